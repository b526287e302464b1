//! `ScopeLocks`: locks striped by scope id, so one scope's operations of a kind (opening it,
//! mounting it) run one at a time while different scopes' run in parallel.

use std::hash::{BuildHasher, BuildHasherDefault};

use parking_lot::Mutex;

use crate::ids::ScopeId;

/// Stripes: scopes sharing one only wait on each other's (short) operation.
const STRIPES: usize = 64;

/// A fixed set of locks; a scope always maps to the same one.
pub struct ScopeLocks {
    stripes: [Mutex<()>; STRIPES],
}

impl Default for ScopeLocks {
    fn default() -> ScopeLocks {
        ScopeLocks { stripes: std::array::from_fn(|_| Mutex::new(())) }
    }
}

impl ScopeLocks {
    /// The lock of `scope` (shared with the scopes of its stripe).
    pub fn of(&self, scope: &ScopeId) -> &Mutex<()> {
        let hash = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(scope);
        &self.stripes[(hash % STRIPES as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_always_maps_to_the_same_lock() {
        let locks = ScopeLocks::default();
        let a = ScopeId::generate();
        assert!(std::ptr::eq(locks.of(&a), locks.of(&a.clone())));
        let _held = locks.of(&a).lock();
        assert!(locks.of(&a).try_lock().is_none(), "held by this scope's operation");
    }
}
