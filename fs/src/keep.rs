//! Keeping mounts across daemon restarts: the names under which each mount's `/dev/fuse`
//! descriptor is handed to a keeper (systemd's fd store or the `scopefs serve` supervisor), the
//! keeper interface, and the resend request that re-queues what a dead server had read.
//!
//! A kept descriptor holds the FUSE connection open while no daemon runs: the kernel queues the
//! mount's requests (callers wait instead of getting `ENOTCONN`) until the next daemon resumes
//! the connection (`MountManager::resuming`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use scopefs::ids::ScopeId;

/// Prefix of the fd name of a scope's FUSE connection: `fuse-<scope_id>`.
const FUSE_FD_PREFIX: &str = "fuse-";

/// `FUSE_NOTIFY_RESEND` (Linux 6.9, protocol 7.40): move every request the server had read but
/// not answered back to the pending queue.
const FUSE_NOTIFY_RESEND: i32 = 7;

/// Holds descriptors for the next daemon process. Failures are logged by the caller: a mount
/// whose descriptor is not kept still works, it just does not survive a restart.
pub trait FdKeeper: Send + Sync {
    /// Keeps (a duplicate of) `fd` under `name`, replacing a descriptor kept under that name.
    fn keep(&self, name: &str, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// Closes the descriptor kept under `name`, if any.
    fn forget(&self, name: &str) -> io::Result<()>;
}

/// The fd name of a scope's FUSE connection.
pub fn fuse_fd_name(scope: &ScopeId) -> String {
    format!("{FUSE_FD_PREFIX}{scope}")
}

/// The scope whose FUSE connection an fd name names, if it names one.
pub fn scope_of_fd_name(name: &str) -> Option<ScopeId> {
    ScopeId::parse(name.strip_prefix(FUSE_FD_PREFIX)?).ok()
}

/// Asks the kernel to hand again every request of this connection that was read but not answered
/// (by a server that died). Older kernels refuse the notification (`ENOSYS`/`EINVAL`): their
/// callers of such requests wait until the connection ends.
pub fn request_resend(fd: BorrowedFd<'_>) -> io::Result<()> {
    // struct fuse_out_header { u32 len; i32 error; u64 unique; }: a notification has unique 0
    // and carries its code in `error`.
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&16u32.to_ne_bytes());
    header[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    // SAFETY: writes 16 initialized bytes from a live buffer to a valid descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), header.as_ptr().cast(), header.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_names_round_trip_and_reject_others() {
        let scope = ScopeId::generate();
        let name = fuse_fd_name(&scope);
        assert!(!name.contains(':'), "systemd fd names cannot contain ':'");
        assert_eq!(scope_of_fd_name(&name), Some(scope));
        assert_eq!(scope_of_fd_name("http"), None);
        assert_eq!(scope_of_fd_name("fuse-not a scope"), None);
    }
}
