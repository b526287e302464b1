//! What a closed scope database notes beside itself (`scopes/<id>/usage`): its usage and its root
//! directory's attributes, written when the database closes (or is handed over to the next
//! process) and removed when it opens again. While the note exists the database is closed and holds
//! exactly what it says, so `statfs` and a `stat` of the mount's root of an idle scope open nothing:
//! every mount of a restarted daemon answers them at once. A killed process leaves no note for the
//! databases it had open (they were removed when they opened); a damaged note is no note.

use std::path::{Path, PathBuf};

use super::meta::InodeRow;
use super::types::{FileKind, Usage, ROOT_INO};

/// A closed database's usage and root directory.
#[derive(Debug, Clone)]
pub(crate) struct Note {
    pub usage: Usage,
    pub root: InodeRow,
}

const MAGIC: &[u8; 4] = b"SFU2";
/// Magic, four counters, root (perm, uid, gid, three times, version, subdirs), CRC-32.
const LEN: usize = 4 + 32 + 12 + 24 + 16 + 4;

fn path(db: &Path) -> PathBuf {
    db.with_file_name("usage")
}

/// Notes `note` beside the database at `db` (a failure only costs the next `statfs` an open).
pub(crate) fn write(db: &Path, note: &Note) {
    let (u, r) = (&note.usage, &note.root);
    let mut out = Vec::with_capacity(LEN);
    out.extend_from_slice(MAGIC);
    for v in [u.files, u.bytes, u.inodes, u.links] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [r.perm, r.uid, r.gid] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [r.atime_ns, r.mtime_ns, r.ctime_ns] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [r.version, r.subdirs] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&crc32fast::hash(&out[4..]).to_le_bytes());
    if let Err(e) = std::fs::write(path(db), &out) {
        tracing::debug!(error = %e, "noting a closed scope's usage failed; statfs opens its database");
    }
}

/// Removes the note before the database can change (`Err` if it cannot be removed).
pub(crate) fn forget(db: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path(db)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The note beside the database at `db`, if there is a sound one.
pub(crate) fn read(db: &Path) -> Option<Note> {
    let b = std::fs::read(path(db)).ok()?;
    if b.len() != LEN || &b[..4] != MAGIC || b[LEN - 4..] != crc32fast::hash(&b[4..LEN - 4]).to_le_bytes() {
        return None;
    }
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
    let usage = Usage { files: u64_at(4), bytes: u64_at(12), inodes: u64_at(20), links: u64_at(28) };
    let root = InodeRow {
        ino: ROOT_INO,
        parent: None,
        name: None,
        kind: FileKind::Dir,
        perm: u32_at(36),
        uid: u32_at(40),
        gid: u32_at(44),
        size: 0,
        atime_ns: u64_at(48) as i64,
        mtime_ns: u64_at(56) as i64,
        ctime_ns: u64_at(64) as i64,
        symlink_target: None,
        version: u64_at(72),
        nlink: 1,
        rdev: 0,
        link: None,
        subdirs: u64_at(80),
    };
    Some(Note { usage, root })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reads_back_and_a_damaged_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.sqlite3");
        assert!(read(&db).is_none());
        let root = InodeRow {
            ino: ROOT_INO,
            parent: None,
            name: None,
            kind: FileKind::Dir,
            perm: 0o750,
            uid: 7,
            gid: 8,
            size: 0,
            atime_ns: -1,
            mtime_ns: 2,
            ctime_ns: 3,
            symlink_target: None,
            version: 4,
            nlink: 1,
            rdev: 0,
            link: None,
            subdirs: 5,
        };
        write(&db, &Note { usage: Usage { files: 1, bytes: 2, inodes: 3, links: 4 }, root });
        let n = read(&db).unwrap();
        assert_eq!(n.usage, Usage { files: 1, bytes: 2, inodes: 3, links: 4 });
        assert_eq!((n.root.perm, n.root.uid, n.root.gid, n.root.atime_ns, n.root.subdirs), (0o750, 7, 8, -1, 5));
        let mut bytes = std::fs::read(path(&db)).unwrap();
        bytes[10] ^= 1;
        std::fs::write(path(&db), &bytes).unwrap();
        assert!(read(&db).is_none(), "a damaged note is no note");
        forget(&db).unwrap();
        forget(&db).unwrap();
        assert!(!path(&db).exists());
    }
}
