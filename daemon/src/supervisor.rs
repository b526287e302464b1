//! `scopefs serve` outside systemd: a small parent that keeps the worker's descriptors (each
//! mount's `/dev/fuse` connection and the HTTP listening socket, sent with `FDSTORE=1` as systemd
//! would receive them) and restarts the worker with them, so mounts outlive the worker process.
//!
//! The worker is this binary again (`SCOPEFS_SERVE_ROLE=worker`), started with the kept
//! descriptors from fd 3 (`LISTEN_FDS`, `LISTEN_FDNAMES`), its notification socket
//! (`SCOPEFS_NOTIFY_FD`) and the data directory's lock, which the supervisor holds for its whole
//! life (`SCOPEFS_DATA_LOCK_FD`, see `datadir_lock`). It dies with the supervisor
//! (`PR_SET_PDEATHSIG`), so killing the supervisor ends everything, as killing the daemon did before.
//!
//! Signals: SIGTERM/SIGINT are forwarded and the supervisor exits with the worker's status (the
//! worker unmounts every scope); SIGHUP is a graceful restart (the worker drains HTTP, waits for
//! uploads and exits without unmounting; a new worker resumes the mounts). A worker that dies is
//! restarted with the kept descriptors for as long as any worker was ready once (giving up would
//! end every kept mount): at once when it had run `RestartPolicy::healthy_run` after it was ready,
//! otherwise after a delay that doubles up to a bound, for consecutive failures (`RestartPolicy`).
//! Only a first worker that fails before it was ever ready (bad configuration, store probe) ends
//! the supervisor, with its status.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::datadir_lock::{DataDirLock, LOCK_FD_ENV};
use crate::fdstore::{self, Message, FDNAMES_FD_ENV, LISTEN_FDS_START, MAX_KEPT_FDS};
use crate::notify::NOTIFY_FD_ENV;

/// Variable that makes `scopefs serve` the worker instead of the supervisor.
pub const ROLE_ENV: &str = "SCOPEFS_SERVE_ROLE";
/// Variables telling a worker how many workers before it died unasked, and how long the
/// supervisor waited before starting it (`/metrics`: a crash loop shows there).
const CRASHES_ENV: &str = "SCOPEFS_WORKER_CRASHES";
const DELAY_ENV: &str = "SCOPEFS_WORKER_RESTART_DELAY_MS";

/// What the supervisor told this worker: workers before it that died unasked, and the delay (ms)
/// waited before it started; zeros outside a supervisor.
pub fn worker_history() -> (u64, u64) {
    let read = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    (read(CRASHES_ENV), read(DELAY_ENV))
}

/// When a worker that died is started again: at once after a healthy run, otherwise after a delay
/// that doubles from `first_delay` up to `max_delay` (and starts over after a healthy run or a
/// completed graceful restart: the doubling is for consecutive failures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartPolicy {
    /// A worker that ran this long after it was ready is restarted at once.
    pub healthy_run: Duration,
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// The delay of the next restart that follows a short run.
    next: Duration,
}

impl Default for RestartPolicy {
    fn default() -> RestartPolicy {
        RestartPolicy::new(Duration::from_secs(10), Duration::from_millis(250), Duration::from_secs(30))
    }
}

impl RestartPolicy {
    pub fn new(healthy_run: Duration, first_delay: Duration, max_delay: Duration) -> RestartPolicy {
        RestartPolicy { healthy_run, first_delay, max_delay, next: first_delay }
    }

    /// The wait before restarting a worker that died `ran_after_ready` after it reported ready
    /// (`None`: it never was).
    pub fn next_delay(&mut self, ran_after_ready: Option<Duration>) -> Duration {
        if ran_after_ready.is_some_and(|ran| ran >= self.healthy_run) {
            self.next = self.first_delay;
            return Duration::ZERO;
        }
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max_delay);
        delay
    }

    /// A worker ended well (a graceful restart it completed): the next failure waits
    /// `first_delay` again.
    pub fn reset(&mut self) {
        self.next = self.first_delay;
    }
}

/// True in the worker started by the supervisor.
pub fn is_worker() -> bool {
    std::env::var_os(ROLE_ENV).is_some_and(|v| v == "worker")
}

/// How one worker's run ended.
struct Run {
    status: ExitStatus,
    /// When it reported `READY=1` (`None`: never).
    ready_at: Option<Instant>,
    /// A stop (SIGTERM/SIGINT) was forwarded to it.
    stopping: bool,
    /// A graceful restart (SIGHUP) was forwarded to it.
    restart: bool,
}

/// What ended the wait before a restart.
enum Waited {
    /// The delay passed, or SIGHUP asked for the restart now.
    Restart,
    /// SIGTERM/SIGINT: stop instead.
    Stop,
}

/// Runs the supervisor, holding the data directory's `lock`, until the worker stops for good;
/// returns the worker's exit status.
pub fn run(lock: DataDirLock) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("locating the scopefs binary")?;
    // It holds every kept connection; the worker raises its own limit to the configured one.
    let nofile = crate::rlimit::raise_open_files(scopefs::limits::LimitsConfig::default().max_open_files)
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot raise the supervisor's open-file limit");
            1024
        });
    let max_kept = kept_bound(nofile);
    let signals = Signals::block().context("installing the supervisor's signal handling")?;
    let (mine, theirs) = std::os::unix::net::UnixDatagram::pair().context("creating the notification socket")?;
    let mut kept: BTreeMap<String, OwnedFd> = BTreeMap::new();
    let mut policy = RestartPolicy::default();
    let mut ever_ready = false;
    let (mut crashes, mut delay_ms) = (0u64, 0u64);
    loop {
        let fds = WorkerFds { kept: &kept, notify: theirs.as_fd(), lock: lock.fd() };
        let mut child = spawn(&exe, &fds, (crashes, delay_ms)).context("starting the scopefs worker")?;
        tracing::info!(pid = child.id(), kept = kept.len(), "worker started");
        let run = supervise(&mut child, &signals, mine.as_raw_fd(), &mut kept, max_kept)?;
        ever_ready |= run.ready_at.is_some();
        let code = exit_code(run.status);
        if run.stopping {
            tracing::info!(code, "worker stopped");
            return Ok(ExitCode::from(code));
        }
        if run.restart && run.status.success() {
            policy.reset();
            continue;
        }
        if !ever_ready && !run.restart {
            tracing::error!(code, "worker failed before it was ready; not restarting");
            return Ok(ExitCode::from(code));
        }
        let delay = policy.next_delay(run.ready_at.map(|t| t.elapsed()));
        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        crashes += 1;
        tracing::warn!(
            code,
            signal = run.status.signal(),
            delay_ms,
            crashes,
            kept = kept.len(),
            "worker died; restarting it with the kept mounts"
        );
        if let Waited::Stop = wait_before_restart(&signals, delay)? {
            tracing::warn!(code, "stopped while waiting to restart the worker; the kept mounts end here");
            return Ok(ExitCode::from(code));
        }
    }
}

/// Serves one worker's notifications and forwards signals to it until it exits.
fn supervise(
    child: &mut Child,
    signals: &Signals,
    sock: RawFd,
    kept: &mut BTreeMap<String, OwnedFd>,
    max_kept: usize,
) -> anyhow::Result<Run> {
    let mut ready_at = None;
    let (mut stopping, mut restart) = (false, false);
    loop {
        let (sig_ready, msg_ready) = poll2(signals.fd.as_raw_fd(), sock, None)?;
        if msg_ready && drain(sock, kept, max_kept) && ready_at.is_none() {
            ready_at = Some(Instant::now());
        }
        if sig_ready {
            for sig in signals.read()? {
                match sig {
                    libc::SIGTERM | libc::SIGINT => {
                        stopping = true;
                        forward(child, sig);
                    }
                    libc::SIGHUP => {
                        tracing::info!("SIGHUP: restarting the worker gracefully; mounts stay");
                        restart = true;
                        forward(child, libc::SIGHUP);
                    }
                    _ => {}
                }
            }
        }
        if let Some(status) = child.try_wait()? {
            if drain(sock, kept, max_kept) && ready_at.is_none() {
                ready_at = Some(Instant::now());
            }
            return Ok(Run { status, ready_at, stopping, restart });
        }
    }
}

/// Waits `delay` before a restart, unless a signal cuts it short (SIGHUP: restart now;
/// SIGTERM/SIGINT: stop).
fn wait_before_restart(signals: &Signals, delay: Duration) -> anyhow::Result<Waited> {
    let deadline = Instant::now() + delay;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Waited::Restart);
        }
        let (sig_ready, _) = poll2(signals.fd.as_raw_fd(), -1, Some(left))?;
        if !sig_ready {
            continue;
        }
        for sig in signals.read()? {
            match sig {
                libc::SIGTERM | libc::SIGINT => return Ok(Waited::Stop),
                libc::SIGHUP => return Ok(Waited::Restart),
                _ => {}
            }
        }
    }
}

/// The worker's status as a process exit code (128 + signal when killed).
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(1),
        _ => 1,
    }
}

fn forward(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    if unsafe { libc::kill(child.id() as libc::pid_t, sig) } != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "forwarding a signal to the worker failed");
    }
}

/// How many descriptors the supervisor may keep with `nofile` open files allowed: starting a
/// worker holds each one twice for a moment (moved above the target numbers, then placed), plus a
/// few of its own. Beyond it a mount is not kept: it ends with the worker and is mounted anew.
fn kept_bound(nofile: u64) -> usize {
    let bound = (nofile.saturating_sub(64) / 2) as usize;
    bound.min(MAX_KEPT_FDS)
}

/// Applies every pending message of the worker; true when one was `READY=1`.
fn drain(sock: RawFd, kept: &mut BTreeMap<String, OwnedFd>, max_kept: usize) -> bool {
    let mut ready = false;
    loop {
        let (text, mut fds) = match fdstore::recv_message(sock, 1) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ready,
            Err(e) => {
                tracing::warn!(error = %e, "reading a worker notification failed");
                return ready;
            }
        };
        match fdstore::parse_message(&text) {
            Message::Store(name) if fds.len() == 1 => {
                if kept.len() >= max_kept && !kept.contains_key(&name) {
                    tracing::warn!(name, max_kept, "descriptor store full (open-file limit); not kept");
                } else {
                    kept.insert(name, fds.remove(0));
                }
            }
            Message::Remove(name) => {
                kept.remove(&name);
            }
            Message::Ready => ready = true,
            _ => {}
        }
    }
}

/// What a worker is started with.
struct WorkerFds<'a> {
    kept: &'a BTreeMap<String, OwnedFd>,
    notify: BorrowedFd<'a>,
    /// The data directory's lock, shared with every worker.
    lock: BorrowedFd<'a>,
}

/// Starts the worker with the kept descriptors at fd 3.., the notification socket after them,
/// then the descriptor holding their names, then the data directory's lock.
fn spawn(exe: &PathBuf, fds: &WorkerFds<'_>, (crashes, delay_ms): (u64, u64)) -> io::Result<Child> {
    let kept = fds.kept;
    let n = kept.len();
    let floor = LISTEN_FDS_START + n as RawFd + 3;
    // Above every target number, so no dup2 below overwrites a source still to be moved.
    let mut sources = Vec::with_capacity(n + 3);
    for fd in kept.values() {
        sources.push(fdstore::dup_at_least(fd.as_fd(), floor)?);
    }
    sources.push(fdstore::dup_at_least(fds.notify, floor)?);
    let names: Vec<&str> = kept.keys().map(String::as_str).collect();
    let names_fd = fdstore::names_fd(&names)?;
    sources.push(fdstore::dup_at_least(names_fd.as_fd(), floor)?);
    drop(names_fd);
    sources.push(fdstore::dup_at_least(fds.lock, floor)?);
    let raw: Vec<RawFd> = sources.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(ROLE_ENV, "worker")
        .env("LISTEN_FDS", n.to_string())
        .env(FDNAMES_FD_ENV, (LISTEN_FDS_START + n as RawFd + 1).to_string())
        .env(NOTIFY_FD_ENV, (LISTEN_FDS_START + n as RawFd).to_string())
        .env(LOCK_FD_ENV, (LISTEN_FDS_START + n as RawFd + 2).to_string())
        .env(CRASHES_ENV, crashes.to_string())
        .env(DELAY_ENV, delay_ms.to_string())
        .env_remove("LISTEN_FDNAMES")
        .env_remove("LISTEN_PID")
        .env_remove("NOTIFY_SOCKET");
    // SAFETY: the closure only calls async-signal-safe functions (sigprocmask, prctl, getppid,
    // dup2) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != parent {
                return Err(io::Error::other("the supervisor is gone"));
            }
            for (i, fd) in raw.iter().enumerate() {
                if libc::dup2(*fd, LISTEN_FDS_START + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    drop(sources);
    child
}

/// Waits until the signal fd or the socket (`-1`: none) is readable, or `timeout` passed
/// (EINTR retried: a retry waits the whole `timeout` again, which the callers' deadlines bound).
fn poll2(a: RawFd, b: RawFd, timeout: Option<Duration>) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd { fd: a, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: b, events: libc::POLLIN, revents: 0 },
    ];
    // Rounded up, so a wait never ends just short of its deadline.
    let ms = timeout.map_or(-1, |t| i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX));
    loop {
        // SAFETY: polls a live array of two entries (a negative fd is ignored by poll).
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if rc >= 0 {
            return Ok((fds[0].revents != 0, fds[1].revents != 0));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// SIGTERM, SIGINT, SIGHUP and SIGCHLD, blocked and read from a signalfd.
struct Signals {
    fd: OwnedFd,
}

impl Signals {
    fn block() -> io::Result<Signals> {
        // SAFETY: plain signal-set manipulation on a local set; the supervisor has one thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
                libc::sigaddset(&mut set, s);
            }
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Signals { fd: OwnedFd::from_raw_fd(fd) })
        }
    }

    /// The signals delivered since the last read.
    fn read(&self) -> io::Result<Vec<i32>> {
        let mut out = Vec::new();
        loop {
            // SAFETY: reads whole signalfd_siginfo records into a live, correctly sized value.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            let n = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut info).cast(), size) };
            if n == size as isize {
                out.push(info.ssi_signo as i32);
                continue;
            }
            let e = io::Error::last_os_error();
            return if n < 0 && e.kind() == io::ErrorKind::WouldBlock { Ok(out) } else { Err(e) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }

    #[test]
    fn drain_keeps_replaces_and_removes_by_name() {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let f1 = tempfile::tempfile().unwrap();
        let f2 = tempfile::tempfile().unwrap();
        let send = |text: &str, fd: Option<&std::fs::File>| {
            let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
            crate::notify::send(a.as_raw_fd(), None, text.as_bytes(), &fds).unwrap();
        };
        send("FDSTORE=1\nFDNAME=fuse-a", Some(&f1));
        send("FDSTORE=1\nFDNAME=http", Some(&f1));
        send("FDSTORE=1\nFDNAME=fuse-a", Some(&f2));
        send("FDSTORE=1\nFDNAME=nofd", None);
        let mut kept = BTreeMap::new();
        assert!(!drain(b.as_raw_fd(), &mut kept, 10));
        assert_eq!(kept.keys().cloned().collect::<Vec<_>>(), vec!["fuse-a".to_string(), "http".into()]);
        send("FDSTOREREMOVE=1\nFDNAME=fuse-a", None);
        send("READY=1", None);
        assert!(drain(b.as_raw_fd(), &mut kept, 10));
        assert_eq!(kept.keys().cloned().collect::<Vec<_>>(), vec!["http".to_string()]);
        // Past the bound a new name is not kept (a known one is still replaced).
        send("FDSTORE=1\nFDNAME=fuse-b", Some(&f1));
        send("FDSTORE=1\nFDNAME=http", Some(&f2));
        drain(b.as_raw_fd(), &mut kept, 1);
        assert_eq!(kept.keys().cloned().collect::<Vec<_>>(), vec!["http".to_string()]);
    }

    #[test]
    fn restarts_wait_doubling_delays_except_after_a_healthy_run() {
        let ms = Duration::from_millis;
        let mut policy = RestartPolicy::default();
        assert_eq!((policy.healthy_run, policy.first_delay, policy.max_delay), (ms(10_000), ms(250), ms(30_000)));
        // Crashes soon after ready (or before it): 250 ms, doubling, bounded by 30 s.
        let short = Some(ms(500));
        let delays: Vec<u64> =
            (0..10).map(|i| policy.next_delay(if i % 2 == 0 { short } else { None }).as_millis() as u64).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000, 30_000]);
        // A worker that ran 10 s after it was ready is restarted at once, and the delays start over.
        assert_eq!(policy.next_delay(Some(ms(10_000))), Duration::ZERO);
        assert_eq!(policy.next_delay(Some(ms(9_999))), ms(250));
        assert_eq!(policy.next_delay(Some(ms(3_600_000))), Duration::ZERO);
        assert_eq!(policy.next_delay(None), ms(250));
        // A completed graceful restart ends a run of failures as well.
        assert_eq!(policy.next_delay(None), ms(500));
        policy.reset();
        assert_eq!(policy.next_delay(Some(ms(1))), ms(250));
    }

    #[test]
    fn the_kept_bound_leaves_room_to_start_a_worker() {
        assert_eq!(kept_bound(20_000), 9_968);
        assert_eq!(kept_bound(1 << 20), MAX_KEPT_FDS);
        assert_eq!(kept_bound(10), 0);
    }
}
