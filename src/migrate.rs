//! Applies embedded SQL migrations to a SQLite database by `PRAGMA user_version`; refuses newer databases.

use rusqlite::Connection;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("database schema version {found} is newer than this binary supports ({supported}); refusing to open it")]
    NewerDatabase { found: i64, supported: i64 },
    #[error("migration {version} failed: {source}")]
    Failed { version: i64, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("reading the schema version failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// One migration: its version (1, 2, ...) and its SQL.
pub struct Migration {
    pub version: i64,
    pub sql: &'static str,
}

/// Registry (control database) migrations, from `migrations/registry/`.
pub const REGISTRY: &[Migration] = &[
    Migration { version: 1, sql: include_str!("../migrations/registry/0001_scopes.sql") },
    Migration { version: 2, sql: include_str!("../migrations/registry/0002_owners_runs_leases.sql") },
    Migration { version: 3, sql: include_str!("../migrations/registry/0003_import_records.sql") },
    Migration { version: 4, sql: include_str!("../migrations/registry/0004_auth_nonces.sql") },
    Migration { version: 5, sql: include_str!("../migrations/registry/0005_environments.sql") },
    Migration { version: 6, sql: include_str!("../migrations/registry/0006_billing.sql") },
    Migration { version: 7, sql: include_str!("../migrations/registry/0007_environment_outputs.sql") },
    Migration { version: 8, sql: include_str!("../migrations/registry/0008_operations_sagas.sql") },
    Migration { version: 9, sql: include_str!("../migrations/registry/0009_scope_users.sql") },
    Migration { version: 10, sql: include_str!("../migrations/registry/0010_nodes.sql") },
    Migration { version: 11, sql: include_str!("../migrations/registry/0011_forks.sql") },
    Migration { version: 12, sql: include_str!("../migrations/registry/0012_usage_reported.sql") },
    Migration { version: 13, sql: include_str!("../migrations/registry/0013_prices_adjustments_audit.sql") },
    Migration { version: 14, sql: include_str!("../migrations/registry/0014_artifact_snapshots.sql") },
];

/// The same registry on PostgreSQL, from `migrations/registry-postgres/` (one file per SQLite
/// file, same version numbers, PostgreSQL's types).
pub const REGISTRY_POSTGRES: &[Migration] = &[
    Migration { version: 1, sql: include_str!("../migrations/registry-postgres/0001_scopes.sql") },
    Migration { version: 2, sql: include_str!("../migrations/registry-postgres/0002_owners_runs_leases.sql") },
    Migration { version: 3, sql: include_str!("../migrations/registry-postgres/0003_import_records.sql") },
    Migration { version: 4, sql: include_str!("../migrations/registry-postgres/0004_auth_nonces.sql") },
    Migration { version: 5, sql: include_str!("../migrations/registry-postgres/0005_environments.sql") },
    Migration { version: 6, sql: include_str!("../migrations/registry-postgres/0006_billing.sql") },
    Migration { version: 7, sql: include_str!("../migrations/registry-postgres/0007_environment_outputs.sql") },
    Migration { version: 8, sql: include_str!("../migrations/registry-postgres/0008_operations_sagas.sql") },
    Migration { version: 9, sql: include_str!("../migrations/registry-postgres/0009_scope_users.sql") },
    Migration { version: 10, sql: include_str!("../migrations/registry-postgres/0010_nodes.sql") },
    Migration { version: 11, sql: include_str!("../migrations/registry-postgres/0011_forks.sql") },
    Migration { version: 12, sql: include_str!("../migrations/registry-postgres/0012_usage_reported.sql") },
    Migration { version: 13, sql: include_str!("../migrations/registry-postgres/0013_prices_adjustments_audit.sql") },
    Migration { version: 14, sql: include_str!("../migrations/registry-postgres/0014_artifact_snapshots.sql") },
];

/// Per-scope metadata migrations, from `migrations/scope/`.
pub const SCOPE_META: &[Migration] = &[
    Migration { version: 1, sql: include_str!("../migrations/scope/0001_namespace.sql") },
    Migration { version: 2, sql: include_str!("../migrations/scope/0002_children_by_inode.sql") },
    Migration { version: 3, sql: include_str!("../migrations/scope/0003_symlink_bytes.sql") },
    Migration { version: 4, sql: include_str!("../migrations/scope/0004_hard_links_devices.sql") },
    Migration { version: 5, sql: include_str!("../migrations/scope/0005_xattrs.sql") },
    Migration { version: 6, sql: include_str!("../migrations/scope/0006_inline_journal.sql") },
    Migration { version: 7, sql: include_str!("../migrations/scope/0007_subdir_counts.sql") },
    Migration { version: 8, sql: include_str!("../migrations/scope/0008_redo_state.sql") },
    Migration { version: 9, sql: include_str!("../migrations/scope/0009_redo_v2.sql") },
    Migration { version: 10, sql: include_str!("../migrations/scope/0010_ship_seq.sql") },
    Migration { version: 11, sql: include_str!("../migrations/scope/0011_block_homes.sql") },
    Migration { version: 12, sql: include_str!("../migrations/scope/0012_gc_deleting.sql") },
    Migration { version: 13, sql: include_str!("../migrations/scope/0013_block_key_epochs.sql") },
];

/// The pack database of a local object directory (its small objects), from `migrations/store/`.
pub const STORE_PACK: &[Migration] =
    &[Migration { version: 1, sql: include_str!("../migrations/store/0001_packed_objects.sql") }];

/// Brings `conn` up to the newest version in `migrations`, each step in its own transaction.
pub fn apply(conn: &mut Connection, migrations: &[Migration]) -> Result<i64, MigrateError> {
    let supported = migrations.last().map(|m| m.version).unwrap_or(0);
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > supported {
        return Err(MigrateError::NewerDatabase { found, supported });
    }
    for m in migrations.iter().filter(|m| m.version > found) {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|source| MigrateError::Failed { version: m.version, source: Box::new(source) })?;
        tx.execute_batch(m.sql)
            .and_then(|_| tx.pragma_update(None, "user_version", m.version))
            .and_then(|_| tx.commit())
            .map_err(|source| MigrateError::Failed { version: m.version, source: Box::new(source) })?;
    }
    Ok(supported)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &[Migration] = &[
        Migration { version: 1, sql: "CREATE TABLE a (x INTEGER);" },
        Migration { version: 2, sql: "CREATE TABLE b (y INTEGER);" },
    ];

    #[test]
    fn applies_in_order_and_is_idempotent() {
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(apply(&mut c, &TWO[..1]).unwrap(), 1);
        assert_eq!(apply(&mut c, TWO).unwrap(), 2);
        assert_eq!(apply(&mut c, TWO).unwrap(), 2);
        c.execute("INSERT INTO b VALUES (1)", []).unwrap();
    }

    #[test]
    fn refuses_a_newer_database() {
        let mut c = Connection::open_in_memory().unwrap();
        apply(&mut c, TWO).unwrap();
        match apply(&mut c, &TWO[..1]) {
            Err(MigrateError::NewerDatabase { found: 2, supported: 1 }) => {}
            other => panic!("expected NewerDatabase, got {other:?}"),
        }
    }

    #[test]
    fn failed_migration_leaves_version_unchanged() {
        let mut c = Connection::open_in_memory().unwrap();
        let bad = [Migration { version: 1, sql: "CREATE TABLE a (x); NOT SQL;" }];
        assert!(apply(&mut c, &bad).is_err());
        let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v, 0);
    }

    /// Registry 0012 rebuilds `compute_usage_log` (SQLite cannot change a CHECK): the rows of a
    /// version-11 database, their ids and the id sequence survive, and `reported` is allowed.
    #[test]
    fn the_usage_log_rebuild_keeps_rows_and_ids() {
        let mut c = Connection::open_in_memory().unwrap();
        apply(&mut c, &REGISTRY[..11]).unwrap();
        let insert =
            "INSERT INTO compute_usage_log (environment_id, user_id, thread_id, runtime_seconds, compute_minutes,
                      artifacts_state, created_at) VALUES (?1, 'u', 't', 60, 1, 'none', 1)";
        c.execute(insert, ["e1"]).unwrap();
        c.execute(insert, ["e2"]).unwrap();
        c.execute("DELETE FROM compute_usage_log WHERE environment_id = 'e2'", []).unwrap();
        assert_eq!(apply(&mut c, &REGISTRY[..12]).unwrap(), 12);
        c.execute(insert, ["e3"]).unwrap();
        let ids: Vec<(i64, String)> = c
            .prepare("SELECT usage_id, environment_id FROM compute_usage_log ORDER BY usage_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ids, vec![(1, "e1".to_string()), (3, "e3".to_string())], "an id is never reused");
        c.execute("UPDATE compute_usage_log SET settlement_status = 'reported', settled_at = 2 WHERE usage_id = 1", [])
            .unwrap();
        let no_ledger = "UPDATE compute_usage_log SET settlement_status = 'settled', settled_at = 2 WHERE usage_id = 3";
        assert!(c.execute(no_ledger, []).is_err(), "settled here still needs its ledger row");
    }

    #[test]
    fn embedded_migrations_are_numbered_one_by_one_in_order() {
        // `apply` runs them in list order and records the last: a gap or a swap would skip one.
        for list in [REGISTRY, SCOPE_META] {
            let versions: Vec<i64> = list.iter().map(|m| m.version).collect();
            assert_eq!(versions, (1..=list.len() as i64).collect::<Vec<_>>());
        }
    }
}
