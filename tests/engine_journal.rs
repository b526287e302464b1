//! The inline journal (issue 10, small-file speed): a small file's block stays in memory while the
//! file is open and is journaled in the metadata commit at close, so closing it creates no staging
//! file; it is read back, survives a restart (recovered eagerly, uploads resumed), leaves staging
//! once uploaded or collected, and a block that outgrows the bound or the memory budget is a
//! staging file as before.

pub mod engine_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::{block_key, ObjectStore};
use sha2::{Digest, Sha256};

fn entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Files of one scope's staging (`blocks/` and `open/`).
fn staging_files(h: &Harness, id: &ScopeId) -> Vec<PathBuf> {
    let dir = h.data_dir().join("staging").join(id.as_str());
    let mut all = entries(&dir.join("blocks"));
    all.extend(entries(&dir.join("open")));
    all
}

fn marker(h: &Harness, id: &ScopeId) -> PathBuf {
    h.data_dir().join("staging").join(id.as_str()).join("inline-journal")
}

/// A storage on its own runtime, so dropping it ends every task it started (a killed daemon).
fn daemon(h: &Harness) -> (tokio::runtime::Runtime, Arc<Storage>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let storage = Storage::new(store, h.settings.clone(), &h.data_dir(), rt.handle().clone()).unwrap();
    (rt, storage)
}

fn content(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[test]
fn a_closed_small_file_is_journaled_inline_and_survives_a_restart() {
    let h = Harness::new(StorageSettings::default());
    let id = ScopeId::generate();
    let data = content(4096, 1);
    h.store.set_unavailable(true); // nothing leaves the journal until the store comes back
    {
        let (rt, storage) = daemon(&h);
        let e = storage.open_scope(&id, big_quota()).unwrap();
        write_file(&e, "small.txt", &data).unwrap();
        assert!(staging_files(&h, &id).is_empty(), "close created a staging file: {:?}", staging_files(&h, &id));
        assert_eq!(e.staging_bytes(), 4096, "the inline block counts against staging");
        assert_eq!(storage.staging_bytes(), 4096);
        assert_eq!(read_file(&e, "small.txt").unwrap(), data);
        assert!(marker(&h, &id).exists(), "the marker makes a restart recover the scope eagerly");
        assert_eq!(e.pending_uploads(), 1);
        drop(e);
        drop(storage);
        rt.shutdown_background(); // killed with the upload still queued
    }
    // The restarted daemon has no staging file for it: the block comes from the metadata database.
    let (_rt, storage) = daemon(&h);
    let e = storage.open_scope(&id, big_quota()).unwrap();
    assert_eq!(e.staging_bytes(), 4096, "recovered rows are charged again");
    assert_eq!(e.pending_uploads(), 1, "the journaled upload was queued again");
    assert_eq!(read_file(&e, "small.txt").unwrap(), data);
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
    let key = block_key(id.as_str(), &sha(&data));
    assert!(h.store.keys().contains(&key), "uploaded under its hash");
    assert_eq!(e.staging_bytes(), 0, "the uploaded block left staging");
    assert_eq!(storage.staging_bytes(), 0);
    assert_eq!(read_file(&e, "small.txt").unwrap(), data, "read from the cache or the store now");
    let report = e.fsck(false).unwrap();
    assert!(report.damaged_files.is_empty() && report.metadata_problems.is_empty(), "{report:?}");
    drop(e);
    drop(storage);
    // Nothing inline is left: the next start removes the marker.
    let (_rt2, storage) = daemon(&h);
    let e = storage.open_scope(&id, big_quota()).unwrap();
    assert_eq!(read_file(&e, "small.txt").unwrap(), data);
    drop(e);
    assert!(!marker(&h, &id).exists());
}

#[test]
fn a_block_that_outgrows_the_inline_bound_becomes_a_staging_file() {
    let settings = StorageSettings { block_size: 64 * 1024, inline_block_max_bytes: 1024, ..Default::default() };
    let h = Harness::new(settings);
    h.store.set_unavailable(true);
    let storage = h.storage();
    let e = new_scope(&storage);
    let id = e.scope_id().clone();
    let (attr, opened) = e
        .create(ROOT_INO, b"grows", 0o644, OpenFlags { write: true, truncate: false, exclusive: false }, OWNER)
        .unwrap();
    let head = content(512, 2);
    e.write(attr.ino, opened.fh, 0, &head).unwrap();
    assert!(staging_files(&h, &id).is_empty(), "512 bytes stay in memory");
    assert_eq!(e.read(attr.ino, opened.fh, 0, 512).unwrap(), head, "read back from memory before close");
    let tail = content(4096, 3);
    e.write(attr.ino, opened.fh, 512, &tail).unwrap();
    assert_eq!(staging_files(&h, &id).len(), 1, "past 1 KiB the block is a working file in open/");
    e.release(attr.ino, opened.fh).unwrap();
    let files = staging_files(&h, &id);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].parent().unwrap().ends_with("blocks"), "sealed as a journal file: {files:?}");
    let mut whole = head.clone();
    whole.extend_from_slice(&tail);
    assert_eq!(read_file(&e, "grows").unwrap(), whole);
    assert_eq!(e.staging_bytes(), whole.len() as u64);
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
    assert_eq!(e.staging_bytes(), 0);
}

#[test]
fn without_room_in_the_memory_budget_small_blocks_are_staging_files() {
    let settings = StorageSettings { dirty_memory_max_bytes: 0, ..Default::default() };
    let h = Harness::new(settings);
    h.store.set_unavailable(true);
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "a", &content(100, 4)).unwrap();
    assert_eq!(staging_files(&h, &e.scope_id().clone()).len(), 1, "a journal file, as before the inline journal");
    assert_eq!(storage.dirty_memory_bytes(), 0);
    assert_eq!(read_file(&e, "a").unwrap(), content(100, 4));
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
}

#[test]
fn memory_of_dirty_blocks_is_bounded_and_given_back() {
    let settings = StorageSettings { dirty_memory_max_bytes: 8 * 1024, ..Default::default() };
    let h = Harness::new(settings);
    h.store.set_unavailable(true);
    let storage = h.storage();
    let e = new_scope(&storage);
    let flags = OpenFlags { write: true, truncate: false, exclusive: false };
    let mut open = Vec::new();
    // Five open files of 4 KiB each: two fit the 8 KiB budget, the other three use staging files.
    for i in 0..5u8 {
        let (attr, opened) = e.create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, flags, OWNER).unwrap();
        e.write(attr.ino, opened.fh, 0, &content(4096, i)).unwrap();
        assert!(storage.dirty_memory_bytes() <= 8 * 1024, "{}", storage.dirty_memory_bytes());
        open.push((attr.ino, opened.fh));
    }
    assert_eq!(storage.dirty_memory_bytes(), 8 * 1024);
    assert_eq!(staging_files(&h, &e.scope_id().clone()).len(), 3, "three working files in open/");
    for (ino, fh) in open {
        e.release(ino, fh).unwrap();
    }
    assert_eq!(storage.dirty_memory_bytes(), 0, "closing gives the memory back");
    for i in 0..5u8 {
        assert_eq!(read_file(&e, &format!("f{i}")).unwrap(), content(4096, i));
    }
    // An open file whose last handle goes without a commit (unlinked) gives it back as well.
    let (attr, opened) = e.create(ROOT_INO, b"gone", 0o644, flags, OWNER).unwrap();
    e.write(attr.ino, opened.fh, 0, b"x").unwrap();
    assert_eq!(storage.dirty_memory_bytes(), 1);
    e.unlink(ROOT_INO, b"gone").unwrap();
    e.release(attr.ino, opened.fh).unwrap();
    assert_eq!(storage.dirty_memory_bytes(), 0);
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
    assert_eq!(e.staging_bytes(), 0);
}

#[test]
fn collected_inline_blocks_leave_the_journal_and_staging() {
    let h = Harness::new(StorageSettings::default());
    h.store.set_unavailable(true);
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "v", &content(3000, 5)).unwrap();
    write_file(&e, "v", &content(2000, 6)).unwrap(); // the first version's block is unreferenced
    write_file(&e, "same", &content(2000, 6)).unwrap(); // identical block: journaled once
    assert_eq!(e.staging_bytes(), 5000, "3000 + 2000: the duplicate is not charged twice");
    let report = e.collect_garbage(Duration::ZERO).unwrap();
    assert_eq!(report.blocks_deleted, 1);
    assert_eq!(e.staging_bytes(), 2000, "the collected block left staging");
    assert_eq!(read_file(&e, "v").unwrap(), content(2000, 6));
    assert_eq!(read_file(&e, "same").unwrap(), content(2000, 6));
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
    assert_eq!(e.staging_bytes(), 0);
    assert_eq!(h.store.keys().len(), 1, "only the live block was uploaded: {:?}", h.store.keys());
}

/// A store that, when a delete arrives, records whether the metadata that survives a power loss
/// (the database file and its WAL; never the redo log, which is not flushed) still holds the block's
/// row: an object must be deleted only once its row's deletion is there (review D6).
struct DeleteProbe {
    inner: Arc<scopefs::store::MemoryStore>,
    data_dir: PathBuf,
    /// (key, whether the row was still in the database file and WAL when the delete arrived).
    deletes: parking_lot::Mutex<Vec<(String, bool)>>,
}

impl DeleteProbe {
    /// Whether the copy of the scope's database file and WAL has the row of block `key`.
    fn row_in_database(&self, key: &str) -> bool {
        let parts: Vec<&str> = key.split('/').collect();
        let (scope, sha) = (parts[1], parts[3]);
        let db = self.data_dir.join("scopes").join(scope).join("meta.sqlite3");
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(&db, copy.path().join("meta.sqlite3")).unwrap();
        let wal = PathBuf::from(format!("{}-wal", db.display()));
        if wal.exists() {
            std::fs::copy(&wal, copy.path().join("meta.sqlite3-wal")).unwrap();
        }
        let conn = rusqlite::Connection::open(copy.path().join("meta.sqlite3")).unwrap();
        let rows: i64 = conn.query_row("SELECT count(*) FROM blocks WHERE sha256 = ?1", [sha], |r| r.get(0)).unwrap();
        rows > 0
    }
}

#[async_trait::async_trait]
impl ObjectStore for DeleteProbe {
    async fn put(&self, key: &str, data: bytes::Bytes) -> Result<(), scopefs::store::StoreError> {
        self.inner.put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<bytes::Bytes, scopefs::store::StoreError> {
        self.inner.get(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<u64>, scopefs::store::StoreError> {
        self.inner.head(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), scopefs::store::StoreError> {
        let row = self.row_in_database(key);
        self.deletes.lock().push((key.to_string(), row));
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<scopefs::store::ObjectInfo>, scopefs::store::StoreError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "delete probe".to_string()
    }
}

#[test]
fn gc_deletes_an_object_only_after_the_deletion_of_its_row_is_durable() {
    let h = Harness::new(StorageSettings::default());
    let probe = Arc::new(DeleteProbe {
        inner: h.store.clone(),
        data_dir: h.data_dir(),
        deletes: parking_lot::Mutex::new(Vec::new()),
    });
    let store: Arc<dyn ObjectStore> = probe.clone();
    let storage = Storage::new(store, h.settings.clone(), &h.data_dir(), h.rt.handle().clone()).unwrap();
    let e = new_scope(&storage);
    // An inline block and a staging file, both uploaded, then both unreferenced.
    write_file(&e, "small", &content(3000, 1)).unwrap();
    write_file(&e, "large", &content(300_000, 2)).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(20)));
    write_file(&e, "small", &content(3000, 3)).unwrap();
    write_file(&e, "large", &content(300_000, 4)).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(20)));
    let old: Vec<String> = [sha(&content(3000, 1)), sha(&content(300_000, 2))]
        .iter()
        .map(|s| block_key(e.scope_id().as_str(), s))
        .collect();
    for key in &old {
        assert!(h.store.keys().contains(key), "{key} was not uploaded: {:?}", h.store.keys());
    }
    // The batch before gc is committed, so what gc's row deletions do is all that is pending.
    e.checkpoint_metadata().unwrap();
    let report = e.collect_garbage(Duration::ZERO).unwrap();
    assert_eq!(report.blocks_deleted, 2);
    let deletes = probe.deletes.lock().clone();
    let mut keys: Vec<String> = deletes.iter().map(|(k, _)| k.clone()).collect();
    keys.sort();
    let mut want = old.clone();
    want.sort();
    assert_eq!(keys, want, "gc deleted other objects");
    for (key, row_left) in &deletes {
        assert!(!row_left, "{key} was deleted while its row's deletion was not yet in the database");
    }
    for key in &old {
        assert!(!h.store.keys().contains(key), "{key} is still stored");
    }
    assert_eq!(read_file(&e, "small").unwrap(), content(3000, 3));
    assert_eq!(read_file(&e, "large").unwrap(), content(300_000, 4));
}
