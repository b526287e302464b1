//! Process-wide FUSE counters: operations, errors and latency per operation, refused path and
//! symlink attempts, requests this filesystem does not implement (per operation), and the worker
//! pool's busy workers and share waits.
//!
//! Recorded by the adapter's `call` helper (every engine call of every mount) and read by the
//! daemon's `/metrics`. Counters only ever grow.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::RwLock;
use scopefs::engine::{EngineError, Refusal};

/// Upper bounds of the latency histogram, in seconds.
pub const LATENCY_BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// Counters of one operation.
#[derive(Default)]
pub struct OpStats {
    pub count: AtomicU64,
    pub errors: AtomicU64,
    pub sum_micros: AtomicU64,
    /// Non-cumulative per bucket; the last slot is above the largest bound.
    pub buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
}

/// A copy of one operation's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSnapshot {
    pub count: u64,
    pub errors: u64,
    pub sum_seconds: f64,
    /// Cumulative counts per bound of `LATENCY_BUCKETS` (Prometheus `le` semantics).
    pub cumulative: Vec<u64>,
}

static OPS: LazyLock<RwLock<BTreeMap<&'static str, Arc<OpStats>>>> = LazyLock::new(Default::default);
static REFUSED_PATH: AtomicU64 = AtomicU64::new(0);
static REFUSED_SYMLINK: AtomicU64 = AtomicU64::new(0);
static UNSUPPORTED: LazyLock<RwLock<BTreeMap<&'static str, Arc<AtomicU64>>>> = LazyLock::new(Default::default);

fn stats(op: &'static str) -> Arc<OpStats> {
    if let Some(s) = OPS.read().get(op) {
        return s.clone();
    }
    OPS.write().entry(op).or_default().clone()
}

/// Records one finished operation.
pub fn record(op: &'static str, elapsed: Duration, ok: bool) {
    let s = stats(op);
    s.count.fetch_add(1, Ordering::Relaxed);
    if !ok {
        s.errors.fetch_add(1, Ordering::Relaxed);
    }
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    s.sum_micros.fetch_add(micros, Ordering::Relaxed);
    let secs = elapsed.as_secs_f64();
    let slot = LATENCY_BUCKETS.iter().position(|b| secs <= *b).unwrap_or(LATENCY_BUCKETS.len());
    s.buckets[slot].fetch_add(1, Ordering::Relaxed);
}

/// The counters of the process's FUSE worker pool (the mount manager's, once it exists).
static POOL: RwLock<Option<Arc<fuser::PoolCounters>>> = RwLock::new(None);

/// Reports `counters` as the process's pool (`MountManager::new`).
pub(crate) fn set_pool(counters: Arc<fuser::PoolCounters>) {
    *POOL.write() = Some(counters);
}

/// Workers serving a request now, and times a mount reached its share of workers (zero before
/// the pool exists).
pub fn pool() -> (usize, u64) {
    POOL.read().as_ref().map_or((0, 0), |c| (c.busy_workers(), c.share_waits()))
}

/// Counts a refusal of the path or symlink rules (`EngineError::refusal`); other errors are not refusals.
pub fn note_refusal(err: &EngineError) {
    match err.refusal() {
        Some(Refusal::Symlink) => REFUSED_SYMLINK.fetch_add(1, Ordering::Relaxed),
        Some(Refusal::Path) => REFUSED_PATH.fetch_add(1, Ordering::Relaxed),
        None => 0,
    };
}

/// Refused attempts so far: (path, symlink).
pub fn refused() -> (u64, u64) {
    (REFUSED_PATH.load(Ordering::Relaxed), REFUSED_SYMLINK.load(Ordering::Relaxed))
}

/// Counts a request of operation `op` this filesystem does not implement (an unknown flag, mode
/// or file type, or the whole operation): `errno::Failure::{Unsupported, NotImplemented}`.
pub fn note_unsupported(op: &'static str) {
    let counter = UNSUPPORTED.read().get(op).cloned();
    let counter = counter.unwrap_or_else(|| UNSUPPORTED.write().entry(op).or_default().clone());
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Unsupported requests so far, by operation.
pub fn unsupported() -> Vec<(&'static str, u64)> {
    UNSUPPORTED.read().iter().map(|(op, n)| (*op, n.load(Ordering::Relaxed))).collect()
}

/// Every operation seen so far, by name.
pub fn snapshot() -> Vec<(&'static str, OpSnapshot)> {
    OPS.read()
        .iter()
        .map(|(op, s)| {
            let mut acc = 0;
            let cumulative = s.buckets[..LATENCY_BUCKETS.len()]
                .iter()
                .map(|b| {
                    acc += b.load(Ordering::Relaxed);
                    acc
                })
                .collect();
            let snap = OpSnapshot {
                count: s.count.load(Ordering::Relaxed),
                errors: s.errors.load(Ordering::Relaxed),
                sum_seconds: s.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
                cumulative,
            };
            (*op, snap)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_counts_errors_buckets_and_refusals() {
        record("test-op", Duration::from_micros(50), true);
        record("test-op", Duration::from_millis(2), false);
        record("test-op", Duration::from_secs(10), true);
        let (_, s) = snapshot().into_iter().find(|(op, _)| *op == "test-op").unwrap();
        assert_eq!((s.count, s.errors), (3, 1));
        assert_eq!(s.cumulative[0], 1); // <= 100 µs
        assert_eq!(s.cumulative[3], 2); // <= 5 ms
        assert_eq!(*s.cumulative.last().unwrap(), 2); // 10 s is above every bound
        let (p0, s0) = refused();
        note_refusal(&EngineError::InvalidName("reserved"));
        note_refusal(&EngineError::BadSymlinkTarget);
        note_refusal(&EngineError::NotFound);
        let (p1, s1) = refused();
        assert_eq!((p1 - p0, s1 - s0), (1, 1));
    }

    #[test]
    fn unsupported_requests_are_counted_per_operation() {
        let count = |op| unsupported().into_iter().find(|(o, _)| *o == op).map_or(0, |(_, n)| n);
        let before = count("test-unsupported");
        note_unsupported("test-unsupported");
        note_unsupported("test-unsupported");
        assert_eq!(count("test-unsupported") - before, 2);
        assert_eq!(count("test-never-unsupported"), 0);
    }
}
