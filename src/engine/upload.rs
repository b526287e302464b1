//! Uploads of journaled blocks: the background queue (retried until it succeeds) and foreground uploads for fsync/close durability.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::error::EngineResult;
use super::scope::ScopeEngine;
use crate::store::{block_key, StoreError};

/// Hashes queued or in flight, with a condition variable for waiters.
#[derive(Default)]
pub(crate) struct UploadQueue {
    pending: Mutex<HashSet<String>>,
    drained: Condvar,
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
        let staged = self.blocks_dir.join(sha);
        let data = match tokio::fs::read(&staged).await {
            Ok(d) => Bytes::from(d),
            // Already uploaded and moved to the cache by a foreground upload, or collected.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let key = block_key(self.scope_id.as_str(), sha);
        let timeout = self.storage.settings.store_timeout;
        match tokio::time::timeout(timeout, self.storage.store.put(&key, data)).await {
            Ok(r) => r?,
            Err(_) => return Err(StoreError::Timeout(timeout)),
        }
        self.finish_upload(sha).map_err(|e| StoreError::Unavailable(format!("recording upload: {e}")))
    }

    fn finish_upload(&self, sha: &str) -> EngineResult<()> {
        self.meta.lock().mark_uploaded(sha)?;
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
            let meta = self.meta.lock();
            for sha in shas {
                if meta.block_uploaded(sha)? == Some(false) && !todo.contains(sha) {
                    todo.push(sha.clone());
                }
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        let st = &self.storage;
        let attempts = st.settings.store_attempts;
        let results = st.rt.block_on(async {
            let mut set = Vec::new();
            for sha in &todo {
                set.push(async move {
                    let _permit = st.upload_slots.acquire().await;
                    st.with_retry(attempts, || self.upload_one(sha)).await
                });
            }
            let mut out = Vec::new();
            for f in set {
                out.push(f.await);
            }
            out
        });
        for r in results {
            r?;
        }
        Ok(())
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
