//! `MemoryStore`: an in-memory object store for tests that can inject failures, stalls and corruption
//! (the fault switches exist only with the `test-hooks` feature, see `crate::testhooks`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(any(test, feature = "test-hooks"))]
use std::{
    sync::atomic::{AtomicBool, AtomicUsize},
    time::Duration,
};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use super::{ObjectInfo, ObjectStore, StoreError};

/// Objects in a `BTreeMap` behind a mutex, with switches (feature `test-hooks`) that make calls
/// fail, stall or return damaged bytes.
#[derive(Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, Bytes>>,
    #[cfg(any(test, feature = "test-hooks"))]
    faults: Faults,
    puts: AtomicU64,
    gets: AtomicU64,
}

/// The fault switches of a `MemoryStore`.
#[cfg(any(test, feature = "test-hooks"))]
#[derive(Default)]
struct Faults {
    unavailable: AtomicBool,
    stall: Mutex<Option<Duration>>,
    fail_puts: AtomicUsize,
    fail_gets: AtomicUsize,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Every stored key, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.objects.lock().keys().cloned().collect()
    }

    /// Number of `put` calls made (failed ones included).
    pub fn put_count(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }

    /// Number of `get` calls made (failed ones included).
    pub fn get_count(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// Applies the stall and the global outage switch common to every call.
    #[cfg(any(test, feature = "test-hooks"))]
    async fn before_call(&self) -> Result<(), StoreError> {
        let stall = *self.faults.stall.lock();
        if let Some(stall) = stall {
            tokio::time::sleep(stall).await;
        }
        if self.faults.unavailable.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("memory store switched off".into()));
        }
        Ok(())
    }

    #[cfg(not(any(test, feature = "test-hooks")))]
    async fn before_call(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether an injected put failure is due (decrements the budget).
    #[cfg(any(test, feature = "test-hooks"))]
    fn put_fails(&self) -> bool {
        take_failure(&self.faults.fail_puts)
    }

    /// Whether an injected get failure is due (decrements the budget).
    #[cfg(any(test, feature = "test-hooks"))]
    fn get_fails(&self) -> bool {
        take_failure(&self.faults.fail_gets)
    }

    #[cfg(not(any(test, feature = "test-hooks")))]
    fn put_fails(&self) -> bool {
        false
    }

    #[cfg(not(any(test, feature = "test-hooks")))]
    fn get_fails(&self) -> bool {
        false
    }
}

/// The fault switches (feature `test-hooks`).
#[cfg(any(test, feature = "test-hooks"))]
impl MemoryStore {
    /// While set, every call fails with `StoreError::Unavailable`.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.faults.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// While set, every call first sleeps this long (a `tokio` sleep, so callers' timeouts fire).
    pub fn set_stall(&self, stall: Option<Duration>) {
        *self.faults.stall.lock() = stall;
    }

    /// The next `n` puts fail with `StoreError::Unavailable` (nothing is stored).
    pub fn fail_next_puts(&self, n: usize) {
        self.faults.fail_puts.store(n, Ordering::SeqCst);
    }

    /// The next `n` gets fail with `StoreError::Unavailable`.
    pub fn fail_next_gets(&self, n: usize) {
        self.faults.fail_gets.store(n, Ordering::SeqCst);
    }

    /// Flips one byte of a stored object; returns whether the object existed (and was not empty).
    pub fn corrupt(&self, key: &str) -> bool {
        let mut objects = self.objects.lock();
        match objects.get_mut(key) {
            Some(body) if !body.is_empty() => {
                let mut damaged = body.to_vec();
                let middle = damaged.len() / 2;
                damaged[middle] ^= 0xff;
                *body = Bytes::from(damaged);
                true
            }
            _ => false,
        }
    }

    /// Removes an object behind the caller's back; returns whether it existed.
    pub fn remove_object(&self, key: &str) -> bool {
        self.objects.lock().remove(key).is_some()
    }
}

/// Decrements a failure budget; true when this call should fail.
#[cfg(any(test, feature = "test-hooks"))]
fn take_failure(budget: &AtomicUsize) -> bool {
    budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

#[async_trait]
impl ObjectStore for MemoryStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.before_call().await?;
        if self.put_fails() {
            return Err(StoreError::Unavailable("injected put failure".into()));
        }
        self.objects.lock().insert(key.to_string(), data);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.before_call().await?;
        if self.get_fails() {
            return Err(StoreError::Unavailable("injected get failure".into()));
        }
        self.objects.lock().get(key).cloned().ok_or_else(|| StoreError::NotFound { key: key.to_string() })
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.before_call().await?;
        Ok(self.objects.lock().get(key).map(|body| body.len() as u64))
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.before_call().await?;
        self.objects.lock().remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.before_call().await?;
        let objects = self.objects.lock();
        Ok(objects
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, body)| ObjectInfo { key: key.clone(), size: body.len() as u64 })
            .collect())
    }

    fn describe(&self) -> String {
        "in-memory store".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    #[test]
    fn roundtrip_list_delete() {
        rt().block_on(async {
            let s = MemoryStore::new();
            s.put("a/1", Bytes::from_static(b"one")).await.unwrap();
            s.put("a/2", Bytes::from_static(b"two!")).await.unwrap();
            s.put("b/1", Bytes::from_static(b"x")).await.unwrap();
            assert_eq!(s.get("a/2").await.unwrap(), Bytes::from_static(b"two!"));
            assert_eq!(s.head("a/2").await.unwrap(), Some(4));
            assert_eq!(s.head("zz").await.unwrap(), None);
            let listed = s.list("a/").await.unwrap();
            assert_eq!(
                listed,
                vec![ObjectInfo { key: "a/1".into(), size: 3 }, ObjectInfo { key: "a/2".into(), size: 4 }]
            );
            s.delete("a/1").await.unwrap();
            s.delete("a/1").await.unwrap();
            assert!(matches!(s.get("a/1").await, Err(StoreError::NotFound { .. })));
            assert_eq!(s.keys(), vec!["a/2".to_string(), "b/1".to_string()]);
            assert_eq!(s.put_count(), 3);
            assert_eq!(s.get_count(), 2);
        });
    }

    #[test]
    fn injected_failures_are_counted_down() {
        rt().block_on(async {
            let s = MemoryStore::new();
            s.fail_next_puts(2);
            assert!(matches!(s.put("k", Bytes::from_static(b"v")).await, Err(StoreError::Unavailable(_))));
            assert!(matches!(s.put("k", Bytes::from_static(b"v")).await, Err(StoreError::Unavailable(_))));
            assert!(s.keys().is_empty());
            s.put("k", Bytes::from_static(b"v")).await.unwrap();
            s.fail_next_gets(1);
            assert!(s.get("k").await.unwrap_err().is_transient());
            assert_eq!(s.get("k").await.unwrap(), Bytes::from_static(b"v"));
        });
    }

    #[test]
    fn unavailable_fails_every_call() {
        rt().block_on(async {
            let s = MemoryStore::new();
            s.put("k", Bytes::from_static(b"v")).await.unwrap();
            s.set_unavailable(true);
            assert!(matches!(s.get("k").await, Err(StoreError::Unavailable(_))));
            assert!(matches!(s.head("k").await, Err(StoreError::Unavailable(_))));
            assert!(matches!(s.list("").await, Err(StoreError::Unavailable(_))));
            assert!(matches!(s.delete("k").await, Err(StoreError::Unavailable(_))));
            assert!(matches!(s.put("k2", Bytes::new()).await, Err(StoreError::Unavailable(_))));
            s.set_unavailable(false);
            assert_eq!(s.keys(), vec!["k".to_string()]);
        });
    }

    #[test]
    fn stall_lets_caller_timeouts_fire() {
        rt().block_on(async {
            let s = MemoryStore::new();
            s.set_stall(Some(Duration::from_secs(30)));
            let started = Instant::now();
            let res = tokio::time::timeout(Duration::from_millis(50), s.head("k")).await;
            assert!(res.is_err(), "stalled call must not finish before the timeout");
            assert!(started.elapsed() < Duration::from_secs(5));
            s.set_stall(None);
            assert_eq!(s.head("k").await.unwrap(), None);
        });
    }

    #[test]
    fn corrupt_and_remove() {
        rt().block_on(async {
            let s = MemoryStore::new();
            s.put("k", Bytes::from_static(b"hello")).await.unwrap();
            assert!(s.corrupt("k"));
            assert_ne!(s.get("k").await.unwrap(), Bytes::from_static(b"hello"));
            assert!(!s.corrupt("missing"));
            assert!(s.remove_object("k"));
            assert!(!s.remove_object("k"));
            assert!(matches!(s.get("k").await, Err(StoreError::NotFound { .. })));
        });
    }
}
