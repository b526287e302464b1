//! Issue 23 item 3, at the engine: fencing of a scope's shipped metadata. A node serves a scope at
//! an epoch; what it ships counts (and its `fsync` returns) only once the registry recorded it at
//! that epoch. After a takeover (the next epoch, another node), the new owner restores exactly the
//! recorded head, the deposed node's durability points fail, and the objects it still puts are
//! never part of the scope's state.

pub mod engine_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine_support::*;
use parking_lot::Mutex;
use scopefs::engine::fence::{epoch_of, Head, ShipFence};
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::ObjectStore;

/// The registry's row of the one scope: who serves it, at which epoch, and the recorded head.
#[derive(Default)]
struct Row {
    node: String,
    epoch: u64,
    head: Option<Head>,
    refused: u64,
}

/// One node's view of the registry.
struct NodeFence {
    node: &'static str,
    /// The epoch this node believes it serves the scope at.
    epoch: u64,
    row: Arc<Mutex<Row>>,
}

impl ShipFence for NodeFence {
    fn epoch(&self, _scope: &str) -> Option<u64> {
        Some(self.epoch)
    }
    fn recorded(&self, _scope: &str) -> Result<Option<Head>, String> {
        Ok(self.row.lock().head)
    }
    fn record(&self, _scope: &str, epoch: u64, head: Head) -> Result<bool, String> {
        let mut row = self.row.lock();
        if row.node == self.node && row.epoch == epoch {
            row.head = Some(head);
            Ok(true)
        } else {
            row.refused += 1;
            Ok(false)
        }
    }
}

fn settings() -> StorageSettings {
    StorageSettings {
        block_size: 64 * 1024,
        inline_block_max_bytes: 16 * 1024,
        upload_delay: Duration::from_millis(10),
        store_timeout: Duration::from_millis(500),
        store_attempts: 2,
        metadata_sync: Some(Duration::from_millis(50)),
        ..StorageSettings::default()
    }
}

fn node(h: &Harness, dir: &Path, node: &'static str, epoch: u64, row: &Arc<Mutex<Row>>) -> Arc<Storage> {
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let storage = Storage::new(store, settings(), dir, h.rt.handle().clone()).unwrap();
    storage.set_ship_fence(Arc::new(NodeFence { node, epoch, row: row.clone() }));
    storage
}

fn take_over(row: &Arc<Mutex<Row>>, node: &str) {
    let mut r = row.lock();
    r.node = node.to_string();
    r.epoch += 1;
}

fn write_set(e: &ScopeEngine, name: &str, n: usize, seed: u8) -> Vec<(String, Vec<u8>)> {
    e.mkdir(ROOT_INO, name.as_bytes(), 0o755, OWNER).unwrap();
    let files: Vec<_> = (0..n).map(|i| (format!("{name}/f{i}"), pattern(200 + i * 4099, seed + i as u8))).collect();
    for (path, data) in &files {
        write_file(e, path, data).unwrap();
    }
    files
}

/// The metadata objects of `scope` in generations of `epoch`.
fn metadata_keys(h: &Harness, scope: &ScopeId, epoch: u64) -> std::collections::BTreeSet<String> {
    let prefix = format!("scopes/{}/meta/g", scope.as_str());
    let gen = |k: &str| k.strip_prefix(&prefix)?.get(..16).and_then(|g| u64::from_str_radix(g, 16).ok());
    h.store.keys().into_iter().filter(|k| gen(k).is_some_and(|g| epoch_of(g) == epoch)).collect()
}

#[test]
fn a_deposed_node_cannot_make_its_writes_the_scopes_state() {
    let h = Harness::new(settings());
    let id = ScopeId::generate();
    let row = Arc::new(Mutex::new(Row { node: "a".into(), epoch: 1, ..Row::default() }));

    // Node a serves the scope at epoch 1; what it fsyncs is recorded.
    let a = node(&h, &h.dir.path().join("a"), "a", 1, &row);
    let ea = a.open_scope(&id, big_quota()).unwrap();
    let before = write_set(&ea, "before", 6, 1);
    ea.sync().unwrap();
    let recorded = row.lock().head.expect("a recorded its head");
    assert_eq!(epoch_of(recorded.0), 1, "generations carry the writer's epoch");

    // Node b takes over (epoch 2) while a is frozen; b restores exactly the recorded head.
    take_over(&row, "b");
    let b = node(&h, &h.dir.path().join("b"), "b", 2, &row);
    let eb = b.open_scope(&id, big_quota()).unwrap();
    for (path, data) in &before {
        assert_eq!(&read_file(&eb, path).unwrap(), data, "{path}");
    }

    // a resumes with writes in flight: its durability point fails, nothing it ships is recorded.
    let epoch1_before = metadata_keys(&h, &id, 1);
    let late = write_set(&ea, "late", 4, 50);
    assert!(matches!(ea.sync(), Err(EngineError::Store(_))), "a deposed node must not acknowledge an fsync");
    assert!(row.lock().refused > 0, "a's record was refused");
    // (b's first snapshot deletes a's earlier objects meanwhile: a new key, not a larger count.)
    let late_objects = metadata_keys(&h, &id, 1).difference(&epoch1_before).count();
    assert!(late_objects > 0, "a's late object reached the bucket (and must be ignored)");
    assert!(matches!(ea.sync(), Err(EngineError::Store(_))), "and it stays deposed");

    // b goes on at epoch 2.
    let after = write_set(&eb, "after", 5, 90);
    eb.sync().unwrap();
    assert_eq!(epoch_of(row.lock().head.unwrap().0), 2);

    // A third node restoring the scope sees a's recorded writes and b's, never a's late ones.
    take_over(&row, "c");
    let c = node(&h, &h.dir.path().join("c"), "c", 3, &row);
    let ec = c.open_scope(&id, big_quota()).unwrap();
    for (path, data) in before.iter().chain(&after) {
        assert_eq!(&read_file(&ec, path).unwrap(), data, "{path}");
    }
    for (path, _) in &late {
        assert!(resolve(&ec, path).is_err(), "{path} of the deposed node became part of the scope");
    }
    assert!(resolve(&ec, "late").is_err());
    let report = ec.fsck(false).unwrap();
    assert!(report.metadata_problems.is_empty(), "{report:?}");
    drop((ea, eb));
}

#[test]
fn an_owner_that_restarts_continues_its_recorded_chain() {
    let h = Harness::new(settings());
    let id = ScopeId::generate();
    let row = Arc::new(Mutex::new(Row { node: "a".into(), epoch: 1, ..Row::default() }));
    let dir = h.dir.path().join("a");
    let first = {
        let a = node(&h, &dir, "a", 1, &row);
        let e = a.open_scope(&id, big_quota()).unwrap();
        let files = write_set(&e, "one", 3, 7);
        e.sync().unwrap();
        files
    };
    let gen = row.lock().head.unwrap().0;
    let second = {
        let a = node(&h, &dir, "a", 1, &row);
        let e = a.open_scope(&id, big_quota()).unwrap();
        let files = write_set(&e, "two", 3, 8);
        e.sync().unwrap();
        files
    };
    assert_eq!(row.lock().head.unwrap().0, gen, "a clean reopen continues the recorded generation");
    std::fs::remove_dir_all(&dir).unwrap();
    let e = node(&h, &dir, "a", 1, &row).open_scope(&id, big_quota()).unwrap();
    for (path, data) in first.iter().chain(&second) {
        assert_eq!(&read_file(&e, path).unwrap(), data, "{path}");
    }
}

/// Blocks are content-addressed, so two owners of a scope may store the same bytes. A deposed node
/// whose gc pass began before the takeover (its last durability point recorded, nothing new to
/// ship) may still delete, after it, a block its state left unreferenced: the new owner, which
/// stores the same bytes again, must not lose them (its blocks are under keys of its own epoch,
/// and it never reuses a block its predecessor may still delete).
#[test]
fn a_deposed_nodes_gc_never_deletes_what_the_new_owner_stores() {
    let h = Harness::new(settings());
    let id = ScopeId::generate();
    let row = Arc::new(Mutex::new(Row { node: "a".into(), epoch: 1, ..Row::default() }));
    let a = node(&h, &h.dir.path().join("a"), "a", 1, &row);
    let ea = a.open_scope(&id, big_quota()).unwrap();
    let data = unique(4 * 64 * 1024 + 100, 9);
    write_file(&ea, "gone.bin", &data).unwrap();
    ea.sync().unwrap();
    ea.unlink(ROOT_INO, b"gone.bin").unwrap();
    ea.sync().unwrap();
    let unlinked = unix_now();

    // b takes over with a frozen: b's state has the blocks, unreferenced; b stores the same bytes.
    take_over(&row, "b");
    let b = node(&h, &h.dir.path().join("b"), "b", 2, &row);
    let eb = b.open_scope(&id, big_quota()).unwrap();
    write_file(&eb, "kept.bin", &data).unwrap();
    eb.sync().unwrap();

    // a resumes and its gc deletes the blocks its own state holds unreferenced.
    next_second_after(unlinked);
    let blocks_of = |epoch: &str| {
        let prefix = format!("scopes/{}/blocks/", id.as_str());
        h.store.keys().iter().filter(|k| k.starts_with(&prefix) && k.ends_with(epoch)).count()
    };
    let keys: Vec<String> = h.store.keys().into_iter().filter(|k| k.contains("/blocks/")).collect();
    assert!(
        blocks_of(".e1") >= 4 && blocks_of(".e2") >= 4,
        "b stored the bytes again under keys of its epoch: {keys:?}"
    );
    let report = ea.collect_garbage_online(Duration::ZERO, u64::MAX).unwrap();
    assert!(report.blocks_deleted >= 4, "the deposed gc deleted what its own state held unreferenced: {report:?}");
    // Whatever a did, a restore of b's state on another node reads every byte from the store.
    take_over(&row, "c");
    let c = node(&h, &h.dir.path().join("c"), "c", 3, &row);
    let ec = c.open_scope(&id, big_quota()).unwrap();
    assert_eq!(read_file(&ec, "kept.bin").unwrap(), data, "the new owner's file lost blocks to a deposed gc");
    let report = ec.fsck(false).unwrap();
    assert!(report.metadata_problems.is_empty() && report.damaged_files.is_empty(), "{report:?}");
    drop((ea, eb));
}
