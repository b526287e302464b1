//! SQL of `import_records`: the audit trail and idempotency of legacy imports (seed 000 §11.1).
//!
//! An import is reserved (`applying`) before its copy and completed after it, in separate
//! `BEGIN IMMEDIATE` transactions; the state change is checked against `import_state_transitions`.
//! The same idempotency key in the same scope returns the recorded import (a `completed` one is never
//! copied again); the key reused for a different source, target or mode is `OperationConflict`. A
//! copy that fails deletes its `applying` row (`abandon_import`), so the key can be retried.

use crate::registry::db::{params, Conn, OptionalExtension, Row};

use super::{to_i64, to_u64, validate_key, DeploymentRegistry, RegistryError};
use crate::ids::ScopeId;

/// State of an import record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportState {
    Applying,
    Completed,
}

impl ImportState {
    pub fn as_str(self) -> &'static str {
        match self {
            ImportState::Applying => "applying",
            ImportState::Completed => "completed",
        }
    }
}

/// What an import asks for (paths already normalized).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRequest {
    pub idempotency_key: String,
    pub source_path: String,
    pub target_path: String,
    pub overwrite: bool,
}

/// One row of `import_records`. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRecord {
    pub scope_id: ScopeId,
    pub request: ImportRequest,
    pub state: ImportState,
    pub size_bytes: Option<u64>,
    pub sha256: Option<String>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
}

/// The outcome of reserving an import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportBegin {
    /// A new `applying` record: copy, then `complete_import` (or `abandon_import` on failure).
    Reserved(ImportRecord),
    /// The key was used before for the same request: its record (`completed`, or `applying` if a
    /// copy is under way or was interrupted — the caller may redo it).
    Existing(ImportRecord),
}

const COLUMNS: &str = "scope_id, idempotency_key, source_path, target_path, overwrite, state, size_bytes, sha256, \
                       created_at, completed_at";

fn from_row(row: &Row<'_>) -> crate::registry::db::Result<Result<ImportRecord, RegistryError>> {
    let scope: String = row.get(0)?;
    let state: String = row.get(5)?;
    let size: Option<i64> = row.get(6)?;
    let build = || -> Result<ImportRecord, RegistryError> {
        Ok(ImportRecord {
            scope_id: ScopeId::parse(&scope)
                .map_err(|_| RegistryError::Corrupt("invalid scope_id in import_records".into()))?,
            request: ImportRequest {
                idempotency_key: row.get(1)?,
                source_path: row.get(2)?,
                target_path: row.get(3)?,
                overwrite: row.get::<_, i64>(4)? != 0,
            },
            state: match state.as_str() {
                "applying" => ImportState::Applying,
                "completed" => ImportState::Completed,
                other => return Err(RegistryError::Corrupt(format!("unknown import state {other:?}"))),
            },
            size_bytes: size.map(|s| to_u64(s, "size_bytes")).transpose()?,
            sha256: row.get(7)?,
            created_at: row.get(8)?,
            completed_at: row.get(9)?,
        })
    };
    Ok(build())
}

fn get_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    key: &str,
) -> Result<Option<ImportRecord>, RegistryError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM import_records WHERE deployment_id = ?1 AND scope_id = ?2 AND idempotency_key = ?3"
    );
    conn.query_row(&sql, params![deployment, scope.to_string(), key], from_row).optional()?.transpose()
}

impl DeploymentRegistry {
    /// Reserves an import under its idempotency key (unique per scope); see [`ImportBegin`].
    pub fn begin_import(&self, scope: &ScopeId, req: &ImportRequest) -> Result<ImportBegin, RegistryError> {
        let deployment = self.id.as_str();
        validate_key("idempotency_key", &req.idempotency_key)?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        if let Some(existing) = get_in(&tx, deployment, scope, &req.idempotency_key)? {
            return if existing.request == *req {
                Ok(ImportBegin::Existing(existing))
            } else {
                Err(RegistryError::OperationConflict)
            };
        }
        tx.execute(
            "INSERT INTO import_records (deployment_id, scope_id, idempotency_key, source_path, target_path,
                                         overwrite, state, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'applying', ?7)",
            params![
                deployment,
                scope.to_string(),
                req.idempotency_key,
                req.source_path,
                req.target_path,
                i64::from(req.overwrite),
                now
            ],
        )?;
        let rec = get_in(&tx, deployment, scope, &req.idempotency_key)?
            .ok_or_else(|| RegistryError::Corrupt("import record vanished".into()))?;
        tx.commit()?;
        Ok(ImportBegin::Reserved(rec))
    }

    /// Records a finished copy. Completing an already `completed` record with the same content is a
    /// no-op that returns it (two requests with one key may race); different content is a conflict.
    pub fn complete_import(
        &self,
        scope: &ScopeId,
        key: &str,
        size_bytes: u64,
        sha256: &str,
    ) -> Result<ImportRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let changed = tx.execute(
            "UPDATE import_records SET state = 'completed', size_bytes = ?1, sha256 = ?2, completed_at = ?3
             WHERE deployment_id = ?4 AND scope_id = ?5 AND idempotency_key = ?6
               AND EXISTS (SELECT 1 FROM import_state_transitions
                           WHERE from_state = import_records.state AND to_state = 'completed')",
            params![to_i64(size_bytes), sha256, now, deployment, scope.to_string(), key],
        )?;
        let rec = get_in(&tx, deployment, scope, key)?.ok_or(RegistryError::NotFound)?;
        if changed != 1 && rec.sha256.as_deref() != Some(sha256) {
            return Err(RegistryError::OperationConflict);
        }
        tx.commit()?;
        Ok(rec)
    }

    /// Deletes an `applying` record after a failed copy (a `completed` one is never removed).
    pub fn abandon_import(&self, scope: &ScopeId, key: &str) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        conn.execute(
            "DELETE FROM import_records
             WHERE deployment_id = ?1 AND scope_id = ?2 AND idempotency_key = ?3 AND state = 'applying'",
            params![deployment, scope.to_string(), key],
        )?;
        Ok(())
    }

    /// The imports of `scope`, oldest first, at most `limit` of them, after the one recorded under
    /// `after` (its idempotency key: the next page).
    pub fn list_imports(
        &self,
        scope: &ScopeId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ImportRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let start = match after {
            Some(key) => match get_in(&conn, deployment, scope, key)? {
                Some(r) => (r.created_at, key.to_string()),
                None => return Err(RegistryError::NotFound),
            },
            None => (i64::MIN, String::new()),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM import_records
             WHERE deployment_id = ?1 AND scope_id = ?2
               AND (created_at > ?3 OR (created_at = ?3 AND idempotency_key > ?4))
             ORDER BY created_at, idempotency_key LIMIT ?5"
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params![deployment, scope.to_string(), start.0, start.1, limit], from_row)?;
        rows.map(|r| r.map_err(RegistryError::from).and_then(|x| x)).collect()
    }

    /// The import recorded under `key` in `scope`, if any.
    pub fn get_import(&self, scope: &ScopeId, key: &str) -> Result<Option<ImportRecord>, RegistryError> {
        let deployment = self.id.as_str();
        get_in(&self.db.conn()?, deployment, scope, key)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ids::ThreadId;
    use crate::registry::Registry;

    fn setup() -> (Arc<Registry>, ScopeId) {
        let reg = Arc::new(Registry::open_for_tests().unwrap());
        let thread = ThreadId::parse("thread-imports").unwrap();
        let rec = reg.deployment("dep").create_scope(&thread, None).unwrap();
        (reg, rec.scope_id)
    }

    fn req(key: &str, source: &str) -> ImportRequest {
        ImportRequest {
            idempotency_key: key.into(),
            source_path: source.into(),
            target_path: "in/a.txt".into(),
            overwrite: false,
        }
    }

    #[test]
    fn same_key_returns_the_recorded_import() {
        let (reg, scope) = setup();
        let r = req("k1", "a.txt");
        let ImportBegin::Reserved(first) = reg.deployment("dep").begin_import(&scope, &r).unwrap() else {
            panic!("first use of a key reserves it")
        };
        assert_eq!(first.state, ImportState::Applying);
        let done = reg.deployment("dep").complete_import(&scope, "k1", 5, "abc").unwrap();
        assert_eq!(
            (done.state, done.size_bytes, done.sha256.as_deref()),
            (ImportState::Completed, Some(5), Some("abc"))
        );
        assert!(done.completed_at.is_some());
        match reg.deployment("dep").begin_import(&scope, &r).unwrap() {
            ImportBegin::Existing(rec) => assert_eq!(rec, done),
            other => panic!("expected the existing record, got {other:?}"),
        }
        // A racing second completion with the same content returns the record; other content conflicts.
        assert_eq!(reg.deployment("dep").complete_import(&scope, "k1", 5, "abc").unwrap(), done);
        assert!(matches!(
            reg.deployment("dep").complete_import(&scope, "k1", 6, "def"),
            Err(RegistryError::OperationConflict)
        ));
    }

    #[test]
    fn a_key_reused_for_another_request_conflicts() {
        let (reg, scope) = setup();
        reg.deployment("dep").begin_import(&scope, &req("k1", "a.txt")).unwrap();
        assert!(matches!(
            reg.deployment("dep").begin_import(&scope, &req("k1", "b.txt")),
            Err(RegistryError::OperationConflict)
        ));
        let mut other_mode = req("k1", "a.txt");
        other_mode.overwrite = true;
        assert!(matches!(
            reg.deployment("dep").begin_import(&scope, &other_mode),
            Err(RegistryError::OperationConflict)
        ));
    }

    #[test]
    fn keys_are_per_scope_and_validated() {
        let (reg, scope) = setup();
        let other =
            reg.deployment("dep").create_scope(&ThreadId::parse("thread-other").unwrap(), None).unwrap().scope_id;
        assert!(matches!(
            reg.deployment("dep").begin_import(&scope, &req("k1", "a.txt")).unwrap(),
            ImportBegin::Reserved(_)
        ));
        assert!(matches!(
            reg.deployment("dep").begin_import(&other, &req("k1", "b.txt")).unwrap(),
            ImportBegin::Reserved(_)
        ));
        assert!(matches!(
            reg.deployment("dep").begin_import(&scope, &req("bad key", "a.txt")),
            Err(RegistryError::Invalid { .. })
        ));
    }

    #[test]
    fn abandoning_frees_the_key_but_never_a_completed_record() {
        let (reg, scope) = setup();
        reg.deployment("dep").begin_import(&scope, &req("k1", "a.txt")).unwrap();
        reg.deployment("dep").abandon_import(&scope, "k1").unwrap();
        assert_eq!(reg.deployment("dep").get_import(&scope, "k1").unwrap(), None);
        assert!(matches!(
            reg.deployment("dep").begin_import(&scope, &req("k1", "b.txt")).unwrap(),
            ImportBegin::Reserved(_)
        ));
        reg.deployment("dep").complete_import(&scope, "k1", 1, "x").unwrap();
        reg.deployment("dep").abandon_import(&scope, "k1").unwrap();
        assert_eq!(reg.deployment("dep").get_import(&scope, "k1").unwrap().unwrap().state, ImportState::Completed);
    }

    #[test]
    fn unknown_scope_is_refused_by_the_foreign_key() {
        let (reg, _) = setup();
        assert!(reg.deployment("dep").begin_import(&ScopeId::generate(), &req("k1", "a.txt")).is_err());
    }
}
