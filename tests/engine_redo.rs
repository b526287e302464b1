//! Grouped metadata commits (issue 10): mutations commit in batches, and between two commits each
//! one lives in the scope's redo log. A process killed with SIGKILL at any moment loses no mutation
//! that had returned: a child process runs a fixed sequence of namespace and file operations
//! (mkdir, whole-file writes, rename, unlink, hard links, xattrs) on a scope, noting each finished
//! step outside the data, until the parent kills it at a random moment; the parent opens the scope
//! again (the log is replayed) and finds exactly the state after the last noted step, or after the
//! one in flight. Also: a durability point or an idle batch leaves nothing uncommitted, and a log
//! holding a torn record replays the records before it.

pub mod engine_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_support::{read_file, resolve, split, write_file, OWNER};
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::{LocalDirStore, ObjectStore};

/// Set (to the test's directory) in the child process that runs the workload.
const CHILD_ENV: &str = "SCOPEFS_TEST_REDO_CHILD";
const ROUNDS: usize = 6;

/// One step of the fixed workload. Step `i` only touches what earlier steps of its own ten made,
/// so the state after any prefix of the sequence is known.
#[derive(Debug, Clone)]
enum Step {
    Mkdir(String),
    Write(String, Vec<u8>),
    Rename(String, String),
    Unlink(String),
    Link(String, String),
    SetXattr(String, Vec<u8>),
}

fn dir_of(i: u64) -> String {
    format!("d{}", i / 10)
}

fn file_of(i: u64) -> String {
    format!("{}/f{i}", dir_of(i))
}

fn content(i: u64) -> Vec<u8> {
    // Sizes from a few bytes to past one 64 KiB block of the test's storage.
    let len = ((i * 7919) % 70_000) as usize + 1;
    (0..len).map(|k| (k as u64 * 31 + i) as u8).collect()
}

fn step(i: u64) -> Step {
    let base = i - i % 10;
    match i % 10 {
        0 => Step::Mkdir(dir_of(i)),
        1..=5 => Step::Write(file_of(i), content(i)),
        6 => Step::Rename(file_of(base + 2), format!("{}/renamed{i}", dir_of(i))),
        7 => Step::Unlink(file_of(base + 3)),
        8 => Step::Link(file_of(base + 4), format!("{}/link{i}", dir_of(i))),
        _ => Step::SetXattr(file_of(base + 5), format!("value of {i}").into_bytes()),
    }
}

/// What a path holds in the model: a directory, or a file's bytes and its `user.k` attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>, Option<Vec<u8>>),
}

/// The state after steps `0..n`.
fn model(n: u64) -> BTreeMap<String, Node> {
    let mut m = BTreeMap::new();
    for i in 0..n {
        apply(&mut m, &step(i));
    }
    m
}

fn apply(m: &mut BTreeMap<String, Node>, s: &Step) {
    match s {
        Step::Mkdir(p) => {
            m.insert(p.clone(), Node::Dir);
        }
        Step::Write(p, data) => {
            m.insert(p.clone(), Node::File(data.clone(), None));
        }
        Step::Rename(from, to) => {
            let node = m.remove(from).expect("model: rename source");
            m.insert(to.clone(), node);
        }
        Step::Unlink(p) => {
            m.remove(p);
        }
        Step::Link(from, to) => {
            let node = m.get(from).expect("model: link source").clone();
            m.insert(to.clone(), node);
        }
        Step::SetXattr(p, v) => {
            if let Some(Node::File(_, x)) = m.get_mut(p) {
                *x = Some(v.clone());
            }
        }
    }
}

fn run(e: &ScopeEngine, s: &Step) -> EngineResult<()> {
    match s {
        Step::Mkdir(p) => e.mkdir(ROOT_INO, p.as_bytes(), 0o755, OWNER).map(drop),
        Step::Write(p, data) => write_file(e, p, data),
        Step::Rename(from, to) => {
            let (fp, fname) = split(e, from)?;
            let (tp, tname) = split(e, to)?;
            e.rename(fp, fname.as_bytes(), tp, tname.as_bytes(), RenameMode::Replace)
        }
        Step::Unlink(p) => {
            let (parent, name) = split(e, p)?;
            e.unlink(parent, name.as_bytes())
        }
        Step::Link(from, to) => {
            let (tp, tname) = split(e, to)?;
            e.link(resolve(e, from)?, tp, tname.as_bytes()).map(drop)
        }
        Step::SetXattr(p, v) => e.setxattr(resolve(e, p)?, b"user.k", v, XattrMode::Either),
    }
}

/// Every path below the root with what it holds, read through the engine.
fn tree(e: &ScopeEngine) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let mut after = 0;
        loop {
            let page = e.readdir_page(dir, after, 256).unwrap();
            for entry in &page {
                let name = String::from_utf8(entry.name.clone()).unwrap();
                let path = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
                if entry.attr.kind == FileKind::Dir {
                    out.insert(path.clone(), Node::Dir);
                    todo.push((entry.attr.ino, path));
                } else {
                    let data = read_file(e, &path).unwrap();
                    let x = e.getxattr(entry.attr.ino, b"user.k").ok();
                    out.insert(path, Node::File(data, x));
                }
            }
            match page.last() {
                Some(last) if page.len() == 256 => after = last.cursor,
                _ => break,
            }
        }
    }
    out
}

fn settings() -> StorageSettings {
    StorageSettings { block_size: 64 * 1024, ..StorageSettings::default() }
}

fn storage(dir: &Path, rt: &tokio::runtime::Runtime) -> Arc<Storage> {
    let store: Arc<dyn ObjectStore> = Arc::new(LocalDirStore::new(dir.join("objects")).unwrap());
    Storage::new(store, settings(), &dir.join("data"), rt.handle().clone()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

fn scope_id(dir: &Path) -> ScopeId {
    ScopeId::parse(std::fs::read_to_string(dir.join("scope")).unwrap().trim()).unwrap()
}

/// The child's side: runs the steps from 0 until killed, appending `i` to `done` after step `i`
/// returned. Only runs in the child process (a plain run of the suite returns at once).
#[test]
#[ignore = "the child process of a_killed_process_loses_no_mutation_that_returned"]
fn redo_child_workload() {
    let Some(dir) = std::env::var_os(CHILD_ENV).map(PathBuf::from) else { return };
    let rt = runtime();
    let e = storage(&dir, &rt).open_scope(&scope_id(&dir), engine_support::big_quota()).unwrap();
    let mut done = std::fs::OpenOptions::new().append(true).create(true).open(dir.join("done")).unwrap();
    std::fs::write(dir.join("started"), b"").unwrap();
    for i in 0.. {
        run(&e, &step(i)).unwrap_or_else(|err| panic!("step {i} {:?}: {err}", step(i)));
        done.write_all(format!("{i}\n").as_bytes()).unwrap();
    }
}

fn last_done(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("done")).unwrap_or_default().lines().rev().find_map(|l| l.parse().ok())
}

#[test]
fn a_killed_process_loses_no_mutation_that_returned() {
    for round in 0..ROUNDS {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("scope"), ScopeId::generate().as_str()).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "redo_child_workload", "--ignored", "--test-threads=1"])
            .env(CHILD_ENV, dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Kill at a moment that varies by round, once the child has started its steps: batches of
        // every size, commits and log writes in flight.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dir.join("started").exists() {
            assert!(child.try_wait().unwrap().is_none(), "the child ended before it started");
            assert!(Instant::now() < deadline, "the child did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(150 + 170 * round as u64));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child ran to an end it never reaches: {status}");

        let n = last_done(dir).map_or(0, |i| i + 1);
        assert!(n > 20, "round {round}: the child finished only {n} steps before the kill");
        let rt = runtime();
        let e = storage(dir, &rt).open_scope(&scope_id(dir), engine_support::big_quota()).unwrap();
        let found = tree(&e);
        let before = model(n);
        let mut after = before.clone();
        apply(&mut after, &step(n));
        // A whole-file write in flight may also have left its file created and empty.
        let mut partial = before.clone();
        if let Step::Write(p, _) = step(n) {
            partial.insert(p, Node::File(Vec::new(), None));
        }
        assert!(
            found == before || found == after || found == partial,
            "round {round}: after {n} steps (step {n} was {:?}), the scope holds {} paths, expected {}",
            step(n),
            found.len(),
            before.len()
        );
        assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new(), "round {round}");
        let report = e.fsck(false).unwrap();
        assert!(report.damaged_files.is_empty(), "round {round}: {report:?}");
        eprintln!("round {round}: killed after {n} steps; all there after the replay");
    }
}

#[test]
fn a_durability_point_and_an_idle_batch_leave_nothing_uncommitted() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let e = storage(tmp.path(), &rt).open_scope(&ScopeId::generate(), engine_support::big_quota()).unwrap();
    for i in 0..30u64 {
        run(&e, &step(i)).unwrap();
    }
    assert!(e.uncommitted_metadata() > 0, "the batch's mutations are in the log only");
    e.fsync_dir().unwrap();
    assert_eq!(e.uncommitted_metadata(), 0, "a durability point commits the batch");
    for i in 30..40u64 {
        run(&e, &step(i)).unwrap();
    }
    // The idle flusher commits a batch once it is older than its age bound.
    let deadline = Instant::now() + Duration::from_secs(30);
    while e.uncommitted_metadata() > 0 {
        assert!(Instant::now() < deadline, "an idle batch was never committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(tree(&e), model(40));
}

#[test]
fn a_torn_record_ends_the_replay_and_what_came_before_it_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let id = ScopeId::generate();
    let db = tmp.path().join("data/scopes").join(id.as_str()).join("meta.sqlite3");
    let log = tmp.path().join("data/scopes").join(id.as_str()).join("meta.sqlite3-redo");
    {
        let rt = runtime();
        let e = storage(tmp.path(), &rt).open_scope(&id, engine_support::big_quota()).unwrap();
        for i in 0..12u64 {
            run(&e, &step(i)).unwrap();
        }
        e.fsync_dir().unwrap();
        for i in 12..27u64 {
            run(&e, &step(i)).unwrap();
        }
        // What a killed process leaves: the log, and the database (its file and WAL) as its last
        // commit had them.
        let logged = std::fs::read(&log).unwrap();
        std::fs::copy(&db, tmp.path().join("db.copy")).unwrap();
        std::fs::copy(db.with_file_name("meta.sqlite3-wal"), tmp.path().join("wal.copy")).unwrap();
        drop(e);
        std::fs::write(tmp.path().join("log.copy"), logged).unwrap();
    }
    std::fs::copy(tmp.path().join("db.copy"), &db).unwrap();
    std::fs::copy(tmp.path().join("wal.copy"), db.with_file_name("meta.sqlite3-wal")).unwrap();
    // The last record (step 26, a rename: one mutation) loses its tail (a write cut short), and
    // garbage follows.
    let mut logged = std::fs::read(tmp.path().join("log.copy")).unwrap();
    let full = logged.len();
    logged.truncate(full - 3);
    logged.extend_from_slice(b"garbage after a torn write");
    std::fs::write(&log, &logged).unwrap();
    let rt = runtime();
    let e = storage(tmp.path(), &rt).open_scope(&id, engine_support::big_quota()).unwrap();
    assert!(matches!(step(26), Step::Rename(..)));
    assert_eq!(tree(&e), model(26), "every step before the torn one (step 26) came back");
    assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new());
    // The scope goes on: new mutations after the replay are kept too.
    run(&e, &step(26)).unwrap();
    e.fsync_dir().unwrap();
    drop(e);
    let e = storage(tmp.path(), &rt).open_scope(&id, engine_support::big_quota()).unwrap();
    assert_eq!(tree(&e), model(27));
}

/// A refused mutation (removing an extended attribute that is not there) in the middle of a batch,
/// in a fresh batch and after a durability point leaves every mutation before it in place and the
/// database consistent (the undo of one refused after writing: `meta::batch` unit tests).
#[test]
fn a_refused_mutation_leaves_its_batch_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let e = storage(tmp.path(), &rt).open_scope(&ScopeId::generate(), engine_support::big_quota()).unwrap();
    for i in 0..25u64 {
        run(&e, &step(i)).unwrap();
    }
    let ino = resolve(&e, &file_of(1)).unwrap();
    e.setxattr(ino, b"user.kept", b"v", XattrMode::Either).unwrap();
    assert!(e.uncommitted_metadata() > 0, "the batch holds the mutations");
    assert!(matches!(e.removexattr(ino, b"user.absent"), Err(EngineError::NoData)));
    assert_eq!(tree(&e), model(25), "every mutation before the failed one is kept");
    assert_eq!(e.getxattr(ino, b"user.kept").unwrap(), b"v");
    assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new());
    for i in 25..30u64 {
        run(&e, &step(i)).unwrap();
    }
    assert!(matches!(e.removexattr(ino, b"user.absent"), Err(EngineError::NoData)));
    e.fsync_dir().unwrap();
    assert!(matches!(e.removexattr(ino, b"user.absent"), Err(EngineError::NoData)));
    assert_eq!(tree(&e), model(30));
    assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new());
}
