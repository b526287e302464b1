//! The daemon's services, each with one job and its own state: `Scopes` (provisioning, mounts,
//! owners, runs, leases and the lifecycle of scopes), `WorkspaceFiles` (file work of the HTTP API
//! and signed tool requests in a thread's scope) and `ComputeService` (environments, commands and
//! processes). They share the deployment's registry handle and `OpenScopes`, the one table of open
//! scopes; mounting goes through the `Mounter` trait. Synchronous: call them on blocking threads.
//!
//! Dependencies run one way: `api` → services → (registry, engine, `mounter`, `executor`); inside,
//! `scopes` → `compute` (a deleted scope's work is stopped) → `open_scopes` → `mounter`.

pub mod cluster;
mod cluster_tick;
pub mod compute;
pub mod files;
pub mod forks;
pub mod gc;
mod lifecycle;
pub mod mounter;
pub mod open_scopes;
pub mod peers;
mod sagas;
pub mod scopes;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use scopefs::engine::{EngineError, Usage};
use scopefs::registry::{RegistryError, ScopeRecord, ScopeState};
use scopefs_fs::MountError;

pub use compute::ComputeService;
pub use files::WorkspaceFiles;
pub use lifecycle::{LifecycleSettings, MaintenanceReport};
pub use sagas::{CutoverGate, OperationsReport};
pub use scopes::{ProvisionBy, Scopes};

/// Failures of scope lifecycle work.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no such scope")]
    ScopeNotFound,
    #[error("scope is {0}; only draft and active scopes can be mounted")]
    NotMountable(ScopeState),
    #[error("operation id must be 1-128 characters of [A-Za-z0-9_.:-]")]
    BadOperationId,
    #[error("a scope can only be moved to active or deleting")]
    StateNotRequestable,
    /// Cutover mode `required` and the migration report does not check out (seed 000 §11.1).
    #[error("this thread has no workspace and the deployment's migration is not verified; run the cutover")]
    MigrationRequired,
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("file engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Mount(#[from] MountError),
    /// The scope is in use in a way the request cannot proceed through.
    #[error("scope is busy: {0}")]
    Busy(&'static str),
    /// Several nodes: another node serves this scope (or none does until a takeover).
    #[error("this scope is served by another node or is moving between nodes; retry")]
    ServedElsewhere,
}

impl ServiceError {
    /// A short snake_case code recorded with a failed operation.
    pub fn code(&self) -> &'static str {
        match self {
            ServiceError::ScopeNotFound => "scope_not_found",
            ServiceError::NotMountable(_) => "scope_not_mountable",
            ServiceError::BadOperationId => "invalid_operation_id",
            ServiceError::StateNotRequestable => "invalid_state_transition",
            ServiceError::MigrationRequired => "migration_required",
            ServiceError::Registry(_) => "registry_error",
            ServiceError::Engine(_) => "engine_error",
            ServiceError::Mount(_) => "mount_failed",
            ServiceError::ServedElsewhere => "scope_moving",
            ServiceError::Busy(_) => "scope_busy",
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
    scopefs::ids::is_token(op).then_some(()).ok_or(ServiceError::BadOperationId)
}

/// What `Scopes::recover` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    pub mounted: usize,
    pub failed: usize,
}

/// Aborts the process at failpoint `name` (test builds only, see `scopefs::testhooks`); a worker
/// started by the supervisor takes its supervisor down too, so the whole service crashes as a
/// crash test means (a worker crash alone is survived; its kept mounts end with the supervisor).
pub(crate) fn failpoint(name: &str) {
    scopefs::testhooks::failpoint_then(name, || {
        if crate::notify::supervised() {
            // SAFETY: kill(2) of our parent, the supervisor that started this worker.
            unsafe { libc::kill(libc::getppid(), libc::SIGKILL) };
        }
    });
}

/// The services of one daemon, as the HTTP API and startup use them.
#[derive(Clone)]
pub struct Services {
    pub scopes: Arc<Scopes>,
    pub files: Arc<WorkspaceFiles>,
    pub compute: Arc<ComputeService>,
    /// With several nodes: this node.
    pub cluster: Option<Arc<cluster::Cluster>>,
}

/// Whether a scope in `state` has files the API can work on: `NotMountable(Deleting)` while it is
/// being deleted (the API answers 409), `ScopeNotFound` when it is not draft/active.
pub(crate) fn require_open_state(state: ScopeState) -> Result<(), ServiceError> {
    match state {
        s if s.is_mountable() => Ok(()),
        ScopeState::Deleting => Err(ServiceError::NotMountable(ScopeState::Deleting)),
        _ => Err(ServiceError::ScopeNotFound),
    }
}
