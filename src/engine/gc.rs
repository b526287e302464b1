//! Garbage collection of a scope's unreferenced blocks, offline (`scopefs gc`: nothing else uses the
//! scope) and online (the daemon, one scope at a time, while its files are written), and the
//! registry of block puts in flight that keeps online gc from deleting what a put is storing.
//!
//! Online gc is safe against concurrent writers, uploads and readers by these rules (each one is
//! an enumerated interleaving in `tests/engine_gc.rs`):
//!
//! 1. A row is taken only while nothing references it, and only once the store holds its block
//!    (`uploaded`): a staged row's journal file may be the copy a writer between its seal and its
//!    commit relies on, and online gc leaves journal files alone (rule 2), so a staged row waits
//!    for the uploader, which moves its file out of staging, and a later pass takes it.
//! 2. Online gc never removes `blocks/<sha>`: beside an uploaded row, that file is a writer's copy
//!    sealed just now, whose commit (finding no row) stages and uploads it again.
//! 3. Every put of a block (the uploader's, an early upload's) is registered under the metadata
//!    lock when it looks at the block's row, and stays registered until its result is recorded; gc
//!    leaves a registered block for a later pass. So no put lands after gc deleted its object, and
//!    no row saying "uploaded" is recorded for an object gc deleted.
//! 4. A page of rows is taken and made durable under one hold of the metadata lock (a power loss
//!    never brings back a row saying "uploaded" for a deleted object), and its blocks are marked
//!    *being deleted* in that same hold. The objects are deleted after the lock is let go (a store
//!    request never runs under it: the runtime's threads may be waiting for it, and they drive
//!    the request); a put of a block being deleted waits until its delete is done (an early upload
//!    gives up: the commit uploads the block).
//! 5. With metadata shipped to the bucket, a pass first reaches a durability point (which waits for
//!    shipping) and takes only blocks unreferenced before it: a restore from the bucket never
//!    names a block gc deleted.
//! 6. A reader that finds a block gone because its file changed meanwhile reads again (`fileio.rs`).
//! 7. The rows' deletion logs each object it leaves to delete (`gc_deleting`, same transaction);
//!    the log entry goes once the object is gone. Every pass (online and offline) first deletes
//!    what the log still names — the objects of a pass a crash or restart cut short, which nothing
//!    else would ever delete — except a block the scope has a row for again under the same key (its
//!    object is that row's), by rules 3 and 4 (a put in flight defers it, puts of it wait for its
//!    delete).
//! 8. With several nodes, a block is stored under a key of its owner's fencing epoch, and an owner
//!    never reuses a row an earlier epoch left unreferenced (`meta/blocks.rs::add_ref`): a deposed
//!    owner's pass deletes only keys the scope's state no longer names.
//! 9. The uploader takes a row itself, without a pass, when it finds it unreferenced, staged and
//!    journaled inline (no object, no journal file): in the same hold of the metadata lock, with
//!    no put of it registered and no fork copying the database (`unneeded.rs`).
//!
//! A pass takes one of the scope's upload shares and one of the daemon's upload slots per page, so
//! a scope's gc takes turns with every scope's uploads and never holds more than its share.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::error::{EngineError, EngineResult};
use super::meta::{now_ns, MetaDb, StoredBlock};
use super::scope::ScopeEngine;

/// Rows an online pass takes under one hold of the metadata lock (the longest a commit waits).
const ONLINE_PAGE: usize = 32;
/// Rows an offline pass takes per transaction.
const OFFLINE_PAGE: usize = 256;

/// Blocks and bytes online and offline gc deleted in this process (for `/metrics`).
static BLOCKS_DELETED: AtomicU64 = AtomicU64::new(0);
static BYTES_DELETED: AtomicU64 = AtomicU64::new(0);

/// Blocks gc deleted in this process, and their bytes.
pub fn gc_totals() -> (u64, u64) {
    (BLOCKS_DELETED.load(Ordering::Relaxed), BYTES_DELETED.load(Ordering::Relaxed))
}

/// Result of a garbage collection pass of one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub blocks_deleted: u64,
    /// Content bytes of the deleted blocks (each counted once, however many copies it had).
    pub bytes_deleted: u64,
    /// Unreferenced blocks left for a later pass: not stored yet, a put in flight, held by a fork
    /// or a snapshot, or past the pass's bound.
    pub blocks_deferred: u64,
}

/// Block puts in flight, by hash (rule 3), and blocks whose objects a gc page is deleting (rule 4).
#[derive(Default)]
pub(crate) struct PutsInFlight {
    by_sha: Mutex<HashMap<String, usize>>,
    deleting: Mutex<HashSet<String>>,
    /// Woken when a page's deletes are done.
    deleted: tokio::sync::Notify,
    /// Puts waiting for a page's deletes.
    waiting: std::sync::atomic::AtomicUsize,
}

/// One registered put; unregistered when dropped (after its result is recorded).
pub(crate) struct PutInFlight {
    puts: Arc<PutsInFlight>,
    sha: String,
}

impl Drop for PutInFlight {
    fn drop(&mut self) {
        let mut by_sha = self.puts.by_sha.lock();
        if let Some(n) = by_sha.get_mut(&self.sha) {
            *n -= 1;
            if *n == 0 {
                by_sha.remove(&self.sha);
            }
        }
    }
}

/// The blocks of one gc page being deleted; they are done (and waiting puts woken) when dropped.
struct Deleting<'a> {
    puts: &'a PutsInFlight,
    shas: Vec<String>,
}

impl Drop for Deleting<'_> {
    fn drop(&mut self) {
        let mut deleting = self.puts.deleting.lock();
        for sha in &self.shas {
            deleting.remove(sha);
        }
        drop(deleting);
        self.puts.deleted.notify_waiters();
    }
}

impl PutsInFlight {
    /// Registers a put of block `sha`; `None` while a gc page deletes it (wait with
    /// [`PutsInFlight::until_deleted`], made before the call). `_locked` is the scope's metadata
    /// database, so the caller holds its lock: a gc page takes its rows wholly before the
    /// registration or wholly after it.
    pub(crate) fn begin(self: &Arc<Self>, _locked: &MetaDb, sha: &str) -> Option<PutInFlight> {
        if self.deleting.lock().contains(sha) {
            return None;
        }
        *self.by_sha.lock().entry(sha.to_string()).or_insert(0) += 1;
        Some(PutInFlight { puts: self.clone(), sha: sha.to_string() })
    }

    /// Completes once a gc page's deletes are done; made before `begin`, it misses none.
    pub(crate) fn until_deleted(&self) -> tokio::sync::futures::Notified<'_> {
        self.deleted.notified()
    }

    /// Waits for `deleted` (from `until_deleted`), counted as a put waiting for gc meanwhile.
    pub(crate) async fn wait_deleted(&self, deleted: tokio::sync::futures::Notified<'_>) {
        struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.waiting);
        deleted.await;
    }

    pub(crate) fn contains(&self, sha: &str) -> bool {
        self.by_sha.lock().contains_key(sha)
    }

    /// Marks `shas` as being deleted (under the metadata lock, with their rows' removal).
    fn deleting(&self, shas: Vec<String>) -> Deleting<'_> {
        self.deleting.lock().extend(shas.iter().cloned());
        Deleting { puts: self, shas }
    }
}

/// What one pass may take.
struct Pass {
    /// Only blocks unreferenced at or before this (unix seconds).
    cutoff: i64,
    online: bool,
    max_blocks: u64,
}

fn now_unix() -> i64 {
    now_ns() / 1_000_000_000
}

fn seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

impl ScopeEngine {
    /// Deletes every block unreferenced for longer than `grace` from staging, cache and the object
    /// store. Offline: nothing else may use the scope meanwhile (`scopefs gc`).
    pub fn collect_garbage(&self, grace: Duration) -> EngineResult<GcReport> {
        let cutoff = now_unix().saturating_sub(seconds(grace));
        self.collect(&Pass { cutoff, online: false, max_blocks: u64::MAX })
    }

    /// Deletes up to `max_blocks` blocks unreferenced for longer than `grace` while the scope is in
    /// use (the module's rules). `grace` should exceed the longest a read or an upload may take
    /// (the store's timeout times its attempts): a block is only ever deleted once nothing has
    /// referenced it for that long.
    pub fn collect_garbage_online(&self, grace: Duration, max_blocks: u64) -> EngineResult<GcReport> {
        let started = now_unix();
        // Rule 5: every mutation before `started` is durable (and in the bucket) once this returns.
        self.flush_local()?;
        let mut cutoff = started.saturating_sub(seconds(grace));
        if self.ship.is_some() {
            // Unreferenced in the second `started` began may be after the durability point.
            cutoff = cutoff.min(started - 1);
        }
        self.collect(&Pass { cutoff, online: true, max_blocks })
    }

    fn collect(&self, pass: &Pass) -> EngineResult<GcReport> {
        let page_len = if pass.online { ONLINE_PAGE } else { OFFLINE_PAGE };
        let mut report = GcReport::default();
        self.finish_logged_deletes(pass.online, page_len, &mut report)?;
        let mut after = String::new();
        loop {
            let _turn = if pass.online { Some(self.gc_turn()?) } else { None };
            let mut meta = self.meta.lock()?;
            let page = meta.unreferenced(pass.cutoff, &after, page_len)?;
            let Some(last) = page.last() else { break };
            after = last.sha256.clone();
            let full = page.len() == page_len;
            let mut batch = Vec::with_capacity(page.len());
            for b in page {
                let room = report.blocks_deleted + (batch.len() as u64) < pass.max_blocks;
                // Rules 1 and 3 (online); a block of this scope a fork or a snapshot still refers to
                // stays, its row too, so a later pass looks again.
                let settled =
                    !pass.online || ((b.uploaded || b.home.is_some()) && !self.uploads.puts.contains(&b.sha256));
                if room && settled && (b.home.is_some() || !self.held_elsewhere(&b.sha256)?) {
                    batch.push(b);
                } else {
                    report.blocks_deferred += 1;
                }
            }
            // Rule 4 (review D6): the rows' deletion is durable before anything they named goes.
            meta.take_unreferenced(&mut batch)?;
            meta.make_durable()?;
            let _deleting = self.uploads.puts.deleting(batch.iter().map(|b| b.sha256.clone()).collect());
            drop(meta);
            crate::testhooks::interleave("gc.deleting", self.scope_id.as_str());
            let logged: Vec<StoredBlock> = batch
                .iter()
                .filter(|b| b.uploaded && b.home.is_none())
                .map(|b| StoredBlock { sha256: b.sha256.clone(), key_epoch: b.key_epoch })
                .collect();
            for block in batch {
                match &block.home {
                    // Another scope's block: this scope lets go of it; it goes once nobody refers
                    // to it and its scope was purged (else that scope's gc deletes it).
                    Some(home) => {
                        if self.release_shared(home, &block.sha256)? {
                            self.storage.delete_block_object(home, &block.sha256)?;
                        }
                    }
                    None => self.delete_collected(&block, pass.online)?,
                }
                report.blocks_deleted += 1;
                report.bytes_deleted += block.len;
                BLOCKS_DELETED.fetch_add(1, Ordering::Relaxed);
                BYTES_DELETED.fetch_add(block.len, Ordering::Relaxed);
            }
            // Rule 7: their objects are gone; forgetting them need not be durable (a replay of a
            // delete finds nothing to delete).
            self.meta.lock()?.forget_gc_deleting(&logged)?;
            if !full || report.blocks_deleted >= pass.max_blocks {
                break;
            }
        }
        Ok(report)
    }

    /// Rule 7: deletes the objects the deletion log still names (a pass cut short), a page at a
    /// time, except a block with a row again (forgotten: the object is the row's) or a put in
    /// flight (left for a later pass); counted as deleted blocks of unknown size.
    fn finish_logged_deletes(&self, online: bool, page_len: usize, report: &mut GcReport) -> EngineResult<()> {
        let mut deferred: HashSet<StoredBlock> = HashSet::new();
        loop {
            let _turn = if online { Some(self.gc_turn()?) } else { None };
            let mut meta = self.meta.lock()?;
            let mut page = meta.gc_deleting(page_len + deferred.len())?;
            page.retain(|(object, _)| !deferred.contains(object));
            let mut again = Vec::new();
            let mut gone = Vec::new();
            for (object, has_row) in page {
                if has_row {
                    again.push(object);
                } else if self.uploads.puts.contains(&object.sha256) {
                    deferred.insert(object);
                } else {
                    gone.push(object);
                }
            }
            if again.is_empty() && gone.is_empty() {
                return Ok(());
            }
            meta.forget_gc_deleting(&again)?;
            let _deleting = self.uploads.puts.deleting(gone.iter().map(|o| o.sha256.clone()).collect());
            drop(meta);
            let scope = self.scope_id.as_str();
            for object in &gone {
                self.storage.cache.remove(scope, &object.sha256);
                self.delete_object(&object.key(scope))?;
                report.blocks_deleted += 1;
                BLOCKS_DELETED.fetch_add(1, Ordering::Relaxed);
            }
            self.meta.lock()?.forget_gc_deleting(&gone)?;
        }
    }

    /// Puts of this scope waiting until gc has deleted an earlier copy of their block.
    pub fn puts_waiting_for_gc(&self) -> usize {
        self.uploads.puts.waiting.load(Ordering::SeqCst)
    }

    /// One of the scope's upload shares, then one of the daemon's upload slots (in that order, as
    /// every upload takes them): an online page's turn.
    fn gc_turn(&self) -> EngineResult<(tokio::sync::SemaphorePermit<'_>, tokio::sync::SemaphorePermit<'_>)> {
        let closed = |_| EngineError::Invalid("the storage is closing");
        let rt = &self.storage.rt;
        let share = rt.block_on(self.shares.upload.acquire()).map_err(closed)?;
        let slot = rt.block_on(self.storage.upload_slots.acquire()).map_err(closed)?;
        Ok((share, slot))
    }

    /// Deletes what a collected block row named (its rows' deletion is durable): the inline
    /// journal's bookkeeping, the staging file (offline only: rule 2), the cache entry and the
    /// stored object.
    fn delete_collected(&self, block: &super::meta::Unreferenced, online: bool) -> EngineResult<()> {
        let (scope, sha) = (self.scope_id.as_str(), block.sha256.as_str());
        self.forget_inline(sha, block.inline, block.len);
        let staged = self.blocks_dir.join(sha);
        if !online {
            if let Ok(m) = std::fs::metadata(&staged) {
                if std::fs::remove_file(&staged).is_ok() {
                    self.staging_sub(m.len());
                }
            }
        }
        self.storage.cache.remove(scope, sha);
        if block.uploaded {
            self.delete_object(&crate::store::block_key_at(scope, block.key_epoch, sha))?;
        }
        Ok(())
    }

    /// Deletes the stored object `key`.
    fn delete_object(&self, key: &str) -> EngineResult<()> {
        let st = &self.storage;
        st.rt.block_on(st.with_retry(st.settings.store_attempts, || st.store.delete(key)))?;
        Ok(())
    }
}
