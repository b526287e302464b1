//! Reading a scope's directories (entries, pages of entries, parents and paths) and its
//! filesystem statistics: the engine's read-only namespace queries beside `scope.rs`.

use super::error::{EngineError, EngineResult};
use super::meta::InodeRow;
use super::scope::ScopeEngine;
use super::types::*;
use crate::names;

impl ScopeEngine {
    /// Children of a directory (without `.` and `..`).
    pub fn readdir(&self, ino: Ino) -> EngineResult<Vec<DirEntry>> {
        let rows = {
            let meta = self.meta.lock()?;
            if meta.inode(ino)?.kind != FileKind::Dir {
                return Err(EngineError::NotDir);
            }
            meta.children(ino)?
        };
        Ok(self.entries(rows))
    }

    /// One page of a directory's names: at most `limit` entries after cursor `after` (0 starts; then
    /// the `cursor` of the last entry returned). A listing paged this way needs no snapshot: every
    /// name present for the whole walk is returned exactly once, names added or removed meanwhile at
    /// most once.
    pub fn readdir_page(&self, ino: Ino, after: u64, limit: usize) -> EngineResult<Vec<DirEntry>> {
        let rows = {
            let meta = self.meta.lock()?;
            if meta.inode(ino)?.kind != FileKind::Dir {
                return Err(EngineError::NotDir);
            }
            meta.children_after(ino, after, limit)?
        };
        Ok(self.entries(rows))
    }

    /// Directory entries of metadata rows.
    fn entries(&self, rows: Vec<InodeRow>) -> Vec<DirEntry> {
        rows.into_iter()
            .map(|row| {
                let attr = self.attr_of(&row);
                let cursor = super::meta::cursor_of(&row);
                DirEntry { name: row.name.unwrap_or_default(), attr, cursor }
            })
            .collect()
    }

    /// The parent directory of a directory (root is its own parent).
    pub fn parent_of(&self, ino: Ino) -> EngineResult<Ino> {
        if ino == ROOT_INO {
            return Ok(ROOT_INO);
        }
        self.meta.lock()?.inode(ino)?.parent.ok_or(EngineError::NotFound)
    }

    /// The virtual path of an inode, if it still has a name.
    pub fn path_of(&self, ino: Ino) -> EngineResult<Option<String>> {
        self.meta.lock()?.path_of(ino)
    }

    pub fn statfs(&self) -> EngineResult<StatFs> {
        const BSIZE: u64 = 4096;
        let q = self.quota();
        let (used, pending) = match self.meta.noted() {
            // An idle scope: its database holds exactly the noted usage (nothing is opened).
            Some(noted) => (noted.usage, (*self.pending_growth.lock()).max(0) as u64),
            None => {
                let meta = self.meta.lock()?;
                (meta.usage()?, (*self.pending_growth.lock()).max(0) as u64)
            }
        };
        let used_bytes = used.bytes + pending;
        Ok(StatFs {
            block_size: BSIZE as u32,
            total_blocks: q.bytes / BSIZE,
            free_blocks: q.bytes.saturating_sub(used_bytes) / BSIZE,
            total_inodes: q.inodes,
            free_inodes: q.inodes.saturating_sub(used.inodes + used.links),
            max_name_len: names::MAX_NAME_LEN as u32,
        })
    }
}
