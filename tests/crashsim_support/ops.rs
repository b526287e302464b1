//! The operation log of the recording filesystem: one `Op` per mutating request it performed, in
//! the order it performed them, with files named by a `FileId` that is never reused.

use std::ffi::OsString;
use std::sync::Arc;

/// A file, directory or symlink of the recorded filesystem. Ids are handed out once (a new
/// inode gets a new id even when the backing filesystem reuses an inode number); hard links
/// share one. `ROOT` is the recorded directory itself.
pub type FileId = u64;

pub const ROOT: FileId = 1;

/// The `renameat2` flag the image replays specially (the log keeps a rename's flags as given).
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// One mutating operation, as performed. Entry operations name what the entry pointed to when
/// the operation ran, so that replaying a subset of the log can tell when an operation no longer
/// applies (its source is not where it was: a dropped earlier operation).
#[derive(Clone, Debug)]
pub enum Op {
    /// `pwrite` of `data` at `offset`.
    Write {
        file: FileId,
        offset: u64,
        data: Arc<[u8]>,
    },
    /// `ftruncate`, or `setattr` with a size, or an open with `O_TRUNC`.
    Truncate {
        file: FileId,
        size: u64,
    },
    /// A new regular file (`create`, `mknod`) named `name` in `dir`.
    Create {
        dir: FileId,
        name: OsString,
        file: FileId,
    },
    Mkdir {
        dir: FileId,
        name: OsString,
        new: FileId,
    },
    Symlink {
        dir: FileId,
        name: OsString,
        target: OsString,
        new: FileId,
    },
    /// A further name of `file`.
    Link {
        file: FileId,
        dir: FileId,
        name: OsString,
    },
    /// Removal of the name `name` of `file` from `dir`.
    Unlink {
        dir: FileId,
        name: OsString,
        file: FileId,
    },
    Rmdir {
        dir: FileId,
        name: OsString,
        file: FileId,
    },
    /// `renameat2`: `file` moves from `from_dir/from_name` to `to_dir/to_name`; `other` is what
    /// the target named before (replaced, or with `RENAME_EXCHANGE` moved the other way).
    Rename {
        from_dir: FileId,
        from_name: OsString,
        to_dir: FileId,
        to_name: OsString,
        file: FileId,
        other: Option<FileId>,
        flags: u32,
    },
    /// `fsync` (or `fdatasync`) of a regular file.
    Fsync {
        file: FileId,
        datasync: bool,
    },
    /// `fsync` of a directory.
    FsyncDir {
        dir: FileId,
    },
}

/// Which unit of durability an unsynced operation belongs to: a file's data, or a directory's
/// entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    Data(FileId),
    Entries(FileId),
}

impl Op {
    /// The units the operation belongs to (a rename between two directories belongs to both).
    pub fn units(&self) -> Vec<Unit> {
        match self {
            Op::Write { file, .. } | Op::Truncate { file, .. } => vec![Unit::Data(*file)],
            Op::Create { dir, .. }
            | Op::Mkdir { dir, .. }
            | Op::Symlink { dir, .. }
            | Op::Link { dir, .. }
            | Op::Unlink { dir, .. }
            | Op::Rmdir { dir, .. } => vec![Unit::Entries(*dir)],
            Op::Rename { from_dir, to_dir, .. } if from_dir == to_dir => vec![Unit::Entries(*from_dir)],
            Op::Rename { from_dir, to_dir, .. } => vec![Unit::Entries(*from_dir), Unit::Entries(*to_dir)],
            Op::Fsync { .. } | Op::FsyncDir { .. } => Vec::new(),
        }
    }

    /// The unit a completed sync makes durable.
    pub fn synced_unit(&self) -> Option<Unit> {
        match self {
            Op::Fsync { file, .. } => Some(Unit::Data(*file)),
            Op::FsyncDir { dir } => Some(Unit::Entries(*dir)),
            _ => None,
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(self, Op::Write { .. })
    }

    pub fn is_sync(&self) -> bool {
        self.synced_unit().is_some()
    }

    /// A short name of the kind, for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Write { .. } => "write",
            Op::Truncate { .. } => "truncate",
            Op::Create { .. } => "create",
            Op::Mkdir { .. } => "mkdir",
            Op::Symlink { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::Fsync { datasync: false, .. } => "fsync",
            Op::Fsync { datasync: true, .. } => "fdatasync",
            Op::FsyncDir { .. } => "fsync-dir",
        }
    }

    /// The file whose data, or the directory whose entries, the operation changes or syncs
    /// (the source directory of a rename).
    pub fn subject(&self) -> FileId {
        match self {
            Op::Write { file, .. } | Op::Truncate { file, .. } | Op::Fsync { file, .. } => *file,
            Op::Create { dir, .. }
            | Op::Mkdir { dir, .. }
            | Op::Symlink { dir, .. }
            | Op::Link { dir, .. }
            | Op::Unlink { dir, .. }
            | Op::Rmdir { dir, .. }
            | Op::FsyncDir { dir } => *dir,
            Op::Rename { from_dir, .. } => *from_dir,
        }
    }
}

/// Which requests a one-shot fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOn {
    /// The n-th recorded `write` (counted from 0 since recording started).
    Write(usize),
    /// The n-th `fsync`/`fdatasync` of a file or `fsync` of a directory.
    Sync(usize),
}

/// A fault that fired: where in the log it would have gone, what it hit.
#[derive(Clone, Debug)]
pub struct Fired {
    pub at_op: usize,
    pub errno: i32,
    pub what: String,
    pub file: FileId,
    pub sync: bool,
}
