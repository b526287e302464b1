//! SQL of `scope_operations`: idempotent provisioning keyed by `operation_id`, completion and failure;
//! the shared helpers of every saga kind (compensation and recovery are in `sagas`).
//!
//! Provisioning is a saga: `provision` records the scope (`provisioning`) and an
//! `applying` operation in one transaction; the caller then creates the scope's
//! filesystem and mount and calls `complete_provision`, which moves the scope to
//! `draft` and the operation to `completed` together. A crash in between leaves
//! an open operation and a `provisioning` scope, which the daemon finishes at
//! startup (or on the next request for the same operation or thread), or compensates (`sagas`).

use std::fmt;
use std::str::FromStr;

use crate::registry::db::{params, Conn, OptionalExtension};

use super::leases::refuse_unless_holder_in;
use super::owners::insert_primary_owner_in;
use super::scopes::{find_by_thread_in, get_in, insert_in, transition_in};
use super::{DeploymentRegistry, RegistryError, ScopeRecord, ScopeState};
use crate::engine::Quota;
use crate::ids::{ScopeId, ThreadId};

/// State of an operation: `reserved → applying → completed`, or `… → compensating → compensated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationState {
    Reserved,
    Applying,
    Completed,
    Failed,
    Compensating,
    Compensated,
}

impl OperationState {
    pub const ALL: [OperationState; 6] = [
        OperationState::Reserved,
        OperationState::Applying,
        OperationState::Completed,
        OperationState::Failed,
        OperationState::Compensating,
        OperationState::Compensated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::Reserved => "reserved",
            OperationState::Applying => "applying",
            OperationState::Completed => "completed",
            OperationState::Failed => "failed",
            OperationState::Compensating => "compensating",
            OperationState::Compensated => "compensated",
        }
    }

    /// Whether nothing further happens to an operation in this state.
    pub fn is_terminal(self) -> bool {
        matches!(self, OperationState::Completed | OperationState::Compensated)
    }
}

impl fmt::Display for OperationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OperationState {
    type Err = RegistryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OperationState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| RegistryError::Corrupt(format!("unknown operation state {s:?}")))
    }
}

/// One row of `scope_operations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRecord {
    pub operation_id: String,
    /// `None` only for the deployment-level `cutover` operation.
    pub scope_id: Option<ScopeId>,
    pub kind: String,
    pub state: OperationState,
    /// For `run` and `cron`: the owner the operation registered.
    pub external_resource_id: Option<String>,
    /// For `cutover`: the SHA-256 of the migration report.
    pub result_sha256: Option<String>,
    pub last_error_code: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Columns of [`OperationRecord`], in `op_from_row` order.
pub(super) const OP_COLUMNS: &str = "operation_id, scope_id, kind, state, external_resource_id, result_sha256, \
                                     last_error_code, created_at, updated_at";

/// Reads one row selected with [`OP_COLUMNS`].
pub(super) fn op_from_row(
    r: &crate::registry::db::Row<'_>,
) -> crate::registry::db::Result<Result<OperationRecord, RegistryError>> {
    let scope_id: Option<String> = r.get(1)?;
    let state: String = r.get(3)?;
    let scope_id = scope_id
        .map(|s| ScopeId::parse(&s).map_err(|_| RegistryError::Corrupt("invalid scope_id in scope_operations".into())))
        .transpose();
    Ok((|| {
        Ok(OperationRecord {
            operation_id: r.get(0)?,
            scope_id: scope_id?,
            kind: r.get(2)?,
            state: state.parse()?,
            external_resource_id: r.get(4)?,
            result_sha256: r.get(5)?,
            last_error_code: r.get(6)?,
            created_at: r.get(7)?,
            updated_at: r.get(8)?,
        })
    })())
}

/// One operation by id.
pub(super) fn get_op_in(
    conn: &Conn<'_>,
    deployment: &str,
    operation_id: &str,
) -> Result<Option<OperationRecord>, RegistryError> {
    let sql = format!("SELECT {OP_COLUMNS} FROM scope_operations WHERE deployment_id = ?1 AND operation_id = ?2");
    conn.query_row(&sql, params![deployment, operation_id], op_from_row).optional()?.transpose()
}

/// Moves one operation to `to` if the transition table allows it; returns whether it moved.
pub(super) fn set_op_in(
    conn: &Conn<'_>,
    deployment: &str,
    operation_id: &str,
    to: OperationState,
    error_code: Option<&str>,
    now: i64,
) -> Result<bool, RegistryError> {
    let n = conn.execute(
        "UPDATE scope_operations SET state = ?1, updated_at = ?2, last_error_code = COALESCE(?3, last_error_code)
         WHERE deployment_id = ?4 AND operation_id = ?5
           AND EXISTS (SELECT 1 FROM operation_state_transitions
                       WHERE from_state = scope_operations.state AND to_state = ?1)",
        params![to.as_str(), now, error_code, deployment, operation_id],
    )?;
    Ok(n == 1)
}

/// Ends an open operation as compensated (through `compensating`), recording `error_code` as the
/// reason; a terminal operation is left alone. Returns whether it moved.
pub(super) fn compensate_op_in(
    conn: &Conn<'_>,
    deployment: &str,
    operation_id: &str,
    error_code: &str,
    now: i64,
) -> Result<bool, RegistryError> {
    set_op_in(conn, deployment, operation_id, OperationState::Compensating, Some(error_code), now)?;
    set_op_in(conn, deployment, operation_id, OperationState::Compensated, None, now)
}

/// The open operation of `kind` that registered owner `owner_id` (kinds `run`, `cron`).
pub(super) fn op_for_owner_in(
    conn: &Conn<'_>,
    deployment: &str,
    kind: &str,
    owner_id: &str,
) -> Result<Option<OperationRecord>, RegistryError> {
    let sql = format!(
        "SELECT {OP_COLUMNS} FROM scope_operations
         WHERE deployment_id = ?1 AND kind = ?2 AND external_resource_id = ?3 LIMIT 1"
    );
    conn.query_row(&sql, params![deployment, kind, owner_id], op_from_row).optional()?.transpose()
}

/// Records an operation that registered owner `owner_id` (`run`, `cron`) as `applying`, unless
/// `operation_id` exists already.
pub(super) fn record_owner_op_in(
    conn: &Conn<'_>,
    deployment: &str,
    operation_id: &str,
    scope: &ScopeId,
    kind: &str,
    owner_id: &str,
    now: i64,
) -> Result<(), RegistryError> {
    conn.execute(
        "INSERT INTO scope_operations (deployment_id, operation_id, scope_id, kind, state, external_resource_id,
                                       created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, 'applying', ?5, ?6, ?6)
         ON CONFLICT (deployment_id, operation_id) DO NOTHING",
        params![deployment, operation_id, scope.as_str(), kind, owner_id, now],
    )?;
    Ok(())
}

/// The outcome of `provision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioned {
    pub scope: ScopeRecord,
    /// Whether this call created the scope (else it existed for this operation or thread).
    pub created: bool,
}

/// Moves every open operation of `kind` on `scope` to `to`, where the transition table allows it.
pub(super) fn set_ops_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    kind: &str,
    to: OperationState,
    error_code: Option<&str>,
    now: i64,
) -> Result<usize, RegistryError> {
    Ok(conn.execute(
        "UPDATE scope_operations SET state = ?1, updated_at = ?2, last_error_code = ?3
         WHERE deployment_id = ?4 AND scope_id = ?5 AND kind = ?6
           AND EXISTS (SELECT 1 FROM operation_state_transitions
                       WHERE from_state = scope_operations.state AND to_state = ?1)",
        params![to.as_str(), now, error_code, deployment, scope.as_str(), kind],
    )?)
}

/// Records an operation in `state` unless `operation_id` exists already (then nothing changes).
/// Returns whether it was inserted.
#[allow(clippy::too_many_arguments)]
pub(super) fn record_op_in(
    conn: &Conn<'_>,
    deployment: &str,
    operation_id: &str,
    scope: &ScopeId,
    kind: &str,
    expected_revision: Option<u64>,
    state: OperationState,
    now: i64,
) -> Result<bool, RegistryError> {
    let n = conn.execute(
        "INSERT INTO scope_operations (deployment_id, operation_id, scope_id, kind, expected_revision,
                                       state, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)
         ON CONFLICT (deployment_id, operation_id) DO NOTHING",
        params![
            deployment,
            operation_id,
            scope.as_str(),
            kind,
            expected_revision.map(|r| r as i64),
            state.as_str(),
            now
        ],
    )?;
    Ok(n == 1)
}

impl DeploymentRegistry {
    /// Idempotent provisioning: the same `operation_id` always yields the same scope (a different
    /// thread under a used `operation_id` is `OperationConflict`); a thread that already has a scope
    /// yields that scope. A new scope starts in `provisioning` with an `applying` operation and an
    /// active `primary_thread` owner. Refused with `CutoverInProgress` while a blocking lease is held.
    pub fn provision(
        &self,
        operation_id: &str,
        thread: &ThreadId,
        quota: Option<Quota>,
    ) -> Result<Provisioned, RegistryError> {
        self.provision_as(operation_id, thread, quota, None, None)
    }

    /// `provision` by the holder of the blocking lease `holder` names (its `operation_id`): not
    /// refused by that lease (a cutover provisions the threads it migrates), still by another.
    pub fn provision_under_lease(
        &self,
        operation_id: &str,
        thread: &ThreadId,
        quota: Option<Quota>,
        holder: Option<&str>,
    ) -> Result<Provisioned, RegistryError> {
        self.provision_as(operation_id, thread, quota, None, holder)
    }

    /// `provision` of a scope made as a copy of `parent` (a fork, a snapshot's scope): a new scope
    /// is recorded as `parent`'s copy in the same transaction (`forked_from`), so a copy a crash
    /// interrupts is made again rather than finished as an empty scope. An existing scope of the
    /// thread that is not `parent`'s copy is `OperationConflict`.
    pub fn provision_fork(
        &self,
        operation_id: &str,
        thread: &ThreadId,
        parent: &ScopeId,
    ) -> Result<Provisioned, RegistryError> {
        let p = self.provision_as(operation_id, thread, None, Some(parent), None)?;
        if self.forked_from(&p.scope.scope_id)?.as_ref() != Some(parent) {
            return Err(RegistryError::OperationConflict);
        }
        Ok(p)
    }

    fn provision_as(
        &self,
        operation_id: &str,
        thread: &ThreadId,
        quota: Option<Quota>,
        parent: Option<&ScopeId>,
        holder: Option<&str>,
    ) -> Result<Provisioned, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        refuse_unless_holder_in(&tx, deployment, now, holder)?;
        let existing_op: Option<String> = tx
            .query_row(
                "SELECT scope_id FROM scope_operations WHERE deployment_id = ?1 AND operation_id = ?2",
                params![deployment, operation_id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(scope_id) = existing_op {
            let scope_id = ScopeId::parse(&scope_id)
                .map_err(|_| RegistryError::Corrupt("invalid scope_id in scope_operations".into()))?;
            let scope = get_in(&tx, deployment, &scope_id)?.ok_or(RegistryError::NotFound)?;
            if &scope.primary_thread_id != thread {
                return Err(RegistryError::OperationConflict);
            }
            return Ok(Provisioned { scope, created: false });
        }
        let (scope, created) = match find_by_thread_in(&tx, deployment, thread)? {
            Some(scope) => (scope, false),
            None => {
                let scope = insert_in(&tx, deployment, thread, quota, now)?;
                insert_primary_owner_in(&tx, deployment, &scope.scope_id, thread, now)?;
                if let Some(parent) = parent {
                    tx.execute(
                        "INSERT INTO scope_forks (deployment_id, scope_id, parent_scope_id, created_at) VALUES (?1, ?2, ?3, ?4)",
                        params![deployment, scope.scope_id.as_str(), parent.as_str(), now],
                    )?;
                }
                (scope, true)
            }
        };
        let op_state =
            if scope.state == ScopeState::Provisioning { OperationState::Applying } else { OperationState::Completed };
        tx.execute(
            "INSERT INTO scope_operations (deployment_id, operation_id, scope_id, kind, expected_revision,
                                           state, created_at, updated_at)
             VALUES (?1, ?2, ?3, 'provision', ?4, ?5, ?6, ?6)",
            params![deployment, operation_id, scope.scope_id.as_str(), scope.revision as i64, op_state.as_str(), now],
        )?;
        tx.commit()?;
        Ok(Provisioned { scope, created })
    }

    /// Finishes provisioning: a `provisioning` scope becomes `draft` and its open provision
    /// operations `completed`, in one transaction. A scope already past `provisioning` is returned
    /// as is (its open operations are completed too), so finishing twice is harmless.
    pub fn complete_provision(&self, scope: &ScopeId) -> Result<ScopeRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let current = get_in(&tx, deployment, scope)?.ok_or(RegistryError::NotFound)?;
        let rec = match current.state {
            ScopeState::Provisioning => {
                transition_in(&tx, deployment, scope, current.revision, ScopeState::Draft, now)?
            }
            _ => current,
        };
        set_ops_in(&tx, deployment, scope, "provision", OperationState::Completed, None, now)?;
        tx.commit()?;
        Ok(rec)
    }

    /// Records that finishing a scope's provisioning failed (`error_code` is a snake_case code);
    /// the scope stays `provisioning` and is retried later.
    pub fn fail_provision(&self, scope: &ScopeId, error_code: &str) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        set_ops_in(&tx, deployment, scope, "provision", OperationState::Failed, Some(error_code), now)?;
        tx.commit()?;
        Ok(())
    }

    /// Operations of the deployment that are not terminal (`completed`/`compensated`), oldest first.
    pub fn open_operations(&self) -> Result<Vec<OperationRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let sql = format!(
            "SELECT {OP_COLUMNS} FROM scope_operations
             WHERE deployment_id = ?1 AND state NOT IN ('completed', 'compensated')
             ORDER BY created_at, operation_id"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params![deployment], op_from_row)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }

    /// One operation by id.
    pub fn operation(&self, operation_id: &str) -> Result<Option<OperationRecord>, RegistryError> {
        get_op_in(&self.db.conn()?, self.id.as_str(), operation_id)
    }
}
