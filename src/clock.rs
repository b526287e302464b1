//! Injectable wall-clock time (Unix milliseconds): the system clock, a manual clock for tests, and an offset-file clock for daemon tests.

#[cfg(any(test, feature = "test-hooks"))]
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in Unix milliseconds. Everything that compares dates
/// (draft expiry, retention, leases) asks a `Clock`, so tests can move time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

fn system_now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The real time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_now_ms()
    }
}

/// A clock that only moves when told to (unit tests).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock(AtomicI64::new(start_ms))
    }

    /// Starts at the current system time.
    pub fn starting_now() -> ManualClock {
        Self::new(system_now_ms())
    }

    pub fn set_ms(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst)
    }

    pub fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// System time plus an offset in seconds read from a file on every call (a missing or unreadable
/// file means no offset). Only for tests of a running daemon: compiled in with the `test-hooks`
/// feature only, and used solely when `SCOPEFS_TEST_CLOCK_FILE` names such a file
/// (see [`crate::testhooks::test_clock`]).
#[cfg(any(test, feature = "test-hooks"))]
#[derive(Debug)]
pub struct OffsetFileClock {
    path: PathBuf,
}

#[cfg(any(test, feature = "test-hooks"))]
impl OffsetFileClock {
    pub fn new(path: PathBuf) -> OffsetFileClock {
        OffsetFileClock { path }
    }

    fn offset_ms(&self) -> i64 {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .map(|secs| secs.saturating_mul(1000))
            .unwrap_or(0)
    }
}

#[cfg(any(test, feature = "test-hooks"))]
impl Clock for OffsetFileClock {
    fn now_ms(&self) -> i64 {
        system_now_ms().saturating_add(self.offset_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance_ms(500);
        assert_eq!(c.now_ms(), 1_500);
        c.set_ms(10);
        assert_eq!(c.now_ms(), 10);
    }

    #[test]
    fn offset_file_clock_adds_the_file_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offset");
        let c = OffsetFileClock::new(path.clone());
        let base = SystemClock.now_ms();
        assert!((c.now_ms() - base).abs() < 60_000, "no file means no offset");
        std::fs::write(&path, "86400\n").unwrap();
        let shifted = c.now_ms() - SystemClock.now_ms();
        assert!((86_340_000..=86_460_000).contains(&shifted), "offset {shifted}");
    }
}
