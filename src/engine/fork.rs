//! Forks and snapshots (issue 23 item 5): a new scope whose files are another's at one instant,
//! made by copying the parent's metadata database (O(metadata)), never a block: the copy's blocks
//! are read from where they live (`blocks.home`, the parent's prefix or further up). Which scope
//! refers to which block of another is the registry's to keep ([`SharedBlocks`]): gc and purge of
//! the scope that holds a block delete it only once no other scope refers to it, and the last
//! scope letting go of a block of a purged scope deletes it.

use std::collections::HashSet;
use std::sync::Arc;

use super::error::{EngineError, EngineResult};
use super::scope::ScopeEngine;
use super::storage::Storage;
use crate::ids::ScopeId;

/// Which scopes refer to which blocks of others (implemented over the registry).
pub trait SharedBlocks: Send + Sync {
    /// Whether another scope refers to `home`'s block `sha`.
    fn held(&self, home: &str, sha: &str) -> Result<bool, String>;
    /// `holder` no longer refers to `home`'s block `sha`; `true` when no scope does any more and
    /// `home` no longer keeps its blocks (it was purged): the caller deletes the object.
    fn release(&self, holder: &str, home: &str, sha: &str) -> Result<bool, String>;
    /// `home`'s blocks that other scopes refer to (a purge keeps them).
    fn held_blocks(&self, home: &str) -> Result<HashSet<String>, String>;
}

fn shared_error(e: String) -> EngineError {
    EngineError::Store(crate::store::StoreError::Unavailable(e))
}

impl Storage {
    /// Makes `child` (a scope with no local database yet) a copy of `parent` as it is now: every
    /// block `parent` committed is put in the store first, its database copied and made the
    /// child's. Returns the (home, sha) of every block the child refers to, for the registry.
    pub fn fork_scope(&self, parent: &Arc<ScopeEngine>, child: &ScopeId) -> EngineResult<Vec<(String, String)>> {
        let dir = self.scope_meta_dir(child.as_str());
        crate::durable_dirs::create_private_dir(&dir)?;
        let db = dir.join("meta.sqlite3");
        if db.exists() {
            return Err(EngineError::Exists);
        }
        parent.sync()?;
        crate::testhooks::interleave("fork.synced", parent.scope_id().as_str());
        // The copy may name a block the parent lets go of before the next sync stores it: it
        // must not be dropped unstored meanwhile (`unneeded.rs`).
        let _stored_first = parent.hold_drops();
        let tmp = dir.join("meta.sqlite3-fork");
        let _ = crate::db_files::remove_with(&tmp, &["", "-wal", "-shm"]);
        parent.meta.lock()?.snapshot_to(&tmp)?;
        crate::testhooks::interleave("fork.copied", parent.scope_id().as_str());
        // What the copy names and was still staged is in the store once this returns.
        parent.sync()?;
        let homed = super::meta::forked::prepare_copy(&tmp, parent.scope_id().as_str(), child.as_str())?;
        crate::db_files::replace_with(&db, &tmp, &["-wal", "-shm", "-redo"])?;
        Ok(homed)
    }

    /// Deletes the objects of block `sha` under scope `home`'s prefix, under every epoch's key (the
    /// last holder of a block of a purged scope let go of it).
    pub fn delete_block_object(&self, home: &str, sha: &str) -> EngineResult<()> {
        let prefix = crate::store::block_key(home, sha);
        let attempts = self.settings.store_attempts;
        self.rt.block_on(async {
            for obj in self.with_retry(attempts, || self.store.list(&prefix)).await? {
                if crate::store::block_of_key(home, &obj.key).is_some_and(|(s, _)| s == sha) {
                    self.with_retry(attempts, || self.store.delete(&obj.key)).await?;
                }
            }
            Ok::<_, EngineError>(())
        })
    }

    /// Several scopes may share blocks: `shared` says which (set once, before a scope opens).
    pub fn set_shared_blocks(&self, shared: Arc<dyn SharedBlocks>) {
        let _ = self.shared.set(shared);
    }

    pub(crate) fn shared_blocks(&self) -> Option<&Arc<dyn SharedBlocks>> {
        self.shared.get()
    }

    /// `scope`'s blocks other scopes refer to (none without a [`SharedBlocks`]).
    pub(crate) fn held_blocks(&self, scope: &str) -> EngineResult<HashSet<String>> {
        match self.shared_blocks() {
            Some(s) => s.held_blocks(scope).map_err(shared_error),
            None => Ok(HashSet::new()),
        }
    }
}

impl ScopeEngine {
    /// Where block `sha`'s object lives: the scope whose prefix holds it (this one, or the one it
    /// shares it with) and the fencing epoch of its key.
    pub(crate) fn place_of(&self, sha: &str) -> EngineResult<(String, u64)> {
        let (home, epoch) = self.meta.lock()?.block_place(sha)?;
        Ok((home.unwrap_or_else(|| self.scope_id.as_str().to_string()), epoch))
    }

    /// The key of block `sha`'s object.
    pub(crate) fn key_of(&self, sha: &str) -> EngineResult<String> {
        let (home, epoch) = self.place_of(sha)?;
        Ok(crate::store::block_key_at(&home, epoch, sha))
    }

    /// The fencing epoch blocks new to this scope are stored under (0: one node, no fence).
    pub(crate) fn key_epoch(&self) -> u64 {
        self.ship.as_ref().map_or(0, |s| s.key_epoch)
    }

    /// Starts background downloads of `shas`, each from the key it lives under.
    pub(crate) fn prefetch(&self, shas: Vec<String>) -> EngineResult<()> {
        let mut by_place: std::collections::BTreeMap<(String, u64), Vec<String>> = Default::default();
        for sha in shas {
            by_place.entry(self.place_of(&sha)?).or_default().push(sha);
        }
        for ((home, epoch), shas) in by_place {
            self.storage.prefetch((&home, epoch), &self.shares.fetch, shas);
        }
        Ok(())
    }

    /// Blocks of other scopes this scope refers to: (home, sha).
    pub fn shared_blocks(&self) -> EngineResult<Vec<(String, String)>> {
        self.meta.lock()?.homed_blocks()
    }

    /// Whether another scope refers to this scope's block `sha` (gc keeps it then).
    pub(crate) fn held_elsewhere(&self, sha: &str) -> EngineResult<bool> {
        match self.storage.shared_blocks() {
            Some(s) => s.held(self.scope_id.as_str(), sha).map_err(shared_error),
            None => Ok(false),
        }
    }

    /// This scope no longer refers to `home`'s block `sha`: whether the object must go now.
    pub(crate) fn release_shared(&self, home: &str, sha: &str) -> EngineResult<bool> {
        match self.storage.shared_blocks() {
            Some(s) => s.release(self.scope_id.as_str(), home, sha).map_err(shared_error),
            None => Ok(false),
        }
    }
}
