//! Grouped commits of a scope's metadata database (issue 10). Mutations run inside one long write
//! transaction, the batch; every statement a mutation writes with is recorded (its text and values)
//! and the record is appended to the database's redo log (one write, no flush) before the mutation
//! returns, so a mutation survives a killed daemon at once. A mutation that fails after it wrote is
//! undone without a savepoint (which would copy every page it touches): the batch is rolled back
//! and its logged mutations, which never include the failed one, run again (`Op::drop`). The batch
//! commits, writing each page it changed to the WAL once for many mutations, after `BATCH_OPS`
//! mutations or `BATCH_LOG_BYTES` of log, once `BATCH_AGE` old (at its next mutation, or by the
//! idle flusher), at a durability point (`make_durable`), and when the database closes; the log is
//! emptied after. Opening a database runs again, in order, the statements its log holds for the
//! batch after the last committed one: the statements are deterministic (times and names are
//! values, inode numbers come from the same AUTOINCREMENT state, triggers do the same again;
//! foreign keys are on while a log replays, for logs of older daemons that relied on their
//! cascades), so the database ends exactly as the killed process had it.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, ToSql};

use super::{exec_raw, MetaDb};
use crate::engine::{EngineError, EngineResult};

/// The first schema version with a redo log (migration 0008: `redo_state`).
pub(super) const REDO_SCHEMA: i64 = 8;
/// Mutations a batch takes before it commits.
const BATCH_OPS: u32 = 1024;
/// Bytes of redo log at which the batch commits.
const BATCH_LOG_BYTES: u64 = 8 << 20;
/// Age at which a batch commits: at its next mutation, or by the idle flusher
/// (`MetaBudget::commit_idle`).
pub(crate) const BATCH_AGE: Duration = Duration::from_millis(200);
/// Capacity of the record buffer kept between mutations.
const RECORD_KEEP_BYTES: usize = 16 << 10;
/// First bytes of every log record.
const MAGIC: u32 = 0x5346_5244;
/// Record header: magic, payload length, epoch, CRC-32 of epoch and payload.
const HEADER: usize = 20;

/// The redo log of one database and the state of its open batch.
pub(crate) struct Redo {
    path: PathBuf,
    file: File,
    /// Where the next record goes.
    end: u64,
    /// Epoch of the batch being recorded: the last committed one + 1.
    epoch: u64,
    /// Mutations recorded in the open batch.
    ops: u32,
    /// When the open batch began (`None`: no batch open).
    started: Option<Instant>,
    record: Vec<u8>,
    /// The database lacks logged mutations of the open batch (undoing a failed one could not put
    /// them back): restored before the next mutation runs.
    restore_pending: bool,
}

/// The log file of the database at `db`: `<db>-redo`.
pub(crate) fn log_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-redo");
    PathBuf::from(name)
}

impl Redo {
    /// Opens (creating, mode 0600) the log of the database at `db`, whose last committed batch is
    /// `committed`; returns it with the payloads of the batch after, in order: the records of that
    /// epoch from the start of the file, up to the first damaged or short one (a write a killed
    /// process left unfinished) or one of another epoch. A batch always writes its records from
    /// the start, over those of the batch before (`committed`), so a replay only ever runs a prefix
    /// of the mutations of one batch onto the state the batch began from: never what lies behind
    /// a later batch's records (records a power loss brought back).
    fn open(db: &Path, committed: u64) -> io::Result<(Redo, Vec<Vec<u8>>)> {
        Redo::open_log(log_path(db), committed)
    }

    /// `open` of the log file at `path` itself.
    fn open_log(path: PathBuf, committed: u64) -> io::Result<(Redo, Vec<Vec<u8>>)> {
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&path)?;
        let mut all = Vec::new();
        file.read_to_end(&mut all)?;
        let epoch = committed + 1;
        let mut payloads = Vec::new();
        let mut at = 0;
        while at + HEADER <= all.len() {
            let word = |i: usize| u32::from_le_bytes([all[at + i], all[at + i + 1], all[at + i + 2], all[at + i + 3]]);
            let (magic, len, crc) = (word(0), word(4) as usize, word(16));
            let record_epoch = u64::from(word(8)) | (u64::from(word(12)) << 32);
            let start = at + HEADER;
            if magic != MAGIC || start + len > all.len() || checksum(record_epoch, &all[start..start + len]) != crc {
                break;
            }
            if record_epoch != epoch {
                break;
            }
            payloads.push(all[start..start + len].to_vec());
            at = start + len;
        }
        // What follows the last sound record (a torn write) is overwritten by the next one.
        let redo = Redo {
            path,
            file,
            end: at as u64,
            epoch,
            ops: 0,
            started: None,
            record: Vec::new(),
            restore_pending: false,
        };
        Ok((redo, payloads))
    }

    /// Appends one mutation's record (one write; nothing is flushed).
    fn append(&mut self, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("record over 4 GiB"))?;
        self.record.clear();
        self.record.extend_from_slice(&MAGIC.to_le_bytes());
        self.record.extend_from_slice(&len.to_le_bytes());
        self.record.extend_from_slice(&self.epoch.to_le_bytes());
        self.record.extend_from_slice(&checksum(self.epoch, payload).to_le_bytes());
        self.record.extend_from_slice(payload);
        // A failed or partial write leaves `end` where it was: the next record overwrites it.
        let written = self.file.write_all_at(&self.record, self.end);
        let len = self.record.len() as u64;
        if self.record.capacity() > RECORD_KEEP_BYTES {
            // An idle open database keeps no large buffer (thousands may be open).
            self.record = Vec::new();
        }
        written?;
        self.end += len;
        self.ops += 1;
        Ok(())
    }

    /// The batch committed: the next one writes its records from the start of the log, over the
    /// committed ones (of an older epoch, so never replayed: a replay skips them and stops at the
    /// first torn record). The file is not truncated on the way (that frees and allocates its
    /// blocks again every batch); it stays within `BATCH_LOG_BYTES` and one record.
    fn committed(&mut self) {
        self.epoch += 1;
        self.ops = 0;
        self.started = None;
        self.end = 0;
    }

    /// Empties the log (the database is closing with its batch committed).
    fn truncate(&mut self) {
        if let Err(e) = self.file.set_len(0) {
            tracing::warn!(error = %e, "emptying a metadata redo log failed; it keeps committed records");
        }
        self.end = 0;
    }

    /// Whether the open batch should commit now.
    fn due(&self) -> bool {
        self.ops >= BATCH_OPS || self.end >= BATCH_LOG_BYTES || self.started.is_some_and(|t| t.elapsed() >= BATCH_AGE)
    }
}

fn checksum(epoch: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&epoch.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// One mutation inside the open batch and the record of the statements it writes with (`write`).
/// `commit` logs and keeps it; dropped without `commit` (an error on the way) after it wrote, the
/// batch is rolled back and restored from the log, which never holds the failed mutation.
pub(crate) struct Op<'a> {
    conn: &'a Connection,
    statements: RefCell<Vec<u8>>,
    redo: &'a mut Redo,
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
    pub fn write(&self, sql: &str, params: &[&dyn ToSql]) -> rusqlite::Result<usize> {
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
        encode_statement(&mut self.statements.borrow_mut(), sql, refs)?;
        self.conn.prepare_cached(sql)?.execute(params)
    }

    /// Records the mutation in the redo log, then keeps its changes in the batch (which commits
    /// when due). A mutation that cannot be logged is undone and fails.
    pub fn commit(mut self) -> EngineResult<()> {
        if !self.statements.get_mut().is_empty() {
            // On failure `drop` sees the unlogged statements and undoes them.
            self.redo.append(self.statements.get_mut())?;
        }
        self.finished = true;
        if self.redo.due() {
            // The mutation is logged and in the batch: a failed batch commit is not its failure
            // (`commit_batch` put the batch back from the log; the next durability point reports).
            if let Err(e) = commit_batch(self.conn, self.redo) {
                tracing::warn!(error = %e, "committing a metadata batch failed; it stays in the redo log");
            }
        }
        Ok(())
    }
}

impl Drop for Op<'_> {
    /// A mutation that wrote and did not commit: the batch goes back to what its log holds (rare:
    /// checks come before writes), and commits at once, so the next failure replays little.
    fn drop(&mut self) {
        if self.finished || self.statements.get_mut().is_empty() {
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
        let undone = restore_batch(self.conn, self.redo).and_then(|()| commit_batch(self.conn, self.redo));
        if let Err(e) = undone {
            // The log keeps every logged mutation; the next mutation tries again (`MetaDb::tx`).
            self.redo.restore_pending = true;
            tracing::warn!(error = %e, "restoring a metadata batch after a failed mutation failed");
        }
    }
}

/// Value tags of a recorded statement.
const NULL: u8 = 0;
const INTEGER: u8 = 1;
const REAL: u8 = 2;
const TEXT: u8 = 3;
const BLOB: u8 = 4;

/// Appends one statement to a mutation's record: its text, then each value (tag and bytes).
fn encode_statement<'v>(
    out: &mut Vec<u8>,
    sql: &str,
    values: impl ExactSizeIterator<Item = rusqlite::Result<ValueRef<'v>>>,
) -> rusqlite::Result<()> {
    let bytes = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    bytes(out, sql.as_bytes());
    out.extend_from_slice(&(values.len() as u16).to_le_bytes());
    for v in values {
        match v? {
            ValueRef::Null => out.push(NULL),
            ValueRef::Integer(i) => {
                out.push(INTEGER);
                out.extend_from_slice(&i.to_le_bytes());
            }
            ValueRef::Real(f) => {
                out.push(REAL);
                out.extend_from_slice(&f.to_le_bytes());
            }
            ValueRef::Text(t) => {
                out.push(TEXT);
                bytes(out, t);
            }
            ValueRef::Blob(b) => {
                out.push(BLOB);
                bytes(out, b);
            }
        }
    }
    Ok(())
}

/// Reads a mutation's record back: its statements and their values, in order. `None` when the
/// bytes are not a record this module wrote (the CRC passed, so only a newer daemon's log).
fn decode_statements(mut rec: &[u8]) -> Option<Vec<(String, Vec<Value>)>> {
    fn take<'a>(rec: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (rec.get(..n)?, rec.get(n..)?);
        *rec = rest;
        Some(head)
    }
    fn bytes<'a>(rec: &mut &'a [u8]) -> Option<&'a [u8]> {
        let n = u32::from_le_bytes(take(rec, 4)?.try_into().ok()?) as usize;
        take(rec, n)
    }
    let mut out = Vec::new();
    while !rec.is_empty() {
        let sql = String::from_utf8(bytes(&mut rec)?.to_vec()).ok()?;
        let n = u16::from_le_bytes(take(&mut rec, 2)?.try_into().ok()?);
        let mut values = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let tag = take(&mut rec, 1)?[0];
            values.push(match tag {
                NULL => Value::Null,
                INTEGER => Value::Integer(i64::from_le_bytes(take(&mut rec, 8)?.try_into().ok()?)),
                REAL => Value::Real(f64::from_le_bytes(take(&mut rec, 8)?.try_into().ok()?)),
                TEXT => Value::Text(String::from_utf8(bytes(&mut rec)?.to_vec()).ok()?),
                BLOB => Value::Blob(bytes(&mut rec)?.to_vec()),
                _ => return None,
            });
        }
        out.push((sql, values));
    }
    Some(out)
}

/// Commits the open batch (its epoch recorded with it) and empties the log. When the commit fails
/// (the disk is full, an I/O error) SQLite rolls the batch back: it is applied again from the log,
/// so the database keeps every mutation its callers were told succeeded, and the error is returned.
fn commit_batch(conn: &Connection, redo: &mut Redo) -> EngineResult<()> {
    if conn.is_autocommit() {
        return Ok(());
    }
    let committed = conn
        .prepare_cached("UPDATE redo_state SET epoch = ?1 WHERE id = 1")
        .and_then(|mut st| st.execute([redo.epoch as i64]))
        .and_then(|_| conn.execute_batch("COMMIT"));
    match committed {
        Ok(()) => {
            redo.committed();
            Ok(())
        }
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            restore_batch(conn, redo)?;
            Err(e.into())
        }
    }
}

/// Runs the log's records of the open batch again, in a new batch (after its commit failed).
fn restore_batch(conn: &Connection, redo: &mut Redo) -> EngineResult<()> {
    let (fresh, payloads) = Redo::open_log(redo.path.clone(), redo.epoch - 1)?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    if let Err(e) = apply(conn, &payloads) {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(e);
    }
    let ops = payloads.len() as u32;
    *redo = Redo { ops, started: Some(Instant::now()), ..fresh };
    Ok(())
}

/// Runs the recorded mutations again, in order, inside the caller's transaction.
fn apply(conn: &Connection, records: &[Vec<u8>]) -> EngineResult<()> {
    for record in records {
        let statements = decode_statements(record)
            .ok_or(EngineError::Invalid("a metadata redo record this daemon cannot read (written by a newer one?)"))?;
        for (sql, values) in statements {
            conn.prepare_cached(&sql)?.execute(rusqlite::params_from_iter(values.iter()))?;
        }
    }
    Ok(())
}

impl MetaDb {
    /// Opens the redo log of a freshly opened (migrated) database and runs again what it holds
    /// beyond the last committed batch, committing it as that batch's successor.
    pub(super) fn open_redo(conn: &Connection, path: &Path) -> EngineResult<Redo> {
        let committed: i64 = conn.query_row("SELECT epoch FROM redo_state WHERE id = 1", [], |r| r.get(0))?;
        let (mut redo, payloads) = Redo::open(path, committed.max(0) as u64)?;
        if payloads.is_empty() {
            return Ok(redo);
        }
        let replayed = conn.execute_batch("BEGIN IMMEDIATE").map_err(EngineError::from).and_then(|()| {
            apply(conn, &payloads)?;
            conn.execute("UPDATE redo_state SET epoch = ?1 WHERE id = 1", [redo.epoch as i64])?;
            Ok(conn.execute_batch("COMMIT")?)
        });
        if replayed.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        replayed?;
        tracing::info!(mutations = payloads.len(), "replayed a scope's metadata redo log");
        redo.committed();
        Ok(redo)
    }

    /// Starts one mutation (opening a batch first when none is open).
    pub(super) fn tx(&mut self) -> EngineResult<Op<'_>> {
        let MetaDb { conn, redo, .. } = self;
        if redo.restore_pending {
            if !conn.is_autocommit() {
                conn.execute_batch("ROLLBACK")?;
            }
            restore_batch(conn, redo)?;
            redo.restore_pending = false;
        }
        if conn.is_autocommit() {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            redo.started = Some(Instant::now());
        }
        Ok(Op { conn, statements: RefCell::new(Vec::new()), redo, finished: false })
    }

    /// Makes every earlier mutation durable: the open batch commits, then one FULL-synchronous
    /// commit flushes the WAL, which covers every commit before it.
    pub fn make_durable(&mut self) -> EngineResult<()> {
        commit_batch(&self.conn, &mut self.redo)?;
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        let r = exec_raw(&self.conn, "UPDATE usage SET id = id WHERE id = 1");
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        r?;
        Ok(())
    }

    /// Commits the open batch, then copies the WAL into the database file (a passive checkpoint);
    /// `true` when every frame was copied.
    pub fn checkpoint(&mut self) -> EngineResult<bool> {
        commit_batch(&self.conn, &mut self.redo)?;
        let (busy, log, copied): (i64, i64, i64) =
            self.conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(busy == 0 && log == copied)
    }

    /// Commits the open batch, then writes a consistent copy of the database to `to`.
    pub fn copy_to(&mut self, to: &Path) -> EngineResult<()> {
        commit_batch(&self.conn, &mut self.redo)?;
        let to = to.to_str().ok_or(EngineError::Invalid("a metadata copy's path must be UTF-8"))?;
        self.conn.execute("VACUUM INTO ?1", [to])?;
        Ok(())
    }

    /// Mutations in the open batch (in the redo log, not yet committed).
    pub fn uncommitted(&self) -> u32 {
        self.redo.ops
    }

    /// Commits the open batch if it is at least `age` old (the idle flusher), or whatever its age
    /// with `Duration::ZERO` (before the database closes or is handed over).
    pub fn commit_batch_older_than(&mut self, age: Duration) -> EngineResult<()> {
        match self.redo.started {
            Some(t) if t.elapsed() >= age => commit_batch(&self.conn, &mut self.redo),
            _ => Ok(()),
        }
    }
}

impl Drop for MetaDb {
    /// A database closing commits its batch and empties its log; if the commit fails the log keeps
    /// the batch for the next open.
    fn drop(&mut self) {
        match self.commit_batch_older_than(Duration::ZERO) {
            Ok(()) => self.redo.truncate(),
            Err(e) => tracing::warn!(error = %e, "committing a metadata batch at close failed; the redo log keeps it"),
        }
    }
}

/// Keeps the WAL file when the database closes (emptied, not deleted): a scope's database is
/// closed and opened again by the open-database budget, and creating the file anew each time cost
/// the host file system an inode allocation (most of a reopen's time).
pub(super) fn persist_wal(conn: &Connection) -> rusqlite::Result<()> {
    let mut on: std::ffi::c_int = 1;
    // SAFETY: a file control on this open connection's main database, with a pointer to an int
    // that outlives the call.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&raw mut on).cast(),
        )
    };
    if rc == rusqlite::ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), Some("persisting the WAL file".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(dir: &Path, batches: &[(u64, &[&[u8]])]) -> PathBuf {
        let db = dir.join("meta.sqlite3");
        let (mut redo, _) = Redo::open(&db, 0).unwrap();
        for (epoch, records) in batches {
            redo.epoch = *epoch;
            redo.end = 0;
            for r in *records {
                redo.append(r).unwrap();
            }
        }
        db
    }

    /// A mutation dropped after it wrote (an error on its way) is undone: the batch goes back to
    /// its logged mutations (run again from the log), which stay, and commits; the next mutation
    /// and a reopen see exactly those. An undo with nothing logged is a plain rollback.
    #[test]
    fn a_mutation_failing_after_it_wrote_is_undone_and_its_batch_kept() {
        use crate::engine::meta::NewNode;
        use crate::engine::{FileKind, Owner, ROOT_INO};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite3");
        let owner = Owner { uid: 0, gid: 0 };
        let names =
            |db: &MetaDb| db.children(ROOT_INO).unwrap().into_iter().map(|r| r.name.unwrap()).collect::<Vec<_>>();
        let mut db = MetaDb::open(&path, 0, 0).unwrap();
        let failing = |db: &mut MetaDb| {
            let tx = db.tx().unwrap();
            super::super::exec(&tx, "UPDATE usage SET files = files + 100 WHERE id = 1", &[]).unwrap();
            // Dropped without commit: the error path of a mutation.
        };
        failing(&mut db);
        assert_eq!(db.usage().unwrap().files, 0, "nothing logged: rolled back");
        for name in [&b"a"[..], b"b"] {
            db.insert(ROOT_INO, name, NewNode::plain(FileKind::File, 0o644), owner, 100).unwrap();
        }
        assert_eq!(db.uncommitted(), 2);
        failing(&mut db);
        assert_eq!(db.usage().unwrap().files, 2, "the failed mutation is undone");
        assert_eq!(names(&db), vec![b"a".to_vec(), b"b".to_vec()], "the logged ones are kept");
        assert_eq!(db.uncommitted(), 0, "and committed");
        db.insert(ROOT_INO, b"c", NewNode::plain(FileKind::File, 0o644), owner, 100).unwrap();
        assert_eq!(db.consistency_problems().unwrap(), Vec::<String>::new());
        drop(db);
        let db = MetaDb::open(&path, 0, 0).unwrap();
        assert_eq!(names(&db), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(db.usage().unwrap().files, 3);
    }

    #[test]
    fn a_replay_takes_the_records_of_the_next_epoch_from_the_start_of_the_log() {
        let dir = tempfile::tempdir().unwrap();
        // Batch 3 wrote three records; batch 4 then two, over the start of them.
        let db = log_with(dir.path(), &[(3, &[b"a3", b"b3", b"c3"]), (4, &[b"a4", b"b4"])]);
        let (redo, found) = Redo::open(&db, 3).unwrap();
        assert_eq!(found, vec![b"a4".to_vec(), b"b4".to_vec()], "batch 4, not the tail of batch 3 behind it");
        assert_eq!(redo.epoch, 4);
        // With batch 4 committed, nothing is replayed, and the next batch writes from the start.
        let (redo, found) = Redo::open(&db, 4).unwrap();
        assert!(found.is_empty());
        assert_eq!(redo.end, 0);
        // A database that lost batch 3 (a power loss) never gets batch 3's tail behind batch 4.
        let (_, found) = Redo::open(&db, 2).unwrap();
        assert!(found.is_empty());
    }

    #[test]
    fn a_torn_record_ends_the_records_and_the_next_one_overwrites_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = log_with(dir.path(), &[(1, &[b"first", b"second", b"third"])]);
        let log = log_path(&db);
        let full = std::fs::read(&log).unwrap();
        std::fs::write(&log, &full[..full.len() - 2]).unwrap();
        let (mut redo, found) = Redo::open(&db, 0).unwrap();
        assert_eq!(found, vec![b"first".to_vec(), b"second".to_vec()]);
        redo.append(b"again").unwrap();
        let (_, found) = Redo::open(&db, 0).unwrap();
        assert_eq!(found, vec![b"first".to_vec(), b"second".to_vec(), b"again".to_vec()]);
        // Garbage is no record.
        std::fs::write(&log, b"not a record at all, just bytes").unwrap();
        assert!(Redo::open(&db, 0).unwrap().1.is_empty());
    }

    #[test]
    fn statements_and_values_round_trip_through_a_record() {
        let mut rec = Vec::new();
        let values =
            vec![Value::Null, Value::Integer(-7), Value::Real(1.5), Value::Text("é".into()), Value::Blob(vec![0, 255])];
        let refs = values.iter().map(|v| Ok(ValueRef::from(v)));
        encode_statement(&mut rec, "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)", refs).unwrap();
        encode_statement(&mut rec, "DELETE FROM t", std::iter::empty()).unwrap();
        let decoded = decode_statements(&rec).unwrap();
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[0].1, values);
        assert_eq!(decoded[1], ("DELETE FROM t".to_string(), Vec::new()));
        assert!(decode_statements(&rec[..rec.len() - 1]).is_none(), "a cut record does not decode");
    }
}
