//! An in-memory `Executor` for tests: containers are records, commands echo, the engine can be
//! switched off, and containers of an earlier daemon can be planted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};
use scopefs::executor::{
    ContainerInfo, ContainerSpec, ExecOutput, ExecRequest, Executor, ExecutorError, ExitCallback, ProcessExit,
    SpawnRequest, StopCallback,
};

#[derive(Default)]
struct FakeContainer {
    spec: Option<ContainerSpec>,
    running: bool,
    watchers: Vec<StopCallback>,
    processes: HashMap<String, ExitCallback>,
}

/// See the module docs.
#[derive(Default)]
pub struct FakeExecutor {
    down: AtomicBool,
    next: AtomicU64,
    containers: Mutex<HashMap<String, FakeContainer>>,
    /// Every command `exec` ran, in order.
    pub commands: Mutex<Vec<String>>,
    /// While closed, `exec` waits for it to open (tests of concurrency); counts the waiting calls.
    gate: Mutex<Gate>,
    gate_changed: Condvar,
}

#[derive(Default)]
struct Gate {
    closed: bool,
    waiting: usize,
}

impl FakeExecutor {
    /// Makes every call fail as `Unavailable` (or answer again).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst)
    }

    /// Ids of the containers that exist.
    pub fn container_ids(&self) -> Vec<String> {
        self.containers.lock().keys().cloned().collect()
    }

    /// Adds a container as if created by an earlier daemon.
    pub fn adopt(&self, spec: ContainerSpec) -> String {
        let id = format!("fake{}", self.next.fetch_add(1, Ordering::SeqCst));
        self.containers
            .lock()
            .insert(id.clone(), FakeContainer { spec: Some(spec), running: true, ..Default::default() });
        id
    }

    /// Closes (or opens) the gate `exec` waits at.
    pub fn set_gate_closed(&self, closed: bool) {
        self.gate.lock().closed = closed;
        self.gate_changed.notify_all();
    }

    /// Blocks until `n` calls of `exec` wait at the closed gate.
    pub fn wait_for_waiting(&self, n: usize) {
        let mut gate = self.gate.lock();
        while gate.waiting < n {
            self.gate_changed.wait(&mut gate);
        }
    }

    fn pass_gate(&self) {
        let mut gate = self.gate.lock();
        gate.waiting += 1;
        self.gate_changed.notify_all();
        while gate.closed {
            self.gate_changed.wait(&mut gate);
        }
        gate.waiting -= 1;
    }

    fn up(&self) -> Result<(), ExecutorError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ExecutorError::Unavailable("fake engine is down".into()));
        }
        Ok(())
    }
}

impl Executor for FakeExecutor {
    fn ping(&self) -> Result<(), ExecutorError> {
        self.up()
    }

    fn create(&self, spec: &ContainerSpec) -> Result<String, ExecutorError> {
        self.up()?;
        Ok(self.adopt(spec.clone()))
    }

    fn is_running(&self, container_id: &str) -> Result<bool, ExecutorError> {
        self.up()?;
        self.containers.lock().get(container_id).map(|c| c.running).ok_or(ExecutorError::NoSuchContainer)
    }

    fn remove(&self, container_id: &str) -> Result<(), ExecutorError> {
        self.up()?;
        let removed = self.containers.lock().remove(container_id);
        if let Some(c) = removed {
            for (_, p) in c.processes {
                p(ProcessExit { exit_code: Some(137) });
            }
            for w in c.watchers {
                w();
            }
        }
        Ok(())
    }

    fn list(&self, deployment_id: &str) -> Result<Vec<ContainerInfo>, ExecutorError> {
        self.up()?;
        Ok(self
            .containers
            .lock()
            .iter()
            .filter_map(|(id, c)| {
                let spec = c.spec.as_ref()?;
                (spec.deployment_id == deployment_id).then(|| ContainerInfo {
                    container_id: id.clone(),
                    running: c.running,
                    scope_id: Some(spec.scope_id.clone()),
                    owner_id: Some(spec.owner_id.clone()),
                    environment_id: Some(spec.environment_id.clone()),
                })
            })
            .collect())
    }

    fn exec(&self, container_id: &str, req: &ExecRequest) -> Result<ExecOutput, ExecutorError> {
        self.up()?;
        if !self.containers.lock().get(container_id).ok_or(ExecutorError::NoSuchContainer)?.running {
            return Err(ExecutorError::NotRunning);
        }
        self.pass_gate();
        self.commands.lock().push(req.command.clone());
        let mut stdout = req.command.clone().into_bytes();
        let truncated = stdout.len() as u64 > req.max_output_bytes;
        stdout.truncate(usize::try_from(req.max_output_bytes).unwrap_or(usize::MAX));
        Ok(ExecOutput { stdout, stderr: Vec::new(), exit_code: Some(0), truncated, timed_out: false })
    }

    fn spawn(&self, container_id: &str, mut req: SpawnRequest, on_exit: ExitCallback) -> Result<String, ExecutorError> {
        use std::io::Write;
        self.up()?;
        let mut all = self.containers.lock();
        let c = all.get_mut(container_id).ok_or(ExecutorError::NoSuchContainer)?;
        let exec = format!("exec{}", self.next.fetch_add(1, Ordering::SeqCst));
        let _ = req.log.write_all(req.command.as_bytes());
        c.processes.insert(exec.clone(), on_exit);
        Ok(exec)
    }

    fn kill(&self, container_id: &str, exec_id: &str) -> Result<(), ExecutorError> {
        self.up()?;
        let cb = self.containers.lock().get_mut(container_id).and_then(|c| c.processes.remove(exec_id));
        if let Some(cb) = cb {
            cb(ProcessExit { exit_code: Some(137) });
        }
        Ok(())
    }

    fn watch(&self, container_id: &str, on_stop: StopCallback) -> Result<(), ExecutorError> {
        self.up()?;
        let mut all = self.containers.lock();
        let c = all.get_mut(container_id).ok_or(ExecutorError::NoSuchContainer)?;
        c.watchers.push(on_stop);
        Ok(())
    }
}
