//! The system calls of the recording filesystem's pass-through: names resolved against `O_PATH`
//! descriptors of the backing directory's inodes (so a file keeps working after a rename or an
//! unlink of another of its names), each returning the errno to answer on failure.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};

pub type Sys<T> = Result<T, Errno>;

fn last_errno() -> Errno {
    Errno::from_i32(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

pub fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn cname(name: &OsStr) -> Sys<CString> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

fn check(rc: libc::c_int) -> Sys<()> {
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// `/proc/self/fd/N` of a descriptor: opening it opens the inode itself.
pub fn proc_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// An `O_PATH` descriptor of `dir/name` (not following a final symlink).
pub fn open_path(dir: &OwnedFd, name: &OsStr) -> Sys<OwnedFd> {
    let n = cname(name)?;
    // SAFETY: a valid directory descriptor and NUL-terminated name; the result is checked.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), n.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a descriptor this call just opened and nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `O_PATH` descriptor of the directory at `path`.
pub fn open_root(path: &std::path::Path) -> Sys<OwnedFd> {
    let p = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a descriptor this call just opened.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn fstat(fd: RawFd) -> Sys<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: a valid descriptor, an empty path with AT_EMPTY_PATH and a valid out pointer.
    check(unsafe { libc::fstatat(fd, empty.as_ptr(), &mut st, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// The backing inode number `dir/name` names.
pub fn ino_at(dir: &OwnedFd, name: &OsStr) -> Sys<u64> {
    let n = cname(name)?;
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid directory descriptor, a NUL-terminated name and a valid out pointer.
    check(unsafe { libc::fstatat(dir.as_raw_fd(), n.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st.st_ino)
}

/// Opens the inode behind an `O_PATH` descriptor for I/O (`flags`: access mode and the like).
pub fn reopen(fd: &OwnedFd, flags: i32) -> Sys<File> {
    let p = CString::new(proc_path(fd).as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let f = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) };
    if f < 0 {
        return Err(last_errno());
    }
    // SAFETY: a descriptor this call just opened.
    Ok(unsafe { File::from_raw_fd(f) })
}

/// Creates the regular file `dir/name` (it must not exist) and opens it read-write.
pub fn create_file(dir: &OwnedFd, name: &OsStr, mode: u32) -> Sys<File> {
    let n = cname(name)?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and NUL-terminated name; the result is checked.
    let f = unsafe { libc::openat(dir.as_raw_fd(), n.as_ptr(), flags, mode as libc::c_uint) };
    if f < 0 {
        return Err(last_errno());
    }
    // SAFETY: a descriptor this call just opened.
    Ok(unsafe { File::from_raw_fd(f) })
}

pub fn mkdir(dir: &OwnedFd, name: &OsStr, mode: u32) -> Sys<()> {
    let n = cname(name)?;
    // SAFETY: a valid directory descriptor and NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), mode as libc::mode_t) })
}

pub fn symlink(dir: &OwnedFd, name: &OsStr, target: &OsStr) -> Sys<()> {
    let (n, t) = (cname(name)?, cname(target)?);
    // SAFETY: NUL-terminated strings and a valid directory descriptor.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) })
}

/// A further name `dir/name` of the inode behind `fd`.
pub fn link(fd: &OwnedFd, dir: &OwnedFd, name: &OsStr) -> Sys<()> {
    let from = CString::new(proc_path(fd).as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let n = cname(name)?;
    // SAFETY: NUL-terminated strings and valid descriptors; AT_SYMLINK_FOLLOW resolves the
    // /proc magic link to the inode.
    check(unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), dir.as_raw_fd(), n.as_ptr(), libc::AT_SYMLINK_FOLLOW) })
}

pub fn unlink(dir: &OwnedFd, name: &OsStr, is_dir: bool) -> Sys<()> {
    let n = cname(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: a valid directory descriptor and NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), n.as_ptr(), flags) })
}

pub fn rename(from: &OwnedFd, name: &OsStr, to: &OwnedFd, new: &OsStr, flags: u32) -> Sys<()> {
    let (a, b) = (cname(name)?, cname(new)?);
    // SAFETY: valid directory descriptors and NUL-terminated names.
    check(unsafe { libc::renameat2(from.as_raw_fd(), a.as_ptr(), to.as_raw_fd(), b.as_ptr(), flags) })
}

pub fn readlink(fd: &OwnedFd) -> Sys<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    let empty = c"";
    // SAFETY: a valid O_PATH descriptor of a symlink, an empty path, and a buffer of its length.
    let n = unsafe { libc::readlinkat(fd.as_raw_fd(), empty.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(last_errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn chmod(fd: &OwnedFd, mode: u32) -> Sys<()> {
    std::fs::set_permissions(proc_path(fd), std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
        .map_err(io_errno)
}

pub fn chown(fd: &OwnedFd, uid: Option<u32>, gid: Option<u32>) -> Sys<()> {
    std::os::unix::fs::chown(proc_path(fd), uid, gid).map_err(io_errno)
}

pub fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// The attributes to answer for a backing inode shown as `ino`.
pub fn attr(ino: u64, st: &libc::stat) -> FileAttr {
    let t = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: t(st.st_atime, st.st_atime_nsec),
        mtime: t(st.st_mtime, st.st_mtime_nsec),
        ctime: t(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}
