//! Self-checks of the metadata database: SQLite's integrity check and a recount of the usage counters and block references.

use super::{usage_in, MetaDb};
use crate::engine::EngineResult;

impl MetaDb {
    pub fn integrity_check(&self) -> EngineResult<String> {
        let mut st = self.conn.prepare("PRAGMA integrity_check")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?.join("; "))
    }

    /// Checks the stored counters against a recount; returns a description of each mismatch.
    pub fn consistency_problems(&self) -> EngineResult<Vec<String>> {
        let mut problems = Vec::new();
        let bad_refs: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM blocks b WHERE refcount <> (SELECT COUNT(*) FROM file_blocks f WHERE f.sha256 = b.sha256)",
            [],
            |r| r.get(0),
        )?;
        if bad_refs > 0 {
            problems.push(format!("{bad_refs} block reference counts disagree with the block lists"));
        }
        let missing: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM file_blocks f WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.sha256 = f.sha256)",
            [],
            |r| r.get(0),
        )?;
        if missing > 0 {
            problems.push(format!("{missing} file blocks point at no block row"));
        }
        // Foreign keys are not enforced while a scope is in use (`MetaDb::open`): every reference
        // of every table is checked here.
        let dangling: Vec<String> = {
            let mut st = self.conn.prepare("PRAGMA foreign_key_check")?;
            let rows = st.query_map([], |r| Ok(format!("{} -> {}", r.get::<_, String>(0)?, r.get::<_, String>(2)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        if !dangling.is_empty() {
            problems.push(format!("{} rows reference missing rows: {}", dangling.len(), dangling.join(", ")));
        }
        let u = usage_in(&self.conn)?;
        let (files, bytes, inodes): (i64, i64, i64) = self.conn.query_row(
            "SELECT COALESCE(SUM(kind = 'file'), 0), COALESCE(SUM(CASE WHEN kind IN ('file', 'symlink') THEN size ELSE 0 END), 0)
                    + (SELECT COALESCE(SUM(length(name) + length(value)), 0) FROM xattrs), COUNT(*)
             FROM inodes WHERE ino <> 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        if (files as u64, bytes as u64, inodes as u64) != (u.files, u.bytes, u.inodes) {
            problems.push(format!(
                "usage counters ({}, {}, {}) disagree with a recount ({files}, {bytes}, {inodes})",
                u.files, u.bytes, u.inodes
            ));
        }
        let links: i64 = self.conn.query_row("SELECT COUNT(*) FROM links", [], |r| r.get(0))?;
        if links as u64 != u.links {
            problems.push(format!("the link counter ({}) disagrees with a recount ({links})", u.links));
        }
        let bad_nlink: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM inodes i WHERE kind <> 'dir' AND nlink <>
                 (i.parent IS NOT NULL) + (SELECT COUNT(*) FROM links l WHERE l.ino = i.ino)",
            [],
            |r| r.get(0),
        )?;
        if bad_nlink > 0 {
            problems.push(format!("{bad_nlink} link counts disagree with the names of their inodes"));
        }
        let bad_subdirs: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM inodes d WHERE kind = 'dir' AND subdirs <>
                 (SELECT COUNT(*) FROM inodes c WHERE c.parent = d.ino AND c.kind = 'dir')",
            [],
            |r| r.get(0),
        )?;
        if bad_subdirs > 0 {
            problems.push(format!("{bad_subdirs} subdirectory counts disagree with the directories below them"));
        }
        Ok(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MetaDb, NewNode};
    use crate::engine::{FileKind, Owner, RenameMode, ROOT_INO};
    use crate::migrate;

    /// A database written before subdirectory counts were kept (schema 5) opens with every row
    /// intact and each directory's count derived; mkdir, rename, exchange and rmdir keep it.
    #[test]
    fn a_schema_5_database_gains_subdirectory_counts_that_namespace_changes_keep() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite3");
        {
            let mut conn = rusqlite::Connection::open(&path).unwrap();
            migrate::apply(&mut conn, &migrate::SCOPE_META[..5]).unwrap();
            conn.execute_batch(
                "INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
                     VALUES (1, NULL, NULL, 'dir', 493, 0, 0, 0, 0, 0),
                            (2, 1, X'61', 'dir', 493, 0, 0, 0, 0, 0),
                            (3, 2, X'62', 'dir', 493, 0, 0, 0, 0, 0),
                            (4, 2, X'63', 'dir', 493, 0, 0, 0, 0, 0),
                            (5, 2, X'66', 'file', 420, 0, 0, 0, 0, 0);
                 UPDATE usage SET files = 1, inodes = 4;",
            )
            .unwrap();
        }
        let mut meta = MetaDb::open(&path, 0, 0).unwrap();
        let subdirs = |m: &MetaDb| [1, 2, 3, 4].map(|ino| m.inode(ino).unwrap().subdirs);
        assert_eq!(subdirs(&meta), [1, 2, 0, 0]);
        assert_eq!(meta.lookup(2, b"f").unwrap().ino, 5, "rows survive the migration");
        assert!(meta.consistency_problems().unwrap().is_empty(), "{:?}", meta.consistency_problems());
        let new = meta.insert(3, b"d", NewNode::plain(FileKind::Dir, 0o755), Owner::default(), 100).unwrap();
        assert_eq!(subdirs(&meta), [1, 2, 1, 0]);
        let never_open = |_| false;
        meta.rename(2, b"b", ROOT_INO, b"b", RenameMode::Replace, &never_open).unwrap();
        assert_eq!(subdirs(&meta), [2, 1, 1, 0]);
        meta.rename(ROOT_INO, b"b", 2, b"c", RenameMode::Exchange, &never_open).unwrap();
        assert_eq!(subdirs(&meta), [2, 1, 1, 0], "an exchange moves one directory each way");
        assert_eq!(meta.lookup(2, b"c").unwrap().ino, 3);
        meta.rmdir(3, b"d").unwrap();
        assert!(meta.inode(new.ino).is_err());
        assert_eq!(subdirs(&meta), [2, 1, 0, 0]);
        meta.rename(2, b"c", 2, b"e", RenameMode::Replace, &never_open).unwrap();
        assert_eq!(subdirs(&meta), [2, 1, 0, 0], "a rename within a directory changes no count");
        meta.rmdir(2, b"e").unwrap();
        assert_eq!([1, 2, 4].map(|ino| meta.inode(ino).unwrap().subdirs), [2, 0, 0]);
        assert!(meta.consistency_problems().unwrap().is_empty(), "{:?}", meta.consistency_problems());
    }

    #[test]
    fn an_unknown_inode_kind_is_an_error_naming_it() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let sql = "SELECT 5, 1, X'78', 'weird', 420, 0, 0, 0, 0, 0, 0, NULL, 1, 1, 0, NULL, 0";
        let err = conn.query_row(sql, [], super::super::row_to_inode).unwrap_err();
        assert!(err.to_string().contains("unknown inode kind \"weird\""), "{err}");
        for kind in FileKind::ALL {
            let row = conn.query_row(&sql.replace("weird", kind.as_str()), [], super::super::row_to_inode).unwrap();
            assert_eq!(row.kind, kind);
        }
    }
}
