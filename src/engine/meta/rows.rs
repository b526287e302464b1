//! How rows of `inodes` (and of `links`, for further names) are read into `InodeRow`s.

use super::InodeRow;
use crate::engine::{FileKind, Ino};

/// The kind stored in column 3; any other text is an error naming it (a damaged or newer database).
pub(super) fn kind_from(s: &str) -> rusqlite::Result<FileKind> {
    FileKind::from_name(s).ok_or_else(|| {
        let why = format!("unknown inode kind {s:?}");
        rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, why.into())
    })
}

/// The columns `row_to_inode` reads, as a literal (for `concat!`: hot statements are built at
/// compile time, not formatted per call).
macro_rules! inode_cols {
    () => {
        "ino, parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns, symlink_target, version, nlink, rdev, NULL, subdirs"
    };
}
/// The columns of `inode_cols!` for an inode reached through a further name `l` (a `links` row) of
/// inode `i`.
macro_rules! link_cols {
    () => {
        "i.ino, l.parent, l.name, i.kind, i.perm, i.uid, i.gid, i.size, i.atime_ns, i.mtime_ns, \
         i.ctime_ns, i.symlink_target, i.version, i.nlink, i.rdev, l.id, i.subdirs"
    };
}
pub(super) use {inode_cols, link_cols};

pub(super) fn row_to_inode(r: &rusqlite::Row<'_>) -> rusqlite::Result<InodeRow> {
    Ok(InodeRow {
        ino: r.get::<_, i64>(0)? as Ino,
        parent: r.get::<_, Option<i64>>(1)?.map(|p| p as Ino),
        name: r.get(2)?,
        kind: kind_from(
            r.get_ref(3)?
                .as_str()
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, Box::new(e)))?,
        )?,
        perm: r.get::<_, i64>(4)? as u32,
        uid: r.get::<_, i64>(5)? as u32,
        gid: r.get::<_, i64>(6)? as u32,
        size: r.get::<_, i64>(7)? as u64,
        atime_ns: r.get(8)?,
        mtime_ns: r.get(9)?,
        ctime_ns: r.get(10)?,
        symlink_target: r.get(11)?,
        version: r.get::<_, i64>(12)? as u64,
        nlink: r.get::<_, i64>(13)? as u32,
        rdev: r.get::<_, i64>(14)? as u32,
        link: r.get(15)?,
        subdirs: r.get::<_, i64>(16)?.max(0) as u64,
    })
}
