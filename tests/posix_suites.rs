//! External POSIX suites against a real scope mount: pjdfstest (twice: no caching, production TTL) and fsx.

#[path = "support/fuse_harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::*;
use scopefs_fs::MountOptions;

/// Finds an installed tool (PATH, then cargo's bin dir); a missing one fails the test.
fn tool(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not installed: run scripts/test.sh (it installs pjdfstest and fsx)"))
}

fn artifacts(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("posix_suites").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir
}

fn run_pjdfstest(attr_ttl: Duration, label: &str) {
    let bin = tool("pjdfstest");
    let user_exists = Command::new("id").arg("tests").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(user_exists, "pjdfstest needs the dummy user `tests`: run scripts/test.sh (it creates it)");
    let opts = MountOptions { attr_ttl, ..MountOptions::default() };
    let h = Harness::new(small_block_settings(), opts);
    let (_engine, leaf) = h.scope(big_quota());
    // pjdfstest switches to unprivileged users, who cannot traverse the 0700 mount root.
    let bind = BindMount::new(&leaf);
    let mnt = bind.path.clone();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/pjdfstest.toml");
    let run = |cases: &[&str]| {
        let mut cmd = Command::new(&bin);
        cmd.arg("-c").arg(&config).arg("-p").arg(&mnt).env("NO_COLOR", "1");
        if !cases.is_empty() {
            cmd.arg("-e").args(cases);
        }
        cmd.output().expect("run pjdfstest")
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = artifacts(label).join("pjdfstest.log");
    std::fs::write(&log, stdout.as_bytes()).expect("write log");
    let failed: Vec<&str> =
        stdout.lines().filter(|l| l.contains("FAILED") || l.contains("PASSED UNEXPECTEDLY")).collect();
    let summary = stdout.lines().rev().find(|l| l.contains("Summary")).unwrap_or("(no summary line)");
    let mut success = out.status.success();
    // The `*::etxtbsy` cases exec a freshly written copy of `sleep` and race its start; when they
    // are the only failures they are run again by exact name (twice at most, logged). Any other
    // failure, an unexpected pass, or an etxtbsy case failing every time still fails the test.
    let retryable: Vec<&str> = failed
        .iter()
        .filter(|l| l.contains(" FAILED") && !l.contains("UNEXPECTEDLY"))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.ends_with("::etxtbsy"))
        .collect();
    if !success && !retryable.is_empty() && retryable.len() == failed.len() {
        for attempt in 1..=2 {
            let again = run(&retryable);
            eprintln!("pjdfstest ({label}): retry {attempt} of {retryable:?}: {}", again.status);
            if again.status.success() {
                success = true;
                break;
            }
        }
    }
    // pjdfstest exits non-zero when a case outside `expected_failures` fails or an
    // expected failure passes, so the exit status enforces the list.
    assert!(
        success,
        "pjdfstest ({label}) failed: {summary}\n{}\nstderr: {}\nfull log: {}",
        failed.join("\n"),
        String::from_utf8_lossy(&out.stderr),
        log.display()
    );
    eprintln!("pjdfstest ({label}): {summary}");
}

#[test]
fn pjdfstest_without_attribute_caching() {
    run_pjdfstest(Duration::ZERO, "pjdfstest-ttl0");
}

#[test]
fn pjdfstest_with_production_ttl() {
    run_pjdfstest(Duration::from_secs(60), "pjdfstest-ttl60");
}

/// fsx configuration: every operation our filesystem supports. posix_fallocate and
/// hole punching stay off because fallocate answers EOPNOTSUPP by design. mmap reads
/// and writes are on (the daemon goes through the page cache; no direct I/O).
const FSX_CONFIG: &str = r#"
flen = 1048576
[opsize]
max = 131072
min = 0
align = 1
[weights]
close_open = 2
read = 10
write = 10
mapread = 5
mapwrite = 5
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 0
punch_hole = 0
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
"#;

#[test]
fn fsx_twenty_thousand_operations() {
    let bin = tool("fsx");
    let h = Harness::new(small_block_settings(), MountOptions::default());
    let (_engine, mnt) = h.scope(big_quota());
    let art = artifacts("fsx");
    let config = art.join("fsx.toml");
    std::fs::write(&config, FSX_CONFIG).expect("fsx config");
    let out = Command::new(&bin)
        .args(["-N", "20000", "-S", "42", "-f"])
        .arg(&config)
        .arg("-P")
        .arg(&art)
        .arg(mnt.join("f0"))
        .output()
        .expect("run fsx");
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b).into_owned();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert!(
        out.status.success(),
        "fsx failed ({}):\nstdout:\n{}\nstderr:\n{}\nartifacts: {}",
        out.status,
        tail(&out.stdout),
        tail(&out.stderr),
        art.display()
    );
}
