//! `Storage`: what all scopes of one daemon share — the object store (with timeout and retries), block cache, runtime and staging accounting.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::cache::BlockCache;
use super::census::StagingCensus;
use super::error::{EngineError, EngineResult};
use super::scope::ScopeEngine;
use super::types::{Quota, StorageSettings};
use crate::ids::ScopeId;
use crate::scope_locks::ScopeLocks;
use crate::store::{ObjectStore, StoreError};

pub struct Storage {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) settings: StorageSettings,
    pub(crate) data_dir: PathBuf,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) cache: BlockCache,
    pub(crate) upload_slots: Arc<tokio::sync::Semaphore>,
    /// Bytes of blocks being fetched from the store (`fetch_memory_max_bytes`; one permit a byte).
    fetch_memory: Arc<tokio::sync::Semaphore>,
    staging_bytes: AtomicU64,
    /// Bytes of dirty blocks kept in memory (`dirty_memory_max_bytes`).
    dirty_memory: AtomicU64,
    prefetching: Mutex<HashSet<(String, String)>>,
    /// Large blocks of a local object directory whose bytes were checked against their SHA-256 (by
    /// a read, or sealed before their upload): read in place (`read_local_range`) instead of being
    /// copied into the block cache.
    verified_local: Mutex<VerifiedBlocks>,
    scopes: Mutex<HashMap<ScopeId, Weak<ScopeEngine>>>,
    /// Held while a scope opens: one scope opens once at a time, and different scopes open in
    /// parallel (thousands at once after a restart).
    opening: ScopeLocks,
    /// Each scope's staging census taken at startup, until the scope's first open takes it.
    census: Mutex<HashMap<String, StagingCensus>>,
    /// Metadata databases open at once (`limits.max_open_scope_databases`).
    pub(crate) meta_budget: Arc<super::lazy_meta::MetaBudget>,
    /// Bytes of listings held at once, daemon-wide and per scope (`listing.rs`).
    pub(crate) listing_memory: Arc<super::listing::ListingMemory>,
    /// With several nodes: who serves each scope, and the registry's record of its chain.
    fence: std::sync::OnceLock<Arc<dyn super::fence::ShipFence>>,
    /// Which scopes refer to which blocks of others (forks, snapshots): `fork.rs`.
    pub(crate) shared: std::sync::OnceLock<Arc<dyn super::fork::SharedBlocks>>,
}

/// The file in a scope's metadata directory naming the epoch it was served under (`local_epoch`).
const EPOCH_FILE: &str = "node-epoch";

/// Largest block of a local object directory that a read fetches again (and verifies) rather
/// than reading in place once verified.
const LOCAL_REREAD_MAX_BYTES: usize = 128 * 1024;
/// Verified local blocks remembered (the oldest is forgotten first; about 100 bytes each).
const VERIFIED_KEPT: usize = 4096;

/// A bounded set of blocks' object keys (`store::block_key`), forgetting the oldest first.
#[derive(Default)]
struct VerifiedBlocks {
    set: HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl VerifiedBlocks {
    fn insert(&mut self, key: String) {
        if self.set.insert(key.clone()) {
            self.order.push_back(key);
            while self.order.len() > VERIFIED_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }

    fn remove(&mut self, key: &str) {
        if self.set.remove(key) {
            self.order.retain(|k| k != key);
        }
    }
}

impl Storage {
    /// Opens the shared storage rooted at `data_dir` (`staging/`, `cache/`, `scopes/` below it).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        settings: StorageSettings,
        data_dir: &Path,
        runtime: tokio::runtime::Handle,
    ) -> EngineResult<Arc<Storage>> {
        for sub in ["staging", "cache", "scopes"] {
            private_dir(&data_dir.join(sub))?;
        }
        let cache = BlockCache::open(data_dir.join("cache"), settings.cache_max_bytes)?;
        // Kernel-bound (directory reads): more walkers than cores still help.
        let walkers = std::thread::available_parallelism().map_or(2, |n| n.get() * 2).min(16);
        let (census, staging_bytes) = super::census::take_all(&data_dir.join("staging"), walkers);
        let meta_budget =
            super::lazy_meta::MetaBudget::new(settings.max_open_scope_databases, settings.metadata_cache_max_bytes);
        meta_budget.start_flusher()?;
        let listing_memory = Arc::new(super::listing::ListingMemory::new(
            settings.max_listing_bytes,
            settings.listing_memory_per_scope_bytes,
            settings.listing_memory_max_bytes,
        ));
        Ok(Arc::new(Storage {
            store,
            upload_slots: Arc::new(tokio::sync::Semaphore::new(settings.upload_parallelism)),
            fetch_memory: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(settings.fetch_memory_max_bytes)
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            settings,
            data_dir: data_dir.to_path_buf(),
            rt: runtime,
            cache,
            staging_bytes: AtomicU64::new(staging_bytes),
            dirty_memory: AtomicU64::new(0),
            prefetching: Mutex::new(HashSet::new()),
            verified_local: Mutex::new(VerifiedBlocks::default()),
            scopes: Mutex::new(HashMap::new()),
            opening: ScopeLocks::default(),
            census: Mutex::new(census),
            meta_budget,
            listing_memory,
            fence: std::sync::OnceLock::new(),
            shared: std::sync::OnceLock::new(),
        }))
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub fn settings(&self) -> &StorageSettings {
        &self.settings
    }

    /// Bytes of listings held now (daemon-wide).
    pub fn listing_bytes_held(&self) -> u64 {
        self.listing_memory.held()
    }

    /// Opens (creating if needed) one scope's engine; replays its upload journal and drops orphans.
    /// Opening a scope that is already open returns the same engine.
    pub fn open_scope(self: &Arc<Self>, scope_id: &ScopeId, quota: Quota) -> EngineResult<Arc<ScopeEngine>> {
        self.open_scope_as(scope_id, quota, false)
    }

    /// `open_scope` of a scope whose mount an earlier process served and this one serves on (the
    /// kernel may still hold its files open, unlinked ones too): nothing the kernel may hold is
    /// collected (see `ScopeEngine::forget`).
    pub fn open_scope_resumed(self: &Arc<Self>, scope_id: &ScopeId, quota: Quota) -> EngineResult<Arc<ScopeEngine>> {
        self.open_scope_as(scope_id, quota, true)
    }

    fn open_scope_as(
        self: &Arc<Self>,
        scope_id: &ScopeId,
        quota: Quota,
        resumed: bool,
    ) -> EngineResult<Arc<ScopeEngine>> {
        let _opening = self.opening.of(scope_id).lock();
        if let Some(engine) = self.scopes.lock().get(scope_id).and_then(Weak::upgrade) {
            engine.set_quota(quota);
            return Ok(engine);
        }
        let engine = ScopeEngine::open_new(self.clone(), scope_id.clone(), quota, resumed)?;
        self.scopes.lock().insert(scope_id.clone(), Arc::downgrade(&engine));
        Ok(engine)
    }

    /// The census of a scope's staging directory: the one taken at startup, the first time the
    /// scope opens (nothing but its engine writes there, and it was not open), else a new walk.
    pub(crate) fn staging_census(&self, scope: &str) -> StagingCensus {
        let taken = self.census.lock().remove(scope);
        taken.unwrap_or_else(|| StagingCensus::of(&self.scope_staging_dir(scope)))
    }

    /// Deletes every object of a scope from the store (blocking), each request under the store's
    /// timeout and retry policy; returns the number of objects deleted. Idempotent.
    pub fn purge_objects(&self, scope_id: &ScopeId) -> EngineResult<u64> {
        let prefix = crate::store::scope_prefix(scope_id.as_str());
        let attempts = self.settings.store_attempts;
        // Blocks a fork or a snapshot still refers to stay; the last to let go deletes each.
        // (Under any epoch's key: the holder's row names the key it reads.)
        let held: HashSet<String> = self.held_blocks(scope_id.as_str())?;
        let block_of = |key: &str| crate::store::block_of_key(scope_id.as_str(), key).map(|(sha, _)| sha.to_string());
        self.rt.block_on(async {
            let objects = self.with_retry(attempts, || self.store.list(&prefix)).await?;
            let mut deleted = 0;
            for obj in objects.iter().filter(|o| block_of(&o.key).is_none_or(|sha| !held.contains(&sha))) {
                self.with_retry(attempts, || self.store.delete(&obj.key)).await?;
                deleted += 1;
            }
            Ok(deleted)
        })
    }

    /// Forgets a closed scope and deletes its local metadata, staging and cache (objects stay in the store).
    pub fn remove_scope_local(&self, scope_id: &ScopeId) -> EngineResult<()> {
        let _opening = self.opening.of(scope_id).lock();
        self.scopes.lock().remove(scope_id);
        let id = scope_id.as_str();
        self.census.lock().remove(id);
        self.cache.remove_scope(id);
        let staging = self.scope_staging_dir(id);
        self.staging_sub(dir_size(&staging));
        for dir in [staging, self.scope_meta_dir(id)] {
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// The fencing epoch under which this data directory last served `scope` (several nodes:
    /// a local database of another epoch is not the scope's state); `None` when never noted.
    pub fn local_epoch(&self, scope_id: &ScopeId) -> Option<u64> {
        let text = std::fs::read_to_string(self.scope_meta_dir(scope_id.as_str()).join(EPOCH_FILE)).ok()?;
        text.trim().parse().ok()
    }

    /// Notes (durably) that this data directory serves `scope` under `epoch`.
    pub fn set_local_epoch(&self, scope_id: &ScopeId, epoch: u64) -> EngineResult<()> {
        let dir = self.scope_meta_dir(scope_id.as_str());
        let tmp = dir.join(format!("{EPOCH_FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, epoch.to_string().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(EPOCH_FILE))?;
        std::fs::File::open(&dir)?.sync_all()?;
        Ok(())
    }

    /// Names of the local scope directories (metadata under `scopes/`, staging under `staging/`),
    /// sorted and deduplicated; the maintenance pass compares them with the registry.
    pub fn local_scope_dirs(&self) -> std::io::Result<Vec<String>> {
        let mut names = std::collections::BTreeSet::new();
        for sub in ["scopes", "staging"] {
            for entry in std::fs::read_dir(self.data_dir.join(sub))? {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    names.insert(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Whether `scope_id` has a local metadata directory.
    pub fn has_local_metadata(&self, scope_id: &ScopeId) -> bool {
        self.scope_meta_dir(scope_id.as_str()).is_dir()
    }

    /// Bytes currently held in staging across all scopes.
    pub fn staging_bytes(&self) -> u64 {
        self.staging_bytes.load(Ordering::Relaxed)
    }

    /// Bytes held by the block cache.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.total_bytes()
    }

    /// Cache hits and misses so far.
    pub fn cache_counts(&self) -> (u64, u64) {
        (self.cache.stats.hits.load(Ordering::Relaxed), self.cache.stats.misses.load(Ordering::Relaxed))
    }

    /// Restores a scope's metadata database at `db_path` from the bucket (`restore.rs`); `false`
    /// when the bucket holds none of it.
    pub(crate) fn restore_scope_now(&self, scope: &str, db_path: &Path) -> EngineResult<bool> {
        let upto = match self.fence() {
            Some(fence) => {
                Some(fence.recorded(scope).map_err(|e| EngineError::Store(crate::store::StoreError::Unavailable(e)))?)
            }
            None => None,
        };
        let restored = self.rt.block_on(super::restore::restore_scope(&*self.store, scope, db_path, upto))?;
        if let Some(r) = &restored {
            tracing::info!(
                scope,
                seq = r.seq,
                objects = r.objects,
                blocks_missing = r.blocks_missing,
                "restored a scope's metadata from the object store"
            );
        }
        Ok(restored.is_some())
    }

    /// Several nodes serve this deployment: `fence` says which scopes this one serves and records
    /// their shipped heads (set once, before any scope opens).
    pub fn set_ship_fence(&self, fence: Arc<dyn super::fence::ShipFence>) {
        let _ = self.fence.set(fence);
    }

    pub(crate) fn fence(&self) -> Option<&Arc<dyn super::fence::ShipFence>> {
        self.fence.get()
    }

    pub(crate) fn scope_meta_dir(&self, scope: &str) -> PathBuf {
        self.data_dir.join("scopes").join(scope)
    }

    pub(crate) fn scope_staging_dir(&self, scope: &str) -> PathBuf {
        self.data_dir.join("staging").join(scope)
    }

    /// Claims `n` more bytes of staging; `NoSpace` past `staging_max_bytes`. Scopes claim through
    /// `ScopeEngine::staging_add`, which also applies the per-scope budget.
    pub(crate) fn staging_add(&self, n: u64) -> EngineResult<()> {
        let max = self.settings.staging_max_bytes;
        self.staging_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| cur.checked_add(n).filter(|total| *total <= max))
            .map(|_| ())
            .map_err(|_| {
                crate::limits::refuse(crate::limits::Bound::StagingGlobal);
                EngineError::NoSpace
            })
    }

    pub(crate) fn staging_sub(&self, n: u64) {
        let _ = self.staging_bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| Some(cur.saturating_sub(n)));
    }

    /// Charges `n` bytes of dirty blocks kept in memory; `false` when the daemon-wide budget
    /// (`dirty_memory_max_bytes`) has no room (the block then lives in a staging file).
    pub(crate) fn dirty_memory_charge(&self, n: u64) -> bool {
        let max = self.settings.dirty_memory_max_bytes;
        self.dirty_memory
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| cur.checked_add(n).filter(|t| *t <= max))
            .is_ok()
    }

    pub(crate) fn dirty_memory_release(&self, n: u64) {
        let _ = self.dirty_memory.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| Some(cur.saturating_sub(n)));
    }

    /// Bytes of dirty blocks held in memory by every scope.
    pub fn dirty_memory_bytes(&self) -> u64 {
        self.dirty_memory.load(Ordering::Relaxed)
    }

    /// Runs one store request with the configured timeout, retrying transient failures `attempts` times.
    pub(crate) async fn with_retry<T, F, Fut>(&self, attempts: u32, op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        retry_store(self.settings.store_timeout, attempts, op).await
    }

    /// Downloads one block, verifies its SHA-256 and caches it; foreground (bounded attempts). A
    /// local directory answers on this thread and its blocks are not copied into the cache: a
    /// large one, once verified, is read in place (`read_local_range`); a small one is cheaper to
    /// read and hash again.
    pub(crate) fn fetch_block(&self, scope: &str, key: &str, share: &Semaphore, sha: &str) -> EngineResult<Vec<u8>> {
        let _room = self.fetch_room(share)?;
        let data = match self.store.get_now(key) {
            Some(read) => read?,
            None => self.rt.block_on(self.with_retry(self.settings.store_attempts, || self.store.get(key)))?,
        };
        if hex::encode(Sha256::digest(&data)) != sha {
            return Err(EngineError::Corrupt { sha256: sha.to_string() });
        }
        self.keep_fetched(scope, key, sha, &data)?;
        Ok(data.to_vec())
    }

    /// A fetched and verified block: into the cache, or for a local directory's large block, into
    /// the set of blocks read in place.
    fn keep_fetched(&self, scope: &str, key: &str, sha: &str, data: &[u8]) -> EngineResult<()> {
        if !self.store.reads_are_local() {
            self.cache.insert_bytes(scope, sha, data)?;
        } else if data.len() > LOCAL_REREAD_MAX_BYTES {
            self.verified_local.lock().insert(key.to_string());
        }
        Ok(())
    }

    /// A block a local object directory stored from bytes whose hash was checked when they were
    /// sealed: a large one is read in place from now on, without a verifying read first.
    pub(crate) fn verified_upload(&self, key: &str, len: u64) {
        if len > LOCAL_REREAD_MAX_BYTES as u64 {
            self.verified_local.lock().insert(key.to_string());
        }
    }

    /// Fills `buf` from `offset` of a block of a local object directory that a read verified
    /// before, in place; `false` when the block is not one (the caller fetches and verifies it).
    pub(crate) fn read_local_range(&self, key: &str, offset: u64, buf: &mut [u8]) -> EngineResult<bool> {
        if !self.store.reads_are_local() || !self.verified_local.lock().contains(key) {
            return Ok(false);
        }
        match self.store.read_at_now(key, offset, buf) {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => {
                // Gone or changed underneath: fetched and verified again, which reports it.
                self.verified_local.lock().remove(key);
                tracing::warn!(error = %e, "reading a verified local block in place failed");
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// Room for one block's download and its copy in the scope's `share`, then in
    /// `fetch_memory_max_bytes`, each waited for (in arrival order) on this blocking thread while
    /// other downloads hold it.
    pub(crate) fn fetch_room<'a>(&'a self, share: &'a Semaphore) -> EngineResult<[SemaphorePermit<'a>; 2]> {
        let closed = |_| EngineError::Io(std::io::Error::other("the fetch budget is closed"));
        let charge = self.fetch_charge();
        let own = self.rt.block_on(share.acquire_many(charge)).map_err(closed)?;
        let all = self.rt.block_on(self.fetch_memory.acquire_many(charge)).map_err(closed)?;
        Ok([own, all])
    }

    /// Permits one fetch holds: two blocks (the store's bytes and the copy handed to the reader),
    /// at most the whole budget.
    fn fetch_charge(&self) -> u32 {
        let want = 2 * self.settings.block_size;
        u32::try_from(want.min(self.settings.fetch_memory_max_bytes)).unwrap_or(u32::MAX)
    }

    /// Starts background downloads of blocks a sequential reader will want next, each under
    /// `scope`'s prefix at the key of fencing epoch `epoch`.
    pub(crate) fn prefetch(self: &Arc<Self>, (scope, epoch): (&str, u64), share: &Arc<Semaphore>, shas: Vec<String>) {
        for sha in shas {
            let obj = crate::store::block_key_at(scope, epoch, &sha);
            let kept = self.cache.size_of(scope, &sha).is_some() || self.verified_local.lock().contains(&obj);
            let key = (scope.to_string(), sha);
            let mut prefetching = self.prefetching.lock();
            if kept || prefetching.contains(&key) {
                continue;
            }
            // Readahead only uses room nobody waits for: without it, the block is read when asked.
            let charge = self.fetch_charge();
            let Ok(own) = share.clone().try_acquire_many_owned(charge) else { return };
            let Ok(room) = self.fetch_memory.clone().try_acquire_many_owned(charge) else { return };
            prefetching.insert(key.clone());
            drop(prefetching);
            let this = self.clone();
            self.rt.spawn(async move {
                let _room = (own, room);
                if let Ok(data) = this.with_retry(1, || this.store.get(&obj)).await {
                    if hex::encode(Sha256::digest(&data)) == key.1 {
                        let _ = this.keep_fetched(&key.0, &obj, &key.1, &data);
                    }
                }
                this.prefetching.lock().remove(&key);
            });
        }
    }
}

/// Creates `dir` (and missing parents) readable by the daemon's user only, each new one's name
/// made durable in its parent (`durable_dirs`), and makes an existing one private too: staging,
/// cache and metadata hold every tenant's data.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    crate::durable_dirs::create_private_dir(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Bytes of the files below `dir`.
pub(crate) fn dir_size(dir: &Path) -> u64 {
    super::census::tree_size(dir).0
}

/// A scope's shares of the storage's upload slots and download memory: taken before the storage's
/// own, so one scope's backlog waits here and other scopes take turns at the rest.
pub(crate) struct StoreShares {
    /// Upload slots (`upload_parallelism_per_scope`, at most `upload_parallelism`).
    pub upload: Semaphore,
    /// Bytes of downloads (`fetch_memory_per_scope_bytes`, at least one download's).
    pub fetch: Arc<Semaphore>,
}

impl StoreShares {
    pub(crate) fn of(storage: &Storage) -> StoreShares {
        let s = &storage.settings;
        let fetch = usize::try_from(s.fetch_memory_per_scope_bytes).unwrap_or(usize::MAX);
        StoreShares {
            upload: Semaphore::new(s.upload_parallelism_per_scope.clamp(1, s.upload_parallelism.max(1))),
            fetch: Arc::new(Semaphore::new(fetch.max(storage.fetch_charge() as usize).min(Semaphore::MAX_PERMITS))),
        }
    }
}

impl ScopeEngine {
    /// Claims `n` more bytes of staging for this scope: `NoSpace` past the scope's budget
    /// (`staging_max_bytes_per_scope`) or the daemon's (`staging_max_bytes`).
    pub(crate) fn staging_add(&self, n: u64) -> EngineResult<()> {
        let max = self.storage.settings.staging_max_bytes_per_scope;
        self.staged_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| cur.checked_add(n).filter(|t| *t <= max))
            .map_err(|_| {
                crate::limits::refuse(crate::limits::Bound::StagingPerScope);
                EngineError::NoSpace
            })?;
        if let Err(e) = self.storage.staging_add(n) {
            self.staged_sub_local(n);
            return Err(e);
        }
        Ok(())
    }

    /// Gives back `n` bytes of this scope's staging.
    pub(crate) fn staging_sub(&self, n: u64) {
        self.staged_sub_local(n);
        self.storage.staging_sub(n);
    }

    /// Counts `n` bytes already on disk (recovered at startup) even past the budgets: new
    /// writes are refused until uploads bring staging back under them.
    pub(crate) fn force_staging_add(&self, n: u64) {
        self.staged_bytes.fetch_add(n, Ordering::AcqRel);
        self.storage.staging_bytes.fetch_add(n, Ordering::AcqRel);
    }

    fn staged_sub_local(&self, n: u64) {
        let _ = self.staged_bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| Some(c.saturating_sub(n)));
    }

    /// Bytes this scope holds in staging.
    pub fn staging_bytes(&self) -> u64 {
        self.staged_bytes.load(Ordering::Relaxed)
    }
}

/// Runs a store request up to `attempts` times, each bounded by `timeout`, backing off between
/// attempts (100 ms doubling, at most 2 s); an error that is not transient ends it at once.
pub(crate) async fn retry_store<T, F, Fut>(timeout: Duration, attempts: u32, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut last = StoreError::Timeout(timeout);
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            let backoff = Duration::from_millis(100u64 << attempt.min(5)).min(Duration::from_secs(2));
            tokio::time::sleep(backoff).await;
        }
        match tokio::time::timeout(timeout, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !e.is_transient() => return Err(e),
            Ok(Err(e)) => last = e,
            Err(_) => last = StoreError::Timeout(timeout),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_directory_a_scope_creates_has_its_name_synced_in_its_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(crate::store::MemoryStore::new());
        let storage = Storage::new(store, StorageSettings::default(), &data, rt.handle().clone()).unwrap();
        let id = ScopeId::generate();
        let _engine = storage.open_scope(&id, Quota { bytes: 1 << 30, inodes: 1 << 20 }).unwrap();
        let synced = crate::durable_dirs::synced_below(tmp.path());
        let staging = data.join("staging").join(id.as_str());
        // data/ (its parent), staging/ cache/ scopes/ (data), scopes/<id> (scopes), staging/<id>
        // (staging), staging/<id>/blocks and open (staging/<id>).
        for parent in [tmp.path().to_path_buf(), data.clone(), data.join("scopes"), data.join("staging"), staging] {
            assert!(synced.contains(&parent), "{} never synced: {synced:?}", parent.display());
        }
    }
}
