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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use scopefs::config::Config;
    use scopefs::engine::{Quota, Storage, StorageSettings};
    use scopefs::executor::ContainerSpec;
    use scopefs::ids::{ScopeId, ThreadId};
    use scopefs::limits::LimitsConfig;
    use scopefs::registry::environments::{EnvironmentState, NewEnvironment};
    use scopefs::registry::Registry;
    use scopefs::store::MemoryStore;
    use scopefs_fs::{MountManager, MountOptions};

    use super::FakeExecutor;
    use crate::executor::{Compute, ComputeError, ComputeSettings};
    use crate::lifecycle::LifecycleSettings;
    use crate::service::ScopeService;

    fn service(tmp: &std::path::Path, rt: &tokio::runtime::Runtime, fake: Arc<FakeExecutor>) -> Arc<ScopeService> {
        service_with(tmp, rt, fake, LimitsConfig::default())
    }

    fn service_with(
        tmp: &std::path::Path,
        rt: &tokio::runtime::Runtime,
        fake: Arc<FakeExecutor>,
        limits: LimitsConfig,
    ) -> Arc<ScopeService> {
        let storage = Storage::new(
            Arc::new(MemoryStore::new()),
            StorageSettings::default(),
            &tmp.join("data"),
            rt.handle().clone(),
        )
        .unwrap();
        let registry = Arc::new(Registry::open_in_memory().unwrap());
        let mounts = MountManager::new(&tmp.join("mnt"), MountOptions::default()).unwrap();
        let cfg = Config { data_dir: tmp.join("data"), limits, ..Config::default() };
        let quota = Quota { bytes: 1 << 20, inodes: 100 };
        let svc = ScopeService::new(
            "d".into(),
            quota,
            registry,
            storage,
            mounts,
            LifecycleSettings::from_config(&cfg),
            rt.handle().clone(),
        )
        .with_compute(Compute::new(fake, ComputeSettings::from_config(&cfg)));
        Arc::new(svc)
    }

    #[test]
    fn startup_reconciliation_ends_live_environments_and_removes_every_container() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fake = Arc::new(FakeExecutor::default());
        let svc = service(tmp.path(), &rt, fake.clone());
        let p = svc.registry.provision("d", "op", &ThreadId::parse("t").unwrap(), None).unwrap();
        let scope = svc.registry.complete_provision("d", &p.scope.scope_id).unwrap().scope_id;
        let new = NewEnvironment {
            user_id: "u".into(),
            thread_id: "t".into(),
            read_only: false,
            requested_max_runtime_seconds: None,
            effective_max_runtime_seconds: 60,
            max_live_per_scope: 4,
        };
        let env = svc.registry.create_environment("d", &scope, &new).unwrap().unwrap();
        let spec = |env_id: &str, dep: &str| ContainerSpec {
            deployment_id: dep.into(),
            scope_id: scope.to_string(),
            owner_id: env.owner_id.clone(),
            environment_id: env_id.into(),
            workspace: tmp.path().into(),
            read_only_workspace: false,
        };
        let known = fake.adopt(spec(&env.environment_id, "d"));
        svc.registry.attach_container("d", &env.environment_id, &known).unwrap();
        svc.registry.environment_started("d", &env.environment_id).unwrap().unwrap();
        let rogue = fake.adopt(spec("env_unknown", "d"));
        let other_deployment = fake.adopt(spec("env_other", "other"));

        fake.set_down(true);
        let report = svc.reconcile_compute_at_startup(&Default::default()).unwrap();
        assert_eq!((report.environments_ended, report.containers_removed), (1, 0));
        let ended = svc.registry.environment("d", &scope, &env.environment_id).unwrap().unwrap();
        assert_eq!((ended.state, ended.end_reason.as_deref()), (EnvironmentState::Ended, Some("daemon_restart")));
        // Nothing is served until the engine answers and the containers are reconciled.
        assert!(matches!(svc.list_environments(&scope), Err(ComputeError::Unavailable(_))));
        fake.set_down(false);
        assert_eq!(svc.list_environments(&scope).unwrap().len(), 1);
        let mut left = fake.container_ids();
        left.sort();
        assert_eq!(left, vec![other_deployment], "known {known} and rogue {rogue} must be gone");
    }

    /// Issue 9: an environment whose scope's mount outlived the daemon is adopted at startup (live,
    /// its container kept); another scope's environment still ends.
    #[test]
    fn startup_reconciliation_adopts_environments_of_resumed_mounts() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fake = Arc::new(FakeExecutor::default());
        let svc = service(tmp.path(), &rt, fake.clone());
        let (kept_scope, kept_env) = scope_with_env(&svc, &fake, "t-kept");
        let (_, ended_env) = scope_with_env(&svc, &fake, "t-ended");
        let resumed = std::collections::HashSet::from([kept_scope.clone()]);
        let report = svc.reconcile_compute_at_startup(&resumed).unwrap();
        assert_eq!((report.environments_ended, report.containers_kept, report.containers_removed), (1, 1, 1));
        let kept = svc.registry.environment("d", &kept_scope, &kept_env).unwrap().unwrap();
        assert!(kept.state.is_live(), "{:?}", kept.state);
        assert_eq!(fake.container_ids(), vec![kept.container_id.clone().unwrap()]);
        let ended = svc.registry.environment_unscoped("d", &ended_env).unwrap().unwrap();
        assert_eq!(ended.end_reason.as_deref(), Some("daemon_restart"));
    }

    /// A draft scope of thread `t` with one running environment (registry rows and a fake
    /// container, no mount).
    fn scope_with_env(svc: &ScopeService, fake: &FakeExecutor, t: &str) -> (ScopeId, String) {
        let p = svc.registry.provision("d", &format!("op-{t}"), &ThreadId::parse(t).unwrap(), None).unwrap();
        let scope = svc.registry.complete_provision("d", &p.scope.scope_id).unwrap().scope_id;
        let new = NewEnvironment {
            user_id: "u".into(),
            thread_id: t.into(),
            read_only: false,
            requested_max_runtime_seconds: None,
            effective_max_runtime_seconds: 60,
            max_live_per_scope: 4,
        };
        let env = svc.registry.create_environment("d", &scope, &new).unwrap().unwrap();
        let container = fake.adopt(ContainerSpec {
            deployment_id: "d".into(),
            scope_id: scope.to_string(),
            owner_id: env.owner_id.clone(),
            environment_id: env.environment_id.clone(),
            workspace: "/nonexistent".into(),
            read_only_workspace: false,
        });
        svc.registry.attach_container("d", &env.environment_id, &container).unwrap();
        svc.registry.environment_started("d", &env.environment_id).unwrap().unwrap();
        (scope, env.environment_id)
    }

    fn refused(label: &str) -> u64 {
        scopefs::limits::refusals().into_iter().find(|(l, _)| *l == label).map(|(_, n)| n).unwrap()
    }

    /// Review M3: a scope runs at most `max_concurrent_execs_per_scope` commands at once; beyond
    /// is 429 before anything runs, other scopes are unaffected, and a finished command frees its slot.
    #[test]
    fn concurrent_commands_are_capped_per_scope() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fake = Arc::new(FakeExecutor::default());
        let limits = LimitsConfig { max_concurrent_execs_per_scope: 2, ..LimitsConfig::default() };
        let svc = service_with(tmp.path(), &rt, fake.clone(), limits);
        let (a, env_a) = scope_with_env(&svc, &fake, "ta");
        let (b, env_b) = scope_with_env(&svc, &fake, "tb");
        fake.set_gate_closed(true);
        let running: Vec<_> = (0..2)
            .map(|i| {
                let (svc, a, env_a) = (svc.clone(), a.clone(), env_a.clone());
                std::thread::spawn(move || svc.execute_command(&a, &env_a, &format!("long {i}"), None, None))
            })
            .collect();
        fake.wait_for_waiting(2);
        let before = refused("concurrent_execs");
        let third = svc.execute_command(&a, &env_a, "one too many", None, None);
        assert!(matches!(third, Err(ComputeError::TooMany(_))), "{:?}", third.map(|o| o.exit_code));
        assert!(refused("concurrent_execs") > before);
        assert!(!fake.commands.lock().iter().any(|c| c == "one too many"), "the refused command ran");
        // Another scope has its own slots.
        let other = std::thread::spawn({
            let (svc, b) = (svc.clone(), b.clone());
            move || svc.execute_command(&b, &env_b, "other scope", None, None)
        });
        fake.wait_for_waiting(3);
        fake.set_gate_closed(false);
        for t in running {
            assert_eq!(t.join().unwrap().unwrap().exit_code, Some(0));
        }
        assert_eq!(other.join().unwrap().unwrap().exit_code, Some(0));
        assert_eq!(svc.execute_command(&a, &env_a, "after", None, None).unwrap().stdout, b"after");
    }

    /// Review M8: live background processes per scope are capped (429), and only the newest
    /// `max_process_logs_per_scope` logs are kept: the oldest finished processes' logs are removed.
    #[test]
    fn live_processes_and_kept_logs_are_capped_per_scope() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fake = Arc::new(FakeExecutor::default());
        let limits =
            LimitsConfig { max_live_processes_per_scope: 1, max_process_logs_per_scope: 2, ..LimitsConfig::default() };
        let svc = service_with(tmp.path(), &rt, fake.clone(), limits);
        let (a, env_a) = scope_with_env(&svc, &fake, "ta");
        let (b, env_b) = scope_with_env(&svc, &fake, "tb");
        let log = |scope: &ScopeId, id: &str| {
            tmp.path().join("data/runtime").join(scope.as_str()).join("processes").join(format!("{id}.log"))
        };
        let first = svc.start_process(&a, Some(&env_a), "first").unwrap();
        let before = refused("live_processes");
        let refused_start = svc.start_process(&a, Some(&env_a), "second while first runs");
        assert!(matches!(refused_start, Err(ComputeError::TooMany(_))), "{:?}", refused_start.map(|p| p.process_id));
        assert!(refused("live_processes") > before);
        assert_eq!(svc.list_processes(&a, None).unwrap().len(), 1, "the refused process was not registered");
        svc.start_process(&b, Some(&env_b), "another scope's own share").unwrap();

        let mut ids = vec![first.process_id];
        for cmd in ["second", "third"] {
            svc.stop_process(&a, ids.last().unwrap()).unwrap();
            ids.push(svc.start_process(&a, Some(&env_a), cmd).unwrap().process_id);
        }
        assert!(!log(&a, &ids[0]).exists(), "the oldest finished log is removed");
        assert!(log(&a, &ids[1]).exists() && log(&a, &ids[2]).exists(), "the two newest logs stay");
        let (_, tail) = svc.check_process(&a, &ids[0], None).unwrap();
        assert_eq!((tail.text.as_str(), tail.log_bytes), ("", 0));
        assert_eq!(svc.check_process(&a, &ids[2], None).unwrap().1.text, "third");
    }
}
