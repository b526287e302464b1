//! The Docker implementation of `Executor` through bollard (blocking wrappers over the daemon's runtime).
//!
//! Containers follow `ContainerPolicy` (see `policy`). Commands run through exec as
//! `/bin/sh -c <command>` in `/workspace`; Docker makes each exec'd process the leader of its own
//! session and process group, so a timeout or `stop_process` kills that whole group with SIGKILL
//! from the host (after checking, through `/proc/<pid>/cgroup`, that the pid still belongs to the
//! container — a reused pid is never signalled). Processes that leave the group on purpose
//! (`setsid`) are killed with their container. The engine is only reached through its Unix socket;
//! a connection failure is `ExecutorError::Unavailable` and the client reconnects on the next call.

use std::collections::HashMap;
use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountBindOptions, MountBindOptionsPropagationEnum, MountType,
    RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use bollard::{ClientVersion, Docker};
use futures_util::StreamExt;
use parking_lot::Mutex;
use scopefs::executor::{
    ContainerInfo, ContainerSpec, ExecOutput, ExecRequest, Executor, ExecutorError, ExitCallback, ProcessExit,
    SpawnRequest, StopCallback, LABEL_DEPLOYMENT, LABEL_ENVIRONMENT, LABEL_OWNER, LABEL_SCOPE,
};
use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;

use super::policy::ContainerPolicy;

/// Timeout of ordinary engine requests (not of attached output streams).
const REQUEST_TIMEOUT_SECS: u64 = 60;
/// After a kill, how long the output stream may take to close.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);
/// The oldest engine API this client speaks (Docker 20.10); newer engines are negotiated down to it.
const API_VERSION: ClientVersion = ClientVersion { major_version: 1, minor_version: 41 };

/// A Docker engine reached through a Unix socket.
pub struct DockerExecutor {
    socket: String,
    policy: ContainerPolicy,
    rt: Handle,
    client: Mutex<Option<Docker>>,
}

fn map_err(e: DockerError) -> ExecutorError {
    match e {
        DockerError::DockerResponseServerError { status_code: 404, .. } => ExecutorError::NoSuchContainer,
        DockerError::DockerResponseServerError { status_code: 409, message } if message.contains("not running") => {
            ExecutorError::NotRunning
        }
        DockerError::DockerResponseServerError { status_code, message } => {
            ExecutorError::Failed(format!("engine answered {status_code}: {message}"))
        }
        DockerError::SocketNotFoundError(_) => ExecutorError::Unavailable("the Docker socket does not exist".into()),
        DockerError::HyperLegacyError { .. }
        | DockerError::IOError { .. }
        | DockerError::RequestTimeoutError
        | DockerError::HyperResponseError { .. }
        | DockerError::HttpClientError { .. } => {
            ExecutorError::Unavailable(format!("the Docker engine does not answer: {e}"))
        }
        other => ExecutorError::Failed(other.to_string()),
    }
}

impl DockerExecutor {
    /// A client for `socket` (path of the engine's Unix socket). Nothing is contacted yet.
    pub fn new(socket: &str, policy: ContainerPolicy, rt: Handle) -> DockerExecutor {
        DockerExecutor { socket: socket.to_string(), policy, rt, client: Mutex::new(None) }
    }

    /// The connected client, connecting (and negotiating the API version) if needed.
    fn client(&self) -> Result<Docker, ExecutorError> {
        if let Some(c) = self.client.lock().as_ref() {
            return Ok(c.clone());
        }
        let docker = Docker::connect_with_unix(&self.socket, REQUEST_TIMEOUT_SECS, &API_VERSION).map_err(map_err)?;
        let docker = self.rt.block_on(docker.negotiate_version()).map_err(map_err)?;
        *self.client.lock() = Some(docker.clone());
        Ok(docker)
    }

    /// Runs `f` with a client; an `Unavailable` outcome drops the cached client.
    fn with<T, F, Fut>(&self, f: F) -> Result<T, ExecutorError>
    where
        F: FnOnce(Docker) -> Fut,
        Fut: std::future::Future<Output = Result<T, ExecutorError>>,
    {
        let docker = self.client()?;
        let out = self.rt.block_on(f(docker));
        if matches!(out, Err(ExecutorError::Unavailable(_))) {
            *self.client.lock() = None;
        }
        out
    }

    /// `Ok` if the configured image exists on the engine (strict mode checks this at startup).
    pub fn image_present(&self) -> Result<(), ExecutorError> {
        let image = self.policy.image.clone();
        self.with(|d| async move {
            match d.inspect_image(&image).await.map_err(map_err) {
                Ok(_) => Ok(()),
                Err(ExecutorError::NoSuchContainer) => {
                    Err(ExecutorError::Failed("the image does not exist on the engine".into()))
                }
                Err(e) => Err(e),
            }
        })
    }

    fn create_body(&self, spec: &ContainerSpec) -> ContainerCreateBody {
        let p = &self.policy;
        let labels = HashMap::from([
            (LABEL_DEPLOYMENT.to_string(), spec.deployment_id.clone()),
            (LABEL_SCOPE.to_string(), spec.scope_id.clone()),
            (LABEL_OWNER.to_string(), spec.owner_id.clone()),
            (LABEL_ENVIRONMENT.to_string(), spec.environment_id.clone()),
        ]);
        let workspace = Mount {
            target: Some("/workspace".into()),
            source: Some(spec.workspace.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(spec.read_only_workspace),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut mounts = vec![workspace];
        mounts.extend(spec.views.iter().map(|v| Mount {
            target: Some(v.target.clone()),
            source: Some(v.source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(v.read_only),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                ..Default::default()
            }),
            ..Default::default()
        }));
        let host = HostConfig {
            mounts: Some(mounts),
            network_mode: Some(p.network.clone()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([("/tmp".to_string(), p.tmpfs_options())])),
            memory: (p.memory_bytes > 0).then_some(p.memory_bytes),
            memory_swap: (p.memory_bytes > 0).then_some(p.memory_bytes),
            nano_cpus: (p.nano_cpus > 0).then_some(p.nano_cpus),
            pids_limit: (p.pids_limit > 0).then_some(p.pids_limit),
            ipc_mode: Some("private".into()),
            privileged: Some(false),
            init: Some(true),
            restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::NO), maximum_retry_count: None }),
            auto_remove: Some(false),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(p.image.clone()),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            entrypoint: Some(vec![]),
            user: Some(p.user.clone()),
            working_dir: Some("/workspace".into()),
            env: Some(vec!["HOME=/tmp".into()]),
            hostname: Some("sandbox".into()),
            labels: Some(labels),
            network_disabled: Some(p.network == "none"),
            attach_stdin: Some(false),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            tty: Some(false),
            open_stdin: Some(false),
            host_config: Some(host),
            ..Default::default()
        }
    }
}

fn exec_options(command: &str) -> CreateExecOptions<String> {
    CreateExecOptions {
        cmd: Some(vec!["/bin/sh".into(), "-c".into(), command.into()]),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        attach_stdin: Some(false),
        tty: Some(false),
        working_dir: Some("/workspace".into()),
        privileged: Some(false),
        ..Default::default()
    }
}

/// SIGKILLs the process group led by host pid `pid` if that pid still belongs to `container_id`.
fn kill_group_in_container(pid: i64, container_id: &str) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    if pid <= 1 {
        return;
    }
    let belongs = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(container_id));
    if !belongs {
        return;
    }
    // SAFETY: plain signal delivery to a process group / process we verified above.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Kills the group of a running exec (nothing if it has ended or is unknown).
async fn kill_exec(docker: &Docker, container_id: &str, exec_id: &str) -> Result<(), ExecutorError> {
    match docker.inspect_exec(exec_id).await {
        Ok(info) => {
            if info.running == Some(true) {
                if let Some(pid) = info.pid {
                    kill_group_in_container(pid, container_id);
                }
            }
            Ok(())
        }
        Err(e) => match map_err(e) {
            ExecutorError::NoSuchContainer => Ok(()),
            other => Err(other),
        },
    }
}

/// The exit code of an exec, waiting up to `wait` for it to finish.
async fn exec_exit_code(docker: &Docker, exec_id: &str, wait: Duration) -> Option<i64> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match docker.inspect_exec(exec_id).await {
            Ok(info) if info.running != Some(true) => return info.exit_code,
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => return None,
        }
    }
}

/// Keeps at most `max` bytes in total across both streams; reports whether anything was dropped.
fn keep(buf: &mut Vec<u8>, other_len: usize, chunk: &[u8], max: u64, truncated: &mut bool) {
    let room = usize::try_from(max).unwrap_or(usize::MAX).saturating_sub(buf.len() + other_len);
    let take = room.min(chunk.len());
    buf.extend_from_slice(&chunk[..take]);
    if take < chunk.len() {
        *truncated = true;
    }
}

impl Executor for DockerExecutor {
    fn ping(&self) -> Result<(), ExecutorError> {
        self.with(|d| async move { d.ping().await.map(|_| ()).map_err(map_err) })
    }

    fn create(&self, spec: &ContainerSpec) -> Result<String, ExecutorError> {
        let body = self.create_body(spec);
        let name = format!("scopefs-{}", spec.environment_id);
        let image = self.policy.image.clone();
        self.with(|d| async move {
            let opts = CreateContainerOptions { name: Some(name), ..Default::default() };
            let created = d.create_container(Some(opts), body).await.map_err(|e| match map_err(e) {
                ExecutorError::NoSuchContainer => {
                    ExecutorError::Unavailable(format!("the sandbox image {image} does not exist on the engine"))
                }
                other => other,
            })?;
            if let Err(e) = d.start_container(&created.id, None).await {
                let remove = RemoveContainerOptions { force: true, ..Default::default() };
                let _ = d.remove_container(&created.id, Some(remove)).await;
                return Err(map_err(e));
            }
            Ok(created.id)
        })
    }

    fn is_running(&self, container_id: &str) -> Result<bool, ExecutorError> {
        let id = container_id.to_string();
        self.with(|d| async move {
            let info = d.inspect_container(&id, None::<InspectContainerOptions>).await.map_err(map_err)?;
            Ok(info.state.and_then(|s| s.running).unwrap_or(false))
        })
    }

    fn remove(&self, container_id: &str) -> Result<(), ExecutorError> {
        let id = container_id.to_string();
        self.with(|d| async move {
            let opts = RemoveContainerOptions { force: true, v: true, ..Default::default() };
            match d.remove_container(&id, Some(opts)).await.map_err(map_err) {
                Ok(()) | Err(ExecutorError::NoSuchContainer) => Ok(()),
                // Removal already in progress.
                Err(ExecutorError::Failed(m)) if m.contains("already in progress") => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn list(&self, deployment_id: &str) -> Result<Vec<ContainerInfo>, ExecutorError> {
        let filter = format!("{LABEL_DEPLOYMENT}={deployment_id}");
        self.with(|d| async move {
            let opts = ListContainersOptions {
                all: true,
                filters: Some(HashMap::from([("label".to_string(), vec![filter])])),
                ..Default::default()
            };
            let list = d.list_containers(Some(opts)).await.map_err(map_err)?;
            Ok(list
                .into_iter()
                .filter_map(|c| {
                    let labels = c.labels.unwrap_or_default();
                    Some(ContainerInfo {
                        container_id: c.id?,
                        running: c.state.is_some_and(|s| s.to_string() == "running"),
                        scope_id: labels.get(LABEL_SCOPE).cloned(),
                        owner_id: labels.get(LABEL_OWNER).cloned(),
                        environment_id: labels.get(LABEL_ENVIRONMENT).cloned(),
                    })
                })
                .collect())
        })
    }

    fn exec(&self, container_id: &str, req: &ExecRequest) -> Result<ExecOutput, ExecutorError> {
        let id = container_id.to_string();
        let req = req.clone();
        self.with(|d| async move {
            let exec = d.create_exec(&id, exec_options(&req.command)).await.map_err(map_err)?;
            let StartExecResults::Attached { mut output, .. } =
                d.start_exec(&exec.id, None::<StartExecOptions>).await.map_err(map_err)?
            else {
                return Err(ExecutorError::Failed("exec did not attach".into()));
            };
            let mut out = ExecOutput::default();
            let mut deadline = tokio::time::Instant::now() + req.timeout;
            loop {
                match tokio::time::timeout_at(deadline, output.next()).await {
                    Ok(Some(Ok(chunk))) => {
                        use bollard::container::LogOutput;
                        match chunk {
                            LogOutput::StdOut { message } | LogOutput::Console { message } => keep(
                                &mut out.stdout,
                                out.stderr.len(),
                                &message,
                                req.max_output_bytes,
                                &mut out.truncated,
                            ),
                            LogOutput::StdErr { message } => keep(
                                &mut out.stderr,
                                out.stdout.len(),
                                &message,
                                req.max_output_bytes,
                                &mut out.truncated,
                            ),
                            LogOutput::StdIn { .. } => {}
                        }
                    }
                    Ok(Some(Err(e))) => {
                        tracing::warn!(error = %e, "exec output stream failed");
                        break;
                    }
                    Ok(None) => break,
                    Err(_) if !out.timed_out => {
                        out.timed_out = true;
                        kill_exec(&d, &id, &exec.id).await?;
                        deadline = tokio::time::Instant::now() + DRAIN_AFTER_KILL;
                    }
                    // Something outside the group still holds the output open: stop reading.
                    Err(_) => break,
                }
            }
            out.exit_code = exec_exit_code(&d, &exec.id, Duration::from_secs(2)).await;
            Ok(out)
        })
    }

    fn spawn(&self, container_id: &str, req: SpawnRequest, on_exit: ExitCallback) -> Result<String, ExecutorError> {
        let id = container_id.to_string();
        let rt = self.rt.clone();
        self.with(|d| async move {
            let exec = d.create_exec(&id, exec_options(&req.command)).await.map_err(map_err)?;
            let StartExecResults::Attached { mut output, .. } =
                d.start_exec(&exec.id, None::<StartExecOptions>).await.map_err(map_err)?
            else {
                return Err(ExecutorError::Failed("exec did not attach".into()));
            };
            let exec_id = exec.id.clone();
            let max = req.max_log_bytes;
            let mut log = tokio::fs::File::from_std(req.log);
            rt.spawn(async move {
                let mut written: u64 = 0;
                let mut dropped = false;
                while let Some(item) = output.next().await {
                    let Ok(chunk) = item else { break };
                    let bytes = chunk.into_bytes();
                    let take = usize::try_from(max.saturating_sub(written)).unwrap_or(usize::MAX).min(bytes.len());
                    if take > 0 && log.write_all(&bytes[..take]).await.is_err() {
                        dropped = true;
                    }
                    written += take as u64;
                    if take < bytes.len() && !dropped {
                        dropped = true;
                        let _ = log.write_all(b"\n[scopefs: log limit reached; further output dropped]\n").await;
                    }
                }
                let _ = log.flush().await;
                let exit_code = exec_exit_code(&d, &exec_id, Duration::from_secs(5)).await;
                let _ = tokio::task::spawn_blocking(move || on_exit(ProcessExit { exit_code })).await;
            });
            Ok(exec.id)
        })
    }

    fn kill(&self, container_id: &str, exec_id: &str) -> Result<(), ExecutorError> {
        let (id, exec) = (container_id.to_string(), exec_id.to_string());
        self.with(|d| async move { kill_exec(&d, &id, &exec).await })
    }

    fn watch(&self, container_id: &str, on_stop: StopCallback) -> Result<(), ExecutorError> {
        let docker = self.client()?;
        let id = container_id.to_string();
        self.rt.spawn(async move {
            loop {
                let mut wait = docker.wait_container(&id, None::<bollard::query_parameters::WaitContainerOptions>);
                let _ = wait.next().await;
                // Whatever ended the wait (exit, error, lost connection): look before concluding.
                match docker.inspect_container(&id, None::<InspectContainerOptions>).await {
                    Ok(info) if info.state.as_ref().and_then(|s| s.running) == Some(true) => {}
                    Ok(_) => break,
                    Err(e) => {
                        if let ExecutorError::NoSuchContainer = map_err(e) {
                            break;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let _ = tokio::task::spawn_blocking(on_stop).await;
        });
        Ok(())
    }
}
