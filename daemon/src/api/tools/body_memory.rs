//! The byte budget of `/tools` request bodies held in memory (`[limits] tools_body_memory_bytes`):
//! a body is charged before it is read and until its request is answered. Room is not handed out
//! in arrival order: a small body finds room beside large ones waiting for theirs, so one tenant's
//! queue of large bodies does not hold up another tenant's small call (a large body waits until
//! enough has been given back, at most the caller's timeout). An answer keeps its charge until
//! the client has taken it ([`charged_json`], a [`HeldAnswer`]).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Notify;

use super::super::held_answer::HeldAnswer;
use super::super::ApiError;

/// The budget (see the module docs).
#[derive(Debug)]
pub struct BodyMemory {
    max: u64,
    used: Mutex<u64>,
    freed: Notify,
}

/// Bytes charged to a [`BodyMemory`]; given back when dropped.
#[derive(Debug)]
pub struct BodyCharge {
    budget: Arc<BodyMemory>,
    bytes: u64,
}

impl BodyMemory {
    pub fn new(max: u64) -> Arc<BodyMemory> {
        Arc::new(BodyMemory { max, used: Mutex::new(0), freed: Notify::new() })
    }

    /// Charges `bytes` (at most the whole budget), waiting up to `wait` for room; `None` when
    /// there was none by then.
    pub async fn charge(self: &Arc<Self>, bytes: u64, wait: Duration) -> Option<BodyCharge> {
        let bytes = bytes.min(self.max);
        tokio::time::timeout(wait, async {
            loop {
                let freed = self.freed.notified();
                tokio::pin!(freed);
                // Registered before the check, so a release between the check and the wait wakes it.
                freed.as_mut().enable();
                if let Some(charge) = self.try_charge(bytes) {
                    return charge;
                }
                freed.await;
            }
        })
        .await
        .ok()
    }

    /// Charges `bytes` if there is room now (never waits).
    pub fn try_charge(self: &Arc<Self>, bytes: u64) -> Option<BodyCharge> {
        let mut used = self.used.lock();
        (*used + bytes <= self.max).then(|| {
            *used += bytes;
            BodyCharge { budget: self.clone(), bytes }
        })
    }

    fn give_back(&self, bytes: u64) {
        let mut used = self.used.lock();
        *used = used.saturating_sub(bytes);
        drop(used);
        self.freed.notify_waiters();
    }

    /// Bytes charged now.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        *self.used.lock()
    }
}

impl BodyCharge {
    /// Adds `other`'s bytes to this charge (given back together).
    pub fn absorb(&mut self, mut other: BodyCharge) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// Gives back what is charged beyond `bytes` (the body turned out shorter than declared).
    pub fn trim(&mut self, bytes: u64) {
        if self.bytes > bytes {
            self.budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// Bytes of `s` as a JSON string, quotes included (as `serde_json` escapes it).
pub fn json_string_len(s: &str) -> u64 {
    let escaped: u64 = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    escaped + 2
}

/// `value` as a JSON answer under `charge`, cut to the answer's bytes (what stays in memory
/// until the client has taken it).
pub fn charged_json<T: Serialize>(value: &T, mut charge: BodyCharge) -> Result<HeldAnswer, ApiError> {
    let bytes = serde_json::to_vec(value).map_err(|e| ApiError::internal("answer_not_serialized", &e))?;
    charge.trim(bytes.len() as u64);
    Ok(HeldAnswer::new(bytes, charge))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn bodies_are_charged_their_bytes_until_dropped() {
        let budget = BodyMemory::new(100 * 1024);
        let mut first = budget.charge(60 * 1024, WAIT).await.expect("room for the first body");
        assert!(budget.charge(60 * 1024, WAIT).await.is_none(), "no room for a second 60 KiB");
        first.trim(10 * 1024);
        assert_eq!(budget.used(), 10 * 1024, "the charge is cut to the bytes read");
        let second = budget.charge(60 * 1024, WAIT).await.expect("room once the first is trimmed");
        drop((first, second));
        assert_eq!(budget.used(), 0);
        let whole = budget.charge(1 << 30, WAIT).await.expect("a body over the budget is charged the whole budget");
        assert_eq!(whole.bytes(), 100 * 1024);
        assert!(budget.charge(1, WAIT).await.is_none(), "nothing is left beside it");
    }

    #[tokio::test]
    async fn a_small_body_is_not_queued_behind_a_large_one() {
        let budget = BodyMemory::new(100);
        let held = budget.charge(60, WAIT).await.unwrap();
        let large = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.charge(80, Duration::from_secs(30)).await.map(|c| c.bytes()) })
        };
        // The large one runs until it waits for room (this runtime has one thread: yielding runs it).
        tokio::task::yield_now().await;
        // A small one finds the room left at once (a queue in arrival order would put it behind).
        let small = budget.charge(30, Duration::ZERO).await;
        assert_eq!(small.as_ref().map(BodyCharge::bytes), Some(30));
        drop((held, small));
        assert_eq!(large.await.unwrap(), Some(80), "the large one is woken once room is given back");
    }
}
