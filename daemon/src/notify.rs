//! systemd readiness notification (`sd_notify` protocol): one datagram to `$NOTIFY_SOCKET`, if set.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (e.g. `READY=1`) to the service manager; `Ok(false)` when not run under one.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let socket = socket.into_encoded_bytes();
    let addr = match socket.strip_prefix(b"@") {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
        None => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(&socket))?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
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
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(sent.unwrap());
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert!(!notify("READY=1").unwrap());
    }
}
