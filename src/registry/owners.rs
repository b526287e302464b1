//! SQL of `scope_owners`: registering owners, attaching resources, CAS state changes, lookup by resource.

use std::fmt;
use std::str::FromStr;

use crate::registry::db::{params, Conn, OptionalExtension, Row};

use super::leases::refuse_unless_holder_in;
use super::operations::{compensate_op_in, op_for_owner_in, record_owner_op_in, set_op_in, OperationState};
use super::scopes::get_in as get_scope_in;
use super::{is_constraint, to_i64, to_u64, validate_resource_id, DeploymentRegistry, RegistryError, ScopeState};
use crate::ids::{ScopeId, ThreadId};

string_enum!(
    /// What kind of actor an owner is.
    OwnerType, "owner type", {
    PrimaryThread => "primary_thread",
    AsyncThread => "async_thread",
    MemoryWorker => "memory_worker",
    Cron => "cron",
    BackgroundProcess => "background_process",
    Run => "run",
    Environment => "environment",
});

string_enum!(
    /// Owner state: `reserved, active, draining, terminal, failed, quarantined` (transitions in
    /// `owner_state_transitions`; `terminal` and `quarantined` never return to `active`).
    OwnerState, "owner state", {
    Reserved => "reserved",
    Active => "active",
    Draining => "draining",
    Terminal => "terminal",
    Failed => "failed",
    Quarantined => "quarantined",
});

impl OwnerState {
    /// Settled owners no longer act in their scope: a delete does not wait for them.
    pub fn is_settled(self) -> bool {
        matches!(self, OwnerState::Terminal | OwnerState::Failed | OwnerState::Quarantined)
    }
}

/// One row of `scope_owners`. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct OwnerRecord {
    pub owner_id: String,
    pub scope_id: ScopeId,
    pub owner_type: OwnerType,
    pub resource_id: Option<String>,
    pub parent_owner_id: Option<String>,
    pub state: OwnerState,
    pub revision: u64,
    pub created_at: i64,
    pub updated_at: i64,
    pub terminal_at: Option<i64>,
}

/// A request to register an owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOwner {
    pub owner_type: OwnerType,
    pub resource_id: Option<String>,
    pub parent_owner_id: Option<String>,
}

/// A change to an owner: attach a resource and/or move its state (optionally CAS on revision).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerUpdate {
    pub expected_revision: Option<u64>,
    pub resource_id: Option<String>,
    pub state: Option<OwnerState>,
}

const COLUMNS: &str = "owner_id, scope_id, owner_type, resource_id, parent_owner_id, state, revision, \
                       created_at, updated_at, terminal_at";

/// An `scope_owners` row as stored, read by column name (see [`COLUMNS`]).
struct RawOwner {
    owner_id: String,
    scope_id: String,
    owner_type: String,
    resource_id: Option<String>,
    parent_owner_id: Option<String>,
    state: String,
    revision: i64,
    created_at: i64,
    updated_at: i64,
    terminal_at: Option<i64>,
}

fn from_row(r: &Row<'_>) -> crate::registry::db::Result<RawOwner> {
    Ok(RawOwner {
        owner_id: r.get("owner_id")?,
        scope_id: r.get("scope_id")?,
        owner_type: r.get("owner_type")?,
        resource_id: r.get("resource_id")?,
        parent_owner_id: r.get("parent_owner_id")?,
        state: r.get("state")?,
        revision: r.get("revision")?,
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
        terminal_at: r.get("terminal_at")?,
    })
}

fn validate(raw: RawOwner) -> Result<OwnerRecord, RegistryError> {
    Ok(OwnerRecord {
        owner_id: raw.owner_id,
        scope_id: ScopeId::parse(&raw.scope_id)
            .map_err(|_| RegistryError::Corrupt("invalid scope_id in scope_owners".into()))?,
        owner_type: raw.owner_type.parse()?,
        resource_id: raw.resource_id,
        parent_owner_id: raw.parent_owner_id,
        state: raw.state.parse()?,
        revision: to_u64(raw.revision, "owner revision")?,
        created_at: raw.created_at,
        updated_at: raw.updated_at,
        terminal_at: raw.terminal_at,
    })
}

pub(super) fn get_owner_in(
    conn: &Conn<'_>,
    deployment: &str,
    owner_id: &str,
) -> Result<Option<OwnerRecord>, RegistryError> {
    let sql = format!("SELECT {COLUMNS} FROM scope_owners WHERE deployment_id = ?1 AND owner_id = ?2");
    conn.query_row(&sql, params![deployment, owner_id], from_row).optional()?.map(validate).transpose()
}

/// Every owner of a scope, oldest first.
pub(super) fn owners_of_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
) -> Result<Vec<OwnerRecord>, RegistryError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM scope_owners WHERE deployment_id = ?1 AND scope_id = ?2 ORDER BY created_at, owner_id"
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(params![deployment, scope.as_str()], from_row)?;
    let mut out = Vec::new();
    for raw in rows {
        out.push(validate(raw?)?);
    }
    Ok(out)
}

/// A fresh owner id (UUIDv7).
pub(super) fn new_owner_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Inserts an owner row; a resource already held (any scope) is `ResourceOwned`.
#[allow(clippy::too_many_arguments)]
pub(super) fn insert_owner_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    owner_type: OwnerType,
    resource_id: Option<&str>,
    parent_owner_id: Option<&str>,
    state: OwnerState,
    now: i64,
) -> Result<OwnerRecord, RegistryError> {
    let owner_id = new_owner_id();
    let inserted = conn.execute(
        "INSERT INTO scope_owners (deployment_id, owner_id, scope_id, owner_type, resource_id, parent_owner_id,
                                   state, revision, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?8)",
        params![
            deployment,
            owner_id,
            scope.as_str(),
            owner_type.as_str(),
            resource_id,
            parent_owner_id,
            state.as_str(),
            now
        ],
    );
    match inserted {
        Ok(_) => {}
        Err(e) if is_constraint(&e) => return Err(RegistryError::ResourceOwned),
        Err(e) => return Err(e.into()),
    }
    get_owner_in(conn, deployment, &owner_id)?.ok_or(RegistryError::OwnerNotFound)
}

/// The `primary_thread` owner of a new scope (active; its resource is the thread id).
pub(super) fn insert_primary_owner_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    thread: &ThreadId,
    now: i64,
) -> Result<OwnerRecord, RegistryError> {
    insert_owner_in(
        conn,
        deployment,
        scope,
        OwnerType::PrimaryThread,
        Some(thread.as_str()),
        None,
        OwnerState::Active,
        now,
    )
}

/// CAS state change of one owner (transition table; optional revision check).
pub(super) fn set_owner_state_in(
    conn: &Conn<'_>,
    deployment: &str,
    owner: &OwnerRecord,
    expected_revision: Option<u64>,
    to: OwnerState,
    now: i64,
) -> Result<OwnerRecord, RegistryError> {
    let changed = conn.execute(
        "UPDATE scope_owners
         SET state = ?1, revision = revision + 1, updated_at = ?2,
             terminal_at = CASE WHEN ?1 IN ('terminal', 'failed', 'quarantined') THEN COALESCE(terminal_at, ?2) ELSE terminal_at END
         WHERE deployment_id = ?3 AND owner_id = ?4 AND revision = ?5
           AND EXISTS (SELECT 1 FROM owner_state_transitions WHERE from_state = scope_owners.state AND to_state = ?1)",
        params![to.as_str(), now, deployment, owner.owner_id, to_i64(expected_revision.unwrap_or(owner.revision))],
    )?;
    let current = get_owner_in(conn, deployment, &owner.owner_id)?.ok_or(RegistryError::OwnerNotFound)?;
    if changed != 1 {
        return Err(RegistryError::OwnerConflict {
            stale_revision: current.revision != expected_revision.unwrap_or(owner.revision),
            current_revision: current.revision,
            current_state: current.state,
            requested: to,
        });
    }
    Ok(current)
}

/// Attaches `resource_id` to an owner that has none (the same id again is a no-op).
pub(super) fn attach_resource_in(
    conn: &Conn<'_>,
    deployment: &str,
    owner: &OwnerRecord,
    resource_id: &str,
    now: i64,
) -> Result<OwnerRecord, RegistryError> {
    validate_resource_id(resource_id)?;
    match owner.resource_id.as_deref() {
        Some(existing) if existing == resource_id => return Ok(owner.clone()),
        Some(_) => return Err(RegistryError::ResourceIdAlreadySet),
        None => {}
    }
    let updated = conn.execute(
        "UPDATE scope_owners SET resource_id = ?1, revision = revision + 1, updated_at = ?2
         WHERE deployment_id = ?3 AND owner_id = ?4 AND resource_id IS NULL",
        params![resource_id, now, deployment, owner.owner_id],
    );
    match updated {
        Ok(1) => {}
        Ok(_) => return Err(RegistryError::ResourceIdAlreadySet),
        Err(e) if is_constraint(&e) => return Err(RegistryError::ResourceOwned),
        Err(e) => return Err(e.into()),
    }
    get_owner_in(conn, deployment, &owner.owner_id)?.ok_or(RegistryError::OwnerNotFound)
}

/// `ScopeUnavailable` unless the scope accepts new owners and activity (`draft` or `active`).
pub(super) fn require_open_scope_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
) -> Result<ScopeState, RegistryError> {
    let rec = get_scope_in(conn, deployment, scope)?.ok_or(RegistryError::NotFound)?;
    match rec.state {
        ScopeState::Draft | ScopeState::Active => Ok(rec.state),
        other => Err(RegistryError::ScopeUnavailable(other)),
    }
}

impl DeploymentRegistry {
    /// Registers an owner in a draft or active scope (never while a blocking lease is held, never in
    /// a deleting/deleted scope). Registering the same resource of the same type in the same scope
    /// again returns the existing owner (`created = false`); in another scope it is `ResourceOwned`.
    pub fn create_owner(&self, scope: &ScopeId, new: &NewOwner) -> Result<(OwnerRecord, bool), RegistryError> {
        self.create_owner_under_lease(scope, new, None)
    }

    /// `create_owner` by the holder of the blocking lease `holder` names (its `operation_id`): not
    /// refused by that lease, still by another.
    pub fn create_owner_under_lease(
        &self,
        scope: &ScopeId,
        new: &NewOwner,
        holder: Option<&str>,
    ) -> Result<(OwnerRecord, bool), RegistryError> {
        let deployment = self.id.as_str();
        if let Some(r) = &new.resource_id {
            validate_resource_id(r)?;
        }
        if new.owner_type == OwnerType::PrimaryThread {
            return Err(RegistryError::Invalid {
                field: "owner_type",
                reason: "the primary_thread owner is created by provision",
            });
        }
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        refuse_unless_holder_in(&tx, deployment, now, holder)?;
        require_open_scope_in(&tx, deployment, scope)?;
        if let Some(parent) = &new.parent_owner_id {
            let p = get_owner_in(&tx, deployment, parent)?;
            if p.is_none_or(|p| &p.scope_id != scope) {
                return Err(RegistryError::OwnerNotFound);
            }
        }
        if let Some(r) = &new.resource_id {
            if let Some(existing) = find_by_resource_in(&tx, deployment, Some(new.owner_type), r)? {
                if &existing.scope_id == scope {
                    return Ok((existing, false));
                }
                return Err(RegistryError::ResourceOwned);
            }
        }
        let owner = insert_owner_in(
            &tx,
            deployment,
            scope,
            new.owner_type,
            new.resource_id.as_deref(),
            new.parent_owner_id.as_deref(),
            OwnerState::Reserved,
            now,
        )?;
        if owner.owner_type == OwnerType::Cron {
            // Cron creation is a saga: `applying` until the cron is active, compensated if it never is.
            let key = owner.resource_id.as_deref().unwrap_or(&owner.owner_id);
            record_owner_op_in(&tx, deployment, &format!("cron:{key}"), scope, super::CRON_KIND, &owner.owner_id, now)?;
        }
        tx.commit()?;
        Ok((owner, true))
    }

    /// Attaches a resource and/or changes the state of an owner of `scope`. Becoming `active` is
    /// refused unless the scope is draft or active; `terminal`/`quarantined` never become `active`.
    pub fn update_owner(
        &self,
        scope: &ScopeId,
        owner_id: &str,
        update: &OwnerUpdate,
    ) -> Result<OwnerRecord, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let mut owner = get_owner_in(&tx, deployment, owner_id)?
            .filter(|o| &o.scope_id == scope)
            .ok_or(RegistryError::OwnerNotFound)?;
        if let Some(expected) = update.expected_revision {
            if expected != owner.revision {
                return Err(RegistryError::OwnerConflict {
                    stale_revision: true,
                    current_revision: owner.revision,
                    current_state: owner.state,
                    requested: update.state.unwrap_or(owner.state),
                });
            }
        }
        if let Some(r) = &update.resource_id {
            owner = attach_resource_in(&tx, deployment, &owner, r, now)?;
        }
        if let Some(to) = update.state.filter(|to| *to != owner.state) {
            if to == OwnerState::Active {
                require_open_scope_in(&tx, deployment, scope)?;
            }
            let from = owner.state;
            owner = set_owner_state_in(&tx, deployment, &owner, None, to, now)?;
            if owner.owner_type == OwnerType::Cron {
                follow_cron_operation_in(&tx, deployment, &owner.owner_id, from, to, now)?;
            }
        }
        tx.commit()?;
        Ok(owner)
    }

    /// The owner of `resource_id` in `scope` (optionally of one type). An owner in another scope is
    /// not found; several types holding the same id without `owner_type` is `AmbiguousResource`.
    pub fn owner_by_resource(
        &self,
        scope: &ScopeId,
        resource_id: &str,
        owner_type: Option<OwnerType>,
    ) -> Result<OwnerRecord, RegistryError> {
        let deployment = self.id.as_str();
        validate_resource_id(resource_id)?;
        let conn = self.db.conn()?;
        let sql = format!(
            "SELECT {COLUMNS} FROM scope_owners
             WHERE deployment_id = ?1 AND scope_id = ?2 AND resource_id = ?3 AND (CAST(?4 AS TEXT) IS NULL OR owner_type = ?4)
             ORDER BY created_at LIMIT 2"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows =
            stmt.query_map(params![deployment, scope.as_str(), resource_id, owner_type.map(|t| t.as_str())], from_row)?;
        let mut found = Vec::new();
        for raw in rows {
            found.push(validate(raw?)?);
        }
        match found.len() {
            0 => Err(RegistryError::OwnerNotFound),
            1 => Ok(found.remove(0)),
            _ => Err(RegistryError::AmbiguousResource),
        }
    }

    /// One owner of `scope`.
    pub fn owner(&self, scope: &ScopeId, owner_id: &str) -> Result<OwnerRecord, RegistryError> {
        let deployment = self.id.as_str();
        get_owner_in(&self.db.conn()?, deployment, owner_id)?
            .filter(|o| &o.scope_id == scope)
            .ok_or(RegistryError::OwnerNotFound)
    }

    /// Every owner of a scope, oldest first.
    pub fn owners(&self, scope: &ScopeId) -> Result<Vec<OwnerRecord>, RegistryError> {
        let deployment = self.id.as_str();
        owners_of_in(&self.db.conn()?, deployment, scope)
    }
}

/// Moves a cron's operation with its owner: active → `completed`; settled before it was ever
/// active → `compensated` (the cron was not created).
fn follow_cron_operation_in(
    conn: &Conn<'_>,
    deployment: &str,
    owner_id: &str,
    from: OwnerState,
    to: OwnerState,
    now: i64,
) -> Result<(), RegistryError> {
    let Some(op) = op_for_owner_in(conn, deployment, super::CRON_KIND, owner_id)? else { return Ok(()) };
    if to == OwnerState::Active {
        set_op_in(conn, deployment, &op.operation_id, OperationState::Completed, None, now)?;
    } else if to.is_settled() && matches!(from, OwnerState::Reserved | OwnerState::Draining) {
        compensate_op_in(conn, deployment, &op.operation_id, &format!("cron_{to}"), now)?;
    }
    Ok(())
}

/// The owner holding `resource_id` (of `owner_type`, if given) anywhere in the deployment.
fn find_by_resource_in(
    conn: &Conn<'_>,
    deployment: &str,
    owner_type: Option<OwnerType>,
    resource_id: &str,
) -> Result<Option<OwnerRecord>, RegistryError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM scope_owners
         WHERE deployment_id = ?1 AND resource_id = ?2 AND (CAST(?3 AS TEXT) IS NULL OR owner_type = ?3) LIMIT 1"
    );
    conn.query_row(&sql, params![deployment, resource_id, owner_type.map(|t| t.as_str())], from_row)
        .optional()?
        .map(validate)
        .transpose()
}
