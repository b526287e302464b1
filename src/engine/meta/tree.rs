//! Tree shape in the metadata database: depth and path length of a directory, path of an inode, and
//! bounded walks of a subtree (its extent below a directory, its size) — one SQL statement each, but the
//! depth of a directory, which walks up its parents by point lookups.

use rusqlite::{params, OptionalExtension};

use super::{query_one, MetaDb};
use crate::engine::{EngineError, EngineResult, Ino, ROOT_INO};

/// Directory places `MetaDb::place` keeps (a few hundred KiB at most per open database).
pub(super) const PLACES_KEPT: usize = 4096;

/// Where an inode sits: components from the root and bytes of its path (root = `(0, 0)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub depth: u64,
    pub bytes: u64,
}

impl Place {
    /// The place of a child named with `name_len` bytes.
    pub fn child(self, name_len: usize) -> Place {
        let sep = u64::from(self.depth > 0);
        Place { depth: self.depth + 1, bytes: self.bytes + sep + name_len as u64 }
    }
}

impl MetaDb {
    /// Depth and path bytes of `ino`, walking at most `max_depth + 1` parents: a deeper inode answers
    /// a depth above `max_depth` (its bytes then only count the part walked). One point lookup per
    /// parent (a directory's name and parent), from the statement cache: a create in a shallow tree
    /// costs a few index probes, no recursive query.
    pub fn place(&self, ino: Ino, max_depth: u64) -> EngineResult<Place> {
        if let Some(p) = self.places.borrow().get(&ino) {
            return Ok(*p);
        }
        let mut st = self.conn.prepare_cached("SELECT parent, length(name) FROM inodes WHERE ino = ?1")?;
        let (mut at, mut depth, mut len) = (ino, 0u64, 0u64);
        loop {
            if at == ROOT_INO {
                // `len` counts one separator per component; a path has one fewer.
                let place = Place { depth, bytes: len.saturating_sub(1) };
                let mut places = self.places.borrow_mut();
                if places.len() >= PLACES_KEPT {
                    places.clear();
                }
                places.insert(ino, place);
                return Ok(place);
            }
            if depth > max_depth {
                return Ok(Place { depth, bytes: len });
            }
            let row: Option<(Option<i64>, Option<i64>)> =
                st.query_row([at as i64], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
            match row {
                Some((Some(parent), name_len)) => {
                    depth += 1;
                    len += name_len.unwrap_or(0) as u64 + 1;
                    at = parent as Ino;
                }
                // Missing, or detached (no parent) below the root.
                _ => return Err(EngineError::NotFound),
            }
        }
    }

    /// How far the subtree below directory `ino` reaches: the most components and the most bytes
    /// (separators included) of a path relative to `ino`. Entries past `depth_budget` or
    /// `bytes_budget` are reported but not descended into, so a deep legacy chain ends the walk early.
    pub fn extent_below(&self, ino: Ino, depth_budget: u64, bytes_budget: u64) -> EngineResult<(u64, u64)> {
        let (d, len): (i64, i64) = query_one(
            &self.conn,
            "WITH RECURSIVE down(ino, d, len) AS (
                 SELECT ?1, 0, 0
                 UNION ALL
                 SELECT i.ino, down.d + 1, down.len + 1 + length(i.name)
                 FROM inodes i JOIN down ON i.parent = down.ino
                 WHERE down.d <= ?2 AND down.len <= ?3
                 UNION ALL
                 SELECT l.ino, down.d + 1, down.len + 1 + length(l.name)
                 FROM links l JOIN down ON l.parent = down.ino
                 WHERE down.d <= ?2 AND down.len <= ?3
             )
             SELECT MAX(d), MAX(len) FROM down",
            params![
                ino as i64,
                i64::try_from(depth_budget).unwrap_or(i64::MAX),
                i64::try_from(bytes_budget).unwrap_or(i64::MAX)
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((d as u64, len as u64))
    }

    /// Names below `ino` (itself excluded; a hard link counts as a name), counting at most `limit + 1`.
    pub fn count_below(&self, ino: Ino, limit: u64) -> EngineResult<u64> {
        let n: i64 = query_one(
            &self.conn,
            "WITH RECURSIVE down(ino) AS (
                 SELECT ?1
                 UNION ALL
                 SELECT i.ino FROM inodes i JOIN down ON i.parent = down.ino
                 UNION ALL
                 SELECT l.ino FROM links l JOIN down ON l.parent = down.ino
                 LIMIT ?2
             )
             SELECT COUNT(*) - 1 FROM down",
            params![ino as i64, i64::try_from(limit.saturating_add(2)).unwrap_or(i64::MAX)],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// The virtual path of an inode (`/a/b`), or `None` if it has no name any more.
    pub fn path_of(&self, mut ino: Ino) -> EngineResult<Option<String>> {
        let mut parts = Vec::new();
        while ino != ROOT_INO {
            let row = self.inode(ino)?;
            let (Some(parent), Some(name)) = (row.parent, row.name) else { return Ok(None) };
            parts.push(String::from_utf8_lossy(&name).into_owned());
            ino = parent;
        }
        parts.reverse();
        Ok(Some(format!("/{}", parts.join("/"))))
    }
}
