//! Issue 24 item 7 (acceptance c), at the engine: online gc is safe against concurrent writers,
//! uploads and readers. Each rule of `src/engine/gc.rs` is one enumerated interleaving: a whole gc
//! pass is put (a test hook) exactly between the two steps of another actor that it could
//! otherwise break, and the test fails if that rule is taken out. Then a scope rewritten 10 times
//! while a writer keeps writing, readers read and gc runs: every read sees a whole version, the
//! store ends with exactly the blocks the files use, `fsck` is clean, and the bucket alone restores
//! every file. A pass cut short leaves its objects logged for the next (rule 7), and a long pass
//! lets another scope's upload have the host's slot between two of its pages (its fair share).
//! The uploader's side (`src/engine/unneeded.rs`): a small file deleted before its upload is never
//! stored; a block written again just after its drop, or named by a fork's copy, still is.

pub mod engine_support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::{block_key, ObjectStore};
use scopefs::testhooks::set_interleave;
use sha2::{Digest, Sha256};

const BLOCK: usize = 16 * 1024;

/// Blocks of 16 KiB in journal files (inline up to 2 KiB), uploads held unless asked for, no
/// metadata shipping unless a test turns it on.
fn settings(early: bool) -> StorageSettings {
    StorageSettings {
        block_size: BLOCK as u64,
        inline_block_max_bytes: 2 * 1024,
        upload_delay: Duration::from_secs(3600),
        dirty_writeback: Duration::from_secs(3600),
        store_timeout: Duration::from_secs(2),
        store_attempts: 2,
        early_upload: early,
        ..StorageSettings::default()
    }
}

/// Writes `path` (created or truncated) and fsyncs it: its blocks are in the store.
fn write_synced(e: &ScopeEngine, path: &str, data: &[u8]) {
    let (parent, name) = split(e, path).unwrap();
    let flags = OpenFlags { write: true, truncate: true, exclusive: false };
    let (attr, opened) = e.create(parent, name.as_bytes(), 0o644, flags, OWNER).unwrap();
    e.write(attr.ino, opened.fh, 0, data).unwrap();
    e.fsync(attr.ino, Some(opened.fh)).unwrap();
    e.release(attr.ino, opened.fh).unwrap();
}

fn key_of(e: &ScopeEngine, data: &[u8]) -> String {
    block_key(e.scope_id().as_str(), &hex::encode(Sha256::digest(data)))
}

fn online(e: &ScopeEngine) -> GcReport {
    e.collect_garbage_online(Duration::ZERO, u64::MAX).unwrap()
}

fn assert_fsck_clean(e: &ScopeEngine) {
    let report = e.fsck(false).unwrap();
    assert!(
        report.damaged_files.is_empty() && report.orphan_objects.is_empty() && report.metadata_problems.is_empty(),
        "{report:?}"
    );
}

/// Rule 2: a writer seals a block whose old copy gc deletes between the seal and the commit. The
/// commit finds no row, stages the block again and uploads the writer's own copy.
#[test]
fn a_block_sealed_again_while_gc_deletes_it_is_uploaded_from_the_writers_copy() {
    let h = Harness::new(settings(false));
    let e = new_scope(&h.storage());
    let x = unique(BLOCK, 1);
    write_synced(&e, "a", &x);
    write_synced(&e, "a", &unique(BLOCK, 2));
    let (_hook, report) = once_at(&e, "commit.sealed", online);
    write_synced(&e, "b", &x);
    let report = report.lock().unwrap().take().expect("gc ran between the seal and the commit");
    assert_eq!(report.blocks_deleted, 1, "gc took the old copy in that window: {report:?}");
    assert!(h.store.keys().contains(&key_of(&e, &x)), "the writer's copy is stored again");
    assert_eq!(read_file(&e, "b").unwrap(), x);
    assert_fsck_clean(&e);
}

/// Rule 3, an early upload: between its put and its row, another copy of the same block is
/// stored, unreferenced and offered to gc, which leaves it (a put is in flight). The row the early
/// upload records then names an object that exists.
#[test]
fn an_early_upload_in_flight_keeps_its_block_from_gc() {
    let h = Harness::new(settings(true));
    let e = new_scope(&h.storage());
    let x = unique(BLOCK, 3);
    let (_hook, report) = once_at(&e, "early.before_record", move |e: &ScopeEngine| {
        write_synced(e, "c", &unique(BLOCK, 3));
        write_synced(e, "c", &unique(BLOCK, 4));
        online(e)
    });
    let (parent, name) = split(&e, "a").unwrap();
    let (attr, opened) =
        e.create(parent, name.as_bytes(), 0o644, OpenFlags { write: true, ..Default::default() }, OWNER).unwrap();
    e.write(attr.ino, opened.fh, 0, &x).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(10)), "the early upload finished");
    let report = report.lock().unwrap().take().expect("gc ran between the early put and its row");
    assert_eq!(report.blocks_deleted, 0, "{report:?}");
    assert!(report.blocks_deferred >= 1, "the block in flight was offered and left: {report:?}");
    e.fsync(attr.ino, Some(opened.fh)).unwrap();
    e.release(attr.ino, opened.fh).unwrap();
    assert!(h.store.keys().contains(&key_of(&e, &x)));
    assert_eq!(read_file(&e, "a").unwrap(), x);
    assert_fsck_clean(&e);
}

/// Rule 3, the uploader: between reading a staged block and putting it, another upload of the
/// same block finishes and the block is unreferenced; gc leaves it while the first put is in
/// flight, so that put never lands after a delete (no orphan object), and a later pass takes it.
#[test]
fn an_upload_in_flight_keeps_its_block_from_gc() {
    let h = Harness::new(settings(false));
    let e = new_scope(&h.storage());
    let x = unique(BLOCK, 5);
    write_file(&e, "a", &x).unwrap();
    let (_hook, report) = once_at(&e, "upload.before_put", move |e: &ScopeEngine| {
        write_synced(e, "c", &unique(BLOCK, 5));
        write_synced(e, "c", &unique(BLOCK, 6));
        write_synced(e, "a", &unique(BLOCK, 7));
        online(e)
    });
    assert!(e.wait_uploads(Duration::from_secs(10)), "the background upload finished");
    let report = report.lock().unwrap().take().expect("gc ran before the background put");
    assert_eq!(report.blocks_deleted, 0, "{report:?}");
    assert!(report.blocks_deferred >= 1, "{report:?}");
    assert_eq!(online(&e).blocks_deleted, 1, "once the put is recorded, the block goes");
    assert!(!h.store.keys().contains(&key_of(&e, &x)));
    assert_fsck_clean(&e);
}

/// Rule 6: a reader has resolved a block when the file is rewritten and gc deletes the old
/// block; the reader reads the file's new version, never `EIO`.
#[test]
fn a_reader_whose_block_gc_deleted_reads_the_new_version() {
    let h = Harness::new(settings(false));
    let e = new_scope(&h.storage());
    let (old, new) = (unique(BLOCK, 8), unique(BLOCK, 9));
    write_synced(&e, "a", &old);
    let replacement = new.clone();
    let (_hook, report) = once_at(&e, "read.resolved", move |e: &ScopeEngine| {
        write_synced(e, "a", &replacement);
        online(e)
    });
    assert_eq!(read_file(&e, "a").unwrap(), new);
    let report = report.lock().unwrap().take().expect("gc ran between the read's lookup and its fetch");
    assert_eq!(report.blocks_deleted, 1, "the old block was gone when the reader fetched it: {report:?}");
    assert_fsck_clean(&e);
}

/// Rule 5: with metadata shipped to the bucket, a pass first ships what unreferenced its blocks,
/// so a host lost right after gc restores from the bucket without a missing block.
#[test]
fn the_bucket_never_names_a_block_gc_deleted() {
    let mut s = settings(false);
    s.metadata_sync = Some(Duration::from_secs(600));
    s.upload_delay = Duration::from_millis(10);
    let h = Harness::new(s);
    let id = ScopeId::generate();
    let (old, new) = (unique(BLOCK, 10), unique(BLOCK, 11));
    {
        let e = h.storage().open_scope(&id, big_quota()).unwrap();
        write_synced(&e, "a", &old);
        // Rewritten and uploaded, but no durability point: the bucket's metadata still says `old`.
        write_file(&e, "a", &new).unwrap();
        assert!(e.wait_uploads(Duration::from_secs(10)));
        next_second_after(unix_now());
        assert_eq!(online(&e).blocks_deleted, 1);
        assert!(!h.store.keys().contains(&key_of(&e, &old)));
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let storage = Storage::new(store, h.settings.clone(), elsewhere.path(), h.rt.handle().clone()).unwrap();
    let restored = storage.open_scope(&id, big_quota()).unwrap();
    assert_eq!(read_file(&restored, "a").unwrap(), new);
    assert_fsck_clean(&restored);
}

/// Rule 1: a block unreferenced before it was ever stored waits for its upload; gc takes it after.
#[test]
fn a_block_not_stored_yet_waits_for_its_upload() {
    let h = Harness::new(settings(false));
    let e = new_scope(&h.storage());
    write_file(&e, "a", &unique(BLOCK, 12)).unwrap();
    write_file(&e, "a", &unique(BLOCK, 13)).unwrap();
    let first = online(&e);
    assert_eq!((first.blocks_deleted, first.blocks_deferred), (0, 1), "{first:?}");
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert_eq!(online(&e).blocks_deleted, 1);
    assert_eq!(read_file(&e, "a").unwrap(), unique(BLOCK, 13));
    assert_fsck_clean(&e);
}

const FILES: u64 = 8;
/// Four full blocks and a tail small enough to be journaled inline.
const FILE_LEN: usize = 4 * BLOCK + 1000;

fn version(file: u64, v: u64) -> Vec<u8> {
    unique(FILE_LEN, file * 1000 + v + 1)
}

/// Acceptance c: eight files rewritten 10 times, fsynced or only closed, while a writer keeps
/// writing, two readers read and gc runs; metadata shipped every 50 ms.
#[test]
fn online_gc_reclaims_a_scope_rewritten_ten_times_under_writers_and_readers() {
    let mut s = settings(true);
    s.upload_delay = Duration::from_millis(20);
    s.metadata_sync = Some(Duration::from_millis(50));
    let h = Harness::new(s);
    let id = ScopeId::generate();
    let e = h.storage().open_scope(&id, big_quota()).unwrap();
    for f in 0..FILES {
        write_synced(&e, &format!("f{f}"), &version(f, 0));
    }
    let (done, deleted, passes) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let reads = AtomicU64::new(0);
    let busy_versions = AtomicU64::new(0);
    std::thread::scope(|t| {
        t.spawn(|| {
            for round in 1..=10 {
                for f in 0..FILES {
                    let path = format!("f{f}");
                    if (round + f) % 2 == 0 {
                        write_synced(&e, &path, &version(f, round));
                    } else {
                        write_file(&e, &path, &version(f, round)).unwrap();
                    }
                }
            }
            // It keeps writing until gc has reclaimed blocks in at least three passes meanwhile.
            let deadline = Instant::now() + Duration::from_secs(60);
            while passes.load(Ordering::SeqCst) < 3 {
                assert!(Instant::now() < deadline, "gc reclaimed nothing while the writer wrote");
                let v = busy_versions.fetch_add(1, Ordering::SeqCst);
                write_file(&e, "busy", &version(99, v)).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        });
        for reader in 0..2u64 {
            let (e, done, reads) = (&e, &done, &reads);
            t.spawn(move || {
                let mut n = reader;
                while !done.load(Ordering::SeqCst) {
                    let f = n % FILES;
                    n += 1;
                    let got = read_file(e, &format!("f{f}")).unwrap_or_else(|err| panic!("reading f{f}: {err}"));
                    let whole = got.is_empty() || (0..=10).any(|v| got == version(f, v));
                    assert!(whole, "f{f}: {} bytes that are no version of it", got.len());
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        t.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                let report = online(&e);
                if report.blocks_deleted > 0 {
                    deleted.fetch_add(report.blocks_deleted, Ordering::SeqCst);
                    passes.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    });
    assert!(reads.load(Ordering::Relaxed) > 0);
    // Everything stored and shipped; one more second so that every block unreferenced is older than
    // the pass's durability point; then nothing is left to take.
    e.sync().unwrap();
    assert!(e.wait_uploads(Duration::from_secs(30)));
    next_second_after(unix_now());
    let last = online(&e);
    assert_eq!(last.blocks_deferred, 0, "{last:?}");
    let total = deleted.load(Ordering::SeqCst) + last.blocks_deleted;
    assert!(total >= 10 * FILES * 4, "every old version's blocks went: {total}");
    let mut live = BTreeSet::new();
    let busy = busy_versions.load(Ordering::SeqCst) - 1;
    for (f, v) in (0..FILES).map(|f| (f, 10)).chain([(99, busy)]) {
        for chunk in version(f, v).chunks(BLOCK) {
            live.insert(key_of(&e, chunk));
        }
    }
    let stored: BTreeSet<String> = h.store.keys().into_iter().filter(|k| k.contains("/blocks/")).collect();
    assert_eq!(stored, live, "the store holds exactly the blocks the files use");
    assert_fsck_clean(&e);
    drop(e);
    let elsewhere = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let storage = Storage::new(store, h.settings.clone(), elsewhere.path(), h.rt.handle().clone()).unwrap();
    let restored = storage.open_scope(&id, big_quota()).unwrap();
    for f in 0..FILES {
        assert_eq!(read_file(&restored, &format!("f{f}")).unwrap(), version(f, 10), "f{f} from the bucket");
    }
    assert_fsck_clean(&restored);
}

/// Rule 4: a writer commits a block again while gc is deleting its earlier copy (rows taken, the
/// metadata lock let go, the object not deleted yet). Its upload waits until the delete is done,
/// so the object the new row names is the one the upload put after it.
#[test]
fn an_upload_of_a_block_gc_is_deleting_waits_for_the_delete() {
    let h = Harness::new(settings(false));
    let e = new_scope(&h.storage());
    let x = unique(BLOCK, 14);
    write_synced(&e, "a", &x);
    write_synced(&e, "a", &unique(BLOCK, 15));
    let writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
    let (started, weak) = (writer.clone(), Arc::downgrade(&e));
    let _hook = set_interleave("gc.deleting", e.scope_id().as_str(), move || {
        let Some(engine) = weak.upgrade() else { return };
        let mut slot = started.lock().unwrap();
        if slot.is_some() {
            return;
        }
        let again = engine.clone();
        *slot = Some(std::thread::spawn(move || write_synced(&again, "b", &unique(BLOCK, 14))));
        let deadline = Instant::now() + Duration::from_secs(10);
        while engine.puts_waiting_for_gc() == 0 {
            assert!(Instant::now() < deadline, "the upload of b never reached the block being deleted");
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    assert_eq!(online(&e).blocks_deleted, 1);
    writer.lock().unwrap().take().expect("the writer ran in the delete window").join().unwrap();
    assert!(h.store.keys().contains(&key_of(&e, &x)), "the new upload's object is there");
    assert_eq!(read_file(&e, "b").unwrap(), x);
    assert_fsck_clean(&e);
}

/// Rule 7: a pass cut short between its rows' deletion and its objects' (here the store fails its
/// deletes; a crash there is enumerated in `crash_states.rs`) leaves the objects logged, not
/// orphaned: fsck names them pending, and the next pass deletes them — except a block written
/// again meanwhile, whose object is now its new row's and stays.
#[test]
fn objects_of_a_pass_cut_short_are_deleted_by_the_next_unless_written_again() {
    let h = Harness::new(settings(false));
    let e = new_scope(&h.storage());
    let (x, y) = (unique(BLOCK, 71), unique(BLOCK, 72));
    write_synced(&e, "a", &x);
    write_synced(&e, "b", &y);
    write_synced(&e, "a", &unique(BLOCK, 73));
    write_synced(&e, "b", &unique(BLOCK, 74));
    let store = h.store.clone();
    let hook = set_interleave("gc.deleting", e.scope_id().as_str(), move || store.set_unavailable(true));
    assert!(e.collect_garbage_online(Duration::ZERO, u64::MAX).is_err(), "the deletes failed");
    drop(hook);
    h.store.set_unavailable(false);
    let (kx, ky) = (key_of(&e, &x), key_of(&e, &y));
    assert!(h.store.keys().contains(&kx) && h.store.keys().contains(&ky), "both objects are left");
    let report = e.fsck(false).unwrap();
    assert!(report.orphan_objects.is_empty(), "logged, not orphaned: {report:?}");
    assert_eq!(BTreeSet::from_iter(report.pending_deletes), BTreeSet::from([kx.clone(), ky.clone()]));

    // x is written again before the next pass: its object is the new row's.
    write_synced(&e, "c", &x);
    let report = online(&e);
    assert!(report.blocks_deleted >= 1, "{report:?}");
    let keys = h.store.keys();
    assert!(keys.contains(&kx), "the block written again keeps its object");
    assert!(!keys.contains(&ky), "the logged object nobody wrote again is deleted");
    assert_eq!(read_file(&e, "c").unwrap(), x);
    let report = e.fsck(false).unwrap();
    assert!(report.pending_deletes.is_empty(), "{report:?}");
    assert_fsck_clean(&e);
}

/// Item 7's fair share: a pass takes the host's upload slot one page at a time, so another scope's
/// upload gets it between two pages. With a single slot for the whole host and a slow store, a
/// scope's `fsync` (which waits for its upload) returns while a long gc pass of another scope is
/// still deleting — it would wait for the whole pass if gc held the slot throughout.
#[test]
fn another_scopes_fsync_gets_the_upload_slot_between_two_pages_of_a_long_pass() {
    let h = Harness::new(StorageSettings { upload_parallelism: 1, upload_parallelism_per_scope: 1, ..settings(false) });
    let storage = h.storage();
    let (a, b) = (new_scope(&storage), new_scope(&storage));
    const GARBAGE: u64 = 320;
    for i in 0..GARBAGE {
        write_file(&a, &format!("g{i}"), &unique(BLOCK, 10_000 + i)).unwrap();
    }
    a.sync().unwrap();
    for i in 0..GARBAGE {
        a.unlink(ROOT_INO, format!("g{i}").as_bytes()).unwrap();
    }
    h.store.set_stall(Some(Duration::from_millis(20)));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let started = Mutex::new(Some(started_tx));
    let hook = set_interleave("gc.deleting", a.scope_id().as_str(), move || {
        if let Some(tx) = started.lock().unwrap().take() {
            let _ = tx.send(());
        }
    });
    let done = Arc::new(AtomicBool::new(false));
    let pass = {
        let (a, done) = (a.clone(), done.clone());
        std::thread::spawn(move || {
            let report = online(&a);
            done.store(true, Ordering::SeqCst);
            report
        })
    };
    started_rx.recv_timeout(Duration::from_secs(30)).expect("the pass reached its first deletes");
    write_synced(&b, "mine", &unique(BLOCK, 99));
    let gc_was_running = !done.load(Ordering::SeqCst);
    let report = pass.join().unwrap();
    drop(hook);
    h.store.set_stall(None);
    assert_eq!(report.blocks_deleted, GARBAGE, "{report:?}");
    assert!(gc_was_running, "the other scope's fsync waited for the whole gc pass");
    assert_eq!(read_file(&b, "mine").unwrap(), unique(BLOCK, 99));
    assert_fsck_clean(&a);
    assert_fsck_clean(&b);
}

/// Uploads no longer needed (`src/engine/unneeded.rs`): whether `data`'s block is in the store.
fn stored(h: &Harness, e: &ScopeEngine, data: &[u8]) -> bool {
    h.store.keys().contains(&key_of(e, data))
}

fn unlink(e: &ScopeEngine, path: &str) {
    let (parent, name) = split(e, path).unwrap();
    e.unlink(parent, name.as_bytes()).unwrap();
}

/// A small file deleted before its block's upload never reaches the store, and nothing a program
/// still refers to is lost for it: staging's charge comes back to zero, and a restart and `fsck`
/// find nothing wrong.
#[test]
fn small_files_deleted_before_their_upload_are_never_stored() {
    let h = Harness::new(settings(false));
    let storage = h.storage();
    let e = new_scope(&storage);
    let gone: Vec<Vec<u8>> = (0..50).map(|i| unique(1000 + i * 7, i as u64)).collect();
    let kept = unique(2 * 1024, 99);
    for (i, data) in gone.iter().enumerate() {
        write_file(&e, &format!("tmp-{i}"), data).unwrap();
    }
    write_file(&e, "kept", &kept).unwrap();
    assert!(storage.staging_bytes() > 0, "the blocks wait in the inline journal");
    for i in 0..gone.len() {
        unlink(&e, &format!("tmp-{i}"));
    }
    let (dropped_before, _) = unneeded_upload_totals();
    let puts = h.store.put_count();
    assert!(e.wait_uploads(Duration::from_secs(10)), "the queue drained");
    assert_eq!(h.store.put_count() - puts, 1, "only the file still there was put");
    assert!(stored(&h, &e, &kept));
    assert!(gone.iter().all(|d| !stored(&h, &e, d)), "no deleted file's block reached the store");
    assert!(unneeded_upload_totals().0 - dropped_before >= gone.len() as u64);
    assert_eq!(storage.staging_bytes(), 0, "every dropped block's staging charge came back");
    assert_eq!(read_file(&e, "kept").unwrap(), kept);
    assert_fsck_clean(&e);

    // Killed now and restarted: nothing left to upload, nothing missing.
    let copy = tempfile::tempdir().unwrap();
    let storage = killed_now(&h, copy.path());
    let e = storage.open_scope(e.scope_id(), big_quota()).unwrap();
    assert_eq!(e.pending_uploads(), 0);
    let puts = h.store.put_count();
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert_eq!(h.store.put_count(), puts);
    assert_eq!(read_file(&e, "kept").unwrap(), kept);
    assert_fsck_clean(&e);
}

/// A scope (uploads held) with file `a` holding `data` written and deleted before its upload.
fn deleted_before_upload(data: &[u8]) -> (Harness, Arc<Storage>, Arc<ScopeEngine>) {
    let h = Harness::new(settings(false));
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "a", data).unwrap();
    unlink(&e, "a");
    (h, storage, e)
}

/// The drop and a commit of the same bytes, interleaved: right after the drop lets go of the
/// metadata lock, a new file with the dropped block's bytes is written. Its commit finds no row,
/// journals the block anew and queues it. The drop took the old queue entry in the same hold as
/// the row, so the new one is not swallowed: the block is stored before the queue counts as
/// drained.
#[test]
fn a_block_written_again_just_after_its_drop_is_uploaded() {
    let x = unique(1500, 7);
    let (h, storage, e) = deleted_before_upload(&x);
    let again = x.clone();
    let (_hook, wrote) = once_at(&e, "upload.dropped", move |e: &ScopeEngine| write_file(e, "b", &again).is_ok());
    assert!(e.wait_uploads(Duration::from_secs(10)));
    // The drop emptied the queue, so that wait may end while the writer still runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while wrote.lock().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the writer never ran between the drop and the group's end");
        std::thread::yield_now();
    }
    assert_eq!(*wrote.lock().unwrap(), Some(true));
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert!(stored(&h, &e, &x), "the block written again was uploaded");
    assert_eq!(read_file(&e, "b").unwrap(), x);
    assert_eq!(storage.staging_bytes(), 0);
    assert_fsck_clean(&e);

    // Written again after the drop is over: the same.
    let y = unique(900, 8);
    write_file(&e, "c", &y).unwrap();
    unlink(&e, "c");
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert!(!stored(&h, &e, &y));
    write_file(&e, "d", &y).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert!(stored(&h, &e, &y));
    assert_eq!(read_file(&e, "d").unwrap(), y);
    assert_eq!(storage.staging_bytes(), 0);
}

/// A fork's copy names a block the parent committed after the fork's first sync; between the copy
/// and the sync that stores what it names, the parent deletes the file and its uploader runs. The
/// block must not be dropped: the fork reads the file from the parent's prefix.
#[test]
fn a_block_a_forks_copy_names_is_stored_though_the_parent_let_go_of_it() {
    let h = Harness::new(settings(false));
    let storage = h.storage();
    let parent = new_scope(&storage);
    let x = unique(1200, 11);
    let written = x.clone();
    let (_synced, _) = once_at(&parent, "fork.synced", move |e: &ScopeEngine| write_file(e, "a", &written).unwrap());
    let (_copied, ran) = once_at(&parent, "fork.copied", |e: &ScopeEngine| {
        unlink(e, "a");
        e.wait_uploads(Duration::from_secs(10))
    });
    let child = ScopeId::generate();
    storage.fork_scope(&parent, &child).unwrap();
    assert_eq!(*ran.lock().unwrap(), Some(true), "the parent's uploader ran between the copy and the sync");
    assert!(stored(&h, &parent, &x), "the block the copy names was stored");
    let fork = storage.open_scope(&child, big_quota()).unwrap();
    assert_eq!(read_file(&fork, "a").unwrap(), x);
    assert!(matches!(read_file(&parent, "a"), Err(EngineError::NotFound)));
}

/// A commit that lists a block's hash as inline just before the uploader drops the old row of that
/// block, then journals it anew: the new row's staging charge is released once it is uploaded
/// (the charge follows the row, not the list of inline hashes the drop took the hash out of).
#[test]
fn a_block_dropped_while_a_commit_lists_it_again_leaves_no_staging_charge_behind() {
    let x = unique(1700, 12);
    let (h, storage, e) = deleted_before_upload(&x);
    let (_hook, ran) = once_at(&e, "inline.listed", |e: &ScopeEngine| e.wait_uploads(Duration::from_secs(10)));
    write_file(&e, "b", &x).unwrap();
    assert_eq!(*ran.lock().unwrap(), Some(true), "the uploader ran between the listing and the commit");
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert!(stored(&h, &e, &x));
    assert_eq!(read_file(&e, "b").unwrap(), x);
    assert_eq!(storage.staging_bytes(), 0, "no charge left behind");
    assert_fsck_clean(&e);
}
