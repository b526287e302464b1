//! Paged directory listing in the metadata database: a directory's children in inode order, one page at a time.

use super::{row_to_inode, InodeRow, MetaDb, INODE_COLS};
use crate::engine::{EngineResult, Ino};

impl MetaDb {
    /// Up to `limit` children of `parent` whose inode number is above `after`, in inode order
    /// (index `inodes_by_parent_ino`). Inode numbers are never reused, so `after` is a stable
    /// resume point however the directory changes between pages.
    pub fn children_after(&self, parent: Ino, after: Ino, limit: usize) -> EngineResult<Vec<InodeRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {INODE_COLS} FROM inodes WHERE parent = ?1 AND ino > ?2 ORDER BY ino LIMIT ?3"
        ))?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = st.query_map(rusqlite::params![parent as i64, after, limit], row_to_inode)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
