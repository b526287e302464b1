//! Nodes, placement, moves and the fenced record of shipped heads (issue 23), on either backend.

use std::sync::Arc;
use std::time::Duration;

use super::nodes::{choose_node, NodeLoad, NodeState, ShippedHead};
use super::{Registry, RegistryError};
use crate::clock::ManualClock;
use crate::ids::ThreadId;

const DEP: &str = "dep-nodes";
const LEASE: Duration = Duration::from_secs(10);

fn registry() -> (Arc<Registry>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    (Arc::new(Registry::open_for_tests().unwrap().with_clock(clock.clone())), clock)
}

#[test]
fn nodes_register_heartbeat_and_expire() {
    let (reg, clock) = registry();
    let dep = reg.deployment(DEP);
    let a = dep.register_node("node-a", "http://10.0.0.1:7070", 100, LEASE).unwrap();
    assert_eq!((a.state, a.scopes, a.lease_until), (NodeState::Active, 0, 1_010_000));
    clock.advance_ms(4_000);
    let load = NodeLoad { bytes_used: 5, environments: 2 };
    let a = dep.heartbeat("node-a", LEASE, load).unwrap().unwrap();
    assert_eq!((a.lease_until, a.bytes_used, a.environments), (1_014_000, 5, 2));
    assert_eq!(dep.heartbeat("node-z", LEASE, load).unwrap(), None, "an unregistered node has no lease");
    // Another deployment sees none of it.
    assert!(reg.deployment("other").nodes().unwrap().is_empty());
    clock.advance_ms(11_000);
    assert!(!dep.node("node-a").unwrap().unwrap().is_live(reg.now_ms()));
}

#[test]
fn a_move_bumps_the_epoch_once_and_fences_the_old_owner() {
    let (reg, clock) = registry();
    let dep = reg.deployment(DEP);
    dep.register_node("node-a", "http://a", 100, LEASE).unwrap();
    dep.register_node("node-b", "http://b", 100, LEASE).unwrap();
    let scope = dep.create_scope(&ThreadId::parse("t-move").unwrap(), None).unwrap().scope_id;
    let p = dep.place(&scope, "node-a").unwrap();
    assert_eq!((p.node_id.as_str(), p.epoch, p.head), ("node-a", 1, None));
    assert_eq!(dep.place(&scope, "node-b").unwrap(), p, "a placed scope keeps its placement");
    let head = ShippedHead { gen: (1 << 32) | 1, seq: 7, state: u64::MAX - 3 };
    assert!(dep.record_shipped(&scope, "node-a", 1, head).unwrap());
    assert_eq!(dep.placement(&scope).unwrap().unwrap().head, Some(head), "u64 bits survive the round trip");

    // Not orphaned while node-a's lease runs.
    assert!(dep.orphaned_placements(10).unwrap().is_empty());
    clock.advance_ms(11_000);
    dep.heartbeat("node-b", LEASE, NodeLoad::default()).unwrap();
    let orphans = dep.orphaned_placements(10).unwrap();
    assert_eq!(orphans.iter().map(|p| p.scope_id.clone()).collect::<Vec<_>>(), vec![scope.clone()]);

    // Two takers race: one wins, at the next epoch, with the head kept.
    let won = dep.move_scope(&scope, "node-a", 1, "node-b").unwrap().unwrap();
    assert_eq!((won.node_id.as_str(), won.epoch, won.head), ("node-b", 2, Some(head)));
    assert_eq!(dep.move_scope(&scope, "node-a", 1, "node-b").unwrap(), None);
    // The deposed node can no longer record; the new owner can.
    let late = ShippedHead { gen: (1 << 32) | 1, seq: 9, state: 1 };
    assert!(!dep.record_shipped(&scope, "node-a", 1, late).unwrap());
    assert!(!dep.record_shipped(&scope, "node-b", 1, late).unwrap(), "an old epoch records nothing");
    assert_eq!(dep.placement(&scope).unwrap().unwrap().head, Some(head));
    let next = ShippedHead { gen: (2 << 32) | 1, seq: 8, state: 2 };
    assert!(dep.record_shipped(&scope, "node-b", 2, next).unwrap());
    assert_eq!(dep.placements_on("node-b").unwrap().len(), 1);
    assert!(dep.placements_on("node-a").unwrap().is_empty());
}

#[test]
fn drain_and_remove_follow_the_transition_table() {
    let (reg, _clock) = registry();
    let dep = reg.deployment(DEP);
    dep.register_node("node-a", "http://a", 100, LEASE).unwrap();
    let scope = dep.create_scope(&ThreadId::parse("t-drain").unwrap(), None).unwrap().scope_id;
    dep.place(&scope, "node-a").unwrap();
    assert_eq!(dep.set_node_state("node-a", NodeState::Draining).unwrap().state, NodeState::Draining);
    assert!(matches!(dep.set_node_state("node-a", NodeState::Removed), Err(RegistryError::NodeHasScopes(1))));
    dep.register_node("node-b", "http://b", 100, LEASE).unwrap();
    dep.move_scope(&scope, "node-a", 1, "node-b").unwrap().unwrap();
    assert_eq!(dep.set_node_state("node-a", NodeState::Removed).unwrap().state, NodeState::Removed);
    assert!(matches!(
        dep.set_node_state("node-a", NodeState::Draining),
        Err(RegistryError::NodeTransition { current: NodeState::Removed, requested: NodeState::Draining })
    ));
    assert!(matches!(dep.set_node_state("node-q", NodeState::Draining), Err(RegistryError::NodeNotFound)));
    // Starting again brings a removed node back.
    assert_eq!(dep.register_node("node-a", "http://a2", 5, LEASE).unwrap().state, NodeState::Active);
}

#[test]
fn placement_spreads_by_scopes_environments_bytes_and_honours_max_scopes() {
    let (reg, clock) = registry();
    let dep = reg.deployment(DEP);
    dep.register_node("node-a", "http://a", 2, LEASE).unwrap();
    dep.register_node("node-b", "http://b", 100, LEASE).unwrap();
    dep.register_node("node-c", "http://c", 100, LEASE).unwrap();
    let mut placed = Vec::new();
    for i in 0..9 {
        let scope = dep.create_scope(&ThreadId::parse(&format!("t-p{i}")).unwrap(), None).unwrap().scope_id;
        let node = dep.choose_node().unwrap().unwrap().node_id;
        placed.push(dep.place(&scope, &node).unwrap().node_id);
    }
    let count = |n: &str| placed.iter().filter(|p| p.as_str() == n).count();
    assert_eq!((count("node-a"), count("node-b"), count("node-c")), (2, 4, 3), "{placed:?}");
    // Live environments weigh four scopes each; bytes break ties.
    dep.heartbeat("node-b", LEASE, NodeLoad { bytes_used: 0, environments: 1 }).unwrap();
    assert_eq!(dep.choose_node().unwrap().unwrap().node_id, "node-c");
    dep.heartbeat("node-c", LEASE, NodeLoad { bytes_used: 10, environments: 0 }).unwrap();
    let nodes = dep.nodes().unwrap();
    assert_eq!(choose_node(&nodes, reg.now_ms()).unwrap().node_id, "node-c");
    // Draining or expired nodes take nothing.
    dep.set_node_state("node-c", NodeState::Draining).unwrap();
    clock.advance_ms(11_000);
    dep.heartbeat("node-b", LEASE, NodeLoad::default()).unwrap();
    assert_eq!(dep.choose_node().unwrap().unwrap().node_id, "node-b");
    clock.advance_ms(11_000);
    assert_eq!(dep.choose_node().unwrap(), None);
}
