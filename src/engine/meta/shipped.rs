//! A scope's database rebuilt from what was shipped to the bucket (`engine/restore.rs`): a
//! snapshot's copy, with the batches of its generation's logs run onto it in order (the typed
//! statements of `statements.rs`, as a replay runs them), and the staged blocks the copy names.

use std::path::Path;

use rusqlite::{params, Connection};

use super::batch;
use super::statements as st;
use crate::engine::ship_objects::Batch;
use crate::engine::{EngineError, EngineResult};

/// Readies a consistent copy of a scope's database (`MetaDb::snapshot_to`) to be shipped: without
/// the inline journal (a file's bytes reach the bucket only as its blocks, `ship.rs`), compacted
/// (the pages a live database keeps free are not sent).
pub(crate) fn compact_copy(path: &Path) -> EngineResult<()> {
    let conn = Connection::open(path)?;
    // A scratch copy: nothing here needs to survive a crash.
    conn.execute_batch("PRAGMA synchronous = OFF; DELETE FROM staged_inline; VACUUM")?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    conn.close().map_err(|(_, e)| EngineError::from(e))
}

/// A block a rebuilt copy names as not yet uploaded.
pub(crate) struct StagedRow {
    pub sha256: String,
    /// Its bytes, when the copy holds them inline.
    pub inline: Option<Vec<u8>>,
    /// Whether a file refers to it.
    pub referenced: bool,
    /// The fencing epoch of its key (`store::block_key_at`).
    pub key_epoch: u64,
}

/// A snapshot's copy being rebuilt.
pub(crate) struct Rebuild {
    conn: Connection,
}

impl Rebuild {
    /// Opens the copy at `path` (a snapshot's bytes); `Invalid` when SQLite finds it damaged.
    pub fn open(path: &Path) -> EngineResult<Rebuild> {
        let conn = Connection::open(path)?;
        let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
        if check != "ok" {
            return Err(EngineError::Invalid("a shipped metadata snapshot is damaged"));
        }
        Ok(Rebuild { conn })
    }

    /// The batch number and state id the copy is at.
    pub fn head(&self) -> EngineResult<(u64, u64)> {
        let (seq, state): (i64, i64) =
            self.conn
                .query_row("SELECT ship_seq, state FROM redo_state WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok((seq as u64, state as u64))
    }

    /// Runs one shipped batch as one transaction, leaving the copy at its number and state.
    pub fn apply(&self, b: &Batch) -> EngineResult<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let applied = batch::apply(&self.conn, &b.records).and_then(|_| {
            self.conn.execute(
                "UPDATE redo_state SET epoch = epoch + 1, state = ?1, ship_seq = ?2 WHERE id = 1",
                params![b.state as i64, b.seq as i64],
            )?;
            Ok(self.conn.execute_batch("COMMIT")?)
        });
        if applied.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        applied
    }

    /// Blocks the copy names as not yet uploaded: each one's digest, its bytes when the copy holds
    /// them (only objects shipped before shipped metadata left the inline journal out do), and
    /// whether any file refers to it.
    pub fn staged_blocks(&self) -> EngineResult<Vec<StagedRow>> {
        let mut q = self.conn.prepare(
            "SELECT b.sha256, i.data, b.refcount > 0, b.key_epoch FROM blocks b
             LEFT JOIN staged_inline i ON i.sha256 = b.sha256 WHERE b.state = 'staged'",
        )?;
        let rows = q.query_map([], |r| {
            Ok(StagedRow {
                sha256: r.get(0)?,
                inline: r.get(1)?,
                referenced: r.get(2)?,
                key_epoch: r.get::<_, i64>(3)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Blocks the copy names as uploaded under this scope's prefix that no file refers to: a gc
    /// pass may have deleted their objects after the last batch the bucket holds (its rows'
    /// deletion was durable only on the lost host).
    pub fn unreferenced_uploaded(&self) -> EngineResult<Vec<super::StoredBlock>> {
        let mut q = self.conn.prepare(
            "SELECT sha256, key_epoch FROM blocks WHERE state = 'uploaded' AND refcount = 0 AND home IS NULL
             ORDER BY sha256",
        )?;
        let rows =
            q.query_map([], |r| Ok(super::StoredBlock { sha256: r.get(0)?, key_epoch: r.get::<_, i64>(1)? as u64 }))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// A staged block no file refers to and the store does not hold: its row goes (nothing is lost).
    pub fn forget_unreferenced(&self, sha: &str) -> EngineResult<()> {
        batch::run(&self.conn, &st::DELETE_UNREFERENCED, &[sha.to_string().into()])?;
        batch::run(&self.conn, &st::DELETE_INLINE, &[sha.to_string().into()])?;
        Ok(())
    }

    /// A staged block found (or put) in the store: marked uploaded, its inline copy dropped.
    pub fn mark_uploaded(&self, sha: &str) -> EngineResult<()> {
        batch::run(&self.conn, &st::MARK_UPLOADED, &[sha.to_string().into()])?;
        batch::run(&self.conn, &st::DELETE_INLINE, &[sha.to_string().into()])?;
        Ok(())
    }

    /// Gives the copy a state of its own (`redo_state.state`) after the restore changed rows the
    /// bucket's batches do not: the process that opens it then starts a new generation with a
    /// snapshot (`ship.rs`) instead of continuing a chain that would replay onto the old rows.
    pub fn diverge(&self) -> EngineResult<()> {
        let state = crate::engine::logfile::fresh_id();
        self.conn.execute("UPDATE redo_state SET state = ?1 WHERE id = 1", params![state as i64])?;
        Ok(())
    }

    /// Ends the rebuild: the copy's WAL folded into its file.
    pub fn finish(self) -> EngineResult<()> {
        self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        self.conn.close().map_err(|(_, e)| EngineError::from(e))
    }
}
