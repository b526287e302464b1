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

/// Several nodes: which scopes this node may open (it serves them), asked before a scope opens.
pub trait ServesScope: Send + Sync {
    /// `Ok` when this node serves `scope` (or may start to: nobody does); else `ServedElsewhere`.
    fn admit(&self, scope: &ScopeId) -> Result<(), ServiceError>;
    /// The scope's engine opened here.
    fn opened(&self, scope: &ScopeId);
}

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
    /// With several nodes: the scopes this node serves (`services::cluster`).
    gate: std::sync::OnceLock<Arc<dyn ServesScope>>,
}

impl OpenScopes {
    pub fn new(storage: Arc<Storage>, mounter: Arc<dyn Mounter>, default_quota: Quota) -> OpenScopes {
        OpenScopes {
            storage,
            mounter,
            default_quota,
            table: Mutex::new(HashMap::new()),
            gate: std::sync::OnceLock::new(),
        }
    }

    /// Opens only the scopes `gate` admits from now on (set once, before any scope opens).
    pub fn set_gate(&self, gate: Arc<dyn ServesScope>) {
        let _ = self.gate.set(gate);
    }

    /// The quota of a scope that records none.
    pub fn default_quota(&self) -> Quota {
        self.default_quota
    }

    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    pub fn mounter(&self) -> &dyn Mounter {
        self.mounter.as_ref()
    }

    /// The engine of a scope, opening it (without mounting) if needed.
    /// The table is not held while the scope opens (`Storage` opens each scope once, and
    /// different scopes in parallel); an entry another caller made meanwhile is kept.
    pub fn engine(&self, rec: &ScopeRecord) -> Result<Arc<ScopeEngine>, ServiceError> {
        if let Some(open) = self.table.lock().get(&rec.scope_id) {
            return Ok(open.engine.clone());
        }
        if let Some(gate) = self.gate.get() {
            gate.admit(&rec.scope_id)?;
        }
        let quota = rec.quota_or(self.default_quota);
        let engine = if self.mounter.will_resume(&rec.scope_id) {
            self.storage.open_scope_resumed(&rec.scope_id, quota)?
        } else {
            self.storage.open_scope(&rec.scope_id, quota)?
        };
        if let Some(gate) = self.gate.get() {
            gate.opened(&rec.scope_id);
        }
        let mut table = self.table.lock();
        let open = table.entry(rec.scope_id.clone()).or_insert(OpenScope { engine, mount: None });
        Ok(open.engine.clone())
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

    /// Opens and mounts many scopes at once on `threads` threads (startup): mounting is mostly
    /// waiting on the kernel, and different scopes do not wait on each other (see
    /// `MountManager::mount`). Returns each scope's result, in no particular order.
    pub fn mount_all(&self, records: &[ScopeRecord], threads: usize) -> Vec<(ScopeId, Result<PathBuf, ServiceError>)> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = Mutex::new(Vec::with_capacity(records.len()));
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, records.len().max(1)) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(rec) = records.get(i) else { return };
                    let result = self.mount(rec);
                    results.lock().push((rec.scope_id.clone(), result));
                });
            }
        });
        results.into_inner()
    }

    /// Whether a scope is mounted.
    pub fn is_mounted(&self, scope: &ScopeId) -> bool {
        self.table.lock().get(scope).is_some_and(|o| o.mount.is_some())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use scopefs::engine::{Quota, Storage, StorageSettings};
    use scopefs::ids::ThreadId;
    use scopefs::registry::Registry;
    use scopefs::store::MemoryStore;

    use super::OpenScopes;
    use crate::services::mounter::FakeMounter;

    #[test]
    fn mount_all_mounts_each_scope_once_in_parallel_and_reports_each_failure() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let storage = Storage::new(
            Arc::new(MemoryStore::new()),
            StorageSettings::default(),
            &dir.path().join("data"),
            rt.handle().clone(),
        )
        .unwrap();
        let registry = Arc::new(Registry::open_in_memory().unwrap()).deployment("d");
        let records: Vec<_> = (0..40)
            .map(|i| {
                let rec = registry.create_scope(&ThreadId::parse(&format!("t{i}")).unwrap(), None).unwrap();
                registry.complete_provision(&rec.scope_id).unwrap()
            })
            .collect();
        let mounter = Arc::new(FakeMounter::new(&dir.path().join("mnt")));
        let open = OpenScopes::new(storage, mounter.clone(), Quota { bytes: 1 << 20, inodes: 100 });
        mounter.fail_next_mounts(3);
        let results = open.mount_all(&records, 8);
        assert_eq!(results.len(), records.len());
        let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).map(|(id, _)| id.clone()).collect();
        assert_eq!(failed.len(), 3, "every injected failure is reported for its own scope");
        assert_eq!(mounter.mounts_made(), 37);
        assert_eq!(open.counts().mounted, 37);
        // Again: the failed ones mount now, the mounted ones are not mounted twice.
        let again = open.mount_all(&records, 8);
        assert!(again.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(mounter.mounts_made(), 40);
        assert!(records.iter().all(|r| mounter.is_mounted(&r.scope_id)));
    }
}
