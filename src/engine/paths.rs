//! Path-level operations for the HTTP API: virtual-path resolution (never following symlinks), listing,
//! atomic whole-file replace, deletion, and the change observer that keeps kernel caches coherent.

use std::io::Read;
use std::sync::Arc;

use super::error::{EngineError, EngineResult};
use super::listing::Listing;
use super::scope::ScopeEngine;
use super::types::*;
use crate::limits::{refuse, Bound};
use crate::names;

/// The buffer `write_path` copies a stream's content through.
pub const WRITE_FILL_BYTES: u64 = 1 << 20;

/// Names a listing reads from a directory at once.
const LIST_PAGE: usize = 4096;

/// A change made outside the kernel's view (through the HTTP API): the FUSE layer invalidates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The name `name` in directory `parent` appeared, disappeared or now names another inode.
    Entry { parent: Ino, name: Vec<u8> },
    /// The content or attributes of `ino` changed.
    Inode(Ino),
}

/// Receives changes made through path operations.
pub type ChangeObserver = Arc<dyn Fn(&Change) + Send + Sync>;

/// How `write_path` treats an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Fail with `Exists` if the path exists.
    CreateNew,
    /// Atomically replace an existing file (readers see the old or the new version, never a mix).
    Replace,
    /// Atomically replace the file only if the path still names inode `ino` at content `version`
    /// (what a read-modify-write read); otherwise fail with `Changed` and leave it as it is.
    ReplaceIfUnchanged { ino: Ino, version: u64 },
}

/// One entry of a listing, with its path relative to the scope root (no leading `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathEntry {
    pub path: String,
    pub attr: Attr,
}

/// A directory of a recursive delete: its inode, its parent and name (none for the walk's top),
/// and whether its children were listed yet.
type PendingDir = (Ino, Option<(Ino, Vec<u8>)>, bool);

/// Splits a validated relative virtual path into components (empty for the root).
fn components(path: &str) -> EngineResult<Vec<&str>> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for p in &parts {
        if *p == "." || *p == ".." {
            return Err(EngineError::InvalidName("'.' and '..' are not allowed in paths"));
        }
        names::check_lookup_name(p.as_bytes())?;
    }
    Ok(parts)
}

impl ScopeEngine {
    /// Installs the observer of path-level changes (replacing any previous one).
    pub fn set_observer(&self, observer: Option<ChangeObserver>) {
        *self.observer.lock() = observer;
    }

    fn notify(&self, change: Change) {
        let observer = self.observer.lock().clone();
        if let Some(o) = observer {
            o(&change);
        }
    }

    /// The components of a path, refused (`PathTooLong`) beyond the path bounds before any lookup.
    fn bounded_components<'p>(&self, path: &'p str) -> EngineResult<Vec<&'p str>> {
        let s = &self.storage.settings;
        let parts = components(path)?;
        let bytes = parts.iter().map(|p| p.len()).sum::<usize>() + parts.len().saturating_sub(1);
        if parts.len() as u64 > u64::from(s.max_path_depth) || bytes as u64 > u64::from(s.max_path_bytes) {
            let depth = parts.len() as u64 > u64::from(s.max_path_depth);
            refuse(if depth { Bound::PathDepth } else { Bound::PathBytes });
            return Err(EngineError::PathTooLong);
        }
        Ok(parts)
    }

    /// Resolves a relative virtual path without following symlinks: a symlink or file in the middle is `NotFound`.
    /// Names are matched byte for byte, exactly as a listing shows them (no Unicode normalization).
    pub fn resolve_path(&self, path: &str) -> EngineResult<Attr> {
        let mut attr = self.getattr(ROOT_INO)?;
        for part in self.bounded_components(path)? {
            if attr.kind != FileKind::Dir {
                return Err(EngineError::NotFound);
            }
            attr = self.lookup(attr.ino, part.as_bytes())?;
        }
        Ok(attr)
    }

    /// The directory inode and last name of a path (the directory must exist).
    fn parent_and_name<'p>(&self, path: &'p str) -> EngineResult<(Ino, &'p str)> {
        let parts = self.bounded_components(path)?;
        let Some((name, dirs)) = parts.split_last() else {
            return Err(EngineError::Invalid("the scope root has no name"));
        };
        let dir = self.resolve_path(&dirs.join("/"))?;
        if dir.kind != FileKind::Dir {
            return Err(EngineError::NotFound);
        }
        Ok((dir.ino, name))
    }

    /// Lists a directory (recursively if asked), paths relative to the scope root, sorted; symlinks are
    /// listed, never followed. Directories are read `LIST_PAGE` names at a time. The walk uses an
    /// explicit stack and stops with `TooManyEntries` past
    /// `max_walk_entries` entries, `PathTooLong` at a path longer than `max_path_bytes`, and
    /// `ListingTooLarge`, `ScopeBusy` or `Busy` when the bytes it builds (each entry's path and overhead, the
    /// stack's copies, a directory's entries while it is read) pass a bound of `listing.rs`: each
    /// entry is charged before it is built. The listing holds its charge until it is dropped.
    pub fn list_path(&self, path: &str, recursive: bool) -> EngineResult<Listing> {
        use super::listing::ENTRY_OVERHEAD_BYTES;
        let dir = self.resolve_path(path)?;
        if dir.kind != FileKind::Dir {
            return Err(EngineError::NotDir);
        }
        let s = &self.storage.settings;
        let (max_entries, max_bytes) = (s.max_walk_entries, s.max_path_bytes as usize);
        let mut charge = self.storage.listing_memory.charge(self.scope_id.as_str());
        let base = components(path)?.join("/");
        charge.add(base.len() as u64)?;
        let mut out = Vec::new();
        let mut stack = vec![(dir.ino, base)];
        while let Some((ino, prefix)) = stack.pop() {
            // A page at a time: a huge directory is never read whole before it is charged, and
            // the scope's metadata is not held for the whole directory.
            let mut after = 0;
            loop {
                let page = self.readdir_page(ino, after, LIST_PAGE)?;
                let last_page = page.len() < LIST_PAGE;
                after = page.last().map_or(after, |e| e.cursor);
                if (out.len() + page.len()) as u64 > max_entries {
                    refuse(Bound::WalkEntries);
                    return Err(EngineError::TooManyEntries);
                }
                let read: u64 = page.iter().map(|e| e.name.len() as u64 + ENTRY_OVERHEAD_BYTES).sum();
                charge.add(read)?;
                for e in page {
                    let name = String::from_utf8_lossy(&e.name);
                    let len = if prefix.is_empty() { name.len() } else { prefix.len() + 1 + name.len() };
                    if len > max_bytes {
                        refuse(Bound::PathBytes);
                        return Err(EngineError::PathTooLong);
                    }
                    let descend = recursive && e.attr.kind == FileKind::Dir;
                    charge.add(len as u64 * (1 + u64::from(descend)) + ENTRY_OVERHEAD_BYTES)?;
                    let p = if prefix.is_empty() { name.into_owned() } else { format!("{prefix}/{name}") };
                    if descend {
                        stack.push((e.attr.ino, p.clone()));
                    }
                    out.push(PathEntry { path: p, attr: e.attr });
                }
                charge.sub(read);
                if last_page {
                    break;
                }
            }
            charge.sub(prefix.len() as u64);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Listing::new(out, charge))
    }

    /// Reads up to `len` bytes of a regular file from `offset`.
    pub fn read_path(&self, path: &str, offset: u64, len: u64) -> EngineResult<Vec<u8>> {
        let attr = self.resolve_path(path)?;
        match attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(EngineError::IsDir),
            FileKind::Symlink | FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice => {
                return Err(EngineError::NotFound)
            }
        }
        let opened = self.open(attr.ino, OpenFlags::default())?;
        let mut out = Vec::new();
        let end = offset.saturating_add(len);
        let result = loop {
            let pos = offset + out.len() as u64;
            if pos >= end {
                break Ok(());
            }
            let want = (end - pos).min(1 << 20) as u32;
            match self.read(attr.ino, opened.fh, pos, want) {
                Ok(chunk) if chunk.is_empty() => break Ok(()),
                Ok(chunk) => out.extend_from_slice(&chunk),
                Err(e) => break Err(e),
            }
        };
        self.release(attr.ino, opened.fh)?;
        result.map(|_| out)
    }

    /// Creates the missing directories of `path` (like `mkdir -p`); returns the last one's inode.
    pub fn make_dirs(&self, path: &str, owner: Owner) -> EngineResult<Ino> {
        let mut ino = ROOT_INO;
        for part in self.bounded_components(path)? {
            ino = match self.lookup(ino, part.as_bytes()) {
                Ok(a) if a.kind == FileKind::Dir => a.ino,
                Ok(_) => return Err(EngineError::NotDir),
                Err(EngineError::NotFound) => {
                    let a = self.mkdir(ino, part.as_bytes(), 0o755, owner)?;
                    self.notify(Change::Entry { parent: ino, name: part.as_bytes().to_vec() });
                    a.ino
                }
                Err(e) => return Err(e),
            };
        }
        Ok(ino)
    }

    /// Writes a whole new version of `path` from `content`, at most `max_len` bytes (more is `TooLarge`
    /// and leaves nothing behind). The file is built without a name and linked into place at the end,
    /// so a failure never leaves a partial file and a replace is atomic.
    pub fn write_path(
        &self,
        path: &str,
        content: &mut dyn Read,
        max_len: u64,
        mode: WriteMode,
        owner: Owner,
    ) -> EngineResult<Attr> {
        self.check_writable()?;
        let (parent, name) = self.parent_and_name(path)?;
        names::check_new_name(name.as_bytes(), parent == ROOT_INO)?;
        self.check_placement(&*self.meta.lock()?, parent, name.as_bytes(), None)?;
        if mode == WriteMode::CreateNew && self.lookup(parent, name.as_bytes()).is_ok() {
            return Err(EngineError::Exists);
        }
        let max_inodes = self.quota().inodes;
        let row =
            self.within_inode_quota(|| self.meta.lock()?.insert_detached(0o644, owner.uid, owner.gid, max_inodes))?;
        let ino = row.ino;
        let opened = match self.open(ino, OpenFlags { write: true, ..Default::default() }) {
            Ok(o) => o,
            Err(e) => {
                self.meta.lock()?.delete_detached(ino)?;
                return Err(e);
            }
        };
        let filled = self.fill(ino, opened.fh, content, max_len).and_then(|_| self.flush(ino, opened.fh));
        let linked = filled.and_then(|_| {
            let mut meta = self.meta.lock()?;
            // The directory may have moved while the content was written.
            self.check_placement(&meta, parent, name.as_bytes(), None)?;
            let dropped = meta.attach(ino, parent, name.as_bytes(), mode, &|i| i != ino && self.is_open(i))?;
            drop(meta);
            self.after_drop(dropped);
            Ok(())
        });
        // Releasing an unlinked inode deletes it, so a failed write leaves nothing behind.
        self.release(ino, opened.fh)?;
        linked?;
        self.notify(Change::Entry { parent, name: name.as_bytes().to_vec() });
        self.getattr(ino)
    }

    fn fill(&self, ino: Ino, fh: Fh, content: &mut dyn Read, max_len: u64) -> EngineResult<()> {
        let mut buf = vec![0u8; WRITE_FILL_BYTES as usize];
        let mut pos = 0u64;
        loop {
            let n = content.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            if pos + n as u64 > max_len {
                return Err(EngineError::TooLarge);
            }
            self.write(ino, fh, pos, &buf[..n])?;
            pos += n as u64;
        }
    }

    /// Removes a file or symlink, or a directory (with `recursive`, including everything below it).
    /// A recursive delete walks with an explicit stack (any depth) and refuses, before removing
    /// anything, a tree of more than `max_walk_entries` entries.
    pub fn remove_path(&self, path: &str, recursive: bool) -> EngineResult<()> {
        let (parent, name) = self.parent_and_name(path)?;
        let attr = self.lookup(parent, name.as_bytes())?;
        if attr.kind == FileKind::Dir {
            if recursive {
                self.remove_below(attr.ino)?;
            }
            self.rmdir(parent, name.as_bytes())?;
        } else {
            self.unlink(parent, name.as_bytes())?;
        }
        self.notify(Change::Entry { parent, name: name.as_bytes().to_vec() });
        Ok(())
    }

    /// Empties directory `dir`: children first, each directory after everything below it.
    fn remove_below(&self, dir: Ino) -> EngineResult<()> {
        let max = self.storage.settings.max_walk_entries;
        if self.meta.lock()?.count_below(dir, max)? > max {
            refuse(Bound::WalkEntries);
            return Err(EngineError::TooManyEntries);
        }
        // (directory, its parent and name, children listed yet?)
        let mut stack: Vec<PendingDir> = vec![(dir, None, false)];
        while let Some(top) = stack.last_mut() {
            let ino = top.0;
            if !top.2 {
                top.2 = true;
                for child in self.readdir(ino)? {
                    if child.attr.kind == FileKind::Dir {
                        stack.push((child.attr.ino, Some((ino, child.name)), false));
                    } else {
                        self.unlink(ino, &child.name)?;
                        self.notify(Change::Entry { parent: ino, name: child.name });
                    }
                }
                continue;
            }
            if let Some((_, Some((parent, name)), _)) = stack.pop() {
                self.rmdir(parent, &name)?;
                self.notify(Change::Entry { parent, name });
            }
        }
        Ok(())
    }
}
