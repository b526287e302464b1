//! Tests of the environment and process SQL.

use std::sync::Arc;

use super::*;
use crate::ids::ThreadId;
use crate::registry::Registry;

fn setup() -> (Arc<Registry>, ScopeId) {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let p = reg.deployment("d").provision("op1", &ThreadId::parse("t1").unwrap(), None).unwrap();
    let scope = p.scope.scope_id.clone();
    let scope = if p.scope.state == crate::registry::ScopeState::Provisioning {
        reg.deployment("d").complete_provision(&scope).unwrap().scope_id
    } else {
        scope
    };
    (reg, scope)
}

fn new_env(max: u64) -> NewEnvironment {
    NewEnvironment {
        user_id: "u".into(),
        thread_id: "t1".into(),
        read_only: false,
        requested_max_runtime_seconds: Some(100),
        effective_max_runtime_seconds: 100,
        max_live_per_scope: max,
        pricing_snapshot: None,
    }
}

#[test]
fn environment_lifecycle_records_runtime_once_and_settles_owners() {
    let (reg, scope) = setup();
    let env = reg.deployment("d").create_environment(&scope, &new_env(2)).unwrap().unwrap();
    assert_eq!(env.state, EnvironmentState::Creating);
    let owner = reg.deployment("d").owner(&scope, &env.owner_id).unwrap();
    assert_eq!((owner.owner_type, owner.state), (OwnerType::Environment, OwnerState::Reserved));
    assert_eq!(owner.resource_id.as_deref(), Some(env.environment_id.as_str()));
    reg.deployment("d").attach_container(&env.environment_id, "c1").unwrap();
    let running = reg.deployment("d").environment_started(&env.environment_id).unwrap().unwrap();
    assert_eq!(running.state, EnvironmentState::Running);
    assert_eq!(running.container_id.as_deref(), Some("c1"));
    assert_eq!(reg.deployment("d").owner(&scope, &env.owner_id).unwrap().state, OwnerState::Active);

    let p = reg.deployment("d").create_process(&scope, &env.environment_id, "sleep 1").unwrap().unwrap();
    reg.deployment("d").process_started(&p.process_id, "exec1").unwrap().unwrap();
    let powner = reg.deployment("d").owner(&scope, &p.owner_id).unwrap();
    assert_eq!(powner.parent_owner_id.as_deref(), Some(env.owner_id.as_str()));
    assert_eq!(powner.state, OwnerState::Active);

    let (ended, changed) = reg.deployment("d").end_environment(&env.environment_id, false, "destroyed").unwrap();
    assert!(changed);
    assert_eq!(ended.state, EnvironmentState::Ended);
    assert_eq!(ended.end_reason.as_deref(), Some("destroyed"));
    assert!(ended.runtime_seconds.is_some());
    let (again, changed) = reg.deployment("d").end_environment(&env.environment_id, false, "max_runtime").unwrap();
    assert!(!changed);
    assert_eq!(again, ended, "a second end changes nothing");
    assert_eq!(reg.deployment("d").owner(&scope, &env.owner_id).unwrap().state, OwnerState::Terminal);
    let lost = reg.deployment("d").process(&scope, &p.process_id).unwrap().unwrap();
    assert_eq!((lost.state, lost.end_reason.as_deref()), (ProcessState::Lost, Some("environment_ended")));
    assert_eq!(reg.deployment("d").owner(&scope, &p.owner_id).unwrap().state, OwnerState::Terminal);
    assert!(reg.deployment("d").delete_blockers(&scope).unwrap().is_empty());
    assert!(reg.deployment("d").create_process(&scope, &env.environment_id, "x").unwrap().is_none());
}

#[test]
fn limits_and_scoping() {
    let (reg, scope) = setup();
    let other = reg.deployment("d").provision("op2", &ThreadId::parse("t2").unwrap(), None).unwrap().scope.scope_id;
    let e1 = reg.deployment("d").create_environment(&scope, &new_env(1)).unwrap().unwrap();
    assert!(reg.deployment("d").create_environment(&scope, &new_env(1)).unwrap().is_none(), "capacity");
    assert!(reg.deployment("d").environment(&other, &e1.environment_id).unwrap().is_none());
    assert!(reg.deployment("d").environments(&other).unwrap().is_empty());
    assert_eq!(reg.deployment("d").live_environments().unwrap().len(), 1);
    let (failed, _) = reg.deployment("d").end_environment(&e1.environment_id, true, "create_failed").unwrap();
    assert_eq!((failed.state, failed.runtime_seconds), (EnvironmentState::Failed, Some(0)));
    assert_eq!(reg.deployment("d").owner(&scope, &e1.owner_id).unwrap().state, OwnerState::Failed);
    assert!(reg.deployment("d").environment_started(&e1.environment_id).unwrap().is_none(), "no way back");
}

#[test]
fn runtime_rounds_up() {
    assert_eq!(runtime_seconds(Some(1000), 1000), 0);
    assert_eq!(runtime_seconds(Some(1000), 1001), 1);
    assert_eq!(runtime_seconds(Some(1000), 61_000), 60);
    assert_eq!(runtime_seconds(None, 5000), 0);
}
