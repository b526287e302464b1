//! Early uploads: a block that a writer has just filled (the write reached the block's end and
//! every page of it is written) is uploaded to a remote store while the writer goes on, instead of
//! waiting for the file's commit at close or `fsync`. The upload is recorded as an uploaded block
//! nobody references yet; the commit that seals the same bytes finds the row and only adds its
//! reference (its sealed copy goes to the cache), so `fsync` uploads just what the early uploads did
//! not cover. A block changed again before its commit stays unreferenced and gc collects it like
//! any other; a process killed between the upload and its row leaves an orphan object that
//! `scopefs fsck --repair` names and deletes. Nothing here decides what a file holds: the commit
//! still hashes what it seals, and only a row it finds `uploaded` spares an upload.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use sha2::{Digest, Sha256};

use super::scope::ScopeEngine;
use super::Ino;
use crate::store::block_key_at;

/// Early uploads in flight, by inode, with a condition variable for a commit that waits for them.
#[derive(Default)]
pub(crate) struct EarlyUploads {
    in_flight: Mutex<HashMap<Ino, usize>>,
    finished: Condvar,
    /// Blocks recorded by an early upload (for tests and metrics).
    recorded: std::sync::atomic::AtomicU64,
}

/// Counts one early upload of an inode as in flight until dropped.
struct InFlight<'a> {
    early: &'a EarlyUploads,
    ino: Ino,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.early.in_flight.lock();
        if let Some(n) = in_flight.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.ino);
            }
        }
        drop(in_flight);
        self.early.finished.notify_all();
    }
}

impl ScopeEngine {
    /// Whether full blocks are uploaded while their file is written: a remote store, and the
    /// setting on.
    pub(crate) fn uploads_early(&self) -> bool {
        self.storage.settings.early_upload && !self.storage.store.reads_are_local()
    }

    /// Starts the early upload of the working file `path` of inode `ino` (a full block); the hash of
    /// what it reads goes into `hash` (the commit uses it while the block has not changed since).
    /// It takes one of the scope's upload shares and one of the daemon's slots, as every upload does.
    pub(crate) fn upload_early(&self, ino: Ino, path: PathBuf, hash: Arc<OnceLock<String>>) {
        let Some(engine) = self.self_ref.upgrade() else { return };
        *self.early.in_flight.lock().entry(ino).or_insert(0) += 1;
        self.storage.rt.spawn(async move {
            let _counted = InFlight { early: &engine.early, ino };
            if let Err(e) = engine.upload_early_now(&path, &hash).await {
                // The commit uploads the block as usual.
                tracing::debug!(scope = %engine.scope_id, ino, error = %e, "early upload skipped");
            }
        });
    }

    async fn upload_early_now(&self, path: &std::path::Path, hash: &OnceLock<String>) -> Result<(), String> {
        let _share = self.shares.upload.acquire().await;
        let _slot = self.storage.upload_slots.acquire().await;
        // Gone: the commit sealed and retired it meanwhile (and uploads it itself).
        let data = tokio::fs::read(path).await.map_err(|e| format!("reading the working file: {e}"))?;
        if data.len() as u64 != self.storage.settings.block_size {
            return Err("the block is no longer full".into());
        }
        let sha = hex::encode(Sha256::digest(&data));
        let _ = hash.set(sha.clone());
        // Registered with the look at its row, until its own row is recorded (`gc.rs`, rule 3).
        let _put = {
            let meta = self.meta.lock().map_err(|e| e.to_string())?;
            if meta.block_uploaded(&sha).map_err(|e| e.to_string())?.is_some() {
                return Ok(()); // the scope has these bytes already (stored, or its own upload queued)
            }
            match self.uploads.puts.begin(&meta, &sha) {
                Some(put) => put,
                None => return Err("gc is deleting an earlier copy; the commit uploads it".into()),
            }
        };
        crate::testhooks::interleave("early.before_put", self.scope_id.as_str());
        let key = block_key_at(self.scope_id.as_str(), self.key_epoch(), &sha);
        let timeout = self.storage.settings.store_timeout;
        let len = data.len() as u64;
        match tokio::time::timeout(timeout, self.storage.store.put_hashed(&key, Bytes::from(data), &sha)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        }
        crate::testhooks::interleave("early.before_record", self.scope_id.as_str());
        let now = super::meta::now_ns() / 1_000_000_000;
        let inserted = self.meta.lock().and_then(|mut m| m.record_unreferenced_upload(&sha, len, now));
        match inserted.map_err(|e| e.to_string())? {
            true => {
                self.early.recorded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            // A commit sealed the same bytes meanwhile (as a journal file): they are stored now, so
            // its upload is done. Inline bytes are left to their own upload (it reads them there).
            false if self.is_inline(&sha) => Ok(()),
            false => self.finish_uploads(&[(sha.as_str(), None)]).map_err(|e| e.to_string()),
        }
    }

    /// Waits (at most two store timeouts) until no early upload of `ino` is in flight, so the commit
    /// that follows finds what they stored instead of uploading it again.
    pub(crate) fn wait_early_uploads(&self, ino: Ino) {
        let deadline =
            Instant::now() + self.storage.settings.store_timeout.saturating_mul(2).max(Duration::from_secs(1));
        self.wait_early_until(deadline, |in_flight| !in_flight.contains_key(&ino));
    }

    /// Waits until no early upload of the scope is in flight; `false` if `deadline` passed first.
    pub(crate) fn wait_all_early_uploads(&self, deadline: Instant) -> bool {
        self.wait_early_until(deadline, HashMap::is_empty)
    }

    /// Waits until `done` holds of the uploads in flight; `false` if `deadline` passed first.
    fn wait_early_until(&self, deadline: Instant, done: impl Fn(&HashMap<Ino, usize>) -> bool) -> bool {
        let mut in_flight = self.early.in_flight.lock();
        while !done(&in_flight) {
            if self.early.finished.wait_until(&mut in_flight, deadline).timed_out() {
                return done(&in_flight);
            }
        }
        true
    }

    /// Early uploads started and not finished yet.
    pub fn early_uploads_in_flight(&self) -> usize {
        self.early.in_flight.lock().values().sum()
    }

    /// Blocks an early upload recorded (stored before any commit referenced them).
    pub fn early_uploads(&self) -> u64 {
        self.early.recorded.load(std::sync::atomic::Ordering::Relaxed)
    }
}
