//! Public API of `Storage` and `ScopeEngine` (bodies being implemented).
#![allow(unused_variables)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::ids::ScopeId;
use crate::store::ObjectStore;

/// Shared by all scopes of one daemon: the object store, the block cache, the runtime and staging accounting.
pub struct Storage {}

/// Result of a garbage collection pass of one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub blocks_deleted: u64,
    pub bytes_deleted: u64,
}

/// Result of `fsck` of one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    pub files_checked: u64,
    pub blocks_checked: u64,
    /// Virtual paths of files with a missing or corrupt block.
    pub damaged_files: Vec<String>,
    /// Objects under the scope prefix no block row refers to.
    pub orphan_objects: Vec<String>,
}

impl Storage {
    /// Opens the shared storage rooted at `data_dir` (`staging/`, `cache/`, `scopes/` below it).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        settings: StorageSettings,
        data_dir: &Path,
        runtime: tokio::runtime::Handle,
    ) -> EngineResult<Arc<Storage>> {
        todo!()
    }
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        todo!()
    }
    pub fn settings(&self) -> &StorageSettings {
        todo!()
    }
    /// Opens (creating if needed) one scope's engine; replays its upload journal and drops orphans.
    pub fn open_scope(self: &Arc<Self>, scope_id: &ScopeId, quota: Quota) -> EngineResult<Arc<ScopeEngine>> {
        todo!()
    }
    /// Bytes currently held in staging across all scopes.
    pub fn staging_bytes(&self) -> u64 {
        todo!()
    }
}

/// One scope's filesystem.
pub struct ScopeEngine {}

impl ScopeEngine {
    pub fn scope_id(&self) -> &ScopeId {
        todo!()
    }
    /// Read-only (deleting) scopes answer `ReadOnly` to every change.
    pub fn set_read_only(&self, read_only: bool) {
        todo!()
    }
    pub fn set_quota(&self, quota: Quota) {
        todo!()
    }
    pub fn quota(&self) -> Quota {
        todo!()
    }
    pub fn usage(&self) -> EngineResult<Usage> {
        todo!()
    }
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> EngineResult<Attr> {
        todo!()
    }
    pub fn getattr(&self, ino: Ino) -> EngineResult<Attr> {
        todo!()
    }
    pub fn setattr(&self, ino: Ino, changes: &SetAttr) -> EngineResult<Attr> {
        todo!()
    }
    pub fn readlink(&self, ino: Ino) -> EngineResult<Vec<u8>> {
        todo!()
    }
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u32, owner: Owner) -> EngineResult<Attr> {
        todo!()
    }
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> EngineResult<()> {
        todo!()
    }
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> EngineResult<()> {
        todo!()
    }
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], owner: Owner) -> EngineResult<Attr> {
        todo!()
    }
    pub fn rename(&self, parent: Ino, name: &[u8], new_parent: Ino, new_name: &[u8], mode: RenameMode) -> EngineResult<()> {
        todo!()
    }
    /// Creates a regular file and opens it.
    pub fn create(&self, parent: Ino, name: &[u8], perm: u32, flags: OpenFlags, owner: Owner) -> EngineResult<(Attr, Opened)> {
        todo!()
    }
    pub fn open(&self, ino: Ino, flags: OpenFlags) -> EngineResult<Opened> {
        todo!()
    }
    pub fn read(&self, ino: Ino, fh: Fh, offset: u64, size: u32) -> EngineResult<Vec<u8>> {
        todo!()
    }
    pub fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> EngineResult<u32> {
        todo!()
    }
    /// Commits the file's dirty data (a new version); in `close` durability also uploads it.
    pub fn flush(&self, ino: Ino, fh: Fh) -> EngineResult<()> {
        todo!()
    }
    pub fn release(&self, ino: Ino, fh: Fh) -> EngineResult<()> {
        todo!()
    }
    /// Commits and waits until every block of the file is in the object store.
    pub fn fsync(&self, ino: Ino, fh: Option<Fh>) -> EngineResult<()> {
        todo!()
    }
    /// Children of a directory (without `.` and `..`).
    pub fn readdir(&self, ino: Ino) -> EngineResult<Vec<DirEntry>> {
        todo!()
    }
    /// The parent directory of a directory (root is its own parent).
    pub fn parent_of(&self, ino: Ino) -> EngineResult<Ino> {
        todo!()
    }
    pub fn statfs(&self) -> EngineResult<StatFs> {
        todo!()
    }
    /// Waits until the upload queue is empty; `false` if `timeout` passed first.
    pub fn wait_uploads(&self, timeout: Duration) -> bool {
        todo!()
    }
    pub fn pending_uploads(&self) -> usize {
        todo!()
    }
    pub fn collect_garbage(&self, grace: Duration) -> EngineResult<GcReport> {
        todo!()
    }
    pub fn fsck(&self, repair: bool) -> EngineResult<FsckReport> {
        todo!()
    }
    /// `PRAGMA integrity_check` of the scope's metadata database ("ok" when healthy).
    pub fn integrity_check(&self) -> EngineResult<String> {
        todo!()
    }
}
