//! Issue 22 item 4 over the fake executor and the manual clock: an adopted environment keeps its
//! runtime (its timer fires at `started_at` + the admitted runtime, it is stopped at once when that
//! has passed, its watcher and shared slot come back), the maintenance pass ends any environment
//! past its runtime, and a stop that unmounts ends every environment first.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use scopefs::limits::LimitsConfig;
use scopefs::registry::environments::{EnvironmentRecord, EnvironmentState};

use super::{env_in, harness, scope_with_env, Harness};
use scopefs::executor::Executor;

fn record(h: &Harness, env: &str) -> EnvironmentRecord {
    h.services.compute.registry().environment_unscoped(env).unwrap().unwrap()
}

/// Waits (bounded) until `env` has ended; its record.
fn ended(h: &Harness, env: &str, within: Duration) -> EnvironmentRecord {
    let deadline = Instant::now() + within;
    loop {
        let rec = record(h, env);
        if rec.state == EnvironmentState::Ended {
            return rec;
        }
        assert!(Instant::now() < deadline, "{env} still {:?}", rec.state);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 9: an environment whose scope's mount outlived the daemon is adopted at startup (live,
/// its container kept); another scope's environment still ends.
#[test]
fn startup_reconciliation_adopts_environments_of_resumed_mounts() {
    let h = harness(LimitsConfig::default());
    let (svc, fake) = (&h.services.compute, &h.executor);
    let (kept_scope, kept_env) = scope_with_env(svc, fake, "t-kept");
    let (_, ended_env) = scope_with_env(svc, fake, "t-ended");
    let resumed = std::collections::HashSet::from([kept_scope.clone()]);
    let report = svc.reconcile_compute_at_startup(&resumed).unwrap();
    assert_eq!((report.environments_ended, report.containers_kept, report.containers_removed), (1, 1, 1));
    let kept = svc.registry().environment(&kept_scope, &kept_env).unwrap().unwrap();
    assert!(kept.state.is_live(), "{:?}", kept.state);
    assert_eq!(fake.container_ids(), vec![kept.container_id.clone().unwrap()]);
    let ended = svc.registry().environment_unscoped(&ended_env).unwrap().unwrap();
    assert_eq!(ended.end_reason.as_deref(), Some("daemon_restart"));
}

/// The environment of `scope_with_env` ran 59.7 s of its 60 s before the restart: the new process's
/// timer stops it within the 0.3 s left (not 60 s later), billed 60 s, its container removed.
#[test]
fn an_adopted_environment_is_stopped_at_its_deadline_and_billed_no_more() {
    let h = harness(LimitsConfig::default());
    let (scope, env) = scope_with_env(&h.services.compute, &h.executor, "t-adopt");
    h.clock.advance_ms(59_700);
    let report = h.services.compute.reconcile_compute_at_startup(&HashSet::from([scope])).unwrap();
    assert_eq!((report.environments_ended, report.containers_kept), (0, 1));
    assert!(record(&h, &env).state.is_live());
    let rec = ended(&h, &env, Duration::from_secs(10));
    assert_eq!((rec.end_reason.as_deref(), rec.runtime_seconds), (Some("max_runtime"), Some(60)));
    assert!(h.executor.container_ids().is_empty(), "{:?}", h.executor.container_ids());
}

/// Past its runtime at startup (the daemon was down for five minutes): stopped by the
/// reconciliation itself and billed the admitted 60 s, not the 300 s that passed.
#[test]
fn an_adopted_environment_past_its_runtime_is_stopped_at_startup() {
    let h = harness(LimitsConfig::default());
    let (scope, env) = scope_with_env(&h.services.compute, &h.executor, "t-late");
    h.clock.advance_ms(300_000);
    let report = h.services.compute.reconcile_compute_at_startup(&HashSet::from([scope])).unwrap();
    assert_eq!(report.environments_ended, 1);
    let rec = record(&h, &env);
    assert_eq!(
        (rec.state, rec.end_reason.as_deref(), rec.runtime_seconds),
        (EnvironmentState::Ended, Some("max_runtime"), Some(60))
    );
    assert!(h.executor.container_ids().is_empty());
}

/// The adopted environment's container is watched again: when it dies, the environment ends.
#[test]
fn an_adopted_environments_container_is_watched_again() {
    let h = harness(LimitsConfig::default());
    let (scope, env) = scope_with_env(&h.services.compute, &h.executor, "t-watch");
    h.services.compute.reconcile_compute_at_startup(&HashSet::from([scope])).unwrap();
    let container = record(&h, &env).container_id.unwrap();
    h.executor.remove(&container).unwrap();
    let rec = record(&h, &env);
    assert_eq!((rec.state, rec.end_reason.as_deref()), (EnvironmentState::Ended, Some("container_exited")));
}

/// An environment that was already running (no timer in this process) and is past its runtime is
/// ended by the next maintenance pass, billed its admitted runtime; one within it is left alone.
#[test]
fn the_maintenance_pass_ends_environments_past_their_runtime() {
    let h = harness(LimitsConfig::default());
    let (_, overdue) = scope_with_env(&h.services.compute, &h.executor, "t-overdue");
    h.clock.advance_ms(30_000);
    let (_, fresh) = scope_with_env(&h.services.compute, &h.executor, "t-fresh");
    h.clock.advance_ms(31_000);
    let report = h.services.scopes.maintenance_pass().unwrap();
    assert_eq!(report.environments_overdue, 1, "{report:?}");
    let rec = record(&h, &overdue);
    assert_eq!((rec.end_reason.as_deref(), rec.runtime_seconds), (Some("max_runtime"), Some(60)));
    assert!(record(&h, &fresh).state.is_live(), "31 s of 60 s used: it keeps running");
    assert_eq!(h.executor.container_ids(), vec![record(&h, &fresh).container_id.unwrap()]);
}

/// A stop that unmounts the scopes ends (and bills) every environment and removes its container
/// before the mounts go.
#[test]
fn a_stop_ends_every_environment_before_it_unmounts() {
    let h = harness(LimitsConfig::default());
    let (_, a) = scope_with_env(&h.services.compute, &h.executor, "t-stop-a");
    let (_, b) = scope_with_env(&h.services.compute, &h.executor, "t-stop-b");
    h.clock.advance_ms(12_300);
    h.services.scopes.shutdown(Duration::from_secs(1));
    for env in [a, b] {
        let rec = record(&h, &env);
        assert_eq!(
            (rec.state, rec.end_reason.as_deref(), rec.runtime_seconds),
            (EnvironmentState::Ended, Some("daemon_stopped"), Some(13))
        );
    }
    assert!(h.executor.container_ids().is_empty(), "{:?}", h.executor.container_ids());
}

/// A shared environment adopted after a restart gets its user slot back (a new shared one of the
/// same user is 429 at `max_shared_environments_per_user` = 1) and, its mounts not being known for
/// certain, its container is removed at its end instead of kept warm; then the slot is free.
#[test]
fn an_adopted_shared_environment_holds_its_users_slot() {
    use crate::services::compute::shared::SharedRequest;
    use crate::services::compute::{Caller, ComputeError, CreateEnvironment, DestroyEnvironment};
    let h = harness(LimitsConfig { max_shared_environments_per_user: 1, ..LimitsConfig::default() });
    let svc = &h.services.compute;
    let (scope, env) = scope_with_env(svc, &h.executor, "t-shared");
    svc.registry().set_environment_options(&env, r#"{"execution_mode":"simple"}"#).unwrap();
    svc.reconcile_compute_at_startup(&HashSet::from([scope.clone()])).unwrap();
    assert_eq!(svc.execution_of(&env).mode, "simple");
    let caller = Caller { user_id: "u".into(), thread_id: "t-shared".into(), read_only: false };
    let shared = CreateEnvironment {
        max_runtime_seconds: Some(30),
        shared: SharedRequest { asked: Some("simple"), ..SharedRequest::default() },
        ..CreateEnvironment::default()
    };
    let refused = svc.create_environment(&scope, &caller, &shared);
    assert!(matches!(refused, Err(ComputeError::TooMany(_))), "{refused:?}");
    let container = record(&h, &env).container_id.unwrap();
    svc.destroy_environment(&scope, &env, &DestroyEnvironment::default()).unwrap();
    assert!(!h.executor.container_ids().contains(&container), "an adopted container is never reused");
    let next = svc.create_environment(&scope, &caller, &shared).unwrap();
    assert_eq!(svc.execution_of(&next.environment_id).mode, "simple");
}

/// Issue 24, item 6: an environment its max runtime ends has its outputs recorded with its end,
/// before anything can settle its usage: the files under its default output paths that changed
/// since it was created, not the ones that were there before (at 2351eb5 nothing was recorded
/// until a later destroy, which a settlement could precede).
#[test]
fn an_environment_its_timer_ends_records_its_outputs_with_its_end() {
    use scopefs::engine::WriteMode;
    let h = harness(LimitsConfig::default());
    let svc = &h.services.compute;
    let (_, env) = scope_with_env(svc, &h.executor, "t-outputs");
    let (_, engine) = h.services.files.engine_for_thread(&scopefs::ids::ThreadId::parse("t-outputs").unwrap()).unwrap();
    let owner = crate::services::files::api_owner(&engine).unwrap();
    let write = |path: &str| engine.write_path(path, &mut &b"bytes"[..], 1 << 20, WriteMode::CreateNew, owner).unwrap();
    write("before.txt");
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let options = format!(r#"{{"default_output_paths":["/workspace"],"outputs_since_ns":{since}}}"#);
    svc.registry().set_environment_options(&env, &options).unwrap();
    write("made.txt");
    h.clock.advance_ms(61_000);
    assert_eq!(h.services.scopes.maintenance_pass().unwrap().environments_overdue, 1);
    assert_eq!(record(&h, &env).end_reason.as_deref(), Some("max_runtime"));
    let billing = svc.registry().registry();
    let usage = billing.usage_by_environment(&env).unwrap().expect("usage recorded with the end");
    assert_eq!(usage.artifacts_state, scopefs::registry::billing::ArtifactsState::Pending, "{usage:?}");
    let paths = billing.usage_artifacts(&env).unwrap();
    assert!(paths.len() == 1 && paths[0].ends_with("made.txt"), "{paths:?}");
}

/// Issue 24 item 6: each environment ending with outputs keeps them in a snapshot of its scope,
/// which its artifacts name; a scope keeps at most `limits.max_output_snapshots_per_scope` such
/// snapshots (each costs the scope's metadata), past which outputs are hashed in the live scope and
/// name none. Ended again, an environment uses the snapshot it took.
#[test]
fn a_scope_keeps_at_most_its_bound_of_output_snapshots() {
    use crate::services::compute::DestroyEnvironment;
    use scopefs::engine::WriteMode;
    let h = harness(LimitsConfig { max_output_snapshots_per_scope: 1, ..LimitsConfig::default() });
    let svc = &h.services.compute;
    let (scope, first) = scope_with_env(svc, &h.executor, "t-kept-outputs");
    let second = env_in(svc, &h.executor, &scope, "t-kept-outputs");
    let thread = scopefs::ids::ThreadId::parse("t-kept-outputs").unwrap();
    let (_, engine) = h.services.files.engine_for_thread(&thread).unwrap();
    let owner = crate::services::files::api_owner(&engine).unwrap();
    for (env, file) in [(&first, "first.txt"), (&second, "second.txt")] {
        svc.registry().set_environment_options(env, r#"{"default_output_paths":["/workspace"]}"#).unwrap();
        engine.write_path(file, &mut &b"bytes"[..], 1 << 20, WriteMode::CreateNew, owner).unwrap();
    }
    let destroy = |env: &str| svc.destroy_environment(&scope, env, &DestroyEnvironment::default()).unwrap();
    let kept = destroy(&first);
    assert!(!kept.artifacts.is_empty());
    let id = format!("out.{first}");
    assert!(kept.artifacts.iter().all(|a| a.snapshot_id.as_deref() == Some(id.as_str())), "{:?}", kept.artifacts);
    let past = destroy(&second);
    assert!(!past.artifacts.is_empty());
    assert!(past.artifacts.iter().all(|a| a.snapshot_id.is_none()), "past the bound: {:?}", past.artifacts);
    let snapshots = h.services.scopes.snapshots(&scope).unwrap();
    assert_eq!(snapshots.iter().map(|s| s.snapshot_id.as_str()).collect::<Vec<_>>(), vec![id.as_str()]);
}
