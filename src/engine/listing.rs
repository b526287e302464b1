//! The memory listings build (issue 22 N2): each listing charges the bytes of the entries it
//! builds, as it builds them, against three bounds checked before the bytes are allocated — its
//! own (`limits.max_listing_bytes`, else `ListingTooLarge`), its scope's share
//! (`limits.listing_memory_per_scope_bytes`) and the daemon's budget
//! (`limits.listing_memory_max_bytes`), else `ScopeBusy` or `Busy` — and gives them back when the [`Listing`] is
//! dropped. So a listing's size is bounded by its bytes, not only its entry count, and the listings
//! held at once (by requests in flight, zip streams) are bounded daemon-wide, with one scope
//! never holding more than its share.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::{EngineError, EngineResult};
use super::paths::PathEntry;
use crate::limits::{refuse, Bound};

/// What one entry of a listing costs besides its path's bytes (the entry itself).
pub const ENTRY_OVERHEAD_BYTES: u64 = std::mem::size_of::<PathEntry>() as u64;

/// The listing bytes held daemon-wide and per scope, and their bounds.
#[derive(Debug)]
pub struct ListingMemory {
    max_one: u64,
    max_per_scope: u64,
    max_total: u64,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: u64,
    scopes: HashMap<String, u64>,
}

impl ListingMemory {
    /// Bounds of one listing, of one scope's listings and of all of them.
    pub fn new(max_one: u64, max_per_scope: u64, max_total: u64) -> ListingMemory {
        ListingMemory { max_one, max_per_scope, max_total, held: Mutex::default() }
    }

    /// Bytes held by listings now (daemon-wide).
    pub fn held(&self) -> u64 {
        self.held.lock().total
    }

    /// A charge of `scope`'s, empty so far.
    pub fn charge(self: &Arc<Self>, scope: &str) -> ListingCharge {
        ListingCharge { memory: self.clone(), scope: scope.to_string(), bytes: 0 }
    }
}

/// Bytes one listing holds; given back when dropped.
#[derive(Debug)]
pub struct ListingCharge {
    memory: Arc<ListingMemory>,
    scope: String,
    bytes: u64,
}

impl ListingCharge {
    /// Charges `n` more bytes, or refuses them (nothing charged): `ListingTooLarge` past the
    /// listing's own bound, `ScopeBusy` past its scope's share, `Busy` past the daemon's budget.
    pub fn add(&mut self, n: u64) -> EngineResult<()> {
        let m = &self.memory;
        let bytes = self.bytes.saturating_add(n);
        if bytes > m.max_one {
            refuse(Bound::ListingBytes);
            return Err(EngineError::ListingTooLarge);
        }
        let mut held = m.held.lock();
        let scope = held.scopes.get(&self.scope).copied().unwrap_or(0).saturating_add(n);
        if scope > m.max_per_scope {
            refuse(Bound::ListingMemory);
            return Err(EngineError::ScopeBusy("this scope's listings in flight hold its share of listing memory"));
        }
        let total = held.total.saturating_add(n);
        if total > m.max_total {
            refuse(Bound::ListingMemory);
            return Err(EngineError::Busy("listings in flight hold the daemon's listing memory"));
        }
        held.total = total;
        held.scopes.insert(self.scope.clone(), scope);
        self.bytes = bytes;
        Ok(())
    }

    /// Gives back `n` of the bytes charged (a transient buffer freed).
    pub fn sub(&mut self, n: u64) {
        let n = n.min(self.bytes);
        self.bytes -= n;
        let mut held = self.memory.held.lock();
        held.total = held.total.saturating_sub(n);
        if let Some(s) = held.scopes.get_mut(&self.scope) {
            *s = s.saturating_sub(n);
            if *s == 0 {
                held.scopes.remove(&self.scope);
            }
        }
    }
}

impl Drop for ListingCharge {
    fn drop(&mut self) {
        self.sub(self.bytes);
    }
}

/// The entries of a listing with the memory they are charged for (held until it is dropped).
#[derive(Debug)]
pub struct Listing {
    entries: Vec<PathEntry>,
    _charge: ListingCharge,
}

impl Listing {
    pub(crate) fn new(entries: Vec<PathEntry>, charge: ListingCharge) -> Listing {
        Listing { entries, _charge: charge }
    }

    /// The entries and their charge, apart: a caller that builds an answer from the entries keeps
    /// the charge until the answer is gone.
    pub fn into_parts(mut self) -> (Vec<PathEntry>, ListingCharge) {
        let entries = std::mem::take(&mut self.entries);
        (entries, self._charge)
    }
}

impl Deref for Listing {
    type Target = Vec<PathEntry>;
    fn deref(&self) -> &Vec<PathEntry> {
        &self.entries
    }
}

impl DerefMut for Listing {
    fn deref_mut(&mut self) -> &mut Vec<PathEntry> {
        &mut self.entries
    }
}

/// Consumes the listing: its charge is given back at once (for callers that keep no copy).
impl IntoIterator for Listing {
    type Item = PathEntry;
    type IntoIter = std::vec::IntoIter<PathEntry>;
    fn into_iter(mut self) -> Self::IntoIter {
        std::mem::take(&mut self.entries).into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_listing_its_scope_and_the_daemon_are_bounded_and_drops_give_back() {
        let m = Arc::new(ListingMemory::new(100, 150, 250));
        let mut a1 = m.charge("a");
        a1.add(100).unwrap();
        assert!(matches!(a1.add(1), Err(EngineError::ListingTooLarge)), "one listing's own bound");
        let mut a2 = m.charge("a");
        assert!(matches!(a2.add(51), Err(EngineError::ScopeBusy(_))), "the scope's share");
        a2.add(50).unwrap();
        let mut b = m.charge("b");
        b.add(100).unwrap();
        let mut c = m.charge("c");
        assert!(matches!(c.add(1), Err(EngineError::Busy(_))), "the daemon's budget");
        assert_eq!(m.held(), 250);
        drop(a1);
        c.add(100).unwrap();
        b.sub(40);
        assert_eq!(m.held(), 210);
        drop((a2, b, c));
        assert_eq!(m.held(), 0);
        assert!(m.held.lock().scopes.is_empty());
    }
}
