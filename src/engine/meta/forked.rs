//! SQL of forks (issue 23): a copy of a scope's database made into another scope's, its blocks
//! read from where they live (`blocks.home`), and which blocks of other scopes a scope refers to.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::MetaDb;
use crate::engine::EngineResult;

/// Makes the copy at `path` of `parent`'s database (every block of it in the object store) scope
/// `child`'s: each block lives where the parent's did (under the parent's prefix unless it had a
/// home of its own; one whose home is `child` is `child`'s own), is uploaded, and has no journaled
/// bytes. Returns the (home, sha) of every block of another scope, for the registry's holds.
pub(crate) fn prepare_copy(path: &Path, parent: &str, child: &str) -> EngineResult<Vec<(String, String)>> {
    let mut conn = Connection::open(path)?;
    let tx = conn.transaction()?;
    tx.execute("UPDATE blocks SET home = COALESCE(home, ?1), state = 'uploaded'", params![parent])?;
    // A copy made back into a scope (a snapshot restored): its own blocks are its own again.
    tx.execute("UPDATE blocks SET home = NULL WHERE home = ?1", params![child])?;
    tx.execute("DELETE FROM staged_inline", [])?;
    let homed = {
        let mut st = tx.prepare("SELECT home, sha256 FROM blocks WHERE home IS NOT NULL ORDER BY home, sha256")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        rows.collect::<Result<Vec<_>, _>>()?
    };
    tx.commit()?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    conn.close().map_err(|(_, e)| crate::engine::EngineError::from(e))?;
    Ok(homed)
}

impl MetaDb {
    /// Where a block's object lives: the scope whose prefix holds it when not this one (a block
    /// shared with a fork's parent), and the fencing epoch of its key; `(None, 0)` without a row.
    pub fn block_place(&self, sha: &str) -> EngineResult<(Option<String>, u64)> {
        let mut st = self.conn.prepare_cached("SELECT home, key_epoch FROM blocks WHERE sha256 = ?1")?;
        let row = st.query_row(params![sha], |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1)? as u64)));
        Ok(row.optional()?.unwrap_or((None, 0)))
    }

    /// Blocks of other scopes this one refers to: (home, sha).
    pub fn homed_blocks(&self) -> EngineResult<Vec<(String, String)>> {
        let mut st =
            self.conn.prepare("SELECT home, sha256 FROM blocks WHERE home IS NOT NULL ORDER BY home, sha256")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
