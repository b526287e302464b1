//! The one `scopefs serve` child process of the integration tests: its config file layout, a clean
//! environment, polling `/ready`, stopping (SIGTERM with a bounded wait, or SIGKILL), its log, and
//! on drop killing it and detaching any FUSE mount it left behind; provisioning and mounting a
//! scope through its internal API.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_scopefs");

/// An HTTP client for a test daemon (60 s per request).
pub fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
}

/// The service token the daemon with data under `dir` generated.
pub fn service_token(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("data/control/service-token")).unwrap().trim().to_owned()
}

/// Provisions a scope for `thread-1` in the daemon with data under `dir` and mounts it: its id and
/// the mount route's answer. A provisioning that names no scope fails with its answer and the
/// daemon's warnings.
pub fn provision_and_mount(http: &Client, daemon: &ServeProcess, dir: &Path) -> (String, Value) {
    let token = service_token(dir);
    let resp = http
        .post(format!("{}/internal/workspace-scopes/provision", daemon.base))
        .bearer_auth(&token)
        .json(&json!({"operation_id": "op-1", "primary_thread_id": "thread-1"}))
        .send()
        .unwrap();
    let status = resp.status();
    let resp: Value = resp.json().unwrap();
    let Some(scope) = resp["scope_id"].as_str().map(str::to_owned) else {
        panic!("provision answered {status} {resp}; the daemon's warnings:\n{}", daemon.warnings())
    };
    let mount: Value = http
        .get(format!("{}/internal/workspace-scopes/{scope}/mount", daemon.base))
        .bearer_auth(&token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    (scope, mount)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Writes `<dir>/scopefs.toml` and returns its path: `data_dir` `<dir>/data`, `mount_root`
/// `<dir>/mnt` (the layout [`ServeProcess::start`] expects), `listen` on `port`, then `rest`
/// (further top-level keys, then the tables).
pub fn write_config(dir: &Path, port: u16, rest: &str) -> PathBuf {
    let text = format!(
        "data_dir = {data:?}\nmount_root = {mnt:?}\nlisten = \"127.0.0.1:{port}\"\n{rest}",
        data = dir.join("data"),
        mnt = dir.join("mnt"),
    );
    let path = dir.join("scopefs.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Mountpoints in this process's mount table at or below `root`.
pub fn mounts_under(root: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("reading /proc/self/mountinfo");
    mounts_in(&table, root)
}

/// Lazily detaches every mount at or below `root` (after a test that failed midway); never panics.
pub fn detach_mounts_under(root: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    for mp in mounts_in(&table, root) {
        let _ = Command::new("umount").arg("-l").arg(&mp).status();
    }
}

fn mounts_in(table: &str, root: &Path) -> Vec<String> {
    let root = root.to_string_lossy();
    let below = format!("{root}/");
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|mp| *mp == root || mp.starts_with(&below))
        .collect()
}

/// A running `scopefs serve`; killed and its mounts detached when dropped.
pub struct ServeProcess {
    child: Option<Child>,
    pub log: PathBuf,
    /// The host view: `<dir>/mnt`.
    pub mount_root: PathBuf,
    /// The daemon's root-only directory of real mounts beside the view (`<dir>/.mnt.real`).
    pub real_root: PathBuf,
    pub base: String,
    /// Started as `scopefs serve` with a supervisor (no `NOTIFY_SOCKET`): the server is its worker.
    supervised: bool,
}

impl ServeProcess {
    /// Spawns `scopefs --config <config> serve` listening on `port`, with its stderr in
    /// `<dir>/<log_name>` and its mounts under `<dir>/mnt`. The child gets no `SCOPEFS_*` variable
    /// and no `NOTIFY_SOCKET` of this process, only those of `env`. Does not wait for readiness.
    pub fn start(dir: &Path, config: &Path, port: u16, log_name: &str, env: &[(&str, &str)]) -> ServeProcess {
        ServeProcess::start_with_fds(dir, config, port, log_name, env, &[])
    }

    /// `start`, handing the child `fds` from fd 3 on as systemd hands its fd store over
    /// (`LISTEN_FDS`, `LISTEN_FDNAMES`; without `LISTEN_PID`, which the child cannot be given).
    pub fn start_with_fds(
        dir: &Path,
        config: &Path,
        port: u16,
        log_name: &str,
        env: &[(&str, &str)],
        fds: &[(String, std::os::fd::OwnedFd)],
    ) -> ServeProcess {
        Self::launch(Path::new(BIN), dir, config, port, log_name, env, fds)
    }

    /// `start` with another `scopefs` binary than this build's (e.g. the installed release build).
    pub fn start_binary(
        bin: &Path,
        dir: &Path,
        config: &Path,
        port: u16,
        log_name: &str,
        env: &[(&str, &str)],
    ) -> ServeProcess {
        Self::launch(bin, dir, config, port, log_name, env, &[])
    }

    fn launch(
        bin: &Path,
        dir: &Path,
        config: &Path,
        port: u16,
        log_name: &str,
        env: &[(&str, &str)],
        fds: &[(String, std::os::fd::OwnedFd)],
    ) -> ServeProcess {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let log = dir.join(log_name);
        let supervised = !env.iter().any(|(k, _)| *k == "NOTIFY_SOCKET");
        let mut cmd = Command::new(bin);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SCOPEFS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env_remove("NOTIFY_SOCKET");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut handed = Vec::new();
        if !fds.is_empty() {
            // Duplicates above every target number, so no dup2 overwrites a source still to move.
            let floor = 3 + fds.len() as i32 + 1;
            // SAFETY: F_DUPFD_CLOEXEC on live descriptors; the copies are closed after the spawn.
            let raw: Vec<i32> = fds
                .iter()
                .map(|(_, fd)| unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) })
                .collect();
            assert!(raw.iter().all(|fd| *fd >= floor), "duplicating the fds to hand over");
            let names: Vec<&str> = fds.iter().map(|(n, _)| n.as_str()).collect();
            cmd.env("LISTEN_FDS", fds.len().to_string()).env("LISTEN_FDNAMES", names.join(":"));
            let moved = raw.clone();
            // SAFETY: dup2 is async-signal-safe; nothing is allocated in the child.
            unsafe {
                cmd.pre_exec(move || {
                    for (i, fd) in moved.iter().enumerate() {
                        if libc::dup2(*fd, 3 + i as i32) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
            handed = raw;
        }
        let child = cmd
            .arg("--config")
            .arg(config)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting scopefs serve");
        for fd in handed {
            // SAFETY: closes the copies made above, once.
            unsafe { libc::close(fd) };
        }
        ServeProcess {
            supervised,
            child: Some(child),
            log,
            mount_root: dir.join("mnt"),
            real_root: scopefs_fs::layout::real_root_of(&dir.join("mnt")),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The daemon's log so far (empty if unreadable).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 60 warning and error lines of the daemon's log (what a failure needs explained).
    pub fn warnings(&self) -> String {
        let log = self.log_text();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// The process that serves the mounts and the API: the supervisor's worker (waited for), or
    /// the child itself when it runs as a systemd main process (`NOTIFY_SOCKET` given).
    pub fn pid(&self) -> u32 {
        if self.supervised {
            self.worker(None)
        } else {
            self.supervisor_pid()
        }
    }

    /// The child this harness started: the supervisor (or, under `NOTIFY_SOCKET`, the daemon).
    pub fn supervisor_pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon was already stopped").id()
    }

    fn take_child(&mut self) -> Child {
        self.child.take().expect("the daemon was already stopped")
    }

    /// The worker the supervisor (`scopefs serve` outside systemd) runs, waited for up to 60 s and
    /// different from `not` (a worker that was replaced).
    pub fn worker(&self, not: Option<u32>) -> u32 {
        let supervisor = self.supervisor_pid();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let kids = children_of(supervisor);
            if let [pid] = kids.as_slice() {
                if Some(*pid) != not {
                    return *pid;
                }
            }
            assert!(Instant::now() < deadline, "no new worker under the supervisor: {kids:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `/ready` until 200 (any other answer must be 503); fails with the daemon's log if it
    /// exits or is not ready within 60 s.
    pub fn wait_ready(&mut self, http: &Client) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.as_mut().expect("the daemon was already stopped").try_wait().unwrap() {
                panic!("scopefs serve exited early ({status}); log:\n{}", self.log_text());
            }
            if let Ok(resp) = http.get(format!("{}/ready", self.base)).send() {
                if resp.status() == StatusCode::OK {
                    return;
                }
                assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "unexpected /ready status");
            }
            assert!(Instant::now() < deadline, "daemon not ready within 60 s; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and returns the exit status; kills the daemon and fails with its log if it is
    /// still running after `limit`.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let child = self.take_child();
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        self.reap(child, limit, "of SIGTERM")
    }

    /// Waits for a daemon expected to die by itself (e.g. a failpoint aborted it) and returns its
    /// exit status; fails with its log if it is still running after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let child = self.take_child();
        self.reap(child, limit, "by itself")
    }

    /// The exit status of `child` within `limit`; otherwise kills it and fails with the log,
    /// saying it did not exit within `limit` `how`.
    fn reap(&self, mut child: Child, limit: Duration, how: &str) -> ExitStatus {
        if let Some(status) = wait_bounded(&mut child, limit) {
            return status;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the daemon did not exit within {limit:?} {how}; log:\n{}", self.log_text());
    }

    /// SIGKILL, as a crash: nothing is unmounted.
    pub fn kill9(&mut self) {
        let mut child = self.take_child();
        let workers = if self.supervised { children_of(child.id()) } else { Vec::new() };
        child.kill().unwrap();
        child.wait().unwrap();
        // The worker dies with its supervisor (PR_SET_PDEATHSIG); wait until it has, so the next
        // daemon never races it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while workers.iter().any(|pid| alive(*pid)) {
            assert!(Instant::now() < deadline, "the worker outlived its killed supervisor");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops quietly (never panics, does nothing if already stopped): SIGTERM, up to `limit` for
    /// the exit, then SIGKILL; then detaches any mount left under the mount root.
    pub fn stop(&mut self, limit: Duration) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: plain kill(2) on our own child's pid.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            if wait_bounded(&mut child, limit).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.detach_mounts();
    }
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.split_whitespace().next() != Some("Z")),
        Err(_) => false,
    }
}

/// The pids whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // "pid (comm) state ppid ...": comm may contain spaces, so fields count after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        if rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// Polls `child` for its exit status for up to `limit`; `None` if it is still running (or cannot
/// be waited for).
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() <= deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => return None,
        }
    }
}

impl ServeProcess {
    /// Lazily detaches every mount left in the view and among the real mounts (views first).
    fn detach_mounts(&self) {
        detach_mounts_under(&self.mount_root);
        detach_mounts_under(&self.real_root);
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.detach_mounts();
    }
}
