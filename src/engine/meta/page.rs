//! Paged directory listing in the metadata database: a directory's names one page at a time — first
//! names in inode order, then further names (hard links) in link order — resumed after a cursor.

use super::{inode_cols, link_cols, row_to_inode, InodeRow, MetaDb};
use crate::engine::{EngineResult, Ino};

/// Cursors at or above this value resume among further names (`LINKS_CURSOR + links.id`); below
/// it, among first names (the inode number). Inode numbers and link ids are never reused.
pub(crate) const LINKS_CURSOR: u64 = 1 << 62;

/// The cursor after `row` in a paged listing.
pub(crate) fn cursor_of(row: &InodeRow) -> u64 {
    match row.link {
        Some(id) => LINKS_CURSOR + id as u64,
        None => row.ino,
    }
}

impl MetaDb {
    /// Up to `limit` names in `parent` after cursor `after` (`cursor_of` the last one returned;
    /// 0 starts). A stable resume point however the directory changes between pages: a name present
    /// for the whole walk is returned once, others at most once.
    pub fn children_after(&self, parent: Ino, after: u64, limit: usize) -> EngineResult<Vec<InodeRow>> {
        let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut rows = Vec::new();
        if after < LINKS_CURSOR {
            let mut st = self.conn.prepare_cached(concat!(
                "SELECT ",
                inode_cols!(),
                " FROM inodes WHERE parent = ?1 AND ino > ?2 ORDER BY ino LIMIT ?3"
            ))?;
            let found = st.query_map(rusqlite::params![parent as i64, after as i64, limit_sql], row_to_inode)?;
            rows = found.collect::<Result<Vec<_>, _>>()?;
            if rows.len() == limit {
                return Ok(rows);
            }
        }
        let after_link = after.saturating_sub(LINKS_CURSOR).min(i64::MAX as u64) as i64;
        let mut st = self.conn.prepare_cached(concat!(
            "SELECT ",
            link_cols!(),
            " FROM links l JOIN inodes i ON i.ino = l.ino WHERE l.parent = ?1 AND l.id > ?2 ORDER BY l.id LIMIT ?3"
        ))?;
        let more = (limit - rows.len()) as i64;
        let found = st.query_map(rusqlite::params![parent as i64, after_link, more], row_to_inode)?;
        for row in found {
            rows.push(row?);
        }
        Ok(rows)
    }
}
