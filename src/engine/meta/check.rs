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
        Ok(problems)
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::FileKind;

    #[test]
    fn an_unknown_inode_kind_is_an_error_naming_it() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let sql = "SELECT 5, 1, X'78', 'weird', 420, 0, 0, 0, 0, 0, 0, NULL, 1, 1, 0, NULL";
        let err = conn.query_row(sql, [], super::super::row_to_inode).unwrap_err();
        assert!(err.to_string().contains("unknown inode kind \"weird\""), "{err}");
        for kind in FileKind::ALL {
            let row = conn.query_row(&sql.replace("weird", kind.as_str()), [], super::super::row_to_inode).unwrap();
            assert_eq!(row.kind, kind);
        }
    }
}
