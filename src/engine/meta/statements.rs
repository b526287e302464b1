//! The compile-time table of every statement a metadata mutation writes with. A mutation's redo
//! record names each statement by its id here and carries its values, never SQL text; a replay runs
//! only statements of this table. Ids are part of the redo log's format: never reuse or renumber
//! one (add new statements with new ids).

/// One writing statement: its stable id and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stmt {
    pub id: u16,
    pub sql: &'static str,
}

macro_rules! statements {
    ($($(#[$doc:meta])* $name:ident = $id:literal => $sql:expr;)*) => {
        $($(#[$doc])* pub(crate) const $name: Stmt = Stmt { id: $id, sql: $sql };)*
        /// Every statement, for replays.
        pub(crate) const ALL: &[Stmt] = &[$($name),*];
    };
}

statements! {
    INSERT_INODE = 1 => "INSERT INTO inodes (parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns, symlink_target, rdev)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?9, ?10)";
    USAGE_INSERTED = 2 => "UPDATE usage SET inodes = inodes + 1, files = files + ?1, bytes = bytes + ?2 WHERE id = 1";
    INSERT_DETACHED = 3 => "INSERT INTO inodes (parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns, nlink)
             VALUES (NULL, NULL, 'file', ?1, ?2, ?3, ?4, ?4, ?4, 0)";
    USAGE_DETACHED_INSERTED = 4 => "UPDATE usage SET inodes = inodes + 1, files = files + 1 WHERE id = 1";
    SET_NLINK_ONE = 5 => "UPDATE inodes SET nlink = 1 WHERE ino = ?1";
    SET_ATTRS = 6 => "UPDATE inodes SET perm = ?2, uid = ?3, gid = ?4, atime_ns = ?5, mtime_ns = ?6, ctime_ns = ?7 WHERE ino = ?1";
    PUT_FILE_BLOCK = 7 => "INSERT OR REPLACE INTO file_blocks (ino, idx, sha256, len) VALUES (?1, ?2, ?3, ?4)";
    DELETE_FILE_BLOCK = 8 => "DELETE FROM file_blocks WHERE ino = ?1 AND idx = ?2";
    SET_VERSION = 9 => "UPDATE inodes SET size = ?2, mtime_ns = ?3, ctime_ns = ?4, version = version + 1, content_sha256 = ?5
             WHERE ino = ?1";
    USAGE_BYTES = 10 => "UPDATE usage SET bytes = bytes + ?1 WHERE id = 1";
    TOUCH_DIR = 11 => "UPDATE inodes SET mtime_ns = ?2, ctime_ns = ?2 WHERE ino = ?1";
    SET_NAME = 12 => "UPDATE inodes SET parent = ?2, name = ?3, ctime_ns = ?4 WHERE ino = ?1";
    DETACH = 13 => "UPDATE inodes SET parent = NULL, name = NULL, nlink = 0, ctime_ns = ?2 WHERE ino = ?1";
    DELETE_FILE_BLOCKS = 14 => "DELETE FROM file_blocks WHERE ino = ?1";
    DELETE_XATTRS = 15 => "DELETE FROM xattrs WHERE ino = ?1";
    DELETE_INODE = 16 => "DELETE FROM inodes WHERE ino = ?1";
    USAGE_DELETED = 17 => "UPDATE usage SET inodes = inodes - 1, files = files - ?1, bytes = bytes - ?2 WHERE id = 1";
    MARK_UPLOADED = 18 => "UPDATE blocks SET state = 'uploaded' WHERE sha256 = ?1";
    DELETE_INLINE = 19 => "DELETE FROM staged_inline WHERE sha256 = ?1";
    DELETE_UNREFERENCED = 20 => "DELETE FROM blocks WHERE sha256 = ?1 AND refcount = 0";
    STAGE_INLINE = 21 => "INSERT OR IGNORE INTO staged_inline (sha256, data) VALUES (?1, ?2)";
    ADD_REF = 22 => "UPDATE blocks SET refcount = refcount + 1, unreferenced_since = NULL WHERE sha256 = ?1";
    INSERT_BLOCK = 23 => "INSERT INTO blocks (sha256, len, refcount, state) VALUES (?1, ?2, 1, 'staged')";
    DROP_REF = 24 => "UPDATE blocks SET refcount = refcount - 1,
                unreferenced_since = CASE WHEN refcount = 1 THEN ?2 ELSE unreferenced_since END
         WHERE sha256 = ?1";
    INSERT_LINK = 25 => "INSERT INTO links (parent, name, ino) VALUES (?1, ?2, ?3)";
    NLINK_UP = 26 => "UPDATE inodes SET nlink = nlink + 1, ctime_ns = ?2 WHERE ino = ?1";
    USAGE_LINK_ADDED = 27 => "UPDATE usage SET links = links + 1 WHERE id = 1";
    DELETE_LINK = 28 => "DELETE FROM links WHERE id = ?1";
    PROMOTE_LINK = 29 => "UPDATE inodes SET parent = ?2, name = ?3 WHERE ino = ?1";
    NLINK_DOWN = 30 => "UPDATE inodes SET nlink = nlink - 1, ctime_ns = ?2 WHERE ino = ?1";
    USAGE_LINK_DROPPED = 31 => "UPDATE usage SET links = links - 1 WHERE id = 1";
    MOVE_LINK = 32 => "UPDATE links SET parent = ?2, name = ?3 WHERE id = ?1";
    SET_CTIME = 33 => "UPDATE inodes SET ctime_ns = ?2 WHERE ino = ?1";
    LINK_ASIDE = 34 => "UPDATE links SET parent = -id WHERE id = ?1";
    INODE_ASIDE = 35 => "UPDATE inodes SET parent = NULL WHERE ino = ?1";
    PUT_XATTR = 36 => "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value";
    DELETE_XATTR = 37 => "DELETE FROM xattrs WHERE ino = ?1 AND name = ?2";
    INSERT_UNREFERENCED_UPLOAD = 38 => "INSERT OR IGNORE INTO blocks (sha256, len, refcount, state, unreferenced_since)
             VALUES (?1, ?2, 0, 'uploaded', ?3)";
    INSERT_GC_DELETING = 39 => "INSERT OR IGNORE INTO gc_deleting (sha256) VALUES (?1)";
    DELETE_GC_DELETING = 40 => "DELETE FROM gc_deleting WHERE sha256 = ?1";
    /// With a fence (epoch ?2 > 0): a row of an earlier epoch nothing references is not reused.
    ADD_REF_AT = 41 => "UPDATE blocks SET refcount = refcount + 1, unreferenced_since = NULL
         WHERE sha256 = ?1 AND (refcount > 0 OR (home IS NULL AND key_epoch >= ?2))";
    /// Such a row is retired: its object (if stored) goes to gc's deletion log, the row goes.
    RETIRE_UNREFERENCED = 42 => "INSERT OR IGNORE INTO gc_deleting (sha256, key_epoch)
             SELECT sha256, key_epoch FROM blocks WHERE sha256 = ?1 AND refcount = 0 AND home IS NULL AND state = 'uploaded'";
    INSERT_BLOCK_AT = 43 => "INSERT INTO blocks (sha256, len, refcount, state, key_epoch) VALUES (?1, ?2, 1, 'staged', ?3)";
    INSERT_GC_DELETING_AT = 44 => "INSERT OR IGNORE INTO gc_deleting (sha256, key_epoch) VALUES (?1, ?2)";
    DELETE_GC_DELETING_AT = 45 => "DELETE FROM gc_deleting WHERE sha256 = ?1 AND key_epoch = ?2";
    INSERT_UNREFERENCED_UPLOAD_AT = 46 => "INSERT OR IGNORE INTO blocks (sha256, len, refcount, state, unreferenced_since, key_epoch)
             VALUES (?1, ?2, 0, 'uploaded', ?3, ?4)";
}

/// The statement with id `id`.
pub(crate) fn by_id(id: u16) -> Option<&'static Stmt> {
    ALL.iter().find(|s| s.id == id)
}

/// The statement whose text is `sql` up to whitespace (a record of the redo log's first format,
/// which carried SQL text: replayed only when it is one of these).
pub(crate) fn by_text(sql: &str) -> Option<&'static Stmt> {
    let wanted = squeeze(sql);
    ALL.iter().find(|s| squeeze(s.sql) == wanted)
}

fn squeeze(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_every_statement_writes() {
        let mut ids: Vec<u16> = ALL.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), ALL.len(), "a statement id is used twice");
        for s in ALL {
            let verb = s.sql.split_whitespace().next().unwrap_or_default();
            assert!(["INSERT", "UPDATE", "DELETE"].contains(&verb), "{} does not write", s.id);
            assert_eq!(by_id(s.id), Some(s));
            assert_eq!(by_text(&s.sql.replace('\n', " ")), Some(s));
        }
        assert_eq!(by_id(0), None);
        assert_eq!(by_text("ATTACH DATABASE '/tmp/x' AS x"), None);
    }
}
