//! Background processes of `ComputeService`: start (with a per-scope bound and log eviction),
//! check with a log tail, stop, list.

use std::sync::Arc;

use scopefs::executor::{ExecutorError, ProcessExit, SpawnRequest};
use scopefs::ids::ScopeId;
use scopefs::registry::environments::{EnvironmentState, ProcessRecord, ProcessState};

use super::{open_log, process_reason, read_tail, Compute, ComputeError, ComputeService, LogTail};

impl ComputeService {
    /// Starts a detached command in an environment of `scope` (the newest running one when none is
    /// named); its output goes to the scope's runtime area on the host.
    pub fn start_process(
        self: &Arc<Self>,
        scope: &ScopeId,
        env_id: Option<&str>,
        command: &str,
    ) -> Result<ProcessRecord, ComputeError> {
        let compute = self.compute_ready()?;
        if command.is_empty() {
            return Err(ComputeError::Invalid("command", "must not be empty".into()));
        }
        let env_id = match env_id {
            Some(id) => id.to_string(),
            None => self.newest_running(scope)?,
        };
        let (_, container) = self.running_container(scope, &env_id)?;
        let proc = self.admit_process(compute, scope, &env_id, command)?;
        self.evict_process_logs(compute, scope)?;
        let path = self.process_log_path(compute, scope, &proc.process_id);
        let log = match open_log(&path) {
            Ok(f) => f,
            Err(e) => return Err(self.fail_start(&proc, process_reason::LOG_UNAVAILABLE, e.into())),
        };
        let on_exit = self.exit_recorder(&proc.process_id);
        let spawn =
            SpawnRequest { command: command.to_string(), log, max_log_bytes: compute.settings.max_process_log_bytes };
        // Registered before it starts, so a fast exit always finds a `running` row to end.
        match compute.executor.spawn(&container, spawn, on_exit) {
            Ok(exec_id) => {
                let started = self.registry.process_started(&proc.process_id, &exec_id)?;
                let rec = match started {
                    Some(r) => r,
                    None => self.registry.process(scope, &proc.process_id)?.ok_or(ComputeError::ProcessNotFound)?,
                };
                tracing::info!(scope_id = %scope, process_id = %rec.process_id, environment_id = %env_id, "process started");
                Ok(rec)
            }
            Err(e) => Err(self.fail_start(&proc, process_reason::START_FAILED, e.into())),
        }
    }

    /// The newest running environment of `scope`.
    fn newest_running(&self, scope: &ScopeId) -> Result<String, ComputeError> {
        self.registry
            .environments(scope)?
            .into_iter()
            .rev()
            .find(|e| e.state == EnvironmentState::Running)
            .map(|e| e.environment_id)
            .ok_or(ComputeError::EnvironmentNotFound)
    }

    /// Registers a process unless `scope` already runs `max_live_processes` (429, before anything
    /// runs); counting and registering happen under one lock.
    fn admit_process(
        &self,
        compute: &Compute,
        scope: &ScopeId,
        env_id: &str,
        command: &str,
    ) -> Result<ProcessRecord, ComputeError> {
        let _one_at_a_time = compute.process_admission.lock();
        let live = self.registry.processes(scope, None)?.iter().filter(|p| p.state.is_live()).count();
        if live as u64 >= compute.settings.max_live_processes {
            scopefs::limits::refuse(scopefs::limits::Bound::LiveProcesses);
            return Err(ComputeError::TooMany("running processes (limits.max_live_processes_per_scope)"));
        }
        self.registry.create_process(scope, env_id, command)?.ok_or(ComputeError::NotRunning)
    }

    /// Records a process that could not start as failed (`why`) and returns the cause (or the
    /// failure to record it).
    fn fail_start(&self, proc: &ProcessRecord, why: &str, cause: ComputeError) -> ComputeError {
        match self.registry.end_process(&proc.process_id, ProcessState::Failed, None, why) {
            Ok(_) => cause,
            Err(e) => e.into(),
        }
    }

    /// What runs when a process exits: its end is recorded, unless the daemon is stopping it.
    fn exit_recorder(self: &Arc<Self>, process_id: &str) -> Box<dyn FnOnce(ProcessExit) + Send> {
        let svc = self.clone();
        let pid = process_id.to_string();
        Box::new(move |exit: ProcessExit| {
            let Some(compute) = svc.compute.as_ref() else { return };
            if compute.stopping.lock().contains(&pid) {
                return;
            }
            let (state, why) = match exit.exit_code {
                Some(_) => (ProcessState::Exited, process_reason::EXITED),
                None => (ProcessState::Lost, process_reason::LOST),
            };
            if let Err(e) = svc.registry.end_process(&pid, state, exit.exit_code, why) {
                tracing::error!(process_id = %pid, error = %e, "recording a process exit failed");
            }
        })
    }

    /// Keeps at most `max_process_logs` logs of `scope`: beyond, the logs of the oldest finished
    /// processes are removed (a live process keeps its log; `check_process` of an evicted one
    /// answers an empty tail).
    fn evict_process_logs(&self, compute: &Compute, scope: &ScopeId) -> Result<(), ComputeError> {
        let all = self.registry.processes(scope, None)?;
        let excess = (all.len() as u64).saturating_sub(compute.settings.max_process_logs);
        for p in all.iter().filter(|p| !p.state.is_live()).take(usize::try_from(excess).unwrap_or(usize::MAX)) {
            match std::fs::remove_file(self.process_log_path(compute, scope, &p.process_id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// A process of `scope` with the tail of its log (`tail_bytes`, capped by `max_output_bytes`).
    pub fn check_process(
        &self,
        scope: &ScopeId,
        process_id: &str,
        tail_bytes: Option<u64>,
    ) -> Result<(ProcessRecord, LogTail), ComputeError> {
        let compute = self.compute_ready()?;
        let rec = self.scoped_process(scope, process_id)?;
        let want = tail_bytes.unwrap_or(4096).min(compute.settings.max_output_bytes);
        let tail = read_tail(&self.process_log_path(compute, scope, &rec.process_id), want)?;
        Ok((rec, tail))
    }

    /// Kills a process of `scope` (its whole process group) and records it `stopped`; stopping an
    /// ended one returns it unchanged.
    pub fn stop_process(&self, scope: &ScopeId, process_id: &str) -> Result<ProcessRecord, ComputeError> {
        let compute = self.compute_ready()?;
        let rec = self.scoped_process(scope, process_id)?;
        if !rec.state.is_live() {
            return Ok(rec);
        }
        let env = self.scoped_env(scope, &rec.environment_id)?;
        compute.stopping.lock().insert(rec.process_id.clone());
        let killed = match (&env.container_id, &rec.exec_id) {
            (Some(c), Some(exec)) => compute.executor.kill(c, exec),
            _ => Ok(()),
        };
        let result = match killed {
            Ok(()) | Err(ExecutorError::NoSuchContainer) => self
                .registry
                .end_process(&rec.process_id, ProcessState::Stopped, None, "stopped")
                .map(|(r, _)| r)
                .map_err(ComputeError::from),
            Err(e) => Err(e.into()),
        };
        compute.stopping.lock().remove(&rec.process_id);
        result
    }

    /// The processes of `scope` (optionally of one of its environments).
    pub fn list_processes(&self, scope: &ScopeId, env_id: Option<&str>) -> Result<Vec<ProcessRecord>, ComputeError> {
        self.compute_ready()?;
        if let Some(env) = env_id {
            self.scoped_env(scope, env)?;
        }
        Ok(self.registry.processes(scope, env_id)?)
    }
}
