//! Conversions between the kernel's and the engine's types for `ScopeFs` (a child module of
//! `adapter`): attributes, file types, open/rename/mknod flags and modes.

use std::time::SystemTime;

use fuser::{FileAttr, FileType, FopenFlags, INodeNo, Request, TimeOrNow};
use scopefs::engine::{Attr, EngineError, FileKind, Ino, OpenFlags, Opened, Owner, RenameMode, TimeSet};

use super::FastPaths;
use crate::errno::Failure;

/// `st_blksize` reported for every inode (the preferred I/O size).
const PREFERRED_IO_SIZE: u32 = 128 * 1024;

/// Converts engine attributes to the kernel's.
pub(super) fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.ctime,
        kind: file_type(attr.kind),
        perm: (attr.perm & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: PREFERRED_IO_SIZE,
        flags: 0,
    }
}

pub(super) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub(super) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(at) => TimeSet::At(at),
    }
}

/// Engine open flags from the kernel's `open(2)` flags.
pub(super) fn open_flags(flags: i32) -> OpenFlags {
    OpenFlags {
        write: flags & libc::O_ACCMODE != libc::O_RDONLY,
        truncate: flags & libc::O_TRUNC != 0,
        exclusive: flags & libc::O_EXCL != 0,
    }
}

/// Engine rename mode from `renameat2` flags; other flags (`RENAME_WHITEOUT`, or both) are an
/// unsupported request answered `EINVAL`.
pub(super) fn rename_mode(flags: u32) -> Result<RenameMode, Failure> {
    let noreplace = libc::RENAME_NOREPLACE;
    let exchange = libc::RENAME_EXCHANGE;
    let unsupported = Failure::Unsupported(EngineError::Invalid("unsupported rename flags"));
    if flags & !(noreplace | exchange) != 0 {
        return Err(unsupported);
    }
    match (flags & noreplace != 0, flags & exchange != 0) {
        (false, false) => Ok(RenameMode::Replace),
        (true, false) => Ok(RenameMode::NoReplace),
        (false, true) => Ok(RenameMode::Exchange),
        (true, true) => Err(unsupported),
    }
}

/// The kind of node `mknod` creates from its mode's type bits (device nodes are inert: the
/// mount is `nodev`, only their number is kept); another type is an unsupported request
/// answered `EINVAL`.
pub(super) fn mknod_kind(mode: u32) -> Result<FileKind, Failure> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Ok(FileKind::File),
        libc::S_IFIFO => Ok(FileKind::Fifo),
        libc::S_IFSOCK => Ok(FileKind::Socket),
        libc::S_IFCHR => Ok(FileKind::CharDevice),
        libc::S_IFBLK => Ok(FileKind::BlockDevice),
        _ => Err(Failure::Unsupported(EngineError::Invalid("unsupported file type"))),
    }
}

pub(super) fn fopen_flags(fast: &FastPaths, opened: &Opened) -> FopenFlags {
    if fast.keep_cache && opened.keep_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

pub(super) fn owner(req: &Request) -> Owner {
    Owner { uid: req.uid(), gid: req.gid() }
}

/// Placeholder attributes for `.`/`..` in readdirplus (the kernel ignores them).
pub(super) fn dot_attr(ino: Ino) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::Directory,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: PREFERRED_IO_SIZE,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use fuser::Errno;

    use super::*;

    #[test]
    fn open_flags_follow_access_mode_and_trunc() {
        assert_eq!(open_flags(libc::O_RDONLY), OpenFlags::default());
        assert!(open_flags(libc::O_WRONLY).write);
        assert!(open_flags(libc::O_RDWR).write);
        let f = open_flags(libc::O_RDWR | libc::O_TRUNC | libc::O_EXCL);
        assert!(f.write && f.truncate && f.exclusive);
    }

    #[test]
    fn rename_flags_map_to_modes() {
        assert_eq!(rename_mode(0).unwrap(), RenameMode::Replace);
        assert_eq!(rename_mode(libc::RENAME_NOREPLACE).unwrap(), RenameMode::NoReplace);
        assert_eq!(rename_mode(libc::RENAME_EXCHANGE).unwrap(), RenameMode::Exchange);
        for bad in [libc::RENAME_WHITEOUT, libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE] {
            let err = rename_mode(bad).unwrap_err();
            assert!(matches!(err, Failure::Unsupported(EngineError::Invalid(_))), "{bad:#x}: {err:?}");
            assert_eq!(err.errno(), Errno::EINVAL);
        }
    }

    #[test]
    fn mknod_types_map_to_kinds_or_are_unsupported() {
        assert_eq!(mknod_kind(libc::S_IFIFO | 0o644).unwrap(), FileKind::Fifo);
        assert_eq!(mknod_kind(libc::S_IFCHR).unwrap(), FileKind::CharDevice);
        assert_eq!(mknod_kind(libc::S_IFREG).unwrap(), FileKind::File);
        for bad in [libc::S_IFDIR, libc::S_IFLNK, 0] {
            assert_eq!(mknod_kind(bad).unwrap_err().errno(), Errno::EINVAL, "{bad:#o}");
        }
    }

    #[test]
    fn attributes_convert_with_kind_and_blocks() {
        let now = SystemTime::now();
        let attr = Attr {
            ino: 42,
            kind: FileKind::Symlink,
            size: 1025,
            perm: 0o4755,
            nlink: 1,
            uid: 7,
            gid: 8,
            atime: now,
            mtime: now,
            ctime: now,
            version: 3,
            rdev: 0,
        };
        let fa = file_attr(&attr);
        assert_eq!(fa.ino, INodeNo(42));
        assert_eq!(fa.kind, FileType::Symlink);
        assert_eq!(fa.blocks, 3);
        assert_eq!(fa.perm, 0o4755);
        assert_eq!((fa.uid, fa.gid, fa.nlink), (7, 8, 1));
    }
}
