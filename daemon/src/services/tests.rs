//! Service tests without the kernel: `Scopes`, `WorkspaceFiles` and `ComputeService` over the
//! fake mounter, the fake executor, an in-memory registry with a manual clock and a memory store.

use std::sync::Arc;

use scopefs::clock::ManualClock;
use scopefs::config::{Config, CutoverConfig, CutoverMode};
use scopefs::engine::{EngineError, Quota, Storage, StorageSettings, WriteMode};
use scopefs::executor::ContainerSpec;
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::limits::LimitsConfig;
use scopefs::registry::environments::{EnvironmentState, NewEnvironment};
use scopefs::registry::imports::ImportRequest;
use scopefs::registry::{
    DeleteStep, DeploymentRegistry, NewOwner, OperationState, OwnerState, OwnerType, Registry, RunReserve, ScopeState,
};
use scopefs::store::MemoryStore;

use super::compute::{Compute, ComputeError, ComputeSettings};
use super::files::{api_owner, WorkspaceSettings};
use super::mounter::FakeMounter;
use super::open_scopes::OpenScopes;
use super::{ComputeService, LifecycleSettings, Scopes, ServiceError, Services, WorkspaceFiles};
use crate::executor::fake::FakeExecutor;

mod peers;
mod provisioned;
mod runtime_limits;

/// Everything a service test needs; `tmp` holds the data directory, the fake mounts and the
/// legacy workspace.
struct Harness {
    tmp: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    mounter: Arc<FakeMounter>,
    executor: Arc<FakeExecutor>,
    registry: DeploymentRegistry,
    services: Services,
}

fn harness(limits: LimitsConfig) -> Harness {
    harness_with(limits, StorageSettings::default())
}

fn harness_with(limits: LimitsConfig, settings: StorageSettings) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().to_path_buf();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(MemoryStore::new());
    let storage = Storage::new(store.clone(), settings, &tmp.join("data"), rt.handle().clone()).unwrap();
    let clock = Arc::new(ManualClock::starting_now());
    let registry = Arc::new(Registry::open_for_tests().unwrap().with_clock(clock.clone())).deployment("d");
    let mounter = Arc::new(FakeMounter::new(&tmp.join("mnt")));
    std::fs::create_dir_all(tmp.join("legacy")).unwrap();
    let cfg = Config { data_dir: tmp.join("data"), legacy_root: Some(tmp.join("legacy")), limits, ..Config::default() };
    let open = Arc::new(OpenScopes::new(storage, mounter.clone(), Quota { bytes: 1 << 20, inodes: 100 }));
    let executor = Arc::new(FakeExecutor::default());
    let compute = Arc::new(
        ComputeService::new(registry.clone(), open.clone(), rt.handle().clone())
            .with_compute(Compute::new(executor.clone(), ComputeSettings::from_config(&cfg))),
    );
    let files = Arc::new(WorkspaceFiles::new(registry.clone(), open.clone(), WorkspaceSettings::from_config(&cfg)));
    let scopes = Arc::new(Scopes::new(registry.clone(), open, compute.clone(), LifecycleSettings::from_config(&cfg)));
    crate::services::forks::keep_outputs_in_snapshots(&scopes);
    let services = Services { scopes, files, compute, cluster: None };
    Harness { tmp, _dir: dir, _rt: rt, store, clock, mounter, executor, registry, services }
}

fn thread(t: &str) -> ThreadId {
    ThreadId::parse(t).unwrap()
}

/// Provisioning mounts through the mounter once; the same operation again returns the same scope
/// without a second mount; a mount failure leaves the scope `provisioning` and a later `mount`
/// finishes it.
#[test]
fn provisioning_mounts_once_and_a_failed_mount_is_finished_later() {
    let h = harness(LimitsConfig::default());
    let scopes = &h.services.scopes;
    let (rec, created) = scopes.provision("op-1", &thread("t1")).unwrap();
    assert!(created);
    assert_eq!(rec.state, ScopeState::Draft);
    assert!(h.mounter.is_mounted(&rec.scope_id));
    let (again, created) = scopes.provision("op-1", &thread("t1")).unwrap();
    assert_eq!((again.scope_id.clone(), created), (rec.scope_id.clone(), false));
    assert_eq!(h.mounter.mounts_made(), 1);
    assert_eq!(scopes.open_scopes().counts().mounted, 1);

    h.mounter.fail_next_mounts(1);
    let failed = scopes.provision("op-2", &thread("t2"));
    assert!(matches!(failed, Err(ServiceError::Mount(_))), "{failed:?}");
    let stuck = h.registry.find_by_thread(&thread("t2")).unwrap().unwrap();
    assert_eq!(stuck.state, ScopeState::Provisioning);
    assert!(!h.mounter.is_mounted(&stuck.scope_id));
    let (finished, path) = scopes.mount(&stuck.scope_id).unwrap();
    assert_eq!(finished.state, ScopeState::Draft);
    assert!(h.mounter.is_mounted(&stuck.scope_id));
    assert!(path.is_dir());
    let report = scopes.recover().unwrap();
    assert_eq!((report.mounted, report.failed), (2, 0));
    assert_eq!(h.mounter.mounts_made(), 2, "recovery of mounted scopes mounts nothing again");
}

/// Delete freezes the files, unmounts and closes the engine in one step (the table of open scopes
/// and the mounter agree), and after the retention the purge removes the scope's objects and local
/// data; a second maintenance pass finds nothing more to do.
#[test]
fn delete_unmounts_and_closes_and_the_purge_removes_objects_after_retention() {
    let h = harness(LimitsConfig::default());
    let (scopes, files) = (&h.services.scopes, &h.services.files);
    let (rec, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    let (_, engine) = files.engine_for_thread(&thread("t1")).unwrap();
    let owner = api_owner(&engine).unwrap();
    engine.write_path("notes.txt", &mut &b"kept until the purge"[..], 1 << 20, WriteMode::CreateNew, owner).unwrap();
    engine.sync().unwrap();
    assert!(!h.store.keys().is_empty(), "the file's block reached the store");
    drop(engine);

    let rec = scopes.request_state(&rec.scope_id, rec.revision, ScopeState::Deleting).unwrap();
    assert_eq!(rec.state, ScopeState::Deleted);
    assert!(!h.mounter.is_mounted(&rec.scope_id));
    assert_eq!(scopes.open_scopes().counts(), Default::default());
    assert!(matches!(files.engine_for_thread(&thread("t1")), Err(ServiceError::ScopeNotFound)));

    assert_eq!(scopes.maintenance_pass().unwrap().purged, 0, "not before the retention");
    h.clock.advance_ms(8 * 86_400_000);
    assert_eq!(scopes.maintenance_pass().unwrap().purged, 1);
    let prefix = scopefs::store::scope_prefix(rec.scope_id.as_str());
    assert!(h.store.keys().iter().all(|k| !k.starts_with(&prefix)), "objects left: {:?}", h.store.keys());
    assert_eq!(scopes.maintenance_pass().unwrap(), Default::default());
}

/// A scope whose owners are still live stays `deleting` (read-only) until they settle; expired
/// drafts are deleted by maintenance.
#[test]
fn a_blocked_delete_waits_for_owners_and_drafts_expire() {
    let h = harness(LimitsConfig::default());
    let scopes = &h.services.scopes;
    let (rec, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    let new = run_owner("run-1");
    scopes.create_owner(&rec.scope_id, &new, None).unwrap();
    let rec = h.registry.get(&rec.scope_id).unwrap().unwrap();
    let deleting = scopes.request_state(&rec.scope_id, rec.revision, ScopeState::Deleting).unwrap();
    assert_eq!(deleting.state, ScopeState::Deleting);
    assert!(matches!(scopes.try_finish_delete(&rec.scope_id).unwrap(), DeleteStep::Blocked(_)));
    assert!(h.mounter.is_mounted(&rec.scope_id), "a blocked delete keeps the mount (read-only)");
    let engine = scopes.open_scopes().get(&rec.scope_id).unwrap();
    let refused = engine.make_dirs("new-dir", api_owner(&engine).unwrap());
    assert!(matches!(refused, Err(EngineError::ReadOnly)), "{refused:?}");

    let (draft, _) = scopes.provision("op-2", &thread("t2")).unwrap();
    h.clock.advance_ms(2 * 86_400_000);
    let report = scopes.maintenance_pass().unwrap();
    assert_eq!((report.drafts_expired, report.still_deleting), (1, 1), "{report:?}");
    assert_eq!(h.registry.get(&draft.scope_id).unwrap().unwrap().state, ScopeState::Deleted);
}

/// Workspace files resolve a thread to its open engine: unknown threads and deleted scopes are
/// not found, a deleting one is refused as such; signed requests' nonces are single-use; a legacy
/// import copies once and replays.
#[test]
fn workspace_files_resolve_threads_nonces_and_imports_without_mounting() {
    let h = harness(LimitsConfig::default());
    let (scopes, files) = (&h.services.scopes, &h.services.files);
    assert!(matches!(files.engine_for_thread(&thread("nobody")), Err(ServiceError::ScopeNotFound)));
    let (rec, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    let (found, engine) = files.engine_for_thread(&thread("t1")).unwrap();
    assert_eq!(found.scope_id, rec.scope_id);
    let (binding, same) = files.tool_scope(&thread("t1"), "u1").unwrap();
    assert_eq!(binding.scope.scope_id, rec.scope_id);
    assert!(Arc::ptr_eq(&engine, &same), "one open engine per scope");

    let expires = files.now_ms() + 60_000;
    assert!(files.consume_nonce("nonce-1", expires).unwrap());
    assert!(!files.consume_nonce("nonce-1", expires).unwrap(), "a nonce is single-use");

    std::fs::write(h.tmp.join("legacy/report.txt"), b"legacy bytes").unwrap();
    let req = ImportRequest {
        idempotency_key: "imp-1".into(),
        source_path: "report.txt".into(),
        target_path: "imported/report.txt".into(),
        overwrite: false,
    };
    let first = files.import_legacy(&thread("t1"), req.clone()).unwrap();
    assert!(!first.replayed);
    assert_eq!(engine.read_path("imported/report.txt", 0, 100).unwrap(), b"legacy bytes");
    let again = files.import_legacy(&thread("t1"), req).unwrap();
    assert!(again.replayed);
    assert_eq!(again.record.sha256, first.record.sha256);

    let rec = h.registry.get(&rec.scope_id).unwrap().unwrap();
    let new = run_owner("run-2");
    scopes.create_owner(&rec.scope_id, &new, None).unwrap();
    let rec = h.registry.get(&rec.scope_id).unwrap().unwrap();
    scopes.request_state(&rec.scope_id, rec.revision, ScopeState::Deleting).unwrap();
    let deleting = files.engine_for_thread(&thread("t1")).map(|(rec, _)| rec);
    assert!(matches!(deleting, Err(ServiceError::NotMountable(ScopeState::Deleting))), "{deleting:?}");
}

/// A live owner of another kind than the primary thread (it blocks a delete until it settles).
fn run_owner(resource: &str) -> scopefs::registry::NewOwner {
    scopefs::registry::NewOwner {
        owner_type: scopefs::registry::OwnerType::Run,
        resource_id: Some(resource.into()),
        parent_owner_id: None,
    }
}

#[test]
fn startup_reconciliation_ends_live_environments_and_removes_every_container() {
    let h = harness(LimitsConfig::default());
    let (svc, fake, tmp) = (&h.services.compute, &h.executor, &h.tmp);
    let p = svc.registry().provision("op", &ThreadId::parse("t").unwrap(), None).unwrap();
    let scope = svc.registry().complete_provision(&p.scope.scope_id).unwrap().scope_id;
    let new = NewEnvironment {
        user_id: "u".into(),
        thread_id: "t".into(),
        read_only: false,
        requested_max_runtime_seconds: None,
        effective_max_runtime_seconds: 60,
        max_live_per_scope: 4,
        pricing_snapshot: None,
    };
    let env = svc.registry().create_environment(&scope, &new).unwrap().unwrap();
    let spec = |env_id: &str, dep: &str| ContainerSpec {
        deployment_id: dep.into(),
        scope_id: scope.to_string(),
        owner_id: env.owner_id.clone(),
        environment_id: env_id.into(),
        workspace: tmp.clone(),
        read_only_workspace: false,
        views: Vec::new(),
    };
    let known = fake.adopt(spec(&env.environment_id, "d"));
    svc.registry().attach_container(&env.environment_id, &known).unwrap();
    svc.registry().environment_started(&env.environment_id).unwrap().unwrap();
    let rogue = fake.adopt(spec("env_unknown", "d"));
    let other_deployment = fake.adopt(spec("env_other", "other"));

    fake.set_down(true);
    let report = svc.reconcile_compute_at_startup(&Default::default()).unwrap();
    assert_eq!((report.environments_ended, report.containers_removed), (1, 0));
    let ended = svc.registry().environment(&scope, &env.environment_id).unwrap().unwrap();
    assert_eq!((ended.state, ended.end_reason.as_deref()), (EnvironmentState::Ended, Some("daemon_restart")));
    // Nothing is served until the engine answers and the containers are reconciled.
    assert!(matches!(svc.list_environments(&scope), Err(ComputeError::Unavailable(_))));
    fake.set_down(false);
    assert_eq!(svc.list_environments(&scope).unwrap().len(), 1);
    let mut left = fake.container_ids();
    left.sort();
    assert_eq!(left, vec![other_deployment], "known {known} and rogue {rogue} must be gone");
}

/// A draft scope of thread `t` with one running environment (registry rows and a fake
/// container, no mount).
fn scope_with_env(svc: &ComputeService, fake: &FakeExecutor, t: &str) -> (ScopeId, String) {
    let p = svc.registry().provision(&format!("op-{t}"), &ThreadId::parse(t).unwrap(), None).unwrap();
    let scope = svc.registry().complete_provision(&p.scope.scope_id).unwrap().scope_id;
    let env = env_in(svc, fake, &scope, t);
    (scope, env)
}

/// A running environment of thread `t` in `scope`, on a container `fake` adopted.
fn env_in(svc: &ComputeService, fake: &FakeExecutor, scope: &ScopeId, t: &str) -> String {
    let new = NewEnvironment {
        user_id: "u".into(),
        thread_id: t.into(),
        read_only: false,
        requested_max_runtime_seconds: None,
        effective_max_runtime_seconds: 60,
        max_live_per_scope: 4,
        pricing_snapshot: None,
    };
    let env = svc.registry().create_environment(scope, &new).unwrap().unwrap();
    let container = fake.adopt(ContainerSpec {
        deployment_id: "d".into(),
        scope_id: scope.to_string(),
        owner_id: env.owner_id.clone(),
        environment_id: env.environment_id.clone(),
        workspace: "/nonexistent".into(),
        read_only_workspace: false,
        views: Vec::new(),
    });
    svc.registry().attach_container(&env.environment_id, &container).unwrap();
    svc.registry().environment_started(&env.environment_id).unwrap().unwrap();
    env.environment_id
}

fn refused(label: &str) -> u64 {
    scopefs::limits::refusals().into_iter().find(|(l, _)| *l == label).map(|(_, n)| n).unwrap()
}

/// Review M3: a scope runs at most `max_concurrent_execs_per_scope` commands at once; beyond
/// is 429 before anything runs, other scopes are unaffected, and a finished command frees its slot.
#[test]
fn concurrent_commands_are_capped_per_scope() {
    let limits = LimitsConfig { max_concurrent_execs_per_scope: 2, ..LimitsConfig::default() };
    let h = harness(limits);
    let (svc, fake) = (&h.services.compute, &h.executor);
    let (a, env_a) = scope_with_env(svc, fake, "ta");
    let (b, env_b) = scope_with_env(svc, fake, "tb");
    fake.set_gate_closed(true);
    let running: Vec<_> = (0..2)
        .map(|i| {
            let (svc, a, env_a) = (Arc::clone(svc), a.clone(), env_a.clone());
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
        let (svc, b) = (Arc::clone(svc), b.clone());
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
    let limits =
        LimitsConfig { max_live_processes_per_scope: 1, max_process_logs_per_scope: 2, ..LimitsConfig::default() };
    let h = harness(limits);
    let (svc, fake, tmp) = (&h.services.compute, &h.executor, &h.tmp);
    let (a, env_a) = scope_with_env(svc, fake, "ta");
    let (b, env_b) = scope_with_env(svc, fake, "tb");
    let log = |scope: &ScopeId, id: &str| {
        tmp.join("data/runtime").join(scope.as_str()).join("processes").join(format!("{id}.log"))
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

const DAY_MS: i64 = 86_400_000;

/// Seed 000 §5.3, provisioning: a crash after the record is resumed by recovery (mounted, draft);
/// a provisioning that keeps failing is retried until the draft TTL, then compensated (mount and
/// local data removed, scope `deleted`); a crash between `compensating` and `compensated` is
/// finished by the next recovery.
#[test]
fn provisioning_is_resumed_or_compensated_by_recovery() {
    let h = harness(LimitsConfig::default());
    let scopes = &h.services.scopes;
    let storage = scopes.open_scopes().storage().clone();
    let resumed = h.registry.provision("op-crash", &thread("t0"), None).unwrap().scope;
    let report = scopes.recover().unwrap();
    assert_eq!(h.registry.get(&resumed.scope_id).unwrap().unwrap().state, ScopeState::Draft);
    assert!(h.mounter.is_mounted(&resumed.scope_id));
    assert_eq!(report.failed, 0);

    h.mounter.fail_next_mounts(2);
    assert!(matches!(scopes.provision("op-1", &thread("t1")), Err(ServiceError::Mount(_))));
    let stuck = h.registry.find_by_thread(&thread("t1")).unwrap().unwrap();
    let ops = scopes.recover_operations().unwrap();
    assert_eq!((ops.failed, ops.compensated), (1, 0), "retried before the TTL: {ops:?}");
    h.clock.advance_ms(DAY_MS + 1);
    let ops = scopes.recover_operations().unwrap();
    assert_eq!(ops.compensated, 1, "{ops:?}");
    let gone = h.registry.get(&stuck.scope_id).unwrap().unwrap();
    assert_eq!(gone.state, ScopeState::Deleted);
    assert!(!h.mounter.is_mounted(&stuck.scope_id));
    assert!(!storage.has_local_metadata(&stuck.scope_id), "the partial local data is removed");
    let op = h.registry.operation("op-1").unwrap().unwrap();
    assert_eq!((op.state, op.last_error_code.as_deref()), (OperationState::Compensated, Some("provision_expired")));

    // Crash after `compensating` was recorded: the next recovery undoes and ends it.
    let half = h.registry.provision("op-2", &thread("t2"), None).unwrap().scope;
    h.registry.begin_compensation("op-2", "operator_abort").unwrap();
    assert_eq!(scopes.recover_operations().unwrap().compensated, 1);
    assert_eq!(h.registry.get(&half.scope_id).unwrap().unwrap().state, ScopeState::Deleted);
    assert!(h.registry.open_operations().unwrap().is_empty());
}

/// A delete interrupted after `deleting` was recorded is finished by recovery; a run reservation
/// and a cron registered in a scope being deleted are compensated (run cancelled, owners
/// terminal), which lets the delete finish in the same maintenance pass.
#[test]
fn deletes_resume_and_runs_and_crons_of_a_deleted_scope_are_compensated() {
    let h = harness(LimitsConfig::default());
    let scopes = &h.services.scopes;
    let (crashed, _) = scopes.provision("op-0", &thread("t0")).unwrap();
    h.registry.begin_delete(&crashed.scope_id, crashed.revision).unwrap();
    scopes.recover().unwrap();
    assert_eq!(h.registry.get(&crashed.scope_id).unwrap().unwrap().state, ScopeState::Deleted);
    assert!(!h.mounter.is_mounted(&crashed.scope_id));

    let (rec, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    let req = RunReserve {
        run_request_id: "r1".into(),
        turn_id: "turn".into(),
        interrupt_key: None,
        request_hash: "h".into(),
    };
    let reserved = scopes.reserve_run(&rec.scope_id, &req).unwrap();
    let cron = NewOwner { owner_type: OwnerType::Cron, resource_id: Some("cron-1".into()), parent_owner_id: None };
    let (cron_owner, _) = scopes.create_owner(&rec.scope_id, &cron, None).unwrap();
    assert_eq!(scopes.maintenance_pass().unwrap().compensated, 0, "open scope: the caller drives them");
    let rec = h.registry.get(&rec.scope_id).unwrap().unwrap();
    let deleting = scopes.request_state(&rec.scope_id, rec.revision, ScopeState::Deleting).unwrap();
    assert_eq!(deleting.state, ScopeState::Deleting, "blocked by the run and the cron");

    let report = scopes.maintenance_pass().unwrap();
    assert_eq!((report.compensated, report.deleted), (2, 1), "{report:?}");
    assert_eq!(h.registry.get(&rec.scope_id).unwrap().unwrap().state, ScopeState::Deleted);
    let run = h.registry.run_request(&rec.scope_id, "r1").unwrap();
    assert_eq!(run.state, scopefs::registry::RunRequestState::Cancelled);
    for owner in [&reserved.run.run_owner_id, &cron_owner.owner_id] {
        assert_eq!(h.registry.owner(&rec.scope_id, owner).unwrap().state, OwnerState::Terminal);
    }
    let run_op = h.registry.operation(&scopefs::registry::run_operation_id(&rec.scope_id, "r1")).unwrap();
    assert_eq!(run_op.unwrap().state, OperationState::Compensated);
    assert_eq!(h.registry.operation("cron:cron-1").unwrap().unwrap().state, OperationState::Compensated);
    assert!(h.registry.open_operations().unwrap().is_empty());
}

/// Seed 000 §11.1: in cutover mode `required` a thread without a scope is refused
/// (`MigrationRequired`, 409 `migration-required`) until the report is passed, for this deployment
/// and recorded with its SHA-256; a changed report closes the gate again; known threads pass.
#[test]
fn the_required_cutover_gate_opens_only_for_a_verified_report() {
    let h = harness(LimitsConfig::default());
    let report = h.tmp.join("latest.json");
    let cfg = Config {
        deployment_id: "d".into(),
        cutover: CutoverConfig { mode: CutoverMode::Required, report: Some(report.clone()) },
        ..Config::default()
    };
    let s = &h.services.scopes;
    let gated = Scopes::new(h.registry.clone(), s.open.clone(), s.compute.clone(), s.lifecycle)
        .with_cutover(super::CutoverGate::from_config(&cfg));
    let refused = gated.provision("op-1", &thread("t1"));
    assert!(matches!(refused, Err(ServiceError::MigrationRequired)), "{refused:?}");
    let startup = gated.verify_cutover_at_startup().unwrap_err();
    assert!(startup.contains("no report") || startup.contains("cannot be read"), "{startup}");

    let gates = r#""counts":{"threads":1,"scopes":1,"primary_owners":1},"unhandled_legacy_owners":0,"inconsistencies":0,"static_gate":"passed""#;
    let write = |deployment: &str, status: &str| {
        let body = format!(r#"{{"operation_id":"cut-1","deployment_id":"{deployment}","status":"{status}",{gates}}}"#);
        std::fs::write(&report, body).unwrap();
    };
    write("d", "failed");
    assert!(matches!(gated.record_cutover_report(), Err(ServiceError::MigrationRequired)));
    write("other", "passed");
    assert!(matches!(gated.record_cutover_report(), Err(ServiceError::MigrationRequired)));
    write("d", "passed");
    assert!(matches!(gated.provision("op-1", &thread("t1")), Err(ServiceError::MigrationRequired)), "not recorded");
    assert!(gated.verify_cutover_at_startup().is_err(), "passed, but not recorded");
    let op = gated.record_cutover_report().unwrap();
    assert_eq!((op.operation_id.as_str(), op.scope_id), ("cut-1", None));
    assert_eq!(gated.verify_cutover_at_startup(), Ok(()));
    let (rec, created) = gated.provision("op-1", &thread("t1")).unwrap();
    assert!(created && rec.state == ScopeState::Draft);
    let missed = gated.provision_as("op-m", &thread("t-old"), super::ProvisionBy::default());
    assert!(matches!(missed, Err(ServiceError::MigrationRequired)), "not new: missed by the cutover");

    std::fs::write(
        &report,
        format!(r#"{{"operation_id":"cut-1","deployment_id":"d","status":"passed",{gates},"x":1}}"#),
    )
    .unwrap();
    assert!(matches!(gated.provision("op-2", &thread("t2")), Err(ServiceError::MigrationRequired)), "hash changed");
    assert_eq!(gated.provision("op-1", &thread("t1")).unwrap().0.scope_id, rec.scope_id, "known thread");
    assert!(gated.verify_cutover_at_startup().is_err(), "a changed report stops the next start too");
    assert!(h.services.scopes.provision("op-3", &thread("t3")).is_ok(), "mode off by default");
    assert_eq!(h.services.scopes.verify_cutover_at_startup(), Ok(()), "mode off: nothing to verify");
}

/// Seed 000 §11.1: the maintenance pass shares the `maintenance` lease: while an operator holds
/// it the pass does no registry work (counted as skipped); otherwise it takes and releases it.
#[test]
fn the_maintenance_pass_takes_the_lease_and_skips_while_an_operator_or_the_cutover_holds_one() {
    let h = harness(LimitsConfig::default());
    let scopes = &h.services.scopes;
    let (draft, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    h.clock.advance_ms(2 * DAY_MS);
    h.registry.acquire_lease("maintenance", "operator-run", 60_000).unwrap();
    let skipped_before = crate::metrics::consistency_counters().2;
    let report = scopes.maintenance_pass().unwrap();
    assert!(report.skipped && report.drafts_expired == 0, "{report:?}");
    assert!(crate::metrics::consistency_counters().2 > skipped_before);
    assert_eq!(h.registry.get(&draft.scope_id).unwrap().unwrap().state, ScopeState::Draft);

    h.registry.release_lease("maintenance", "operator-run").unwrap();
    // Issue 24, item 3: nothing expires while the cutover holds its lease either.
    h.registry.acquire_lease("workspace-cutover", "cut-1", 60_000).unwrap();
    assert!(scopes.maintenance_pass().unwrap().skipped, "a cutover in progress");
    assert_eq!(h.registry.get(&draft.scope_id).unwrap().unwrap().state, ScopeState::Draft);
    h.registry.release_lease("workspace-cutover", "cut-1").unwrap();
    let report = scopes.maintenance_pass().unwrap();
    assert!(!report.skipped && report.drafts_expired == 1, "{report:?}");
    assert!(h.registry.lease("maintenance").unwrap().is_none(), "released after the pass");
    // A lease the daemon's previous process left behind is taken back, not waited for.
    h.registry.acquire_lease("maintenance", super::lifecycle::MAINTENANCE_HOLDER, 60_000).unwrap();
    scopes.provision("op-2", &thread("t2")).unwrap_err();
    h.registry.release_lease("maintenance", super::lifecycle::MAINTENANCE_HOLDER).unwrap();
    let (late, _) = scopes.provision("op-2", &thread("t2")).unwrap();
    h.clock.advance_ms(2 * DAY_MS);
    h.registry.acquire_lease("maintenance", super::lifecycle::MAINTENANCE_HOLDER, 60_000).unwrap();
    assert_eq!(scopes.maintenance_pass().unwrap().drafts_expired, 1);
    assert_eq!(h.registry.get(&late.scope_id).unwrap().unwrap().state, ScopeState::Deleted);
}

/// Seed 000 §17: tool requests of a thread without a scope, scopes whose local metadata is
/// missing and local directories of no registry scope are counted and reach `/metrics`; the
/// orphan directory is left in place.
#[test]
fn runs_without_scope_metadata_mismatches_and_orphan_directories_are_measured() {
    let h = harness(LimitsConfig::default());
    let (scopes, files) = (&h.services.scopes, &h.services.files);
    let (before_runs, before_mismatch, _) = crate::metrics::consistency_counters();
    assert!(matches!(files.tool_scope(&thread("nobody"), "u1"), Err(ServiceError::ScopeNotFound)));
    assert!(crate::metrics::consistency_counters().0 > before_runs);

    assert_eq!(scopes.maintenance_pass().unwrap(), Default::default());
    let orphan = h.tmp.join("data/scopes").join(ScopeId::generate().as_str());
    std::fs::create_dir_all(&orphan).unwrap();
    let (rec, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    scopes.open_scopes().close(&rec.scope_id).unwrap();
    std::fs::remove_dir_all(h.tmp.join("data/scopes").join(rec.scope_id.as_str())).unwrap();
    let report = scopes.maintenance_pass().unwrap();
    assert_eq!((report.orphan_directories, report.metadata_mismatches), (1, 1), "{report:?}");
    assert!(report.is_quiet(), "a scan alone changes nothing");
    assert!(orphan.is_dir(), "orphans are reported, not deleted");
    let after_mismatch = crate::metrics::consistency_counters().1;
    assert!(after_mismatch > before_mismatch);
    scopes.maintenance_pass().unwrap();
    assert_eq!(crate::metrics::consistency_counters().1, after_mismatch, "a scope counts once");

    let storage = scopes.open_scopes().storage();
    let text = crate::metrics::render(&h.registry, &[], storage).unwrap();
    for family in [
        "scopefs_runs_without_scope_total",
        "scopefs_metadata_mismatch_total",
        "scopefs_orphan_directories",
        "scopefs_maintenance_skipped_total",
    ] {
        assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing from /metrics");
    }
}

/// Shared compute (seed 003 §15) over the fake executor: eligible environments of a user share warm
/// containers of that user and scope (cleaned at release, reused at the next create), another
/// user never gets them, a third live shared environment of a user is 429 before any container is
/// made, ineligible ones get dedicated containers removed at destroy, idle ones are reaped.
#[test]
fn shared_environments_reuse_their_users_warm_containers() {
    use super::compute::shared::SharedRequest;
    use super::compute::{Caller, CreateEnvironment, DestroyEnvironment};
    let h = harness(LimitsConfig { max_shared_environments_per_user: 2, ..LimitsConfig::default() });
    let (svc, fake) = (&h.services.compute, &h.executor);
    let scope_of = |t: &str| h.services.scopes.provision(&format!("op-{t}"), &thread(t)).unwrap().0.scope_id;
    let (sa, sb) = (scope_of("ta"), scope_of("tb"));
    let caller = |u: &str, t: &str| Caller { user_id: u.into(), thread_id: t.into(), read_only: false };
    let shared = CreateEnvironment {
        max_runtime_seconds: Some(30),
        shared: SharedRequest { asked: Some("simple"), ..SharedRequest::default() },
        ..CreateEnvironment::default()
    };
    let container = |env: &str| svc.registry().environment_unscoped(env).unwrap().unwrap().container_id.unwrap();
    let destroy = |scope: &ScopeId, env: &str| svc.destroy_environment(scope, env, &DestroyEnvironment::default());

    let e1 = svc.create_environment(&sa, &caller("u1", "ta"), &shared).unwrap().environment_id;
    assert_eq!(svc.execution_of(&e1).mode, "simple");
    let c1 = container(&e1);
    let e2 = svc.create_environment(&sa, &caller("u1", "ta"), &shared).unwrap().environment_id;
    assert_ne!(container(&e2), c1, "one environment per container at a time");
    let made = fake.container_ids().len();
    let third = svc.create_environment(&sa, &caller("u1", "ta"), &shared);
    assert!(matches!(third, Err(ComputeError::TooMany(_))), "{third:?}");
    assert_eq!(fake.container_ids().len(), made, "the refused environment made no container");
    let dedicated = svc.create_environment(&sa, &caller("u1", "ta"), &CreateEnvironment::default()).unwrap();
    assert_eq!(svc.execution_of(&dedicated.environment_id).mode, "standard");

    destroy(&sa, &e1).unwrap();
    assert!(fake.container_ids().contains(&c1), "a destroyed shared environment's container stays warm");
    assert!(fake.commands.lock().iter().any(|c| c.contains("kill -9")), "it was cleaned at release");
    let other_user = svc.create_environment(&sb, &caller("u2", "tb"), &shared).unwrap().environment_id;
    assert_ne!(container(&other_user), c1, "another user never gets it");
    let e3 = svc.create_environment(&sa, &caller("u1", "ta"), &shared).unwrap().environment_id;
    assert_eq!(container(&e3), c1, "the same user and scope reuse it");

    let dc = container(&dedicated.environment_id);
    destroy(&sa, &dedicated.environment_id).unwrap();
    assert!(!fake.container_ids().contains(&dc), "a dedicated container is removed at destroy");
    for (scope, env) in [(&sa, &e2), (&sa, &e3), (&sb, &other_user)] {
        destroy(scope, env).unwrap();
    }
    assert_eq!(svc.reap_shared(std::time::Instant::now()), 0, "not idle long enough yet");
    let later = std::time::Instant::now() + std::time::Duration::from_secs(LimitsConfig::default().shared_idle_secs);
    assert_eq!(svc.reap_shared(later), 3);
    assert!(fake.container_ids().is_empty(), "{:?}", fake.container_ids());
}

/// `limits.max_input_objects` bounds `input_objects`, `limits.max_environment_paths` the views they
/// grant and `default_output_paths`: one entry over is refused (`Invalid` naming the field: 400
/// `invalid_request`) before any row or container exists; at the bounds the environment is created.
#[test]
fn environment_path_lists_are_bounded() {
    use super::compute::{Caller, CreateEnvironment, EnvironmentOptions};
    use crate::services::peers::{View, ViewGrant};
    let limits = LimitsConfig { max_environment_paths: 2, max_input_objects: 3, ..LimitsConfig::default() };
    let h = harness(limits);
    let svc = &h.services.compute;
    let scope = h.services.scopes.provision("op-tp", &thread("tp")).unwrap().0.scope_id;
    let caller = Caller { user_id: "u".into(), thread_id: "tp".into(), read_only: false };
    let req = |inputs: usize, views: usize, outputs: usize| CreateEnvironment {
        input_objects: inputs,
        views: (0..views)
            .map(|i| ViewGrant { view: View::Thread(thread(&format!("tv{i}"))), writable: false })
            .collect(),
        options: EnvironmentOptions {
            default_output_paths: (0..outputs).map(|i| format!("/workspace/out{i}")).collect(),
            ..EnvironmentOptions::default()
        },
        ..CreateEnvironment::default()
    };
    let (paths, inputs) = (refused("environment_paths"), refused("input_objects"));
    for (over, field) in
        [(req(4, 0, 0), "input_objects"), (req(3, 3, 0), "input_objects"), (req(0, 0, 3), "default_output_paths")]
    {
        let got = svc.create_environment(&scope, &caller, &over);
        assert!(matches!(got, Err(ComputeError::Invalid(f, _)) if f == field), "{field}: {got:?}");
    }
    assert_eq!((refused("environment_paths"), refused("input_objects")), (paths + 2, inputs + 1));
    assert!(h.registry.environments(&scope).unwrap().is_empty() && h.executor.container_ids().is_empty());
    let env = svc.create_environment(&scope, &caller, &req(3, 0, 2)).unwrap();
    assert_eq!((h.registry.environments(&scope).unwrap().len(), h.executor.container_ids().len()), (1, 1), "{env:?}");
}

/// A maintenance pass leaves alone an operation a request may be driving right now (so normal
/// traffic never makes it take the `maintenance` lease, which refuses creates with 503), and
/// finishes it once it has been left over.
#[test]
fn maintenance_leaves_in_flight_operations_to_their_request() {
    let h = harness(LimitsConfig::default());
    let scopes = &h.services.scopes;
    let p = h.registry.provision("op-inflight", &thread("t-inflight"), None).unwrap();
    assert_eq!(p.scope.state, ScopeState::Provisioning);
    let report = scopes.maintenance_pass().unwrap();
    assert!(!report.skipped, "{report:?}");
    let rec = h.registry.get(&p.scope.scope_id).unwrap().unwrap();
    assert_eq!(rec.state, ScopeState::Provisioning, "a fresh operation is its request's to finish");
    assert!(!h.mounter.is_mounted(&p.scope.scope_id));
    assert!(h.registry.lease("maintenance").unwrap().is_none(), "no lease was taken for it");

    h.clock.advance_ms(3 * 60_000);
    scopes.maintenance_pass().unwrap();
    let rec = h.registry.get(&p.scope.scope_id).unwrap().unwrap();
    assert_eq!(rec.state, ScopeState::Draft, "a left-over provisioning is finished by maintenance");
    assert!(h.mounter.is_mounted(&p.scope.scope_id));
}
