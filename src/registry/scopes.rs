//! SQL of the `scopes` table: create, look up, list and compare-and-set state transitions.

use crate::registry::db::{params, Conn, OptionalExtension, Row};

use super::{to_i64, to_u64, DeploymentRegistry, RegistryError, ScopeRecord, ScopeState};
use crate::engine::Quota;
use crate::ids::{ScopeId, ThreadId};

pub(super) const COLUMNS: &str = "deployment_id, scope_id, primary_thread_id, state, revision, quota_bytes, \
                       quota_inodes, created_at, updated_at, deleted_at, delete_blocked_by, purged_at, user_id";

/// The one statement every scope state change goes through: revision CAS plus the transition table.
const TRANSITION_SQL: &str = "UPDATE scopes
    SET state = ?1, revision = revision + 1, updated_at = ?2,
        deleted_at = CASE WHEN ?1 = 'deleted' THEN ?2 ELSE deleted_at END,
        delete_blocked_by = NULL
    WHERE deployment_id = ?3 AND scope_id = ?4 AND revision = ?5
      AND EXISTS (SELECT 1 FROM scope_state_transitions
                  WHERE from_state = scopes.state AND to_state = ?1)";

pub(super) fn from_row(row: &Row<'_>) -> crate::registry::db::Result<RawScope> {
    Ok(RawScope {
        deployment_id: row.get(0)?,
        scope_id: row.get(1)?,
        primary_thread_id: row.get(2)?,
        state: row.get(3)?,
        revision: row.get(4)?,
        quota_bytes: row.get(5)?,
        quota_inodes: row.get(6)?,
        created_at: row.get(7)?,
        updated_at: row.get(8)?,
        deleted_at: row.get(9)?,
        delete_blocked_by: row.get(10)?,
        purged_at: row.get(11)?,
        user_id: row.get(12)?,
    })
}

/// A row as stored, before validation.
pub(super) struct RawScope {
    deployment_id: String,
    scope_id: String,
    primary_thread_id: String,
    state: String,
    revision: i64,
    quota_bytes: Option<i64>,
    quota_inodes: Option<i64>,
    created_at: i64,
    updated_at: i64,
    deleted_at: Option<i64>,
    delete_blocked_by: Option<String>,
    purged_at: Option<i64>,
    user_id: Option<String>,
}

impl RawScope {
    pub(super) fn validate(self) -> Result<ScopeRecord, RegistryError> {
        let bad = |what: &str| RegistryError::Corrupt(format!("invalid {what} in scopes"));
        let quota = match (self.quota_bytes, self.quota_inodes) {
            (Some(b), Some(i)) => Some(Quota { bytes: to_u64(b, "quota_bytes")?, inodes: to_u64(i, "quota_inodes")? }),
            (None, None) => None,
            _ => return Err(bad("partial quota")),
        };
        let delete_blocked_by = match self.delete_blocked_by {
            Some(json) => serde_json::from_str(&json).map_err(|_| bad("delete_blocked_by"))?,
            None => Vec::new(),
        };
        Ok(ScopeRecord {
            deployment_id: self.deployment_id,
            scope_id: ScopeId::parse(&self.scope_id).map_err(|_| bad("scope_id"))?,
            primary_thread_id: ThreadId::parse_stored(&self.primary_thread_id).map_err(|_| bad("primary_thread_id"))?,
            state: self.state.parse()?,
            revision: to_u64(self.revision, "revision")?,
            quota,
            created_at: self.created_at,
            updated_at: self.updated_at,
            deleted_at: self.deleted_at,
            delete_blocked_by,
            purged_at: self.purged_at,
            user_id: self.user_id,
        })
    }
}

/// Reads one scope by id.
pub(super) fn get_in(conn: &Conn<'_>, deployment: &str, scope: &ScopeId) -> Result<Option<ScopeRecord>, RegistryError> {
    let sql = format!("SELECT {COLUMNS} FROM scopes WHERE deployment_id = ?1 AND scope_id = ?2");
    let raw = conn.query_row(&sql, params![deployment, scope.as_str()], from_row).optional()?;
    raw.map(RawScope::validate).transpose()
}

/// Reads the scope bound to a thread.
pub(super) fn find_by_thread_in(
    conn: &Conn<'_>,
    deployment: &str,
    thread: &ThreadId,
) -> Result<Option<ScopeRecord>, RegistryError> {
    let sql = format!("SELECT {COLUMNS} FROM scopes WHERE deployment_id = ?1 AND primary_thread_id = ?2");
    let raw = conn.query_row(&sql, params![deployment, thread.as_str()], from_row).optional()?;
    raw.map(RawScope::validate).transpose()
}

/// Inserts a new scope in `provisioning`; a thread that already has a scope is refused.
pub(super) fn insert_in(
    conn: &Conn<'_>,
    deployment: &str,
    thread: &ThreadId,
    quota: Option<Quota>,
    now: i64,
) -> Result<ScopeRecord, RegistryError> {
    if let Some(existing) = find_by_thread_in(conn, deployment, thread)? {
        return Err(RegistryError::ThreadAlreadyBound(existing.scope_id));
    }
    let scope = ScopeId::generate();
    let inserted = conn.execute(
        "INSERT INTO scopes (deployment_id, scope_id, primary_thread_id, state, revision,
                             quota_bytes, quota_inodes, created_at, updated_at)
         VALUES (?1, ?2, ?3, 'provisioning', 1, ?4, ?5, ?6, ?6)",
        params![
            deployment,
            scope.as_str(),
            thread.as_str(),
            quota.map(|q| to_i64(q.bytes)),
            quota.map(|q| to_i64(q.inodes)),
            now
        ],
    );
    match inserted {
        Ok(_) => {}
        // The thread was checked above under the write lock: a violation here is a reused scope id.
        Err(e) if e.is_constraint() => return Err(RegistryError::Corrupt("scope id collision".into())),
        Err(e) => return Err(e.into()),
    }
    get_in(conn, deployment, &scope)?.ok_or(RegistryError::NotFound)
}

/// Applies one state transition (revision CAS + transition table) inside the caller's transaction.
pub(super) fn transition_in(
    conn: &Conn<'_>,
    deployment: &str,
    scope: &ScopeId,
    expected_revision: u64,
    to: ScopeState,
    now: i64,
) -> Result<ScopeRecord, RegistryError> {
    let changed =
        conn.execute(TRANSITION_SQL, params![to.as_str(), now, deployment, scope.as_str(), to_i64(expected_revision)])?;
    let current = get_in(conn, deployment, scope)?.ok_or(RegistryError::NotFound)?;
    if changed != 1 {
        return Err(RegistryError::Conflict {
            expected_revision,
            current_revision: current.revision,
            current_state: current.state,
            requested: to,
        });
    }
    Ok(current)
}

impl DeploymentRegistry {
    /// Creates a scope for `thread` in state `provisioning` (revision 1).
    pub fn create_scope(&self, thread: &ThreadId, quota: Option<Quota>) -> Result<ScopeRecord, RegistryError> {
        let deployment = self.id.as_str();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let now = self.now_ms();
        let rec = insert_in(&tx, deployment, thread, quota, now)?;
        super::owners::insert_primary_owner_in(&tx, deployment, &rec.scope_id, thread, now)?;
        tx.commit()?;
        Ok(rec)
    }

    /// The scope bound to `thread`, if any.
    pub fn find_by_thread(&self, thread: &ThreadId) -> Result<Option<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        find_by_thread_in(&self.db.conn()?, deployment, thread)
    }

    /// The scope with id `scope`, if any.
    pub fn get(&self, scope: &ScopeId) -> Result<Option<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        get_in(&self.db.conn()?, deployment, scope)
    }

    /// Every scope of the deployment, oldest first.
    pub fn list(&self) -> Result<Vec<ScopeRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let sql = format!("SELECT {COLUMNS} FROM scopes WHERE deployment_id = ?1 ORDER BY created_at, scope_id");
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params![deployment], from_row)?;
        let mut out = Vec::new();
        for raw in rows {
            out.push(raw?.validate()?);
        }
        Ok(out)
    }

    /// Binds `scope` to `user` if it has no user yet; returns the user it belongs to afterwards
    /// (`user` or the one bound before: the caller compares). `NotFound` for an unknown scope.
    pub fn bind_scope_user(&self, scope: &ScopeId, user: &str) -> Result<String, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        conn.execute(
            "UPDATE scopes SET user_id = ?3 WHERE deployment_id = ?1 AND scope_id = ?2 AND user_id IS NULL",
            params![deployment, scope.as_str(), user],
        )?;
        let bound: Option<Option<String>> = conn
            .query_row(
                "SELECT user_id FROM scopes WHERE deployment_id = ?1 AND scope_id = ?2",
                params![deployment, scope.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        bound.flatten().ok_or(RegistryError::NotFound)
    }

    /// Compare-and-set state change: succeeds only if the scope is at `expected_revision` and
    /// `current → to` is an allowed transition; then the revision is incremented.
    pub fn transition(
        &self,
        scope: &ScopeId,
        expected_revision: u64,
        to: ScopeState,
    ) -> Result<ScopeRecord, RegistryError> {
        let deployment = self.id.as_str();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = transition_in(&tx, deployment, scope, expected_revision, to, self.now_ms())?;
        tx.commit()?;
        Ok(rec)
    }
}

#[cfg(test)]
impl super::Registry {
    /// Whether `from → to` is in the transition table.
    pub fn transition_allowed(&self, from: ScopeState, to: ScopeState) -> Result<bool, RegistryError> {
        let conn = self.db.conn()?;
        let found = conn
            .query_row(
                "SELECT 1 FROM scope_state_transitions WHERE from_state = ?1 AND to_state = ?2",
                params![from.as_str(), to.as_str()],
                |_| Ok(()),
            )
            .optional()?;
        Ok(found.is_some())
    }
}
