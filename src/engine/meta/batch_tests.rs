//! Tests of grouped commits and the redo log: undo of a failed mutation, poisoning when a batch
//! cannot be put back (D1), replays that take nothing of another timeline or of anybody's forging
//! (D2), and the answers kept for resent requests (D5).

use std::path::{Path, PathBuf};

use super::super::statements as st;
use super::super::{exec, NewNode};
use super::*;
use crate::engine::{FileKind, Owner, ROOT_INO};

const OWNER: Owner = Owner { uid: 0, gid: 0 };

fn names(db: &MetaDb) -> Vec<String> {
    db.children(ROOT_INO).unwrap().into_iter().map(|r| String::from_utf8(r.name.unwrap()).unwrap()).collect()
}

fn add(db: &mut MetaDb, name: &str) {
    db.insert(ROOT_INO, name.as_bytes(), NewNode::plain(FileKind::File, 0o644), OWNER, 1 << 20).unwrap();
}

/// A mutation that writes and is dropped without `commit` (the error path of a mutation).
fn failing(db: &mut MetaDb) {
    let tx = db.tx().unwrap();
    exec(&tx, st::USAGE_BYTES, &[&100i64]).unwrap();
}

/// A copy of the database's files as a process killed now leaves them (the page cache survives).
fn snapshot(db_path: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for suffix in ["", "-wal", "-redo"] {
        let from = PathBuf::from(format!("{}{suffix}", db_path.display()));
        if from.exists() {
            std::fs::copy(&from, to.join(format!("meta.sqlite3{suffix}"))).unwrap();
        }
    }
    to.join("meta.sqlite3")
}

#[test]
fn a_mutation_failing_after_it_wrote_is_undone_and_its_batch_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite3");
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    failing(&mut db);
    assert_eq!(db.usage().unwrap().bytes, 0, "nothing logged: rolled back");
    add(&mut db, "a");
    add(&mut db, "b");
    assert_eq!(db.uncommitted(), 2);
    failing(&mut db);
    assert_eq!(db.usage().unwrap().bytes, 0, "the failed mutation is undone");
    assert_eq!(names(&db), ["a", "b"], "the logged ones are kept");
    assert_eq!(db.uncommitted(), 0, "and committed");
    add(&mut db, "c");
    assert_eq!(db.consistency_problems().unwrap(), Vec::<String>::new());
    drop(db);
    let db = MetaDb::open(&path, 0, 0).unwrap();
    assert_eq!(names(&db), ["a", "b", "c"]);
    assert_eq!(db.usage().unwrap().files, 3);
}

/// Full disks at the next `commits` batch commits and `restores` batch restores on this thread.
fn full_disk(commits: u32, restores: u32) {
    super::faults::PENDING.with(|p| p.set((commits, restores)));
}

/// D1: a batch whose restore fails (the disk is full) must not lose acknowledged mutations: the
/// database is poisoned (every use fails) until the batch is put back, and closing it keeps the log.
#[test]
fn a_batch_that_cannot_be_put_back_poisons_the_database_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite3");
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    for i in 0..50 {
        add(&mut db, &format!("f{i:02}"));
    }
    full_disk(0, 3);
    failing(&mut db);
    assert!(db.poisoned, "the batch could not be put back");
    assert!(matches!(db.tx(), Err(EngineError::Metadata(_))), "every use fails while it cannot");
    assert!(db.make_durable().is_err(), "a durability point never claims the lost batch durable");
    drop(db);
    full_disk(0, 0);
    // Closing kept the log: every acknowledged mutation is there.
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    assert_eq!(names(&db).len(), 50);
    // With room again, a poisoned database heals in place.
    add(&mut db, "g1");
    full_disk(0, 1);
    failing(&mut db);
    assert!(db.poisoned);
    add(&mut db, "g2");
    assert!(!db.poisoned, "the next use put the batch back");
    assert_eq!(names(&db).len(), 52);
    drop(db);
    assert_eq!(names(&MetaDb::open(&path, 0, 0).unwrap()).len(), 52);
}

/// D1 (b): a commit that fails, and whose batch cannot be put back either, never reports the batch
/// durable, and nothing acknowledged is lost.
#[test]
fn a_failed_commit_is_reported_and_the_batch_stays_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite3");
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    for i in 0..50 {
        add(&mut db, &format!("f{i:02}"));
    }
    full_disk(1, 0);
    assert!(db.make_durable().is_err(), "the failed commit is reported");
    assert_eq!(names(&db).len(), 50, "the batch was put back");
    full_disk(1, 1);
    assert!(db.make_durable().is_err());
    assert!(db.poisoned);
    add_fails(&mut db);
    drop(db);
    full_disk(0, 0);
    assert_eq!(names(&MetaDb::open(&path, 0, 0).unwrap()).len(), 50);
}

fn add_fails(db: &mut MetaDb) {
    full_disk(0, 1);
    assert!(db.insert(ROOT_INO, b"x", NewNode::plain(FileKind::File, 0o644), OWNER, 1 << 20).is_err());
}

/// D2: a power loss that takes the database back to an older state never gets records of the lost
/// timeline replayed onto it, whatever their batch number.
#[test]
fn a_log_of_a_lost_timeline_is_never_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live/meta.sqlite3");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    add(&mut db, "a");
    db.make_durable().unwrap();
    // The durable state a power loss falls back to.
    let old = snapshot(&path, &dir.path().join("old"));
    add(&mut db, "b");
    db.make_durable().unwrap();
    add(&mut db, "c");
    // The power loss kept the database of `old` and the newest log (its pages written back).
    std::fs::copy(redo::log_path(&path), redo::log_path(&old)).unwrap();
    drop(db);
    let db = MetaDb::open(&old, 0, 0).unwrap();
    assert_eq!(names(&db), ["a"], "the newest batch builds on a state this database never reached");
    // The same log onto the state it was built on replays.
    let db = MetaDb::open(&path, 0, 0).unwrap();
    assert_eq!(names(&db), ["a", "b", "c"]);
}

/// D2: kill -9 states of one timeline replay exactly the logged prefix.
#[test]
fn a_killed_process_leaves_every_logged_mutation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live/meta.sqlite3");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    let mut expected = Vec::new();
    for i in 0..5 {
        let name = format!("n{i}");
        add(&mut db, &name);
        expected.push(name);
        if i == 2 {
            db.commit_batch_older_than(Duration::ZERO).unwrap();
        }
        let copy = snapshot(&path, &dir.path().join(format!("kill{i}")));
        assert_eq!(names(&MetaDb::open(&copy, 0, 0).unwrap()), expected, "killed after {i}");
    }
}

/// D2 (security): a tenant's bytes that form a valid record — of the first format (SQL text) or a
/// byte-exact copy of a record of this log — behind the log's last record never run.
#[test]
fn forged_records_behind_the_log_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite3");
    let target = dir.path().join("attached.sqlite3");
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    // The tenant's file content is copied into a record's payload (an inline block, a name).
    let attach = format!("ATTACH DATABASE '{}' AS x", target.display());
    let old_format =
        redo::legacy::encode_v1(1, &[(attach.as_str(), vec![]), (st::DELETE_INODE.sql, vec![Value::Integer(1)])]);
    add(&mut db, "genuine");
    let log = std::fs::read(redo::log_path(&path)).unwrap();
    let copy_of_last = log[crate::engine::logfile::HEADER_LEN..].to_vec();
    let killed = snapshot(&path, &dir.path().join("killed"));
    let mut bytes = std::fs::read(redo::log_path(&killed)).unwrap();
    bytes.extend_from_slice(&old_format);
    bytes.extend_from_slice(&copy_of_last);
    std::fs::write(redo::log_path(&killed), &bytes).unwrap();
    let db = MetaDb::open(&killed, 0, 0).unwrap();
    assert_eq!(names(&db), ["genuine"], "only the genuine record ran, once");
    assert!(!target.exists(), "nothing was attached");
    assert_eq!(db.usage().unwrap().files, 1);
    // A log of the first format naming anything outside the statement table runs nothing at all.
    let db_path = v8_database(&dir.path().join("legacy"));
    std::fs::write(redo::log_path(&db_path), &old_format).unwrap();
    assert!(matches!(MetaDb::open(&db_path, 0, 0), Err(EngineError::Poisoned(_))), "refused, not run");
    assert!(!target.exists());
}

/// A database as a daemon of the first log format left it (schema 8).
fn v8_database(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("meta.sqlite3");
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
    crate::migrate::apply(&mut conn, &crate::migrate::SCOPE_META[..8]).unwrap();
    conn.execute(
        "INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
         VALUES (1, NULL, NULL, 'dir', 493, 0, 0, 0, 0, 0)",
        [],
    )
    .unwrap();
    path
}

/// Upgrading: a log of the first format that a killed older daemon left, naming only statements of
/// the table, is replayed once; the database then moves to the second format.
#[test]
fn a_log_of_the_first_format_is_replayed_once() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = v8_database(dir.path());
    let insert = (
        st::INSERT_INODE.sql,
        vec![
            Value::Integer(1),
            Value::Blob(b"old".to_vec()),
            Value::Text("file".into()),
            Value::Integer(0o644),
            Value::Integer(0),
            Value::Integer(0),
            Value::Integer(0),
            Value::Integer(5),
            Value::Null,
            Value::Integer(0),
        ],
    );
    let usage = (st::USAGE_INSERTED.sql, vec![Value::Integer(1), Value::Integer(0)]);
    std::fs::write(redo::log_path(&db_path), redo::legacy::encode_v1(1, &[insert, usage])).unwrap();
    let db = MetaDb::open(&db_path, 0, 0).unwrap();
    assert_eq!(names(&db), ["old"]);
    assert_eq!(db.usage().unwrap().files, 1);
    let version: i64 = db.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert!(version >= REDO_V2, "migrated to the second format and on");
    assert_eq!(Some(version), crate::migrate::SCOPE_META.last().map(|m| m.version));
    drop(db);
    assert_eq!(names(&MetaDb::open(&db_path, 0, 0).unwrap()), ["old"], "replayed once");
}

/// D5: the answer of a request whose mutation was logged survives the process (in the log, then in
/// `redo_state` at the commit), so a resent request is answered, not run again.
#[test]
fn answers_of_logged_requests_outlive_the_process() {
    use crate::engine::requests::{Answers, RequestScope};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live/meta.sqlite3");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let answers = std::sync::Arc::new(Answers::default());
    let mut db = MetaDb::open_with(&path, 0, 0, answers.clone()).unwrap();
    let ino = {
        let _request = RequestScope::enter(&answers, 41, false);
        let row = db.insert(ROOT_INO, b"made", NewNode::plain(FileKind::Dir, 0o755), OWNER, 1 << 20).unwrap();
        // Killed before the answer went out: in the log only.
        let copy = snapshot(&path, &dir.path().join("in-log"));
        let next = std::sync::Arc::new(Answers::default());
        let _db = MetaDb::open_with(&copy, 0, 0, next.clone()).unwrap();
        assert_eq!(next.lookup(41), Some(row.ino), "inherited from the replayed record");
        // Committed, still not answered: in `redo_state`.
        db.commit_batch_older_than(Duration::ZERO).unwrap();
        let copy = snapshot(&path, &dir.path().join("committed"));
        let next = std::sync::Arc::new(Answers::default());
        let _db = MetaDb::open_with(&copy, 0, 0, next.clone()).unwrap();
        assert_eq!(next.lookup(41), Some(row.ino), "inherited from the commit");
        row.ino
    };
    // Answered: a later commit keeps nothing of it.
    add(&mut db, "later");
    db.commit_batch_older_than(Duration::ZERO).unwrap();
    let copy = snapshot(&path, &dir.path().join("answered"));
    let next = std::sync::Arc::new(Answers::default());
    let _db = MetaDb::open_with(&copy, 0, 0, next.clone()).unwrap();
    assert_eq!(next.lookup(41), None, "answered requests are not kept (made {ino})");
}

/// D12: a replay runs the statements exactly as live execution ran them (foreign keys off in both):
/// a logged deletion whose cascade live execution did not run does not cascade when replayed, so a
/// killed process's successor ends with the very state it had.
#[test]
fn a_replay_has_the_foreign_key_semantics_of_live_execution() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live/meta.sqlite3");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut db = MetaDb::open(&path, 0, 0).unwrap();
    add(&mut db, "f");
    let ino = db.lookup(ROOT_INO, b"f").unwrap().ino;
    let bounds = super::super::XattrBounds { max_count: 10, max_bytes: 1 << 16 };
    db.set_xattr(ino, b"user.k", b"v", crate::engine::XattrMode::Either, bounds, &|_, _| Ok(())).unwrap();
    db.commit_batch_older_than(Duration::ZERO).unwrap();
    // A mutation that deletes the inode alone (its attribute row stays: live execution has no
    // cascades).
    let tx = db.tx().unwrap();
    exec(&tx, st::DELETE_INODE, &[&(ino as i64)]).unwrap();
    tx.commit().unwrap();
    let count = |db: &MetaDb| -> i64 { db.conn.query_row("SELECT COUNT(*) FROM xattrs", [], |r| r.get(0)).unwrap() };
    assert_eq!(count(&db), 1);
    let copy = snapshot(&path, &dir.path().join("killed"));
    let replayed = MetaDb::open(&copy, 0, 0).expect("the replay runs what live execution ran");
    assert_eq!(count(&replayed), 1, "no cascade live execution did not run");
    assert!(!replayed.consistency_problems().unwrap().is_empty(), "the drift is reported, not hidden");
}
