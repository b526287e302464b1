//! The data directory's lock (review D8): `flock(<data_dir>/.lock, LOCK_EX|LOCK_NB)`, held by
//! `scopefs serve` for its whole life (outside systemd by the supervisor, whose workers inherit
//! the locked descriptor: `LOCK_FD_ENV`) and by each offline command that opens scopes, the
//! store or the registry for writing, while it runs. Whoever comes second refuses at once.
//!
//! The lock belongs to the open file description, so it goes when the last process holding the
//! descriptor ends (a crash included); it is close-on-exec everywhere except where the supervisor
//! hands it to a worker on purpose, and nothing ever unlocks it explicitly (`LOCK_UN` would
//! unlock the supervisor's description from a worker). The file names its holder (`serve <pid>`
//! or `command <pid> <name>`), for the refusal's message only.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = ".lock";
/// Names the variable with the number of the locked descriptor a supervisor's worker inherits.
pub const LOCK_FD_ENV: &str = "SCOPEFS_DATA_LOCK_FD";

/// Who holds (or wants) the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// `scopefs serve`: the daemon (its supervisor, or the daemon itself under systemd).
    Daemon,
    /// An offline command (`fsck`, `gc`, `import`, `scope create`).
    Command(String),
}

/// Errors of taking the data directory's lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("a scopefs daemon is running on this data directory; stop it first")]
    DaemonRunning,
    #[error("`scopefs {0}` is running on this data directory; wait for it to finish")]
    CommandRunning(String),
    #[error("cannot lock the data directory: {0}")]
    Io(#[from] io::Error),
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
}

impl DataDirLock {
    /// Takes the lock of `data_dir` (created 0700 if missing) for `holder`, or refuses naming who
    /// holds it.
    pub fn acquire(data_dir: &Path, holder: &Holder) -> Result<DataDirLock, LockError> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(data_dir)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(data_dir.join(LOCK_FILE))?;
        if !try_flock(file.as_fd())? {
            return Err(refusal(&mut file));
        }
        let line = match holder {
            Holder::Daemon => format!("serve {}\n", std::process::id()),
            Holder::Command(name) => format!("command {} {name}\n", std::process::id()),
        };
        file.set_len(0)?;
        std::os::unix::fs::FileExt::write_all_at(&file, line.as_bytes(), 0)?;
        Ok(DataDirLock { file })
    }

    /// The lock of `data_dir` a supervisor handed to this worker (`LOCK_FD_ENV`), when it is one.
    /// Clears the variable and makes the descriptor close-on-exec. Must run before any other
    /// thread exists.
    pub fn inherited(data_dir: &Path) -> Result<Option<DataDirLock>, LockError> {
        let Some(fd) = std::env::var(LOCK_FD_ENV).ok().and_then(|v| v.parse::<RawFd>().ok()) else {
            return Ok(None);
        };
        // SAFETY: called at startup, before the runtime or any other thread exists.
        unsafe { std::env::remove_var(LOCK_FD_ENV) };
        // SAFETY: only the close-on-exec flag of the inherited descriptor is set; it fails
        // harmlessly on a number that is not open.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Ok(None);
        }
        // SAFETY: the supervisor passed `fd` to this process for exactly this; nothing else owns it.
        DataDirLock::adopt(data_dir, unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `fd` as the lock of `data_dir` when it is that directory's lock file and its open file
    /// description holds the lock (a killed worker shared it, so a restarted one never waits);
    /// `None` when it is another file (the configured data directory changed), which is left
    /// open: it is not this module's to close.
    fn adopt(data_dir: &Path, fd: OwnedFd) -> Result<Option<DataDirLock>, LockError> {
        let file = File::from(fd);
        let ours = match std::fs::metadata(data_dir.join(LOCK_FILE)) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let held = file.metadata()?;
        if ours.is_none_or(|ours| (held.dev(), held.ino()) != (ours.dev(), ours.ino())) {
            let _ = std::os::fd::IntoRawFd::into_raw_fd(file);
            return Ok(None);
        }
        // Succeeds at once on the open file description that holds the lock.
        if !try_flock(file.as_fd())? {
            return Err(LockError::DaemonRunning);
        }
        Ok(Some(DataDirLock { file }))
    }

    /// The locked descriptor (the supervisor passes it to each worker).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// For an offline command: the lock of `data_dir`, held until dropped.
pub fn for_command(data_dir: &Path, name: &str) -> Result<DataDirLock, LockError> {
    DataDirLock::acquire(data_dir, &Holder::Command(name.to_string()))
}

/// `flock(LOCK_EX|LOCK_NB)`: `false` when another open file description holds the lock.
fn try_flock(fd: BorrowedFd<'_>) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) on a live descriptor.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// The refusal naming the lock's holder, from what it wrote in the file (the daemon when unclear).
fn refusal(file: &mut File) -> LockError {
    let mut text = String::new();
    let _ = file.by_ref().take(512).read_to_string(&mut text);
    let mut words = text.split_whitespace();
    match (words.next(), words.next()) {
        (Some("command"), Some(_pid)) => LockError::CommandRunning(words.collect::<Vec<_>>().join(" ")),
        _ => LockError::DaemonRunning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_until_it_lets_go() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let daemon = DataDirLock::acquire(&data, &Holder::Daemon).unwrap();
        let err = for_command(&data, "gc").unwrap_err();
        assert!(matches!(err, LockError::DaemonRunning), "{err}");
        assert_eq!(err.to_string(), "a scopefs daemon is running on this data directory; stop it first");
        assert!(matches!(DataDirLock::acquire(&data, &Holder::Daemon), Err(LockError::DaemonRunning)));
        drop(daemon);
        let create = for_command(&data, "scope create").unwrap();
        let err = DataDirLock::acquire(&data, &Holder::Daemon).unwrap_err();
        assert_eq!(err.to_string(), "`scopefs scope create` is running on this data directory; wait for it to finish");
        drop(create);
        DataDirLock::acquire(&data, &Holder::Daemon).unwrap();
    }

    #[test]
    fn a_worker_adopts_the_supervisors_descriptor_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let (data, other) = (tmp.path().join("data"), tmp.path().join("other"));
        let supervisor = DataDirLock::acquire(&data, &Holder::Daemon).unwrap();
        // What a worker inherits: the same open file description (a dup), locked.
        let shared = || OwnedFd::from(supervisor.file.try_clone().unwrap());
        let first = DataDirLock::adopt(&data, shared()).unwrap().expect("the worker's lock");
        // A killed worker's copy still open (not yet reaped): the next worker is not refused.
        let second = DataDirLock::adopt(&data, shared()).unwrap().expect("the restarted worker's lock");
        drop((first, second));
        // Another open of the file does not hold the lock: refused.
        let stranger = OwnedFd::from(File::open(data.join(LOCK_FILE)).unwrap());
        assert!(matches!(DataDirLock::adopt(&data, stranger), Err(LockError::DaemonRunning)));
        // The supervisor's lock of another data directory (with a lock file or none yet) is not
        // this one's.
        assert!(DataDirLock::adopt(&other, shared()).unwrap().is_none());
        DataDirLock::acquire(&other, &Holder::Daemon).map(drop).unwrap();
        assert!(DataDirLock::adopt(&other, shared()).unwrap().is_none());
    }

    #[test]
    fn the_descriptor_is_close_on_exec() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(tmp.path(), &Holder::Daemon).unwrap();
        // SAFETY: F_GETFD on a live descriptor.
        let flags = unsafe { libc::fcntl(lock.fd().as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}
