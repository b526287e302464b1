//! A scope provisioned and never used, across a restart: provisioning creates its metadata
//! database (and with it the first snapshot its shipper puts), so the next process answers its
//! mount from what the database noted at the handover instead of creating the database then.

use std::time::Duration;

use scopefs::engine::{Quota, Storage, StorageSettings};
use scopefs::limits::LimitsConfig;

use super::{harness_with, thread};

/// Metadata shipped (the default of a daemon): a new scope's database is then created at its first
/// use, which may restore it from the bucket.
fn shipping() -> StorageSettings {
    StorageSettings { metadata_sync: Some(Duration::from_millis(50)), ..StorageSettings::default() }
}

#[test]
fn a_provisioned_scope_nobody_used_is_answered_after_a_restart_without_opening_its_database() {
    let h = harness_with(LimitsConfig::default(), shipping());
    let scopes = &h.services.scopes;
    let (rec, _) = scopes.provision("op-1", &thread("t1")).unwrap();
    // The handover of a graceful restart: every open database commits and notes its usage.
    scopes.open_scopes().engine(&rec).unwrap().hand_over_metadata().unwrap();
    let next = Storage::new(h.store.clone(), shipping(), &h.tmp.join("data"), h._rt.handle().clone()).unwrap();
    let engine = next.open_scope_resumed(&rec.scope_id, Quota { bytes: 1 << 20, inodes: 100 }).unwrap();
    let usage = engine.usage_known().unwrap();
    assert!(usage.is_some(), "the restarted process had to open the database to answer the mount");
    assert!(engine.usage_if_open().unwrap().is_none(), "answered from the note, nothing opened");
    assert_eq!(engine.getattr(scopefs::engine::ROOT_INO).unwrap().ino, scopefs::engine::ROOT_INO);
    assert!(engine.usage_if_open().unwrap().is_none(), "the root's attributes come from the note too");
}
