//! SQL of saga compensation and the deployment-level cutover operation (seed 000 §5.3, §11.1).
//!
//! An operation whose forward step cannot complete records `compensating`, the caller undoes what
//! it did outside the registry, and the registry step that ends it `compensated` also undoes the
//! registry side (a provisioning scope becomes `deleted`, a reserved run `cancelled`, a cron owner
//! `terminal`). Every step is idempotent, so recovery can repeat any of them after a crash.

use crate::registry::db::params;

use super::operations::{compensate_op_in, get_op_in, op_from_row, set_op_in, OP_COLUMNS};
use super::owners::{get_owner_in, owners_of_in, set_owner_state_in, OwnerState};
use super::scopes::get_in as get_scope_in;
use super::{
    validate_key, DeploymentRegistry, OperationRecord, OperationState, RegistryError, ScopeRecord, ScopeState,
};

/// `scope_operations.kind` of a provisioning.
pub const PROVISION_KIND: &str = "provision";
/// `scope_operations.kind` of a run reservation (`run:<scope_id>:<run_request_id>`).
pub const RUN_KIND: &str = "run";
/// `scope_operations.kind` of a cron registration (`cron:<resource_id or owner_id>`).
pub const CRON_KIND: &str = "cron";
/// `scope_operations.kind` of the deployment-level cutover (scope_id NULL, report SHA-256).
pub const CUTOVER_KIND: &str = "cutover";

/// The compensation of a provisioning: the scope leaves `provisioning` for `deleted` (revision CAS).
/// Not a transition of the scope state machine: only a compensated provision takes it.
fn retire_provisioning_in(
    conn: &crate::registry::db::Conn<'_>,
    deployment: &str,
    scope: &crate::ids::ScopeId,
    expected_revision: u64,
    now: i64,
) -> Result<ScopeRecord, RegistryError> {
    let changed = conn.execute(
        "UPDATE scopes SET state = 'deleted', revision = revision + 1, updated_at = ?1, deleted_at = ?1
         WHERE deployment_id = ?2 AND scope_id = ?3 AND revision = ?4 AND state = 'provisioning'",
        params![now, deployment, scope.as_str(), expected_revision as i64],
    )?;
    let current = get_scope_in(conn, deployment, scope)?.ok_or(RegistryError::NotFound)?;
    if changed != 1 {
        return Err(RegistryError::Conflict {
            expected_revision,
            current_revision: current.revision,
            current_state: current.state,
            requested: ScopeState::Deleted,
        });
    }
    Ok(current)
}

impl DeploymentRegistry {
    /// Moves an open operation to `completed` (its forward step is done); `false` if it could not
    /// (terminal already, or compensating).
    pub fn complete_operation(&self, operation_id: &str) -> Result<bool, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let conn = self.db.conn()?;
        set_op_in(&conn, deployment, operation_id, OperationState::Completed, None, now)
    }

    /// Ends an open operation `compensated` when there is nothing left to undo (its scope went
    /// another way); `false` if it was terminal already.
    pub fn compensate_operation(&self, operation_id: &str, error_code: &str) -> Result<bool, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let moved = compensate_op_in(&tx, deployment, operation_id, error_code, now)?;
        tx.commit()?;
        Ok(moved)
    }

    /// Records that an operation is being compensated (`compensating`, with why); returns it as it
    /// is now (a terminal or already compensating operation is returned unchanged).
    pub fn begin_compensation(&self, operation_id: &str, error_code: &str) -> Result<OperationRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let conn = self.db.conn()?;
        set_op_in(&conn, deployment, operation_id, OperationState::Compensating, Some(error_code), now)?;
        get_op_in(&conn, deployment, operation_id)?.ok_or(RegistryError::NotFound)
    }

    /// Ends a `compensating` provision: a scope still `provisioning` becomes `deleted` (its local data is
    /// purged after the retention like any deleted scope) with its owners settled, and the operation
    /// `compensated`, in one transaction. Returns the scope as it is now.
    pub fn compensate_provision(&self, operation_id: &str) -> Result<Option<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let op = get_op_in(&tx, deployment, operation_id)?.ok_or(RegistryError::NotFound)?;
        let Some(scope) = op.scope_id.as_ref() else { return Ok(None) };
        let mut rec = get_scope_in(&tx, deployment, scope)?;
        if op.kind == PROVISION_KIND && op.state == OperationState::Compensating {
            if let Some(current) = rec.as_ref().filter(|r| r.state == ScopeState::Provisioning) {
                for owner in owners_of_in(&tx, deployment, scope)? {
                    if !owner.state.is_settled() {
                        set_owner_state_in(&tx, deployment, &owner, None, OwnerState::Terminal, now)?;
                    }
                }
                rec = Some(retire_provisioning_in(&tx, deployment, scope, current.revision, now)?);
            }
            set_op_in(&tx, deployment, operation_id, OperationState::Compensated, None, now)?;
        }
        tx.commit()?;
        Ok(rec)
    }

    /// Compensates a `cron` operation whose cron never became active: its owner is settled
    /// (`terminal`) and the operation `compensated`, in one transaction.
    pub fn compensate_cron(&self, operation_id: &str, error_code: &str) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let op = get_op_in(&tx, deployment, operation_id)?.ok_or(RegistryError::NotFound)?;
        if op.kind != CRON_KIND || op.state.is_terminal() {
            return Ok(());
        }
        if let Some(owner) = op.external_resource_id.as_deref().map(|o| get_owner_in(&tx, deployment, o)).transpose()? {
            if let Some(owner) = owner.filter(|o| !o.state.is_settled()) {
                set_owner_state_in(&tx, deployment, &owner, None, OwnerState::Terminal, now)?;
            }
        }
        compensate_op_in(&tx, deployment, operation_id, error_code, now)?;
        tx.commit()?;
        Ok(())
    }

    /// Records the deployment-level cutover operation `operation_id` with the SHA-256 (64 lowercase
    /// hex digits) of its migration report, `completed`. The same id and hash again is a no-op; the
    /// same id with another hash is `OperationConflict`.
    pub fn record_cutover(&self, operation_id: &str, report_sha256: &str) -> Result<OperationRecord, RegistryError> {
        let deployment = self.id.as_str();
        validate_key("operation_id", operation_id)?;
        let hex = report_sha256.len() == 64 && report_sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex {
            return Err(RegistryError::Invalid { field: "report_sha256", reason: "must be 64 lowercase hex digits" });
        }
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        if let Some(existing) = get_op_in(&tx, deployment, operation_id)? {
            if existing.kind != CUTOVER_KIND || existing.result_sha256.as_deref() != Some(report_sha256) {
                return Err(RegistryError::OperationConflict);
            }
            return Ok(existing);
        }
        tx.execute(
            "INSERT INTO scope_operations (deployment_id, operation_id, scope_id, kind, state, result_sha256,
                                           created_at, updated_at)
             VALUES (?1, ?2, NULL, 'cutover', 'completed', ?3, ?4, ?4)",
            params![deployment, operation_id, report_sha256, now],
        )?;
        let rec = get_op_in(&tx, deployment, operation_id)?.ok_or(RegistryError::NotFound)?;
        tx.commit()?;
        Ok(rec)
    }

    /// The newest completed cutover operation of the deployment, if any.
    pub fn latest_cutover(&self) -> Result<Option<OperationRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let sql = format!(
            "SELECT {OP_COLUMNS} FROM scope_operations
             WHERE deployment_id = ?1 AND kind = 'cutover' AND state = 'completed'
             ORDER BY created_at DESC, operation_id DESC LIMIT 1"
        );
        let mut stmt = conn.prepare(&sql)?;
        let mut rows = stmt.query_map(params![deployment], op_from_row)?;
        rows.next().transpose()?.transpose()
    }
}
