//! Mount layout syscalls: the host view (a `nosymfollow,nosuid,nodev` bind of a real FUSE mount),
//! unmounting, and aborting a FUSE connection through the fuse control filesystem.
//!
//! Layout: a scope's real FUSE mount is `<real_root>/<scope_id>`, where `<real_root>` is the root-only
//! (`0700`) sibling `.<name>.real` of the mount root (`/run/scopefs/.scopes.real` for the default
//! `/run/scopefs/scopes`). Containers bind the real mount, where symlinks resolve as POSIX says (in
//! the container's namespace). The host sees `<mount_root>/<scope_id>`, a bind of the real mount
//! remounted `nosymfollow`: a host process that opens a path through a scope's symlink gets `ELOOP`
//! (`readlink` still answers), so a link to `/etc/shadow` or to another scope is harmless there.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the kernel's fuse control filesystem lives (one directory per connection).
const FUSECTL: &str = "/sys/fs/fuse/connections";

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The root-only directory holding the real mounts of `mount_root`: its sibling `.<name>.real`.
pub fn real_root_of(mount_root: &Path) -> PathBuf {
    let name = mount_root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "scopes".into());
    let parent = mount_root.parent().unwrap_or_else(|| Path::new("/"));
    parent.join(format!(".{name}.real"))
}

/// Binds `real` at `view` and remounts the bind `nosymfollow,nosuid,nodev`.
pub fn bind_view(real: &Path, view: &Path) -> io::Result<()> {
    let (src, dst) = (cstr(real)?, cstr(view)?);
    // SAFETY: valid NUL-terminated paths that outlive the calls; null fstype/data are allowed for binds.
    unsafe {
        check(libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()))?;
        let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSYMFOLLOW | libc::MS_NOSUID | libc::MS_NODEV;
        if let Err(e) = check(libc::mount(std::ptr::null(), dst.as_ptr(), std::ptr::null(), flags, std::ptr::null())) {
            // Never leave a view that follows links.
            let _ = libc::umount2(dst.as_ptr(), libc::MNT_DETACH);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts `path`; a busy mount is detached lazily (answered `true`: someone here still uses it),
/// a path that is not a mount is left alone.
pub fn unmount_path(path: &Path) -> io::Result<bool> {
    let c = cstr(path)?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the calls.
    match check(unsafe { libc::umount2(c.as_ptr(), 0) }) {
        Ok(()) => Ok(false),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            // SAFETY: as above.
            check(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }).map(|()| true)
        }
        Err(e) => Err(e),
    }
}

/// Detaches `path` lazily.
pub fn lazy_unmount(path: &Path) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    check(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) })
}

/// The fuse control directory name of the connection mounted at `mountpoint`: the kernel's
/// encoding of the superblock's device number (`major << 20 | minor`).
pub fn connection_of(mountpoint: &Path) -> io::Result<Connection> {
    let dev = device_of(mountpoint)?;
    let name = ((u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev))).to_string();
    let dir_ino = std::fs::metadata(Path::new(FUSECTL).join(&name)).map(|m| m.ino()).ok();
    Ok(Connection { name, dir_ino })
}

/// The device number of the file system mounted at `path`, from the kernel's cached attributes
/// (`AT_STATX_DONT_SYNC`): asking the FUSE daemon for the root's attributes would open the scope's
/// metadata at every mount, for a number the kernel knows itself.
fn device_of(path: &Path) -> io::Result<libc::dev_t> {
    let c = cstr(path)?;
    // SAFETY: statx into a zeroed struct with a NUL-terminated path that outlives the call.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_STATX_DONT_SYNC, libc::STATX_TYPE, &mut st) })?;
    Ok(libc::makedev(st.stx_dev_major, st.stx_dev_minor))
}

/// Sets the readahead of the file system mounted at `path` (`read_ahead_kb` of its backing
/// device): the kernel gives FUSE at most its default at INIT, more is this knob.
pub fn set_readahead(path: &Path, kib: u32) -> io::Result<()> {
    let dev = device_of(path)?;
    std::fs::write(format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev)), kib.to_string())
}

/// A FUSE connection as the fuse control filesystem names it. The number is the mount's device
/// number, which the kernel reuses as soon as the connection ends; the control directory's inode
/// number is not reused, so it tells this connection from a later one that got the same number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    name: String,
    /// Inode of `<fusectl>/<name>` when the connection was recorded; `None` if it could not be read.
    dir_ino: Option<u64>,
}

impl Connection {
    /// Whether this very connection still exists (some mount of it, or an open file on a detached
    /// one, survives). A connection whose control directory could not be identified is never
    /// reported alive, so an unrelated mount is never aborted in its place.
    pub fn alive(&self) -> bool {
        self.alive_under(Path::new(FUSECTL))
    }

    fn alive_under(&self, control: &Path) -> bool {
        let Some(ino) = self.dir_ino else { return false };
        std::fs::metadata(control.join(&self.name)).is_ok_and(|m| m.ino() == ino)
    }

    /// Aborts the connection: pending and future requests fail (`ENOTCONN`) in every mount of it,
    /// and the session's reads end, so its thread can be joined. Does nothing (`Ok(false)`) when
    /// the connection has ended, even if a new one now has its number.
    pub fn abort(&self) -> io::Result<bool> {
        if !self.alive() {
            return Ok(false);
        }
        std::fs::write(Path::new(FUSECTL).join(&self.name).join("abort"), b"1")?;
        Ok(true)
    }
}

/// Mounts the fuse control filesystem when nothing has (systemd normally does), so a connection
/// can be aborted; `table` is this process's `/proc/self/mountinfo`. Failure only costs that
/// ability; the caller logs it.
pub fn ensure_fusectl(table: &str) -> io::Result<()> {
    let mounted = table.lines().any(|l| l.split(' ').nth(4) == Some(FUSECTL));
    if mounted {
        return Ok(());
    }
    let (src, dst) = (CString::new("fusectl").map_err(io::Error::other)?, cstr(Path::new(FUSECTL))?);
    // SAFETY: valid NUL-terminated strings that outlive the call.
    check(unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), src.as_ptr(), 0, std::ptr::null()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_alive_only_while_its_own_control_directory_exists() {
        let control = tempfile::tempdir().unwrap();
        let dir = control.path().join("41");
        std::fs::create_dir(&dir).unwrap();
        let ino = std::fs::metadata(&dir).unwrap().ino();
        let conn = Connection { name: "41".into(), dir_ino: Some(ino) };
        assert!(conn.alive_under(control.path()));
        // The connection ends and a new one gets its number: a different directory, not ours.
        std::fs::rename(&dir, control.path().join("old")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        assert!(!conn.alive_under(control.path()));
        std::fs::remove_dir(&dir).unwrap();
        assert!(!conn.alive_under(control.path()));
        let unknown = Connection { name: "old".into(), dir_ino: None };
        assert!(!unknown.alive_under(control.path()), "an unidentified connection is never aborted");
    }

    #[test]
    fn real_root_is_a_hidden_sibling_of_the_mount_root() {
        assert_eq!(real_root_of(Path::new("/run/scopefs/scopes")), PathBuf::from("/run/scopefs/.scopes.real"));
        assert_eq!(real_root_of(Path::new("/tmp/x/mnt")), PathBuf::from("/tmp/x/.mnt.real"));
    }
}
