//! Issue 21 acceptance c, from outside: a writer creating and closing files through a scope's mount
//! (sizes from 100 B to 1 MiB, each created exclusively, written, closed, then logged with its
//! SHA-256 outside the mount) keeps running with no error at all while the serving worker is killed
//! with `-9` 50 times (the supervisor restarts it with the kept mounts) and restarted gracefully 20
//! times; afterwards every file it closed reads back intact, through the mount and again after a
//! clean restart of the whole daemon. Kills land wherever the writer is: in a create, a write, a
//! close, between files.
//!
//! Kills in a worker's first moments, while eight writers' 1 MiB writes are handed over, fail no
//! write either (the kernel answers `EIO` to a request whose copy into the server's buffer a kill
//! interrupts: vendor/fuser/PATCHES.md, resident request buffers).
//!
//! Issue 22 item 5 (acceptance e): a crash loop, every worker killed as soon as it appears for a
//! minute, never ends a kept mount, shows in `/metrics`, and the daemon serves again after it.

pub mod serve_process;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serve_process::{client, free_port, provision_and_mount, service_token, write_config, ServeProcess};
use sha2::{Digest, Sha256};

const KILLS: usize = 50;
const GRACEFUL: usize = 20;
/// Files the writer closes after a restart before the next one (so each worker serves some work).
const FILES_BETWEEN: usize = 4;

/// A ready daemon on the local store in a fresh directory, with `thread-1`'s scope mounted.
struct Served {
    tmp: tempfile::TempDir,
    config: PathBuf,
    port: u16,
    http: Client,
    daemon: ServeProcess,
    mount: PathBuf,
}

fn serve_with_a_mount() -> Served {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &[]);
    daemon.wait_ready(&http);
    let mount = bind_source(&http, &daemon, tmp.path());
    Served { tmp, config, port, http, daemon, mount }
}

/// Provisions and mounts a scope for `thread-1`: the path containers bind (the real mount).
fn bind_source(http: &Client, daemon: &ServeProcess, dir: &Path) -> PathBuf {
    let (_, mount) = provision_and_mount(http, daemon, dir);
    PathBuf::from(mount["bind_source"].as_str().expect("bind_source"))
}

/// The writer: creates `f<i>` exclusively, writes it in pieces of up to 128 KiB, closes it, then
/// appends `f<i> <sha256>` to the manifest (outside the mount); every failure goes to stderr and
/// the writer goes on with the next file. Stops when `stop` exists.
const WRITER: &str = r#"
import hashlib, os, random, sys
mount, manifest, stop = sys.argv[1], sys.argv[2], sys.argv[3]
rng = random.Random(21)
out = open(manifest, "a", buffering=1)
i = 0
while not os.path.exists(stop):
    name = "f%d" % i
    size = rng.choice([100, 4096, 70000, 300000, 1 << 20]) + rng.randrange(0, 1000)
    data = rng.randbytes(size)
    try:
        fd = os.open(os.path.join(mount, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        at = 0
        while at < size:
            at += os.write(fd, data[at:at + 131072])
        os.close(fd)
        out.write("%s %s\n" % (name, hashlib.sha256(data).hexdigest()))
    except OSError as e:
        sys.stderr.write("%s: %s\n" % (name, e))
        sys.stderr.flush()
    i += 1
"#;

fn start_writer(mount: &Path, dir: &Path) -> (Child, PathBuf, PathBuf, PathBuf) {
    let manifest = dir.join("manifest");
    let stop = dir.join("stop-writer");
    let errors = dir.join("writer.err");
    let child = Command::new("python3")
        .args(["-c", WRITER])
        .arg(mount)
        .arg(&manifest)
        .arg(&stop)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap())
        .spawn()
        .expect("python3 (installed by scripts/install-deps.sh)");
    (child, manifest, stop, errors)
}

/// Files the writer has closed so far, with their SHA-256.
fn manifest(path: &Path) -> BTreeMap<String, String> {
    let Ok(f) = std::fs::File::open(path) else { return BTreeMap::new() };
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.split_once(' ').map(|(n, h)| (n.to_owned(), h.to_owned())))
        .collect()
}

/// Waits until the writers closed `n` more files than `after` (manifest lines; bounded).
fn wait_progress(manifest_path: &Path, after: usize, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = std::fs::read(manifest_path).map_or(0, |m| m.iter().filter(|b| **b == b'\n').count());
        if now >= after + n {
            return now;
        }
        assert!(Instant::now() < deadline, "the writer made no progress past {after} files");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The FUSE workers' request buffers of the serving process `pid` are locked in memory before it
/// serves (vendor/fuser/PATCHES.md): a kill while the kernel copies a request into a page it must
/// fault in ends that request with `EIO` instead of leaving it to be resent. Default `[fuse]`
/// settings: 16 workers, 1 MiB writes (each buffer's first 1 MiB + 8 KiB).
fn assert_buffers_resident(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let locked_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    assert!(locked_kib >= 16 * 1032, "worker {pid} has {locked_kib} KiB locked, not its 16 request buffers");
}

fn errors_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Every file of the manifest reads back with its hash through `mount`.
fn check_all(mount: &Path, files: &BTreeMap<String, String>) {
    let mut bad = Vec::new();
    for (name, sha) in files {
        match std::fs::read(mount.join(name)) {
            Ok(data) if hex::encode(Sha256::digest(&data)) == *sha => {}
            Ok(data) => bad.push(format!("{name}: {} bytes, wrong content", data.len())),
            Err(e) => bad.push(format!("{name}: {e}")),
        }
    }
    assert!(bad.is_empty(), "{} of {} closed files damaged: {:?}", bad.len(), files.len(), &bad[..bad.len().min(20)]);
}

#[test]
fn a_writer_sees_no_error_and_loses_nothing_through_worker_kills_and_graceful_restarts() {
    let Served { tmp, config, port, http, mut daemon, mount } = serve_with_a_mount();
    let (mut writer, manifest_path, stop, errors) = start_writer(&mount, tmp.path());
    let mut closed = wait_progress(&manifest_path, 0, FILES_BETWEEN);
    let supervisor = daemon.supervisor_pid();
    let mut worker = daemon.worker(None);
    let started = Instant::now();
    // Interleaved: a graceful restart after every 2-3 kills.
    let mut plan: Vec<bool> = Vec::new();
    for i in 0..KILLS + GRACEFUL {
        plan.push(i % 7 == 3 || i % 7 == 6);
    }
    assert_eq!(plan.iter().filter(|g| **g).count(), GRACEFUL);
    for (round, graceful) in plan.into_iter().enumerate() {
        let (pid, sig) = if graceful { (supervisor, libc::SIGHUP) } else { (worker, libc::SIGKILL) };
        // SAFETY: kill(2) on the supervisor or its worker, both started by this test.
        assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "round {round}");
        worker = daemon.worker(Some(worker));
        daemon.wait_ready(&http);
        assert_buffers_resident(worker);
        closed = wait_progress(&manifest_path, closed, FILES_BETWEEN);
        let errs = errors_of(&errors);
        assert!(
            errs.is_empty(),
            "round {round} ({}): the writer saw errors:\n{errs}\nthe daemon's warnings:\n{}",
            if graceful { "SIGHUP" } else { "kill -9" },
            daemon.warnings()
        );
    }
    std::fs::write(&stop, b"").unwrap();
    assert!(writer.wait().unwrap().success());
    let errs = errors_of(&errors);
    assert!(errs.is_empty(), "the writer saw errors:\n{errs}");
    let files = manifest(&manifest_path);
    eprintln!(
        "worker_kills: {KILLS} kill -9 and {GRACEFUL} graceful restarts in {:.0} s; {} files closed, 0 errors",
        started.elapsed().as_secs_f64(),
        files.len()
    );
    check_all(&mount, &files);
    // The whole daemon stopped and started again: everything from its data directory alone.
    let status = daemon.terminate(Duration::from_secs(120));
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-2.log", &[]);
    daemon.wait_ready(&http);
    let mount = bind_source(&http, &daemon, tmp.path());
    check_all(&mount, &files);
    let mut out = std::io::stderr();
    writeln!(out, "worker_kills: all {} files intact after a clean restart", files.len()).unwrap();
    daemon.stop(Duration::from_secs(60));
}

/// Issue 22 item 5 and acceptance e: a crash loop. For a minute (at most 20 kills) every worker the
/// supervisor starts is killed with -9 as soon as it appears, ready or not; meanwhile a prober
/// calls statfs and reads a file through the kept mount every few milliseconds. No call may fail:
/// while no worker runs a call waits (`ENOTCONN` would mean the mount ended). The supervisor waits
/// longer before each restart (doubling up to 30 s), never gives up, and the worker that finally
/// stays reports every kill in `/metrics`; the mount then reads and writes again.
#[test]
fn a_crash_loop_never_ends_a_kept_mount_and_the_daemon_serves_again_after_it() {
    let Served { tmp, http, mut daemon, mount, .. } = serve_with_a_mount();
    std::fs::write(mount.join("probe.txt"), b"probe").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (mount, stop) = (mount.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut answered, mut failures) = (0u64, Vec::new());
            // statfs and open always reach the worker (the kernel caches attributes, not these);
            // paced so that the prober does not take a core from the daemon.
            let root = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: statvfs(3) with a valid C path and a zeroed struct (plain integers) to fill.
                let failed = unsafe {
                    let mut vfs: libc::statvfs = std::mem::zeroed();
                    libc::statvfs(root.as_ptr(), &mut vfs) != 0
                };
                if failed {
                    failures.push(format!("statfs: {}", std::io::Error::last_os_error()));
                }
                match std::fs::read(mount.join("probe.txt")) {
                    Ok(b) if b == b"probe" => answered += 1,
                    Ok(b) => failures.push(format!("probe.txt reads {} other bytes", b.len())),
                    Err(e) => failures.push(format!("read: {e}")),
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (answered, failures)
        })
    };
    let started = Instant::now();
    let minute = Duration::from_secs(60);
    let (mut kills, mut last) = (0u64, None);
    while kills < 20 && started.elapsed() < minute {
        let worker = daemon.worker(last);
        if started.elapsed() >= minute {
            last = None;
            break;
        }
        // SAFETY: kill(2) on the worker of the supervisor this test started.
        assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0, "kill {kills}");
        kills += 1;
        last = Some(worker);
    }
    let looped = started.elapsed();
    // The worker after the loop (started after the longest delay, when the loop ended on a kill).
    daemon.worker(last);
    daemon.wait_ready(&http);
    let recovered = started.elapsed();
    std::fs::write(mount.join("after.txt"), b"after the crash loop").unwrap();
    assert_eq!(std::fs::read(mount.join("probe.txt")).unwrap(), b"probe");
    stop.store(true, Ordering::Relaxed);
    let (answered, failures) = prober.join().unwrap();
    assert!(failures.is_empty(), "the mount failed during the crash loop: {failures:?}");
    assert!(answered > 0, "the prober never got an answer");
    let metrics = http.get(format!("{}/metrics", daemon.base)).bearer_auth(service_token(tmp.path())).send().unwrap();
    assert!(metrics.status().is_success(), "/metrics: {}", metrics.status());
    let metrics = metrics.text().unwrap();
    let crashes = metrics.lines().find_map(|l| l.strip_prefix("scopefs_worker_crashes_total ")).map(str::trim);
    assert_eq!(crashes, Some(kills.to_string().as_str()), "every kill counted");
    // The supervisor's doubling delays allow about eight workers a minute.
    assert!(kills >= 6, "only {kills} workers started in a minute");
    eprintln!(
        "crash loop: {kills} kill -9 in {:.0} s, serving again {:.0} s after the first; {answered} probes answered, none failed",
        looped.as_secs_f64(),
        recovered.as_secs_f64()
    );
    daemon.stop(Duration::from_secs(60));
}

/// Eight writers, each rewriting its own three files of 4 MiB in 1 MiB writes (each file's content
/// starts with its number), logging `name sha256` after each close; failures go to stderr.
const LARGE_WRITERS: &str = r#"
import hashlib, os, sys, threading
mount, manifest, stop = sys.argv[1], sys.argv[2], sys.argv[3]
out = open(manifest, "a", buffering=1)
lock = threading.Lock()
def run(t):
    base = os.urandom(1 << 20)
    i = 0
    while not os.path.exists(stop):
        name = "w%d_%d" % (t, i % 3)
        data = (b"%08d" % i) + base[8:]
        try:
            fd = os.open(os.path.join(mount, name), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
            for _ in range(4):
                os.write(fd, data)
            os.close(fd)
            with lock:
                out.write("%s %s\n" % (name, hashlib.sha256(data * 4).hexdigest()))
        except OSError as e:
            sys.stderr.write("%s: %s\n" % (name, e))
            sys.stderr.flush()
        i += 1
threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
"#;

/// Kills in the worker's first moments, while eight writers' 1 MiB writes queue up and the new
/// worker's threads take them into their request buffers: each kill lands 0-60 ms after the worker
/// appears (before or during the hand-over); after every second one the worker serves until the
/// writers progress and is restarted gracefully (which also resets the supervisor's back-off).
/// No write or close may fail, and every closed file reads back. With request buffers faulted in
/// lazily (the state before vendor/fuser's resident buffers) 160 such kills made 8 writes fail with
/// `EIO`, each ended by the kernel in `fuse_dev_do_read`.
#[test]
fn kills_as_each_worker_starts_fail_no_write_of_eight_writers() {
    const ROUNDS: u64 = 40;
    let Served { tmp, http, mut daemon, mount, .. } = serve_with_a_mount();
    let (manifest_path, stop, errors) =
        (tmp.path().join("manifest"), tmp.path().join("stop-writers"), tmp.path().join("writers.err"));
    let mut writers = Command::new("python3")
        .args(["-c", LARGE_WRITERS])
        .args([&mount, &manifest_path, &stop])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap())
        .spawn()
        .expect("python3 (installed by scripts/install-deps.sh)");
    let mut closed = wait_progress(&manifest_path, 0, 8);
    let supervisor = daemon.supervisor_pid();
    let mut worker = daemon.worker(None);
    for round in 0..ROUNDS {
        // Spread over the worker's start: its resume, its first requests (a fixed sequence).
        std::thread::sleep(Duration::from_millis(round * 37 % 61));
        // SAFETY: kill(2) on the worker of the supervisor this test started.
        assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0, "round {round}");
        worker = daemon.worker(Some(worker));
        if round % 2 == 1 {
            daemon.wait_ready(&http);
            closed = wait_progress(&manifest_path, closed, 1);
            // SAFETY: kill(2) on the supervisor this test started.
            assert_eq!(unsafe { libc::kill(supervisor as i32, libc::SIGHUP) }, 0, "round {round}");
            worker = daemon.worker(Some(worker));
        }
    }
    daemon.wait_ready(&http);
    closed = wait_progress(&manifest_path, closed, 8);
    std::fs::write(&stop, b"").unwrap();
    assert!(writers.wait().unwrap().success());
    let errs = errors_of(&errors);
    assert!(errs.is_empty(), "the writers saw errors:\n{errs}\nthe daemon's warnings:\n{}", daemon.warnings());
    let files = manifest(&manifest_path);
    check_all(&mount, &files);
    eprintln!("kills at start: {ROUNDS} kill -9 in the workers' first 60 ms, {closed} files of 4 MiB closed, 0 errors");
    daemon.stop(Duration::from_secs(60));
}
