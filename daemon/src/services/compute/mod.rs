//! `ComputeService`: compute work of scopes (SPEC §8) — environments, commands, background
//! processes, stopping a scope's work, startup reconciliation — on the executor (`crate::executor`).
//! Synchronous: call it on blocking threads.
//!
//! Every request is scoped: an environment or process id of another scope is "not found", lists
//! only show the caller's scope, and process logs live under `<data_dir>/runtime/<scope>/processes/`
//! (outside every scope's files) where only this scope's requests read them. Every method first
//! checks that the engine answers — otherwise `ComputeError::Unavailable` (HTTP 503) and nothing
//! runs anywhere, in particular never on the host.
//!
//! Restarts (issues 4, 9, 22): a container bind-mounts the scope's **leaf** mountpoint. A mount
//! kept across a restart or a killed worker keeps its containers working: their environments are
//! adopted, under the runtime they were admitted for (`runtime_limits`). An environment whose
//! mount did not survive is ended at startup with reason `daemon_restart` (runtime recorded up to
//! that moment) and every container carrying the deployment's label that the registry does not run
//! is removed; nothing runs unknown to the registry. A stop that unmounts the scopes ends their
//! environments first (`daemon_stopped`). If the engine cannot be reached at startup (optional
//! mode), the containers are removed as soon as it answers again, before any compute request is
//! served.

mod environments;
mod outputs;
mod processes;
mod runtime_limits;
pub mod shared;

pub use outputs::{content_type, global_artifact, output_path, output_paths, workspace_path, OutputPaths, WORKSPACE};

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use scopefs::config::Config;
use scopefs::executor::{Executor, ExecutorError};
use scopefs::ids::ScopeId;
use scopefs::limits::{Bound, PerScopeSlots, ScopeSlot};
use scopefs::registry::environments::{EnvironmentRecord, ProcessRecord};
use scopefs::registry::DeploymentRegistry;

use super::open_scopes::OpenScopes;
use super::ServiceError;
use crate::executor::policy;

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
    /// The request names something the configuration does not allow (code, text).
    #[error("{1}")]
    Forbidden(&'static str, String),
    /// The environment's outputs exceed a `[limits]` bound (the text names it); nothing was read.
    #[error("{0}")]
    OutputsTooLarge(String),
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
    /// `executor.image`: the only `image_ref` a request may name.
    pub image: String,
    /// `limits.max_artifact_files` / `limits.max_artifact_bytes`: outputs one destroy collects.
    pub max_artifact_files: u64,
    pub max_artifact_bytes: u64,
    /// `limits.max_output_snapshots_per_scope`: snapshots a scope keeps of outputs.
    pub max_output_snapshots_per_scope: u64,
    /// `limits.max_environment_paths`: entries of a request's path lists, views it grants.
    pub max_environment_paths: u64,
    /// `limits.max_input_objects`: entries of a request's `input_objects`.
    pub max_input_objects: u64,
    /// The `[limits]` of shared compute (seed 003 §15).
    pub shared: shared::SharedSettings,
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
            image: e.image.clone(),
            max_artifact_files: cfg.limits.max_artifact_files,
            max_artifact_bytes: cfg.limits.max_artifact_bytes,
            max_output_snapshots_per_scope: cfg.limits.max_output_snapshots_per_scope,
            max_environment_paths: cfg.limits.max_environment_paths,
            max_input_objects: cfg.limits.max_input_objects,
            shared: shared::SharedSettings::from_config(cfg),
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
    /// The per-user pools of warm shared containers.
    pub(crate) shared: Arc<shared::SharedPool>,
}

/// One running `execute_command` of a scope; dropping it frees the slot.
pub(crate) type ExecSlot = ScopeSlot;

impl Compute {
    pub fn new(executor: Arc<dyn Executor>, settings: ComputeSettings) -> Compute {
        let execs = PerScopeSlots::new(settings.max_concurrent_execs, Bound::ConcurrentExecs);
        Compute {
            executor,
            shared: Arc::new(shared::SharedPool::new(settings.shared.clone())),
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

/// Who asks (from the signed `auth_context`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user_id: String,
    pub thread_id: String,
    /// The caller is a memory worker: `/workspace` is bound read-only.
    pub read_only: bool,
}

/// `create_environment` parameters the daemon honours (seed 003 §4.5).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateEnvironment {
    /// The requested max runtime (already the smallest of the request's caps).
    pub max_runtime_seconds: Option<u64>,
    /// `image_ref`: refused (403 `image_not_allowed`) unless it is the configured `executor.image`.
    pub image_ref: Option<String>,
    /// The environment's options, recorded with it.
    pub options: EnvironmentOptions,
    /// Entries of `input_objects` (validated by the caller; counted against
    /// `limits.max_input_objects` here).
    pub input_objects: usize,
    /// What the request says about shared compute (seed 003 §5, §15).
    pub shared: shared::SharedRequest,
    /// Views the request grants the container (`input_objects` mounted at `/threads/{thread_id}`
    /// or `/__global__`): `services::peers`.
    pub views: Vec<crate::services::peers::ViewGrant>,
}

/// What an environment was created with, recorded as JSON (`environments.create_options`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EnvironmentOptions {
    /// Output paths as sent (`/workspace/...`); destroy collects the files under them.
    #[serde(default)]
    pub default_output_paths: Vec<String>,
    /// `limits.max_stdout_stderr_bytes`: caps the output of every command of the environment.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// `limits.max_files` / `limits.max_output_bytes`: the environment's own artifact bounds
    /// (the smaller of these and `limits.max_artifact_files` / `max_artifact_bytes` applies).
    #[serde(default)]
    pub max_artifact_files: Option<u64>,
    #[serde(default)]
    pub max_artifact_bytes: Option<u64>,
    /// The other seed fields as sent (`resource_class`, `backend_policy`, `execution_mode`,
    /// `shared_compute_eligible`, `limits`, `input_objects`, `artifact_prefix`, `budget_snapshot`).
    #[serde(default)]
    pub recorded: serde_json::Value,
    /// The mode of a shared-pool environment ("simple"/"shared"); `None`: a dedicated container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_mode: Option<String>,
    /// When the environment was created (Unix nanoseconds, the engine's clock): its outputs are
    /// the files under its output paths changed since (`None`, environments of older versions:
    /// every file there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_since_ns: Option<i64>,
    /// The user's global store when the container has it read-write: its changed files under
    /// `/__global__` output paths are outputs too (`None`: `/__global__` output paths hold none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_store_scope: Option<String>,
}

/// `destroy_environment` parameters (seed 003 §4.5, §7.5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestroyEnvironment {
    /// Collect the outputs as artifacts (default: yes, when there are output paths).
    pub persist_outputs: Option<bool>,
    /// Output paths of this destroy; default: the environment's `default_output_paths`.
    pub output_paths: Option<Vec<String>>,
    /// Destroy without collecting outputs (they are reported lost); ends the environment even if
    /// the engine cannot remove its container now.
    pub force_destroy: bool,
}

/// What a destroy did.
#[derive(Debug, Clone, PartialEq)]
pub struct Destroyed {
    pub env: EnvironmentRecord,
    /// This call ended the environment (`false`: it had ended before).
    pub ended_now: bool,
    /// The manifest of its outputs (empty when none were asked for).
    pub artifacts: Vec<scopefs::registry::billing::ArtifactEntry>,
    /// `force_destroy` left output files behind uncollected, or they were past the bounds.
    pub artifacts_lost: bool,
    /// The output paths (as given) whose files were not recorded: past the artifact bounds.
    pub outputs_not_recorded: Vec<String>,
}

/// The end of a process log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTail {
    pub text: String,
    /// Size of the whole log in bytes.
    pub log_bytes: u64,
    /// The tail does not start at the beginning of the log.
    pub truncated: bool,
}

/// What reconciliation did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileReport {
    pub environments_ended: usize,
    pub containers_removed: usize,
    pub containers_kept: usize,
}

/// End reasons recorded on environments.
pub mod reason {
    pub const DESTROYED: &str = "destroyed";
    pub const MAX_RUNTIME: &str = "max_runtime";
    pub const EXITED: &str = "container_exited";
    pub const CREATE_FAILED: &str = "create_failed";
    pub const DAEMON_RESTART: &str = "daemon_restart";
    /// The daemon stopped and unmounted the environment's scope.
    pub const DAEMON_STOPPED: &str = "daemon_stopped";
    pub const SCOPE_DELETED: &str = "scope_deleted";
}

/// End reasons recorded on processes.
pub mod process_reason {
    pub const EXITED: &str = "exited";
    pub const LOST: &str = "lost";
    pub const LOG_UNAVAILABLE: &str = "log_unavailable";
    pub const START_FAILED: &str = "start_failed";
}

/// Compute work of one deployment's scopes (see the module docs).
pub struct ComputeService {
    registry: DeploymentRegistry,
    open: Arc<OpenScopes>,
    /// The sandbox executor; `None`: compute tools answer 503.
    compute: Option<Compute>,
    /// Compute preflight (plan, minutes, cash) of environments; none means no billing checks.
    billing: Option<Arc<crate::billing_loop::BillingService>>,
    /// Runs the max-runtime timers.
    rt: tokio::runtime::Handle,
    /// With several nodes: whether a scope's environments are this node's (it serves the scope);
    /// the others' are started, watched and ended by their own node.
    local: std::sync::OnceLock<LocalScopes>,
    /// Takes the snapshots that keep an ended environment's outputs (`outputs.rs`).
    output_snapshots: std::sync::OnceLock<OutputSnapshots>,
}

/// Whether a scope is served by this node (`ComputeService::set_local_scopes`).
pub type LocalScopes = Arc<dyn Fn(&ScopeId) -> bool + Send + Sync>;

/// Takes snapshot `snapshot_id` of a scope (again: the one taken before) and answers the scope
/// that holds it (`services::forks::keep_outputs_in_snapshots`).
pub type OutputSnapshots = Arc<dyn Fn(&ScopeId, &str) -> Result<ScopeId, ServiceError> + Send + Sync>;

impl ComputeService {
    pub fn new(registry: DeploymentRegistry, open: Arc<OpenScopes>, rt: tokio::runtime::Handle) -> ComputeService {
        ComputeService {
            registry,
            open,
            compute: None,
            billing: None,
            rt,
            local: std::sync::OnceLock::new(),
            output_snapshots: std::sync::OnceLock::new(),
        }
    }

    /// Runs environments through `compute`.
    pub fn with_compute(mut self, compute: Compute) -> ComputeService {
        self.compute = Some(compute);
        self
    }

    /// Checks every environment against the user's plan, minutes and cash first.
    pub fn with_billing(mut self, billing: Arc<crate::billing_loop::BillingService>) -> ComputeService {
        self.billing = Some(billing);
        self
    }

    /// Several nodes: only environments of the scopes `local` accepts are this node's to reconcile,
    /// watch for their runtime, end at a stop, and count (set once, at startup).
    pub fn set_local_scopes(&self, local: LocalScopes) {
        let _ = self.local.set(local);
    }

    /// Keeps ended environments' outputs in snapshots taken by `take` (without: artifacts stay
    /// files of their scope, which may change after).
    pub fn set_output_snapshots(&self, take: OutputSnapshots) {
        let _ = self.output_snapshots.set(take);
    }

    /// Whether `scope`'s environments are this node's (always, for a daemon alone).
    pub(crate) fn is_local(&self, scope: &ScopeId) -> bool {
        self.local.get().is_none_or(|f| f(scope))
    }

    /// Live environments of this node's scopes.
    pub fn live_environment_count(&self) -> Result<u64, ComputeError> {
        Ok(self.registry.live_environments()?.iter().filter(|e| self.is_local(&e.scope_id)).count() as u64)
    }

    /// Whether the executor answers (Docker's `/_ping`): the admin page's health.
    pub fn executor_ping(&self) -> Result<(), ComputeError> {
        let compute =
            self.compute.as_ref().ok_or_else(|| ComputeError::Unavailable("no executor is configured".into()))?;
        Ok(compute.executor.ping()?)
    }

    /// The deployment's registry (environment and process rows for permission checks).
    pub fn registry(&self) -> &DeploymentRegistry {
        &self.registry
    }

    /// Mounts a draft or active scope for a container; returns the path it binds.
    fn mount_scope(&self, scope: &ScopeId) -> Result<PathBuf, ComputeError> {
        let rec = self.registry.get(scope)?.ok_or(ServiceError::ScopeNotFound)?;
        if !rec.state.is_mountable() {
            return Err(ServiceError::NotMountable(rec.state).into());
        }
        Ok(self.open.mount(&rec)?)
    }

    /// The executor, once it answers and leftover containers are reconciled.
    fn compute_ready(&self) -> Result<&Compute, ComputeError> {
        let compute =
            self.compute.as_ref().ok_or_else(|| ComputeError::Unavailable("no executor is configured".into()))?;
        compute.executor.ping()?;
        if compute.needs_reconcile() {
            self.reconcile_containers()?;
        }
        Ok(compute)
    }

    /// An environment of `scope`; another scope's id is refused exactly like a missing one.
    fn scoped_env(&self, scope: &ScopeId, env: &str) -> Result<EnvironmentRecord, ComputeError> {
        let found = self.registry.environment(scope, env)?;
        let elsewhere = || Ok(self.registry.environment_unscoped(env)?.is_some());
        own_or_refused(scope, "environment", env, found, elsewhere, ComputeError::EnvironmentNotFound)
    }

    /// A process of `scope`; another scope's id is refused exactly like a missing one.
    fn scoped_process(&self, scope: &ScopeId, process_id: &str) -> Result<ProcessRecord, ComputeError> {
        let found = self.registry.process(scope, process_id)?;
        let elsewhere = || Ok(self.registry.process_unscoped(process_id)?.is_some());
        own_or_refused(scope, "process", process_id, found, elsewhere, ComputeError::ProcessNotFound)
    }

    fn process_log_path(&self, compute: &Compute, scope: &ScopeId, process_id: &str) -> PathBuf {
        compute.settings.runtime_dir.join(scope.as_str()).join("processes").join(format!("{process_id}.log"))
    }
}

/// Creates a process log (directories 0700, file 0600; never reused).
fn open_log(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    std::fs::OpenOptions::new().create_new(true).append(true).mode(0o600).open(path)
}

/// The last `want` bytes of a log (an absent log is empty).
fn read_tail(path: &std::path::Path, want: u64) -> std::io::Result<LogTail> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogTail { text: String::new(), log_bytes: 0, truncated: false })
        }
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(want);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(want).read_to_end(&mut buf)?;
    Ok(LogTail { text: String::from_utf8_lossy(&buf).into_owned(), log_bytes: len, truncated: start > 0 })
}

/// `found` when the id is `scope`'s; otherwise `missing`. An id of another scope gets the same
/// answer as an unknown one, and is counted and logged (ids only) as a cross-scope attempt.
fn own_or_refused<T>(
    scope: &ScopeId,
    kind: &'static str,
    id: &str,
    found: Option<T>,
    elsewhere: impl FnOnce() -> Result<bool, ComputeError>,
    missing: ComputeError,
) -> Result<T, ComputeError> {
    if let Some(rec) = found {
        return Ok(rec);
    }
    if elsewhere()? {
        crate::metrics::note_cross_scope();
        tracing::warn!(scope_id = %scope, kind, id, "refused another scope's id");
    }
    Err(missing)
}
