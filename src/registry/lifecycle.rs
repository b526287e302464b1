//! SQL of the scope lifecycle (SPEC §10): delete with drain, draft expiry and purge, each recorded as an operation.
//!
//! A delete is the operation `delete-<scope_id>`: `begin_delete` moves the scope
//! to `deleting` (revision CAS), records the operation `applying` and asks every
//! live owner to drain; `complete_delete` moves it to `deleted` only when no owner
//! other than the primary thread is unsettled, else the daemon records why with
//! `record_delete_blocked` (operation `failed`, retried later). A purge is the
//! operation `purge-<scope_id>`, completed by `complete_purge`.

use crate::registry::db::{params, Conn};

use super::operations::{record_op_in, set_ops_in};
use super::owners::{owners_of_in, set_owner_state_in, OwnerState, OwnerType};
use super::scopes::{from_row, get_in, transition_in, COLUMNS};
use super::{DeploymentRegistry, OperationState, RegistryError, ScopeRecord, ScopeState};
use crate::ids::ScopeId;

/// `scope_operations.kind` of a delete (user-requested or draft expiry).
pub const DELETE_KIND: &str = "delete";
/// `scope_operations.kind` of a purge after the retention.
pub const PURGE_KIND: &str = "purge";

/// What `complete_delete` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteStep {
    /// The scope is `deleted`.
    Deleted(ScopeRecord),
    /// The scope stays `deleting`: these owners are not settled yet.
    Blocked(Vec<String>),
}

fn delete_op_id(scope: &ScopeId) -> String {
    format!("delete-{scope}")
}

fn purge_op_id(scope: &ScopeId) -> String {
    format!("purge-{scope}")
}

/// Owners other than the primary thread that still act in the scope.
fn blockers_in(conn: &Conn<'_>, deployment: &str, scope: &ScopeId) -> Result<Vec<String>, RegistryError> {
    Ok(owners_of_in(conn, deployment, scope)?
        .into_iter()
        .filter(|o| o.owner_type != OwnerType::PrimaryThread && !o.state.is_settled())
        .map(|o| o.owner_id)
        .collect())
}

/// `deleting` + operation + every live owner asked to drain, inside the caller's transaction.
fn begin_delete_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    expected_revision: u64,
    now: i64,
) -> Result<ScopeRecord, RegistryError> {
    let rec = transition_in(conn, deployment, scope, expected_revision, ScopeState::Deleting, now)?;
    record_op_in(
        conn,
        deployment,
        &delete_op_id(scope),
        scope,
        DELETE_KIND,
        Some(expected_revision),
        OperationState::Applying,
        now,
    )?;
    for owner in owners_of_in(conn, deployment, scope)? {
        if matches!(owner.state, OwnerState::Reserved | OwnerState::Active) {
            set_owner_state_in(conn, deployment, &owner, None, OwnerState::Draining, now)?;
        }
    }
    Ok(rec)
}

impl DeploymentRegistry {
    /// Starts deleting a draft or active scope (revision CAS): the scope becomes `deleting`, which
    /// freezes owner creation and run reservations; live owners are moved to `draining`.
    pub fn begin_delete(&self, scope: &ScopeId, expected_revision: u64) -> Result<ScopeRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = begin_delete_in(&tx, deployment, scope, expected_revision, now)?;
        tx.commit()?;
        Ok(rec)
    }

    /// Finishes a delete if nothing blocks it: the primary owner becomes terminal, the scope
    /// `deleted` and the delete operation `completed`, in one transaction. Idempotent on a deleted scope.
    pub fn complete_delete(&self, scope: &ScopeId) -> Result<DeleteStep, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_in(&tx, deployment, scope)?.ok_or(RegistryError::NotFound)?;
        match rec.state {
            ScopeState::Deleted => return Ok(DeleteStep::Deleted(rec)),
            ScopeState::Deleting => {}
            other => return Err(RegistryError::ScopeUnavailable(other)),
        }
        let blockers = blockers_in(&tx, deployment, scope)?;
        if !blockers.is_empty() {
            return Ok(DeleteStep::Blocked(blockers));
        }
        for owner in owners_of_in(&tx, deployment, scope)? {
            if !owner.state.is_settled() {
                set_owner_state_in(&tx, deployment, &owner, None, OwnerState::Terminal, now)?;
            }
        }
        let rec = transition_in(&tx, deployment, scope, rec.revision, ScopeState::Deleted, now)?;
        set_ops_in(&tx, deployment, scope, DELETE_KIND, OperationState::Completed, None, now)?;
        tx.commit()?;
        Ok(DeleteStep::Deleted(rec))
    }

    /// Records why a `deleting` scope cannot finish (the unsettled owners) on the scope and fails
    /// its delete operation with `owners_not_settled` (a later retry moves it on).
    pub fn record_delete_blocked(&self, scope: &ScopeId, blockers: &[String]) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let json = serde_json::to_string(blockers).map_err(|e| RegistryError::Corrupt(e.to_string()))?;
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE scopes SET delete_blocked_by = ?1, updated_at = ?2
             WHERE deployment_id = ?3 AND scope_id = ?4 AND state = 'deleting'",
            params![json, now, deployment, scope.as_str()],
        )?;
        set_ops_in(&tx, deployment, scope, DELETE_KIND, OperationState::Failed, Some("owners_not_settled"), now)?;
        tx.commit()?;
        Ok(())
    }

    /// Drafts created at or before `cutoff` (Unix ms) that have no unsettled owner besides the primary thread.
    pub fn expired_drafts(&self, cutoff: i64) -> Result<Vec<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let sql = format!(
            "SELECT {COLUMNS} FROM scopes WHERE deployment_id = ?1 AND state = 'draft' AND created_at <= ?2
             ORDER BY created_at"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params![deployment, cutoff], from_row)?;
        let mut out = Vec::new();
        for raw in rows {
            let rec = raw?.validate()?;
            if blockers_in(&conn, deployment, &rec.scope_id)?.is_empty() {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Starts deleting an expired draft, re-checking in the same transaction that it is still a
    /// draft created at or before `cutoff` with no other live owner (`Ok(None)` when it no longer is).
    pub fn begin_draft_expiry(&self, scope: &ScopeId, cutoff: i64) -> Result<Option<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let Some(rec) = get_in(&tx, deployment, scope)? else { return Ok(None) };
        if rec.state != ScopeState::Draft || rec.created_at > cutoff || !blockers_in(&tx, deployment, scope)?.is_empty()
        {
            return Ok(None);
        }
        let rec = begin_delete_in(&tx, deployment, scope, rec.revision, now)?;
        tx.commit()?;
        Ok(Some(rec))
    }

    /// Deleted scopes whose deletion is at or before `cutoff` and that are not purged yet.
    pub fn purge_due(&self, cutoff: i64) -> Result<Vec<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let sql = format!(
            "SELECT {COLUMNS} FROM scopes
             WHERE deployment_id = ?1 AND state = 'deleted' AND purged_at IS NULL AND deleted_at <= ?2
             ORDER BY deleted_at"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params![deployment, cutoff], from_row)?;
        let mut out = Vec::new();
        for raw in rows {
            out.push(raw?.validate()?);
        }
        Ok(out)
    }

    /// Records the purge operation of a deleted scope (`applying`; a second call changes nothing).
    pub fn begin_purge(&self, scope: &ScopeId) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_in(&tx, deployment, scope)?.ok_or(RegistryError::NotFound)?;
        if rec.state != ScopeState::Deleted {
            return Err(RegistryError::ScopeUnavailable(rec.state));
        }
        record_op_in(&tx, deployment, &purge_op_id(scope), scope, PURGE_KIND, None, OperationState::Applying, now)?;
        tx.commit()?;
        Ok(())
    }

    /// Marks a deleted scope purged and completes its purge operation.
    pub fn complete_purge(&self, scope: &ScopeId) -> Result<ScopeRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE scopes SET purged_at = COALESCE(purged_at, ?1)
             WHERE deployment_id = ?2 AND scope_id = ?3 AND state = 'deleted'",
            params![now, deployment, scope.as_str()],
        )?;
        set_ops_in(&tx, deployment, scope, PURGE_KIND, OperationState::Completed, None, now)?;
        let rec = get_in(&tx, deployment, scope)?.ok_or(RegistryError::NotFound)?;
        tx.commit()?;
        Ok(rec)
    }
}

impl DeploymentRegistry {
    /// The owners (other than the primary thread) of `scope` that are not settled.
    pub fn delete_blockers(&self, scope: &ScopeId) -> Result<Vec<String>, RegistryError> {
        let deployment = self.id.as_str();
        blockers_in(&self.db.conn()?, deployment, scope)
    }
}
