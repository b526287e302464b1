//! SQL of signed-request authentication (seed 003 §4.3): single-use nonces in `auth_nonces` (with
//! expiry cleanup), and which scope a signed request's `auth_context.thread_id` acts in.

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::scopes::{find_by_thread_in, get_in as get_scope_in};
use super::{validate_key, OwnerType, Registry, RegistryError, ScopeRecord};
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

impl Registry {
    /// Records `nonce` as used until `expires_at_ms`; `Replayed`-style `false` if it was already
    /// recorded and has not expired. Expired nonces are deleted in the same transaction.
    pub fn consume_nonce(&self, deployment: &str, nonce: &str, expires_at_ms: i64) -> Result<bool, RegistryError> {
        validate_key("nonce", nonce)?;
        let now = self.now_ms();
        let mut conn = self.conn.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM auth_nonces WHERE expires_at < ?1", params![now])?;
        let inserted = tx.execute(
            "INSERT OR IGNORE INTO auth_nonces (deployment_id, nonce, expires_at, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![deployment, nonce, expires_at_ms.max(now), now],
        )?;
        tx.commit()?;
        Ok(inserted == 1)
    }

    /// Number of nonces currently remembered (tests and metrics).
    pub fn nonce_count(&self, deployment: &str) -> Result<u64, RegistryError> {
        let n: i64 = self.conn.lock().query_row(
            "SELECT COUNT(*) FROM auth_nonces WHERE deployment_id = ?1",
            params![deployment],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// The scope `thread` acts in: the scope whose primary thread it is, else the scope of the
    /// `reserved` or `active` owner of a thread type ([`THREAD_OWNER_TYPES`]) holding it as
    /// resource. `None` if neither exists (the scope's own state is the caller's to judge).
    pub fn thread_binding(&self, deployment: &str, thread: &ThreadId) -> Result<Option<ThreadBinding>, RegistryError> {
        let conn = self.conn.lock();
        if let Some(scope) = find_by_thread_in(&conn, deployment, thread)? {
            return Ok(Some(ThreadBinding { scope, role: ThreadRole::Primary }));
        }
        let types: Vec<&str> = THREAD_OWNER_TYPES.iter().map(|t| t.as_str()).collect();
        let owner: Option<(String, String, String)> = conn
            .query_row(
                "SELECT owner_id, scope_id, owner_type FROM scope_owners
                 WHERE deployment_id = ?1 AND resource_id = ?2 AND state IN ('reserved', 'active')
                   AND owner_type IN (?3, ?4, ?5)
                 ORDER BY created_at LIMIT 1",
                params![deployment, thread.as_str(), types[0], types[1], types[2]],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((owner_id, scope_id, owner_type)) = owner else { return Ok(None) };
        let scope_id =
            ScopeId::parse(&scope_id).map_err(|_| RegistryError::Corrupt("invalid scope_id in scope_owners".into()))?;
        let Some(scope) = get_scope_in(&conn, deployment, &scope_id)? else { return Ok(None) };
        Ok(Some(ThreadBinding { scope, role: ThreadRole::Owner { owner_id, owner_type: owner_type.parse()? } }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::registry::{NewOwner, OwnerState, OwnerUpdate};

    #[test]
    fn a_nonce_is_accepted_once_until_it_expires() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let reg = Registry::open_in_memory().unwrap().with_clock(clock.clone());
        assert!(reg.consume_nonce("d", "n1", 1_300_000).unwrap());
        assert!(!reg.consume_nonce("d", "n1", 1_300_000).unwrap(), "replay");
        assert!(reg.consume_nonce("other", "n1", 1_300_000).unwrap(), "per deployment");
        assert!(reg.consume_nonce("d", "n2", 1_300_000).unwrap());
        clock.set_ms(1_300_001);
        assert!(reg.consume_nonce("d", "n3", 1_600_000).unwrap());
        assert_eq!(reg.nonce_count("d").unwrap(), 1, "expired nonces are cleaned up");
        assert!(reg.consume_nonce("d", "bad nonce", 1).is_err());
    }

    #[test]
    fn threads_bind_as_primary_or_as_a_live_thread_owner() {
        let reg = Registry::open_in_memory().unwrap();
        let main = ThreadId::parse("thr_main").unwrap();
        let rec = reg.create_scope("d", &main, None).unwrap();
        let rec = reg.complete_provision("d", &rec.scope_id).unwrap();
        let b = reg.thread_binding("d", &main).unwrap().unwrap();
        assert_eq!((b.scope.scope_id.clone(), b.role), (rec.scope_id.clone(), ThreadRole::Primary));

        let child = ThreadId::parse("thr_child").unwrap();
        assert_eq!(reg.thread_binding("d", &child).unwrap(), None);
        let new = NewOwner {
            owner_type: OwnerType::AsyncThread,
            resource_id: Some("thr_child".into()),
            parent_owner_id: None,
        };
        let (owner, _) = reg.create_owner("d", &rec.scope_id, &new).unwrap();
        let b = reg.thread_binding("d", &child).unwrap().unwrap();
        assert_eq!(b.scope.scope_id, rec.scope_id);
        assert_eq!(b.role, ThreadRole::Owner { owner_id: owner.owner_id.clone(), owner_type: OwnerType::AsyncThread });
        assert_eq!(reg.thread_binding("other", &child).unwrap(), None);

        // A settled owner no longer acts; neither does a resource of a non-thread type.
        let done = OwnerUpdate { state: Some(OwnerState::Terminal), ..Default::default() };
        reg.update_owner("d", &rec.scope_id, &owner.owner_id, &done).unwrap();
        assert_eq!(reg.thread_binding("d", &child).unwrap(), None);
        let env =
            NewOwner { owner_type: OwnerType::Environment, resource_id: Some("thr_env".into()), parent_owner_id: None };
        reg.create_owner("d", &rec.scope_id, &env).unwrap();
        assert_eq!(reg.thread_binding("d", &ThreadId::parse("thr_env").unwrap()).unwrap(), None);
    }
}
