//! File contents: open-file state, reads through dirty blocks (`dirty.rs`), the inline journal, staging, cache and store, truncate, and commits of new versions.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::dirty::{DirtyBlock, Sealed};
use super::error::{EngineError, EngineResult};
use super::meta::{BlockRef, FileVersion, InodeRow};
use super::scope::{HandleInfo, ScopeEngine};
use super::types::*;
use crate::store::StoreError;

/// `fallocate`: works on the open-file state below.
#[path = "alloc.rs"]
pub(super) mod alloc;
/// Reads of one committed block: inline journal, staging, cache, local directory or store.
#[path = "blockread.rs"]
mod blockread;
/// Open files across a restart: their uncommitted changes logged, and replayed after a crash.
#[path = "reopen.rs"]
mod reopen;
/// Open files' changes committed while they stay open: after a bound, under pressure, at handover.
#[path = "writeback.rs"]
pub(super) mod writeback;

/// Largest file size: sizes and usage are stored as SQLite integers (`i64`). Larger is `TooLarge`.
pub(crate) const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// An open file shared by all its handles.
pub(crate) struct OpenEntry {
    pub handles: u32,
    pub file: Arc<Mutex<OpenFile>>,
    /// The inode has no name any more (unlinked or renamed over while open, or an `O_TMPFILE`):
    /// the last handle's release deletes it.
    pub detached: bool,
}

pub(crate) struct OpenFile {
    size: u64,
    committed_size: u64,
    /// The committed block list, minus blocks cut away by a pending truncate.
    pub(super) blocks: BTreeMap<u64, BlockRef>,
    pub(super) dirty: BTreeMap<u64, DirtyBlock>,
    /// Since when the file has changes not committed yet (`None`: none).
    changed: Option<Instant>,
    mtime_ns: i64,
    last_read_block: Option<u64>,
    /// The committed version the state builds on (what its logged changes name).
    version: u64,
    /// The inode was seen without set-user-ID and set-group-ID bits to clear (`privs.rs`).
    pub(super) privs_clear: bool,
}

/// Where the bytes of one piece of a read come from.
/// Why a read failed, and the block (index, hash) it was reading when it was one.
type ReadFailure = (EngineError, Option<(u64, String)>);

enum Piece {
    Ready(Vec<u8>),
    Block { idx: u64, block: BlockRef, offset: u64, len: u64 },
}

impl ScopeEngine {
    fn block_size(&self) -> u64 {
        self.storage.settings.block_size
    }

    /// Current size and pending mtime of an open file.
    pub(crate) fn open_overlay(&self, ino: Ino) -> Option<(u64, Option<i64>)> {
        let file = self.open_files.lock().get(&ino).map(|e| e.file.clone())?;
        let f = file.lock();
        Some((f.size, f.changed.is_some().then_some(f.mtime_ns)))
    }

    pub(crate) fn override_open_mtime(&self, ino: Ino, mtime_ns: i64) {
        if let Some(file) = self.open_files.lock().get(&ino).map(|e| e.file.clone()) {
            file.lock().mtime_ns = mtime_ns;
        }
    }

    /// Registers one more handle on `ino`, loading its state on first open.
    fn acquire(&self, ino: Ino) -> EngineResult<Arc<Mutex<OpenFile>>> {
        if let Some(e) = self.open_files.lock().get_mut(&ino) {
            e.handles += 1;
            return Ok(e.file.clone());
        }
        let (row, blocks) = {
            let meta = self.meta.lock()?;
            let row = meta.inode(ino)?;
            if row.kind != FileKind::File {
                return Err(if row.kind == FileKind::Dir {
                    EngineError::IsDir
                } else {
                    EngineError::Invalid("not a regular file")
                });
            }
            (row.clone(), meta.blocks_of(ino)?)
        };
        Ok(self.register_open(&row, blocks))
    }

    /// Registers one more handle on `row`'s inode: its open state is `blocks` and the row's size
    /// unless another request opened it meanwhile.
    fn register_open(&self, row: &InodeRow, blocks: BTreeMap<u64, BlockRef>) -> Arc<Mutex<OpenFile>> {
        let fresh = Arc::new(Mutex::new(OpenFile {
            size: row.size,
            committed_size: row.size,
            blocks,
            dirty: BTreeMap::new(),
            changed: None,
            mtime_ns: row.mtime_ns,
            last_read_block: None,
            version: row.version,
            privs_clear: false,
        }));
        let mut map = self.open_files.lock();
        let e = map.entry(row.ino).or_insert(OpenEntry { handles: 0, file: fresh, detached: row.parent.is_none() });
        e.handles += 1;
        e.file.clone()
    }

    /// A new handle on an inode registered by `acquire` or `register_open`. The low bit carries the
    /// write right, so a later process can adopt the handle.
    fn new_handle(&self, ino: Ino, write: bool) -> Opened {
        let fh = (self.next_fh.fetch_add(1, Ordering::Relaxed) << 1) | u64::from(write);
        let err_seen = self.errors.sample(ino);
        self.handles.lock().insert(fh, HandleInfo { ino, write, err_seen });
        Opened { fh, keep_cache: true }
    }

    /// Opens a regular file `create` has just inserted (`row`): empty, so nothing is read back.
    pub(crate) fn open_created(&self, row: &InodeRow, write: bool) -> Opened {
        self.register_open(row, BTreeMap::new());
        self.new_handle(row.ino, write)
    }

    pub(super) fn file_of(&self, ino: Ino, fh: Fh, write: bool) -> EngineResult<Arc<Mutex<OpenFile>>> {
        let known = self.handles.lock().get(&fh).copied();
        let h = match known {
            Some(h) => h,
            None => self.adopt_handle(ino, fh)?,
        };
        if h.ino != ino || (write && !h.write) {
            return Err(EngineError::BadHandle);
        }
        self.open_files.lock().get(&ino).map(|e| e.file.clone()).ok_or(EngineError::BadHandle)
    }

    /// A handle this process never opened: one an earlier daemon process serving the same mount
    /// returned to the kernel (handles outlive a restart, issue 9). Its open state is re-created
    /// from the inode and its write right read from the handle's low bit (`open`'s encoding).
    /// Numbers never repeat across processes (`ScopeEngine::next_fh` starts at the clock), so an
    /// unknown number is never another live handle. Data such a handle had not committed when its
    /// process was killed is lost (fs/SEMANTICS.md).
    fn adopt_handle(&self, ino: Ino, fh: Fh) -> EngineResult<HandleInfo> {
        if fh == 0 {
            return Err(EngineError::BadHandle);
        }
        self.acquire(ino)?;
        // Opened before anything this process saw: every error since is news to it.
        let info = HandleInfo { ino, write: fh & 1 == 1, err_seen: Default::default() };
        let raced = {
            let mut handles = self.handles.lock();
            match handles.get(&fh).copied() {
                Some(existing) => Some(existing),
                None => {
                    handles.insert(fh, info);
                    None
                }
            }
        };
        match raced {
            // Another request adopted it first: keep one reference.
            Some(existing) => {
                self.drop_handle_ref(ino);
                Ok(existing)
            }
            None => {
                tracing::debug!(ino, "handle of an earlier process adopted");
                Ok(info)
            }
        }
    }

    pub fn open(&self, ino: Ino, flags: OpenFlags) -> EngineResult<Opened> {
        if flags.write || flags.truncate {
            self.check_writable()?;
        }
        let file = self.acquire(ino)?;
        if flags.truncate {
            let mut f = file.lock();
            if let Err(e) = self.truncate_locked(&mut f, 0).and_then(|_| self.commit_locked(ino, &mut f)) {
                drop(f);
                self.drop_handle_ref(ino);
                return Err(e);
            }
        }
        Ok(self.new_handle(ino, flags.write))
    }

    pub fn read(&self, ino: Ino, fh: Fh, offset: u64, size: u32) -> EngineResult<Vec<u8>> {
        let file = self.file_of(ino, fh, false)?;
        let mut again = 0;
        loop {
            match self.read_once(&file, offset, size) {
                // A block of a version the file no longer has may be gone (online gc, rule 6):
                // read what the file holds now.
                Err((EngineError::Store(StoreError::NotFound { .. }), Some((idx, sha))))
                    if again < 2 && file.lock().blocks.get(&idx).is_none_or(|b| b.sha256 != sha) =>
                {
                    again += 1;
                }
                r => return r.map_err(|(e, _)| e),
            }
        }
    }

    /// One read of `file`; a failure names the block (index, hash) it was reading, if any.
    fn read_once(&self, file: &Mutex<OpenFile>, offset: u64, size: u32) -> Result<Vec<u8>, ReadFailure> {
        let bs = self.block_size();
        let mut pieces = Vec::new();
        let mut ahead = Vec::new();
        {
            let mut f = file.lock();
            if offset >= f.size || size == 0 {
                return Ok(Vec::new());
            }
            let end = f.size.min(offset + size as u64);
            let mut pos = offset;
            while pos < end {
                let idx = pos / bs;
                let in_off = pos % bs;
                let n = (bs - in_off).min(end - pos);
                if let Some(d) = f.dirty.get(&idx) {
                    let mut buf = vec![0u8; n as usize];
                    let avail = d.len().saturating_sub(in_off).min(n) as usize;
                    if avail > 0 {
                        d.read_at(&mut buf[..avail], in_off).map_err(|e| (e.into(), None))?;
                    }
                    pieces.push(Piece::Ready(buf));
                } else if let Some(b) = f.blocks.get(&idx) {
                    pieces.push(Piece::Block { idx, block: b.clone(), offset: in_off, len: n });
                } else {
                    pieces.push(Piece::Ready(vec![0u8; n as usize]));
                }
                pos += n;
            }
            let first = offset / bs;
            let last = (end - 1) / bs;
            let sequential = first == 0 || f.last_read_block.is_some_and(|l| l + 1 >= first && l <= last);
            f.last_read_block = Some(last);
            if sequential {
                for i in last + 1..=last + self.storage.settings.readahead_blocks {
                    if let (Some(b), false) = (f.blocks.get(&i), f.dirty.contains_key(&i)) {
                        ahead.push(b.sha256.clone());
                    }
                }
            }
        }
        if !ahead.is_empty() {
            self.prefetch(ahead).map_err(|e| (e, None))?;
        }
        crate::testhooks::interleave("read.resolved", self.scope_id.as_str());
        let mut out = Vec::with_capacity(size as usize);
        for p in pieces {
            match p {
                Piece::Ready(b) => out.extend_from_slice(&b),
                Piece::Block { idx, block, offset, len } => {
                    self.read_block_range(&block, offset, len, &mut out).map_err(|e| (e, Some((idx, block.sha256))))?
                }
            }
        }
        Ok(out)
    }

    /// Writes `data` at `offset` through handle `fh`: into the open file's dirty blocks, logged in
    /// the open-file log before it returns (a killed process's successor replays it).
    pub fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> EngineResult<u32> {
        self.check_writable()?;
        let file = self.file_of(ino, fh, true)?;
        let mut f = file.lock();
        let end = offset.checked_add(data.len() as u64).ok_or(EngineError::Invalid("offset overflow"))?;
        if end > MAX_FILE_SIZE {
            crate::limits::refuse(crate::limits::Bound::FileSize);
            return Err(EngineError::TooLarge);
        }
        if end > f.size {
            self.reserve_growth(end - f.size)?;
        }
        let (reached, result) = self.write_with_room(&mut f, ino, offset, data);
        if reached > offset {
            self.mark_changed(&mut f);
            let written = &data[..(reached - offset) as usize];
            // A write that cannot be logged fails (its bytes stay in the open file, uncommitted).
            self.log_write(ino, &mut f, offset, written)?;
        }
        result?;
        if self.commit_each_write.load(Ordering::SeqCst) {
            self.commit_locked(ino, &mut f)?;
        }
        Ok(data.len() as u32)
    }

    /// Puts `data` at `offset` into the dirty blocks (growth already reserved by the caller; what was
    /// reserved beyond what got written is given back). Returns how far it got and whether it all went.
    fn write_blocks(&self, f: &mut OpenFile, ino: Ino, offset: u64, data: &[u8]) -> (u64, EngineResult<()>) {
        let end = offset + data.len() as u64;
        let bs = self.block_size();
        let mut pos = offset;
        let result = (|| -> EngineResult<()> {
            while pos < end {
                let idx = pos / bs;
                let in_off = pos % bs;
                let n = (bs - in_off).min(end - pos);
                let src = &data[(pos - offset) as usize..(pos - offset + n) as usize];
                self.ensure_dirty(f, ino, idx, in_off, n)?;
                let d = f.dirty.get_mut(&idx).ok_or(EngineError::BadHandle)?;
                self.write_dirty(d, ino, idx, src, in_off)?;
                // A sequential writer just filled this block: upload it while the writer goes on.
                if in_off + n == bs && self.uploads_early() {
                    if let Some((path, hash)) = d.take_full_for_early(bs) {
                        self.upload_early(ino, path, hash);
                    }
                }
                pos += n;
            }
            Ok(())
        })();
        let reached = pos;
        if end > f.size {
            // Only what was written counts; release the rest of the reservation.
            let grown = reached.saturating_sub(f.size);
            *self.pending_growth.lock() -= (end - f.size - grown) as i64;
            f.size = f.size.max(reached);
        }
        (reached, result)
    }

    /// Checks the byte quota for `growth` more bytes and reserves them. Committed usage and pending
    /// growth are read under the metadata lock, which commits also hold while they move bytes from
    /// pending to committed, so the sum is never seen half-moved.
    fn reserve_growth(&self, growth: u64) -> EngineResult<()> {
        let meta = self.meta.lock()?;
        let committed = meta.usage()?.bytes;
        let mut pending = self.pending_growth.lock();
        self.check_bytes(committed, *pending, growth)?;
        *pending += growth as i64; // ≤ the quota, itself ≤ i64::MAX (checked above)
        Ok(())
    }

    /// Sets the size of a file (open or not) and commits the change.
    pub(crate) fn truncate(&self, ino: Ino, size: u64) -> EngineResult<()> {
        let file = self.acquire(ino)?;
        let result = {
            let mut f = file.lock();
            self.truncate_locked(&mut f, size).and_then(|_| self.commit_locked(ino, &mut f))
        };
        self.drop_handle_ref(ino);
        result.map(|_| ())
    }

    fn truncate_locked(&self, f: &mut OpenFile, size: u64) -> EngineResult<()> {
        if size == f.size {
            return Ok(());
        }
        if size > MAX_FILE_SIZE {
            crate::limits::refuse(crate::limits::Bound::FileSize);
            return Err(EngineError::TooLarge);
        }
        if size > f.size {
            self.reserve_growth(size - f.size)?;
        } else {
            *self.pending_growth.lock() -= (f.size - size) as i64;
        }
        let bs = self.block_size();
        let first_gone = size.div_ceil(bs);
        for (_, d) in f.dirty.split_off(&first_gone) {
            self.discard_dirty(d);
        }
        f.blocks.split_off(&first_gone);
        let tail = size % bs;
        if tail > 0 && size < f.size {
            let idx = size / bs;
            let longer = f.blocks.get(&idx).is_some_and(|b| b.len > tail);
            if longer && !f.dirty.contains_key(&idx) {
                self.ensure_dirty(f, 0, idx, 0, 0)?;
            }
            if let Some(d) = f.dirty.get_mut(&idx) {
                if d.len() > tail {
                    self.resize_dirty(d, 0, idx, tail)?;
                }
            }
        }
        f.size = size;
        self.mark_changed(f);
        Ok(())
    }

    /// Seals dirty blocks into the journal and commits the new version; queues the blocks new to
    /// the scope for background upload and returns their hashes.
    fn commit_locked(&self, ino: Ino, f: &mut OpenFile) -> EngineResult<Vec<String>> {
        self.commit_with(ino, f, false)
    }

    /// Like `commit_locked`, but with `foreground` the new blocks are not queued: the caller
    /// uploads them (and queues them if that fails).
    fn commit_with(&self, ino: Ino, f: &mut OpenFile, foreground: bool) -> EngineResult<Vec<String>> {
        if f.changed.is_none() {
            return Ok(Vec::new());
        }
        let bs = self.block_size();
        let mut blocks = f.blocks.clone();
        let mut sealed = Vec::new();
        // In-memory blocks, journaled inline by the commit's transaction (deduplicated by hash).
        let mut inline = BTreeMap::new();
        // Dirty blocks whose file is now the journal's `blocks/<sha>` (the others are duplicates).
        let mut linked = std::collections::HashSet::new();
        for (&idx, d) in f.dirty.iter_mut() {
            if idx * bs >= f.size {
                continue;
            }
            let len = bs.min(f.size - idx * bs);
            self.resize_dirty(d, ino, idx, len)?;
            let (sha, how) = self.seal_dirty(d)?;
            match how {
                Sealed::Inline(data) => {
                    inline.insert(sha.clone(), data);
                }
                Sealed::File(true) => {
                    linked.insert(idx);
                    sealed.push(sha.clone());
                }
                Sealed::File(false) => sealed.push(sha.clone()),
            }
            blocks.insert(idx, BlockRef { sha256: sha, len });
        }
        self.note_unsynced(&sealed);
        crate::testhooks::interleave("commit.sealed", self.scope_id.as_str());
        let content_sha = content_sha256(&blocks, f.size);
        let (new, version) = self.commit_version(ino, f, &blocks, content_sha.as_deref(), &inline)?;
        for (idx, d) in std::mem::take(&mut f.dirty) {
            self.retire_dirty(d, linked.contains(&idx));
        }
        f.committed_size = f.size;
        f.blocks = blocks;
        f.changed = None;
        f.version = version;
        self.open_log.settled(true);
        self.retire_redundant_sealed(&sealed, &new)?;
        if !foreground {
            for sha in &new {
                self.enqueue_upload(sha.clone());
            }
        }
        Ok(new)
    }

    /// Records the new version (and its inline journal entries) under the metadata lock, moving
    /// the file's pending growth to committed usage.
    fn commit_version(
        &self,
        ino: Ino,
        f: &OpenFile,
        blocks: &BTreeMap<u64, BlockRef>,
        content_sha256: Option<&str>,
        inline: &BTreeMap<String, Vec<u8>>,
    ) -> EngineResult<(Vec<String>, u64)> {
        let version = FileVersion { ino, size: f.size, mtime_ns: f.mtime_ns, blocks, content_sha256 };
        let number = std::cell::Cell::new(0);
        let new = self.with_inline_journal(inline, || {
            let mut meta = self.meta.lock()?;
            let (new, n) = meta.commit_file(&version, inline)?;
            number.set(n);
            // Moved from pending to committed under the metadata lock (see `reserve_growth`).
            *self.pending_growth.lock() -= f.size as i64 - f.committed_size as i64;
            Ok(new)
        })?;
        Ok((new, number.get()))
    }

    /// Commits the file's dirty data (a new version) without a disk flush: it survives a killed
    /// daemon, and the next durability point makes it survive power loss. In `close` durability
    /// this is that point (as `fsync`).
    pub fn flush(&self, ino: Ino, fh: Fh) -> EngineResult<()> {
        let file = self.file_of(ino, fh, false)?;
        self.report_errors(ino, fh)?;
        if self.storage.settings.durability == Durability::Close {
            self.commit_and_upload(ino, &file)
        } else {
            self.commit_locked(ino, &mut file.lock()).map(|_| ())
        }
    }

    /// Directory fsync: every earlier commit of the scope (namespace and file versions) survives
    /// power loss when it returns (one grouped local flush), and with metadata shipping the loss
    /// of the host too (`upload_for_shipping`).
    pub fn fsync_dir(&self) -> EngineResult<()> {
        let uploaded = self.upload_for_shipping();
        self.flush_local()?;
        uploaded
    }

    /// With metadata shipped to the bucket, a durability point's promise covers the bucket: every
    /// block of every committed version is uploaded before the batches that name it are waited
    /// for, so a restore never names a version whose blocks the bucket lacks (found by the
    /// lost-host states of `tests/crash_states.rs`: a directory fsync shipped a file's new
    /// version, not its blocks, and the restored file read EIO). Nothing without shipping.
    fn upload_for_shipping(&self) -> EngineResult<()> {
        if self.ship.is_none() {
            return Ok(());
        }
        let staged = self.meta.lock()?.staged_blocks()?;
        self.upload_now(&staged)
    }

    /// Commits the file, makes everything the scope committed so far survive power loss, and
    /// waits until every block of the file is in the object store (bounded attempts and
    /// timeouts: an unreachable store answers `Store`, after the local flush).
    pub fn fsync(&self, ino: Ino, fh: Option<Fh>) -> EngineResult<()> {
        let file = match fh {
            Some(fh) => {
                let file = self.file_of(ino, fh, false)?;
                self.report_errors(ino, fh)?;
                file
            }
            None => match self.open_files.lock().get(&ino) {
                Some(e) => e.file.clone(),
                None => {
                    let uploaded =
                        self.upload_now(&self.committed_shas(ino)?).and_then(|()| self.upload_for_shipping());
                    self.flush_local()?;
                    return uploaded;
                }
            },
        };
        self.commit_and_upload(ino, &file)
    }

    /// The whole scope's `syncfs`: what open files were told was written is committed first
    /// (they stay open); everything committed survives power loss and every staged block is in
    /// the object store when it returns.
    pub fn sync(&self) -> EngineResult<()> {
        // A file whose commit fails keeps its changes logged; everything else is still synced.
        let committed = self.commit_open_changes();
        let staged = self.meta.lock()?.staged_blocks()?;
        let uploaded = self.upload_now(&staged);
        self.flush_local()?;
        committed.and(uploaded)
    }

    /// Commits, uploads every still-staged block of the file in the foreground (what fails stays
    /// queued), then flushes locally. Uploading first lets the flush also make the blocks'
    /// "uploaded" marks durable.
    fn commit_and_upload(&self, ino: Ino, file: &Mutex<OpenFile>) -> EngineResult<()> {
        if self.uploads_early() {
            self.wait_early_uploads(ino);
        }
        let mut f = file.lock();
        let new = self.commit_with(ino, &mut f, true)?;
        let shas: Vec<String> = f.blocks.values().map(|b| b.sha256.clone()).collect();
        drop(f);
        let uploaded = self.upload_now(&shas);
        if uploaded.is_err() {
            for sha in new {
                self.enqueue_upload(sha);
            }
        }
        let uploaded = uploaded.and_then(|()| self.upload_for_shipping());
        self.flush_local()?;
        uploaded
    }

    /// Tells handle `fh` of an error that may have lost its data and that it was not told of yet
    /// (`errseq.rs`): `WriteLost`, once.
    fn report_errors(&self, ino: Ino, fh: Fh) -> EngineResult<()> {
        let mut handles = self.handles.lock();
        let told = handles.get_mut(&fh).is_some_and(|h| self.errors.check(ino, &mut h.err_seen));
        if told {
            return Err(EngineError::WriteLost);
        }
        Ok(())
    }

    fn committed_shas(&self, ino: Ino) -> EngineResult<Vec<String>> {
        Ok(self.meta.lock()?.blocks_of(ino)?.into_values().map(|b| b.sha256).collect())
    }

    pub fn release(&self, ino: Ino, fh: Fh) -> EngineResult<()> {
        let known = self.handles.lock().remove(&fh);
        // A handle of an earlier process that this one never used: nothing of it to commit here.
        let Some(h) = known else { return Ok(()) };
        let result = match self.open_files.lock().get(&h.ino).map(|e| e.file.clone()) {
            Some(file) if self.storage.settings.durability == Durability::Close && file.lock().changed.is_some() => {
                self.commit_and_upload(ino, &file)
            }
            Some(file) => {
                let mut f = file.lock();
                self.commit_locked(ino, &mut f).map(|_| ())
            }
            None => Ok(()),
        };
        self.drop_handle_ref(h.ino);
        result
    }

    /// Drops one handle reference; the last one forgets the open state and deletes a detached inode.
    fn drop_handle_ref(&self, ino: Ino) {
        let last = {
            let mut map = self.open_files.lock();
            match map.get_mut(&ino) {
                Some(e) if e.handles > 1 => {
                    e.handles -= 1;
                    None
                }
                Some(_) => map.remove(&ino),
                None => None,
            }
        };
        let Some(entry) = last else { return };
        self.tmpfiles.lock().remove(&ino);
        let mut f = entry.file.lock();
        // Uncommitted data of a failed commit is given up with the last handle.
        *self.pending_growth.lock() -= f.size as i64 - f.committed_size as i64;
        if f.changed.take().is_some() {
            self.open_log.settled(true);
        }
        for (_, d) in std::mem::take(&mut f.dirty) {
            self.discard_dirty(d);
        }
        drop(f);
        // On a resumed mount the kernel may hold other handles of an earlier process: kept until
        // it lets go (`forget`).
        if entry.detached && !self.kernel_unknown.load(Ordering::Acquire) {
            self.delete_unlinked(ino);
        }
    }
}

/// The SHA-256 of a whole file's content, when known without reading it: the empty file's, or
/// its one block's when that block is the whole file; otherwise `None`.
fn content_sha256(blocks: &BTreeMap<u64, BlockRef>, size: u64) -> Option<String> {
    match blocks.values().next() {
        None if size == 0 => Some(hex::encode(Sha256::digest(b""))),
        Some(b) if blocks.len() == 1 && b.len == size && blocks.contains_key(&0) => Some(b.sha256.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_hash_of_the_empty_file_is_sha256_of_nothing() {
        let empty = content_sha256(&BTreeMap::new(), 0).unwrap();
        assert_eq!(empty, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(empty.len(), 64);
        let one = BTreeMap::from([(0, BlockRef { sha256: "ab".repeat(32), len: 10 })]);
        assert_eq!(content_sha256(&one, 10), Some("ab".repeat(32)));
        assert_eq!(content_sha256(&one, 11), None, "a sparse tail: the block is not the whole file");
        assert_eq!(content_sha256(&BTreeMap::new(), 5), None, "all holes");
    }
}
