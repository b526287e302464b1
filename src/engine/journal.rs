//! The inline journal: small staged blocks kept in the scope's metadata database (written by the
//! commit that first references them, so `close()` creates no file in staging) until their upload
//! is recorded. Owns the in-memory set of inline hashes, the marker that makes a restart recover
//! the scope eagerly, reads of inline blocks and their upload bookkeeping.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::error::EngineResult;
use super::scope::ScopeEngine;

/// Name of the marker file beside `blocks/` while the scope may hold inline journal rows: a
/// restart opens such a scope's database at once and resumes its uploads. It is created by the
/// first inline commit of a process and removed when the engine closes with an empty journal (or
/// by the next start's recovery), never in between: a commit never races its removal.
pub(crate) const INLINE_MARKER: &str = "inline-journal";

/// Which blocks are journaled inline (so reads need not ask the database for every block).
#[derive(Default)]
pub(crate) struct InlineJournal {
    shas: Mutex<HashSet<String>>,
    marked: AtomicBool,
    /// The marker was created since the last local flush.
    unsynced: AtomicBool,
}

impl ScopeEngine {
    fn inline_marker(&self) -> PathBuf {
        self.blocks_dir.with_file_name(INLINE_MARKER)
    }

    /// Runs `commit` (which writes `inline` rows for the hashes new to the scope and returns those
    /// hashes) with the inline bytes charged to staging first, the marker in place, and the hashes
    /// readable as inline while it runs; afterwards only the rows actually written stay charged.
    pub(crate) fn with_inline_journal(
        &self,
        inline: &BTreeMap<String, Vec<u8>>,
        commit: impl FnOnce() -> EngineResult<Vec<String>>,
    ) -> EngineResult<Vec<String>> {
        if inline.is_empty() {
            return commit();
        }
        let bytes: u64 = inline.values().map(|d| d.len() as u64).sum();
        self.staging_add(bytes)?;
        if let Err(e) = self.mark_inline_journal() {
            self.staging_sub(bytes);
            return Err(e);
        }
        // Readable as inline before the commit makes them reachable (a hash already in the set
        // belongs to an earlier commit and stays).
        let added: Vec<&String> = {
            let mut set = self.inline.shas.lock();
            inline.keys().filter(|sha| set.insert((*sha).clone())).collect()
        };
        crate::testhooks::interleave("inline.listed", self.scope_id.as_str());
        match commit() {
            Ok(new) => {
                let mut set = self.inline.shas.lock();
                for (sha, data) in inline {
                    if !new.contains(sha) {
                        self.staging_sub(data.len() as u64);
                        if added.contains(&sha) {
                            set.remove(sha);
                        }
                    }
                }
                Ok(new)
            }
            Err(e) => {
                self.staging_sub(bytes);
                let mut set = self.inline.shas.lock();
                for sha in added {
                    set.remove(sha);
                }
                Err(e)
            }
        }
    }

    /// Creates the marker (once per process).
    fn mark_inline_journal(&self) -> EngineResult<()> {
        if self.inline.marked.load(Ordering::Acquire) {
            return Ok(());
        }
        std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(self.inline_marker())?;
        // Its name is flushed by the next durability point (`sync_inline_marker`), not here:
        // `close()` never waits for a disk flush.
        self.inline.unsynced.store(true, Ordering::Release);
        self.inline.marked.store(true, Ordering::Release);
        Ok(())
    }

    /// Part of a durability point: makes the marker's name durable when it is new.
    pub(crate) fn sync_inline_marker(&self) -> EngineResult<()> {
        if self.inline.unsynced.swap(false, Ordering::AcqRel) {
            let dir = self.blocks_dir.parent().unwrap_or(&self.blocks_dir);
            if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
                self.inline.unsynced.store(true, Ordering::Release);
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Copies `buf.len()` bytes at `offset` of an inline-journaled block into `buf`; `false` when
    /// the block is not (or no longer) inline. With `listed_only`, only hashes known to be inline
    /// are looked up (the fast path); without, the database is asked (a read about to go to the
    /// object store: rows a power loss left without their marker are found too).
    pub(crate) fn read_inline(&self, sha: &str, offset: u64, buf: &mut [u8], listed_only: bool) -> EngineResult<bool> {
        if listed_only && !self.inline.shas.lock().contains(sha) {
            return Ok(false);
        }
        let Some(data) = self.meta.lock()?.inline_block(sha)? else { return Ok(false) };
        let start = offset as usize;
        if data.len() < start + buf.len() {
            return Err(super::error::EngineError::Corrupt { sha256: sha.to_string() });
        }
        buf.copy_from_slice(&data[start..start + buf.len()]);
        Ok(true)
    }

    /// Records the uploads of a group in one transaction (each with its length when it was
    /// inline): their rows leave the journal with the "uploaded" marks. The uploader has put
    /// inline blocks' bytes into the cache first when the store is remote, so a reader always
    /// finds them somewhere.
    pub(crate) fn record_uploads(&self, done: &[(&str, Option<u64>)]) -> EngineResult<()> {
        if done.is_empty() {
            return Ok(());
        }
        let shas: Vec<&str> = done.iter().map(|(sha, _)| *sha).collect();
        let had_rows = self.meta.lock()?.mark_uploaded_many(&shas)?;
        for ((sha, len), had_row) in done.iter().zip(had_rows) {
            self.forget_inline(sha, had_row, len.unwrap_or(0));
        }
        Ok(())
    }

    /// A block that left the inline journal (uploaded or collected): no longer read from the
    /// database, and no longer charged to staging when its row was there.
    pub(crate) fn forget_inline(&self, sha: &str, had_row: bool, len: u64) {
        // The charge follows the row (charged when a commit wrote it), not the set: a commit may
        // have listed the hash anew while the row went (`unneeded.rs`, gc).
        self.inline.shas.lock().remove(sha);
        if had_row {
            self.staging_sub(len);
        }
    }

    pub(crate) fn is_inline(&self, sha: &str) -> bool {
        self.inline.shas.lock().contains(sha)
    }

    /// Startup: the inline rows become readable and charged again; without any, the marker goes.
    /// Returns their hashes (the caller queues their uploads).
    pub(crate) fn recover_inline(&self, rows: Vec<(String, u64)>) -> Vec<String> {
        if rows.is_empty() {
            let _ = std::fs::remove_file(self.inline_marker());
            return Vec::new();
        }
        self.inline.marked.store(true, Ordering::Release);
        // Its name may never have been flushed (an earlier process died before a durability
        // point): the next durability point flushes it.
        self.inline.unsynced.store(true, Ordering::Release);
        let mut set = self.inline.shas.lock();
        let mut shas = Vec::with_capacity(rows.len());
        for (sha, len) in rows {
            // Already on disk: counted even past the budget (new writes are refused instead).
            if self.staging_add(len).is_err() {
                self.force_staging_add(len);
            }
            set.insert(sha.clone());
            shas.push(sha);
        }
        shas
    }

    /// The engine is closing (no other reference): with nothing left in the inline journal, the
    /// marker goes, so the next start opens this scope's database only on use.
    pub(crate) fn close_inline_journal(&self) {
        if self.inline.marked.load(Ordering::Acquire) && self.inline.shas.lock().is_empty() {
            let _ = std::fs::remove_file(self.inline_marker());
        }
    }
}

impl Drop for ScopeEngine {
    fn drop(&mut self) {
        self.close_inline_journal();
        if let Err(e) = self.open_log.empty_if_settled() {
            tracing::warn!(scope = %self.scope_id, error = %e, "emptying the open-file log at close failed");
        }
    }
}
