//! Uploads that are no longer needed: a block journaled inline (its bytes in the scope's database,
//! never stored) that no file refers to any more when the background uploader's turn comes (its
//! file was deleted or rewritten first, as a build's temporaries or an `rm -rf` right after an
//! unpack are) is taken out of the journal instead of being put, so the store never sees it and
//! gc never has to delete it.
//!
//! Why that is safe (the uploader's side of `gc.rs`'s rules):
//!
//! - Before a group is uploaded, its blocks are looked at a page at a time, each page under one
//!   hold of the metadata lock: those unreferenced, staged and inline, with no other put of them
//!   registered (rule 3), have their rows taken in that same hold, in one transaction. A commit
//!   that refers to such a block again runs wholly before (the block is referenced: it is
//!   uploaded) or wholly after (it finds no row and journals the bytes it brings as a new block,
//!   queued anew).
//! - Their queue entries (`pending`) go in that same hold, so such a commit's new entry is never
//!   swallowed by the old one; the group goes on without them.
//! - There is no object to delete and no journal file (an inline block has none): the row and its
//!   bytes are all there is. Its removal need not be durable: a power loss that brings it back
//!   brings it back unreferenced, and the uploader takes it again.
//! - A fork copying the scope's database holds drops off (`hold_drops`) from before its copy until
//!   what the copy names is stored: the copy may name a block the scope lets go of meanwhile.
//! - A restore from the bucket may come back to a state that still named the block (its file's
//!   removal not shipped yet) and find it missing: a file that was never fsynced, the same state
//!   as when the uploader had not reached the block yet; `fsck` names it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::error::EngineResult;
use super::scope::ScopeEngine;

/// Blocks taken out of the journal without an upload in this process, and their bytes.
static BLOCKS_DROPPED: AtomicU64 = AtomicU64::new(0);
static BYTES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// Blocks (and bytes) dropped from the inline journal without an upload, for `/metrics`.
pub fn unneeded_upload_totals() -> (u64, u64) {
    (BLOCKS_DROPPED.load(Ordering::Relaxed), BYTES_DROPPED.load(Ordering::Relaxed))
}

/// Forks copying the scope's database now (drops wait while any does).
#[derive(Default)]
pub(crate) struct DropHolds(AtomicUsize);

/// Holds drops off while it lives.
pub(crate) struct DropHold<'a>(&'a DropHolds);

impl Drop for DropHold<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Blocks looked at under one hold of the metadata lock (as gc's online pages: the longest a
/// commit waits for it).
const DROP_PAGE: usize = 32;

impl ScopeEngine {
    /// Holds drops of unneeded uploads off until the guard goes (take it before the copy).
    pub(crate) fn hold_drops(&self) -> DropHold<'_> {
        self.uploads.drop_holds.0.fetch_add(1, Ordering::SeqCst);
        DropHold(&self.uploads.drop_holds)
    }

    /// Takes the unneeded blocks of an upload group out of the journal; returns the rest, to be
    /// uploaded. A failure leaves the rest of the group to be uploaded as it would have been.
    pub(crate) fn drop_unneeded(&self, group: Vec<String>) -> Vec<String> {
        let mut dropped = HashSet::new();
        for page in group.chunks(DROP_PAGE) {
            match self.drop_page(page) {
                Ok(shas) => dropped.extend(shas),
                Err(e) => {
                    tracing::debug!(scope = %self.scope_id, error = %e, "looking for unneeded uploads failed");
                    break;
                }
            }
        }
        if dropped.is_empty() {
            return group;
        }
        crate::testhooks::interleave("upload.dropped", self.scope_id.as_str());
        group.into_iter().filter(|sha| !dropped.contains(sha)).collect()
    }

    /// One page: what it took out of the journal.
    fn drop_page(&self, page: &[String]) -> EngineResult<Vec<String>> {
        let mut meta = self.meta.lock()?;
        // Read under the lock: a fork takes its hold before its copy takes the lock.
        if self.uploads.drop_holds.0.load(Ordering::SeqCst) > 0 {
            return Ok(Vec::new());
        }
        let mut blocks = meta.unneeded_among(page)?;
        blocks.retain(|b| !self.uploads.puts.contains(&b.sha256));
        if blocks.is_empty() {
            return Ok(Vec::new());
        }
        meta.take_unreferenced(&mut blocks)?;
        let mut pending = self.uploads.pending.lock();
        for b in &blocks {
            pending.remove(&b.sha256);
        }
        drop(pending);
        drop(meta);
        let mut shas = Vec::with_capacity(blocks.len());
        for b in blocks {
            self.forget_inline(&b.sha256, b.inline, b.len);
            BLOCKS_DROPPED.fetch_add(1, Ordering::Relaxed);
            BYTES_DROPPED.fetch_add(b.len, Ordering::Relaxed);
            shas.push(b.sha256);
        }
        Ok(shas)
    }
}
