//! `ScopeService`: scope lifecycle across the registry, the file engine and the mount manager (synchronous; no HTTP).
//!
//! Provisioning is a saga recorded in the registry: the scope row and an
//! `applying` operation are written first, then the scope's filesystem is opened
//! and mounted, then the scope becomes `draft` and the operation `completed` in
//! one transaction. If opening or mounting fails the operation is marked
//! `failed` (with an error code) and the scope stays `provisioning`; it is
//! finished by the next provision request for the same operation or thread, by
//! the mount route, or at the next daemon start (`recover`). Nothing is ever
//! compensated away: a provisioning scope only ever moves forward to `draft`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scopefs::engine::{EngineError, Quota, ScopeEngine, Storage, Usage};
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::{Registry, RegistryError, ScopeRecord, ScopeState};
use scopefs_fs::{MountError, MountManager};

/// Failures of scope lifecycle work.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no such scope")]
    ScopeNotFound,
    #[error("scope is {0}; only draft and active scopes can be mounted")]
    NotMountable(ScopeState),
    #[error("operation id must be 1-128 characters of [A-Za-z0-9_.:-]")]
    BadOperationId,
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("file engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Mount(#[from] MountError),
}

impl ServiceError {
    /// A short snake_case code recorded with a failed operation.
    pub fn code(&self) -> &'static str {
        match self {
            ServiceError::ScopeNotFound => "scope_not_found",
            ServiceError::NotMountable(_) => "scope_not_mountable",
            ServiceError::BadOperationId => "invalid_operation_id",
            ServiceError::Registry(_) => "registry_error",
            ServiceError::Engine(_) => "engine_error",
            ServiceError::Mount(_) => "mount_failed",
        }
    }
}

/// A scope record with its current usage.
#[derive(Debug, Clone)]
pub struct ScopeStatus {
    pub record: ScopeRecord,
    pub usage: Usage,
}

/// Validates an idempotency key: 1-128 characters of `[A-Za-z0-9_.:-]`.
pub fn validate_operation_id(op: &str) -> Result<(), ServiceError> {
    let ok = (1..=128).contains(&op.len())
        && op.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    ok.then_some(()).ok_or(ServiceError::BadOperationId)
}

/// Everything the daemon needs to run scopes of one deployment.
pub struct ScopeService {
    deployment: String,
    default_quota: Quota,
    registry: Arc<Registry>,
    storage: Arc<Storage>,
    mounts: MountManager,
    /// Open engines, kept alive while the daemon runs (the storage only holds weak references).
    engines: Mutex<HashMap<ScopeId, Arc<ScopeEngine>>>,
    /// Serializes provisioning completion so one scope is never finished twice at once.
    provisioning: Mutex<()>,
    ready: AtomicBool,
}

impl ScopeService {
    pub fn new(
        deployment: String,
        default_quota: Quota,
        registry: Arc<Registry>,
        storage: Arc<Storage>,
        mounts: MountManager,
    ) -> ScopeService {
        ScopeService {
            deployment,
            default_quota,
            registry,
            storage,
            mounts,
            engines: Mutex::new(HashMap::new()),
            provisioning: Mutex::new(()),
            ready: AtomicBool::new(false),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release)
    }

    /// The open engine of a scope, opening it if needed.
    fn engine(&self, rec: &ScopeRecord) -> Result<Arc<ScopeEngine>, ServiceError> {
        let mut engines = self.engines.lock();
        if let Some(engine) = engines.get(&rec.scope_id) {
            return Ok(engine.clone());
        }
        let engine = self.storage.open_scope(&rec.scope_id, rec.quota_or(self.default_quota))?;
        engines.insert(rec.scope_id.clone(), engine.clone());
        Ok(engine)
    }

    /// Opens and mounts a `provisioning` scope, then records it as `draft` (see the module docs).
    fn finish_provisioning(&self, rec: &ScopeRecord) -> Result<ScopeRecord, ServiceError> {
        let _one_at_a_time = self.provisioning.lock();
        let mounted = self.engine(rec).and_then(|engine| Ok(self.mounts.mount(engine)?));
        match mounted {
            Ok(_) => Ok(self.registry.complete_provision(&self.deployment, &rec.scope_id)?),
            Err(e) => {
                if let Err(re) = self.registry.fail_provision(&self.deployment, &rec.scope_id, e.code()) {
                    tracing::error!(scope_id = %rec.scope_id, error = %re, "recording a failed provisioning failed");
                }
                Err(e)
            }
        }
    }

    /// The scope of a primary thread and its open engine, for file work through the API.
    /// `ScopeNotFound` for an unknown thread or a scope that is not draft/active (deleted ones are gone),
    /// `NotMountable(Deleting)` while it is being deleted (the API answers 409).
    pub fn engine_for_thread(&self, thread: &ThreadId) -> Result<(ScopeRecord, Arc<ScopeEngine>), ServiceError> {
        let rec = self.registry.find_by_thread(&self.deployment, thread)?.ok_or(ServiceError::ScopeNotFound)?;
        match rec.state {
            ScopeState::Draft | ScopeState::Active => {
                let engine = self.engine(&rec)?;
                Ok((rec, engine))
            }
            ScopeState::Deleting => Err(ServiceError::NotMountable(ScopeState::Deleting)),
            _ => Err(ServiceError::ScopeNotFound),
        }
    }

    /// Idempotent provisioning (operation id and thread); returns the scope and whether it is new.
    pub fn provision(&self, operation_id: &str, thread: &ThreadId) -> Result<(ScopeRecord, bool), ServiceError> {
        validate_operation_id(operation_id)?;
        let p = self.registry.provision(&self.deployment, operation_id, thread, None)?;
        let rec = if p.scope.state == ScopeState::Provisioning { self.finish_provisioning(&p.scope)? } else { p.scope };
        if p.created {
            tracing::info!(scope_id = %rec.scope_id, operation_id, "scope provisioned");
        }
        Ok((rec, p.created))
    }

    /// The scope bound to `thread` with its usage, if any.
    pub fn by_thread(&self, thread: &ThreadId) -> Result<Option<ScopeStatus>, ServiceError> {
        let Some(record) = self.registry.find_by_thread(&self.deployment, thread)? else {
            return Ok(None);
        };
        let usage = match record.state {
            ScopeState::Draft | ScopeState::Active | ScopeState::Deleting => self.engine(&record)?.usage()?,
            ScopeState::Provisioning | ScopeState::Deleted => Usage::default(),
        };
        Ok(Some(ScopeStatus { record, usage }))
    }

    /// Mounts the scope if it is not mounted yet (finishing its provisioning if needed); returns the mountpoint.
    pub fn mount(&self, scope: &ScopeId) -> Result<(ScopeRecord, PathBuf), ServiceError> {
        let mut rec = self.registry.get(&self.deployment, scope)?.ok_or(ServiceError::ScopeNotFound)?;
        if rec.state == ScopeState::Provisioning {
            rec = self.finish_provisioning(&rec)?;
        }
        if !rec.state.is_mountable() {
            return Err(ServiceError::NotMountable(rec.state));
        }
        let path = self.mounts.mount(self.engine(&rec)?)?;
        Ok((rec, path))
    }

    /// Startup: finishes scopes left in `provisioning` and remounts every draft and active scope.
    /// A scope that cannot be mounted is logged and skipped (the mount route retries it).
    pub fn recover(&self) -> Result<RecoveryReport, ServiceError> {
        let mut report = RecoveryReport::default();
        for rec in self.registry.list(&self.deployment)? {
            let result = match rec.state {
                ScopeState::Provisioning => self.finish_provisioning(&rec).map(|_| ()),
                ScopeState::Draft | ScopeState::Active => {
                    self.engine(&rec).and_then(|engine| Ok(self.mounts.mount(engine).map(|_| ())?))
                }
                ScopeState::Deleting | ScopeState::Deleted => continue,
            };
            match result {
                Ok(()) => report.mounted += 1,
                Err(e) => {
                    tracing::error!(scope_id = %rec.scope_id, state = %rec.state, error = %e, "scope could not be mounted at startup");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// Shutdown: waits (bounded by `timeout` overall) for every scope's uploads — what remains stays
    /// journaled and is uploaded after the next start — then unmounts every scope.
    pub fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let engines: Vec<_> = self.engines.lock().values().cloned().collect();
        for engine in &engines {
            let left = deadline.saturating_duration_since(Instant::now());
            if !engine.wait_uploads(left) {
                tracing::warn!(
                    scope_id = %engine.scope_id(),
                    pending = engine.pending_uploads(),
                    "uploads still pending at shutdown; they stay journaled"
                );
            }
        }
        self.mounts.unmount_all();
        self.engines.lock().clear();
    }
}

/// Creates a scope and its filesystem without mounting it (CLI `scope create`; needs no mount
/// manager, so it never touches the mounts of a running daemon).
pub fn create_unmounted(
    deployment: &str,
    default_quota: Quota,
    registry: &Registry,
    storage: &Arc<Storage>,
    thread: &ThreadId,
) -> Result<ScopeRecord, ServiceError> {
    let rec = registry.create_scope(deployment, thread, None)?;
    storage.open_scope(&rec.scope_id, rec.quota_or(default_quota))?;
    Ok(registry.complete_provision(deployment, &rec.scope_id)?)
}

/// What `recover` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    pub mounted: usize,
    pub failed: usize,
}
