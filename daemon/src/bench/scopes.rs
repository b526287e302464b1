//! `scopefs bench --scopes N`: what idle scopes cost the daemon. Starts `scopefs serve` (this
//! binary, under its supervisor, local object store, a temporary data dir), provisions N scopes
//! through the service route (each one really mounted), then reports the daemon's resident memory
//! threads and descriptors (total and per scope over the empty daemon), the provisioning time,
//! and two restarts: a graceful one with the mounts kept (SIGHUP to the supervisor: the clock runs
//! until the new worker answers `/ready`, then until every mount answers a `stat` through it),
//! and a cold start after a stop (SIGTERM unmounts everything; started again, every scope mounted
//! anew).
//!
//! A measuring tool, not a test: it reports, it does not judge.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;

/// Concurrent provisioning requests.
const CLIENTS: usize = 4;
/// How long the daemon may take to become ready or to stop.
const PATIENCE: Duration = Duration::from_secs(1800);
/// Descriptors an idle scope holds in the daemon: its `/dev/fuse` connection (its metadata
/// database opens on use, within `limits.max_open_scope_databases`, three descriptors each).
const FDS_PER_SCOPE: u64 = 1;
/// `statfs(2)` magic of a FUSE file system.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Resident memory and threads of one process.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Footprint {
    pub rss_kib: u64,
    pub threads: u64,
    /// Open descriptors of the process.
    pub fds: u64,
}

/// The report of one run.
#[derive(Debug, Serialize)]
pub struct ScopesReport {
    pub scopes: usize,
    /// The daemon (the supervisor's worker) with no scope.
    pub empty: Footprint,
    /// The daemon with every scope provisioned and idle.
    pub idle: Footprint,
    /// The supervisor process alone, idle.
    pub supervisor: Footprint,
    pub rss_per_scope_kib: f64,
    pub threads_per_scope: f64,
    pub provision_seconds: f64,
    /// SIGTERM to exit of the daemon with every scope mounted (it unmounts them all).
    pub stop_seconds: f64,
    /// From the start of the new process to every mount answering.
    pub restart_ready_seconds: f64,
    /// Until the restarted daemon answered `/ready` (every scope mounted), before any `stat`.
    pub restart_daemon_ready_seconds: f64,
    /// A graceful restart with the mounts kept (SIGHUP): until the new worker answered `/ready`.
    pub handover_ready_seconds: f64,
    /// The same, until every mount answered a `stat` through the new worker.
    pub handover_seconds: f64,
    /// The same, until every mount's root was listed as well (a listing needs the scope's
    /// database, which the new worker opens on first use).
    pub handover_listed_seconds: f64,
    /// The restarted daemon, idle.
    pub restarted: Footprint,
}

/// A running `scopefs serve` of the benchmark.
struct Daemon {
    child: Child,
    base: String,
    port: u16,
}

impl Daemon {
    fn start(dir: &Path, port: u16, log: &str) -> Result<Daemon> {
        let exe = std::env::current_exe().context("locating the scopefs binary")?;
        let mut cmd = Command::new(exe);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SCOPEFS_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .env_remove("NOTIFY_SOCKET")
            .env("SCOPEFS_LOG", "warn")
            .arg("--config")
            .arg(dir.join("scopefs.toml"))
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(log))?)
            .spawn()
            .context("starting scopefs serve")?;
        Ok(Daemon { child, base: format!("127.0.0.1:{port}"), port })
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("scopefs serve exited early ({status})");
            }
            if matches!(http(&self.base, "GET", "/ready", None, None), Ok((200, _))) {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "the daemon was not ready within {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The supervisor's worker: the process serving mounts and the API.
    fn worker(&self) -> Result<u32> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let kids = children_of(self.child.id());
            if let [pid] = kids.as_slice() {
                return Ok(*pid);
            }
            ensure!(Instant::now() < deadline, "no worker under the supervisor");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A graceful restart, mounts kept (SIGHUP to the supervisor): returns once a new worker
    /// (not `old`) answers `/ready`.
    fn restart_gracefully(&mut self, old: u32) -> Result<u32> {
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGHUP) };
        let deadline = Instant::now() + PATIENCE;
        let new = loop {
            match children_of(self.child.id()).as_slice() {
                [pid] if *pid != old => break *pid,
                _ => {}
            }
            ensure!(Instant::now() < deadline, "no new worker within {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(5));
        };
        self.wait_ready()?;
        Ok(new)
    }

    /// SIGTERM, then waits for the exit (the daemon unmounts every scope); its duration.
    fn stop(mut self) -> Result<Duration> {
        let started = Instant::now();
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + PATIENCE;
        while self.child.try_wait()?.is_none() {
            ensure!(Instant::now() < deadline, "the daemon did not stop within {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(started.elapsed())
    }
}

impl Drop for Daemon {
    /// A run that failed midway leaves no daemon behind (its mounts are detached by `run`).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the benchmark with `n` scopes and prints its report (JSON when `json`). The temporary
/// directory is removed afterwards unless `keep`.
pub fn run(n: usize, json: bool, keep: bool) -> Result<()> {
    ensure!(n > 0, "--scopes must be at least 1");
    let nofile = crate::rlimit::raise_open_files(scopefs::limits::LimitsConfig::default().max_open_files)?;
    let databases = 3 * scopefs::limits::LimitsConfig::default().max_open_scope_databases as u64;
    let need = (n as u64).saturating_mul(FDS_PER_SCOPE) + databases + 1024;
    if need > nofile {
        eprintln!("warning: {n} scopes need about {need} descriptors; the limit here is {nofile} (raise the hard RLIMIT_NOFILE)");
    }
    let dir = std::env::temp_dir().join(format!("scopefs-bench-scopes-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(&dir, n);
    if !keep {
        // Mounts left by a failed run are detached first, so removal never walks into a scope.
        detach_below(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("kept {}", dir.display());
    }
    let report = result?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn measure(dir: &Path, n: usize) -> Result<ScopesReport> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let config = format!(
        "data_dir = {:?}\nmount_root = {:?}\nlisten = \"127.0.0.1:{port}\"\n",
        dir.join("data"),
        dir.join("mnt")
    );
    std::fs::write(dir.join("scopefs.toml"), config)?;
    let mut daemon = Daemon::start(dir, port, "serve-1.log")?;
    daemon.wait_ready()?;
    let worker = daemon.worker()?;
    let empty = footprint(worker)?;
    let token = std::fs::read_to_string(dir.join("data/control/service-token"))?.trim().to_owned();

    let started = Instant::now();
    let scopes = provision(&daemon.base, &token, n)?;
    let provision_seconds = started.elapsed().as_secs_f64();
    // Let work queued by provisioning finish before the idle sample.
    std::thread::sleep(Duration::from_secs(2));
    let idle = footprint(worker)?;
    let supervisor = footprint(daemon.child.id())?;
    let views: Vec<PathBuf> = scopes.iter().map(|s| dir.join("mnt").join(s)).collect();
    let started = Instant::now();
    daemon.restart_gracefully(worker)?;
    let handover_ready_seconds = started.elapsed().as_secs_f64();
    wait_mounted(&views)?;
    let handover_seconds = started.elapsed().as_secs_f64();
    list_all(&views)?;
    let handover_listed_seconds = started.elapsed().as_secs_f64();
    let stop_seconds = daemon.stop()?.as_secs_f64();

    let started = Instant::now();
    let mut daemon = Daemon::start(dir, port, "serve-2.log")?;
    daemon.wait_ready()?;
    let restart_daemon_ready_seconds = started.elapsed().as_secs_f64();
    wait_mounted(&views)?;
    let restart_ready_seconds = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let restarted = footprint(daemon.worker()?)?;
    ensure!(daemon.port == port);
    daemon.stop()?;

    let per = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / n as f64;
    Ok(ScopesReport {
        scopes: n,
        empty,
        idle,
        supervisor,
        rss_per_scope_kib: per(idle.rss_kib, empty.rss_kib),
        threads_per_scope: per(idle.threads, empty.threads),
        provision_seconds,
        stop_seconds,
        restart_daemon_ready_seconds,
        restart_ready_seconds,
        handover_ready_seconds,
        handover_seconds,
        handover_listed_seconds,
        restarted,
    })
}

/// Provisions `n` scopes (threads `bench-<i>`) from a few concurrent clients; their ids.
fn provision(base: &str, token: &str, n: usize) -> Result<Vec<String>> {
    let next = AtomicUsize::new(0);
    let ids = Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let body = format!(r#"{{"operation_id":"bench-op-{i}","primary_thread_id":"bench-{i}"}}"#);
                        let path = "/internal/workspace-scopes/provision";
                        let (status, resp) = http(base, "POST", path, Some(token), Some(&body))?;
                        ensure!(status == 200 || status == 201, "provisioning scope {i}: HTTP {status}: {resp}");
                        let v: serde_json::Value = serde_json::from_str(&resp)?;
                        let id = v["scope_id"].as_str().context("no scope_id in the answer")?.to_owned();
                        ids.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(id);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a provisioning client panicked"))??;
        }
        Ok(())
    })?;
    ids.into_inner().map_err(|_| anyhow::anyhow!("poisoned"))
}

/// Waits until every view answers `stat` as a FUSE mount.
/// Waits until every view answers as a FUSE mount, asking from `CLIENTS` threads (as many
/// conversations would), so the figure is the daemon's, not one client's round trips.
fn wait_mounted(views: &[PathBuf]) -> Result<()> {
    let deadline = Instant::now() + PATIENCE;
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    while let Some(view) = views.get(next.fetch_add(1, Ordering::Relaxed)) {
                        while !is_fuse_mount(view) {
                            ensure!(Instant::now() < deadline, "a scope's mount did not answer within {PATIENCE:?}");
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a client panicked"))?)
    })
}

/// Lists the root of every view, from `CLIENTS` threads.
fn list_all(views: &[PathBuf]) -> Result<()> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    while let Some(view) = views.get(next.fetch_add(1, Ordering::Relaxed)) {
                        std::fs::read_dir(view).context("listing a mount")?.for_each(drop);
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a client panicked"))?)
    })
}

fn is_fuse_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs into a zeroed struct with a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0;
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    ok && magic == FUSE_SUPER_MAGIC && std::fs::metadata(path).is_ok()
}

/// `VmRSS` and `Threads` of a process.
fn footprint(pid: u32) -> Result<Footprint> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name}"))?;
        let v = line[name.len()..].split_whitespace().next().context("empty field")?;
        Ok(v.parse()?)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok(Footprint { rss_kib: field("VmRSS:")?, threads: field("Threads:")?, fds })
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// Lazily detaches every mount below `dir` (deepest first).
fn detach_below(dir: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let prefix = format!("{}/", dir.display());
    let mut mps: Vec<&str> =
        table.lines().filter_map(|l| l.split(' ').nth(4)).filter(|mp| mp.starts_with(&prefix)).collect();
    mps.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for mp in mps {
        let _ = Command::new("umount").arg("-l").arg(mp).status();
    }
}

/// One HTTP/1.1 request on a fresh connection: its status and body.
fn http(base: &str, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(base)?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {base}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes())?;
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp);
    let (head, rest) = text.split_once("\r\n\r\n").context("malformed HTTP answer")?;
    let status = head.split(' ').nth(1).context("no status")?.parse()?;
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_owned() };
    Ok((status, body))
}

/// Decodes a chunked body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn print_report(r: &ScopesReport) {
    let footprint = |label: &str, f: &Footprint| {
        let mib = f.rss_kib as f64 / 1024.0;
        println!("{label:<24} {mib:.1} MiB RSS, {} threads, {} fds", f.threads, f.fds);
    };
    println!("scopes                   {}", r.scopes);
    footprint("daemon, empty", &r.empty);
    footprint(&format!("daemon, {} idle scopes", r.scopes), &r.idle);
    println!("per idle scope           {:.1} KiB RSS, {:.3} threads", r.rss_per_scope_kib, r.threads_per_scope);
    footprint("supervisor", &r.supervisor);
    println!(
        "provisioning             {:.2} s ({:.1} ms per scope)",
        r.provision_seconds,
        r.provision_seconds * 1000.0 / r.scopes as f64
    );
    println!(
        "graceful restart         {:.2} s to /ready, {:.2} s until every mount answers stat (SIGHUP, mounts kept)",
        r.handover_ready_seconds, r.handover_seconds
    );
    println!("                         {:.2} s until every mount's root was also listed", r.handover_listed_seconds);
    println!("stop (unmount all)       {:.2} s", r.stop_seconds);
    println!(
        "cold start to /ready     {:.2} s (after the stop: every scope mounted again)",
        r.restart_daemon_ready_seconds
    );
    println!("cold start to ready      {:.2} s (every mount answers stat)", r.restart_ready_seconds);
    footprint("restarted daemon, idle", &r.restarted);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_decoded() {
        assert_eq!(dechunk("4\r\nab{}\r\n3\r\nxyz\r\n0\r\n\r\n"), "ab{}xyz");
        assert_eq!(dechunk("0\r\n\r\n"), "");
    }
}
