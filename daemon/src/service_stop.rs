//! `scopefs service-stop --unit <name>`, the systemd unit's `ExecStop=`: tells a stop of the unit
//! from a restart. systemd sends the daemon `SIGTERM` for both, and on `SIGTERM` the daemon keeps its
//! mounts for the next process (their connections wait in the fd store). A stop closes the fd store
//! (systemd 252 has no `FileDescriptorStorePreserve=`), which would leave the scopes' containers
//! running on dead mounts with no daemon to end them. So this runs first and asks systemd which job
//! it runs on the unit: for a `stop` it sends the daemon (`$MAINPID`) `SIGINT`, a real stop (the
//! environments are ended and billed, the scopes unmounted), and waits until it has exited; for a
//! `restart`, or with no job (the process ended by itself and `Restart=` brings it back), it does
//! nothing and the `SIGTERM` that follows keeps the mounts.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the daemon may take to stop after `SIGINT` (the unit allows `TimeoutStopSec=90s` for
/// the whole stop).
const STOP_WAIT: Duration = Duration::from_secs(85);

/// What the hook does.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send `SIGINT` to this process and wait for it to exit.
    Stop(i32),
    /// Nothing; why.
    Keep(&'static str),
}

/// The hook's decision from the unit's main process and the type of the job systemd runs on it.
pub fn decide(main_pid: Option<i32>, job: Option<&str>) -> Decision {
    match (main_pid, job) {
        (None, _) => Decision::Keep("no main process"),
        (Some(_), None) => Decision::Keep("no job runs: the process ended by itself"),
        (Some(pid), Some("stop")) => Decision::Stop(pid),
        (Some(_), Some(_)) => Decision::Keep("a restart: the mounts are kept"),
    }
}

/// The TYPE column of `unit`'s line in the output of `systemctl list-jobs` (JOB UNIT TYPE STATE).
pub fn job_type_in(listing: &str, unit: &str) -> Option<String> {
    listing.lines().find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() >= 4 && cols[1] == unit).then(|| cols[2].to_string())
    })
}

/// The type of the job systemd runs on `unit` now (`stop`, `restart`, …), if any.
fn running_job(unit: &str) -> anyhow::Result<Option<String>> {
    let out = Command::new("systemctl").args(["list-jobs", "--no-legend", "--no-pager", "--full", unit]).output()?;
    anyhow::ensure!(out.status.success(), "systemctl list-jobs {unit} exited with {}", out.status);
    Ok(job_type_in(&String::from_utf8_lossy(&out.stdout), unit))
}

/// Runs the hook for `unit` with the main process named by `$MAINPID`.
pub fn run(unit: &str) -> anyhow::Result<()> {
    let main_pid = std::env::var("MAINPID").ok().and_then(|p| p.parse::<i32>().ok()).filter(|p| *p > 1);
    let job = match main_pid {
        Some(_) => running_job(unit)?,
        None => None,
    };
    match decide(main_pid, job.as_deref()) {
        Decision::Keep(why) => {
            tracing::info!(unit, why, "service stop: the daemon keeps its mounts");
            Ok(())
        }
        Decision::Stop(pid) => {
            tracing::info!(unit, pid, "service stop: asking the daemon to end its environments and unmount");
            stop_and_wait(pid, STOP_WAIT)
        }
    }
}

/// Sends `SIGINT` to `pid` and waits until it has exited, through a pidfd (the process is the one
/// signalled and watched even if its number is reused). A process already gone is done.
fn stop_and_wait(pid: i32, limit: Duration) -> anyhow::Result<()> {
    // SAFETY: pidfd_open(2) with a plain pid and no flags; the result is a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(anyhow::anyhow!("pidfd_open of the daemon: {e}"));
    }
    // SAFETY: `raw` is a descriptor this process just opened and owns alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    // SAFETY: pidfd_send_signal(2) on a live pidfd, no siginfo, no flags.
    let sent = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), libc::SIGINT, 0usize, 0) };
    if sent < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(anyhow::anyhow!("signalling the daemon: {e}"));
    }
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(!left.is_zero(), "the daemon did not exit within {limit:?} of SIGINT");
        let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: poll(2) on one live descriptor; a pidfd is readable once its process has exited.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            n if n > 0 => return Ok(()),
            0 => {}
            _ => {
                let e = io::Error::last_os_error();
                anyhow::ensure!(e.kind() == io::ErrorKind::Interrupted, "waiting for the daemon: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stop_job_stops_the_daemon() {
        assert_eq!(decide(Some(42), Some("stop")), Decision::Stop(42));
        for job in [Some("restart"), Some("try-restart"), Some("reload"), None] {
            assert!(matches!(decide(Some(42), job), Decision::Keep(_)), "{job:?}");
        }
        assert!(matches!(decide(None, Some("stop")), Decision::Keep(_)));
    }

    #[test]
    fn the_job_type_is_read_from_the_units_line() {
        let listing = "  81 docker.service start waiting\n  80 scopefs.service stop running\n";
        assert_eq!(job_type_in(listing, "scopefs.service").as_deref(), Some("stop"));
        assert_eq!(job_type_in(listing, "scopefs").as_deref(), None);
        assert_eq!(job_type_in("", "scopefs.service"), None);
        assert_eq!(job_type_in("  7 scopefs.service restart running\n", "scopefs.service").as_deref(), Some("restart"));
    }
}
