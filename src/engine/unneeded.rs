//! Uploads that are no longer needed: a block journaled inline (its bytes in the scope's database,
//! never stored) that no file refers to any more when the background uploader's turn comes (its
//! file was deleted or rewritten first, as a build's temporaries or an `rm -rf` right after an
//! unpack are) is taken out of the journal instead of being put, so the store never sees it and
//! gc never has to delete it.
//!
//! Why that is safe (the uploader's side of `gc.rs`'s rules):
//!
//! - The row is taken under the metadata lock, in the same hold that found it unreferenced, staged
//!   and inline, and only while no other put of the block is registered (rule 3): a commit that
//!   refers to the block again runs wholly before (the block is referenced: it is uploaded) or
//!   wholly after (it finds no row and journals the bytes it brings as a new block, queued anew).
//! - Its queue entry (`pending`) goes in that same hold, so such a commit's new entry is never
//!   swallowed by the old one.
//! - There is no object to delete and no journal file (an inline block has none): the row and its
//!   bytes are all there is. Its removal need not be durable: a power loss that brings it back
//!   brings it back unreferenced, and the uploader takes it again.
//! - A fork copying the scope's database holds drops off (`hold_drops`) from before its copy until
//!   what the copy names is stored: the copy may name a block the scope lets go of meanwhile.
//! - A restore from the bucket may come back to a state that still named the block (its file's
//!   removal not shipped yet) and find it missing: a file that was never fsynced, the same state
//!   as when the uploader had not reached the block yet; `fsck` names it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::error::EngineResult;
use super::meta::{MetaDb, Unreferenced};
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

impl ScopeEngine {
    /// Holds drops of unneeded uploads off until the guard goes (take it before the copy).
    pub(crate) fn hold_drops(&self) -> DropHold<'_> {
        self.uploads.drop_holds.0.fetch_add(1, Ordering::SeqCst);
        DropHold(&self.uploads.drop_holds)
    }

    /// Takes `block` (found unneeded in `meta`'s current hold of the lock) out of the journal
    /// unless a put of it is registered or a fork holds drops off; `true` when it went. Its queue
    /// entry goes in the same hold; its staging charge after.
    pub(crate) fn drop_unneeded(&self, meta: &mut MetaDb, block: Unreferenced) -> EngineResult<bool> {
        if self.uploads.drop_holds.0.load(Ordering::SeqCst) > 0 || self.uploads.puts.contains(&block.sha256) {
            return Ok(false);
        }
        let mut taken = vec![block];
        meta.take_unreferenced(&mut taken)?;
        let Some(block) = taken.pop() else { return Ok(false) };
        self.uploads.pending.lock().remove(&block.sha256);
        self.forget_inline(&block.sha256, block.inline, block.len);
        BLOCKS_DROPPED.fetch_add(1, Ordering::Relaxed);
        BYTES_DROPPED.fetch_add(block.len, Ordering::Relaxed);
        Ok(true)
    }
}
