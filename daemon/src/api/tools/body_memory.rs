//! The byte budget of `/tools` request bodies held in memory (`[limits] tools_body_memory_bytes`):
//! a body is charged before it is read and until its request is answered. Room is not handed out
//! in arrival order: a small body finds room beside large ones waiting for theirs, so one tenant's
//! queue of large bodies does not hold up another tenant's small call (a large body waits until
//! enough has been given back, at most the caller's timeout). An answer keeps its charge until
//! the client has taken it ([`charged_json`], a [`HeldAnswer`]), and is charged to its user's
//! share too (`tools_body_memory_per_user_bytes`): one caller that does not read its answers holds
//! at most that share. Bodies are charged before their user is authenticated, to nobody's share.

use std::collections::HashMap;
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
    /// Most one holder (a user, for answers) holds at once.
    per_holder: u64,
    used: Mutex<Used>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct Used {
    total: u64,
    by_holder: HashMap<Arc<str>, u64>,
}

/// Why a charge found no room: its holder's share or the whole budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    Share,
    Budget,
}

/// Bytes charged to a [`BodyMemory`] (and to its holder's share, if any); given back when dropped.
#[derive(Debug)]
pub struct BodyCharge {
    budget: Arc<BodyMemory>,
    bytes: u64,
    holder: Option<Arc<str>>,
}

impl BodyMemory {
    /// A budget of `max` bytes of which one holder holds at most `per_holder`.
    pub fn new(max: u64, per_holder: u64) -> Arc<BodyMemory> {
        Arc::new(BodyMemory { max, per_holder: per_holder.min(max), used: Mutex::default(), freed: Notify::new() })
    }

    /// Charges `bytes` (at most the whole budget; for a holder, at most its share), waiting up to
    /// `wait` for room; why there was none by then otherwise.
    pub async fn charge(
        self: &Arc<Self>,
        holder: Option<&str>,
        bytes: u64,
        wait: Duration,
    ) -> Result<BodyCharge, NoRoom> {
        let holder: Option<Arc<str>> = holder.map(Arc::from);
        let bytes = self.cap(holder.as_ref(), bytes);
        let waited = tokio::time::timeout(wait, async {
            loop {
                let freed = self.freed.notified();
                tokio::pin!(freed);
                // Registered before the check, so a release between the check and the wait wakes it.
                freed.as_mut().enable();
                if let Ok(charge) = self.try_charge(holder.clone(), bytes) {
                    return charge;
                }
                freed.await;
            }
        })
        .await;
        waited.or_else(|_| self.try_charge(holder, bytes))
    }

    /// The most one charge of `holder` may be.
    fn cap(&self, holder: Option<&Arc<str>>, bytes: u64) -> u64 {
        bytes.min(if holder.is_some() { self.per_holder } else { self.max })
    }

    /// Charges `bytes` to `holder` if there is room now (never waits); why not otherwise.
    pub fn try_charge(self: &Arc<Self>, holder: Option<Arc<str>>, bytes: u64) -> Result<BodyCharge, NoRoom> {
        let mut used = self.used.lock();
        if let Some(h) = &holder {
            if used.by_holder.get(h).copied().unwrap_or(0) + bytes > self.per_holder {
                return Err(NoRoom::Share);
            }
        }
        if used.total + bytes > self.max {
            return Err(NoRoom::Budget);
        }
        used.total += bytes;
        if let Some(h) = &holder {
            *used.by_holder.entry(h.clone()).or_default() += bytes;
        }
        Ok(BodyCharge { budget: self.clone(), bytes, holder })
    }

    fn give_back(&self, holder: Option<&Arc<str>>, bytes: u64) {
        let mut used = self.used.lock();
        used.total = used.total.saturating_sub(bytes);
        if let Some(h) = holder {
            if let Some(n) = used.by_holder.get_mut(h) {
                *n = n.saturating_sub(bytes);
                if *n == 0 {
                    used.by_holder.remove(h);
                }
            }
        }
        drop(used);
        self.freed.notify_waiters();
    }

    /// Bytes charged now.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used.lock().total
    }
}

impl BodyCharge {
    /// Adds up to `bytes` more for the same holder if there is room now (never waiting while
    /// holding a charge, so requests cannot each hold part of the budget and wait for the rest);
    /// the charge stays within the whole budget, or its holder's share. `false`: nothing added.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let room = self.budget.cap(self.holder.as_ref(), u64::MAX).saturating_sub(self.bytes);
        match self.budget.try_charge(self.holder.clone(), bytes.min(room)) {
            Ok(mut more) => {
                self.bytes += std::mem::take(&mut more.bytes);
                true
            }
            Err(_) => false,
        }
    }

    /// Gives back what is charged beyond `bytes` (the body turned out shorter than declared).
    pub fn trim(&mut self, bytes: u64) {
        if self.bytes > bytes {
            self.budget.give_back(self.holder.as_ref(), self.bytes - bytes);
            self.bytes = bytes;
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        self.budget.give_back(self.holder.as_ref(), self.bytes);
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
        let budget = BodyMemory::new(100 * 1024, 100 * 1024);
        let mut first = budget.charge(None, 60 * 1024, WAIT).await.expect("room for the first body");
        assert!(budget.charge(None, 60 * 1024, WAIT).await.is_err(), "no room for a second 60 KiB");
        first.trim(10 * 1024);
        assert_eq!(budget.used(), 10 * 1024, "the charge is cut to the bytes read");
        let second = budget.charge(None, 60 * 1024, WAIT).await.expect("room once the first is trimmed");
        drop((first, second));
        assert_eq!(budget.used(), 0);
        let whole =
            budget.charge(None, 1 << 30, WAIT).await.expect("a body over the budget is charged the whole budget");
        assert_eq!(whole.bytes(), 100 * 1024);
        assert!(budget.charge(None, 1, WAIT).await.is_err(), "nothing is left beside it");
    }

    #[tokio::test]
    async fn a_small_body_is_not_queued_behind_a_large_one() {
        let budget = BodyMemory::new(100, 100);
        let held = budget.charge(None, 60, WAIT).await.unwrap();
        let large = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.charge(None, 80, Duration::from_secs(30)).await.ok().map(|c| c.bytes()) })
        };
        // The large one runs until it waits for room (this runtime has one thread: yielding runs it).
        tokio::task::yield_now().await;
        // A small one finds the room left at once (a queue in arrival order would put it behind).
        let small = budget.charge(None, 30, Duration::ZERO).await.ok();
        assert_eq!(small.as_ref().map(BodyCharge::bytes), Some(30));
        drop((held, small));
        assert_eq!(large.await.unwrap(), Some(80), "the large one is woken once room is given back");
    }

    #[tokio::test]
    async fn one_holder_holds_at_most_its_share_and_others_find_room_beside_it() {
        let budget = BodyMemory::new(100, 40);
        let a = |n| budget.try_charge(Some(Arc::from("user-a")), n);
        let first = a(30).unwrap();
        assert_eq!(a(20).err(), Some(NoRoom::Share), "past its share");
        let mut second = a(10).unwrap();
        assert!(!second.try_grow(1), "growing past the share");
        let other = budget.try_charge(Some(Arc::from("user-b")), 40).expect("another user finds room");
        let unattributed = budget.charge(None, 20, Duration::ZERO).await.expect("bodies before authentication too");
        assert_eq!(budget.try_charge(None, 1).err(), Some(NoRoom::Budget));
        assert_eq!(
            budget.charge(Some("user-a"), 1000, Duration::ZERO).await.err(),
            Some(NoRoom::Share),
            "capped at the share, still past it"
        );
        drop((first, other, unattributed));
        assert!(second.try_grow(30), "room again once its own charges are given back");
        assert_eq!(second.bytes(), 40);
        drop(second);
        assert_eq!(budget.used(), 0);
        assert!(budget.used.lock().by_holder.is_empty(), "holders with nothing charged are forgotten");
    }
}
