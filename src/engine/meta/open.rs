//! Opening a scope's metadata database: its connection settings, the replay of what its redo log
//! holds beyond the committed state (format 2, or once the first format of an older daemon), the
//! migrations, and the authorizer every scope connection runs under.
//!
//! The authorizer: a scope database is written only by the statements of `statements.rs` and read by
//! the engine's own queries; whatever runs on the connection may never attach another database, and
//! may not change pragmas beyond the few the engine switches itself. While a log is replayed it is
//! stricter still: reads and writes of the scope's own tables, nothing else.

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::{params, Connection};

use super::batch::{self, REDO_SCHEMA, REDO_V2};
use super::redo::{self, legacy, Redo};
use super::{now_ns, MetaDb};
use crate::engine::logfile::fresh_id;
use crate::engine::requests::{self, Answers};
use crate::engine::types::ROOT_INO;
use crate::engine::{EngineError, EngineResult};
use crate::migrate;

/// WAL pages written between automatic checkpoints (4 KiB pages: 32 MiB).
const WAL_CHECKPOINT_PAGES: i64 = 8192;
/// Bytes of WAL file kept after a checkpoint resets it.
const WAL_KEEP_BYTES: i64 = 4 << 20;

/// What the connection's authorizer lets through.
const MODE_OPEN: u8 = 0;
const MODE_LIVE: u8 = 1;
const MODE_REPLAY: u8 = 2;

/// Pragmas the engine sets on a live connection (`make_durable`, `checkpoint`).
const LIVE_PRAGMAS: &[&str] = &["synchronous", "wal_checkpoint", "foreign_keys"];

fn authorize(mode: u8, ctx: &AuthContext<'_>) -> Authorization {
    if mode == MODE_OPEN {
        return Authorization::Allow;
    }
    let main = ctx.database_name.is_none_or(|d| d == "main");
    match ctx.action {
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => Authorization::Deny,
        AuthAction::Read { .. } | AuthAction::Select | AuthAction::Function { .. } | AuthAction::Recursive => {
            Authorization::Allow
        }
        AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => Authorization::Allow,
        AuthAction::Insert { table_name }
        | AuthAction::Delete { table_name }
        | AuthAction::Update { table_name, .. } => {
            if main && !table_name.starts_with("sqlite_") {
                Authorization::Allow
            } else {
                Authorization::Deny
            }
        }
        AuthAction::Pragma { pragma_name, pragma_value } if mode == MODE_LIVE => {
            if pragma_value.is_none() || LIVE_PRAGMAS.contains(&pragma_name) {
                Authorization::Allow
            } else {
                Authorization::Deny
            }
        }
        _ => Authorization::Deny,
    }
}

impl MetaDb {
    /// Opens (creating and migrating) the database; creates the root directory on first open.
    #[cfg(test)]
    pub fn open(path: &Path, root_uid: u32, root_gid: u32) -> EngineResult<MetaDb> {
        MetaDb::open_with(path, root_uid, root_gid, Arc::default())
    }

    /// `open`, sharing `answers` with the scope's engine (the answers of resent requests).
    pub(crate) fn open_with(path: &Path, root_uid: u32, root_gid: u32, answers: Arc<Answers>) -> EngineResult<MetaDb> {
        let fresh = !path.exists();
        let mut conn = Connection::open(path)?;
        if fresh {
            // Private before the WAL file exists: SQLite gives it the database's mode.
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        }
        persist_wal(&conn)?;
        // Set before the locking pragmas: a database another process holds makes them wait, then fail.
        conn.busy_timeout(Duration::from_secs(30))?;
        // One batch, parsed once (a scope's database is opened again whenever the open-database
        // budget closed it):
        // - EXCLUSIVE: one process owns a scope's database while it has it open (its redo log is
        //   replayed under that ownership).
        // - NORMAL: in WAL mode a commit survives a process crash; a power loss may drop the newest
        //   commits but never corrupts. Durability points (fsync, fsyncdir, sync) flush the WAL
        //   through one FULL-synchronous commit (`make_durable`), covering every commit before it.
        // - a page cache of up to 4 MiB, so a batch's changed pages fit and are written to the WAL
        //   once, at its commit; all caches together stay within `metadata_cache_max_bytes`.
        // - temp_store MEMORY: statement journals and temporary tables never go to a temporary file.
        // - a checkpoint every 8192 pages, not SQLite's 1000; the WAL is cut back to 4 MiB after a
        //   checkpoint and emptied when the database closes.
        // - foreign keys off, replays included: every mutation deletes what an inode owns itself
        //   (`delete_inode`), so a replay runs exactly what live execution ran; `consistency_problems`
        //   checks the references.
        conn.execute_batch(&format!(
            "PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             PRAGMA cache_size = -4096; PRAGMA temp_store = MEMORY;
             PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}; PRAGMA journal_size_limit = {WAL_KEEP_BYTES};
             PRAGMA foreign_keys = OFF;"
        ))?;
        // Every statement of the hot paths stays prepared and keeps its plan (the query planner
        // stability guarantee: without it a cached statement is prepared again whenever a bound value
        // might change its plan).
        conn.set_prepared_statement_cache_capacity(64);
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
        let mode = Arc::new(AtomicU8::new(MODE_OPEN));
        let seen = mode.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| authorize(seen.load(Ordering::Relaxed), &ctx)))?;
        // A log left by a killed daemon is replayed before any migration: its statements were
        // written for the schema the file has now.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let mut redo = None;
        if version >= REDO_V2 {
            // The root is inserted outside any batch: a power loss may keep the batches built on it
            // in the log and drop it from the WAL. Records were written with a root present.
            ensure_root(&conn, root_uid, root_gid)?;
            mode.store(MODE_REPLAY, Ordering::Relaxed);
            redo = Some(replay(&conn, path, &answers)?);
        } else if version >= REDO_SCHEMA {
            mode.store(MODE_REPLAY, Ordering::Relaxed);
            replay_legacy(&conn, path)?;
        }
        mode.store(MODE_OPEN, Ordering::Relaxed);
        let migrated = migrate::SCOPE_META.last().is_some_and(|m| m.version != version);
        if migrated {
            migrate::apply(&mut conn, migrate::SCOPE_META)?;
        }
        ensure_root(&conn, root_uid, root_gid)?;
        let mut redo = match redo {
            Some(redo) => redo,
            None => replay(&conn, path, &answers)?,
        };
        redo.seq = conn.query_row("SELECT ship_seq FROM redo_state WHERE id = 1", [], |r| r.get::<_, i64>(0))? as u64;
        mode.store(MODE_LIVE, Ordering::Relaxed);
        Ok(MetaDb { conn, redo, answers, poisoned: false, places: Default::default(), migrated })
    }
}

/// Creates the root directory of a database that has none. Only a new database (or one whose
/// first commit a power loss dropped) writes here: a reopened one stays read-only until used.
fn ensure_root(conn: &Connection, root_uid: u32, root_gid: u32) -> rusqlite::Result<()> {
    let has_root: bool =
        conn.query_row("SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = ?1)", [ROOT_INO as i64], |r| r.get(0))?;
    if !has_root {
        let now = now_ns();
        conn.execute(
            "INSERT OR IGNORE INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
             VALUES (?1, NULL, NULL, 'dir', 493, ?2, ?3, ?4, ?4, ?4)",
            params![ROOT_INO as i64, root_uid, root_gid, now],
        )?;
    }
    Ok(())
}

/// Opens the log (format 2) and runs again what it holds beyond the committed state, committing it
/// as that state's successor; the answers it recorded are kept for resent requests.
fn replay(conn: &Connection, path: &Path, answers: &Answers) -> EngineResult<Redo> {
    let (state, answered): (i64, Option<Vec<u8>>) =
        conn.query_row("SELECT state, answered FROM redo_state WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    answers.inherit(requests::decode(answered.as_deref().unwrap_or_default()));
    let (mut redo, records) = Redo::open(path, state as u64)?;
    if records.is_empty() {
        return Ok(redo);
    }
    let next = fresh_id();
    let replayed = conn.execute_batch("BEGIN IMMEDIATE").map_err(EngineError::from).and_then(|()| {
        answers.inherit(batch::apply(conn, &records)?);
        conn.execute(
            "UPDATE redo_state SET epoch = epoch + 1, state = ?1, answered = ?2 WHERE id = 1",
            params![next as i64, answers.for_commit()],
        )?;
        Ok(conn.execute_batch("COMMIT")?)
    });
    if replayed.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    if let Err(e) = replayed {
        tracing::error!(error = %e, "replaying a scope's metadata redo log failed; the scope stays unavailable until it succeeds");
        return Err(e);
    }
    tracing::info!(mutations = records.len(), "replayed a scope's metadata redo log");
    redo.committed(next);
    Ok(redo)
}

/// Runs once what a log of the first format holds (a daemon before this one was killed), when every
/// statement in it is one of the table's; a log naming anything else runs nothing and keeps the
/// scope unavailable. The log is emptied afterwards: the next batch writes format 2.
fn replay_legacy(conn: &Connection, path: &Path) -> EngineResult<()> {
    let log = redo::log_path(path);
    let all = match std::fs::read(&log) {
        Ok(all) => all,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let committed: i64 = conn.query_row("SELECT epoch FROM redo_state WHERE id = 1", [], |r| r.get(0))?;
    let records = match legacy::read(&all, committed.max(0) as u64) {
        legacy::Legacy::Records(records) => records,
        legacy::Legacy::Refused => {
            tracing::error!("a scope's redo log of the first format names statements this daemon does not run; nothing of it was run");
            return Err(EngineError::Poisoned("a redo log of an older daemon holds statements this daemon refuses"));
        }
    };
    if !records.is_empty() {
        let replayed = conn.execute_batch("BEGIN IMMEDIATE").map_err(EngineError::from).and_then(|()| {
            for record in &records {
                for (stmt, values) in record {
                    batch::run(conn, stmt, values)?;
                }
            }
            conn.execute("UPDATE redo_state SET epoch = epoch + 1 WHERE id = 1", [])?;
            Ok(conn.execute_batch("COMMIT")?)
        });
        if replayed.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        replayed?;
        tracing::info!(mutations = records.len(), "replayed a scope's metadata redo log of the first format");
    }
    std::fs::OpenOptions::new().write(true).open(&log)?.set_len(0)?;
    Ok(())
}

/// Keeps the WAL file when the database closes (emptied, not deleted): a scope's database is
/// closed and opened again by the open-database budget, and creating the file anew each time cost
/// the host file system an inode allocation (most of a reopen's time).
fn persist_wal(conn: &Connection) -> rusqlite::Result<()> {
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

    #[test]
    fn the_authorizer_refuses_attach_and_pragma_writes_on_a_live_connection() {
        let dir = tempfile::tempdir().unwrap();
        let db = MetaDb::open(&dir.path().join("meta.sqlite3"), 0, 0).unwrap();
        let target = dir.path().join("elsewhere.sqlite3");
        let attach = db.conn.execute("ATTACH DATABASE ?1 AS other", [target.to_str().unwrap()]);
        assert!(attach.is_err(), "ATTACH is refused");
        assert!(!target.exists(), "and creates nothing");
        assert!(db.conn.execute_batch("PRAGMA journal_mode = DELETE").is_err(), "a pragma write is refused");
        assert!(db.conn.execute_batch("PRAGMA writable_schema = ON").is_err());
        assert!(db.conn.execute_batch("CREATE TABLE t (x)").is_err(), "no schema change on a live connection");
        let v: i64 = db.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert!(v >= REDO_V2, "pragma reads still work");
        db.conn.pragma_update(None, "synchronous", "FULL").unwrap();
    }

    #[test]
    fn a_replay_may_only_touch_the_scope_tables() {
        let mode = MODE_REPLAY;
        let ctx = |action| AuthContext { action, database_name: Some("main"), accessor: None };
        assert_eq!(authorize(mode, &ctx(AuthAction::Insert { table_name: "inodes" })), Authorization::Allow);
        assert_eq!(authorize(mode, &ctx(AuthAction::Insert { table_name: "sqlite_master" })), Authorization::Deny);
        let pragma = AuthAction::Pragma { pragma_name: "synchronous", pragma_value: Some("OFF") };
        assert_eq!(authorize(mode, &ctx(pragma)), Authorization::Deny);
        assert_eq!(authorize(mode, &ctx(AuthAction::Attach { filename: "x" })), Authorization::Deny);
        let other = AuthContext {
            action: AuthAction::Delete { table_name: "inodes" },
            database_name: Some("other"),
            accessor: None,
        };
        assert_eq!(authorize(mode, &other), Authorization::Deny);
    }
}
