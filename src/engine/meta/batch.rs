//! Grouped commits of a scope's metadata database (issue 10). Mutations run inside one long write
//! transaction, the batch; each one's statements (ids of `statements.rs` and their values) are
//! recorded in the redo log (`redo.rs`, one write, no flush) before the mutation returns, so a
//! mutation survives a killed daemon at once. The batch commits after `BATCH_OPS` mutations or
//! `BATCH_LOG_BYTES` of log, once `BATCH_AGE` old, at a durability point (`make_durable`) and when
//! the database closes; each commit records a new random state id, and the next batch's records go
//! into a new generation of the log built on it.
//!
//! A mutation that fails after it wrote is undone without a savepoint: the batch is rolled back and
//! the records of its logged mutations, which never include the failed one, run again. When that
//! restore fails too (a full disk, an I/O error), or a batch commit fails and cannot be put back,
//! the database no longer holds mutations that were acknowledged: it is **poisoned**. Every later use
//! (`heal`, called by whoever locks the database) first puts the batch back from the log, and fails
//! with `Poisoned` (EIO) while it cannot; the log is never emptied while it holds records the
//! database lacks.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, ToSql};

use super::redo::{self, Redo};
use super::statements::Stmt;
use super::{exec_raw, MetaDb};
use crate::engine::logfile::fresh_id;
use crate::engine::requests::{self, Answers};
use crate::engine::{EngineError, EngineResult};

/// The first schema version with a redo log (migration 0008: `redo_state`).
pub(super) const REDO_SCHEMA: i64 = 8;
/// The first schema version whose log is of format 2 (migration 0009: `redo_state.state`).
pub(super) const REDO_V2: i64 = 9;
/// Mutations a batch takes before it commits.
const BATCH_OPS: u32 = 1024;
/// Bytes of redo log at which the batch commits.
const BATCH_LOG_BYTES: u64 = 8 << 20;
/// Age at which a batch commits: at its next mutation, or by the idle flusher
/// (`MetaBudget::commit_idle`).
pub(crate) const BATCH_AGE: Duration = Duration::from_millis(200);

impl Redo {
    /// Whether the open batch should commit now.
    fn due(&self) -> bool {
        self.ops >= BATCH_OPS
            || self.log.len() >= BATCH_LOG_BYTES
            || self.started.is_some_and(|t| t.elapsed() >= BATCH_AGE)
    }
}

/// One mutation inside the open batch and the record of the statements it writes with (`write`).
/// `commit` logs and keeps it; dropped without `commit` (an error on the way) after it wrote, the
/// batch is rolled back and restored from the log, which never holds the failed mutation.
pub(crate) struct Op<'a> {
    conn: &'a Connection,
    record: RefCell<Vec<u8>>,
    redo: &'a mut Redo,
    answers: &'a Answers,
    poisoned: &'a mut bool,
    /// What the mutation's request is answered (an inode number), recorded with it.
    answer: Cell<u64>,
    finished: bool,
}

impl std::ops::Deref for Op<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Op<'_> {
    /// Runs one writing statement of the mutation (through the statement cache) and records it. The
    /// values are encoded where they are (a blob is copied into the record once, never cloned).
    pub fn write(&self, stmt: &Stmt, params: &[&dyn ToSql]) -> rusqlite::Result<usize> {
        let mut values = Vec::with_capacity(params.len());
        for p in params {
            values.push(p.to_sql()?);
        }
        let refs = values.iter().map(|v| match v {
            ToSqlOutput::Borrowed(v) => Ok(*v),
            ToSqlOutput::Owned(v) => Ok(ValueRef::from(v)),
            _ => Err(rusqlite::Error::ToSqlConversionFailure("unsupported value kind".into())),
        });
        // Recorded before it runs: a statement that fails part-way is undone with the mutation.
        redo::encode_statement(&mut self.record.borrow_mut(), stmt, refs)?;
        self.conn.prepare_cached(stmt.sql)?.execute(params)
    }

    /// Records the inode the mutation's request is answered with (a created or linked inode).
    pub fn set_answer(&self, ino: u64) {
        self.answer.set(ino);
    }

    /// Records the mutation in the redo log, then keeps its changes in the batch (which commits
    /// when due). A mutation that cannot be logged is undone and fails.
    pub fn commit(mut self) -> EngineResult<()> {
        let rec = self.record.get_mut();
        if redo::has_statements(rec) {
            let request = requests::current_id();
            redo::finish_record(rec, request, self.answer.get());
            // On failure `drop` sees the unlogged statements and undoes them.
            self.redo.log.append(rec)?;
            self.redo.keep_for_shipping(rec);
            self.redo.ops += 1;
            self.answers.logged(request, self.answer.get());
        }
        self.finished = true;
        if self.redo.due() {
            // The mutation is logged and in the batch: a failed batch commit is not its failure
            // (`commit_batch` put the batch back from the log, or poisoned the database; the next
            // use or durability point reports).
            if let Err(e) = commit_batch(self.conn, self.redo, self.answers, self.poisoned) {
                tracing::warn!(error = %e, "committing a metadata batch failed; it stays in the redo log");
            }
        }
        Ok(())
    }
}

impl Drop for Op<'_> {
    /// A mutation that wrote and did not commit: the batch goes back to what its log holds (rare:
    /// checks come before writes), and commits at once, so the next failure replays little. The
    /// record's buffer goes back to the log for the next mutation.
    fn drop(&mut self) {
        let record = std::mem::take(self.record.get_mut());
        let wrote = redo::has_statements(&record);
        self.redo.give_back(record);
        if self.finished || !wrote {
            return;
        }
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        if self.redo.ops == 0 {
            // Nothing logged in this batch: the rollback was the whole undo.
            self.redo.started = None;
            return;
        }
        tracing::info!(mutations = self.redo.ops, "a metadata mutation failed after writing; its batch is restored");
        let undone = restore_batch(self.conn, self.redo)
            .and_then(|()| commit_batch(self.conn, self.redo, self.answers, self.poisoned));
        if let Err(e) = undone {
            *self.poisoned = true;
            tracing::error!(error = %e, "restoring a metadata batch failed; the scope answers EIO until it is restored");
        }
    }
}

/// Commits the open batch as a new state (its id, the answers of requests not answered yet) and
/// starts a new generation of the log. When the commit fails (the disk is full, an I/O error) SQLite
/// rolls the batch back: it is applied again from the log, so the database keeps every mutation its
/// callers were told succeeded, and the error is returned; if it cannot be applied again the
/// database is poisoned.
fn commit_batch(conn: &Connection, redo: &mut Redo, answers: &Answers, poisoned: &mut bool) -> EngineResult<()> {
    if conn.is_autocommit() {
        return Ok(());
    }
    let state = fresh_id();
    let seq = redo.seq + 1;
    let committed = conn
        .prepare_cached(
            "UPDATE redo_state SET epoch = epoch + 1, state = ?1, answered = ?2, ship_seq = ?3 WHERE id = 1",
        )
        .and_then(|mut st| st.execute(rusqlite::params![state as i64, answers.for_commit(), seq as i64]))
        .and_then(|_| faults::inject(faults::Point::Commit))
        .and_then(|()| conn.execute_batch("COMMIT"));
    match committed {
        Ok(()) => {
            redo.committed_batch(state, seq);
            Ok(())
        }
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            if let Err(restore) = restore_batch(conn, redo) {
                *poisoned = true;
                tracing::error!(error = %restore, "a metadata batch could not be put back after a failed commit; the scope answers EIO until it is");
            }
            Err(e.into())
        }
    }
}

/// Runs the log's records of the open batch again, in a new transaction (after a rollback).
fn restore_batch(conn: &Connection, redo: &mut Redo) -> EngineResult<()> {
    let records = redo.reread()?;
    if (records.len() as u64) < u64::from(redo.ops) {
        return Err(EngineError::Poisoned("the redo log lost records of the open batch"));
    }
    if !conn.is_autocommit() {
        conn.execute_batch("ROLLBACK")?;
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    if let Err(e) =
        faults::inject(faults::Point::Restore).map_err(EngineError::from).and_then(|()| apply(conn, &records))
    {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(e);
    }
    redo.ops = records.len() as u32;
    redo.kept_again(&records);
    redo.started = Some(Instant::now());
    Ok(())
}

/// Runs recorded mutations, in order, inside the caller's transaction; returns each record's request
/// and answer.
pub(super) fn apply(conn: &Connection, records: &[Vec<u8>]) -> EngineResult<Vec<(u64, u64)>> {
    let mut answers = Vec::with_capacity(records.len());
    for record in records {
        let rec = redo::decode(record).ok_or(EngineError::Poisoned("a redo record this daemon cannot read"))?;
        for (stmt, values) in &rec.statements {
            run(conn, stmt, values)?;
        }
        answers.push((rec.request, rec.answer));
    }
    Ok(answers)
}

/// Runs one statement of the table with recorded values.
pub(super) fn run(conn: &Connection, stmt: &Stmt, values: &[Value]) -> EngineResult<()> {
    conn.prepare_cached(stmt.sql)?.execute(rusqlite::params_from_iter(values.iter()))?;
    Ok(())
}

impl MetaDb {
    /// Puts a poisoned database's batch back from the log (see the module docs); `Poisoned` while it
    /// cannot.
    pub fn heal(&mut self) -> EngineResult<()> {
        if !self.poisoned {
            return Ok(());
        }
        restore_batch(&self.conn, &mut self.redo)?;
        self.poisoned = false;
        tracing::info!("a poisoned metadata batch was put back from its redo log");
        Ok(())
    }

    /// Starts one mutation (opening a batch first when none is open).
    pub(super) fn tx(&mut self) -> EngineResult<Op<'_>> {
        self.heal()?;
        let MetaDb { conn, redo, answers, poisoned, .. } = self;
        if conn.is_autocommit() {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            redo.started = Some(Instant::now());
        }
        let mut record = std::mem::take(&mut redo.spare_record);
        redo::start_record(&mut record);
        Ok(Op { conn, record: RefCell::new(record), redo, answers, poisoned, answer: Cell::new(0), finished: false })
    }

    fn commit_open_batch(&mut self) -> EngineResult<()> {
        self.heal()?;
        commit_batch(&self.conn, &mut self.redo, &self.answers, &mut self.poisoned)
    }

    /// Makes every earlier mutation durable: the open batch commits, then one FULL-synchronous
    /// commit flushes the WAL, which covers every commit before it.
    pub fn make_durable(&mut self) -> EngineResult<()> {
        self.commit_open_batch()?;
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        let r = exec_raw(&self.conn, "UPDATE usage SET id = id WHERE id = 1");
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        r.map_err(|e| with_os_error(&self.conn, e))?;
        Ok(())
    }

    /// Commits the open batch, then copies the WAL into the database file (a passive checkpoint);
    /// `true` when every frame was copied.
    pub fn checkpoint(&mut self) -> EngineResult<bool> {
        self.commit_open_batch()?;
        let (busy, log, copied): (i64, i64, i64) =
            self.conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(busy == 0 && log == copied)
    }

    /// Commits the open batch, then writes a consistent copy of the database to `to`.
    pub fn copy_to(&mut self, to: &std::path::Path) -> EngineResult<()> {
        self.commit_open_batch()?;
        // SQLite's online backup (no `ATTACH`, which the connection's authorizer refuses).
        self.conn.backup(rusqlite::MAIN_DB, to, None::<fn(rusqlite::backup::Progress)>)?;
        Ok(())
    }

    /// Commits the open batch, then writes a consistent copy of the database to `to` (replacing
    /// any file there, and its WAL); returns the batch number and state id the copy is at (for shipping).
    pub fn snapshot_to(&mut self, to: &std::path::Path) -> EngineResult<(u64, u64)> {
        // A WAL left beside an earlier copy would be read into this one.
        crate::db_files::remove_with(to, &["", "-wal", "-shm"])?;
        self.copy_to(to)?;
        Ok((self.redo.seq, self.redo.base))
    }

    /// `snapshot_to` for a copy that is read once and removed (a snapshot to ship): written without
    /// a journal or a flush, so the scope's operations wait only for the pages to be copied.
    pub fn scratch_snapshot_to(&mut self, to: &std::path::Path) -> EngineResult<(u64, u64)> {
        crate::db_files::remove_with(to, &["", "-wal", "-shm"])?;
        self.commit_open_batch()?;
        let mut copy = Connection::open(to)?;
        copy.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF")?;
        // Every page in one step: nothing else uses this connection meanwhile (the lock is held).
        let step = rusqlite::backup::Backup::new(&self.conn, &mut copy)?.step(-1)?;
        if step != rusqlite::backup::StepResult::Done {
            return Err(EngineError::Io(std::io::Error::other("a metadata snapshot copy did not complete")));
        }
        copy.close().map_err(|(_, e)| EngineError::from(e))?;
        Ok((self.redo.seq, self.redo.base))
    }

    /// Hands every batch committed from now on to `ship`, telling it where the database stands (a
    /// database migrated at this open counts as a state it has not seen: the next object shipped
    /// is a snapshot).
    pub(crate) fn attach_ship(&mut self, ship: std::sync::Arc<crate::engine::ship::MetaShip>) {
        ship.opened(self.redo.seq, if self.migrated { 0 } else { self.redo.base });
        self.redo.ship = Some(ship);
    }

    /// The fencing epoch blocks new to the scope are stored under (0: one node).
    pub(crate) fn key_epoch(&self) -> u64 {
        self.redo.ship.as_ref().map_or(0, |s| s.key_epoch)
    }

    /// The number of the newest committed batch.
    pub fn committed_seq(&self) -> u64 {
        self.redo.seq
    }

    /// Mutations in the open batch (in the redo log, not yet committed).
    pub fn uncommitted(&self) -> u32 {
        self.redo.ops
    }

    /// Commits the open batch if it is at least `age` old (the idle flusher), or whatever its age
    /// with `Duration::ZERO` (before the database closes or is handed over).
    pub fn commit_batch_older_than(&mut self, age: Duration) -> EngineResult<()> {
        if self.poisoned {
            return self.commit_open_batch();
        }
        match self.redo.started {
            Some(t) if t.elapsed() >= age => self.commit_open_batch(),
            _ => Ok(()),
        }
    }
}

/// SQLite reports a failed flush as `SQLITE_IOERR_FSYNC` whatever the host said; a full disk
/// (`ENOSPC`, `EDQUOT`) is told as such (answered `ENOSPC`, not `EIO`).
fn with_os_error(conn: &Connection, e: rusqlite::Error) -> EngineError {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        if f.code == rusqlite::ErrorCode::SystemIoFailure {
            // SAFETY: reads the last OS error code of this open connection; no pointer is kept.
            let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
            if errno == libc::ENOSPC || errno == libc::EDQUOT {
                return EngineError::Io(std::io::Error::from_raw_os_error(errno));
            }
        }
    }
    e.into()
}

impl Drop for MetaDb {
    /// A database closing commits its batch and empties its log; a log whose batch could not be
    /// committed (or put back) keeps it for the next open.
    fn drop(&mut self) {
        match self.commit_batch_older_than(Duration::ZERO) {
            Ok(()) if !self.poisoned && self.redo.ops == 0 => {
                if let Err(e) = self.redo.log.clear(self.redo.base) {
                    tracing::warn!(error = %e, "emptying a metadata redo log failed; its records are of a committed state");
                }
            }
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "committing a metadata batch at close failed; the redo log keeps it"),
        }
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;

/// Faults of a full disk at a batch's commit or restore, for unit tests (a connection's page limit
/// cannot make only the restore fail); nothing outside `cfg(test)`.
mod faults {
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(super) enum Point {
        Commit,
        Restore,
    }

    #[cfg(test)]
    thread_local! {
        /// Failures to inject on this thread at each point, counted down.
        pub(super) static PENDING: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
    }

    /// `SQLITE_FULL` when a failure is pending at `point` on this thread (tests only).
    pub(super) fn inject(point: Point) -> rusqlite::Result<()> {
        #[cfg(test)]
        {
            let (commits, restores) = PENDING.with(|p| p.get());
            let fire = match point {
                Point::Commit if commits > 0 => Some((commits - 1, restores)),
                Point::Restore if restores > 0 => Some((commits, restores - 1)),
                _ => None,
            };
            if let Some(left) = fire {
                PENDING.with(|p| p.set(left));
                let full = rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL);
                return Err(rusqlite::Error::SqliteFailure(full, Some("injected full disk".into())));
            }
        }
        let _ = point;
        Ok(())
    }
}
