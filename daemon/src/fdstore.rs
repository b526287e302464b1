//! Descriptors kept across daemon restarts: what a started daemon inherits (`LISTEN_FDS` and
//! `LISTEN_FDNAMES` from fd 3, as systemd passes its fd store and as the supervisor passes its
//! own), the keeper that hands new descriptors to the manager (`FDSTORE=1`, `FDSTOREREMOVE=1`),
//! and the parsing of those messages (the supervisor's side).
//!
//! Kept: each scope's `/dev/fuse` connection (`fuse-<scope_id>`, see `scopefs_fs::keep`) and the
//! HTTP listening socket (`http`), so a restart neither unmounts nor refuses connections.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use scopefs::ids::ScopeId;
use scopefs_fs::keep::{scope_of_fd_name, FdKeeper};

use crate::notify;

/// First inherited descriptor (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;
/// Fd name of the HTTP listening socket.
pub const HTTP_FD_NAME: &str = "http";
/// Most descriptors the supervisor keeps and a start accepts. (Under systemd the unit's
/// `FileDescriptorStoreMax=` is the bound: systemd passes the names in one environment variable,
/// which execve limits to 128 KiB, about 3,000 names.)
pub const MAX_KEPT_FDS: usize = 65_536;
/// Names the variable of the descriptor holding the kept descriptors' names (`:`-separated), which
/// the supervisor passes instead of `LISTEN_FDNAMES`: no environment variable can hold thousands.
pub const FDNAMES_FD_ENV: &str = "SCOPEFS_LISTEN_FDNAMES_FD";

/// The inherited descriptors, by name.
#[derive(Default)]
pub struct Inherited {
    pub http: Option<OwnedFd>,
    pub mounts: HashMap<ScopeId, OwnedFd>,
}

/// Takes the descriptors this process inherited and clears the variables that announced them (so
/// children never see them). Unnamed or unknown descriptors are closed.
pub fn inherit() -> Inherited {
    let fds = std::env::var("LISTEN_FDS").ok();
    let names = std::env::var("LISTEN_FDNAMES").ok().or_else(|| {
        let fd = std::env::var(FDNAMES_FD_ENV).ok()?.parse::<RawFd>().ok()?;
        let count = fds.as_deref().and_then(|n| n.parse::<usize>().ok()).unwrap_or(0).min(MAX_KEPT_FDS);
        read_names(fd, count)
    });
    let pid = std::env::var("LISTEN_PID").ok();
    for var in ["LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID", FDNAMES_FD_ENV] {
        // SAFETY: called at startup, before the runtime or any other thread exists.
        unsafe { std::env::remove_var(var) };
    }
    if let Some(fd) = std::env::var(notify::NOTIFY_FD_ENV).ok().and_then(|v| v.parse::<RawFd>().ok()) {
        // SAFETY: only the close-on-exec flag of the inherited notification socket is set.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let mut out = Inherited::default();
    for (fd, name) in parse_listen(fds.as_deref(), names.as_deref(), pid.as_deref(), std::process::id()) {
        // SAFETY: the manager passed `fd` to this process and nothing else in it owns the number.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor; only its close-on-exec flag is set.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        if name == HTTP_FD_NAME {
            out.http = Some(owned);
        } else if let Some(scope) = scope_of_fd_name(&name) {
            out.mounts.insert(scope, owned);
        } else {
            tracing::warn!(name, "closing an inherited descriptor of unknown purpose");
        }
    }
    out
}

/// The `(fd, name)` pairs announced by `LISTEN_FDS`/`LISTEN_FDNAMES`; none when `LISTEN_PID` names
/// another process (the variables were inherited by mistake) or the count is not a number.
pub fn parse_listen(fds: Option<&str>, names: Option<&str>, pid: Option<&str>, me: u32) -> Vec<(RawFd, String)> {
    if pid.is_some_and(|p| p.parse::<u32>().ok() != Some(me)) {
        return Vec::new();
    }
    let Some(n) = fds.and_then(|n| n.parse::<usize>().ok()) else { return Vec::new() };
    let n = n.min(MAX_KEPT_FDS);
    let mut names = names.unwrap_or("").split(':');
    (0..n).map(|i| (LISTEN_FDS_START + i as RawFd, names.next().unwrap_or("unknown").to_string())).collect()
}

/// The names the supervisor wrote to descriptor `fd` for `count` descriptors (at most 256 bytes
/// each), closing it.
fn read_names(fd: RawFd, count: usize) -> Option<String> {
    use std::io::Read;
    // SAFETY: the supervisor passed `fd` to this process for exactly this; nothing else owns it.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut names = String::new();
    file.take((count as u64 + 1) * 256).read_to_string(&mut names).ok()?;
    Some(names)
}

/// A descriptor holding `names` joined by `:`, read from its start (the supervisor's side of
/// `FDNAMES_FD_ENV`).
pub fn names_fd(names: &[&str]) -> io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"scopefs-fdnames".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned here.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(names.join(":").as_bytes())?;
    file.rewind()?;
    Ok(file.into())
}

/// A valid fd name: 1-255 printable ASCII characters, no `:` (systemd's rule).
pub fn valid_name(name: &str) -> bool {
    (1..=255).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

/// Hands descriptors to the service manager (systemd's fd store or the supervisor).
pub struct ManagerKeeper;

impl FdKeeper for ManagerKeeper {
    fn keep(&self, name: &str, fd: BorrowedFd<'_>) -> io::Result<()> {
        if !valid_name(name) {
            return Err(io::Error::other("invalid fd name"));
        }
        // systemd keeps every descriptor sent under a name: drop an older one first.
        self.forget(name)?;
        let sent = notify::notify_with_fds(&format!("FDSTORE=1\nFDNAME={name}"), &[fd])?;
        if sent {
            Ok(())
        } else {
            Err(io::Error::other("no service manager"))
        }
    }

    fn forget(&self, name: &str) -> io::Result<()> {
        notify::notify(&format!("FDSTOREREMOVE=1\nFDNAME={name}")).map(drop)
    }
}

/// What one notification message asks of the manager.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    /// `FDSTORE=1` with `FDNAME=`: keep the attached descriptor under that name.
    Store(String),
    /// `FDSTOREREMOVE=1` with `FDNAME=`: close the descriptor kept under that name.
    Remove(String),
    /// `READY=1`.
    Ready,
    /// Anything else (`STOPPING=1`, `STATUS=`...), or a store request without a valid name.
    Other,
}

/// Parses one notification datagram (newline-separated `KEY=VALUE` assignments).
pub fn parse_message(text: &str) -> Message {
    let mut store = false;
    let mut remove = false;
    let mut ready = false;
    let mut name = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("FDSTORE", "1")) => store = true,
            Some(("FDSTOREREMOVE", "1")) => remove = true,
            Some(("READY", "1")) => ready = true,
            Some(("FDNAME", n)) if valid_name(n) => name = Some(n.to_string()),
            _ => {}
        }
    }
    match (store, remove, name) {
        (true, false, Some(n)) => Message::Store(n),
        (false, true, Some(n)) => Message::Remove(n),
        _ if ready => Message::Ready,
        _ => Message::Other,
    }
}

/// Receives one datagram and at most `max_fds` attached descriptors (close-on-exec; extra ones
/// are closed by the kernel's truncation, `MSG_CTRUNC`).
pub fn recv_message(sock: RawFd, max_fds: usize) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut data = vec![0u8; 4096];
    let space = (max_fds * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let mut control = vec![0u8; unsafe { libc::CMSG_SPACE(space) } as usize];
    let mut fds = Vec::new();
    // SAFETY: the msghdr points at live local buffers of the given sizes; received descriptors
    // are owned exactly once.
    let n = unsafe {
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        n as usize
    };
    data.truncate(n);
    Ok((String::from_utf8_lossy(&data).into_owned(), fds))
}

/// Duplicates `fd` (close-on-exec) at a number of at least `min`.
pub fn dup_at_least(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid descriptor returns a new one we own, or -1.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_thousand_names_pass_through_a_descriptor() {
        let names: Vec<String> = (0..10_000).map(|i| format!("fuse-{i:036}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        // More than one environment variable may hold (execve: 128 KiB).
        assert!(refs.join(":").len() > 128 * 1024);
        let fd = names_fd(&refs).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        let read = read_names(raw, names.len()).unwrap();
        let pairs = parse_listen(Some("10000"), Some(&read), None, 1);
        assert_eq!(pairs.len(), 10_000);
        assert_eq!(pairs[9_999], (LISTEN_FDS_START + 9_999, names[9_999].clone()));
    }

    #[test]
    fn listen_fds_are_numbered_from_three_with_their_names() {
        let got = parse_listen(Some("3"), Some("http:fuse-a:fuse-b"), None, 42);
        assert_eq!(got, vec![(3, "http".into()), (4, "fuse-a".into()), (5, "fuse-b".into())]);
        assert_eq!(parse_listen(Some("2"), Some("http"), Some("42"), 42)[1], (4, "unknown".into()));
        assert!(parse_listen(Some("2"), Some("a:b"), Some("41"), 42).is_empty(), "LISTEN_PID of another process");
        assert!(parse_listen(None, Some("a"), None, 42).is_empty());
        assert!(parse_listen(Some("x"), None, None, 42).is_empty());
        assert_eq!(parse_listen(Some("999999"), None, None, 1).len(), MAX_KEPT_FDS);
    }

    #[test]
    fn store_messages_follow_the_sd_notify_protocol() {
        assert_eq!(parse_message("FDSTORE=1\nFDNAME=fuse-x"), Message::Store("fuse-x".into()));
        assert_eq!(parse_message("FDSTOREREMOVE=1\nFDNAME=http"), Message::Remove("http".into()));
        assert_eq!(parse_message("READY=1"), Message::Ready);
        assert_eq!(parse_message("STOPPING=1"), Message::Other);
        assert_eq!(parse_message("FDSTORE=1"), Message::Other, "a stored fd needs a name");
        assert_eq!(parse_message("FDSTORE=1\nFDNAME=a:b"), Message::Other, "':' separates LISTEN_FDNAMES");
        assert_eq!(parse_message("FDSTORE=1\nFDSTOREREMOVE=1\nFDNAME=a"), Message::Other);
        assert!(!valid_name("") && !valid_name(&"x".repeat(256)) && !valid_name("a b") && valid_name("fuse-1"));
    }

    #[test]
    fn descriptors_travel_through_a_socketpair() {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        use std::os::fd::AsFd;
        let dup = dup_at_least(file.as_fd(), 100).unwrap();
        assert!(dup.as_raw_fd() >= 100);
        // The keeper's two messages, sent on the socket the supervisor would pass.
        notify::send(a.as_raw_fd(), None, b"FDSTORE=1\nFDNAME=fuse-1", &[dup.as_fd()]).unwrap();
        notify::send(a.as_raw_fd(), None, b"FDSTOREREMOVE=1\nFDNAME=fuse-1", &[]).unwrap();
        let (text, fds) = recv_message(b.as_raw_fd(), 4).unwrap();
        assert_eq!((parse_message(&text), fds.len()), (Message::Store("fuse-1".into()), 1));
        let (text, fds) = recv_message(b.as_raw_fd(), 4).unwrap();
        assert_eq!((parse_message(&text), fds.len()), (Message::Remove("fuse-1".into()), 0));
    }
}
