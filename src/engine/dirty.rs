//! Dirty blocks of open files: a small block is kept in memory (bounded daemon-wide by
//! `dirty_memory_max_bytes`, of which one scope holds at most `dirty_memory_per_scope_bytes`) and
//! journaled inline in the metadata database at commit; a larger one is a working file in staging,
//! sealed as `blocks/<sha>`. Growth is charged before it happens: memory by length; a working file
//! by the pages written into it while it is dirty (a hole costs no disk, so a sparse file held open
//! holds only what it wrote: review N6), and by its whole length once it is sealed (what every later
//! release of a staged block gives back).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use super::error::EngineResult;
use super::fileio::OpenFile;
use super::scope::ScopeEngine;
use super::types::Ino;

/// Bytes of one page of a working file: the unit its staging charge counts in (the block size
/// when that is smaller).
const PAGE: u64 = 4096;

/// Where a dirty block's bytes are.
enum DirtyData {
    /// In memory; `Vec::len` is the block's length, charged to `Storage::dirty_memory`.
    Mem(Vec<u8>),
    /// A whole-block working file in staging; bytes past `len` read as zeros. `pages`: the pages
    /// written into it (the rest are holes).
    File { file: File, path: PathBuf, pages: Pages },
}

/// A block being modified.
pub(crate) struct DirtyBlock {
    data: DirtyData,
    len: u64,
    /// Staging charged for a working file (0 in memory): `PAGE` per page written, or its length
    /// once sealed; given back exactly when the file goes.
    charged: u64,
    /// Its working file was handed to an early upload (`early.rs`): at most one per dirty block.
    early: bool,
    /// Where that upload puts the hash of the bytes it read; dropped at the first change after the
    /// hand-over, so a hash found here is the hash of the block's bytes as they are.
    early_hash: Option<Arc<OnceLock<String>>>,
}

/// The pages of a working file that have been written (a bit each).
#[derive(Default)]
struct Pages(Vec<u64>);

impl Pages {
    /// Pages `first..end` not written yet.
    fn unwritten(&self, first: u64, end: u64) -> u64 {
        (first..end).filter(|p| !self.has(*p)).count() as u64
    }

    fn has(&self, page: u64) -> bool {
        self.0.get((page / 64) as usize).is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    fn mark(&mut self, first: u64, end: u64) {
        for p in first..end {
            let word = (p / 64) as usize;
            if self.0.len() <= word {
                self.0.resize(word + 1, 0);
            }
            self.0[word] |= 1 << (p % 64);
        }
    }

    /// Forgets the pages from `first` on (the file was cut there); how many remain.
    fn cut(&mut self, first: u64) -> u64 {
        let word = (first / 64) as usize;
        if word < self.0.len() {
            self.0.truncate(word + 1);
            self.0[word] &= (1u64 << (first % 64)) - 1;
        }
        self.0.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// The pages `[first, end)` of `page` bytes that bytes `off..off + len` touch.
fn page_span(off: u64, len: u64, page: u64) -> (u64, u64) {
    if len == 0 {
        return (0, 0);
    }
    (off / page, (off + len).div_ceil(page))
}

/// How a commit journals one hashed dirty block.
pub(crate) enum Sealed {
    /// Small: its bytes go into the metadata database with the commit.
    Inline(Vec<u8>),
    /// Its working file became (or duplicates) `blocks/<sha>`; `true` when it became it.
    File(bool),
}

impl DirtyBlock {
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The working file of a block every page of which is written up to `block_size`, unless it was
    /// handed to an early upload already; marks it handed.
    /// Returns it with the slot the upload fills with the hash of what it read.
    pub(crate) fn take_full_for_early(&mut self, block_size: u64) -> Option<(PathBuf, Arc<OnceLock<String>>)> {
        let DirtyData::File { path, pages, .. } = &self.data else { return None };
        if self.early || self.len != block_size || pages.unwritten(0, block_size.div_ceil(PAGE)) > 0 {
            return None;
        }
        self.early = true;
        let slot = Arc::new(OnceLock::new());
        self.early_hash = Some(slot.clone());
        Some((path.clone(), slot))
    }

    /// The block's bytes change: a hash an early upload computes is no longer theirs.
    fn changed(&mut self) {
        self.early_hash = None;
    }

    /// Reads `buf.len()` bytes at `off`; the caller keeps `off + buf.len()` within `len`.
    pub(crate) fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        match &self.data {
            DirtyData::Mem(v) => {
                let start = off as usize;
                buf.copy_from_slice(&v[start..start + buf.len()]);
                Ok(())
            }
            DirtyData::File { file, .. } => file.read_exact_at(buf, off),
        }
    }

    /// Overwrites bytes within the current length (no growth; the caller charges a working
    /// file's new pages, `ScopeEngine::write_pages`).
    fn overwrite(&mut self, src: &[u8], off: u64) -> std::io::Result<()> {
        debug_assert!(off + src.len() as u64 <= self.len);
        self.changed();
        match &mut self.data {
            DirtyData::Mem(v) => {
                v[off as usize..off as usize + src.len()].copy_from_slice(src);
                Ok(())
            }
            DirtyData::File { file, .. } => file.write_all_at(src, off),
        }
    }

    /// The name of the block's working file in staging (`None`: kept in memory).
    pub(crate) fn working_name(&self) -> Option<String> {
        match &self.data {
            DirtyData::Mem(_) => None,
            DirtyData::File { path, .. } => path.file_name().map(|n| n.to_string_lossy().into_owned()),
        }
    }

    fn sha256(&mut self) -> std::io::Result<String> {
        // Unchanged since an early upload read it (and hashed it): that hash is the bytes' hash.
        if let Some(sha) = self.early_hash.as_ref().and_then(|slot| slot.get()) {
            return Ok(sha.clone());
        }
        match &mut self.data {
            DirtyData::Mem(v) => Ok(hex::encode(Sha256::digest(v.as_slice()))),
            DirtyData::File { file, .. } => hash_file(file, self.len),
        }
    }
}

impl ScopeEngine {
    /// The page of [`PAGE`] bytes, or of the block size when that is smaller.
    fn page(&self) -> u64 {
        PAGE.min(self.storage.settings.block_size).max(1)
    }

    /// Charges `n` bytes of an in-memory dirty block to this scope's share
    /// (`dirty_memory_per_scope_bytes`) and the daemon's budget; `false` when either has no room
    /// (the block then lives in a staging file).
    fn dirty_memory_charge(&self, n: u64) -> bool {
        let share = self.storage.settings.dirty_memory_per_scope_bytes;
        let held = self
            .dirty_memory
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| cur.checked_add(n).filter(|t| *t <= share));
        if held.is_err() {
            return false;
        }
        if !self.storage.dirty_memory_charge(n) {
            self.dirty_memory.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn dirty_memory_release(&self, n: u64) {
        let _ = self.dirty_memory.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| Some(cur.saturating_sub(n)));
        self.storage.dirty_memory_release(n);
    }

    fn inline_max(&self) -> u64 {
        self.storage.settings.inline_block_max_bytes.min(self.storage.settings.block_size)
    }

    /// Makes block `idx` dirty, copying its committed bytes unless the coming write replaces them
    /// all. A block that fits the inline bound starts in memory when the memory budget has room.
    pub(crate) fn ensure_dirty(
        &self,
        f: &mut OpenFile,
        ino: Ino,
        idx: u64,
        cover_off: u64,
        cover_len: u64,
    ) -> EngineResult<()> {
        if f.dirty.contains_key(&idx) {
            return Ok(());
        }
        let committed = f.blocks.get(&idx).filter(|b| !(cover_off == 0 && cover_len >= b.len)).cloned();
        let copy_len = committed.as_ref().map_or(0, |b| b.len);
        if copy_len.max(cover_off + cover_len) <= self.inline_max() && self.dirty_memory_charge(copy_len) {
            let data = match &committed {
                Some(b) => self.read_block(b),
                None => Ok(Vec::new()),
            };
            let data = data.inspect_err(|_| self.dirty_memory_release(copy_len))?;
            f.dirty.insert(
                idx,
                DirtyBlock {
                    len: data.len() as u64,
                    data: DirtyData::Mem(data),
                    charged: 0,
                    early: false,
                    early_hash: None,
                },
            );
            return Ok(());
        }
        let (file, path) = self.working_file(ino, idx)?;
        let mut block = DirtyBlock {
            data: DirtyData::File { file, path, pages: Pages::default() },
            len: 0,
            charged: 0,
            early: false,
            early_hash: None,
        };
        if let Some(b) = committed {
            let copied = self.read_block(&b).and_then(|data| {
                let len = data.len() as u64;
                self.write_pages(&mut block, &data, 0)?;
                block.len = len;
                Ok(())
            });
            if let Err(e) = copied {
                self.discard_dirty(block);
                return Err(e);
            }
        }
        f.dirty.insert(idx, block);
        Ok(())
    }

    fn working_file(&self, ino: Ino, idx: u64) -> EngineResult<(File, PathBuf)> {
        let n = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let path = self.open_dir.join(format!("{ino}.{idx}.{n}"));
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
        Ok((file, path))
    }

    /// Writes `src` at `off` of a dirty block, growing it (charged first: memory while it fits
    /// the inline bound and the budget, else staging after moving its bytes to a working file).
    pub(crate) fn write_dirty(&self, d: &mut DirtyBlock, ino: Ino, idx: u64, src: &[u8], off: u64) -> EngineResult<()> {
        let new_len = d.len.max(off + src.len() as u64);
        if matches!(d.data, DirtyData::Mem(_)) {
            self.resize_dirty(d, ino, idx, new_len)?;
        }
        match &d.data {
            DirtyData::Mem(_) => d.overwrite(src, off)?,
            DirtyData::File { .. } => {
                self.write_pages(d, src, off)?;
                d.len = new_len;
            }
        }
        Ok(())
    }

    /// Writes `src` at `off` of a working file: the pages it writes for the first time are charged
    /// first, and given back if the write fails.
    fn write_pages(&self, d: &mut DirtyBlock, src: &[u8], off: u64) -> EngineResult<()> {
        d.changed();
        let DirtyData::File { file, pages, .. } = &mut d.data else { return Ok(d.overwrite(src, off)?) };
        let page = self.page();
        let (first, end) = page_span(off, src.len() as u64, page);
        let new = pages.unwritten(first, end) * page;
        if new > 0 {
            self.staging_add(new)?;
        }
        if let Err(e) = file.write_all_at(src, off) {
            self.staging_sub(new);
            return Err(e.into());
        }
        pages.mark(first, end);
        d.charged += new;
        Ok(())
    }

    /// Sets a dirty block's length: growth reads as zeros and is charged before it happens.
    pub(crate) fn resize_dirty(&self, d: &mut DirtyBlock, ino: Ino, idx: u64, len: u64) -> EngineResult<()> {
        if len == d.len {
            return Ok(());
        }
        d.changed();
        if let DirtyData::Mem(v) = &mut d.data {
            if len < d.len {
                v.truncate(len as usize);
                self.dirty_memory_release(d.len - len);
                d.len = len;
                return Ok(());
            }
            if len <= self.inline_max() && self.dirty_memory_charge(len - d.len) {
                v.resize(len as usize, 0);
                d.len = len;
                return Ok(());
            }
            self.spill(d, ino, idx)?;
        }
        let DirtyData::File { file, pages, .. } = &mut d.data else { unreachable!("spilled above") };
        file.set_len(len)?;
        if len < d.len {
            // The pages past the cut are freed (a hole costs nothing, growing is not charged).
            let keep = pages.cut(len.div_ceil(self.page())) * self.page();
            if d.charged > keep {
                self.staging_sub(d.charged - keep);
                d.charged = keep;
            }
        }
        d.len = len;
        Ok(())
    }

    /// Charges a working file its whole length before it is sealed (as every staged block is
    /// charged until it leaves staging); `NoSpace` when staging has no room for its holes.
    fn charge_length(&self, d: &mut DirtyBlock) -> EngineResult<()> {
        let DirtyData::File { pages, .. } = &mut d.data else { return Ok(()) };
        if d.len > d.charged {
            self.staging_add(d.len - d.charged)?;
        } else {
            self.staging_sub(d.charged - d.len);
        }
        d.charged = d.len;
        pages.mark(0, d.len.div_ceil(self.page()));
        Ok(())
    }

    /// Moves an in-memory block into a working file (charged to staging; the memory is released).
    fn spill(&self, d: &mut DirtyBlock, ino: Ino, idx: u64) -> EngineResult<()> {
        let DirtyData::Mem(v) = &d.data else { return Ok(()) };
        let (first, end) = page_span(0, d.len, self.page());
        let charge = (end - first) * self.page();
        self.staging_add(charge)?;
        let written = self.working_file(ino, idx).and_then(|(file, path)| match file.write_all_at(v, 0) {
            Ok(()) => Ok((file, path)),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e.into())
            }
        });
        let (file, path) = written.inspect_err(|_| self.staging_sub(charge))?;
        self.dirty_memory_release(d.len);
        let mut pages = Pages::default();
        pages.mark(first, end);
        d.data = DirtyData::File { file, path, pages };
        d.charged = charge;
        Ok(())
    }

    /// Drops a dirty block and gives back what it was charged.
    pub(crate) fn discard_dirty(&self, d: DirtyBlock) {
        match d.data {
            DirtyData::Mem(_) => self.dirty_memory_release(d.len),
            DirtyData::File { path, .. } => {
                if std::fs::remove_file(&path).is_ok() {
                    self.staging_sub(d.charged);
                }
            }
        }
    }

    /// Hashes a dirty block (already at its final length) and journals it: an in-memory block
    /// becomes an inline journal entry (written by the commit's transaction), a working file is
    /// linked as `blocks/<sha>`. No flush here: the next durability point covers both.
    pub(crate) fn seal_dirty(&self, d: &mut DirtyBlock) -> EngineResult<(String, Sealed)> {
        self.charge_length(d)?;
        let sha = d.sha256()?;
        match &d.data {
            DirtyData::Mem(v) => Ok((sha, Sealed::Inline(v.clone()))),
            DirtyData::File { path, .. } => {
                let linked = self.seal(path, &self.blocks_dir.join(&sha))?;
                Ok((sha, Sealed::File(linked)))
            }
        }
    }

    /// After a successful commit: the working file's name goes (a duplicate's bytes leave staging
    /// with it; a linked one's stay as the journal file); memory is given back.
    pub(crate) fn retire_dirty(&self, d: DirtyBlock, linked: bool) {
        match d.data {
            DirtyData::Mem(_) => self.dirty_memory_release(d.len),
            DirtyData::File { path, .. } => {
                if std::fs::remove_file(&path).is_ok() && !linked {
                    self.staging_sub(d.charged);
                }
            }
        }
    }

    /// Links a hashed working file into the journal as `blocks/<sha>`; `true` when the working file
    /// is now that journal file. When another file holds that name already (an identical block of
    /// this or an earlier commit, still staged), `false`: the working file is a duplicate, dropped
    /// once the commit succeeds. Either way staging counts each file on disk once.
    fn seal(&self, dirty: &std::path::Path, staged: &std::path::Path) -> EngineResult<bool> {
        use std::os::unix::fs::MetadataExt;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match std::fs::hard_link(dirty, staged) {
                Ok(()) => return Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A retried commit finds its own earlier link.
                    let a = std::fs::metadata(dirty)?;
                    match std::fs::metadata(staged) {
                        Ok(b) => return Ok(a.dev() == b.dev() && a.ino() == b.ino()),
                        // The other copy's upload just finished and moved it to the cache: link again.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn hash_file(file: &mut File, len: u64) -> std::io::Result<String> {
    file.seek(SeekFrom::Start(0))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = len;
    let mut reader = file.take(len);
    while left > 0 {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "staging block shorter than recorded"));
        }
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(hex::encode(h.finalize()))
}
