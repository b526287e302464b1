//! Views of other scopes over the fake mounter (`services::peers`, seed 003 §3.7).

use scopefs::limits::LimitsConfig;
use scopefs::registry::ScopeState;

use super::{harness, thread};
use crate::services::peers::{mount_views, resolve, View, ViewGrant};
use crate::services::{ProvisionBy, ServiceError};
use scopefs::ids::ThreadId;

/// Views of other scopes (`services::peers`, seed 003 §3.7): a tool request binds an unowned scope
/// to its user and is refused (like an unknown thread) in another user's; `/threads/{id}` resolves
/// only to a draft/active scope of the same user; the global store is created once per user
/// under its reserved thread, and mounted for containers read-only unless granted writable.
#[test]
fn peer_views_are_per_user_and_the_global_store_is_made_once() {
    let h = harness(LimitsConfig::default());
    let (files, open) = (&h.services.files, h.services.scopes.open_scopes());
    let (a, _) =
        h.services.scopes.provision_for_user("op-a", &thread("ta"), Some("u1"), ProvisionBy::default()).unwrap();
    let (b, _) = h.services.scopes.provision("op-b", &thread("tb")).unwrap();
    let (c, _) =
        h.services.scopes.provision_for_user("op-c", &thread("tc"), Some("u2"), ProvisionBy::default()).unwrap();
    assert_eq!(a.user_id.as_deref(), Some("u1"));
    let view = |t: &str| View::Thread(thread(t));
    assert!(matches!(resolve(&h.registry, open, "u1", &view("tb")), Err(ServiceError::ScopeNotFound)), "unowned");
    files.tool_scope(&thread("tb"), "u1").unwrap();
    assert!(matches!(files.tool_scope(&thread("tb"), "u2"), Err(ServiceError::ScopeNotFound)), "another user");
    assert!(matches!(files.tool_scope(&thread("tc"), "u1"), Err(ServiceError::ScopeNotFound)));
    assert_eq!(resolve(&h.registry, open, "u1", &view("tb")).unwrap().scope_id, b.scope_id);
    assert!(matches!(resolve(&h.registry, open, "u1", &view("tc")), Err(ServiceError::ScopeNotFound)));
    assert!(matches!(resolve(&h.registry, open, "u2", &view("tb")), Err(ServiceError::ScopeNotFound)));
    assert!(matches!(resolve(&h.registry, open, "u1", &view("nope")), Err(ServiceError::ScopeNotFound)));
    assert!(matches!(
        h.services.scopes.provision_for_user("op-c2", &thread("tc"), Some("u1"), ProvisionBy::default()),
        Err(ServiceError::ScopeNotFound)
    ));

    let g1 = resolve(&h.registry, open, "u1", &View::Global).unwrap();
    assert_eq!((g1.state, g1.user_id.as_deref()), (ScopeState::Active, Some("u1")), "a draft would expire");
    assert_eq!(g1.primary_thread_id, ThreadId::global_store("u1"));
    assert_eq!(resolve(&h.registry, open, "u1", &View::Global).unwrap().scope_id, g1.scope_id, "made once");
    let g2 = resolve(&h.registry, open, "u2", &View::Global).unwrap();
    assert_ne!(g2.scope_id, g1.scope_id, "one store per user");
    assert_ne!(g2.scope_id, c.scope_id);

    let grant = |view: View, writable| ViewGrant { view, writable };
    let ro = |views: &[View]| views.iter().map(|v| grant(v.clone(), false)).collect::<Vec<_>>();
    let binds = mount_views(&h.registry, open, "u1", &ro(&[view("tb"), View::Global, view("tb")])).unwrap();
    let targets: Vec<(&str, bool)> = binds.mounts.iter().map(|v| (v.target.as_str(), v.read_only)).collect();
    assert_eq!(targets, vec![("/threads/tb", true), ("/__global__", true)], "each view once, read-only");
    assert!(binds.writable_global.is_none());
    assert!(mount_views(&h.registry, open, "u1", &ro(&[view("tb"), view("tc")])).is_err(), "all or nothing");
    // Granted writable: the global store only; a thread stays read-only whatever the grant says.
    let rw = [grant(view("tb"), true), grant(View::Global, true)];
    let binds = mount_views(&h.registry, open, "u1", &rw).unwrap();
    let targets: Vec<(&str, bool)> = binds.mounts.iter().map(|v| (v.target.as_str(), v.read_only)).collect();
    assert_eq!(targets, vec![("/threads/tb", true), ("/__global__", false)]);
    assert_eq!(binds.writable_global.map(|r| r.scope_id), Some(g1.scope_id));
}
