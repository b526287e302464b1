//! Unit tests of the registry: file setup, schema refusal, scope state machine, CAS and idempotent provisioning.

use std::os::unix::fs::PermissionsExt;

use super::*;

const DEP: &str = "dep-a";

fn thread(s: &str) -> ThreadId {
    ThreadId::parse(s).unwrap()
}

/// The transitions the product allows (SPEC §4), written independently of the SQL table.
fn allowed(from: ScopeState, to: ScopeState) -> bool {
    use ScopeState::*;
    matches!(
        (from, to),
        (Provisioning, Draft) | (Draft, Active) | (Draft, Deleting) | (Active, Deleting) | (Deleting, Deleted)
    )
}

/// Brings a fresh scope to `state` along allowed transitions.
fn scope_in(reg: &Arc<Registry>, name: &str, state: ScopeState) -> ScopeRecord {
    use ScopeState::*;
    let mut rec = reg.deployment(DEP).create_scope(&thread(name), None).unwrap();
    let path: &[ScopeState] = match state {
        Provisioning => &[],
        Draft => &[Draft],
        Active => &[Draft, Active],
        Deleting => &[Draft, Active, Deleting],
        Deleted => &[Draft, Active, Deleting, Deleted],
    };
    for &to in path {
        rec = reg.deployment(DEP).transition(&rec.scope_id, rec.revision, to).unwrap();
    }
    assert_eq!(rec.state, state);
    rec
}

#[test]
fn open_creates_private_dir_and_file_and_reopens() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("control/registry.sqlite3");
    let reg = Arc::new(Registry::open(&path).unwrap());
    assert_eq!(reg.schema_version(), crate::migrate::REGISTRY.last().unwrap().version);
    assert!(reg.schema_version() >= 2);
    let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
    let file_mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    assert_eq!(file_mode, 0o600);
    let rec = reg.deployment(DEP).create_scope(&thread("t1"), None).unwrap();
    drop(reg);
    let reg = Arc::new(Registry::open(&path).unwrap());
    assert_eq!(reg.deployment(DEP).get(&rec.scope_id).unwrap(), Some(rec));
    let conn = reg.db.conn().unwrap();
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    let fk: i64 = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0)).unwrap();
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
    assert_eq!((mode.as_str(), fk, sync), ("wal", 1, 2));
}

#[test]
fn refuses_a_newer_database() {
    let tmp = tempfile::tempdir().unwrap();
    let place = super::test_backend::new_place(tmp.path());
    let reg = super::test_backend::open_place(&place).unwrap();
    match place.strip_prefix("pg:") {
        Some(_) => {
            reg.db.conn().unwrap().execute("UPDATE scopefs_schema_version SET version = ?1", [99]).unwrap();
        }
        None => {
            let conn = rusqlite::Connection::open(&place).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }
    }
    drop(reg);
    match super::test_backend::open_place(&place) {
        Err(RegistryError::Migrate(MigrateError::NewerDatabase { found: 99, .. })) => {}
        Err(RegistryError::Postgres(super::PgOpenError::Migrate(MigrateError::NewerDatabase {
            found: 99, ..
        }))) => {}
        Err(other) => panic!("expected NewerDatabase, got {other:?}"),
        Ok(_) => panic!("a newer database was opened"),
    }
}

#[test]
fn create_find_get_list() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let q = Quota { bytes: 1 << 20, inodes: 100 };
    let a = reg.deployment(DEP).create_scope(&thread("thread-a"), Some(q)).unwrap();
    let b = reg.deployment(DEP).create_scope(&thread("thread-b"), None).unwrap();
    assert_eq!((a.state, a.revision, a.quota), (ScopeState::Provisioning, 1, Some(q)));
    assert_eq!(b.quota, None);
    assert_eq!(b.quota_or(q), q);
    assert_eq!(reg.deployment(DEP).find_by_thread(&thread("thread-a")).unwrap(), Some(a.clone()));
    assert_eq!(reg.deployment(DEP).find_by_thread(&thread("nobody")).unwrap(), None);
    assert_eq!(reg.deployment("other-dep").find_by_thread(&thread("thread-a")).unwrap(), None);
    assert_eq!(reg.deployment(DEP).get(&b.scope_id).unwrap(), Some(b.clone()));
    assert_eq!(reg.deployment("other-dep").get(&b.scope_id).unwrap(), None);
    assert_eq!(reg.deployment(DEP).list().unwrap(), vec![a, b]);
    assert!(reg.deployment("other-dep").list().unwrap().is_empty());
}

#[test]
fn one_scope_per_thread_per_deployment() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let a = reg.deployment(DEP).create_scope(&thread("t"), None).unwrap();
    match reg.deployment(DEP).create_scope(&thread("t"), None) {
        Err(RegistryError::ThreadAlreadyBound(id)) => assert_eq!(id, a.scope_id),
        other => panic!("expected ThreadAlreadyBound, got {other:?}"),
    }
    let other = reg.deployment("dep-b").create_scope(&thread("t"), None).unwrap();
    assert_ne!(other.scope_id, a.scope_id);
    assert_eq!(reg.deployment(DEP).list().unwrap().len(), 1);
}

#[test]
fn every_transition_is_allowed_or_refused_as_specified() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let mut n = 0;
    for &from in ScopeState::ALL {
        for &to in ScopeState::ALL {
            n += 1;
            let rec = scope_in(&reg, &format!("t{n}"), from);
            assert_eq!(reg.transition_allowed(from, to).unwrap(), allowed(from, to), "{from} -> {to}");
            let result = reg.deployment(DEP).transition(&rec.scope_id, rec.revision, to);
            let after = reg.deployment(DEP).get(&rec.scope_id).unwrap().unwrap();
            if allowed(from, to) {
                let new = result.unwrap_or_else(|e| panic!("{from} -> {to} refused: {e}"));
                assert_eq!((new.state, new.revision), (to, rec.revision + 1), "{from} -> {to}");
                assert_eq!(after, new);
                assert_eq!(new.deleted_at.is_some(), to == ScopeState::Deleted);
            } else {
                match result {
                    Err(e @ RegistryError::Conflict { .. }) => assert!(!e.is_stale_revision(), "{from} -> {to}"),
                    other => panic!("{from} -> {to}: expected Conflict, got {other:?}"),
                }
                assert_eq!(after, rec, "a refused transition changed the row");
            }
        }
    }
}

#[test]
fn stale_revision_is_a_conflict_and_changes_nothing() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let rec = scope_in(&reg, "t", ScopeState::Draft);
    let err = reg.deployment(DEP).transition(&rec.scope_id, rec.revision - 1, ScopeState::Active).unwrap_err();
    match &err {
        RegistryError::Conflict { expected_revision, current_revision, current_state, requested } => {
            assert_eq!(*expected_revision, rec.revision - 1);
            assert_eq!(*current_revision, rec.revision);
            assert_eq!(*current_state, ScopeState::Draft);
            assert_eq!(*requested, ScopeState::Active);
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(err.is_stale_revision());
    assert_eq!(reg.deployment(DEP).get(&rec.scope_id).unwrap(), Some(rec.clone()));
    // The same CAS with the right revision succeeds exactly once.
    reg.deployment(DEP).transition(&rec.scope_id, rec.revision, ScopeState::Active).unwrap();
    assert!(reg.deployment(DEP).transition(&rec.scope_id, rec.revision, ScopeState::Active).is_err());
}

#[test]
fn transition_of_unknown_scope_is_not_found() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let rec = scope_in(&reg, "t", ScopeState::Draft);
    let missing = ScopeId::generate();
    assert!(matches!(reg.deployment(DEP).transition(&missing, 1, ScopeState::Active), Err(RegistryError::NotFound)));
    assert!(matches!(
        reg.deployment("other-dep").transition(&rec.scope_id, rec.revision, ScopeState::Active),
        Err(RegistryError::NotFound)
    ));
}

#[test]
fn provision_is_idempotent_on_operation_and_thread() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let first = reg.deployment(DEP).provision("op-1", &thread("t"), None).unwrap();
    assert!(first.created);
    assert_eq!(first.scope.state, ScopeState::Provisioning);
    let again = reg.deployment(DEP).provision("op-1", &thread("t"), None).unwrap();
    assert_eq!((again.scope.scope_id.clone(), again.created), (first.scope.scope_id.clone(), false));
    let other_op = reg.deployment(DEP).provision("op-2", &thread("t"), None).unwrap();
    assert_eq!((other_op.scope.scope_id.clone(), other_op.created), (first.scope.scope_id.clone(), false));
    assert!(matches!(reg.deployment(DEP).provision("op-1", &thread("u"), None), Err(RegistryError::OperationConflict)));
    let open = reg.deployment(DEP).open_operations().unwrap();
    let ids: Vec<_> = open.iter().map(|o| o.operation_id.as_str()).collect();
    assert_eq!(ids, ["op-1", "op-2"]);
    assert!(open
        .iter()
        .all(|o| o.state == OperationState::Applying && o.scope_id.as_ref() == Some(&first.scope.scope_id)));

    let done = reg.deployment(DEP).complete_provision(&first.scope.scope_id).unwrap();
    assert_eq!((done.state, done.revision), (ScopeState::Draft, 2));
    assert!(reg.deployment(DEP).open_operations().unwrap().is_empty());
    // Finishing twice is harmless; later provisions of the thread are recorded as completed at once.
    assert_eq!(reg.deployment(DEP).complete_provision(&first.scope.scope_id).unwrap(), done);
    let late = reg.deployment(DEP).provision("op-3", &thread("t"), None).unwrap();
    assert_eq!((late.scope, late.created), (done, false));
    assert!(reg.deployment(DEP).open_operations().unwrap().is_empty());
    // Operation ids are per deployment.
    let elsewhere = reg.deployment("dep-b").provision("op-1", &thread("u"), None).unwrap();
    assert!(elsewhere.created);
}

#[test]
fn failed_provision_stays_open_and_can_be_completed() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    let p = reg.deployment(DEP).provision("op-1", &thread("t"), None).unwrap();
    reg.deployment(DEP).fail_provision(&p.scope.scope_id, "mount_failed").unwrap();
    let open = reg.deployment(DEP).open_operations().unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].state, open[0].last_error_code.as_deref()), (OperationState::Failed, Some("mount_failed")));
    assert_eq!(reg.deployment(DEP).get(&p.scope.scope_id).unwrap().unwrap().state, ScopeState::Provisioning);
    let done = reg.deployment(DEP).complete_provision(&p.scope.scope_id).unwrap();
    assert_eq!(done.state, ScopeState::Draft);
    assert!(reg.deployment(DEP).open_operations().unwrap().is_empty());
}

#[test]
fn complete_provision_of_unknown_scope_is_not_found() {
    let reg = Arc::new(Registry::open_for_tests().unwrap());
    assert!(matches!(reg.deployment(DEP).complete_provision(&ScopeId::generate()), Err(RegistryError::NotFound)));
}

/// A scope belongs to the first user bound to it; binding another user later changes nothing, and
/// the user survives reopening (migration 9). Reserved global-store threads are stored and read.
#[test]
fn scopes_belong_to_their_first_user() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.db");
    let reg = Arc::new(Registry::open(&path).unwrap());
    let dep = reg.deployment(DEP);
    let rec = dep.create_scope(&thread("t-user"), None).unwrap();
    assert_eq!(rec.user_id, None, "no user until one is named");
    assert_eq!(dep.bind_scope_user(&rec.scope_id, "user-1").unwrap(), "user-1");
    assert_eq!(dep.bind_scope_user(&rec.scope_id, "user-2").unwrap(), "user-1", "the first user stays");
    assert!(matches!(dep.bind_scope_user(&ScopeId::generate(), "user-1"), Err(RegistryError::NotFound)));
    let global = dep.create_scope(&ThreadId::global_store("user-1"), None).unwrap();
    drop(dep);
    drop(reg);
    let reg = Arc::new(Registry::open(&path).unwrap());
    let dep = reg.deployment(DEP);
    assert_eq!(dep.get(&rec.scope_id).unwrap().unwrap().user_id.as_deref(), Some("user-1"));
    let again = dep.find_by_thread(&ThreadId::global_store("user-1")).unwrap().unwrap();
    assert_eq!(again.scope_id, global.scope_id);
    assert!(again.primary_thread_id.is_global_store());
}

/// The PostgreSQL migrations spell the same schema as the SQLite ones: same versions, and (on the
/// PostgreSQL run) the same tables with the same columns.
#[test]
fn both_backends_have_the_same_schema() {
    let versions = |m: &[crate::migrate::Migration]| m.iter().map(|m| m.version).collect::<Vec<_>>();
    assert_eq!(versions(crate::migrate::REGISTRY), versions(crate::migrate::REGISTRY_POSTGRES));
    let columns = |reg: &Registry, sql: &str| -> Vec<(String, String)> {
        let conn = reg.db.conn().unwrap();
        let mut out: Vec<(String, String)> =
            conn.query_rows(sql, []).unwrap().iter().map(|r| (r.get(0).unwrap(), r.get(1).unwrap())).collect();
        out.sort();
        out
    };
    let sqlite = Registry::open_in_memory().unwrap();
    let expected = columns(
        &sqlite,
        "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p WHERE m.type = 'table' AND m.name <> 'sqlite_sequence'",
    );
    assert!(expected.iter().any(|(t, c)| t == "wallet_ledger" && c == "entry_id"));
    let reg = Registry::open_for_tests().unwrap();
    if reg.backend_name() == "postgres" {
        let found = columns(
            &reg,
            "SELECT table_name::text, column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name <> 'scopefs_schema_version'",
        );
        assert_eq!(found, expected);
        // The state machines are data: both hold the same transitions.
        for (table, _) in expected.iter().filter(|(t, c)| t.ends_with("_transitions") && c == "from_state") {
            let sql = format!("SELECT from_state, to_state FROM {table}");
            assert_eq!(columns(&reg, &sql), columns(&sqlite, &sql), "{table}");
        }
    }
}
