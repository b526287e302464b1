//! The `Executor` trait: sandbox containers bound to one scope, commands in them, detached processes.
//!
//! Core knows nothing of Docker: the daemon implements this trait with bollard
//! (and a fake for tests). The trait is **synchronous** — every method blocks
//! until the engine answered — so callers run it on blocking threads, like the
//! registry and the file engine. Long-lived work (a detached process's log
//! pump, watching a container die) is started by a method and reports back
//! through a callback.
//!
//! Nothing here ever runs a command on the host: an executor that cannot reach
//! its engine answers `ExecutorError::Unavailable`.

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

/// Label keys every sandbox container carries (values: ids only).
pub const LABEL_DEPLOYMENT: &str = "io.scopefs.deployment";
pub const LABEL_SCOPE: &str = "io.scopefs.scope";
pub const LABEL_OWNER: &str = "io.scopefs.owner";
pub const LABEL_ENVIRONMENT: &str = "io.scopefs.environment";

/// Failures of an executor. Messages carry ids and engine messages, never secrets or host paths.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The engine cannot be reached (or the image is missing): compute is unavailable.
    #[error("executor unavailable: {0}")]
    Unavailable(String),
    /// The container does not exist (any more).
    #[error("no such container")]
    NoSuchContainer,
    /// The container exists but is not running.
    #[error("container is not running")]
    NotRunning,
    /// Anything else the engine refused.
    #[error("executor failed: {0}")]
    Failed(String),
}

/// What one environment's container is bound to. The container policy (image, user, limits,
/// network) belongs to the executor's configuration, not to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub deployment_id: String,
    pub scope_id: String,
    pub owner_id: String,
    pub environment_id: String,
    /// The host mountpoint of the scope, bound at `/workspace`.
    pub workspace: PathBuf,
    /// Bind `/workspace` read-only (memory workers).
    pub read_only_workspace: bool,
    /// Views of other scopes of the same user, granted by the request (seed 003 §3.7), each bound
    /// at its target (`/threads/{thread_id}` always read-only, `/__global__` read-write when granted).
    pub views: Vec<ViewMount>,
}

/// One bind of another scope's mountpoint into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewMount {
    /// The host mountpoint of the viewed scope.
    pub source: PathBuf,
    /// Where the container sees it: `/threads/{thread_id}` or `/__global__`.
    pub target: String,
    /// Bound read-only (every `/threads/{id}`; `/__global__` unless granted writable).
    pub read_only: bool,
}

/// A container carrying the deployment's label, as listed by the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub container_id: String,
    pub running: bool,
    pub scope_id: Option<String>,
    pub owner_id: Option<String>,
    pub environment_id: Option<String>,
}

/// One command run to completion (or timeout) inside a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Run as `/bin/sh -c <command>` in `/workspace`.
    pub command: String,
    pub timeout: Duration,
    /// Bytes of stdout+stderr kept (in arrival order); the rest is drained and dropped.
    pub max_output_bytes: u64,
}

/// What a command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq, schemars::JsonSchema)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// `None` when the engine could not tell (e.g. killed and still being reaped).
    pub exit_code: Option<i64>,
    /// Output beyond `max_output_bytes` was dropped.
    pub truncated: bool,
    /// The timeout was reached and the command's process group was killed.
    pub timed_out: bool,
}

/// A detached command whose output goes to a log file on the host.
#[derive(Debug)]
pub struct SpawnRequest {
    pub command: String,
    /// Opened for appending by the caller (outside `/workspace`).
    pub log: File,
    /// Bytes written to `log` at most; the rest is dropped.
    pub max_log_bytes: u64,
}

/// How a detached process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessExit {
    /// `None` when the engine lost track (container gone, engine unreachable).
    pub exit_code: Option<i64>,
}

/// Called once when a detached process has ended.
pub type ExitCallback = Box<dyn FnOnce(ProcessExit) + Send + 'static>;

/// Called once when a watched container has stopped (by itself or killed).
pub type StopCallback = Box<dyn FnOnce() + Send + 'static>;

/// A sandbox engine. Every method blocks; see the module docs.
pub trait Executor: Send + Sync {
    /// `Ok` if the engine answers now.
    fn ping(&self) -> Result<(), ExecutorError>;

    /// Creates and starts the container of one environment; returns its container id. On failure
    /// nothing is left behind.
    fn create(&self, spec: &ContainerSpec) -> Result<String, ExecutorError>;

    /// Whether the container is running; `NoSuchContainer` if it is gone.
    fn is_running(&self, container_id: &str) -> Result<bool, ExecutorError>;

    /// Kills and removes a container (and everything running in it). A missing container is `Ok`.
    fn remove(&self, container_id: &str) -> Result<(), ExecutorError>;

    /// Every container (running or not) labelled with `deployment_id`.
    fn list(&self, deployment_id: &str) -> Result<Vec<ContainerInfo>, ExecutorError>;

    /// Runs a command to completion; on timeout kills its process group and reports `timed_out`.
    fn exec(&self, container_id: &str, req: &ExecRequest) -> Result<ExecOutput, ExecutorError>;

    /// Starts a detached command; returns its exec id. Its output is written to `req.log`;
    /// `on_exit` is called once it has ended.
    fn spawn(&self, container_id: &str, req: SpawnRequest, on_exit: ExitCallback) -> Result<String, ExecutorError>;

    /// Kills a detached command's process group. Already ended is `Ok`.
    fn kill(&self, container_id: &str, exec_id: &str) -> Result<(), ExecutorError>;

    /// Calls `on_stop` once the container has stopped (or cannot be watched any more).
    fn watch(&self, container_id: &str, on_stop: StopCallback) -> Result<(), ExecutorError>;
}
