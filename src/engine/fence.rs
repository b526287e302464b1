//! Fencing of a scope's shipped metadata when several nodes serve one deployment (issue 23): the
//! epoch this node serves a scope under, and the registry's record of the head of the scope's
//! chain, which only the owner at its epoch can move. A batch is acknowledged (`fsync`) only once
//! its head is recorded, a generation is stamped with its writer's epoch, and a restore rebuilds
//! exactly the recorded head: what a deposed node ships after a takeover never becomes the
//! scope's state. Without a fence (one node), the bucket alone decides (`ship.rs`).

/// A shipped chain's head: generation, last batch and that batch's state id.
pub type Head = (u64, u64, u64);

/// Generations are numbered `epoch << 32 | n`: a node writes only generations of its own epoch.
pub const EPOCH_SHIFT: u32 = 32;

/// The epoch a generation was written under.
pub fn epoch_of(gen: u64) -> u64 {
    gen >> EPOCH_SHIFT
}

/// The first generation of `epoch`.
pub fn first_gen(epoch: u64) -> u64 {
    (epoch << EPOCH_SHIFT) | 1
}

/// What the daemon tells scopes' shippers about ownership (implemented over the registry).
pub trait ShipFence: Send + Sync {
    /// The epoch this node serves `scope` under; `None` when it does not serve it.
    fn epoch(&self, scope: &str) -> Option<u64>;
    /// The recorded head of the scope's chain (what a restore rebuilds); `None`: nothing shipped.
    fn recorded(&self, scope: &str) -> Result<Option<Head>, String>;
    /// Records `head` as the scope's state if this node still serves it at `epoch`; `Ok(false)`
    /// when it does not (deposed).
    fn record(&self, scope: &str, epoch: u64, head: Head) -> Result<bool, String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_carry_their_epoch_and_sort_by_it() {
        assert_eq!(epoch_of(first_gen(7)), 7);
        assert_eq!(epoch_of(first_gen(7) + 5), 7);
        assert!(first_gen(8) > first_gen(7) + 1000);
        // Generations of one node (no fence) are below every fenced one.
        assert!(first_gen(1) > 1_000_000);
        assert_eq!(epoch_of(3), 0);
    }
}
