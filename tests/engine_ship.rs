//! Issue 23 item 1, at the engine: a scope's committed metadata is shipped to the object store, a
//! durability point returns only once it is there, and a lost data directory comes back from the
//! bucket alone (names and versions from the shipped metadata, bytes from the blocks it names: a
//! file's bytes are never shipped twice). A process that reopens its own database continues the
//! shipped chain; one whose database fell behind the bucket starts a new generation, and a restore
//! follows that one.

pub mod engine_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::ObjectStore;

/// Shipping every 50 ms; blocks of 64 KiB, inline up to 16 KiB; uploads at once.
fn harness() -> Harness {
    Harness::new(StorageSettings {
        block_size: 64 * 1024,
        inline_block_max_bytes: 16 * 1024,
        upload_delay: Duration::from_millis(10),
        store_timeout: Duration::from_millis(500),
        store_attempts: 2,
        metadata_sync: Some(Duration::from_millis(50)),
        ..StorageSettings::default()
    })
}

/// The metadata objects of `scope` in the store: (generation, kind `s`/`l`), in key order.
fn shipped(h: &Harness, scope: &ScopeId) -> Vec<(String, char)> {
    let prefix = format!("scopes/{}/meta/", scope.as_str());
    let mut keys: Vec<(String, char)> = h
        .store
        .keys()
        .into_iter()
        .filter_map(|k| {
            let rest = k.strip_prefix(&prefix)?.to_string();
            let (gen, name) = rest.split_once('/')?;
            Some((gen.to_string(), name.chars().next()?))
        })
        .collect();
    keys.sort();
    keys
}

/// Waits (within 10 s) until `done` holds: superseded objects are deleted after the snapshot that
/// supersedes them is in the store, behind the durability point that waited for it.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn files(n: usize, seed: u8) -> Vec<(String, Vec<u8>)> {
    (0..n).map(|i| (format!("d/f{i}"), pattern(100 + i * 997 % 150_000, seed.wrapping_add(i as u8)))).collect()
}

fn write_all(e: &ScopeEngine, files: &[(String, Vec<u8>)]) {
    if resolve(e, "d").is_err() {
        e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    }
    for (path, data) in files {
        write_file(e, path, data).unwrap();
    }
}

fn check_all(e: &ScopeEngine, files: &[(String, Vec<u8>)]) {
    for (path, data) in files {
        assert_eq!(&read_file(e, path).unwrap(), data, "{path}");
    }
}

#[test]
fn a_lost_data_directory_comes_back_from_the_bucket_alone() {
    let h = harness();
    let id = ScopeId::generate();
    let written = files(40, 1);
    {
        let storage = h.storage();
        let e = storage.open_scope(&id, big_quota()).unwrap();
        write_all(&e, &written);
        e.symlink(ROOT_INO, b"link", b"d/f1", OWNER).unwrap();
        e.sync().unwrap();
    }
    assert!(shipped(&h, &id).iter().any(|(_, kind)| *kind == 's'), "a snapshot was shipped");
    std::fs::remove_dir_all(h.data_dir()).unwrap();
    let storage = h.storage();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    check_all(&e, &written);
    assert_eq!(e.readlink(resolve(&e, "link").unwrap()).unwrap(), b"d/f1");
    let report = e.fsck(false).unwrap();
    assert!(report.damaged_files.is_empty() && report.metadata_problems.is_empty(), "{report:?}");
    // The restored scope goes on: written again, restored again.
    let more = files(5, 9).into_iter().map(|(p, d)| (format!("{p}-more"), d)).collect::<Vec<_>>();
    write_all(&e, &more);
    e.sync().unwrap();
    drop(e);
    drop(storage);
    std::fs::remove_dir_all(h.data_dir()).unwrap();
    let e = h.storage().open_scope(&id, big_quota()).unwrap();
    check_all(&e, &written);
    check_all(&e, &more);
}

#[test]
fn a_durability_point_waits_for_the_bucket_and_fails_while_the_store_is_down() {
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    write_all(&e, &files(3, 2));
    e.sync().unwrap();
    h.store.set_unavailable(true);
    // A name alone (no block to upload): only the metadata's way to the bucket can fail it.
    e.mkdir(ROOT_INO, b"made-while-down", 0o755, OWNER).unwrap();
    assert!(matches!(e.fsync_dir(), Err(EngineError::Store(_))), "fsyncdir cannot vouch for a name the bucket lacks");
    h.store.set_unavailable(false);
    e.fsync_dir().unwrap();
    // Without a durability point, a batch still reaches the bucket within the interval.
    write_file(&e, "d/unsynced", b"no fsync").unwrap();
    let before = h.store.keys().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.store.keys().len() == before {
        assert!(Instant::now() < deadline, "the batch was never shipped");
        std::thread::sleep(Duration::from_millis(20));
    }
    let copy = h.dir.path().join("restored.sqlite3");
    let restored = h.rt.block_on(restore::restore_scope(&*h.store, id.as_str(), &copy, None)).unwrap().unwrap();
    assert!(restored.seq > 0 && restored.blocks_missing == 0, "{restored:?}");
}

#[test]
fn a_reopened_database_continues_its_chain_and_one_behind_the_bucket_starts_a_new_generation() {
    let h = harness();
    let id = ScopeId::generate();
    let first = files(5, 3);
    {
        let e = h.storage().open_scope(&id, big_quota()).unwrap();
        write_all(&e, &first);
        e.sync().unwrap();
    }
    let gens = |h: &Harness| shipped(h, &id).into_iter().map(|(g, _)| g).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(gens(&h).len(), 1);
    let snapshots = |h: &Harness| shipped(h, &id).iter().filter(|(_, k)| *k == 's').count();
    // A restart on its own database: the same generation goes on, with logs only.
    let behind = h.dir.path().join("behind");
    {
        let storage = h.storage();
        let e = storage.open_scope(&id, big_quota()).unwrap();
        write_file(&e, "d/second", b"after a restart").unwrap();
        e.sync().unwrap();
        let first_gen: std::collections::BTreeSet<String> = ["g0000000000000001".to_string()].into();
        assert_eq!((gens(&h), snapshots(&h)), (first_gen, 1), "{:?}", shipped(&h, &id));
        // A copy taken now stands for a database a power loss will roll back to this point.
        engine_support::copy_dir(&h.data_dir(), &behind);
        write_file(&e, "d/lost", b"shipped, then lost locally").unwrap();
        e.sync().unwrap();
    }
    // The rolled-back database serves on: it must not write into the chain it fell behind.
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let storage = Storage::new(store, h.settings.clone(), &behind, h.rt.handle().clone()).unwrap();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    write_file(&e, "d/third", b"on the rolled-back database").unwrap();
    e.sync().unwrap();
    drop(e);
    drop(storage);
    let second_gen: std::collections::BTreeSet<String> = ["g0000000000000002".to_string()].into();
    eventually("a new generation; the one it supersedes deleted", || gens(&h) == second_gen);
    std::fs::remove_dir_all(h.data_dir()).unwrap();
    let e = h.storage().open_scope(&id, big_quota()).unwrap();
    check_all(&e, &first);
    assert_eq!(read_file(&e, "d/third").unwrap(), b"on the rolled-back database");
    assert_eq!(read_file(&e, "d/second").unwrap(), b"after a restart");
    assert!(matches!(resolve(&e, "d/lost"), Err(EngineError::NotFound)), "the restore follows the newest chain");
}

/// The sizes of `scope`'s snapshots in the store, in key order.
fn snapshot_sizes(h: &Harness, scope: &ScopeId) -> Vec<usize> {
    let prefix = format!("scopes/{}/meta/", scope.as_str());
    h.store
        .keys()
        .iter()
        .filter(|k| k.starts_with(&prefix) && k.rsplit('/').next().unwrap().starts_with('s'))
        .filter_map(|k| h.rt.block_on(h.store.get(k)).ok().map(|b| b.len()))
        .collect()
}

/// 60 KB of `seed`'s bytes, incompressible (objects are put compressed): an extended attribute's
/// value, which batches carry whole.
fn big_value(seed: u8) -> Vec<u8> {
    unique(60_000, u64::from(seed))
}

#[test]
fn logs_are_compacted_into_a_snapshot_and_what_it_supersedes_is_deleted() {
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let d = resolve(&e, "d").unwrap();
    // 9.6 MB of values replacing each other: the logs outweigh the snapshot, compactions follow.
    for round in 0..160u8 {
        e.setxattr(d, b"user.big", &big_value(round), XattrMode::Either).unwrap();
        if round % 10 == 9 {
            e.fsync_dir().unwrap();
        }
    }
    // Compaction runs at the scope's next quiet moment: wait for it (one log per fsync until then).
    let logs = || shipped(&h, &id).iter().filter(|(_, k)| *k == 'l').count();
    eventually("compacted into one snapshot", || snapshot_sizes(&h, &id).len() == 1 && logs() < 16);
    assert!(snapshot_sizes(&h, &id)[0] < 1 << 20, "the snapshot holds the last value only");
    drop(e);
    drop(storage);
    std::fs::remove_dir_all(h.data_dir()).unwrap();
    let e = h.storage().open_scope(&id, big_quota()).unwrap();
    assert_eq!(e.getxattr(resolve(&e, "d").unwrap(), b"user.big").unwrap(), big_value(159));
}

#[test]
fn batches_past_the_scopes_queue_share_are_dropped_for_a_snapshot_that_covers_them() {
    let mut h = harness();
    h.settings.metadata_queue_per_scope_bytes = 64 * 1024;
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    e.sync().unwrap();
    let snapshot_keys = |h: &Harness| -> Vec<String> {
        let prefix = format!("scopes/{}/meta/", id.as_str());
        h.store
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(&prefix) && k.rsplit('/').next().unwrap().starts_with('s'))
            .collect()
    };
    let first = snapshot_keys(&h);
    assert_eq!(first.len(), 1);
    h.store.set_unavailable(true);
    // Two values of 60 KB travel with their batches: past a share of 64 KiB.
    let written = files(20, 7);
    write_all(&e, &written);
    let d = resolve(&e, "d").unwrap();
    e.setxattr(d, b"user.one", &big_value(1), XattrMode::Either).unwrap();
    e.setxattr(d, b"user.two", &big_value(2), XattrMode::Either).unwrap();
    e.commit_metadata().unwrap();
    assert!(e.pending_metadata_batches() >= 1, "owed to the store while it is down");
    h.store.set_unavailable(false);
    e.sync().unwrap();
    // Without the drop these batches would go as logs (far below a compaction's worth).
    eventually("a new snapshot replaced the first", || {
        let now = snapshot_keys(&h);
        now.len() == 1 && now != first
    });
    drop(e);
    drop(storage);
    std::fs::remove_dir_all(h.data_dir()).unwrap();
    let e = h.storage().open_scope(&id, big_quota()).unwrap();
    check_all(&e, &written);
    assert_eq!(e.getxattr(resolve(&e, "d").unwrap(), b"user.two").unwrap(), big_value(2));
}

/// Whether any metadata object of `scope` holds `needle`.
fn shipped_objects_hold(h: &Harness, scope: &ScopeId, needle: &[u8]) -> bool {
    let prefix = format!("scopes/{}/meta/", scope.as_str());
    h.store.keys().iter().filter(|k| k.starts_with(&prefix)).any(|k| {
        let body = h.rt.block_on(h.store.get(k)).unwrap();
        body.windows(needle.len()).any(|w| w == needle)
    })
}

/// Small files of distinct bytes, each inline (below `inline_block_max_bytes`).
fn small_files(n: usize, seed: u8) -> Vec<(String, Vec<u8>)> {
    (0..n).map(|i| (format!("d/s{i}"), pattern(3_000 + i, seed.wrapping_add(i as u8)))).collect()
}

/// A window of a small file's bytes that nothing else shipped holds by chance.
fn sample(data: &[u8]) -> &[u8] {
    &data[1000..1200]
}

/// A storage on another host: an empty data directory, the same bucket (`store`).
fn elsewhere(h: &Harness, store: Arc<dyn ObjectStore>, dir: &tempfile::TempDir) -> Arc<Storage> {
    Storage::new(store, h.settings.clone(), dir.path(), h.rt.handle().clone()).unwrap()
}

/// Metadata shipped only at durability points, uploads only when asked for (or a whole group).
fn harness_with_uploads_held() -> Harness {
    let mut h = harness();
    h.settings.metadata_sync = Some(Duration::from_secs(600));
    h.settings.upload_delay = Duration::from_secs(60);
    h
}

/// Restores `scope` on another host from `store` and checks that `files` read back whole and fsck
/// finds nothing.
fn assert_restores_whole(h: &Harness, store: Arc<dyn ObjectStore>, scope: &ScopeId, files: &[(String, Vec<u8>)]) {
    let dir = tempfile::tempdir().unwrap();
    let restored = elsewhere(h, store, &dir).open_scope(scope, big_quota()).unwrap();
    check_all(&restored, files);
    let report = restored.fsck(false).unwrap();
    assert!(report.damaged_files.is_empty() && report.metadata_problems.is_empty(), "{report:?}");
}

#[test]
fn a_files_bytes_reach_the_bucket_only_as_its_blocks() {
    let h = harness_with_uploads_held();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    e.fsync_dir().unwrap();
    let written = small_files(20, 3);
    write_all(&e, &written);
    // Names shipped while the blocks wait for upload: the log, and a snapshot taken now, carry no
    // byte of any file (the inline journal stays home).
    e.fsync_dir().unwrap();
    assert!(shipped(&h, &id).iter().any(|(_, kind)| *kind == 'l'), "the files went as a log");
    for (path, data) in &written {
        assert!(!shipped_objects_hold(&h, &id, sample(data)), "{path}: its bytes travel with its metadata");
    }
    // Once uploaded, another host restores every file from its blocks.
    e.sync().unwrap();
    assert_restores_whole(&h, h.store.clone(), &id, &written);
}

/// Names shipped by the metadata timer (no durability point) while the files' bytes wait for
/// their upload: after the host is lost the restored files read EIO, never wrong bytes, and fsck
/// names exactly them; the fsynced ones are whole. (A durability point would have uploaded them:
/// `a_directory_fsync_puts_every_committed_block_in_the_bucket`.)
#[test]
fn a_small_file_neither_fsynced_nor_uploaded_reads_as_damaged_after_the_host_is_lost() {
    let mut h = harness_with_uploads_held();
    h.settings.metadata_sync = Some(Duration::from_millis(50));
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let synced = small_files(4, 5);
    write_all(&e, &synced);
    for (path, _) in &synced {
        e.fsync(resolve(&e, path).unwrap(), None).unwrap();
    }
    let closed: Vec<(String, Vec<u8>)> =
        small_files(3, 9).into_iter().map(|(p, d)| (format!("{p}-closed"), d)).collect();
    write_all(&e, &closed);
    // Their names reach the bucket with the timer's next batch (committed as the idle flusher
    // would), their bytes stay on this host.
    e.commit_metadata().unwrap();
    eventually("the timer shipped every batch", || e.pending_metadata_batches() == 0);
    let dir = tempfile::tempdir().unwrap();
    let restored = elsewhere(&h, h.store.clone(), &dir).open_scope(&id, big_quota()).unwrap();
    check_all(&restored, &synced);
    for (path, _) in &closed {
        assert!(read_file(&restored, path).is_err(), "{path}: never wrong bytes");
    }
    let mut damaged = restored.fsck(false).unwrap().damaged_files;
    damaged.sort();
    let mut expected: Vec<String> = closed.iter().map(|(p, _)| format!("/{p}")).collect();
    expected.sort();
    assert_eq!(damaged, expected, "fsck names exactly the files whose bytes were lost");
}

/// A copy of everything the store holds now (what a restore would find if the host were lost now).
fn store_as_of_now(h: &Harness) -> Arc<scopefs::store::MemoryStore> {
    let copy = Arc::new(scopefs::store::MemoryStore::new());
    for key in h.store.keys() {
        // A superseded object deleted meanwhile was not needed by the chain copied so far.
        if let Ok(body) = h.rt.block_on(h.store.get(&key)) {
            h.rt.block_on(copy.put(&key, body)).unwrap();
        }
    }
    copy
}

#[test]
fn every_state_the_bucket_holds_after_a_sync_restores_whole() {
    // Shipping every 50 ms and uploads after 10 ms race each other. After each `syncfs`, the
    // bucket as it is then must restore every file that point covered, byte for byte, from blocks
    // the logs only name.
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let mut covered: Vec<(String, Vec<u8>)> = Vec::new();
    let mut copies = Vec::new();
    for round in 0..12u8 {
        let written: Vec<(String, Vec<u8>)> =
            small_files(15, round).into_iter().map(|(p, d)| (format!("{p}-r{round}"), d)).collect();
        write_all(&e, &written);
        if round % 3 == 2 {
            // Files unlinked: their blocks lose their last reference.
            let gone = covered.remove(0);
            let (parent, name) = split(&e, &gone.0).unwrap();
            e.unlink(parent, name.as_bytes()).unwrap();
        }
        e.sync().unwrap();
        covered.extend(written);
        copies.push((store_as_of_now(&h), covered.clone()));
    }
    for (store, expected) in copies {
        assert_restores_whole(&h, store, &id, &expected);
    }
}

#[test]
fn what_an_fsync_returned_for_is_in_the_bucket_the_moment_it_returns() {
    // Through an open handle, small and large: a restore from the bucket as it is when the fsync
    // returns finds the file's version and its blocks.
    let h = harness_with_uploads_held();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let mut copies = Vec::new();
    for (i, size) in [3_000usize, 70_000, 200_000].into_iter().enumerate() {
        let path = format!("d/held-{i}");
        write_file(&e, &path, b"").unwrap();
        let (ino, fh) = open_rw(&e, &path);
        let data = pattern(size, i as u8);
        assert_eq!(e.write(ino, fh, 0, &data).unwrap() as usize, data.len());
        e.fsync(ino, Some(fh)).unwrap();
        copies.push((store_as_of_now(&h), vec![(path, data)]));
        e.release(ino, fh).unwrap();
    }
    for (store, file) in copies {
        assert_restores_whole(&h, store, &id, &file);
    }
}

/// A gc pass deletes a block's object once the row's deletion is durable on this host, and the
/// next durability point ships it; a host lost in between leaves a bucket whose metadata still has
/// the row (uploaded, unreferenced) but not the object. The restore drops such a row, so the same
/// bytes written again on the new host are stored again, not counted as already in the bucket.
#[test]
fn a_restore_forgets_unreferenced_blocks_whose_objects_gc_deleted_before_shipping() {
    let h = harness_with_uploads_held();
    let id = ScopeId::generate();
    let x = pattern(100_000, 41);
    {
        let storage = h.storage();
        let e = storage.open_scope(&id, big_quota()).unwrap();
        write_file(&e, "a", &x).unwrap();
        e.sync().unwrap();
        write_file(&e, "a", &pattern(100_000, 42)).unwrap();
        e.sync().unwrap();
        // With shipping, a pass takes only blocks unreferenced in a second before its own.
        let unreferenced_at = unix_secs();
        eventually("the clock moves on", || unix_secs() > unreferenced_at);
        let report = e.collect_garbage_online(Duration::ZERO, u64::MAX).unwrap();
        assert!(report.blocks_deleted >= 1, "x's blocks went: {report:?}");
    }
    // Lost before the next durability point shipped the rows' deletion.
    let dir = tempfile::tempdir().unwrap();
    let e = elsewhere(&h, h.store.clone(), &dir).open_scope(&id, big_quota()).unwrap();
    write_file(&e, "b", &x).unwrap();
    e.sync().unwrap();
    drop(e);
    let again = tempfile::tempdir().unwrap();
    let e = elsewhere(&h, h.store.clone(), &again).open_scope(&id, big_quota()).unwrap();
    assert_eq!(read_file(&e, "b").unwrap(), x, "b's bytes are in the bucket");
    let report = e.fsck(false).unwrap();
    assert!(report.damaged_files.is_empty() && report.metadata_problems.is_empty(), "{report:?}");
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Issue 23's promise, found broken by the lost-host states of `crash_states.rs`: with metadata
/// shipped, a durability point puts every block of every committed version in the bucket before
/// it returns, not only the names: a directory fsync after files were written (none fsynced on
/// its own) leaves a bucket that restores each of them whole on another host.
#[test]
fn a_directory_fsync_puts_every_committed_block_in_the_bucket() {
    let h = harness_with_uploads_held();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let written = small_files(5, 13);
    write_all(&e, &written);
    e.fsync_dir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let restored = elsewhere(&h, h.store.clone(), &dir).open_scope(&id, big_quota()).unwrap();
    check_all(&restored, &written);
    assert!(restored.fsck(false).unwrap().damaged_files.is_empty());
}

/// A restart mounts every scope, and a scope nobody uses keeps its database closed (issue 10): its
/// shipper, which does not know where that database stands, neither looks at the bucket nor starts
/// a new generation over the chain (it once took a whole snapshot of every idle scope a tick after
/// a restart, opening each database to copy it). The chain goes on once the scope is used.
#[test]
fn a_scope_nobody_uses_after_a_restart_keeps_its_chain_and_its_database_closed() {
    let h = harness();
    let id = ScopeId::generate();
    let first = {
        let e = h.storage().open_scope(&id, big_quota()).unwrap();
        write_all(&e, &files(3, 1));
        e.sync().unwrap();
        Arc::downgrade(&e)
    };
    // The last reference may be a task of the first process finishing its pass on the runtime.
    eventually("the first process's engine gone", || first.upgrade().is_none());
    let before = shipped(&h, &id);
    let storage = h.storage();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    assert!(e.usage_if_open().unwrap().is_none(), "an idle scope opens lazily");
    let passes = e.metadata_shipper_passes();
    eventually("three passes of the shipper", || e.metadata_shipper_passes() >= passes + 3);
    assert!(e.usage_if_open().unwrap().is_none(), "the shipper opened the idle scope's database");
    assert_eq!(shipped(&h, &id), before, "the shipper wrote over an idle scope's chain");
    write_file(&e, "d/after", b"used again").unwrap();
    e.sync().unwrap();
    let gens: std::collections::BTreeSet<String> = shipped(&h, &id).into_iter().map(|(g, _)| g).collect();
    assert_eq!(gens, ["g0000000000000001".to_string()].into(), "{:?}", shipped(&h, &id));
}
