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
    (Arc::new(Registry::open_in_memory().unwrap().with_clock(clock.clone())), clock)
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
