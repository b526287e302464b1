//! Sandboxed execution (SPEC §8): the executor the daemon drives, its settings, startup checks
//! (strict mode) and the errors of compute work. The work itself — environments, commands,
//! background processes, reconciliation — is `ScopeService` methods in `ops`.
//!
//! Restart choice (issue 4 item 5): a container bind-mounts the scope's **leaf** mountpoint, and
//! after the daemon restarts that bind mount answers `ENOTCONN` for good. So at startup, before
//! scopes are remounted, every environment the registry still records as live is ended with reason
//! `daemon_restart` (runtime recorded up to that moment) and every container carrying the
//! deployment's label is removed; nothing survives a restart, and nothing runs unknown to the
//! registry. If the engine cannot be reached at startup (optional mode), the containers are removed
//! as soon as it answers again, before any compute request is served.

pub mod docker;
#[cfg(test)]
pub mod fake;
mod ops;
pub mod policy;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use scopefs::config::{Config, Isolation};
use scopefs::executor::{Executor, ExecutorError};
use scopefs::limits::{Bound, PerScopeSlots, ScopeSlot};

use crate::service::ServiceError;

pub use ops::{Caller, CreateEnvironment};

/// Failures of compute work (mapped to HTTP in `api::error`).
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("compute is unavailable: {0}")]
    Unavailable(String),
    #[error("no such environment")]
    EnvironmentNotFound,
    #[error("no such process")]
    ProcessNotFound,
    #[error("the environment is not running")]
    NotRunning,
    #[error("this scope already has its maximum number of live environments")]
    AtCapacity,
    /// A per-scope `[limits]` bound (the text names it); counted by `scopefs::limits::refuse`.
    #[error("this scope already has its maximum number of {0}")]
    TooMany(&'static str),
    #[error("invalid {0}: {1}")]
    Invalid(&'static str, String),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("executor: {0}")]
    Executor(ExecutorError),
    #[error("runtime area: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Billing(#[from] scopefs::billing::BillingError),
}

impl From<ExecutorError> for ComputeError {
    fn from(e: ExecutorError) -> Self {
        match e {
            ExecutorError::Unavailable(m) => ComputeError::Unavailable(m),
            other => ComputeError::Executor(other),
        }
    }
}

impl From<scopefs::registry::RegistryError> for ComputeError {
    fn from(e: scopefs::registry::RegistryError) -> Self {
        ComputeError::Service(ServiceError::Registry(e))
    }
}

/// Limits of compute work, from `[executor]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeSettings {
    pub max_output_bytes: u64,
    pub command_timeout: Duration,
    pub max_runtime_secs: u64,
    pub max_environments_per_scope: u64,
    pub max_process_log_bytes: u64,
    /// `limits.max_concurrent_execs_per_scope`: `execute_command` calls one scope runs at once.
    pub max_concurrent_execs: u64,
    /// `limits.max_live_processes_per_scope`: background processes one scope has running.
    pub max_live_processes: u64,
    /// `limits.max_process_logs_per_scope`: process logs one scope keeps (oldest finished go).
    pub max_process_logs: u64,
    /// `<data_dir>/runtime`: per-scope process logs (never inside a scope's files).
    pub runtime_dir: PathBuf,
    /// The sandbox user (`uid:gid` of `executor.user`): a scope root still owned by root is given
    /// to it before its first container, so commands can write `/workspace`.
    pub sandbox_owner: Option<(u32, u32)>,
}

impl ComputeSettings {
    pub fn from_config(cfg: &Config) -> ComputeSettings {
        let e = &cfg.executor;
        ComputeSettings {
            max_output_bytes: e.max_output_bytes,
            command_timeout: Duration::from_secs(e.command_timeout_secs),
            max_runtime_secs: e.max_runtime_secs,
            max_environments_per_scope: e.max_environments_per_scope,
            max_process_log_bytes: e.max_process_log_bytes,
            max_concurrent_execs: cfg.limits.max_concurrent_execs_per_scope,
            max_live_processes: cfg.limits.max_live_processes_per_scope,
            max_process_logs: cfg.limits.max_process_logs_per_scope,
            runtime_dir: cfg.data_dir.join("runtime"),
            sandbox_owner: policy::parse_user(&e.user),
        }
    }
}

/// The executor and its bookkeeping.
pub struct Compute {
    pub(crate) executor: Arc<dyn Executor>,
    pub(crate) settings: ComputeSettings,
    /// Whether labelled containers have been reconciled with the registry since startup (or since a
    /// container could not be removed).
    reconciled: AtomicBool,
    reconcile_lock: Mutex<()>,
    /// Environments and processes being stopped by the daemon: their watchers record nothing.
    pub(crate) stopping: Mutex<HashSet<String>>,
    /// `execute_command` calls running now, per scope id.
    execs: PerScopeSlots,
    /// Held while a scope's live processes are counted and a new one is registered.
    pub(crate) process_admission: Mutex<()>,
    /// Held while a user's commitments are counted (billing preflight) and an environment is registered.
    pub(crate) environment_admission: Mutex<()>,
}

/// One running `execute_command` of a scope; dropping it frees the slot.
pub(crate) type ExecSlot = ScopeSlot;

impl Compute {
    pub fn new(executor: Arc<dyn Executor>, settings: ComputeSettings) -> Compute {
        let execs = PerScopeSlots::new(settings.max_concurrent_execs, Bound::ConcurrentExecs);
        Compute {
            executor,
            settings,
            reconciled: AtomicBool::new(false),
            reconcile_lock: Mutex::new(()),
            stopping: Mutex::new(HashSet::new()),
            execs,
            process_admission: Mutex::new(()),
            environment_admission: Mutex::new(()),
        }
    }

    /// A slot for one more `execute_command` of `scope`, or `TooMany` (429) when the scope already
    /// runs `max_concurrent_execs` (checked before anything runs).
    pub(crate) fn exec_slot(&self, scope: &str) -> Result<ExecSlot, ComputeError> {
        self.execs
            .try_acquire(scope)
            .ok_or(ComputeError::TooMany("concurrent commands (limits.max_concurrent_execs_per_scope)"))
    }

    pub(crate) fn needs_reconcile(&self) -> bool {
        !self.reconciled.load(Ordering::Acquire)
    }

    pub(crate) fn set_reconciled(&self, done: bool) {
        self.reconciled.store(done, Ordering::Release)
    }

    pub(crate) fn reconcile_guard(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.reconcile_lock.lock()
    }
}

/// Builds the Docker executor of `cfg` and applies the startup policy: in strict mode
/// (`isolation = "required"`) a weak setting, an unreachable engine or a missing image is an error
/// naming the problem; in optional mode weak settings are logged and an unreachable engine only
/// makes the compute tools answer 503.
pub fn build(cfg: &Config, rt: tokio::runtime::Handle) -> anyhow::Result<Compute> {
    let e = &cfg.executor;
    let weak = policy::weaknesses(e);
    let socket = e.docker_socket().ok_or_else(|| anyhow::anyhow!("executor.docker_host must be a Unix socket"))?;
    let docker = docker::DockerExecutor::new(socket, policy::ContainerPolicy::from_config(e), rt);
    match e.isolation {
        Isolation::Required => {
            if !weak.is_empty() {
                anyhow::bail!(
                    "strict isolation (executor.isolation = \"required\") refuses this configuration:\n  - {}",
                    weak.join("\n  - ")
                );
            }
            docker.ping().map_err(|err| {
                anyhow::anyhow!(
                    "strict isolation (executor.isolation = \"required\") needs a reachable Docker engine at \
                     executor.docker_host = {:?}: {err}",
                    e.docker_host
                )
            })?;
            docker.image_present().map_err(|err| {
                anyhow::anyhow!(
                    "strict isolation (executor.isolation = \"required\"): executor.image = {:?} is not usable: {err}",
                    e.image
                )
            })?;
        }
        Isolation::Optional => {
            for w in &weak {
                tracing::warn!(weakness = %w, "sandbox policy is weakened (isolation = \"optional\")");
            }
            if let Err(err) = docker.ping() {
                tracing::warn!(error = %err, "Docker engine not reachable; compute tools answer 503 until it is");
            }
        }
    }
    Ok(Compute::new(Arc::new(docker), ComputeSettings::from_config(cfg)))
}
