//! Service-manager notifications (`sd_notify` protocol): one datagram per message to
//! `$NOTIFY_SOCKET` (systemd), or to the inherited socket `$SCOPEFS_NOTIFY_FD` (the `scopefs serve`
//! supervisor, which speaks the same protocol), optionally carrying descriptors (`FDSTORE=1`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Variable naming the inherited notification socket of a worker run by the supervisor.
pub const NOTIFY_FD_ENV: &str = "SCOPEFS_NOTIFY_FD";

/// Where notifications go.
enum Target {
    /// A connected socket inherited from the supervisor.
    Fd(RawFd),
    /// systemd's socket address.
    Addr(SocketAddr),
}

fn target() -> io::Result<Option<Target>> {
    if let Some(fd) = std::env::var_os(NOTIFY_FD_ENV) {
        let fd = fd.to_str().and_then(|s| s.parse::<RawFd>().ok()).filter(|fd| *fd > 2);
        return fd.map(|fd| Some(Target::Fd(fd))).ok_or_else(|| io::Error::other(format!("bad {NOTIFY_FD_ENV}")));
    }
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(None);
    };
    let socket = socket.into_encoded_bytes();
    let addr = match socket.strip_prefix(b"@") {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
        None => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(&socket))?,
    };
    Ok(Some(Target::Addr(addr)))
}

/// True when a service manager (systemd or the supervisor) listens.
pub fn managed() -> bool {
    matches!(target(), Ok(Some(_)))
}

/// True when the manager keeps descriptors: the supervisor, or systemd with a descriptor store
/// (systemd 254+ sets `$FDSTORE` to `FileDescriptorStoreMax=` when it is not 0; the unit also
/// sets `SCOPEFS_FDSTORE`, for older systemd).
pub fn keeps_fds() -> bool {
    let positive = |var: &str| std::env::var(var).ok().and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n > 0);
    supervised() || (managed() && (positive("FDSTORE") || positive("SCOPEFS_FDSTORE")))
}

/// True when the manager is the `scopefs serve` supervisor.
pub fn supervised() -> bool {
    matches!(target(), Ok(Some(Target::Fd(_))))
}

/// Sends `state` (e.g. `READY=1`) to the service manager; `Ok(false)` when not run under one.
pub fn notify(state: &str) -> io::Result<bool> {
    notify_with_fds(state, &[])
}

/// Sends `state` with `fds` attached (`SCM_RIGHTS`); `Ok(false)` when not run under a manager.
pub fn notify_with_fds(state: &str, fds: &[BorrowedFd<'_>]) -> io::Result<bool> {
    match target()? {
        None => Ok(false),
        Some(Target::Fd(fd)) => send(fd, None, state.as_bytes(), fds).map(|()| true),
        Some(Target::Addr(addr)) => {
            let sock = UnixDatagram::unbound()?;
            if fds.is_empty() {
                sock.send_to_addr(state.as_bytes(), &addr)?;
            } else {
                let path = addr.as_pathname().map(|p| p.as_os_str().as_bytes().to_vec());
                let name = match (path, addr.as_abstract_name()) {
                    (Some(p), _) => p,
                    (None, Some(a)) => [b"\0".as_slice(), a].concat(),
                    (None, None) => return Err(io::Error::other("unnamed notify socket")),
                };
                send(sock.as_raw_fd(), Some(&name), state.as_bytes(), fds)?;
            }
            Ok(true)
        }
    }
}

/// One `sendmsg` of `data` with `fds` as `SCM_RIGHTS`, to `name` (a `sun_path`, abstract names
/// starting with NUL) or on a connected socket.
pub(crate) fn send(sock: RawFd, name: Option<&[u8]>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    // SAFETY: every pointer below refers to a live, correctly sized local buffer for the call.
    unsafe {
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        let mut msg: libc::msghdr = std::mem::zeroed();
        if let Some(name) = name {
            if name.len() >= addr.sun_path.len() {
                return Err(io::Error::other("notify socket path too long"));
            }
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, s) in addr.sun_path.iter_mut().zip(name) {
                *d = *s as libc::c_char;
            }
            let len = std::mem::size_of::<libc::sa_family_t>() + name.len() + usize::from(name[0] != 0);
            msg.msg_name = (&raw mut addr).cast();
            msg.msg_namelen = len as libc::socklen_t;
        }
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let payload = std::mem::size_of_val(raw.as_slice()) as u32;
        let mut control = vec![0u8; libc::CMSG_SPACE(payload) as usize];
        if !raw.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = control.len() as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw.len());
        }
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `notify`, logging instead of failing (a lost notification must not stop the daemon).
pub fn notify_or_log(state: &str) {
    match notify(state) {
        Ok(true) => tracing::debug!(state, "service manager notified"),
        Ok(false) => {}
        Err(e) => tracing::warn!(state, error = %e, "service manager notification failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_one_datagram_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        // Only this test touches NOTIFY_SOCKET in this process.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        let sent = notify("READY=1");
        let file = tempfile::tempfile().unwrap();
        use std::os::fd::AsFd;
        let stored = notify_with_fds("FDSTORE=1\nFDNAME=http", &[file.as_fd()]);
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(sent.unwrap());
        assert!(stored.unwrap());
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let (text, got) = crate::fdstore::recv_message(listener.as_raw_fd(), 4).unwrap();
        assert_eq!(text, "FDSTORE=1\nFDNAME=http");
        assert_eq!(got.len(), 1, "the descriptor travels with the message");
        assert!(!notify("READY=1").unwrap());
    }
}
