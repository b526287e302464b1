//! SQL of `scope_run_requests`: idempotent run reservations (hash-checked), interrupt keys, run state.

use crate::registry::db::{params, Conn, OptionalExtension, Row};

use super::leases::refuse_if_blocked_in;
use super::operations::{compensate_op_in, record_owner_op_in, set_op_in, OperationState};
use super::owners::{
    attach_resource_in, get_owner_in, insert_owner_in, require_open_scope_in, set_owner_state_in, OwnerState, OwnerType,
};
use super::scopes::{get_in as get_scope_in, transition_in};
use super::{
    is_constraint, validate_key, validate_resource_id, DeploymentRegistry, RegistryError, ScopeRecord, ScopeState,
};
use crate::ids::ScopeId;

use std::fmt;
use std::str::FromStr;

string_enum!(
    /// Run request state: `reserved → started → completed | failed | cancelled` (table
    /// `run_request_state_transitions`).
    RunRequestState, "run request state", {
    Reserved => "reserved",
    Started => "started",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});

impl RunRequestState {
    /// The state its run owner takes with it.
    fn owner_state(self) -> OwnerState {
        match self {
            RunRequestState::Reserved => OwnerState::Reserved,
            RunRequestState::Started => OwnerState::Active,
            RunRequestState::Completed | RunRequestState::Cancelled => OwnerState::Terminal,
            RunRequestState::Failed => OwnerState::Failed,
        }
    }
}

/// One row of `scope_run_requests`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct RunRequestRecord {
    pub scope_id: ScopeId,
    pub run_request_id: String,
    pub turn_id: String,
    pub interrupt_key: Option<String>,
    pub request_hash: String,
    pub run_owner_id: String,
    pub run_id: Option<String>,
    pub state: RunRequestState,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A reservation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReserve {
    pub run_request_id: String,
    pub turn_id: String,
    pub interrupt_key: Option<String>,
    pub request_hash: String,
}

/// The outcome of `reserve_run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub run: RunRequestRecord,
    /// Whether this call made the reservation (else it existed for the same id and hash).
    pub created: bool,
    /// The scope after the call (a draft becomes active with its first reservation).
    pub scope: ScopeRecord,
}

/// A change to a run request: attach `run_id` and/or move its state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunUpdate {
    pub run_id: Option<String>,
    pub state: Option<RunRequestState>,
}

const COLUMNS: &str = "scope_id, run_request_id, turn_id, interrupt_key, request_hash, run_owner_id, run_id, state, \
                       created_at, updated_at";

/// A `scope_run_requests` row as stored, read by column name (see [`COLUMNS`]).
struct RawRun {
    scope_id: String,
    run_request_id: String,
    turn_id: String,
    interrupt_key: Option<String>,
    request_hash: String,
    run_owner_id: String,
    run_id: Option<String>,
    state: String,
    created_at: i64,
    updated_at: i64,
}

fn from_row(r: &Row<'_>) -> crate::registry::db::Result<RawRun> {
    Ok(RawRun {
        scope_id: r.get("scope_id")?,
        run_request_id: r.get("run_request_id")?,
        turn_id: r.get("turn_id")?,
        interrupt_key: r.get("interrupt_key")?,
        request_hash: r.get("request_hash")?,
        run_owner_id: r.get("run_owner_id")?,
        run_id: r.get("run_id")?,
        state: r.get("state")?,
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
    })
}

fn validate(raw: RawRun) -> Result<RunRequestRecord, RegistryError> {
    Ok(RunRequestRecord {
        scope_id: ScopeId::parse(&raw.scope_id)
            .map_err(|_| RegistryError::Corrupt("invalid scope_id in scope_run_requests".into()))?,
        run_request_id: raw.run_request_id,
        turn_id: raw.turn_id,
        interrupt_key: raw.interrupt_key,
        request_hash: raw.request_hash,
        run_owner_id: raw.run_owner_id,
        run_id: raw.run_id,
        state: raw.state.parse()?,
        created_at: raw.created_at,
        updated_at: raw.updated_at,
    })
}

/// The operation id of a run reservation: `run:<scope_id>:<run_request_id>`.
pub fn run_operation_id(scope: &ScopeId, run_request_id: &str) -> String {
    format!("run:{scope}:{run_request_id}")
}

/// Moves the run's operation with its request: started or completed → `completed`; failed or
/// cancelled before it started → `compensated` (the reservation and its owner are released).
fn follow_with_operation_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    run_request_id: &str,
    from: RunRequestState,
    to: RunRequestState,
    now: i64,
) -> Result<(), RegistryError> {
    let op = run_operation_id(scope, run_request_id);
    match to {
        RunRequestState::Started | RunRequestState::Completed => {
            set_op_in(conn, deployment, &op, OperationState::Completed, None, now)?;
        }
        RunRequestState::Failed | RunRequestState::Cancelled if from == RunRequestState::Reserved => {
            compensate_op_in(conn, deployment, &op, &format!("run_{to}"), now)?;
        }
        _ => {}
    }
    Ok(())
}

fn get_run_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    run_request_id: &str,
) -> Result<Option<RunRequestRecord>, RegistryError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM scope_run_requests WHERE deployment_id = ?1 AND scope_id = ?2 AND run_request_id = ?3"
    );
    conn.query_row(&sql, params![deployment, scope.as_str(), run_request_id], from_row)
        .optional()?
        .map(validate)
        .transpose()
}

impl DeploymentRegistry {
    /// Idempotent run reservation in a draft or active scope: the same `run_request_id` with the same
    /// `request_hash` returns the existing reservation; with another hash it is `OperationConflict`
    /// (`idempotency_key_conflict`); a used `interrupt_key` is `InterruptAlreadyResolved`; a new
    /// `run_request_id` for a known `turn_id` is a new reservation. Each reservation registers a
    /// `run` owner; the first one activates a draft scope. Refused while a blocking lease is held.
    pub fn reserve_run(&self, scope: &ScopeId, req: &RunReserve) -> Result<Reservation, RegistryError> {
        let deployment = self.id.as_str();
        validate_key("run_request_id", &req.run_request_id)?;
        validate_key("turn_id", &req.turn_id)?;
        validate_key("request_hash", &req.request_hash)?;
        if let Some(k) = &req.interrupt_key {
            validate_key("interrupt_key", k)?;
        }
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        refuse_if_blocked_in(&tx, deployment, now)?;
        if let Some(existing) = get_run_in(&tx, deployment, scope, &req.run_request_id)? {
            if existing.request_hash != req.request_hash {
                return Err(RegistryError::OperationConflict);
            }
            let scope = get_scope_in(&tx, deployment, scope)?.ok_or(RegistryError::NotFound)?;
            return Ok(Reservation { run: existing, created: false, scope });
        }
        let state = require_open_scope_in(&tx, deployment, scope)?;
        let owner = insert_owner_in(&tx, deployment, scope, OwnerType::Run, None, None, OwnerState::Reserved, now)?;
        let inserted = tx.execute(
            "INSERT INTO scope_run_requests (deployment_id, scope_id, run_request_id, turn_id, interrupt_key,
                                             request_hash, run_owner_id, state, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'reserved', ?8, ?8)",
            params![
                deployment,
                scope.as_str(),
                req.run_request_id,
                req.turn_id,
                req.interrupt_key,
                req.request_hash,
                owner.owner_id,
                now
            ],
        );
        match inserted {
            Ok(_) => {}
            Err(e) if is_constraint(&e) => return Err(RegistryError::InterruptAlreadyResolved),
            Err(e) => return Err(e.into()),
        }
        let mut scope_rec = get_scope_in(&tx, deployment, scope)?.ok_or(RegistryError::NotFound)?;
        if state == ScopeState::Draft {
            scope_rec = transition_in(&tx, deployment, scope, scope_rec.revision, ScopeState::Active, now)?;
        }
        let run = get_run_in(&tx, deployment, scope, &req.run_request_id)?.ok_or(RegistryError::RunRequestNotFound)?;
        let op = run_operation_id(scope, &req.run_request_id);
        record_owner_op_in(&tx, deployment, &op, scope, super::RUN_KIND, &owner.owner_id, now)?;
        tx.commit()?;
        Ok(Reservation { run, created: true, scope: scope_rec })
    }

    /// Attaches `run_id` (also the run owner's `resource_id`) and/or moves the run request's state
    /// (its owner follows: started → active, completed/cancelled → terminal, failed → failed).
    /// Starting a run is refused unless the scope is draft or active.
    pub fn update_run(
        &self,
        scope: &ScopeId,
        run_request_id: &str,
        update: &RunUpdate,
    ) -> Result<RunRequestRecord, RegistryError> {
        let deployment = self.id.as_str();
        if let Some(r) = &update.run_id {
            validate_resource_id(r)?;
        }
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let run = get_run_in(&tx, deployment, scope, run_request_id)?.ok_or(RegistryError::RunRequestNotFound)?;
        let mut owner = get_owner_in(&tx, deployment, &run.run_owner_id)?.ok_or(RegistryError::OwnerNotFound)?;
        if let Some(run_id) = &update.run_id {
            match run.run_id.as_deref() {
                Some(existing) if existing != run_id => return Err(RegistryError::RunIdAlreadySet),
                Some(_) => {}
                None => {
                    owner = attach_resource_in(&tx, deployment, &owner, run_id, now)?;
                    tx.execute(
                        "UPDATE scope_run_requests SET run_id = ?1, updated_at = ?2
                         WHERE deployment_id = ?3 AND scope_id = ?4 AND run_request_id = ?5",
                        params![run_id, now, deployment, scope.as_str(), run_request_id],
                    )?;
                }
            }
        }
        if let Some(to) = update.state.filter(|to| *to != run.state) {
            if to == RunRequestState::Started {
                require_open_scope_in(&tx, deployment, scope)?;
            }
            let changed = tx.execute(
                "UPDATE scope_run_requests SET state = ?1, updated_at = ?2
                 WHERE deployment_id = ?3 AND scope_id = ?4 AND run_request_id = ?5
                   AND EXISTS (SELECT 1 FROM run_request_state_transitions
                               WHERE from_state = scope_run_requests.state AND to_state = ?1)",
                params![to.as_str(), now, deployment, scope.as_str(), run_request_id],
            )?;
            if changed != 1 {
                return Err(RegistryError::RunRequestConflict { current: run.state, requested: to });
            }
            let owner_to = to.owner_state();
            if owner.state != owner_to && !owner.state.is_settled() {
                set_owner_state_in(&tx, deployment, &owner, None, owner_to, now)?;
            }
            follow_with_operation_in(&tx, deployment, scope, run_request_id, run.state, to, now)?;
        }
        let run = get_run_in(&tx, deployment, scope, run_request_id)?.ok_or(RegistryError::RunRequestNotFound)?;
        tx.commit()?;
        Ok(run)
    }

    /// Compensates a run reservation that can no longer start (its scope is being deleted or gone):
    /// a `reserved` request becomes `cancelled`, its owner `terminal`, its operation `compensated`,
    /// in one transaction. A request past `reserved` only has its open operation completed.
    pub fn compensate_run(
        &self,
        scope: &ScopeId,
        run_request_id: &str,
        error_code: &str,
    ) -> Result<RunRequestRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let run = get_run_in(&tx, deployment, scope, run_request_id)?.ok_or(RegistryError::RunRequestNotFound)?;
        let op = run_operation_id(scope, run_request_id);
        if run.state == RunRequestState::Reserved {
            tx.execute(
                "UPDATE scope_run_requests SET state = 'cancelled', updated_at = ?1
                 WHERE deployment_id = ?2 AND scope_id = ?3 AND run_request_id = ?4 AND state = 'reserved'",
                params![now, deployment, scope.as_str(), run_request_id],
            )?;
            let owner = get_owner_in(&tx, deployment, &run.run_owner_id)?.ok_or(RegistryError::OwnerNotFound)?;
            if !owner.state.is_settled() {
                set_owner_state_in(&tx, deployment, &owner, None, OwnerState::Terminal, now)?;
            }
            compensate_op_in(&tx, deployment, &op, error_code, now)?;
        } else {
            set_op_in(&tx, deployment, &op, OperationState::Completed, None, now)?;
        }
        let run = get_run_in(&tx, deployment, scope, run_request_id)?.ok_or(RegistryError::RunRequestNotFound)?;
        tx.commit()?;
        Ok(run)
    }

    /// One run request of `scope`.
    pub fn run_request(&self, scope: &ScopeId, run_request_id: &str) -> Result<RunRequestRecord, RegistryError> {
        let deployment = self.id.as_str();
        get_run_in(&self.db.conn()?, deployment, scope, run_request_id)?.ok_or(RegistryError::RunRequestNotFound)
    }
}
