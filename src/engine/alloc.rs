//! `fallocate` of an open file: allocate (grow the size, charged to the quota like a write),
//! `KEEP_SIZE` preallocation, and punching/zeroing a range (whole blocks become holes).
//!
//! A child module of `fileio` (declared there), so it works on the open-file state directly.
//! Blocks are not reserved on disk: a scope stores files sparsely and charges the apparent size,
//! so allocating is making the size (and its quota charge) real; a hole reads as zeros.

use super::{OpenFile, MAX_FILE_SIZE};
use crate::engine::openlog::Change;
use crate::engine::{EngineError, EngineResult, Fh, Ino, ScopeEngine};
use std::sync::atomic::Ordering;

/// What a `fallocate` call asks for (Linux `FALLOC_FL_*`; other modes are refused by the adapter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocMode {
    /// Mode 0 (`keep_size: false`): the file is at least `offset + len` long afterwards.
    /// `FALLOC_FL_KEEP_SIZE`: no change; refused with `QuotaExceeded` when the byte quota has no
    /// room for the range beyond the end (nothing is reserved: a later write may still be refused).
    Allocate { keep_size: bool },
    /// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`: the range reads as zeros; blocks wholly inside
    /// it are dropped (holes), partial ones zeroed. The size never changes.
    PunchHole,
    /// `FALLOC_FL_ZERO_RANGE` (with or without `KEEP_SIZE`): like `PunchHole`, and without
    /// `keep_size` the size grows to `offset + len` like mode 0.
    ZeroRange { keep_size: bool },
}

impl ScopeEngine {
    /// `fallocate(2)` on handle `fh` (which must be open for writing) of file `ino`. A change of
    /// size or content updates the mtime (and the ctime when committed, at close or fsync).
    pub fn fallocate(&self, ino: Ino, fh: Fh, offset: u64, len: u64, mode: AllocMode) -> EngineResult<()> {
        self.check_writable()?;
        if len == 0 {
            return Err(EngineError::Invalid("fallocate of an empty range"));
        }
        let Some(end) = offset.checked_add(len).filter(|e| *e <= MAX_FILE_SIZE) else {
            crate::limits::refuse(crate::limits::Bound::FileSize);
            return Err(EngineError::TooLarge);
        };
        let file = self.file_of(ino, fh, true)?;
        let mut f = file.lock();
        // What changed, as the open-file log records it.
        let mut changes = Vec::new();
        match mode {
            AllocMode::Allocate { keep_size: false } => {
                if self.grow_to(&mut f, end)? {
                    changes.push(Change::SetSize { size: end });
                }
            }
            AllocMode::Allocate { keep_size: true } => self.check_room(&f, end)?,
            AllocMode::PunchHole | AllocMode::ZeroRange { keep_size: true } => {
                if self.zero_range(&mut f, ino, offset, end)? {
                    changes.push(Change::Zero { start: offset, end });
                }
            }
            AllocMode::ZeroRange { keep_size: false } => {
                // Grown first (quota checked before anything changes); the new part is a hole already.
                let old_size = f.size;
                if self.grow_to(&mut f, end)? {
                    changes.push(Change::SetSize { size: end });
                }
                if self.zero_range(&mut f, ino, offset, end.min(old_size))? {
                    changes.push(Change::Zero { start: offset, end: end.min(old_size) });
                }
            }
        }
        if !changes.is_empty() {
            self.mark_changed(&mut f);
            self.log_changes(ino, &mut f, changes)?;
            if self.commit_each_write.load(Ordering::SeqCst) {
                self.commit_locked(ino, &mut f)?;
            }
        }
        Ok(())
    }

    /// Grows the file to `end` bytes (a hole), reserving the growth against the byte quota.
    fn grow_to(&self, f: &mut OpenFile, end: u64) -> EngineResult<bool> {
        if end <= f.size {
            return Ok(false);
        }
        self.reserve_growth(end - f.size)?;
        f.size = end;
        Ok(true)
    }

    /// `QuotaExceeded` unless the byte quota has room for the file to reach `end` bytes (no reservation).
    fn check_room(&self, f: &OpenFile, end: u64) -> EngineResult<()> {
        let growth = end.saturating_sub(f.size);
        if growth == 0 {
            return Ok(());
        }
        let meta = self.meta.lock()?;
        let committed = meta.usage()?.bytes;
        let pending = *self.pending_growth.lock();
        self.check_bytes(committed, pending, growth)
    }

    /// Makes `[start, end)` (clipped to the size) read as zeros: blocks wholly inside become holes,
    /// partial ones are zeroed in a dirty copy. Visits only the blocks the file has. True when a
    /// block changed.
    pub(super) fn zero_range(&self, f: &mut OpenFile, ino: Ino, start: u64, end: u64) -> EngineResult<bool> {
        let end = end.min(f.size);
        if start >= end {
            return Ok(false);
        }
        let bs = self.block_size();
        let (first, last) = (start / bs, (end - 1) / bs);
        let mut present: Vec<u64> = f.blocks.range(first..=last).map(|(i, _)| *i).collect();
        present.extend(f.dirty.range(first..=last).map(|(i, _)| *i));
        present.sort_unstable();
        present.dedup();
        let mut changed = false;
        for idx in present {
            let base = idx * bs;
            let in_file = bs.min(f.size - base);
            let (s, e) = (start.max(base) - base, end.min(base + bs) - base);
            changed = true;
            if s == 0 && e >= in_file {
                f.blocks.remove(&idx);
                if let Some(d) = f.dirty.remove(&idx) {
                    self.discard_dirty(d);
                }
                continue;
            }
            self.ensure_dirty(f, ino, idx, 0, 0)?;
            let d = f.dirty.get_mut(&idx).ok_or(EngineError::BadHandle)?;
            let stop = e.min(d.len());
            if stop > s {
                // Charged like any write: zeros written into a working file's hole take disk.
                self.write_dirty(d, ino, idx, &vec![0u8; (stop - s) as usize], s)?;
            }
        }
        Ok(changed)
    }
}
