//! Identifiers: scope ids (server-generated UUIDv7) and validated primary-thread ids.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("scope id must be a UUID")]
    BadScopeId,
    #[error("thread id must be 1-128 characters of [A-Za-z0-9_.:-]")]
    BadThreadId,
}

/// A scope id: always a canonical lowercase hyphenated UUID, safe as a path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
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

/// A WebUI primary thread id: 1–128 characters of `[A-Za-z0-9_.:-]` (`is_token`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    pub fn parse(s: &str) -> Result<Self, IdError> {
        if is_token(s) {
            Ok(ThreadId(s.to_owned()))
        } else {
            Err(IdError::BadThreadId)
        }
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
    }
}
