//! Uploads of journaled blocks (one background uploader per scope taking its queue in groups,
//! retried until they succeed, and foreground uploads) and the durability points: the grouped local
//! flush behind fsync/fsyncdir/sync.

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use sha2::{Digest, Sha256};

use super::error::{EngineError, EngineResult};
use super::scope::ScopeEngine;
use crate::store::{block_key_at, StoreError};

/// Hashes queued or in flight, with a condition variable for waiters; and what a durability
/// point still has to flush.
#[derive(Default)]
pub(crate) struct UploadQueue {
    pub(super) pending: Mutex<HashSet<String>>,
    drained: Condvar,
    /// Hashes waiting for the scope's uploader, and whether its task runs.
    waiting: Mutex<Waiting>,
    /// Wakes the uploader from its delay (a full group queued, or a waiter in a hurry).
    wake: tokio::sync::Notify,
    /// Journal files (`blocks/<sha>`) sealed since the last local flush: not yet fsynced.
    unsynced: Mutex<HashSet<String>>,
    /// Tickets of durability requests: a request takes one once its own commit is done.
    requested: AtomicU64,
    /// Highest ticket a finished flush covers. Guarded by the flush lock for writers.
    durable: AtomicU64,
    /// One local flush at a time; requests that queue behind a flush share the next one.
    flush_lock: Mutex<()>,
    /// Local flushes performed (each: fsync of new journal files, their directory and the WAL).
    flushes: AtomicU64,
    /// Block puts in flight, which online gc leaves alone (`gc.rs`).
    pub(crate) puts: std::sync::Arc<super::gc::PutsInFlight>,
    /// Forks copying the database: no unneeded upload is dropped meanwhile (`unneeded.rs`).
    pub(super) drop_holds: super::unneeded::DropHolds,
}

#[derive(Default)]
struct Waiting {
    /// Queued hashes with the time each was queued, oldest first.
    queue: VecDeque<(String, Instant)>,
    uploader_running: bool,
    /// Set by a waiter (`wait_uploads`, shutdown): upload what is queued without the delay.
    hurry: bool,
}

/// Longest pause between background retries of a group that failed as a whole.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Most blocks one background group takes (recorded in one transaction per chunk).
const UPLOAD_GROUP: usize = 256;

/// Bytes of blocks a local-directory chunk holds in memory before it is stored (one request, one
/// flush) and recorded.
const LOCAL_CHUNK_BYTES: usize = 8 << 20;

/// A staged block on its way to the store.
struct StagedBlock {
    key: String,
    data: Bytes,
    /// Its bytes came from the inline journal (not a journal file).
    inline: bool,
    /// Registered until its upload is recorded (`gc.rs`, rule 3).
    _put: super::gc::PutInFlight,
}

impl ScopeEngine {
    /// Queues a staged block for background upload (once). The scope's uploader takes a block
    /// once it has waited `upload_delay` (or at once when a whole group is queued), so a burst of
    /// closes is uploaded and recorded in a few groups, each one flush of a local store.
    pub(crate) fn enqueue_upload(&self, sha: String) {
        if !self.uploads.pending.lock().insert(sha.clone()) {
            return;
        }
        let (start, full) = {
            let mut waiting = self.uploads.waiting.lock();
            waiting.queue.push_back((sha, Instant::now()));
            (!std::mem::replace(&mut waiting.uploader_running, true), waiting.queue.len() >= UPLOAD_GROUP)
        };
        if !start {
            if full {
                self.uploads.wake.notify_one();
            }
            return;
        }
        let Some(engine) = self.self_ref.upgrade() else {
            self.uploads.waiting.lock().uploader_running = false;
            return;
        };
        self.storage.rt.clone().spawn(async move { engine.run_uploader().await });
    }

    /// The scope's background uploader: groups until the queue is empty. A group that fails
    /// as a whole is retried after a pause that doubles up to `MAX_BACKOFF`; blocks that fail
    /// go to the back of the queue.
    async fn run_uploader(&self) {
        let mut backoff = Duration::from_millis(200);
        let delay = self.storage.settings.upload_delay;
        loop {
            // `Err(due)`: wait until then (or a wake-up); `Ok(None)`: the queue is empty.
            let next: Result<Option<Vec<String>>, Instant> = {
                let mut waiting = self.uploads.waiting.lock();
                match waiting.queue.front().map(|&(_, queued)| queued + delay) {
                    None => {
                        waiting.uploader_running = false;
                        waiting.hurry = false;
                        Ok(None)
                    }
                    Some(due) if waiting.queue.len() < UPLOAD_GROUP && !waiting.hurry && Instant::now() < due => {
                        Err(due)
                    }
                    Some(_) => {
                        let n = waiting.queue.len().min(UPLOAD_GROUP);
                        Ok(Some(waiting.queue.drain(..n).map(|(sha, _)| sha).collect()))
                    }
                }
            };
            let group = match next {
                Ok(Some(group)) => group,
                Ok(None) => return,
                Err(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due.into()) => {}
                        _ = self.uploads.wake.notified() => {}
                    }
                    continue;
                }
            };
            // Small blocks no file refers to any more are not uploaded at all (`unneeded.rs`).
            let group = self.drop_unneeded(group);
            let outcomes = self.upload_group(&group).await;
            let mut failed = Vec::new();
            let mut first_error = None;
            {
                let mut pending = self.uploads.pending.lock();
                for (sha, outcome) in group.into_iter().zip(outcomes) {
                    match outcome {
                        Ok(()) => {
                            pending.remove(&sha);
                        }
                        Err(e) if !e.is_transient() => {
                            // Retrying cannot change it (a staged block lost, not in the store
                            // either): fsync of its files fails, fsck names them.
                            tracing::error!(scope = %self.scope_id, block = %sha, error = %e, "a staged block cannot be uploaded; run fsck");
                            pending.remove(&sha);
                        }
                        Err(e) => {
                            first_error.get_or_insert(e);
                            failed.push(sha);
                        }
                    }
                }
                if pending.is_empty() {
                    self.uploads.drained.notify_all();
                }
            }
            let Some(e) = first_error else {
                backoff = Duration::from_millis(200);
                continue;
            };
            tracing::warn!(scope = %self.scope_id, blocks = failed.len(), error = %e, "upload failed; retrying");
            let now = Instant::now();
            self.uploads.waiting.lock().queue.extend(failed.into_iter().map(|sha| (sha, now)));
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Uploads a group of staged blocks (one attempt each, under the store's timeout), records
    /// the stored ones in one transaction per chunk and moves them out of staging. One result per
    /// block. A local directory stores the group in chunks of at most `LOCAL_CHUNK_BYTES` (each one
    /// request: one flush), under one of the daemon's upload slots; any other store gets one request
    /// per block, each holding a slot from the read of its bytes to its answer, so the blocks in
    /// memory stay within `upload_parallelism`. A slot is taken after one of the scope's share
    /// (`upload_share`): one scope's backlog waits there, and other scopes take turns at the slots.
    async fn upload_group(&self, shas: &[String]) -> Vec<Result<(), StoreError>> {
        if self.storage.store.reads_are_local() {
            self.upload_chunked(shas).await
        } else {
            self.upload_each(shas).await
        }
    }

    async fn upload_chunked(&self, shas: &[String]) -> Vec<Result<(), StoreError>> {
        let mut outcomes: Vec<Result<(), StoreError>> = shas.iter().map(|_| Ok(())).collect();
        let _share = self.shares.upload.acquire().await;
        let _slot = self.storage.upload_slots.acquire().await;
        let mut chunk: Vec<(usize, StagedBlock)> = Vec::new();
        let mut bytes = 0;
        for (i, sha) in shas.iter().enumerate() {
            match self.staged_block(sha).await {
                Ok(Some(block)) => {
                    bytes += block.data.len();
                    chunk.push((i, block));
                }
                Ok(None) => {}
                Err(e) => outcomes[i] = Err(e),
            }
            if bytes >= LOCAL_CHUNK_BYTES || (i + 1 == shas.len() && !chunk.is_empty()) {
                let (index, blocks): (Vec<usize>, Vec<StagedBlock>) = std::mem::take(&mut chunk).into_iter().unzip();
                bytes = 0;
                let requests = blocks.iter().map(|b| (b.key.clone(), b.data.clone())).collect();
                let timeout = self.storage.settings.store_timeout;
                let stored = match tokio::time::timeout(timeout, self.storage.store.put_many(requests, 1)).await {
                    Ok(results) => results,
                    Err(_) => index.iter().map(|_| Err(StoreError::Timeout(timeout))).collect(),
                };
                let results: Vec<(usize, Result<StagedBlock, StoreError>)> =
                    index.into_iter().zip(blocks.into_iter().zip(stored).map(|(b, r)| r.map(|()| b))).collect();
                self.record_group(shas, results, &mut outcomes);
            }
        }
        outcomes
    }

    async fn upload_each(&self, shas: &[String]) -> Vec<Result<(), StoreError>> {
        let mut outcomes: Vec<Result<(), StoreError>> = shas.iter().map(|_| Ok(())).collect();
        let puts = shas.iter().enumerate().map(|(i, sha)| async move {
            let _share = self.shares.upload.acquire().await;
            let _slot = self.storage.upload_slots.acquire().await;
            let Some(block) = self.staged_block(sha).await? else { return Ok(None) };
            crate::testhooks::interleave("upload.before_put", self.scope_id.as_str());
            let timeout = self.storage.settings.store_timeout;
            let put = self.storage.store.put_hashed(&block.key, block.data.clone(), sha);
            match tokio::time::timeout(timeout, put).await {
                Ok(r) => r?,
                Err(_) => return Err(StoreError::Timeout(timeout)),
            }
            Ok(Some((i, block)))
        });
        let mut results = Vec::new();
        for (i, r) in futures_util::future::join_all(puts).await.into_iter().enumerate() {
            match r {
                Ok(Some((i, block))) => results.push((i, Ok(block))),
                Ok(None) => {}
                Err(e) => results.push((i, Err(e))),
            }
        }
        // Inline blocks go into the cache (one transaction) before their rows leave the journal,
        // so a reader always finds them; best effort: without it a read fetches from the store. A
        // local directory is read as cheaply as the cache: nothing is copied.
        if !self.storage.store.reads_are_local() {
            let cached: Vec<(&str, &[u8])> = results
                .iter()
                .filter_map(|(i, r)| r.as_ref().ok().filter(|b| b.inline).map(|b| (shas[*i].as_str(), &b.data[..])))
                .collect();
            if let Err(e) = self.storage.cache.insert_many(self.scope_id.as_str(), &cached) {
                tracing::debug!(scope = %self.scope_id, error = %e, "caching uploaded inline blocks failed");
            }
        }
        self.record_group(shas, results, &mut outcomes);
        outcomes
    }

    /// The bytes of a staged block to upload and its key; `None` when there is nothing to upload
    /// (uploaded and moved by a foreground upload, collected, or found in the store already).
    /// Damaged bytes (their hash is not the block's) are never uploaded: `drop_damaged` decides.
    /// The store is given the block's hash with its bytes (`put_hashed`).
    async fn staged_block(&self, sha: &str) -> Result<Option<StagedBlock>, StoreError> {
        let unavailable = |e: EngineError| StoreError::Unavailable(format!("reading the inline journal: {e}"));
        // Registered with the look at its row; while gc deletes an earlier copy, after that
        // (`gc.rs`, rules 3 and 4).
        let (row, epoch, put) = loop {
            let deleted = self.uploads.puts.until_deleted();
            {
                let meta = self.meta.lock().map_err(unavailable)?;
                if let Some(put) = self.uploads.puts.begin(&meta, sha) {
                    let (epoch, inline) = meta.staged_upload(sha).map_err(unavailable)?;
                    break (inline, epoch, put);
                }
            }
            self.uploads.puts.wait_deleted(deleted).await;
        };
        let inline = row.is_some();
        let key = block_key_at(self.scope_id.as_str(), epoch, sha);
        // A journal file this process sealed holds the bytes it hashed (nothing writes it after);
        // one an earlier process left is hashed, as its first read does (`staged_is_whole`).
        let (data, trusted) = match row {
            Some(d) => (Bytes::from(d), false),
            None => match tokio::fs::read(self.blocks_dir.join(sha)).await {
                Ok(d) => (Bytes::from(d), !self.unverified_staged.lock().contains(sha)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return self.missing_staged(sha, &key).await,
                Err(e) => return Err(e.into()),
            },
        };
        if !trusted && hex::encode(Sha256::digest(&data)) != sha {
            self.drop_damaged(sha, &key).await?;
            return Ok(None);
        }
        Ok(Some(StagedBlock { key, data, inline, _put: put }))
    }

    /// A staged block whose file is gone. Still marked staged, it is either in the store (its upload
    /// finished and the mark was lost to a power loss: marked now) or lost (`NotFound`: never
    /// counted as uploaded, so fsync of its files fails). Otherwise nothing is left to do.
    async fn missing_staged(&self, sha: &str, key: &str) -> Result<Option<StagedBlock>, StoreError> {
        let unavailable = |e: EngineError| StoreError::Unavailable(format!("reading the upload journal: {e}"));
        if self.meta.lock().and_then(|m| m.block_uploaded(sha)).map_err(unavailable)? != Some(false) {
            return Ok(None);
        }
        let timeout = self.storage.settings.store_timeout;
        let present = match tokio::time::timeout(timeout, self.storage.store.head(key)).await {
            Ok(r) => r?.is_some(),
            Err(_) => return Err(StoreError::Timeout(timeout)),
        };
        if !present {
            return Err(StoreError::NotFound { key: key.to_string() });
        }
        self.meta
            .lock()
            .and_then(|mut m| m.mark_uploaded(sha).map(drop))
            .map_err(|e| StoreError::Unavailable(format!("recording upload: {e}")))?;
        Ok(None)
    }

    /// Records the stored blocks among `results` (index into `shas`, outcome) in one transaction;
    /// each outcome lands in `outcomes`.
    fn record_group(
        &self,
        shas: &[String],
        results: Vec<(usize, Result<StagedBlock, StoreError>)>,
        outcomes: &mut [Result<(), StoreError>],
    ) {
        let mut done: Vec<(usize, Option<u64>)> = Vec::new();
        // Each stays registered as a put in flight until its upload is recorded below.
        let mut stored = Vec::new();
        for (i, r) in results {
            match r {
                Ok(block) => {
                    done.push((i, block.inline.then_some(block.data.len() as u64)));
                    stored.push(block);
                }
                Err(e) => outcomes[i] = Err(e),
            }
        }
        let recorded: Vec<(&str, Option<u64>)> = done.iter().map(|&(i, len)| (shas[i].as_str(), len)).collect();
        if let Err(e) = self.finish_uploads(&recorded) {
            let msg = format!("recording upload: {e}");
            for &(i, _) in &done {
                outcomes[i] = Err(StoreError::Unavailable(msg.clone()));
            }
        }
        drop(stored);
    }

    /// A staged block whose bytes no longer match its hash: a power loss took data that was never
    /// flushed (a file closed but not fsynced). It is never uploaded under its hash. When the
    /// store already holds the block (its "uploaded" mark was what got lost), the mark is
    /// restored; otherwise the files using it read `EIO` (never wrong bytes) and fsck names them.
    async fn drop_damaged(&self, sha: &str, key: &str) -> Result<(), StoreError> {
        let timeout = self.storage.settings.store_timeout;
        let present = match tokio::time::timeout(timeout, self.storage.store.head(key)).await {
            Ok(r) => r?.is_some(),
            Err(_) => return Err(StoreError::Timeout(timeout)),
        };
        let recorded =
            if present { self.meta.lock().and_then(|mut m| m.mark_uploaded(sha).map(|_| ())) } else { Ok(()) };
        recorded.map_err(|e| StoreError::Unavailable(format!("recording upload: {e}")))?;
        let staged = self.blocks_dir.join(sha);
        if let Ok(m) = std::fs::metadata(&staged) {
            if std::fs::remove_file(&staged).is_ok() {
                self.staging_sub(m.len());
            }
        }
        if !present {
            tracing::error!(scope = %self.scope_id, block = %sha, "staged block damaged (not flushed before a power loss); run fsck");
            // Open handles of the files using it learn of the loss at their next flush or fsync.
            if let Ok(files) = self.meta.lock().and_then(|m| m.files_with_block(sha)) {
                for ino in files {
                    self.errors.inode_error(ino);
                }
            }
        }
        Ok(())
    }

    /// Records a group of stored blocks (with the length of each inline one), then moves their
    /// journal files out of staging.
    pub(crate) fn finish_uploads(&self, done: &[(&str, Option<u64>)]) -> EngineResult<()> {
        self.record_uploads(done)?;
        let mut unsynced = self.uploads.unsynced.lock();
        for (sha, _) in done {
            // In the store now: no durability point needs its journal file any more (so a scope
            // that never fsyncs holds no list of every block it ever wrote).
            unsynced.remove(*sha);
        }
        drop(unsynced);
        let cache = &self.storage.cache;
        let keep_in_cache = !self.storage.store.reads_are_local();
        for (sha, inline) in done {
            if inline.is_some() {
                continue;
            }
            let staged = self.blocks_dir.join(sha);
            if let Ok(m) = std::fs::metadata(&staged) {
                // A local directory now holds exactly the sealed bytes: read in place from now on.
                if !keep_in_cache {
                    self.storage.verified_upload(&block_key_at(self.scope_id.as_str(), self.key_epoch(), sha), m.len());
                }
                // Into the cache, or (if the cache cannot take it, or the store is local) away.
                let adopted = keep_in_cache && cache.adopt_file(self.scope_id.as_str(), sha, &staged).is_ok();
                if adopted || std::fs::remove_file(&staged).is_ok() {
                    self.staging_sub(m.len());
                }
            }
        }
        Ok(())
    }

    /// After a commit: the sealed copies (`sealed`) of blocks the scope already had uploaded (not
    /// `new` to it; an early upload's among them) are redundant: kept in the cache of a remote store
    /// (a read finds them there), else removed.
    pub(crate) fn retire_redundant_sealed(&self, sealed: &[String], new: &[String]) -> EngineResult<()> {
        let keep_in_cache = !self.storage.store.reads_are_local();
        for sha in sealed.iter().filter(|s| !new.contains(s)) {
            if self.meta.lock()?.block_uploaded(sha)? == Some(true) {
                let path = self.blocks_dir.join(sha);
                if let Ok(m) = std::fs::metadata(&path) {
                    let adopted =
                        keep_in_cache && self.storage.cache.adopt_file(self.scope_id.as_str(), sha, &path).is_ok();
                    if adopted || std::fs::remove_file(&path).is_ok() {
                        self.staging_sub(m.len());
                    }
                }
            }
        }
        Ok(())
    }

    /// Uploads every still-staged block among `shas` now, with bounded attempts (`EIO` when the store is down).
    pub(crate) fn upload_now(&self, shas: &[String]) -> EngineResult<()> {
        let mut todo = Vec::new();
        {
            let meta = self.meta.lock()?;
            for sha in shas {
                if meta.block_uploaded(sha)? == Some(false) && !todo.contains(sha) {
                    todo.push(sha.clone());
                }
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        // `upload_parallelism` groups at once (hashing and I/O of several blocks at once), each
        // holding one of the storage's upload slots while its store requests run.
        let engine = self.self_ref.upgrade().ok_or(EngineError::Invalid("scope engine is closing"))?;
        let groups = self.storage.settings.upload_parallelism.clamp(1, todo.len());
        let mut split: Vec<Vec<String>> = vec![Vec::new(); groups];
        for (i, sha) in todo.into_iter().enumerate() {
            split[i % groups].push(sha);
        }
        self.storage.rt.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for group in split {
                let engine = engine.clone();
                set.spawn(async move { engine.upload_with_attempts(group).await });
            }
            let mut first_error = None;
            while let Some(joined) = set.join_next().await {
                let result = joined.map_err(|e| EngineError::Io(std::io::Error::other(e)))?;
                if let Err(e) = result {
                    first_error.get_or_insert(EngineError::Store(e));
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    /// `upload_group` until every block is stored, at most `store_attempts` times with a growing
    /// pause; a refusal that retrying cannot change ends it at once.
    async fn upload_with_attempts(&self, mut todo: Vec<String>) -> Result<(), StoreError> {
        let attempts = self.storage.settings.store_attempts.max(1);
        let mut last = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100u64 << attempt.min(5)).min(Duration::from_secs(2))).await;
            }
            let outcomes = self.upload_group(&todo).await;
            let mut failed = Vec::new();
            for (sha, outcome) in todo.into_iter().zip(outcomes) {
                if let Err(e) = outcome {
                    let permanent = !e.is_transient();
                    last = Some(e);
                    if permanent {
                        return Err(last.unwrap_or(StoreError::Unavailable("upload failed".into())));
                    }
                    failed.push(sha);
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            todo = failed;
        }
        Err(last.unwrap_or(StoreError::Unavailable("upload failed".into())))
    }

    /// Records journal files sealed by a commit: the next durability point fsyncs them. Called
    /// before the commit that references them, so a flush that covers the commit covers them.
    pub(crate) fn note_unsynced(&self, shas: &[String]) {
        if !shas.is_empty() {
            self.uploads.unsynced.lock().extend(shas.iter().cloned());
        }
    }

    /// The local durability point, grouped: everything committed before the call (file versions,
    /// namespace changes, the upload journal) survives power loss when it returns. Callers that
    /// arrive while a flush runs share the next one. Costs one fsync per new journal file, one of
    /// the journal directory and one of the SQLite WAL; nothing when nothing is new.
    pub(crate) fn flush_local(&self) -> EngineResult<()> {
        if self.durability_failed.load(Ordering::Acquire) {
            return Err(EngineError::Poisoned(
                "a durability point of this scope failed; nothing later can vouch for its data",
            ));
        }
        let ticket = self.uploads.requested.fetch_add(1, Ordering::AcqRel) + 1;
        let _guard = self.uploads.flush_lock.lock();
        if self.uploads.durable.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        // Every ticket up to here was taken after its caller's commit: this flush covers them.
        let covers = self.uploads.requested.load(Ordering::Acquire);
        let shas: Vec<String> = self.uploads.unsynced.lock().drain().collect();
        let files = self.sync_journal_files(&shas).and_then(|()| self.sync_inline_marker());
        let synced = files.map_err(|e| (true, e)).and_then(|()| {
            let mut meta = self.meta.lock().map_err(|e| (false, e))?;
            meta.make_durable().map_err(|e| (failed_flush(&e), e))?;
            Ok(meta.committed_seq())
        });
        // Every batch committed so far is in the object store too (names and versions as durable
        // as blocks): what the shipper lacks it ships now.
        let synced = synced.and_then(|seq| match &self.ship {
            Some(ship) => ship.wait_shipped(seq).map_err(|e| (false, e)),
            None => Ok(()),
        });
        if let Err((lost, e)) = synced {
            self.uploads.unsynced.lock().extend(shas);
            if lost {
                // A failed flush may have dropped the pages it was flushing, and a later flush
                // would find them clean ("fsyncgate"): no later durability point is believed.
                self.durability_failed.store(true, Ordering::Release);
                self.errors.scope_error();
                tracing::error!(scope = %self.scope_id, error = %e, "a durability point failed; the scope's durability points fail until it is opened again");
            }
            return Err(e);
        }
        self.uploads.flushes.fetch_add(1, Ordering::Relaxed);
        self.uploads.durable.store(covers, Ordering::Release);
        Ok(())
    }

    /// fsyncs the given journal files (those already uploaded and moved away need nothing) and,
    /// when there were any, the journal directory (their names).
    fn sync_journal_files(&self, shas: &[String]) -> EngineResult<()> {
        if shas.is_empty() {
            return Ok(());
        }
        for sha in shas {
            match File::open(self.blocks_dir.join(sha)) {
                Ok(f) => f.sync_data()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        File::open(&self.blocks_dir)?.sync_all()?;
        Ok(())
    }

    /// Startup recovery of a journaled block missing from staging but found in the cache: its
    /// upload finished and its file moved to the cache, but the "uploaded" mark was not flushed
    /// before a power loss. Moves it back to staging (the caller queues it: uploads are
    /// idempotent); `false` when the cache does not have it either.
    pub(crate) fn restage_from_cache(&self, sha: &str) -> bool {
        let cache = &self.storage.cache;
        let Some(len) = cache.size_of(self.scope_id.as_str(), sha) else { return false };
        if self.staging_add(len).is_err() {
            return false;
        }
        match cache.take_back(self.scope_id.as_str(), sha, &self.blocks_dir.join(sha)) {
            Ok(true) => true,
            _ => {
                self.staging_sub(len);
                false
            }
        }
    }

    /// Commits the scope's open batch of metadata mutations (each is in the redo log already, so
    /// this only shortens the log a restart would replay); nothing when its database is closed.
    pub fn commit_metadata(&self) -> EngineResult<()> {
        self.meta.commit_if_open()
    }

    /// The process hands the scope to the next one (a graceful restart): the open batch commits
    /// and the usage is noted, so the next process answers `statfs` without opening the database.
    /// Nothing may change the scope afterwards.
    pub fn hand_over_metadata(&self) -> EngineResult<()> {
        self.meta.hand_over()
    }

    /// Metadata mutations of the scope not yet committed (each is in the redo log).
    pub fn uncommitted_metadata(&self) -> u32 {
        self.meta.uncommitted()
    }

    /// Local flushes (durability points that had work) so far: `close()` alone performs none
    /// unless the scope's durability mode is `close`.
    pub fn local_flushes(&self) -> u64 {
        self.uploads.flushes.load(Ordering::Relaxed)
    }

    /// Waits until the upload queue is empty (uploading what is queued without `upload_delay`) and
    /// no early upload is in flight; `false` if `timeout` passed first.
    pub fn wait_uploads(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if !self.wait_all_early_uploads(deadline) {
            return false;
        }
        {
            let mut waiting = self.uploads.waiting.lock();
            if waiting.uploader_running {
                waiting.hurry = true;
            }
        }
        self.uploads.wake.notify_one();
        let mut pending = self.uploads.pending.lock();
        while !pending.is_empty() {
            if self.uploads.drained.wait_until(&mut pending, deadline).timed_out() {
                return pending.is_empty();
            }
        }
        true
    }

    /// Blocks queued or in flight.
    pub fn pending_uploads(&self) -> usize {
        self.uploads.pending.lock().len()
    }

    /// Committed metadata batches not yet shipped to the object store (0 when not shipped).
    pub fn pending_metadata_batches(&self) -> u64 {
        self.ship.as_ref().map_or(0, |s| s.pending())
    }

    /// Passes this scope's metadata shipper has made (0 when not shipped).
    pub fn metadata_shipper_passes(&self) -> u64 {
        self.ship.as_ref().map_or(0, |s| s.passes())
    }
}

/// Whether a metadata durability point failed at its flush (SQLite's fsync of the WAL or of its
/// directory), not before it wrote anything.
fn failed_flush(e: &EngineError) -> bool {
    match e {
        EngineError::Metadata(rusqlite::Error::SqliteFailure(f, _)) => {
            f.extended_code == rusqlite::ffi::SQLITE_IOERR_FSYNC
                || f.extended_code == rusqlite::ffi::SQLITE_IOERR_DIR_FSYNC
        }
        EngineError::Io(_) => true,
        _ => false,
    }
}
