//! SQL of `deployment_locks`: expiring deployment-wide leases (acquire, renew, release) and the cutover gate.

use crate::registry::db::{params, Conn, OptionalExtension};

use super::{validate_key, DeploymentRegistry, RegistryError};

/// Leases that, while held and unexpired, refuse new scopes, owners and run reservations.
pub const BLOCKING_LEASES: [&str; 2] = ["workspace-cutover", "maintenance"];

/// One held lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct Lease {
    pub lock_name: String,
    pub operation_id: String,
    /// Unix milliseconds.
    pub expires_at: i64,
    pub created_at: i64,
}

/// `CutoverInProgress` if a blocking lease is held (unexpired) at `now`.
pub(super) fn refuse_if_blocked_in(conn: &Conn<'_>, deployment: &str, now: i64) -> Result<(), RegistryError> {
    refuse_unless_holder_in(conn, deployment, now, None)
}

/// `CutoverInProgress` if a blocking lease is held (unexpired) at `now` by an operation other than
/// `holder`: the holder works under its own lease (a cutover creates the scopes it migrates and
/// registers their owners), everyone else waits.
pub(super) fn refuse_unless_holder_in(
    conn: &Conn<'_>,
    deployment: &str,
    now: i64,
    holder: Option<&str>,
) -> Result<(), RegistryError> {
    let held: Option<String> = conn
        .query_row(
            "SELECT lock_name FROM deployment_locks
             WHERE deployment_id = ?1 AND lock_name IN (?2, ?3) AND expires_at > ?4
               AND operation_id IS DISTINCT FROM CAST(?5 AS TEXT)
             ORDER BY lock_name LIMIT 1",
            params![deployment, BLOCKING_LEASES[0], BLOCKING_LEASES[1], now, holder],
            |r| r.get(0),
        )
        .optional()?;
    match held {
        Some(name) => Err(RegistryError::CutoverInProgress(name)),
        None => Ok(()),
    }
}

fn validate_lock_name(name: &str) -> Result<(), RegistryError> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(())
        .ok_or(RegistryError::Invalid { field: "lock_name", reason: "must be 1-64 characters of [a-z0-9-]" })
}

fn validate_ttl(ttl_ms: i64) -> Result<(), RegistryError> {
    // At most one day: a lease is renewed by its holder, never parked.
    (1..=86_400_000)
        .contains(&ttl_ms)
        .then_some(())
        .ok_or(RegistryError::Invalid { field: "ttl_seconds", reason: "must be between 1 and 86400" })
}

fn get_in(conn: &Conn<'_>, deployment: &str, name: &str) -> Result<Option<Lease>, RegistryError> {
    Ok(conn
        .query_row(
            "SELECT lock_name, operation_id, expires_at, created_at FROM deployment_locks
             WHERE deployment_id = ?1 AND lock_name = ?2",
            params![deployment, name],
            |r| {
                Ok(Lease {
                    lock_name: r.get(0)?,
                    operation_id: r.get(1)?,
                    expires_at: r.get(2)?,
                    created_at: r.get(3)?,
                })
            },
        )
        .optional()?)
}

impl DeploymentRegistry {
    /// Takes the lease `name` for `operation_id` for `ttl_ms`: granted if it is free, expired, or
    /// already held by the same operation (then it is extended); else `LeaseHeld`.
    pub fn acquire_lease(&self, name: &str, operation_id: &str, ttl_ms: i64) -> Result<Lease, RegistryError> {
        let deployment = self.id.as_str();
        validate_lock_name(name)?;
        validate_key("operation_id", operation_id)?;
        validate_ttl(ttl_ms)?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let changed = tx.execute(
            "INSERT INTO deployment_locks (deployment_id, lock_name, operation_id, expires_at, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5)
             ON CONFLICT (deployment_id, lock_name) DO UPDATE
                SET operation_id = excluded.operation_id, expires_at = excluded.expires_at,
                    created_at = CASE WHEN deployment_locks.operation_id = excluded.operation_id
                                      THEN deployment_locks.created_at ELSE excluded.created_at END,
                    updated_at = excluded.updated_at
                WHERE deployment_locks.expires_at <= ?5 OR deployment_locks.operation_id = excluded.operation_id",
            params![deployment, name, operation_id, now.saturating_add(ttl_ms), now],
        )?;
        if changed != 1 {
            return Err(RegistryError::LeaseHeld);
        }
        let lease = get_in(&tx, deployment, name)?.ok_or(RegistryError::LeaseNotHeld)?;
        tx.commit()?;
        Ok(lease)
    }

    /// Extends the lease by `ttl_ms` from now; only its holder may, and only before it expired.
    pub fn renew_lease(&self, name: &str, operation_id: &str, ttl_ms: i64) -> Result<Lease, RegistryError> {
        let deployment = self.id.as_str();
        validate_lock_name(name)?;
        validate_key("operation_id", operation_id)?;
        validate_ttl(ttl_ms)?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let changed = tx.execute(
            "UPDATE deployment_locks SET expires_at = ?1, updated_at = ?2
             WHERE deployment_id = ?3 AND lock_name = ?4 AND operation_id = ?5 AND expires_at > ?2",
            params![now.saturating_add(ttl_ms), now, deployment, name, operation_id],
        )?;
        if changed != 1 {
            return Err(RegistryError::LeaseNotHeld);
        }
        let lease = get_in(&tx, deployment, name)?.ok_or(RegistryError::LeaseNotHeld)?;
        tx.commit()?;
        Ok(lease)
    }

    /// Releases the lease held by `operation_id` (expired or not). Releasing a lease that is not
    /// there is a no-op (`Ok(false)`); one held by another operation is `LeaseNotHeld`.
    pub fn release_lease(&self, name: &str, operation_id: &str) -> Result<bool, RegistryError> {
        let deployment = self.id.as_str();
        validate_lock_name(name)?;
        validate_key("operation_id", operation_id)?;
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let Some(lease) = get_in(&tx, deployment, name)? else {
            return Ok(false);
        };
        if lease.operation_id != operation_id {
            return Err(RegistryError::LeaseNotHeld);
        }
        tx.execute(
            "DELETE FROM deployment_locks WHERE deployment_id = ?1 AND lock_name = ?2 AND operation_id = ?3",
            params![deployment, name, operation_id],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// The lease `name` if it is held and unexpired.
    pub fn lease(&self, name: &str) -> Result<Option<Lease>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        Ok(get_in(&self.db.conn()?, deployment, name)?.filter(|l| l.expires_at > now))
    }

    /// `CutoverInProgress` while a blocking lease is held.
    pub fn refuse_if_blocked(&self) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        refuse_if_blocked_in(&self.db.conn()?, deployment, now)
    }
}
