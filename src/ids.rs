//! Identifiers: scope ids (server-generated UUIDv7) and validated primary-thread ids.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("scope id must be a UUID")]
    BadScopeId,
    #[error("thread id must be 1-128 characters of [A-Za-z0-9_.:-], not starting with `__global__`")]
    BadThreadId,
}

/// The prefix of the reserved thread ids of per-user global stores (seed 003 §3.7 `/__global__`):
/// no thread id a client sends may start with it ([`ThreadId::parse`] refuses it), so no WebUI
/// thread can name, provision or reach a global store.
pub const GLOBAL_STORE_PREFIX: &str = "__global__";

/// A scope id: always a canonical lowercase hyphenated UUID, safe as a path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct ScopeId(String);

impl ScopeId {
    pub fn generate() -> Self {
        ScopeId(uuid::Uuid::now_v7().hyphenated().to_string())
    }
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let u = uuid::Uuid::parse_str(s).map_err(|_| IdError::BadScopeId)?;
        let canonical = u.hyphenated().to_string();
        if canonical != s {
            return Err(IdError::BadScopeId);
        }
        Ok(ScopeId(canonical))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The one rule for an identifier a client chooses (thread ids, nonces, idempotency keys, owner
/// and run ids): 1–128 characters of `[A-Za-z0-9_.:-]`, so it is safe in logs, URLs and SQL text.
pub fn is_token(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// A WebUI primary thread id: 1–128 characters of `[A-Za-z0-9_.:-]` (`is_token`) not starting with
/// [`GLOBAL_STORE_PREFIX`]; or, made only by [`ThreadId::global_store`], the reserved thread of a
/// user's global store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// A thread id a client sent: a token, never a reserved one.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        if is_token(s) && !s.starts_with(GLOBAL_STORE_PREFIX) {
            Ok(ThreadId(s.to_owned()))
        } else {
            Err(IdError::BadThreadId)
        }
    }

    /// A thread id as the registry stored it: a client's, or a reserved global-store thread.
    pub fn parse_stored(s: &str) -> Result<Self, IdError> {
        if is_token(s) {
            Ok(ThreadId(s.to_owned()))
        } else {
            Err(IdError::BadThreadId)
        }
    }

    /// The reserved thread of `user`'s global store: `__global__.<user>` when that is a token,
    /// else `__global__.sha256.<hex>` of the user id (one per user, stable).
    pub fn global_store(user: &str) -> ThreadId {
        let plain = format!("{GLOBAL_STORE_PREFIX}.{user}");
        if is_token(&plain) && !user.is_empty() && !user.starts_with("sha256.") {
            return ThreadId(plain);
        }
        use sha2::Digest;
        let digest = hex::encode(sha2::Sha256::digest(user.as_bytes()));
        ThreadId(format!("{GLOBAL_STORE_PREFIX}.sha256.{digest}"))
    }

    /// Whether this is the reserved thread of a global store.
    pub fn is_global_store(&self) -> bool {
        self.0.starts_with(GLOBAL_STORE_PREFIX)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_ids() {
        let s = ScopeId::generate();
        assert_eq!(ScopeId::parse(s.as_str()).unwrap(), s);
        assert_eq!(ScopeId::parse("../etc"), Err(IdError::BadScopeId));
        assert_eq!(ScopeId::parse(&s.as_str().to_uppercase()), Err(IdError::BadScopeId));
    }

    #[test]
    fn tokens_are_1_to_128_characters_of_the_safe_set() {
        for ok in ["a", "thread-1:a.b_c", "A.Z_0:9-", &"x".repeat(128)] {
            assert!(is_token(ok), "{ok:?}");
        }
        for bad in ["", &"x".repeat(129), "a/b", "a b", "é", "a\n", "a\0", "%2e"] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn thread_ids() {
        assert!(ThreadId::parse("thread-1:a.b_c").is_ok());
        assert!(ThreadId::parse(&"a".repeat(128)).is_ok());
        assert_eq!(ThreadId::parse(&"a".repeat(129)), Err(IdError::BadThreadId));
        assert_eq!(ThreadId::parse(""), Err(IdError::BadThreadId));
        assert_eq!(ThreadId::parse("a/b"), Err(IdError::BadThreadId));
        assert_eq!(ThreadId::parse("a b"), Err(IdError::BadThreadId));
        assert_eq!(ThreadId::parse("__global__.u1"), Err(IdError::BadThreadId), "reserved");
        assert_eq!(ThreadId::parse("__global__"), Err(IdError::BadThreadId), "reserved");
        assert!(ThreadId::parse("_global_").is_ok());
    }

    #[test]
    fn global_store_threads_are_reserved_and_per_user() {
        let g = ThreadId::global_store("user-1");
        assert_eq!(g.as_str(), "__global__.user-1");
        assert!(g.is_global_store() && ThreadId::parse(g.as_str()).is_err());
        assert_eq!(ThreadId::parse_stored(g.as_str()).unwrap(), g);
        let odd = ThreadId::global_store("a user/with spaces");
        assert!(odd.as_str().starts_with("__global__.sha256.") && is_token(odd.as_str()));
        assert_ne!(ThreadId::global_store("sha256.x"), ThreadId::global_store("x"));
        assert_ne!(odd, ThreadId::global_store("another user"));
        assert!(!ThreadId::parse("thr_1").unwrap().is_global_store());
    }
}
