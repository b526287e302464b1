//! Forks' and snapshots' registry rows (issue 23 item 5), on either backend: copies recorded with
//! their provisioning, block holds in bulk and their release, snapshots.

use std::sync::Arc;

use super::{Registry, RegistryError};
use crate::ids::{ScopeId, ThreadId};

const DEP: &str = "dep-forks";

fn thread(s: &str) -> ThreadId {
    ThreadId::parse(s).unwrap()
}

#[test]
fn a_fork_is_recorded_with_its_provisioning_and_holds_blocks_in_bulk() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let dep = reg.deployment(DEP);
    let parent = dep.provision("op-p", &thread("t-parent"), None).unwrap().scope;
    let child = dep.provision_fork("op-c", &thread("t-child"), &parent.scope_id).unwrap();
    assert!(child.created);
    assert_eq!(dep.forked_from(&child.scope.scope_id).unwrap(), Some(parent.scope_id.clone()));
    assert_eq!(dep.forked_from(&parent.scope_id).unwrap(), None);
    // Idempotent on the operation; a thread whose scope is no copy of the parent is a conflict.
    assert_eq!(
        dep.provision_fork("op-c", &thread("t-child"), &parent.scope_id).unwrap().scope.scope_id,
        child.scope.scope_id
    );
    assert!(matches!(
        dep.provision_fork("op-x", &thread("t-parent"), &child.scope.scope_id),
        Err(RegistryError::OperationConflict)
    ));

    let home = parent.scope_id.as_str().to_string();
    let blocks: Vec<(String, String)> = (0..2500).map(|i| (home.clone(), format!("{i:064x}"))).collect();
    dep.hold_blocks(&child.scope.scope_id, &blocks).unwrap();
    dep.hold_blocks(&child.scope.scope_id, &blocks[..10]).unwrap();
    assert_eq!(dep.held_blocks(&home).unwrap().len(), 2500);
    assert_eq!(dep.holds_of(&child.scope.scope_id).unwrap().len(), 2500);
    assert!(dep.block_held(&home, &blocks[7].1).unwrap());

    // A second holder; releases: nobody deletes a block of a live scope.
    let other = dep.provision_fork("op-d", &thread("t-other"), &parent.scope_id).unwrap().scope.scope_id;
    dep.hold_blocks(&other, &blocks[..1]).unwrap();
    assert!(!dep.release_block(child.scope.scope_id.as_str(), &home, &blocks[0].1).unwrap());
    assert!(dep.block_held(&home, &blocks[0].1).unwrap(), "the other holder still refers to it");
    assert!(!dep.release_block(other.as_str(), &home, &blocks[0].1).unwrap(), "its scope is live");
    assert!(!dep.block_held(&home, &blocks[0].1).unwrap());
    // The home scope deleted and purged: the last holder deletes.
    let parent = dep.complete_provision(&parent.scope_id).unwrap();
    let deleting = dep.begin_delete(&parent.scope_id, parent.revision).unwrap();
    assert_eq!(deleting.state, super::ScopeState::Deleting);
    dep.complete_delete(&parent.scope_id).unwrap();
    dep.begin_purge(&parent.scope_id).unwrap();
    assert!(dep.complete_purge(&parent.scope_id).unwrap().purged_at.is_some());
    assert!(dep.release_block(child.scope.scope_id.as_str(), &home, &blocks[1].1).unwrap());
}

#[test]
fn snapshots_are_listed_per_scope_and_unique_by_id() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let dep = reg.deployment(DEP);
    let scope = dep.provision("op-s", &thread("t-snap"), None).unwrap().scope.scope_id;
    let s1 = dep.provision_fork("op-s1", &thread("snap.one"), &scope).unwrap().scope.scope_id;
    let s2 = dep.provision_fork("op-s2", &thread("snap.two"), &scope).unwrap().scope.scope_id;
    let one = dep.record_snapshot(&scope, "one", &s1).unwrap();
    dep.record_snapshot(&scope, "two", &s2).unwrap();
    assert!(matches!(dep.record_snapshot(&scope, "one", &s2), Err(RegistryError::OperationConflict)));
    assert_eq!(dep.snapshot("one").unwrap(), Some(one.clone()));
    let listed: Vec<String> = dep.snapshots(&scope).unwrap().into_iter().map(|s| s.snapshot_id).collect();
    assert_eq!(listed, ["one", "two"]);
    assert_eq!(dep.snapshot_scopes().unwrap(), [s1, s2].into_iter().collect());
    assert!(dep.snapshots(&ScopeId::generate()).unwrap().is_empty());
    assert!(matches!(dep.record_snapshot(&scope, "bad id!", &scope), Err(RegistryError::Invalid { .. })));
}
