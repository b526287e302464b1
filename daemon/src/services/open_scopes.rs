//! `OpenScopes`: the one table of the scopes this daemon has open — each scope's engine and, when
//! mounted, the path its mount answers at. Opening, mounting and closing go through here only, so
//! the engine, the mount and the FUSE session of a scope are never out of step. (The shared
//! `Storage` keeps only weak references for its budgets; the mounter keeps the FUSE session.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use scopefs::engine::{Quota, ScopeEngine, Storage};
use scopefs::ids::ScopeId;
use scopefs::registry::ScopeRecord;

use super::mounter::Mounter;
use super::ServiceError;

/// One open scope.
struct OpenScope {
    engine: Arc<ScopeEngine>,
    /// The path its mount answers at (what a container binds), once mounted.
    mount: Option<PathBuf>,
}

/// Counts of the table, for metrics and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OpenCounts {
    pub open: usize,
    pub mounted: usize,
}

/// The scopes open in this daemon (see the module docs).
pub struct OpenScopes {
    storage: Arc<Storage>,
    mounter: Arc<dyn Mounter>,
    default_quota: Quota,
    table: Mutex<HashMap<ScopeId, OpenScope>>,
}

impl OpenScopes {
    pub fn new(storage: Arc<Storage>, mounter: Arc<dyn Mounter>, default_quota: Quota) -> OpenScopes {
        OpenScopes { storage, mounter, default_quota, table: Mutex::new(HashMap::new()) }
    }

    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    pub fn mounter(&self) -> &dyn Mounter {
        self.mounter.as_ref()
    }

    /// The engine of a scope, opening it (without mounting) if needed.
    pub fn engine(&self, rec: &ScopeRecord) -> Result<Arc<ScopeEngine>, ServiceError> {
        let mut table = self.table.lock();
        if let Some(open) = table.get(&rec.scope_id) {
            return Ok(open.engine.clone());
        }
        let engine = self.storage.open_scope(&rec.scope_id, rec.quota_or(self.default_quota))?;
        table.insert(rec.scope_id.clone(), OpenScope { engine: engine.clone(), mount: None });
        Ok(engine)
    }

    /// Opens and mounts a scope (both idempotent); returns the path a container binds.
    pub fn mount(&self, rec: &ScopeRecord) -> Result<PathBuf, ServiceError> {
        let engine = self.engine(rec)?;
        let path = self.mounter.mount(engine)?;
        if let Some(open) = self.table.lock().get_mut(&rec.scope_id) {
            open.mount = Some(path.clone());
        }
        Ok(path)
    }

    /// The engine of a scope if it is open.
    pub fn get(&self, scope: &ScopeId) -> Option<Arc<ScopeEngine>> {
        self.table.lock().get(scope).map(|open| open.engine.clone())
    }

    /// Every open engine.
    pub fn engines(&self) -> Vec<Arc<ScopeEngine>> {
        self.table.lock().values().map(|open| open.engine.clone()).collect()
    }

    pub fn counts(&self) -> OpenCounts {
        let table = self.table.lock();
        OpenCounts { open: table.len(), mounted: table.values().filter(|o| o.mount.is_some()).count() }
    }

    /// Unmounts a scope and closes its engine (a no-op for a scope that is not open or mounted).
    pub fn close(&self, scope: &ScopeId) -> Result<(), ServiceError> {
        self.mounter.unmount(scope)?;
        self.table.lock().remove(scope);
        Ok(())
    }

    /// Closes a scope and deletes its local metadata, staging and cache (objects stay).
    pub fn remove_local(&self, scope: &ScopeId) -> Result<(), ServiceError> {
        self.close(scope)?;
        Ok(self.storage.remove_scope_local(scope)?)
    }

    /// Unmounts every scope and closes every engine (a real stop).
    pub fn close_all(&self) {
        self.mounter.unmount_all();
        self.table.lock().clear();
    }
}
