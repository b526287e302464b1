//! SQL of `block_holds` and `scope_snapshots` (issue 23 item 5): which scope refers to which block
//! of another (forks and snapshots share blocks, never copy them), and the snapshots of a scope.

use std::collections::HashSet;

use crate::ids::ScopeId;
use crate::registry::db::{params, OptionalExtension, Row, ToSql};

use super::{validate_key, DeploymentRegistry, RegistryError};

/// Rows of one multi-row insert (three parameters each).
const HOLDS_PER_INSERT: usize = 300;

/// One snapshot of a scope. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct SnapshotRecord {
    pub snapshot_id: String,
    pub scope_id: ScopeId,
    /// The scope that keeps the snapshot's files (read-only, never mounted).
    pub snapshot_scope_id: ScopeId,
    pub created_at: i64,
}

fn snapshot_row(r: &Row<'_>) -> crate::registry::db::Result<Result<SnapshotRecord, RegistryError>> {
    let (scope, snap): (String, String) = (r.get("scope_id")?, r.get("snapshot_scope_id")?);
    let (snapshot_id, created_at) = (r.get("snapshot_id")?, r.get("created_at")?);
    let parse = |s: &str| ScopeId::parse(s).map_err(|_| RegistryError::Corrupt("scope id in scope_snapshots".into()));
    Ok((|| Ok(SnapshotRecord { snapshot_id, scope_id: parse(&scope)?, snapshot_scope_id: parse(&snap)?, created_at }))(
    ))
}

const SNAPSHOT_COLUMNS: &str = "snapshot_id, scope_id, snapshot_scope_id, created_at";

impl DeploymentRegistry {
    /// The scope `scope` was made a copy of (`provision_fork`), if any.
    pub fn forked_from(&self, scope: &ScopeId) -> Result<Option<ScopeId>, RegistryError> {
        let parent: Option<String> = self
            .db
            .conn()?
            .query_row(
                "SELECT parent_scope_id FROM scope_forks WHERE deployment_id = ?1 AND scope_id = ?2",
                params![self.id(), scope.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        parent.map(|p| ScopeId::parse(&p).map_err(|_| RegistryError::Corrupt("parent scope id".into()))).transpose()
    }

    /// Records that `holder` refers to each `(home, sha)` block (a fork or a snapshot made now).
    pub fn hold_blocks(&self, holder: &ScopeId, blocks: &[(String, String)]) -> Result<(), RegistryError> {
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let (dep, holder) = (self.id().to_string(), holder.as_str().to_string());
        for chunk in blocks.chunks(HOLDS_PER_INSERT) {
            let mut sql =
                String::from("INSERT INTO block_holds (deployment_id, home_scope, sha256, holder_scope) VALUES ");
            let mut args: Vec<&dyn ToSql> = vec![&dep, &holder];
            for (i, (home, sha)) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("(?1, ?{}, ?{}, ?2)", 3 + 2 * i, 4 + 2 * i));
                args.push(home);
                args.push(sha);
            }
            sql.push_str(" ON CONFLICT DO NOTHING");
            tx.execute(&sql, args.as_slice())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Whether any scope refers to `home`'s block `sha`.
    pub fn block_held(&self, home: &str, sha: &str) -> Result<bool, RegistryError> {
        let held: Option<i64> = self
            .db
            .conn()?
            .query_row(
                "SELECT 1 FROM block_holds WHERE deployment_id = ?1 AND home_scope = ?2 AND sha256 = ?3 LIMIT 1",
                params![self.id(), home, sha],
                |r| r.get(0),
            )
            .optional()?;
        Ok(held.is_some())
    }

    /// `home`'s blocks that other scopes refer to.
    pub fn held_blocks(&self, home: &str) -> Result<HashSet<String>, RegistryError> {
        let conn = self.db.conn()?;
        let rows = conn.query_rows(
            "SELECT DISTINCT sha256 FROM block_holds WHERE deployment_id = ?1 AND home_scope = ?2",
            params![self.id(), home],
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect::<Result<_, _>>()?)
    }

    /// The blocks of other scopes `holder` refers to: (home, sha).
    pub fn holds_of(&self, holder: &ScopeId) -> Result<Vec<(String, String)>, RegistryError> {
        let conn = self.db.conn()?;
        let rows = conn.query_rows(
            "SELECT home_scope, sha256 FROM block_holds WHERE deployment_id = ?1 AND holder_scope = ?2
             ORDER BY home_scope, sha256",
            params![self.id(), holder.as_str()],
        )?;
        Ok(rows.iter().map(|r| Ok((r.get(0)?, r.get(1)?))).collect::<Result<_, crate::registry::db::DbError>>()?)
    }

    /// `holder` no longer refers to `home`'s block `sha`. `true` when no scope does any more and
    /// `home` was purged (or is unknown): nobody else will delete the object, so the caller does.
    pub fn release_block(&self, holder: &str, home: &str, sha: &str) -> Result<bool, RegistryError> {
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "DELETE FROM block_holds WHERE deployment_id = ?1 AND home_scope = ?2 AND sha256 = ?3 AND holder_scope = ?4",
            params![self.id(), home, sha, holder],
        )?;
        let others: i64 = tx.query_row(
            "SELECT COUNT(*) FROM block_holds WHERE deployment_id = ?1 AND home_scope = ?2 AND sha256 = ?3",
            params![self.id(), home, sha],
            |r| r.get(0),
        )?;
        let home_keeps: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM scopes WHERE deployment_id = ?1 AND scope_id = ?2 AND purged_at IS NULL",
                params![self.id(), home],
                |r| r.get(0),
            )
            .optional()?;
        tx.commit()?;
        Ok(others == 0 && home_keeps.is_none())
    }

    /// Records snapshot `snapshot_id` of `scope`, kept by `snapshot_scope`.
    pub fn record_snapshot(
        &self,
        scope: &ScopeId,
        snapshot_id: &str,
        snapshot_scope: &ScopeId,
    ) -> Result<SnapshotRecord, RegistryError> {
        validate_key("snapshot_id", snapshot_id)?;
        let conn = self.db.conn()?;
        conn.execute(
            "INSERT INTO scope_snapshots (deployment_id, snapshot_id, scope_id, snapshot_scope_id, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![self.id(), snapshot_id, scope.as_str(), snapshot_scope.as_str(), self.now_ms()],
        )
        .map_err(|e| if e.is_constraint() { RegistryError::OperationConflict } else { e.into() })?;
        drop(conn);
        self.snapshot(snapshot_id)?.ok_or_else(|| RegistryError::Corrupt("new snapshot".into()))
    }

    /// One snapshot.
    pub fn snapshot(&self, snapshot_id: &str) -> Result<Option<SnapshotRecord>, RegistryError> {
        let sql =
            format!("SELECT {SNAPSHOT_COLUMNS} FROM scope_snapshots WHERE deployment_id = ?1 AND snapshot_id = ?2");
        self.db.conn()?.query_row(&sql, params![self.id(), snapshot_id], snapshot_row).optional()?.transpose()
    }

    /// The snapshots of `scope`, oldest first.
    pub fn snapshots(&self, scope: &ScopeId) -> Result<Vec<SnapshotRecord>, RegistryError> {
        let sql = format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM scope_snapshots WHERE deployment_id = ?1 AND scope_id = ?2
             ORDER BY created_at, snapshot_id"
        );
        let conn = self.db.conn()?;
        let rows = conn.query_rows(&sql, params![self.id(), scope.as_str()])?;
        rows.iter().map(|r| snapshot_row(r)?).collect()
    }

    /// The scopes that keep snapshots (never mounted).
    pub fn snapshot_scopes(&self) -> Result<HashSet<ScopeId>, RegistryError> {
        let conn = self.db.conn()?;
        let rows = conn
            .query_rows("SELECT snapshot_scope_id FROM scope_snapshots WHERE deployment_id = ?1", params![self.id()])?;
        rows.iter()
            .map(|r| {
                let s: String = r.get(0)?;
                ScopeId::parse(&s).map_err(|_| RegistryError::Corrupt("snapshot scope id".into()))
            })
            .collect()
    }
}
