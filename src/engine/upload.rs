//! Uploads of journaled blocks (the background queue, retried until it succeeds, and foreground
//! uploads) and the durability points: the grouped local flush behind fsync/fsyncdir/sync.

use std::collections::HashSet;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use sha2::{Digest, Sha256};

use super::error::{EngineError, EngineResult};
use super::scope::ScopeEngine;
use crate::store::{block_key, StoreError};

/// Hashes queued or in flight, with a condition variable for waiters; and what a durability
/// point still has to flush.
#[derive(Default)]
pub(crate) struct UploadQueue {
    pending: Mutex<HashSet<String>>,
    drained: Condvar,
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
}

/// Longest pause between background retries of one block.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl ScopeEngine {
    /// Queues a staged block for background upload (once).
    pub(crate) fn enqueue_upload(&self, sha: String) {
        if !self.uploads.pending.lock().insert(sha.clone()) {
            return;
        }
        let Some(engine) = self.self_ref.upgrade() else { return };
        let rt = self.storage.rt.clone();
        rt.spawn(async move {
            let slots = engine.storage.upload_slots.clone();
            let mut backoff = Duration::from_millis(200);
            loop {
                let outcome = {
                    let _permit = slots.acquire().await;
                    engine.upload_one(&sha).await
                };
                match outcome {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(scope = %engine.scope_id, block = %sha, error = %e, "upload failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
            let mut pending = engine.uploads.pending.lock();
            pending.remove(&sha);
            if pending.is_empty() {
                engine.uploads.drained.notify_all();
            }
        });
    }

    /// Uploads one staged block (one attempt with timeout), records it, and moves it into the cache.
    async fn upload_one(&self, sha: &str) -> Result<(), StoreError> {
        let unavailable = |e: EngineError| StoreError::Unavailable(format!("reading the inline journal: {e}"));
        let inline = self.inline_bytes(sha).map_err(unavailable)?;
        let data = match &inline {
            Some(d) => Bytes::copy_from_slice(d),
            None => match tokio::fs::read(self.blocks_dir.join(sha)).await {
                Ok(d) => Bytes::from(d),
                // Already uploaded and moved to the cache by a foreground upload, or collected.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e.into()),
            },
        };
        let key = block_key(self.scope_id.as_str(), sha);
        let timeout = self.storage.settings.store_timeout;
        if hex::encode(Sha256::digest(&data)) != sha {
            return self.drop_damaged(sha, &key).await;
        }
        match tokio::time::timeout(timeout, self.storage.store.put(&key, data)).await {
            Ok(r) => r?,
            Err(_) => return Err(StoreError::Timeout(timeout)),
        }
        self.finish_upload(sha, inline.as_deref())
            .map_err(|e| StoreError::Unavailable(format!("recording upload: {e}")))
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
        }
        Ok(())
    }

    fn finish_upload(&self, sha: &str, inline: Option<&[u8]>) -> EngineResult<()> {
        self.record_upload(sha, inline)?;
        // In the store now: no durability point needs its journal file any more (so a scope that
        // never fsyncs holds no list of every block it ever wrote).
        self.uploads.unsynced.lock().remove(sha);
        let staged = self.blocks_dir.join(sha);
        if let Ok(m) = std::fs::metadata(&staged) {
            // Into the cache, or (if the cache cannot take it) away: it is in the store now.
            let cache = &self.storage.cache;
            if cache.adopt_file(self.scope_id.as_str(), sha, &staged).is_ok() || std::fs::remove_file(&staged).is_ok() {
                self.staging_sub(m.len());
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
        // Each upload its own task (hashing and I/O of several blocks at once), each holding
        // one of the storage's upload slots while it runs: at most `upload_parallelism` at once.
        let engine = self.self_ref.upgrade().ok_or(EngineError::Invalid("scope engine is closing"))?;
        self.storage.rt.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for sha in todo {
                let engine = engine.clone();
                set.spawn(async move {
                    let st = &engine.storage;
                    let _permit = st.upload_slots.acquire().await;
                    st.with_retry(st.settings.store_attempts, || engine.upload_one(&sha)).await
                });
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
        let ticket = self.uploads.requested.fetch_add(1, Ordering::AcqRel) + 1;
        let _guard = self.uploads.flush_lock.lock();
        if self.uploads.durable.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        // Every ticket up to here was taken after its caller's commit: this flush covers them.
        let covers = self.uploads.requested.load(Ordering::Acquire);
        let shas: Vec<String> = self.uploads.unsynced.lock().drain().collect();
        let synced = self
            .sync_journal_files(&shas)
            .and_then(|()| self.sync_inline_marker())
            .and_then(|()| self.meta.lock()?.make_durable());
        if let Err(e) = synced {
            self.uploads.unsynced.lock().extend(shas);
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
        let len = match std::fs::metadata(cache.path(self.scope_id.as_str(), sha)) {
            Ok(m) => m.len(),
            Err(_) => return false,
        };
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

    /// Local flushes (durability points that had work) so far: `close()` alone performs none
    /// unless the scope's durability mode is `close`.
    pub fn local_flushes(&self) -> u64 {
        self.uploads.flushes.load(Ordering::Relaxed)
    }

    /// Waits until the upload queue is empty; `false` if `timeout` passed first.
    pub fn wait_uploads(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
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
}
