//! Unit tests of owners, run reservations, leases and the delete/expiry/purge lifecycle (manual clock).

use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;

const DEP: &str = "dep-a";
const HOUR: i64 = 3_600_000;

fn thread(s: &str) -> ThreadId {
    ThreadId::parse(s).unwrap()
}

fn registry() -> (Arc<Registry>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    (Arc::new(Registry::open_for_tests().unwrap().with_clock(clock.clone())), clock)
}

/// A provisioned draft scope of `name`.
fn draft(reg: &Arc<Registry>, name: &str) -> ScopeRecord {
    let p = reg.deployment(DEP).provision(&format!("op-{name}"), &thread(name), None).unwrap();
    reg.deployment(DEP).complete_provision(&p.scope.scope_id).unwrap()
}

fn owner(ty: OwnerType, resource: Option<&str>) -> NewOwner {
    NewOwner { owner_type: ty, resource_id: resource.map(str::to_owned), parent_owner_id: None }
}

fn set_state(reg: &Arc<Registry>, scope: &ScopeId, owner: &str, to: OwnerState) -> Result<OwnerRecord, RegistryError> {
    reg.deployment(DEP).update_owner(scope, owner, &OwnerUpdate { state: Some(to), ..Default::default() })
}

fn reserve(id: &str, turn: &str, interrupt: Option<&str>, hash: &str) -> RunReserve {
    RunReserve {
        run_request_id: id.into(),
        turn_id: turn.into(),
        interrupt_key: interrupt.map(str::to_owned),
        request_hash: hash.into(),
    }
}

/// The owner transitions the product allows, written independently of the SQL table.
fn owner_allowed(from: OwnerState, to: OwnerState) -> bool {
    use OwnerState::*;
    match from {
        Reserved => matches!(to, Active | Draining | Terminal | Failed | Quarantined),
        Active => matches!(to, Draining | Terminal | Failed | Quarantined),
        Draining => matches!(to, Terminal | Failed | Quarantined),
        Failed => matches!(to, Terminal | Quarantined),
        Terminal => to == Quarantined,
        Quarantined => to == Terminal,
    }
}

#[test]
fn provision_registers_the_primary_thread_owner() {
    let (reg, _) = registry();
    let s = draft(&reg, "t1");
    let owners = reg.deployment(DEP).owners(&s.scope_id).unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!((owners[0].owner_type, owners[0].state), (OwnerType::PrimaryThread, OwnerState::Active));
    assert_eq!(owners[0].resource_id.as_deref(), Some("t1"));
    assert!(
        reg.deployment(DEP).delete_blockers(&s.scope_id).unwrap().is_empty(),
        "the primary thread never blocks a delete"
    );
}

#[test]
fn every_owner_transition_is_allowed_or_refused_as_specified() {
    let (reg, _) = registry();
    let s = draft(&reg, "t1");
    let path_to = |st: OwnerState| -> Vec<OwnerState> {
        use OwnerState::*;
        match st {
            Reserved => vec![],
            Active => vec![Active],
            Draining => vec![Draining],
            Terminal => vec![Terminal],
            Failed => vec![Failed],
            Quarantined => vec![Quarantined],
        }
    };
    for &from in OwnerState::ALL {
        for &to in OwnerState::ALL.iter().filter(|&&t| t != from) {
            let (o, _) = reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::Cron, None)).unwrap();
            for st in path_to(from) {
                set_state(&reg, &s.scope_id, &o.owner_id, st).unwrap();
            }
            let before = reg.deployment(DEP).owner(&s.scope_id, &o.owner_id).unwrap();
            assert_eq!(before.state, from);
            let result = set_state(&reg, &s.scope_id, &o.owner_id, to);
            let after = reg.deployment(DEP).owner(&s.scope_id, &o.owner_id).unwrap();
            if owner_allowed(from, to) {
                let new = result.unwrap_or_else(|e| panic!("{from} -> {to} refused: {e}"));
                assert_eq!((new.state, new.revision), (to, before.revision + 1));
                assert_eq!(new.terminal_at.is_some(), to.is_settled());
            } else {
                assert!(
                    matches!(result, Err(RegistryError::OwnerConflict { stale_revision: false, .. })),
                    "{from} -> {to}: {result:?}"
                );
                assert_eq!(after, before, "a refused transition changed the owner");
            }
        }
    }
    // In particular: terminal and quarantined never become active again.
    assert!(!owner_allowed(OwnerState::Terminal, OwnerState::Active));
    assert!(!owner_allowed(OwnerState::Quarantined, OwnerState::Active));
}

#[test]
fn owner_revision_cas_and_resource_attachment() {
    let (reg, _) = registry();
    let a = draft(&reg, "ta");
    let b = draft(&reg, "tb");
    let (o, created) = reg.deployment(DEP).create_owner(&a.scope_id, &owner(OwnerType::AsyncThread, None)).unwrap();
    assert!(created);
    assert_eq!((o.state, o.revision, o.resource_id.clone()), (OwnerState::Reserved, 1, None));
    // Stale revision: conflict, nothing changes.
    let stale = OwnerUpdate { expected_revision: Some(7), state: Some(OwnerState::Active), ..Default::default() };
    assert!(matches!(
        reg.deployment(DEP).update_owner(&a.scope_id, &o.owner_id, &stale),
        Err(RegistryError::OwnerConflict { stale_revision: true, .. })
    ));
    // Attach a resource and activate in one CAS.
    let up = OwnerUpdate {
        expected_revision: Some(1),
        resource_id: Some("child-1".into()),
        state: Some(OwnerState::Active),
    };
    let o = reg.deployment(DEP).update_owner(&a.scope_id, &o.owner_id, &up).unwrap();
    assert_eq!((o.state, o.resource_id.as_deref(), o.revision), (OwnerState::Active, Some("child-1"), 3));
    // Same resource again: no-op; a different one: refused.
    let same = OwnerUpdate { resource_id: Some("child-1".into()), ..Default::default() };
    assert_eq!(reg.deployment(DEP).update_owner(&a.scope_id, &o.owner_id, &same).unwrap(), o);
    let other = OwnerUpdate { resource_id: Some("child-2".into()), ..Default::default() };
    assert!(matches!(
        reg.deployment(DEP).update_owner(&a.scope_id, &o.owner_id, &other),
        Err(RegistryError::ResourceIdAlreadySet)
    ));
    // The resource registered again in the same scope returns that owner; in another scope it is refused.
    let (again, created) =
        reg.deployment(DEP).create_owner(&a.scope_id, &owner(OwnerType::AsyncThread, Some("child-1"))).unwrap();
    assert_eq!((again.owner_id.as_str(), created), (o.owner_id.as_str(), false));
    assert!(matches!(
        reg.deployment(DEP).create_owner(&b.scope_id, &owner(OwnerType::AsyncThread, Some("child-1"))),
        Err(RegistryError::ResourceOwned)
    ));
    let (ob, _) = reg.deployment(DEP).create_owner(&b.scope_id, &owner(OwnerType::AsyncThread, None)).unwrap();
    let steal = OwnerUpdate { resource_id: Some("child-1".into()), ..Default::default() };
    assert!(matches!(
        reg.deployment(DEP).update_owner(&b.scope_id, &ob.owner_id, &steal),
        Err(RegistryError::ResourceOwned)
    ));
    // Lookup by resource is per scope.
    assert_eq!(reg.deployment(DEP).owner_by_resource(&a.scope_id, "child-1", None).unwrap().owner_id, o.owner_id);
    assert!(matches!(
        reg.deployment(DEP).owner_by_resource(&b.scope_id, "child-1", None),
        Err(RegistryError::OwnerNotFound)
    ));
    // An owner of another scope is not found through this one.
    assert!(matches!(
        set_state(&reg, &b.scope_id, &o.owner_id, OwnerState::Terminal),
        Err(RegistryError::OwnerNotFound)
    ));
    // The primary thread owner is made by provision only.
    assert!(matches!(
        reg.deployment(DEP).create_owner(&a.scope_id, &owner(OwnerType::PrimaryThread, None)),
        Err(RegistryError::Invalid { .. })
    ));
}

#[test]
fn run_reservations_are_idempotent_and_activate_drafts() {
    let (reg, _) = registry();
    let s = draft(&reg, "t1");
    let r1 = reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-1", "turn-1", None, "h1")).unwrap();
    assert!(r1.created);
    assert_eq!(
        (r1.scope.state, r1.scope.revision),
        (ScopeState::Active, s.revision + 1),
        "first reservation activates"
    );
    assert_eq!(r1.run.state, RunRequestState::Reserved);
    let again = reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-1", "turn-1", None, "h1")).unwrap();
    assert_eq!((again.run.clone(), again.created), (r1.run.clone(), false));
    assert!(matches!(
        reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-1", "turn-1", None, "h2")),
        Err(RegistryError::OperationConflict)
    ));
    // Same turn, new request id: a new reservation (approval/follow-up resume).
    let r2 = reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-2", "turn-1", Some("int-1"), "h3")).unwrap();
    assert!(r2.created);
    assert_ne!(r2.run.run_owner_id, r1.run.run_owner_id);
    assert_eq!(r2.scope.revision, r1.scope.revision, "an active scope is not changed");
    assert!(matches!(
        reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-3", "turn-1", Some("int-1"), "h4")),
        Err(RegistryError::InterruptAlreadyResolved)
    ));
    // The run owner follows the run: attach run_id, start, complete.
    let up = RunUpdate { run_id: Some("run-abc".into()), state: Some(RunRequestState::Started) };
    let run = reg.deployment(DEP).update_run(&s.scope_id, "rr-1", &up).unwrap();
    assert_eq!((run.state, run.run_id.as_deref()), (RunRequestState::Started, Some("run-abc")));
    let o = reg.deployment(DEP).owner(&s.scope_id, &run.run_owner_id).unwrap();
    assert_eq!((o.state, o.resource_id.as_deref()), (OwnerState::Active, Some("run-abc")));
    let other = RunUpdate { run_id: Some("run-xyz".into()), state: None };
    assert!(matches!(reg.deployment(DEP).update_run(&s.scope_id, "rr-1", &other), Err(RegistryError::RunIdAlreadySet)));
    let done = RunUpdate { run_id: None, state: Some(RunRequestState::Completed) };
    reg.deployment(DEP).update_run(&s.scope_id, "rr-1", &done).unwrap();
    assert_eq!(reg.deployment(DEP).owner(&s.scope_id, &run.run_owner_id).unwrap().state, OwnerState::Terminal);
    let restart = RunUpdate { run_id: None, state: Some(RunRequestState::Started) };
    assert!(matches!(
        reg.deployment(DEP).update_run(&s.scope_id, "rr-1", &restart),
        Err(RegistryError::RunRequestConflict { .. })
    ));
    assert!(matches!(
        reg.deployment(DEP).update_run(&s.scope_id, "nope", &done),
        Err(RegistryError::RunRequestNotFound)
    ));
    assert!(matches!(
        reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("bad id", "turn-1", None, "h")),
        Err(RegistryError::Invalid { field: "run_request_id", .. })
    ));
}

#[test]
fn leases_expire_renew_only_by_holder_and_block_creation() {
    let (reg, clock) = registry();
    let s = draft(&reg, "t1");
    let l = reg.deployment(DEP).acquire_lease("workspace-cutover", "cut-1", 60_000).unwrap();
    assert_eq!(l.expires_at, clock.now_ms() + 60_000);
    assert!(matches!(
        reg.deployment(DEP).acquire_lease("workspace-cutover", "cut-2", 60_000),
        Err(RegistryError::LeaseHeld)
    ));
    assert!(matches!(
        reg.deployment(DEP).renew_lease("workspace-cutover", "cut-2", 60_000),
        Err(RegistryError::LeaseNotHeld)
    ));
    // While held: no provision, no owner, no reservation.
    assert!(matches!(
        reg.deployment(DEP).provision("op-x", &thread("t2"), None),
        Err(RegistryError::CutoverInProgress(_))
    ));
    assert!(matches!(
        reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::Cron, None)),
        Err(RegistryError::CutoverInProgress(_))
    ));
    assert!(matches!(
        reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-1", "turn", None, "h")),
        Err(RegistryError::CutoverInProgress(_))
    ));
    // Renewal by the holder extends it.
    clock.advance_ms(30_000);
    let l = reg.deployment(DEP).renew_lease("workspace-cutover", "cut-1", 60_000).unwrap();
    assert_eq!(l.expires_at, clock.now_ms() + 60_000);
    // Expired: the holder can no longer renew; another operation can take it; creation is allowed again.
    clock.advance_ms(60_001);
    assert!(matches!(
        reg.deployment(DEP).renew_lease("workspace-cutover", "cut-1", 60_000),
        Err(RegistryError::LeaseNotHeld)
    ));
    assert!(reg.deployment(DEP).lease("workspace-cutover").unwrap().is_none());
    reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::Cron, None)).unwrap();
    let l2 = reg.deployment(DEP).acquire_lease("workspace-cutover", "cut-2", 1_000).unwrap();
    assert_eq!(l2.operation_id, "cut-2");
    assert!(matches!(
        reg.deployment(DEP).release_lease("workspace-cutover", "cut-1"),
        Err(RegistryError::LeaseNotHeld)
    ));
    assert!(reg.deployment(DEP).release_lease("workspace-cutover", "cut-2").unwrap());
    assert!(!reg.deployment(DEP).release_lease("workspace-cutover", "cut-2").unwrap());
    // Other lock names do not block creation; `maintenance` does.
    reg.deployment(DEP).acquire_lease("reindex", "op-r", 60_000).unwrap();
    reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::Cron, None)).unwrap();
    reg.deployment(DEP).acquire_lease("maintenance", "op-m", 60_000).unwrap();
    assert!(matches!(
        reg.deployment(DEP).provision("op-y", &thread("t3"), None),
        Err(RegistryError::CutoverInProgress(_))
    ));
    assert!(matches!(reg.deployment(DEP).acquire_lease("Bad Name", "op", 1_000), Err(RegistryError::Invalid { .. })));
    assert!(matches!(reg.deployment(DEP).acquire_lease("x", "op", 0), Err(RegistryError::Invalid { .. })));
}

#[test]
fn delete_waits_for_owners_and_freezes_the_scope() {
    let (reg, _) = registry();
    let s = draft(&reg, "t1");
    let (o, _) =
        reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::BackgroundProcess, Some("pid-1"))).unwrap();
    set_state(&reg, &s.scope_id, &o.owner_id, OwnerState::Active).unwrap();
    // Stale revision: refused.
    assert!(matches!(
        reg.deployment(DEP).begin_delete(&s.scope_id, s.revision + 5),
        Err(RegistryError::Conflict { .. })
    ));
    let d = reg.deployment(DEP).begin_delete(&s.scope_id, s.revision).unwrap();
    assert_eq!((d.state, d.revision), (ScopeState::Deleting, s.revision + 1));
    // Live owners were asked to drain; nothing new may start.
    assert_eq!(reg.deployment(DEP).owner(&s.scope_id, &o.owner_id).unwrap().state, OwnerState::Draining);
    assert!(matches!(
        reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::Cron, None)),
        Err(RegistryError::ScopeUnavailable(ScopeState::Deleting))
    ));
    assert!(matches!(
        reg.deployment(DEP).reserve_run(&s.scope_id, &reserve("rr-1", "turn", None, "h")),
        Err(RegistryError::ScopeUnavailable(ScopeState::Deleting))
    ));
    assert!(matches!(
        set_state(&reg, &s.scope_id, &o.owner_id, OwnerState::Active),
        Err(RegistryError::ScopeUnavailable(ScopeState::Deleting))
    ));
    // Blocked: the reason is recorded and the operation failed.
    let step = reg.deployment(DEP).complete_delete(&s.scope_id).unwrap();
    assert_eq!(step, DeleteStep::Blocked(vec![o.owner_id.clone()]));
    reg.deployment(DEP).record_delete_blocked(&s.scope_id, std::slice::from_ref(&o.owner_id)).unwrap();
    let rec = reg.deployment(DEP).get(&s.scope_id).unwrap().unwrap();
    assert_eq!((rec.state, rec.delete_blocked_by.clone()), (ScopeState::Deleting, vec![o.owner_id.clone()]));
    let open = reg.deployment(DEP).open_operations().unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].kind.as_str(), open[0].state), (DELETE_KIND, OperationState::Failed));
    // Once the owner settles the delete completes; the primary owner is terminal.
    set_state(&reg, &s.scope_id, &o.owner_id, OwnerState::Terminal).unwrap();
    let DeleteStep::Deleted(rec) = reg.deployment(DEP).complete_delete(&s.scope_id).unwrap() else {
        panic!("not deleted")
    };
    assert_eq!(rec.state, ScopeState::Deleted);
    assert!(rec.deleted_at.is_some() && rec.delete_blocked_by.is_empty());
    assert!(reg.deployment(DEP).open_operations().unwrap().is_empty());
    assert!(reg.deployment(DEP).owners(&s.scope_id).unwrap().iter().all(|o| o.state.is_settled()));
    // Idempotent; and no owner in a deleted scope.
    assert!(matches!(reg.deployment(DEP).complete_delete(&s.scope_id).unwrap(), DeleteStep::Deleted(_)));
    assert!(matches!(
        reg.deployment(DEP).create_owner(&s.scope_id, &owner(OwnerType::Cron, None)),
        Err(RegistryError::ScopeUnavailable(ScopeState::Deleted))
    ));
    // complete_delete of a scope that is not deleting is refused.
    let other = draft(&reg, "t2");
    assert!(matches!(
        reg.deployment(DEP).complete_delete(&other.scope_id),
        Err(RegistryError::ScopeUnavailable(ScopeState::Draft))
    ));
}

#[test]
fn only_old_idle_drafts_expire() {
    let (reg, clock) = registry();
    let old = draft(&reg, "old");
    let busy = draft(&reg, "busy");
    let (o, _) = reg.deployment(DEP).create_owner(&busy.scope_id, &owner(OwnerType::MemoryWorker, None)).unwrap();
    let active = draft(&reg, "active");
    reg.deployment(DEP).reserve_run(&active.scope_id, &reserve("rr", "turn", None, "h")).unwrap();
    clock.advance_ms(25 * HOUR);
    let young = draft(&reg, "young");
    let cutoff = clock.now_ms() - 24 * HOUR;
    let due: Vec<_> = reg.deployment(DEP).expired_drafts(cutoff).unwrap().into_iter().map(|r| r.scope_id).collect();
    assert_eq!(due, vec![old.scope_id.clone()]);
    assert!(reg.deployment(DEP).begin_draft_expiry(&young.scope_id, cutoff).unwrap().is_none());
    assert!(reg.deployment(DEP).begin_draft_expiry(&busy.scope_id, cutoff).unwrap().is_none());
    assert!(reg.deployment(DEP).begin_draft_expiry(&active.scope_id, cutoff).unwrap().is_none());
    let rec = reg.deployment(DEP).begin_draft_expiry(&old.scope_id, cutoff).unwrap().unwrap();
    assert_eq!(rec.state, ScopeState::Deleting);
    assert!(matches!(reg.deployment(DEP).complete_delete(&old.scope_id).unwrap(), DeleteStep::Deleted(_)));
    // Once its owner settles, the busy draft is due too.
    set_state(&reg, &busy.scope_id, &o.owner_id, OwnerState::Terminal).unwrap();
    let due: Vec<_> = reg.deployment(DEP).expired_drafts(cutoff).unwrap().into_iter().map(|r| r.scope_id).collect();
    assert_eq!(due, vec![busy.scope_id]);
}

#[test]
fn purge_is_due_after_retention_and_recorded() {
    let (reg, clock) = registry();
    let s = draft(&reg, "t1");
    reg.deployment(DEP).begin_delete(&s.scope_id, s.revision).unwrap();
    reg.deployment(DEP).complete_delete(&s.scope_id).unwrap();
    let week = 7 * 24 * HOUR;
    assert!(reg.deployment(DEP).purge_due(clock.now_ms() - week).unwrap().is_empty());
    clock.advance_ms(week);
    assert_eq!(reg.deployment(DEP).purge_due(clock.now_ms() - week).unwrap().len(), 1);
    reg.deployment(DEP).begin_purge(&s.scope_id).unwrap();
    reg.deployment(DEP).begin_purge(&s.scope_id).unwrap();
    assert_eq!(reg.deployment(DEP).open_operations().unwrap().len(), 1, "one purge operation per scope");
    let rec = reg.deployment(DEP).complete_purge(&s.scope_id).unwrap();
    assert_eq!(rec.purged_at, Some(clock.now_ms()));
    assert!(reg.deployment(DEP).purge_due(clock.now_ms()).unwrap().is_empty());
    assert!(reg.deployment(DEP).open_operations().unwrap().is_empty());
    let live = draft(&reg, "t2");
    assert!(matches!(
        reg.deployment(DEP).begin_purge(&live.scope_id),
        Err(RegistryError::ScopeUnavailable(ScopeState::Draft))
    ));
}

/// Open operations of `kind`, as (operation_id, state).
fn ops_of(reg: &Arc<Registry>, kind: &str) -> Vec<(String, OperationState)> {
    let open = reg.deployment(DEP).open_operations().unwrap();
    open.into_iter().filter(|o| o.kind == kind).map(|o| (o.operation_id, o.state)).collect()
}

/// Seed 000 §5.3: a run reservation is a `run` operation keyed by its request id; starting it
/// completes the operation, cancelling it before it started compensates it, and a reservation
/// that can no longer start is compensated by `compensate_run` (run cancelled, owner terminal).
#[test]
fn run_reservations_are_operations_that_complete_or_compensate() {
    let (reg, _) = registry();
    let s = draft(&reg, "t1");
    let d = reg.deployment(DEP);
    let first = d.reserve_run(&s.scope_id, &reserve("r1", "turn", None, "h")).unwrap();
    let op1 = run_operation_id(&s.scope_id, "r1");
    assert_eq!(ops_of(&reg, RUN_KIND), vec![(op1.clone(), OperationState::Applying)]);
    d.reserve_run(&s.scope_id, &reserve("r1", "turn", None, "h")).unwrap();
    assert_eq!(ops_of(&reg, RUN_KIND).len(), 1, "the same key records one operation");
    let op = d.operation(&op1).unwrap().unwrap();
    assert_eq!(op.external_resource_id.as_deref(), Some(first.run.run_owner_id.as_str()));

    let started = RunUpdate { run_id: Some("run-1".into()), state: Some(RunRequestState::Started) };
    d.update_run(&s.scope_id, "r1", &started).unwrap();
    assert_eq!(d.operation(&op1).unwrap().unwrap().state, OperationState::Completed);

    d.reserve_run(&s.scope_id, &reserve("r2", "turn", None, "h2")).unwrap();
    let cancel = RunUpdate { run_id: None, state: Some(RunRequestState::Cancelled) };
    d.update_run(&s.scope_id, "r2", &cancel).unwrap();
    let op2 = d.operation(&run_operation_id(&s.scope_id, "r2")).unwrap().unwrap();
    assert_eq!((op2.state, op2.last_error_code.as_deref()), (OperationState::Compensated, Some("run_cancelled")));

    let r3 = d.reserve_run(&s.scope_id, &reserve("r3", "turn", None, "h3")).unwrap();
    let run = d.compensate_run(&s.scope_id, "r3", "scope_closed").unwrap();
    assert_eq!(run.state, RunRequestState::Cancelled);
    assert_eq!(d.owner(&s.scope_id, &r3.run.run_owner_id).unwrap().state, OwnerState::Terminal);
    let op3 = d.operation(&run_operation_id(&s.scope_id, "r3")).unwrap().unwrap();
    assert_eq!(op3.state, OperationState::Compensated);
    // Again: nothing changes; a started run's operation is only completed.
    assert_eq!(d.compensate_run(&s.scope_id, "r3", "scope_closed").unwrap().state, RunRequestState::Cancelled);
    assert_eq!(d.compensate_run(&s.scope_id, "r1", "scope_closed").unwrap().state, RunRequestState::Started);
    assert!(ops_of(&reg, RUN_KIND).is_empty());
}

/// Cron creation is a `cron` operation keyed by the cron's resource id: active completes it,
/// settling a cron that never became active compensates it, `compensate_cron` settles its owner.
#[test]
fn cron_creation_is_an_operation_keyed_by_its_resource() {
    let (reg, _) = registry();
    let s = draft(&reg, "t1");
    let d = reg.deployment(DEP);
    let (c1, _) = d.create_owner(&s.scope_id, &owner(OwnerType::Cron, Some("cron-1"))).unwrap();
    let (again, created) = d.create_owner(&s.scope_id, &owner(OwnerType::Cron, Some("cron-1"))).unwrap();
    assert_eq!((again.owner_id.as_str(), created), (c1.owner_id.as_str(), false));
    assert_eq!(ops_of(&reg, CRON_KIND), vec![("cron:cron-1".to_string(), OperationState::Applying)]);
    set_state(&reg, &s.scope_id, &c1.owner_id, OwnerState::Active).unwrap();
    assert_eq!(d.operation("cron:cron-1").unwrap().unwrap().state, OperationState::Completed);
    set_state(&reg, &s.scope_id, &c1.owner_id, OwnerState::Terminal).unwrap();
    assert_eq!(
        d.operation("cron:cron-1").unwrap().unwrap().state,
        OperationState::Completed,
        "ended later: stays completed"
    );

    let (c2, _) = d.create_owner(&s.scope_id, &owner(OwnerType::Cron, Some("cron-2"))).unwrap();
    set_state(&reg, &s.scope_id, &c2.owner_id, OwnerState::Failed).unwrap();
    assert_eq!(d.operation("cron:cron-2").unwrap().unwrap().state, OperationState::Compensated);

    let (c3, _) = d.create_owner(&s.scope_id, &owner(OwnerType::Cron, Some("cron-3"))).unwrap();
    d.compensate_cron("cron:cron-3", "scope_closed").unwrap();
    assert_eq!(d.owner(&s.scope_id, &c3.owner_id).unwrap().state, OwnerState::Terminal);
    assert_eq!(d.operation("cron:cron-3").unwrap().unwrap().state, OperationState::Compensated);
    // Other owner types record no operation.
    d.create_owner(&s.scope_id, &owner(OwnerType::AsyncThread, Some("a-1"))).unwrap();
    assert!(d.open_operations().unwrap().is_empty());
}

/// A provision compensates in two recorded steps (`compensating`, then `compensated` with the
/// scope `deleted` and its owners settled); each step may be repeated after a crash.
#[test]
fn a_provision_compensates_to_a_deleted_scope() {
    let (reg, _) = registry();
    let d = reg.deployment(DEP);
    let p = d.provision("op-1", &thread("t1"), None).unwrap();
    let op = d.begin_compensation("op-1", "mount_failed").unwrap();
    assert_eq!((op.state, op.last_error_code.as_deref()), (OperationState::Compensating, Some("mount_failed")));
    assert_eq!(d.begin_compensation("op-1", "again").unwrap().state, OperationState::Compensating);
    let rec = d.compensate_provision("op-1").unwrap().unwrap();
    assert_eq!((rec.state, rec.deleted_at.is_some()), (ScopeState::Deleted, true));
    assert!(d.owners(&p.scope.scope_id).unwrap().iter().all(|o| o.state.is_settled()));
    assert_eq!(d.operation("op-1").unwrap().unwrap().state, OperationState::Compensated);
    assert_eq!(d.compensate_provision("op-1").unwrap().unwrap(), rec, "repeating changes nothing");
    assert!(d.open_operations().unwrap().is_empty());
    // A completed provision is never compensated.
    let q = draft(&reg, "t2");
    assert_eq!(d.begin_compensation("op-t2", "late").unwrap().state, OperationState::Completed);
    assert_eq!(d.compensate_provision("op-t2").unwrap().unwrap().state, q.state);
}

/// Seed 000 §11.1: the cutover is a deployment-level operation (no scope) holding the report's
/// SHA-256; the same id and hash again is a no-op, another hash a conflict; the newest one counts.
#[test]
fn the_cutover_is_a_deployment_level_operation() {
    let (reg, clock) = registry();
    let d = reg.deployment(DEP);
    assert!(d.latest_cutover().unwrap().is_none());
    let sha_a = "a".repeat(64);
    let rec = d.record_cutover("cut-1", &sha_a).unwrap();
    assert_eq!((rec.scope_id, rec.kind.as_str(), rec.state), (None, CUTOVER_KIND, OperationState::Completed));
    assert_eq!(d.record_cutover("cut-1", &sha_a).unwrap().result_sha256, Some(sha_a.clone()));
    assert!(matches!(d.record_cutover("cut-1", &"b".repeat(64)), Err(RegistryError::OperationConflict)));
    assert!(matches!(d.record_cutover("cut-2", "not-hex"), Err(RegistryError::Invalid { .. })));
    clock.advance_ms(1);
    d.record_cutover("cut-2", &"c".repeat(64)).unwrap();
    assert_eq!(d.latest_cutover().unwrap().unwrap().operation_id, "cut-2");
    assert!(reg.deployment("dep-b").latest_cutover().unwrap().is_none());
    assert!(d.open_operations().unwrap().is_empty());
}
