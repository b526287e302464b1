//! SQL of signed-request authentication (seed 003 §4.3): single-use nonces in `auth_nonces` (with
//! expiry cleanup), and which scope a signed request's `auth_context.thread_id` acts in.

use crate::registry::db::params;

use super::scopes::{find_by_thread_in, get_in as get_scope_in};
use super::{validate_key, DeploymentRegistry, OwnerType, RegistryError, ScopeRecord};
use crate::ids::{ScopeId, ThreadId};

/// Owner types whose `resource_id` is a thread id: such a thread acts in its owner's scope.
pub const THREAD_OWNER_TYPES: &[OwnerType] = &[OwnerType::AsyncThread, OwnerType::MemoryWorker, OwnerType::Cron];

/// How a thread is bound to the scope it acts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadRole {
    /// The scope's primary thread.
    Primary,
    /// A thread registered as an owner (`reserved` or `active`) of one of [`THREAD_OWNER_TYPES`].
    Owner { owner_id: String, owner_type: OwnerType },
}

/// The scope a thread acts in, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadBinding {
    pub scope: ScopeRecord,
    pub role: ThreadRole,
}

impl DeploymentRegistry {
    /// Records `nonce` as used until `expires_at_ms`; `Replayed`-style `false` if it was already
    /// recorded and has not expired. Expired nonces are deleted in the same transaction.
    pub fn consume_nonce(&self, nonce: &str, expires_at_ms: i64) -> Result<bool, RegistryError> {
        let deployment = self.id.as_str();
        validate_key("nonce", nonce)?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM auth_nonces WHERE expires_at < ?1", params![now])?;
        let inserted = tx.execute(
            "INSERT INTO auth_nonces (deployment_id, nonce, expires_at, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT DO NOTHING",
            params![deployment, nonce, expires_at_ms.max(now), now],
        )?;
        tx.commit()?;
        Ok(inserted == 1)
    }

    /// Number of nonces currently remembered (tests and metrics).
    pub fn nonce_count(&self) -> Result<u64, RegistryError> {
        let deployment = self.id.as_str();
        let n: i64 = self.db.conn()?.query_row(
            "SELECT COUNT(*) FROM auth_nonces WHERE deployment_id = ?1",
            params![deployment],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// The scope `thread` acts in: the scope whose primary thread it is, else the scope of the
    /// `reserved` or `active` owner of a thread type ([`THREAD_OWNER_TYPES`]) holding it as
    /// resource. `None` if neither exists (the scope's own state is the caller's to judge).
    pub fn thread_binding(&self, thread: &ThreadId) -> Result<Option<ThreadBinding>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        if let Some(scope) = find_by_thread_in(&conn, deployment, thread)? {
            return Ok(Some(ThreadBinding { scope, role: ThreadRole::Primary }));
        }
        // Every live owner holding the thread, oldest first; the first of a thread type binds it
        // (filtered here, so the list of thread types is one Rust constant and nothing else).
        let mut stmt = conn.prepare(
            "SELECT owner_id, scope_id, owner_type FROM scope_owners
             WHERE deployment_id = ?1 AND resource_id = ?2 AND state IN ('reserved', 'active')
             ORDER BY created_at, owner_id",
        )?;
        let rows = stmt.query_map(params![deployment, thread.as_str()], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })?;
        let mut owner = None;
        for row in rows {
            let row = row?;
            if THREAD_OWNER_TYPES.iter().any(|t| t.as_str() == row.2) {
                owner = Some(row);
                break;
            }
        }
        drop(stmt);
        let Some((owner_id, scope_id, owner_type)) = owner else { return Ok(None) };
        let scope_id =
            ScopeId::parse(&scope_id).map_err(|_| RegistryError::Corrupt("invalid scope_id in scope_owners".into()))?;
        let Some(scope) = get_scope_in(&conn, deployment, &scope_id)? else { return Ok(None) };
        Ok(Some(ThreadBinding { scope, role: ThreadRole::Owner { owner_id, owner_type: owner_type.parse()? } }))
    }
}

#[cfg(test)]
mod tests {
    use crate::registry::Registry;
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::registry::{NewOwner, OwnerState, OwnerUpdate};

    #[test]
    fn a_nonce_is_accepted_once_until_it_expires() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let reg = Arc::new(Registry::open_for_tests().unwrap().with_clock(clock.clone()));
        assert!(reg.deployment("d").consume_nonce("n1", 1_300_000).unwrap());
        assert!(!reg.deployment("d").consume_nonce("n1", 1_300_000).unwrap(), "replay");
        assert!(reg.deployment("other").consume_nonce("n1", 1_300_000).unwrap(), "per deployment");
        assert!(reg.deployment("d").consume_nonce("n2", 1_300_000).unwrap());
        clock.set_ms(1_300_001);
        assert!(reg.deployment("d").consume_nonce("n3", 1_600_000).unwrap());
        assert_eq!(reg.deployment("d").nonce_count().unwrap(), 1, "expired nonces are cleaned up");
        assert!(reg.deployment("d").consume_nonce("bad nonce", 1).is_err());
    }

    #[test]
    fn threads_bind_as_primary_or_as_a_live_thread_owner() {
        let reg = Arc::new(Registry::open_for_tests().unwrap());
        let main = ThreadId::parse("thr_main").unwrap();
        let rec = reg.deployment("d").create_scope(&main, None).unwrap();
        let rec = reg.deployment("d").complete_provision(&rec.scope_id).unwrap();
        let b = reg.deployment("d").thread_binding(&main).unwrap().unwrap();
        assert_eq!((b.scope.scope_id.clone(), b.role), (rec.scope_id.clone(), ThreadRole::Primary));

        let child = ThreadId::parse("thr_child").unwrap();
        assert_eq!(reg.deployment("d").thread_binding(&child).unwrap(), None);
        let new = NewOwner {
            owner_type: OwnerType::AsyncThread,
            resource_id: Some("thr_child".into()),
            parent_owner_id: None,
        };
        let (owner, _) = reg.deployment("d").create_owner(&rec.scope_id, &new).unwrap();
        let b = reg.deployment("d").thread_binding(&child).unwrap().unwrap();
        assert_eq!(b.scope.scope_id, rec.scope_id);
        assert_eq!(b.role, ThreadRole::Owner { owner_id: owner.owner_id.clone(), owner_type: OwnerType::AsyncThread });
        assert_eq!(reg.deployment("other").thread_binding(&child).unwrap(), None);

        // A settled owner no longer acts; neither does a resource of a non-thread type.
        let done = OwnerUpdate { state: Some(OwnerState::Terminal), ..Default::default() };
        reg.deployment("d").update_owner(&rec.scope_id, &owner.owner_id, &done).unwrap();
        assert_eq!(reg.deployment("d").thread_binding(&child).unwrap(), None);
        let env =
            NewOwner { owner_type: OwnerType::Environment, resource_id: Some("thr_env".into()), parent_owner_id: None };
        reg.deployment("d").create_owner(&rec.scope_id, &env).unwrap();
        assert_eq!(reg.deployment("d").thread_binding(&ThreadId::parse("thr_env").unwrap()).unwrap(), None);
    }
}
