//! `ScopeEngine`: one scope's filesystem — opening and recovery, namespace operations, attributes, statfs, gc and fsck.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::error::{EngineError, EngineResult};
use super::fileio::OpenEntry;
use super::lazy_meta::LazyMeta;
use super::meta::{from_ns, AttrChanges, Dropped, InodeRow, LinkBounds, MetaDb, NewNode, Place};
use super::storage::Storage;
use super::types::*;
use super::upload::UploadQueue;
use crate::ids::ScopeId;
use crate::limits::Bound;
use crate::names;

/// A handle returned by open/create.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandleInfo {
    pub ino: Ino,
    pub write: bool,
    /// The errors this handle has been told of (`errseq.rs`).
    pub err_seen: super::errseq::Seen,
}

/// One scope's filesystem.
pub struct ScopeEngine {
    pub(crate) scope_id: ScopeId,
    pub(crate) storage: Arc<Storage>,
    /// The metadata database, opened on first use (`LazyMeta`).
    pub(crate) meta: LazyMeta,
    pub(crate) blocks_dir: PathBuf,
    pub(crate) open_dir: PathBuf,
    pub(crate) self_ref: Weak<ScopeEngine>,
    read_only: AtomicBool,
    quota: Mutex<Quota>,
    /// Bytes by which open files exceed their committed sizes (counts against the quota).
    pub(crate) pending_growth: Mutex<i64>,
    /// Bytes this scope holds in staging (its share of `Storage::staging_bytes`).
    pub(crate) staged_bytes: AtomicU64,
    /// Bytes of in-memory dirty blocks this scope holds (its share of `Storage::dirty_memory`).
    pub(crate) dirty_memory: AtomicU64,
    pub(crate) writeback: super::fileio::writeback::WriteBack,
    pub(crate) open_files: Mutex<HashMap<Ino, OpenEntry>>,
    pub(crate) handles: Mutex<HashMap<Fh, HandleInfo>>,
    /// Open `O_TMPFILE` inodes that have no name yet: the only unnamed inodes `link` may name.
    pub(crate) tmpfiles: Mutex<std::collections::HashSet<Ino>>,
    /// Staged blocks an earlier process left (a power loss may have torn them): each is hashed
    /// before its first read from staging (`fileio.rs`).
    pub(crate) unverified_staged: Mutex<std::collections::HashSet<String>>,
    /// Next handle number; starts at the clock (ns) so numbers never repeat across processes.
    pub(crate) next_fh: AtomicU64,
    /// Set when the mount is about to be handed to another process: every write commits.
    pub(crate) commit_each_write: AtomicBool,
    pub(crate) uploads: UploadQueue,
    /// Full blocks uploaded while their file is written (`early.rs`).
    pub(crate) early: super::early::EarlyUploads,
    /// This scope's share of the storage's upload slots (`upload_parallelism_per_scope`): taken
    /// before a slot, so its backlog waits here and not in the slots' queue.
    pub(crate) shares: super::storage::StoreShares,
    /// Small staged blocks journaled in the metadata database.
    pub(crate) inline: super::journal::InlineJournal,
    pub(crate) observer: Mutex<Option<super::paths::ChangeObserver>>,
    /// The kernel may hold open files and inodes this process never handed out: the scope's mount
    /// was resumed from an earlier process. An inode that loses its last name is then kept until the
    /// kernel lets go of it (`forget`, or `kernel_probe` answers it is not held).
    pub(crate) kernel_unknown: AtomicBool,
    /// Asks the kernel whether it still holds an inode (installed by the mount).
    pub(crate) kernel_probe: Mutex<Option<KernelProbe>>,
    /// Answers of requests, for requests a restarted server is handed again (`requests.rs`).
    pub(crate) answers: Arc<super::requests::Answers>,
    /// Uncommitted changes of open files, for the next process (`openlog.rs`).
    pub(crate) open_log: super::openlog::OpenLog,
    /// A durability point of this scope failed: its data may not be on disk, whatever a later flush
    /// says (a failed fsync's pages may be gone). Every later durability point fails until the scope
    /// is opened again.
    pub(crate) durability_failed: AtomicBool,
    /// Unlinked inodes deleted, for creates waiting at the inode quota (`release_wait.rs`).
    pub(crate) releases: super::release_wait::Releases,
    /// Errors that may have lost data of open files, each reported to each handle once.
    pub(crate) errors: super::errseq::ErrSeq,
    /// Reads of attributes outside `user.*` (which scopes never hold; `privs.rs`).
    pub(crate) privileged_attribute_reads: AtomicU64,
    /// Ships the scope's committed metadata to the object store (`None`: not shipped).
    pub(crate) ship: Option<Arc<super::ship::MetaShip>>,
}

/// Whether the kernel still holds inode `ino` (a mount's probe; see `ScopeEngine::set_kernel_probe`).
pub type KernelProbe = Arc<dyn Fn(Ino) -> bool + Send + Sync>;

/// Names the scope only (the engine's state is behind locks).
impl std::fmt::Debug for ScopeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeEngine").field("scope_id", &self.scope_id).finish_non_exhaustive()
    }
}

impl ScopeEngine {
    /// Opens a scope; `resumed`: its mount is served on from an earlier process (the kernel may hold
    /// its files open), so inodes without a name are kept rather than collected.
    pub(crate) fn open_new(
        storage: Arc<Storage>,
        scope_id: ScopeId,
        quota: Quota,
        resumed: bool,
    ) -> EngineResult<Arc<ScopeEngine>> {
        let id = scope_id.as_str().to_string();
        let (meta_dir, staging) = (storage.scope_meta_dir(&id), storage.scope_staging_dir(&id));
        let (blocks_dir, open_dir) = (staging.join("blocks"), staging.join("open"));
        let db_path = meta_dir.join("meta.sqlite3");
        let mut db_exists = db_path.exists();
        let ship = super::ship::MetaShip::for_scope(&storage, &id);
        // One walk of the staging directory (taken at startup for every scope at once).
        let census = storage.staging_census(&id);
        let dirs = [
            (&meta_dir, db_exists),
            (&staging, census.dir),
            (&blocks_dir, census.blocks_dir),
            (&open_dir, census.open_dir),
        ];
        for (d, _) in dirs.into_iter().filter(|&(_, exists)| !exists) {
            super::storage::private_dir(d)?;
        }
        // No local database: the bucket may hold the scope's (a lost disk, another host's); it is
        // restored at the first use (`LazyMeta::lock`), at once only when staging needs recovery.
        db_exists = db_exists || census.has_work() && ship.is_some() && storage.restore_scope_now(&id, &db_path)?;
        // Staging left behind (a journal to replay, buffers to drop) is recovered now; else lazily.
        let eager = census.has_work() || !db_exists && ship.is_none();
        let answers = Arc::new(super::requests::Answers::default());
        let db = if eager { Some(MetaDb::open_with(&db_path, 0, 0, answers.clone())?) } else { None };
        if eager {
            // Open from now on: the usage a close noted is no longer the database's.
            super::note::forget(&db_path)?;
        }
        let meta = LazyMeta::new(db_path, storage.meta_budget.clone(), db, answers.clone(), ship.clone());
        if !resumed {
            // A fresh mount: no kernel holds an inode without a name any more.
            meta.collect_detached()?;
        }
        let engine = Arc::new_cyclic(|me| ScopeEngine {
            shares: super::storage::StoreShares::of(&storage),
            scope_id,
            storage,
            meta,
            blocks_dir,
            open_dir,
            self_ref: me.clone(),
            read_only: AtomicBool::new(false),
            quota: Mutex::new(quota),
            pending_growth: Mutex::new(0),
            staged_bytes: AtomicU64::new(census.bytes),
            dirty_memory: AtomicU64::new(0),
            writeback: Default::default(),
            open_files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            tmpfiles: Mutex::new(std::collections::HashSet::new()),
            unverified_staged: Mutex::new(std::collections::HashSet::new()),
            next_fh: AtomicU64::new(first_handle()),
            commit_each_write: AtomicBool::new(false),
            uploads: UploadQueue::default(),
            early: Default::default(),
            inline: Default::default(),
            observer: Mutex::new(None),
            kernel_unknown: AtomicBool::new(resumed),
            kernel_probe: Mutex::new(None),
            answers,
            open_log: super::openlog::OpenLog::new(),
            durability_failed: AtomicBool::new(false),
            releases: Default::default(),
            errors: Default::default(),
            privileged_attribute_reads: AtomicU64::new(0),
            ship,
        });
        super::ship::MetaShip::start_for(&engine);
        if eager {
            engine.recover()?;
        }
        Ok(engine)
    }

    /// Startup recovery: commit what open files were told was written (the open-file log), drop
    /// the working files, replay the upload journal.
    fn recover(&self) -> EngineResult<()> {
        self.replay_open_log()?;
        for entry in std::fs::read_dir(&self.open_dir)?.flatten() {
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if std::fs::remove_file(entry.path()).is_ok() {
                self.staging_sub(len);
            }
        }
        let meta = self.meta.lock()?;
        let staged = meta.staged_blocks()?;
        let inline_rows = meta.inline_blocks()?;
        drop(meta);
        self.recover_inline(inline_rows);
        let staged_set: std::collections::HashSet<&str> = staged.iter().map(String::as_str).collect();
        for entry in std::fs::read_dir(&self.blocks_dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !staged_set.contains(name.as_str()) {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                if std::fs::remove_file(entry.path()).is_ok() {
                    self.staging_sub(len);
                }
            }
        }
        let mut missing = 0;
        let mut on_disk = Vec::new();
        for sha in staged {
            if self.is_inline(&sha) {
                self.enqueue_upload(sha);
            } else if self.blocks_dir.join(&sha).exists() || self.restage_from_cache(&sha) {
                self.unverified_staged.lock().insert(sha.clone());
                on_disk.push(sha.clone());
                self.enqueue_upload(sha);
            } else {
                // Its upload may have finished with the mark lost to a power loss: the uploader asks
                // the store, and marks it or reports it missing.
                missing += 1;
                self.enqueue_upload(sha);
            }
        }
        // Written by an earlier process and maybe never flushed: the next durability point flushes
        // them (and the marker) before it claims anything.
        self.note_unsynced(&on_disk);
        if missing > 0 {
            tracing::warn!(scope = %self.scope_id, missing, "journaled blocks missing from staging; checking the store");
        }
        Ok(())
    }

    pub fn scope_id(&self) -> &ScopeId {
        &self.scope_id
    }

    /// Read-only (deleting) scopes answer `ReadOnly` to every change.
    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::SeqCst);
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::SeqCst)
    }

    pub(crate) fn check_writable(&self) -> EngineResult<()> {
        if self.is_read_only() {
            Err(EngineError::ReadOnly)
        } else {
            Ok(())
        }
    }

    pub fn set_quota(&self, quota: Quota) {
        *self.quota.lock() = quota;
    }

    pub fn quota(&self) -> Quota {
        *self.quota.lock()
    }

    /// Usage when the scope's metadata database is open, without opening it (`None`: idle).
    pub fn usage_if_open(&self) -> EngineResult<Option<Usage>> {
        if !self.meta.is_open() {
            return Ok(None);
        }
        self.usage().map(Some)
    }

    pub fn usage(&self) -> EngineResult<Usage> {
        self.meta.lock()?.usage()
    }

    /// Opens the scope's metadata database now (creating it, or restoring it from the bucket): a
    /// scope just provisioned has one, and its shipper's first snapshot, before any program uses
    /// it, so a restart finds its usage and root noted and answers its mount without opening it.
    pub fn open_database(&self) -> EngineResult<()> {
        self.meta.lock().map(drop)
    }

    /// The scope's usage without opening its database: the open database's, else what the closed
    /// database noted when it closed (`note.rs`); `None` for a database never opened since its
    /// note was lost (a killed process) or never written.
    pub fn usage_known(&self) -> EngineResult<Option<Usage>> {
        match self.meta.noted() {
            Some(note) => Ok(Some(note.usage)),
            None => self.usage_if_open(),
        }
    }

    /// Whether an inode losing its last name must be kept (detached) rather than deleted: a handle
    /// of this process holds it, or (on a resumed mount) the kernel may hold it.
    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        self.kernel_unknown.load(Ordering::Acquire) || self.open_files.lock().contains_key(&ino)
    }

    /// Attributes of a row, with uncommitted size and mtime of an open file applied. Called after
    /// the metadata lock is released (an open file's lock is never taken under it).
    pub(crate) fn attr_of(&self, row: &InodeRow) -> Attr {
        let (mut size, mut mtime_ns, mut ctime_ns) = (row.size, row.mtime_ns, row.ctime_ns);
        if row.kind == FileKind::File {
            if let Some((s, m)) = self.open_overlay(row.ino) {
                size = s;
                // An uncommitted change of the contents changed the ctime when it changed the mtime.
                if let Some(m) = m {
                    mtime_ns = m;
                    ctime_ns = ctime_ns.max(m);
                }
            }
        }
        Attr {
            ino: row.ino,
            kind: row.kind,
            size,
            perm: row.perm,
            nlink: match row.kind {
                FileKind::Dir => 2u32.saturating_add(u32::try_from(row.subdirs).unwrap_or(u32::MAX)),
                _ => row.nlink,
            },
            uid: row.uid,
            gid: row.gid,
            atime: from_ns(row.atime_ns),
            mtime: from_ns(mtime_ns),
            ctime: from_ns(ctime_ns),
            version: row.version,
            rdev: row.rdev,
        }
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> EngineResult<Attr> {
        names::check_lookup_name(name)?;
        let row = self.meta.lock()?.lookup(parent, name)?;
        Ok(self.attr_of(&row))
    }

    pub fn getattr(&self, ino: Ino) -> EngineResult<Attr> {
        if ino == ROOT_INO {
            // An idle scope: its root is as its closed database noted it (nothing is opened).
            if let Some(noted) = self.meta.noted() {
                return Ok(self.attr_of(&noted.root));
            }
        }
        let row = self.meta.lock()?.inode(ino)?;
        Ok(self.attr_of(&row))
    }

    pub fn setattr(&self, ino: Ino, changes: &SetAttr) -> EngineResult<Attr> {
        self.check_writable()?;
        if let Some(size) = changes.size {
            self.truncate(ino, size)?;
        }
        let ch = AttrChanges {
            perm: changes.perm,
            uid: changes.uid,
            gid: changes.gid,
            atime: changes.atime,
            mtime: changes.mtime,
            kill_suidgid: changes.kill_suidgid,
        };
        let touches =
            ch.perm.is_some() || ch.uid.is_some() || ch.gid.is_some() || ch.atime.is_some() || ch.mtime.is_some();
        if touches {
            let row = self.meta.lock()?.set_attrs(ino, &ch)?;
            if changes.mtime.is_some() {
                self.override_open_mtime(ino, row.mtime_ns);
            }
            if ch.perm.is_some() || ch.uid.is_some() || ch.gid.is_some() {
                self.forget_privs_clear(ino);
            }
        } else if changes.kill_suidgid {
            // Only the bits to clear (a truncate): nothing is written when there are none.
            self.clear_privs(ino)?;
        }
        self.getattr(ino)
    }

    pub fn readlink(&self, ino: Ino) -> EngineResult<Vec<u8>> {
        let row = self.meta.lock()?.inode(ino)?;
        match (row.kind, row.symlink_target) {
            (FileKind::Symlink, Some(t)) => Ok(t),
            _ => Err(EngineError::Invalid("not a symlink")),
        }
    }

    fn insert(&self, parent: Ino, name: &[u8], node: NewNode<'_>, owner: Owner) -> EngineResult<Attr> {
        let row = self.insert_row(parent, name, node, owner)?;
        Ok(self.attr_of(&row))
    }

    fn insert_row(&self, parent: Ino, name: &[u8], node: NewNode<'_>, owner: Owner) -> EngineResult<InodeRow> {
        self.within_inode_quota(|| self.insert_row_once(parent, name, node, owner))
    }

    fn insert_row_once(&self, parent: Ino, name: &[u8], node: NewNode<'_>, owner: Owner) -> EngineResult<InodeRow> {
        if let Some(ino) = self.resent_answer() {
            return self.meta.lock()?.inode(ino);
        }
        self.check_writable()?;
        names::check_new_name(name, parent == ROOT_INO)?;
        let max_inodes = self.quota().inodes;
        let mut meta = self.meta.lock()?;
        self.check_placement(&meta, parent, name, None)?;
        if let Some(t) = node.target {
            names::check_symlink_target(t)?;
            // The target is charged to the byte quota (committed by `insert` under this lock).
            let committed = meta.usage()?.bytes;
            self.check_bytes(committed, *self.pending_growth.lock(), t.len() as u64)?;
        }
        meta.insert(parent, name, node, owner, max_inodes)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u32, owner: Owner) -> EngineResult<Attr> {
        self.insert(parent, name, NewNode::plain(FileKind::Dir, perm), owner)
    }

    /// Creates a special or regular node: a regular file (created empty), a fifo, a socket or a
    /// device node (inert: only its number `rdev` is kept; mounts are `nodev`). Directories and
    /// symlinks have their own calls.
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u32,
        owner: Owner,
    ) -> EngineResult<Attr> {
        match kind {
            FileKind::File => {
                let flags = OpenFlags { write: false, truncate: false, exclusive: true };
                let (attr, opened) = self.create(parent, name, perm, flags, owner)?;
                self.release(attr.ino, opened.fh)?;
                Ok(attr)
            }
            FileKind::Fifo | FileKind::Socket => self.insert(parent, name, NewNode::plain(kind, perm), owner),
            FileKind::CharDevice | FileKind::BlockDevice => {
                self.insert(parent, name, NewNode { rdev, ..NewNode::plain(kind, perm) }, owner)
            }
            FileKind::Dir | FileKind::Symlink => Err(EngineError::Invalid("mknod makes files and special files")),
        }
    }

    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], owner: Owner) -> EngineResult<Attr> {
        let node = NewNode { target: Some(target), ..NewNode::plain(FileKind::Symlink, 0o777) };
        self.insert(parent, name, node, owner)
    }

    /// Gives inode `ino` (not a directory) the further name `new_parent/new_name` (`link(2)`).
    /// The name counts against the inode quota; the file's bytes are charged once.
    pub fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> EngineResult<Attr> {
        if let Some(linked) = self.resent_answer() {
            return self.getattr(linked);
        }
        self.check_writable()?;
        names::check_new_name(new_name, new_parent == ROOT_INO)?;
        let bounds = LinkBounds { max_names: self.quota().inodes, max_links: self.storage.settings.max_links_per_file };
        let row = {
            let mut meta = self.meta.lock()?;
            self.check_placement(&meta, new_parent, new_name, None)?;
            // An `O_TMPFILE` inode gets its first name (on a resumed mount the kernel, which refuses
            // to link a file that was unlinked, is the only judge: the set of this process is new).
            let unnamed_ok = self.tmpfiles.lock().contains(&ino) || self.kernel_unknown.load(Ordering::Acquire);
            meta.link(ino, new_parent, new_name, bounds, unnamed_ok)?
        };
        self.tmpfiles.lock().remove(&ino);
        Ok(self.attr_of(&row))
    }

    /// Creates a regular file without a name in directory `parent` and opens it (`O_TMPFILE`): it
    /// counts against the inode quota, `link` may give it a name while it is open, and it is deleted
    /// at its last release if it never got one (or at the next start).
    pub fn tmpfile(&self, parent: Ino, perm: u32, flags: OpenFlags, owner: Owner) -> EngineResult<(Attr, Opened)> {
        if let Some(ino) = self.resent_answer() {
            let opened = self.open(ino, flags)?;
            return Ok((self.getattr(ino)?, opened));
        }
        self.check_writable()?;
        let max_inodes = self.quota().inodes;
        let row = self.within_inode_quota(|| {
            let mut meta = self.meta.lock()?;
            let dir = meta.inode(parent)?;
            if dir.kind != FileKind::Dir {
                return Err(EngineError::NotDir);
            }
            meta.insert_detached(perm, owner.uid, owner.gid, max_inodes)
        })?;
        self.tmpfiles.lock().insert(row.ino);
        let opened = match self.open(row.ino, flags) {
            Ok(opened) => opened,
            Err(e) => {
                self.tmpfiles.lock().remove(&row.ino);
                self.after_drop(Dropped::Detached(row.ino));
                return Err(e);
            }
        };
        Ok((self.getattr(row.ino)?, opened))
    }

    /// Creates a regular file and opens it (an existing file is opened unless `exclusive`).
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u32,
        flags: OpenFlags,
        owner: Owner,
    ) -> EngineResult<(Attr, Opened)> {
        if let Some(ino) = self.resent_answer() {
            // Created by a process that died before answering: opened as it would have been.
            let opened = self.open(ino, OpenFlags { truncate: false, ..flags })?;
            return Ok((self.getattr(ino)?, opened));
        }
        let attr = match self.insert_row(parent, name, NewNode::plain(FileKind::File, perm), owner) {
            // New and empty: opened without reading anything back.
            Ok(row) => return Ok((self.attr_of(&row), self.open_created(&row, flags.write))),
            Err(EngineError::Exists) if !flags.exclusive => {
                let attr = self.lookup(parent, name)?;
                if attr.kind == FileKind::Dir {
                    return Err(EngineError::IsDir);
                }
                attr
            }
            Err(e) => return Err(e),
        };
        let opened = self.open(attr.ino, flags)?;
        Ok((self.getattr(attr.ino)?, opened))
    }

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> EngineResult<()> {
        if self.resent_answer().is_some() {
            return Ok(());
        }
        self.check_writable()?;
        names::check_lookup_name(name)?;
        let dropped = self.meta.lock()?.unlink(parent, name, &|ino| self.is_open(ino))?;
        self.after_drop(dropped);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> EngineResult<()> {
        if self.resent_answer().is_some() {
            return Ok(());
        }
        self.check_writable()?;
        names::check_lookup_name(name)?;
        self.meta.lock()?.rmdir(parent, name)
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        mode: RenameMode,
    ) -> EngineResult<()> {
        if self.resent_answer().is_some() {
            return Ok(());
        }
        self.check_writable()?;
        names::check_lookup_name(name)?;
        names::check_new_name(new_name, new_parent == ROOT_INO)?;
        let mut meta = self.meta.lock()?;
        // The moved entry (and, exchanged, the other one) must fit below the path bounds where it lands.
        let max_depth = u64::from(self.storage.settings.max_path_depth);
        let src = meta.lookup(parent, name)?;
        let from = meta.place(parent, max_depth)?.child(name.len());
        let moved = (src.kind == FileKind::Dir).then_some((src.ino, from));
        self.check_placement(&meta, new_parent, new_name, moved)?;
        if mode == RenameMode::Exchange {
            if let Ok(dst) = meta.lookup(new_parent, new_name) {
                let from = meta.place(new_parent, max_depth)?.child(new_name.len());
                let moved = (dst.kind == FileKind::Dir).then_some((dst.ino, from));
                self.check_placement(&meta, parent, name, moved)?;
            }
        }
        let dropped = meta.rename(parent, name, new_parent, new_name, mode, &|ino| self.is_open(ino))?;
        drop(meta);
        self.after_drop(dropped);
        Ok(())
    }

    /// Where a new name `name` in `parent` lands; `PathTooLong` when its path (or, for a directory
    /// `moved` from place `from`, the deepest or longest path below it) would exceed
    /// `max_path_depth` components or `max_path_bytes` bytes.
    pub(crate) fn check_placement(
        &self,
        meta: &MetaDb,
        parent: Ino,
        name: &[u8],
        moved: Option<(Ino, Place)>,
    ) -> EngineResult<Place> {
        let s = &self.storage.settings;
        let (max_depth, max_bytes) = (u64::from(s.max_path_depth), u64::from(s.max_path_bytes));
        let at = meta.place(parent, max_depth)?.child(name.len());
        let refuse = |depth: u64| {
            let bound = if depth > max_depth { Bound::PathDepth } else { Bound::PathBytes };
            crate::limits::refuse(bound);
            Err(EngineError::PathTooLong)
        };
        if at.depth > max_depth || at.bytes > max_bytes {
            return refuse(at.depth);
        }
        if let Some((dir, from)) = moved {
            // Moving no deeper and no longer cannot push anything below past a bound.
            if at.depth > from.depth || at.bytes > from.bytes {
                let (below, bytes) = meta.extent_below(dir, max_depth - at.depth, max_bytes - at.bytes)?;
                if at.depth + below > max_depth || at.bytes + bytes > max_bytes {
                    return refuse(at.depth + below);
                }
            }
        }
        Ok(at)
    }

    /// `QuotaExceeded` unless `growth` more bytes fit the byte quota next to `committed` usage and
    /// `pending` growth of open files (read together under the metadata lock by the caller).
    pub(crate) fn check_bytes(&self, committed: u64, pending: i64, growth: u64) -> EngineResult<()> {
        // Never above what SQLite stores exactly, whatever the configured quota.
        let limit = self.quota().bytes.min(i64::MAX as u64);
        let total = i128::from(committed) + i128::from(pending) + i128::from(growth);
        if total > i128::from(limit) {
            crate::limits::refuse(Bound::QuotaBytes);
            return Err(EngineError::QuotaExceeded("bytes"));
        }
        Ok(())
    }

    /// A detached inode may have been released between the namespace change and now.
    /// An open one is marked, and its last handle's release deletes it (under the same lock of the
    /// open files, so exactly one of the two does).
    /// On a resumed mount an inode not open here is kept while the kernel may hold it (deleted at
    /// its `forget`), unless the mount's probe says the kernel does not hold it.
    pub(crate) fn after_drop(&self, dropped: Dropped) {
        if let Dropped::Detached(ino) = dropped {
            if let Some(e) = self.open_files.lock().get_mut(&ino) {
                e.detached = true;
                return;
            }
            if self.kernel_unknown.load(Ordering::Acquire) {
                let probe = self.kernel_probe.lock().clone();
                if probe.is_none_or(|held| held(ino)) {
                    return;
                }
            }
            self.delete_unlinked(ino);
        }
    }
}

/// The first handle number of this process: the clock in nanoseconds (a process opens far fewer
/// files than nanoseconds pass, so a later process never reuses an earlier one's numbers).
/// `open` shifts it left by one, so it must stay below 2^63.
fn first_handle() -> u64 {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    (u64::try_from(ns).unwrap_or(u64::MAX) & (u64::MAX >> 2)).max(1)
}
