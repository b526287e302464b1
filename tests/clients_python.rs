//! The Python client (`clients/python`, issue 25 items 2 and 3) against a live daemon: installs the
//! package into a fresh venv without network (proving it pip-installable), runs its pytest suite
//! with the daemon's URL and secrets in the environment, and runs `examples/smoke.py` — seed 003
//! §16.3's smoke test — stopping the daemon when the program asks for the execution side to be
//! stopped.
//!
//! Needs root, /dev/fuse, a Docker engine with `SCOPEFS_TEST_DOCKER_IMAGE` and
//! `SCOPEFS_TEST_PYTHON_IMAGE` (scripts/docker.sh), and Debian's python3-venv, python3-httpx,
//! python3-pytest, python3-setuptools, python3-wheel and python3-mypy (scripts/install-deps.sh);
//! without them it fails.

pub mod compute_support;
pub mod serve_process;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use compute_support::{compute_toml, docker_image, python_image, uid, Secrets};
use serve_process::{free_port, write_config, ServeProcess};

const SERVICE_TOKEN: &str = "clients-python-service-token-0123456789";
const HMAC_SECRET: &str = "clients-python-hmac-secret";
const ADMIN_TOKEN: &str = "clients-python-admin-token";
const USER: &str = "py_user";
/// Debian's interpreter: the one python3-httpx, python3-pytest and python3-setuptools install for.
const PYTHON: &str = "/usr/bin/python3";

/// New accounts get `pro`; `metered` pays every minute from cash. The daemon settles (one billing
/// authority); its loop runs at startup and then waits an hour, so the tests drive settlement.
const PRICING: &str = "[pricing]\ndefault_plan = \"pro\"\nsettle_interval_secs = 3600\n\
    [pricing.plans.pro]\ncompute_allowed = true\nmonthly_minutes = 120\nhard_max_runtime_seconds = 7200\n\
    [pricing.plans.metered]\ncompute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 7200\n\
    [billing]\nmode = \"settle\"\n";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Fails, naming the script that installs them, unless Debian's python3 has what the client and
/// its tests need.
fn require_python() {
    let probe =
        Command::new(PYTHON).args(["-c", "import venv, ensurepip, httpx, pytest, setuptools, wheel, mypy"]).output();
    let ok = probe.as_ref().is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{PYTHON} lacks venv/httpx/pytest/setuptools/wheel/mypy: run scripts/install-deps.sh (Debian packages \
         python3-venv python3-httpx python3-pytest python3-setuptools python3-wheel python3-mypy); {}",
        probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_else(|e| e.to_string())
    );
}

/// Copies `from` to `to`, leaving out build leftovers (so the install never writes into the repo).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "__pycache__" || name == "build" || name.ends_with(".egg-info") || name.starts_with('.') {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// A fresh venv under `dir` (seeing Debian's packages) with the client installed from a copy of
/// `clients/python`, without network or build isolation; its python.
fn install_client(dir: &Path) -> PathBuf {
    require_python();
    let venv = dir.join("venv");
    let made = Command::new(PYTHON).args(["-m", "venv", "--system-site-packages"]).arg(&venv).output().unwrap();
    assert!(made.status.success(), "python3 -m venv failed: {}", String::from_utf8_lossy(&made.stderr));
    let source = dir.join("client-src");
    copy_tree(&repo().join("clients/python"), &source);
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"])
        .arg(&source)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .unwrap();
    assert!(
        pip.status.success(),
        "pip install of clients/python failed:\n{}{}",
        String::from_utf8_lossy(&pip.stdout),
        String::from_utf8_lossy(&pip.stderr)
    );
    venv.join("bin/python")
}

/// A ready daemon running environments on `image`; its containers are removed when dropped.
struct Daemon {
    serve: ServeProcess,
    deployment: String,
}

impl Daemon {
    fn start(dir: &Path, image: &str, legacy: Option<&Path>) -> Daemon {
        let port = free_port();
        let deployment = format!("cp-{}", &uid()[20..]);
        let secrets =
            Secrets { service_token: SERVICE_TOKEN, hmac_secret: HMAC_SECRET, admin_token: Some(ADMIN_TOKEN) };
        let legacy = legacy.map(|p| format!("legacy_root = {p:?}\n")).unwrap_or_default();
        let rest = format!("{legacy}{}", compute_toml(&deployment, &secrets, image, PRICING));
        let cfg = write_config(dir, port, &rest);
        let mut serve = ServeProcess::start(dir, &cfg, port, "daemon.log", &[]);
        serve.wait_ready(&serve_process::client());
        Daemon { serve, deployment }
    }

    /// What the Python side needs to reach the daemon.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SCOPEFS_CLIENT_TEST_URL", self.serve.base.clone()),
            ("SCOPEFS_CLIENT_TEST_SERVICE_TOKEN", SERVICE_TOKEN.into()),
            ("SCOPEFS_CLIENT_TEST_ADMIN_TOKEN", ADMIN_TOKEN.into()),
            ("SCOPEFS_CLIENT_TEST_HMAC_SECRET", HMAC_SECRET.into()),
            ("SCOPEFS_CLIENT_TEST_USER", USER.into()),
            ("PYTHONDONTWRITEBYTECODE", "1".into()),
        ]
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let label = format!("label=io.scopefs.deployment={}", self.deployment);
        if let Ok(out) = Command::new("docker").args(["ps", "-aq", "--filter", &label]).output() {
            for c in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("docker").args(["rm", "-f", c]).output();
            }
        }
    }
}

/// Prints `summary: <line>` for scripts/test.sh's closing summary, straight to the process's stdout:
/// libtest captures `println!` of a passing test unless run with `--nocapture`.
fn summary(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "summary: {line}");
    let _ = out.flush();
}

/// The count of pytest's closing line when every test passed and none was skipped, xfailed,
/// deselected or errored (`12 passed in 3.2s`, warnings allowed); `None` otherwise.
fn all_passed(output: &str) -> Option<usize> {
    let last = output.lines().rev().find(|l| l.contains(" passed") || l.contains(" failed") || l.contains(" error"))?;
    let bad = ["failed", "error", "skipped", "xfailed", "xpassed", "deselected", "no tests ran"];
    if bad.iter().any(|b| last.contains(b)) {
        return None;
    }
    last.trim().trim_matches('=').split_whitespace().next()?.parse().ok()
}

/// Issue 25, acceptance b (Python): the client's pytest suite — the seed's golden vector, every
/// route family (success and the main errors mapped to their classes), streamed upload and
/// download, the zip, the async client and the retry policy — passes against a live daemon.
#[test]
fn the_python_client_suite_passes_against_a_live_daemon() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("legacy");
    std::fs::create_dir_all(legacy.join("reports")).unwrap();
    std::fs::write(legacy.join("reports/old.txt"), b"from the legacy workspace\n").unwrap();
    let python = install_client(dir.path());
    let image = docker_image();
    let daemon = Daemon::start(dir.path(), &image, Some(&legacy));

    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEsxX", "clients/python/tests"])
        .current_dir(repo())
        .envs(daemon.env())
        .env("SCOPEFS_CLIENT_TEST_IMAGE", &image)
        .env("SCOPEFS_CLIENT_TEST_VENV", python.parent().unwrap().parent().unwrap())
        .env("SCOPEFS_CLIENT_TEST_REPO", repo())
        .output()
        .expect("running pytest");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    let passed = all_passed(&text);
    assert!(
        out.status.success() && passed.is_some(),
        "the Python client's tests did not all pass ({}); the daemon's warnings:\n{}",
        out.status,
        daemon.serve.warnings()
    );
    let n = passed.unwrap();
    assert!(n >= 30, "only {n} tests ran: the suite lost its tests");
    println!("python client suite took {}s", started.elapsed().as_secs());
    summary(&format!("python client: {n} tests passed against a live daemon"));
}

/// Issue 25, acceptance c: `examples/smoke.py` runs seed 003 §16.3's steps against a live daemon
/// running the python sandbox image; when it asks for the execution side to be stopped the
/// daemon is stopped, and it must then get `ComputeUnavailable` and run nothing locally. Every
/// step must be reported ok.
#[test]
fn the_smoke_program_reports_every_step_ok() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let python = install_client(dir.path());
    let mut daemon = Daemon::start(dir.path(), &python_image(), None);

    let mut child = Command::new(&python)
        .arg(repo().join("clients/python/examples/smoke.py"))
        .envs(daemon.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting smoke.py");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stdin = child.stdin.take();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "smoke.py did not finish within 600 s; so far:\n{}", lines.join("\n"));
        match rx.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(line) => {
                println!("{line}");
                if line.starts_with("smoke: stop the execution side") {
                    // The execution side stopped: the daemon is gone, its port closed.
                    daemon.serve.stop(Duration::from_secs(60));
                    let mut pipe = stdin.take().expect("asked twice to stop the execution side");
                    pipe.write_all(b"stopped\n").unwrap();
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.wait().unwrap();
    let text = lines.join("\n");
    assert!(
        status.success(),
        "smoke.py failed ({status}):\n{text}\nthe daemon's warnings:\n{}",
        daemon.serve.warnings()
    );
    let steps: Vec<&str> = lines.iter().filter(|l| l.starts_with("step ")).map(String::as_str).collect();
    let total = steps.len();
    assert_eq!(total, 12, "seed 003 §16.3 has twelve steps that concern scopefs:\n{text}");
    for (i, line) in steps.iter().enumerate() {
        let head = format!("step {}/{total} ", i + 1);
        assert!(line.starts_with(&head) && line.ends_with(": ok"), "step {} not ok: {line}", i + 1);
    }
    println!("smoke.py took {}s", started.elapsed().as_secs());
    summary(&format!("smoke.py: {total}/{total} steps passed"));
}

/// Issue 25, acceptance e (its Python steps): the README quickstart's `examples/quickstart.py`
/// (scope, mount, a file written through the client and read through the mount) and
/// `examples/admin_page.py` (the scope seen on the admin page after a login through its form)
/// work against a live daemon (tokens from `SCOPEFS_SERVICE_TOKEN` / `SCOPEFS_ADMIN_TOKEN`: this
/// daemon's are configured, so it writes no token files to fall back on).
#[test]
fn the_quickstart_examples_work_against_a_live_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let python = install_client(dir.path());
    let daemon = Daemon::start(dir.path(), &docker_image(), None);
    let run = |script: &str| {
        let out = Command::new(&python)
            .arg(format!("clients/python/examples/{script}"))
            .current_dir(repo())
            .env("SCOPEFS_URL", &daemon.serve.base)
            .env("SCOPEFS_SERVICE_TOKEN", SERVICE_TOKEN)
            .env("SCOPEFS_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("running an example");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{script} failed ({}):\n{text}", out.status);
        text
    };
    let wrote = run("quickstart.py");
    assert!(wrote.contains("hello.txt through the mount: 'hello from the Python client\\n'"), "{wrote}");
    let seen = run("admin_page.py");
    assert!(seen.contains("/admin/ui lists thread quickstart's scope: "), "{seen}");
    summary("quickstart examples: quickstart.py and admin_page.py ok against a live daemon");
}
