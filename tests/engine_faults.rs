//! Acceptance g (engine half) and journal replay: the engine over a failing, stalling or corrupting in-memory store.

pub mod engine_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::{block_key, ObjectStore};

/// Copies a scope's metadata database into a fresh data directory: a new daemon with empty cache and staging.
fn fresh_daemon(h: &Harness, e: &ScopeEngine, rt: &tokio::runtime::Runtime) -> (tempfile::TempDir, Arc<Storage>) {
    let dir = tempfile::tempdir().unwrap();
    let meta_dir = dir.path().join("scopes").join(e.scope_id().as_str());
    std::fs::create_dir_all(&meta_dir).unwrap();
    // A consistent copy of the running scope's database (every mutation so far), made by its engine.
    e.copy_metadata_to(&meta_dir.join("meta.sqlite3")).unwrap();
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let storage = Storage::new(store, h.settings.clone(), dir.path(), rt.handle().clone()).unwrap();
    (dir, storage)
}

#[test]
fn uncached_reads_fail_with_a_store_error_within_the_bound_when_the_store_is_down_or_stalls() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "f", &pattern(1000, 1)).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(5)));
    let (_dir, fresh) = fresh_daemon(&h, &e, &h.rt);
    let e2 = fresh.open_scope(e.scope_id(), big_quota()).unwrap();

    // Bound: attempts × timeout plus backoff (2 × 300 ms + 200 ms here).
    let bound = Duration::from_secs(3);
    h.store.set_unavailable(true);
    let t = Instant::now();
    let err = read_file(&e2, "f").unwrap_err();
    assert!(matches!(err, EngineError::Store(_)), "{err:?}");
    assert!(t.elapsed() < bound, "unavailable store answered after {:?}", t.elapsed());
    h.store.set_unavailable(false);

    h.store.set_stall(Some(Duration::from_secs(30)));
    let t = Instant::now();
    let err = read_file(&e2, "f").unwrap_err();
    assert!(matches!(err, EngineError::Store(scopefs::store::StoreError::Timeout(_))), "{err:?}");
    assert!(t.elapsed() < bound, "stalled store answered after {:?}", t.elapsed());
    h.store.set_stall(None);

    assert_eq!(read_file(&e2, "f").unwrap(), pattern(1000, 1), "reads work again once the store is back");
}

#[test]
fn a_corrupt_object_is_refused_never_served() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "f", &pattern(64, 2)).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(5)));
    let key = h.store.keys().into_iter().find(|k| k.contains("/blocks/")).unwrap();
    assert!(h.store.corrupt(&key));
    let (_dir, fresh) = fresh_daemon(&h, &e, &h.rt);
    let e2 = fresh.open_scope(e.scope_id(), big_quota()).unwrap();
    assert!(matches!(read_file(&e2, "f"), Err(EngineError::Corrupt { .. })));
    let report = e2.fsck(false).unwrap();
    assert_eq!(report.damaged_files, vec!["/f".to_string()]);
}

#[test]
fn failed_uploads_are_retried_without_corruption() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    h.store.fail_next_puts(5);
    let data = pattern(64 * 7 + 5, 3);
    write_file(&e, "f", &data).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(20)), "background retries finish");
    let (_dir, fresh) = fresh_daemon(&h, &e, &h.rt);
    let e2 = fresh.open_scope(e.scope_id(), big_quota()).unwrap();
    assert_eq!(read_file(&e2, "f").unwrap(), data);
    assert!(e2.fsck(false).unwrap().damaged_files.is_empty());
}

#[test]
fn fsync_and_close_durability_report_an_unavailable_store_and_keep_the_data_journaled() {
    let mut settings = Harness::small_blocks().settings;
    settings.durability = Durability::Close;
    let h = Harness::new(settings);
    let storage = h.storage();
    let e = new_scope(&storage);
    h.store.set_unavailable(true);
    let data = pattern(200, 4);
    let t = Instant::now();
    let err = write_file(&e, "f", &data).unwrap_err();
    assert!(matches!(err, EngineError::Store(_)), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(e.pending_uploads() > 0, "the committed version waits in the journal");
    assert_eq!(read_file(&e, "f").unwrap(), data, "visible locally at once");
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
    let (_dir, fresh) = fresh_daemon(&h, &e, &h.rt);
    let e2 = fresh.open_scope(e.scope_id(), big_quota()).unwrap();
    assert_eq!(read_file(&e2, "f").unwrap(), data);
}

#[test]
fn the_journal_is_replayed_by_a_restarted_daemon() {
    let h = Harness::small_blocks();
    let scope = ScopeId::generate();
    let data = pattern(64 * 5 + 9, 5);
    {
        // First daemon: the store is down, close() returns (writeback), then the daemon dies.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store: Arc<dyn ObjectStore> = h.store.clone();
        let storage = Storage::new(store, h.settings.clone(), &h.data_dir(), rt.handle().clone()).unwrap();
        let e = storage.open_scope(&scope, big_quota()).unwrap();
        h.store.set_unavailable(true);
        write_file(&e, "f", &data).unwrap();
        assert!(e.pending_uploads() > 0);
        rt.shutdown_background();
    }
    h.store.set_unavailable(false);
    assert!(h.store.keys().is_empty(), "nothing reached the store before the crash");
    let storage = h.storage();
    let e = storage.open_scope(&scope, big_quota()).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(10)), "the journal replays on open");
    let blocks = h.store.keys().iter().filter(|k| k.starts_with(&format!("scopes/{scope}/blocks/"))).count();
    use sha2::Digest;
    let distinct: std::collections::HashSet<String> =
        data.chunks(64).map(|c| hex::encode(sha2::Sha256::digest(c))).collect();
    assert_eq!(blocks, distinct.len(), "every distinct block uploaded once");
    let (_dir, fresh) = fresh_daemon(&h, &e, &h.rt);
    assert_eq!(read_file(&fresh.open_scope(&scope, big_quota()).unwrap(), "f").unwrap(), data);
    assert_eq!(e.integrity_check().unwrap(), "ok");
}

#[test]
fn quotas_are_exact_after_overwrites_and_deletes() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = storage.open_scope(&ScopeId::generate(), Quota { bytes: 1000, inodes: 3 }).unwrap();
    write_file(&e, "a", &[1; 600]).unwrap();
    assert!(matches!(write_file(&e, "b", &[1; 500]), Err(EngineError::QuotaExceeded("bytes"))));
    assert_eq!(e.usage().unwrap().bytes, 600, "the refused write left no bytes behind");
    write_file(&e, "a", &[2; 100]).unwrap();
    write_file(&e, "b", &[1; 500]).unwrap();
    assert_eq!(e.usage().unwrap(), Usage { files: 2, bytes: 600, inodes: 2, links: 0 });
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    assert!(matches!(e.mkdir(ROOT_INO, b"e", 0o755, OWNER), Err(EngineError::QuotaExceeded("inodes"))));
    e.unlink(ROOT_INO, b"a").unwrap();
    assert_eq!(e.usage().unwrap(), Usage { files: 1, bytes: 500, inodes: 2, links: 0 });
    let st = e.statfs().unwrap();
    assert_eq!((st.total_inodes, st.free_inodes), (3, 1));
    assert!(matches!(
        e.setattr(resolve(&e, "b").unwrap(), &SetAttr { size: Some(2000), ..Default::default() }),
        Err(EngineError::QuotaExceeded("bytes"))
    ));
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn staging_exhaustion_is_no_space_and_read_only_scopes_refuse_changes() {
    let mut settings = Harness::small_blocks().settings;
    settings.staging_max_bytes = 256;
    let h = Harness::new(settings);
    let storage = h.storage();
    let e = new_scope(&storage);
    h.store.set_unavailable(true);
    // Sixteen distinct blocks (identical ones are staged once).
    let distinct: Vec<u8> = (0..1024).map(|i| (i / 64) as u8).collect();
    assert!(matches!(write_file(&e, "big", &distinct), Err(EngineError::NoSpace)));
    assert_eq!(e.staging_bytes(), 0, "the refused commit left nothing charged");
    h.store.set_unavailable(false);
    e.set_read_only(true);
    assert!(matches!(e.mkdir(ROOT_INO, b"d", 0o755, OWNER), Err(EngineError::ReadOnly)));
    assert!(matches!(write_file(&e, "x", b"1"), Err(EngineError::ReadOnly)));
}

#[test]
fn blocks_are_content_addressed_under_the_scope_prefix() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "f", &pattern(64, 6)).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(5)));
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(pattern(64, 6)));
    assert_eq!(h.store.keys(), vec![block_key(e.scope_id().as_str(), &sha)]);
}

/// Issue 9: handles outlive the process that opened them (the kernel keeps the mount and its open
/// files across a daemon restart). A restart commits open files first (`commit_open_files`, and
/// every write after it); the next process adopts a handle it never opened on first use, with the
/// write right its number carries, and releases one it never used without an error.
#[test]
fn handles_of_an_earlier_process_are_adopted_by_the_next() {
    let h = Harness::small_blocks();
    let scope = ScopeId::generate();
    let (ino, wfh, rfh) = {
        let storage = h.storage();
        let e = storage.open_scope(&scope, big_quota()).unwrap();
        let (parent, name) = split(&e, "f").unwrap();
        let flags = OpenFlags { write: true, truncate: false, exclusive: false };
        let (attr, w) = e.create(parent, name.as_bytes(), 0o644, flags, OWNER).unwrap();
        e.write(attr.ino, w.fh, 0, b"abc").unwrap();
        let r = e.open(attr.ino, OpenFlags::default()).unwrap();
        e.commit_open_files().unwrap();
        // After the commit, each write commits as it happens.
        e.write(attr.ino, w.fh, 3, b"def").unwrap();
        (attr.ino, w.fh, r.fh)
        // The process ends here: nothing is released.
    };
    let storage = h.storage();
    let e = storage.open_scope(&scope, big_quota()).unwrap();
    assert_eq!(e.read(ino, rfh, 0, 100).unwrap(), b"abcdef");
    e.write(ino, wfh, 6, b"ghi").unwrap();
    assert!(matches!(e.write(ino, rfh, 0, b"x"), Err(EngineError::BadHandle)), "a read handle stays read-only");
    e.flush(ino, wfh).unwrap();
    let fresh = e.open(ino, OpenFlags::default()).unwrap();
    assert!(fresh.fh != wfh && fresh.fh != rfh, "numbers never repeat across processes");
    for fh in [wfh, rfh, fresh.fh, 0x5555_5554] {
        e.release(ino, fh).unwrap();
    }
    assert_eq!(read_file(&e, "f").unwrap(), b"abcdefghi");
}

/// Calls that hold until `want` of them are in flight at once (or, bounded, until a deadline that
/// only calls made one at a time reach), recording the most ever in flight.
struct PeakGate {
    want: usize,
    deadline: Duration,
    in_flight: tokio::sync::watch::Sender<usize>,
    peak: std::sync::atomic::AtomicUsize,
}

impl PeakGate {
    fn new(want: usize, deadline: Duration) -> PeakGate {
        PeakGate { want, deadline, in_flight: tokio::sync::watch::Sender::new(0), peak: Default::default() }
    }

    fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Gate for PeakGate {
    async fn pass(&self) {
        use std::sync::atomic::Ordering;
        self.in_flight.send_modify(|n| {
            *n += 1;
            self.peak.fetch_max(*n, Ordering::SeqCst);
        });
        let mut rx = self.in_flight.subscribe();
        // Once the peak was reached the gate stays open; the deadline only bounds a failing run.
        let peak_reached = |_: &usize| self.peak.load(Ordering::SeqCst) >= self.want;
        let _ = tokio::time::timeout(self.deadline, rx.wait_for(peak_reached)).await;
        self.in_flight.send_modify(|n| *n -= 1);
    }
}

/// What the calls of a [`GatedStore`] pass before they reach its memory store.
#[async_trait::async_trait]
trait Gate: Send + Sync {
    async fn pass(&self);
}

/// A memory store whose puts, or whose gets, of keys starting with `only` pass a [`Gate`] first.
struct GatedStore<G> {
    inner: Arc<scopefs::store::MemoryStore>,
    gate: G,
    gets: bool,
    only: String,
}

impl<G> GatedStore<G> {
    fn new(inner: Arc<scopefs::store::MemoryStore>, gate: G, gets: bool) -> GatedStore<G> {
        GatedStore { inner, gate, gets, only: String::new() }
    }
}

#[async_trait::async_trait]
impl<G: Gate + 'static> ObjectStore for GatedStore<G> {
    async fn put(&self, key: &str, data: bytes::Bytes) -> Result<(), scopefs::store::StoreError> {
        if !self.gets && key.starts_with(&self.only) {
            self.gate.pass().await;
        }
        self.inner.put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<bytes::Bytes, scopefs::store::StoreError> {
        if self.gets && key.starts_with(&self.only) {
            self.gate.pass().await;
        }
        self.inner.get(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<u64>, scopefs::store::StoreError> {
        self.inner.head(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), scopefs::store::StoreError> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<scopefs::store::ObjectInfo>, scopefs::store::StoreError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "gated memory store".into()
    }
}

#[test]
fn fsync_uploads_a_files_blocks_concurrently_within_the_upload_slots() {
    let h = Harness::new(StorageSettings {
        block_size: 64,
        upload_parallelism: 2,
        store_timeout: Duration::from_secs(60),
        store_attempts: 1,
        ..StorageSettings::default()
    });
    let store = Arc::new(GatedStore::new(Arc::default(), PeakGate::new(2, Duration::from_secs(10)), false));
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let storage = Storage::new(dyn_store, h.settings.clone(), &h.data_dir(), h.rt.handle().clone()).unwrap();
    let e = new_scope(&storage);
    let flags = OpenFlags { write: true, truncate: true, exclusive: false };
    let (attr, opened) = e.create(ROOT_INO, b"f", 0o644, flags, OWNER).unwrap();
    // Four distinct blocks, committed and uploaded by the fsync (nothing was queued before it).
    e.write(attr.ino, opened.fh, 0, &pattern(4 * 64, 9)).unwrap();
    e.fsync(attr.ino, Some(opened.fh)).unwrap();
    e.release(attr.ino, opened.fh).unwrap();
    assert_eq!(store.inner.put_count(), 4);
    assert_eq!(store.gate.peak(), 2, "uploads run at once, at most `upload_parallelism` of them");
}

/// A local object directory's large block is verified by its first read and read in place after
/// (no copy in the block cache); a damaged one is refused before any byte of it is served.
#[test]
fn a_local_directorys_blocks_are_verified_then_read_in_place() {
    use scopefs::store::LocalDirStore;
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    let daemon = |data: &str| {
        let store: Arc<dyn ObjectStore> = Arc::new(LocalDirStore::new(&objects).unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let storage =
            Storage::new(store, StorageSettings::default(), &dir.path().join(data), rt.handle().clone()).unwrap();
        (rt, storage)
    };
    let data = pattern(1536 * 1024, 9);
    let id = ScopeId::generate();
    {
        let (_rt, storage) = daemon("data");
        let e = storage.open_scope(&id, big_quota()).unwrap();
        write_file(&e, "f", &data).unwrap();
        e.sync().unwrap();
        std::fs::create_dir_all(dir.path().join("fresh/scopes").join(id.as_str())).unwrap();
        e.copy_metadata_to(&dir.path().join("fresh/scopes").join(id.as_str()).join("meta.sqlite3")).unwrap();
    }
    let cache_files = |data: &str| walk_files(&dir.path().join(data).join("cache"));
    {
        // A fresh data directory: nothing staged or cached, every block from the store.
        let (_rt, storage) = daemon("fresh");
        let e = storage.open_scope(&id, big_quota()).unwrap();
        assert_eq!(read_file(&e, "f").unwrap(), data, "first read: fetched and verified");
        assert_eq!(read_file(&e, "f").unwrap(), data, "read again, in place");
        assert!(cache_files("fresh").iter().all(|f| !f.contains(&id.to_string())), "nothing copied into the cache");
    }
    // The block damaged on disk: the next daemon's first read verifies it and refuses it.
    let block = walk_files(&objects).into_iter().find(|f| f.contains("/blocks/")).unwrap();
    let mut bytes = std::fs::read(&block).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&block, bytes).unwrap();
    std::fs::remove_dir_all(dir.path().join("fresh/cache")).unwrap();
    let (_rt, storage) = daemon("fresh");
    let e = storage.open_scope(&id, big_quota()).unwrap();
    assert!(matches!(read_file(&e, "f"), Err(EngineError::Corrupt { .. })));
}

/// Every file below `dir`, as strings.
fn walk_files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// Review D10: a block cache database a power loss left unreadable does not stop the daemon: it is
/// moved aside (with its WAL) and an empty cache takes its place, which then works and persists.
#[test]
fn an_unreadable_cache_database_is_set_aside_and_the_cache_starts_empty() {
    let h = Harness::new(StorageSettings::default());
    let cache = h.data_dir().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let pack = cache.join(".scopefs-pack.sqlite3");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&pack, &garbage).unwrap();
    std::fs::write(cache.join(".scopefs-pack.sqlite3-wal"), b"not a WAL either").unwrap();

    let storage = h.storage();
    let aside = cache.join(".scopefs-pack.sqlite3.corrupt-1");
    assert_eq!(std::fs::read(&aside).unwrap(), garbage, "the damaged database was moved aside as it was");
    // The junk WAL is gone from beside the new database (SQLite may drop it; otherwise set aside).
    let wal = std::fs::read(cache.join(".scopefs-pack.sqlite3-wal")).unwrap_or_default();
    assert_ne!(wal, b"not a WAL either");
    assert_eq!(storage.cache_bytes(), 0);
    // The new cache works: an uploaded small block goes into it and is read from it.
    let e = new_scope(&storage);
    write_file(&e, "f", &pattern(5000, 9)).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(20)));
    assert_eq!(storage.cache_bytes(), 5000, "the uploaded block was cached");
    let (hits, _) = storage.cache_counts();
    assert_eq!(read_file(&e, "f").unwrap(), pattern(5000, 9));
    assert!(storage.cache_counts().0 > hits, "the read was a cache hit");
    drop((e, storage));
    // Reopened, the new database keeps its entries and nothing more is set aside.
    let again = h.storage();
    assert_eq!(again.cache_bytes(), 5000, "the new cache database kept its entries");
    assert!(!cache.join(".scopefs-pack.sqlite3.corrupt-2").exists());
}

/// Issue 22 N1: one scope's upload backlog does not queue another scope's fsync behind it. Every
/// put takes 20 ms and there are two upload slots, one per scope: scope A fsyncs a file of 40
/// blocks; scope B's fsync of one block returns while most of A's blocks still wait (before, B's
/// block queued behind all of A's at the slots).
#[test]
fn one_scopes_upload_backlog_leaves_another_scopes_fsync_its_turn() {
    let mut settings = Harness::small_blocks().settings;
    (settings.upload_parallelism, settings.upload_parallelism_per_scope) = (2, 1);
    settings.upload_delay = Duration::from_secs(60);
    let h = Harness::new(settings);
    let storage = h.storage();
    let (a, b) = (new_scope(&storage), new_scope(&storage));
    let distinct: Vec<u8> = (0..40u32).flat_map(|k| k.to_le_bytes().into_iter().chain(pattern(60, 1))).collect();
    write_file(&a, "backlog", &distinct).unwrap();
    write_file(&b, "one", &pattern(64, 2)).unwrap();
    let (ino_a, ino_b) = (resolve(&a, "backlog").unwrap(), resolve(&b, "one").unwrap());
    h.store.set_stall(Some(Duration::from_millis(20)));
    std::thread::scope(|s| {
        let backlog = s.spawn(|| a.fsync(ino_a, None));
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.store.put_count() == 0 {
            assert!(Instant::now() < deadline, "scope A's uploads never started");
            std::thread::yield_now();
        }
        b.fsync(ino_b, None).unwrap();
        let puts = h.store.put_count();
        assert!(puts < 20, "scope B's fsync waited for {puts} puts of scope A's 40");
        backlog.join().unwrap().unwrap();
    });
    assert_eq!(h.store.put_count(), 41, "every block of both scopes is stored once");
}

#[test]
fn uncached_reads_download_within_the_fetch_memory_budget() {
    // Room for one block's download (a fetch holds the block and its copy): readers of three
    // uncached blocks download them one at a time.
    let h = Harness::new(StorageSettings {
        block_size: 64,
        fetch_memory_max_bytes: 2 * 64,
        readahead_blocks: 0,
        store_timeout: Duration::from_secs(60),
        store_attempts: 1,
        ..StorageSettings::default()
    });
    let storage = h.storage();
    let e = new_scope(&storage);
    for i in 0..3u8 {
        write_file(&e, &format!("f{i}"), &pattern(64, i)).unwrap();
    }
    assert!(e.wait_uploads(Duration::from_secs(5)));
    let store = Arc::new(GatedStore::new(h.store.clone(), PeakGate::new(2, Duration::from_secs(1)), true));
    let dir = tempfile::tempdir().unwrap();
    let meta_dir = dir.path().join("scopes").join(e.scope_id().as_str());
    std::fs::create_dir_all(&meta_dir).unwrap();
    e.copy_metadata_to(&meta_dir.join("meta.sqlite3")).unwrap();
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let fresh = Storage::new(dyn_store, h.settings.clone(), dir.path(), h.rt.handle().clone()).unwrap();
    let e2 = fresh.open_scope(e.scope_id(), big_quota()).unwrap();
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..3u8)
            .map(|i| {
                (
                    i,
                    s.spawn({
                        let e2 = &e2;
                        move || read_file(e2, &format!("f{i}"))
                    }),
                )
            })
            .collect();
        for (i, r) in readers {
            assert_eq!(r.join().unwrap().unwrap(), pattern(64, i));
        }
    });
    assert_eq!(store.gate.peak(), 1, "downloads beyond the fetch budget ran at once");
}

/// Calls that wait until `released` (bounded), counting how many wait at once.
#[derive(Default)]
struct HeldGate {
    in_flight: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
    released: tokio::sync::watch::Sender<bool>,
}

impl HeldGate {
    fn in_flight(&self) -> usize {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Gate for HeldGate {
    async fn pass(&self) {
        use std::sync::atomic::Ordering;
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let mut rx = self.released.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|r| *r)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One scope's downloads hold at most its share of the fetch budget (`fetch_memory_per_scope_bytes`):
/// while scope A's readers of eight uncached blocks wait on a slow store, scope B's uncached read
/// still finds room and is answered (it used to wait behind A's downloads, first come, first
/// served), and A never has more downloads in flight than its share holds.
#[test]
fn one_scopes_slow_downloads_leave_the_other_scopes_room_to_download() {
    let h = Harness::new(StorageSettings {
        block_size: 64,
        fetch_memory_max_bytes: 8 * 2 * 64,
        fetch_memory_per_scope_bytes: 2 * 2 * 64,
        readahead_blocks: 0,
        store_timeout: Duration::from_secs(60),
        store_attempts: 1,
        ..StorageSettings::default()
    });
    let storage = h.storage();
    let (a, b) = (new_scope(&storage), new_scope(&storage));
    for i in 0..8u8 {
        write_file(&a, &format!("f{i}"), &pattern(64, i)).unwrap();
    }
    write_file(&b, "g", &pattern(64, 99)).unwrap();
    assert!(a.wait_uploads(Duration::from_secs(5)) && b.wait_uploads(Duration::from_secs(5)));
    let store = Arc::new(GatedStore {
        only: block_key(a.scope_id().as_str(), ""),
        ..GatedStore::new(h.store.clone(), HeldGate::default(), true)
    });
    let dir = tempfile::tempdir().unwrap();
    for e in [&a, &b] {
        let meta_dir = dir.path().join("scopes").join(e.scope_id().as_str());
        std::fs::create_dir_all(&meta_dir).unwrap();
        e.copy_metadata_to(&meta_dir.join("meta.sqlite3")).unwrap();
    }
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let fresh = Storage::new(dyn_store, h.settings.clone(), dir.path(), h.rt.handle().clone()).unwrap();
    let (a2, b2) =
        (fresh.open_scope(a.scope_id(), big_quota()).unwrap(), fresh.open_scope(b.scope_id(), big_quota()).unwrap());
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..8u8)
            .map(|i| {
                let a2 = &a2;
                (i, s.spawn(move || read_file(a2, &format!("f{i}"))))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.gate.in_flight() < 2 {
            assert!(Instant::now() < deadline, "A's downloads never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = &b2;
        s.spawn(move || tx.send(read_file(b2, "g")).unwrap());
        let got = rx.recv_timeout(Duration::from_secs(10));
        store.gate.released.send_replace(true);
        let got = got.expect("B's uncached read waited for A's downloads");
        assert_eq!(got.unwrap(), pattern(64, 99));
        for (i, r) in readers {
            assert_eq!(r.join().unwrap().unwrap(), pattern(64, i));
        }
    });
    assert_eq!(store.gate.peak.load(std::sync::atomic::Ordering::SeqCst), 2, "A's downloads in flight at once");
}
