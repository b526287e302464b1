//! Hard links in the metadata database: further names of an inode (`links` rows), its link count, and
//! how a name is moved or dropped whether it is the inode's first name or a further one.

use rusqlite::{params, OptionalExtension};

use super::batch::Op;
use super::statements as st;
use super::{drop_last_name, exec, inode_in, lookup_in, now_ns, touch_dir, usage_in, Dropped, InodeRow, MetaDb};
use crate::engine::{EngineError, EngineResult, FileKind, Ino, ROOT_INO};

/// Bounds a new name is checked against before it is made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkBounds {
    /// Inode quota: inodes plus further names.
    pub max_names: u64,
    /// Names one inode may have (`EMLINK` beyond).
    pub max_links: u32,
}

impl MetaDb {
    /// Gives inode `ino` (not a directory) the further name `parent/name`; its link count and ctime
    /// change, the directory's mtime and ctime too. The new name counts against the inode quota; the
    /// inode's bytes are not charged again. An inode without names gets its first name only when
    /// `unnamed_ok` (an open `O_TMPFILE` file; `NotFound` otherwise).
    pub fn link(
        &mut self,
        ino: Ino,
        parent: Ino,
        name: &[u8],
        bounds: LinkBounds,
        unnamed_ok: bool,
    ) -> EngineResult<InodeRow> {
        let tx = self.tx()?;
        let row = inode_in(&tx, ino)?.ok_or(EngineError::NotFound)?;
        let dir = inode_in(&tx, parent)?.ok_or(EngineError::NotFound)?;
        if dir.kind != FileKind::Dir {
            return Err(EngineError::NotDir);
        }
        if dir.parent.is_none() && parent != ROOT_INO {
            return Err(EngineError::NotFound);
        }
        if row.kind == FileKind::Dir {
            return Err(EngineError::NotPermitted("hard link to a directory"));
        }
        if row.nlink == 0 && (!unnamed_ok || row.parent.is_some() || ino == ROOT_INO) {
            return Err(EngineError::NotFound);
        }
        if lookup_in(&tx, parent, name)?.is_some() {
            return Err(EngineError::Exists);
        }
        let now = now_ns();
        tx.set_answer(ino);
        if row.nlink == 0 {
            // Its first name: the inode is already counted.
            super::set_name(&tx, ino, parent, name, now)?;
            exec(&tx, st::SET_NLINK_ONE, params![ino as i64])?;
            touch_dir(&tx, parent, now)?;
            let row = lookup_in(&tx, parent, name)?.ok_or(EngineError::NotFound)?;
            tx.commit()?;
            return Ok(row);
        }
        if row.nlink >= bounds.max_links {
            crate::limits::refuse(crate::limits::Bound::HardLinks);
            return Err(EngineError::TooManyLinks);
        }
        let usage = usage_in(&tx)?;
        if usage.inodes + usage.links >= bounds.max_names {
            crate::limits::refuse(crate::limits::Bound::QuotaInodes);
            return Err(EngineError::QuotaExceeded("inodes"));
        }
        exec(&tx, st::INSERT_LINK, params![parent as i64, name, ino as i64])?;
        exec(&tx, st::NLINK_UP, params![ino as i64, now])?;
        exec(&tx, st::USAGE_LINK_ADDED, params![])?;
        touch_dir(&tx, parent, now)?;
        let row = lookup_in(&tx, parent, name)?.ok_or(EngineError::NotFound)?;
        tx.commit()?;
        Ok(row)
    }
}

/// Takes one name of an inode away (the name `row` was found through). The last name of an inode
/// detaches it if open, else deletes it; an earlier one only lowers its link count (the inode's first
/// name passes to its oldest further name).
pub(super) fn drop_entry(conn: &Op<'_>, row: &InodeRow, open: bool, now: i64) -> EngineResult<Dropped> {
    if row.kind == FileKind::Dir || row.nlink <= 1 {
        return drop_last_name(conn, row, open, now);
    }
    match row.link {
        Some(id) => {
            exec(conn, st::DELETE_LINK, params![id])?;
        }
        None => {
            let next: Option<(i64, i64, Vec<u8>)> = conn
                .prepare_cached("SELECT id, parent, name FROM links WHERE ino = ?1 ORDER BY id LIMIT 1")?
                .query_row([row.ino as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let Some((id, parent, name)) = next else {
                // A link count without the links behind it: this was the last name after all.
                return drop_last_name(conn, row, open, now);
            };
            exec(conn, st::DELETE_LINK, params![id])?;
            exec(conn, st::PROMOTE_LINK, params![row.ino as i64, parent, name])?;
        }
    }
    exec(conn, st::NLINK_DOWN, params![row.ino as i64, now])?;
    exec(conn, st::USAGE_LINK_DROPPED, params![])?;
    Ok(Dropped::None)
}

/// Moves the name `row` was found through to `parent/name`; the inode's ctime changes.
pub(super) fn set_entry_name(conn: &Op<'_>, row: &InodeRow, parent: Ino, name: &[u8], now: i64) -> EngineResult<()> {
    match row.link {
        Some(id) => {
            exec(conn, st::MOVE_LINK, params![id, parent as i64, name])?;
            exec(conn, st::SET_CTIME, params![row.ino as i64, now])?;
        }
        None => super::set_name(conn, row.ino, parent, name, now)?,
    }
    Ok(())
}

/// Takes the name `row` was found through out of the unique indexes for the rest of the transaction
/// (it is given a new place by `set_entry_name` before the commit).
pub(super) fn move_aside(conn: &Op<'_>, row: &InodeRow) -> EngineResult<()> {
    match row.link {
        // Negative parents name no directory and are unique per link.
        Some(id) => exec(conn, st::LINK_ASIDE, params![id])?,
        None => exec(conn, st::INODE_ASIDE, params![row.ino as i64])?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{MetaDb, NewNode};
    use crate::engine::ROOT_INO;
    use crate::engine::{FileKind, Owner};
    use crate::migrate;

    /// A scope database written by a binary before hard links (schema 3) opens with every inode,
    /// block list and counter intact, link counts derived, and inode numbers still never reused.
    #[test]
    fn a_schema_3_database_migrates_without_losing_rows_or_reusing_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite3");
        {
            let mut conn = rusqlite::Connection::open(&path).unwrap();
            conn.pragma_update(None, "foreign_keys", "ON").unwrap();
            migrate::apply(&mut conn, &migrate::SCOPE_META[..3]).unwrap();
            conn.execute_batch(
                "INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
                     VALUES (1, NULL, NULL, 'dir', 493, 0, 0, 0, 0, 0);
                 INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns)
                     VALUES (2, 1, X'61', 'file', 420, 0, 0, 5, 0, 0, 0);
                 INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
                     VALUES (3, NULL, NULL, 'file', 420, 0, 0, 0, 0, 0);
                 INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
                     VALUES (9, 1, X'676f6e65', 'fifo', 420, 0, 0, 0, 0, 0);
                 DELETE FROM inodes WHERE ino = 9;
                 INSERT INTO blocks (sha256, len, refcount, state) VALUES ('ab', 5, 1, 'staged');
                 INSERT INTO file_blocks (ino, idx, sha256, len) VALUES (2, 0, 'ab', 5);
                 UPDATE usage SET files = 2, bytes = 5, inodes = 2;",
            )
            .unwrap();
        }
        let mut meta = MetaDb::open(&path, 0, 0).unwrap();
        assert_eq!(meta.lookup(ROOT_INO, b"a").unwrap().nlink, 1);
        assert_eq!(meta.inode(3).unwrap().nlink, 0, "a detached inode has no names");
        assert_eq!(meta.blocks_of(2).unwrap().len(), 1, "dropping the old table cascaded nothing");
        assert!(meta.consistency_problems().unwrap().is_empty(), "{:?}", meta.consistency_problems());
        let row = meta.insert(ROOT_INO, b"new", NewNode::plain(FileKind::File, 0o644), Owner::default(), 100).unwrap();
        assert!(row.ino > 9, "inode {} reuses a number", row.ino);
        let bounds = super::LinkBounds { max_names: 100, max_links: 10 };
        let linked = meta.link(2, ROOT_INO, b"b", bounds, false).unwrap();
        assert_eq!((linked.ino, linked.nlink), (2, 2));
    }
}
