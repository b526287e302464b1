//! Metadata in the bucket (issue 23): a scope's committed metadata batches shipped to the object
//! store as immutable objects under `scopes/<id>/meta/`, so a scope whose host disk is lost comes
//! back from the bucket alone (`restore.rs`).
//!
//! Every batch commit of the scope's database numbers its state in order (`redo_state.ship_seq`)
//! and hands its redo records (typed statements, `meta/redo.rs`) to this scope's shipper, which
//! puts them, grouped, as a **log object** within `metadata_sync_interval` (at once when an
//! `fsync` waits for them). A **snapshot** (a consistent copy of the database) starts each
//! generation and compacts it once its logs outweigh twice the last snapshot (at the scope's next
//! quiet moment: copying the database stalls its operations; at once past four times that);
//! objects it supersedes are deleted after it is in the store. Keys (hex, fixed width, so they sort):
//!
//! - `scopes/<id>/meta/g<gen>/s<seq>-<state>`: the database at batch `seq` (its state id `state`);
//! - `scopes/<id>/meta/g<gen>/l<first>-<last>-<state>`: batches `first..=last`, `state` the last's.
//!
//! A **generation** is one unbroken chain of batches. A process looks at the bucket once the
//! scope's database is opened (a mounted scope nobody uses is left alone: its chain, and its
//! database closed), and continues the newest generation there only when it ends exactly at the
//! state the database opened at; otherwise (batches committed and never shipped before a crash, a
//! power loss that rolled the database back behind the bucket, a restore elsewhere) it starts
//! generation `newest + 1` with a snapshot, so no object is ever written twice and a restore
//! follows one chain. Nothing on the create/write/close path waits for the network: a commit only
//! queues its records (a scope's queue past `limits.metadata_queue_per_scope_bytes`, or one that
//! would take the daemon's queues past `limits.metadata_queue_max_bytes`, is dropped for a
//! snapshot, which covers it).
//!
//! Every object is put compressed (`ship_objects::deflate`: 3–5× smaller). A file's bytes reach
//! the bucket only as its blocks: shipped batches and snapshots leave out the inline journal (the
//! bytes of small blocks waiting for upload), so they are not put twice. A restore finds a block
//! the store holds by its hash; one it does not hold (a file neither `fsync`ed nor uploaded before
//! the host was lost) reads as damaged, as after a power loss.
//!
//! With several nodes (a [`ShipFence`], `fence.rs`), generations carry their writer's epoch, a
//! shipped object counts (and an `fsync` waiting for it returns) only once the registry recorded it
//! as the scope's head, a process continues a generation only from the recorded head, and objects
//! are deleted only after a recorded snapshot supersedes them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::error::{EngineError, EngineResult};
use super::fence::{epoch_of, first_gen, Head};
use super::scope::ScopeEngine;
use super::ship_objects::{deflate, encode_log, prefix, Batch, Shipped};
use super::storage::Storage;
use crate::store::StoreError;

/// Bytes of batches queued in this process, every scope's (`metadata_queue_max_bytes`).
static QUEUED_BYTES: AtomicU64 = AtomicU64::new(0);
/// One snapshot is copied and put at a time in this process (it is held in memory while put).
static SNAPSHOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
/// Log bytes of a generation, past its last snapshot, that never trigger a compaction on their own
/// (as put, compressed: about 4 MiB of records).
const COMPACT_MIN_BYTES: u64 = 1 << 20;
/// A compaction waits for the scope to be quiet (no batch for `metadata_sync_interval`: copying its
/// database stalls its operations) until its logs outweigh this many times what started it.
const COMPACT_DEFER_FACTOR: u64 = 4;
/// Metadata objects put by this process, and their bytes (for `/metrics` and the cost benchmark).
static OBJECTS_SHIPPED: AtomicU64 = AtomicU64::new(0);
static BYTES_SHIPPED: AtomicU64 = AtomicU64::new(0);
/// Snapshots copied by this process, and the microseconds their copies held a scope's database.
static SNAPSHOTS_COPIED: AtomicU64 = AtomicU64::new(0);
static SNAPSHOT_HELD_MICROS: AtomicU64 = AtomicU64::new(0);

/// What metadata shipping did in this process (for `/metrics` and the cost benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShippedTotals {
    /// Metadata objects (logs, snapshots) put in the object store, and their bytes.
    pub objects: u64,
    pub bytes: u64,
    /// Snapshots copied from a scope's database, and the microseconds those copies held it (its
    /// operations wait meanwhile).
    pub snapshots: u64,
    pub snapshot_held_micros: u64,
}

/// What metadata shipping did in this process so far.
pub fn shipped_totals() -> ShippedTotals {
    ShippedTotals {
        objects: OBJECTS_SHIPPED.load(Ordering::Relaxed),
        bytes: BYTES_SHIPPED.load(Ordering::Relaxed),
        snapshots: SNAPSHOTS_COPIED.load(Ordering::Relaxed),
        snapshot_held_micros: SNAPSHOT_HELD_MICROS.load(Ordering::Relaxed),
    }
}

/// The shipper of one scope: the batches committed and not yet in the store, and where its chain
/// stands in the bucket.
pub(crate) struct MetaShip {
    /// The fencing epoch this node serves the scope at (0: one node, no fence); blocks new to the
    /// scope are stored under keys of it (`store::block_key_at`).
    pub(crate) key_epoch: u64,
    scope: String,
    storage: Arc<Storage>,
    state: Mutex<ShipState>,
    shipped_cv: Condvar,
    wake: tokio::sync::Notify,
    /// Passes the shipping task made (each ships what was due then).
    passes: AtomicU64,
}

#[derive(Default)]
struct ShipState {
    /// The database was opened in this process (`opened`): until then `base` is unknown, and
    /// nothing is looked at or shipped (a mounted scope nobody used keeps its chain and its
    /// database closed).
    open: bool,
    /// The database's state when the queue's first batch was committed on it: (seq, state id).
    base: (u64, u64),
    queue: VecDeque<Batch>,
    queue_bytes: u64,
    /// The generation being written (`None`: the bucket not looked at yet by this process).
    gen: Option<u64>,
    /// Objects of earlier generations, or superseded in this one: deleted after the next snapshot.
    stale: Vec<String>,
    /// Objects of this generation since its last snapshot (that snapshot first).
    current: Vec<String>,
    /// The newest batch whose effect is in the store.
    shipped: u64,
    need_snapshot: bool,
    /// The logs outweigh the last snapshot: a snapshot follows once the scope is quiet.
    compact_due: bool,
    /// When the newest batch was queued.
    last_batch: Option<Instant>,
    log_bytes: u64,
    snapshot_bytes: u64,
    /// The last failure, and how many there were (waiters give up on a new one).
    error: Option<String>,
    failures: u64,
    /// With a fence: the epoch this process writes under (set by the first look).
    epoch: Option<u64>,
    /// With a fence: another node serves the scope now; nothing more is shipped or acknowledged.
    deposed: bool,
}

impl ShipState {
    fn push_back(&mut self, b: Batch) {
        let n = b.bytes();
        self.queue_bytes += n;
        QUEUED_BYTES.fetch_add(n, Ordering::Relaxed);
        self.queue.push_back(b);
    }

    fn push_front(&mut self, b: Batch) {
        let n = b.bytes();
        self.queue_bytes += n;
        QUEUED_BYTES.fetch_add(n, Ordering::Relaxed);
        self.queue.push_front(b);
    }

    fn pop_front(&mut self) -> Option<Batch> {
        let b = self.queue.pop_front()?;
        self.queue_bytes -= b.bytes();
        QUEUED_BYTES.fetch_sub(b.bytes(), Ordering::Relaxed);
        Some(b)
    }

    fn take_all(&mut self) -> Vec<Batch> {
        QUEUED_BYTES.fetch_sub(self.queue_bytes, Ordering::Relaxed);
        self.queue_bytes = 0;
        self.queue.drain(..).collect()
    }

    /// Drops the queue: the next object is a snapshot at or past `(seq, state)`.
    fn drop_for_snapshot(&mut self, seq: u64, state: u64) {
        self.take_all();
        self.need_snapshot = true;
        self.base = (seq, state);
    }
}

impl Drop for ShipState {
    fn drop(&mut self) {
        self.take_all();
    }
}

enum Step {
    Look,
    Snapshot,
    Log(Vec<Batch>),
}

impl MetaShip {
    /// The shipper of a scope, when this storage ships metadata (`metadata_sync`).
    pub fn for_scope(storage: &Arc<Storage>, scope: &str) -> Option<Arc<MetaShip>> {
        storage.settings.metadata_sync.map(|_| MetaShip::new(storage.clone(), scope))
    }

    /// Restores the scope's database at `db_path` from the bucket when there is none on disk (a
    /// new scope finds nothing there and starts empty).
    pub fn restore_if_missing(&self, db_path: &std::path::Path) -> EngineResult<()> {
        if !db_path.exists() {
            self.storage.restore_scope_now(&self.scope, db_path)?;
        }
        Ok(())
    }

    /// Starts the shipping task of `engine`'s shipper, if it has one.
    pub fn start_for(engine: &Arc<ScopeEngine>) {
        if let (Some(ship), Some(every)) = (&engine.ship, engine.storage.settings.metadata_sync) {
            ship.start(Arc::downgrade(engine), every);
        }
    }

    pub fn new(storage: Arc<Storage>, scope: &str) -> Arc<MetaShip> {
        Arc::new(MetaShip {
            key_epoch: storage.fence().and_then(|f| f.epoch(scope)).unwrap_or(0),
            scope: scope.to_string(),
            storage,
            state: Mutex::new(ShipState::default()),
            shipped_cv: Condvar::new(),
            wake: tokio::sync::Notify::new(),
            passes: AtomicU64::new(0),
        })
    }

    /// The scope's database opened at batch `seq`, state `state`: a state the shipper did not see
    /// committed (a replay at open) is shipped as a snapshot. The first opening wakes the shipper:
    /// a new generation's snapshot is then taken while the database is as small as it gets.
    pub fn opened(&self, seq: u64, state: u64) {
        let mut st = self.state.lock();
        if !st.open {
            // Nothing looked at the bucket before this (`ship_pending` waits for the opening).
            st.open = true;
            st.base = (seq, state);
            self.wake.notify_one();
            return;
        }
        let head = st.queue.back().map_or(st.base, |b| (b.seq, b.state));
        if head == (seq, state) {
            return;
        }
        let had_gen = st.gen.is_some();
        st.drop_for_snapshot(seq, state);
        // Before the first look, the look decides (it may continue the chain from here).
        st.need_snapshot = had_gen;
    }

    /// A batch committed: queued for the next log object (its records without the bytes of small
    /// blocks, `redo::for_shipping`).
    pub fn batch(&self, seq: u64, state: u64, records: Vec<Vec<u8>>) {
        let settings = &self.storage.settings;
        let mut st = self.state.lock();
        st.last_batch = Some(Instant::now());
        let batch = Batch { seq, state, records };
        let n = batch.bytes();
        let over_share = st.queue_bytes + n > settings.metadata_queue_per_scope_bytes;
        let over_all = QUEUED_BYTES.load(Ordering::Relaxed) + n > settings.metadata_queue_max_bytes;
        if over_share || over_all {
            // A snapshot covers every batch: memory stays bounded whatever the store does.
            st.drop_for_snapshot(seq, state);
            return;
        }
        st.push_back(batch);
    }

    /// A batch committed whose records could not be read back: the next object is a snapshot.
    pub fn lost_batch(&self, seq: u64, state: u64, error: &std::io::Error) {
        tracing::warn!(error = %error, "a committed metadata batch could not be read for shipping; a snapshot follows");
        self.state.lock().drop_for_snapshot(seq, state);
    }

    /// Waits until every batch up to `seq` is in the store (a durability point); `Store` when the
    /// shipper fails meanwhile or does not get there within the store's bounds.
    pub fn wait_shipped(&self, seq: u64) -> EngineResult<()> {
        let settings = &self.storage.settings;
        let bound = settings.store_timeout * (settings.store_attempts.max(1) + 1) + Duration::from_secs(2);
        let deadline = Instant::now() + bound;
        let mut st = self.state.lock();
        let failures = st.failures;
        while st.shipped < seq {
            if st.deposed {
                return Err(deposed());
            }
            if st.failures > failures {
                let why = st.error.clone().unwrap_or_default();
                return Err(EngineError::Store(StoreError::Unavailable(why)));
            }
            self.wake.notify_one();
            if self.shipped_cv.wait_until(&mut st, deadline).timed_out() {
                return Err(EngineError::Store(StoreError::Timeout(bound)));
            }
        }
        Ok(())
    }

    /// Committed batches not in the store yet (a snapshot owed counts one).
    pub fn pending(&self) -> u64 {
        let st = self.state.lock();
        st.queue.len() as u64 + u64::from(st.need_snapshot)
    }

    /// Passes the shipping task has made.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Starts the scope's shipping task: every `interval`, or at once when woken, it ships what is
    /// queued; it ends with the engine.
    pub fn start(self: &Arc<Self>, engine: Weak<ScopeEngine>, interval: Duration) {
        let ship = self.clone();
        self.storage.rt.spawn(async move {
            loop {
                tokio::select! {
                    _ = ship.wake.notified() => {}
                    _ = tokio::time::sleep(interval) => {}
                }
                if engine.strong_count() == 0 {
                    break;
                }
                let shipped = ship.ship_pending(&engine).await;
                ship.passes.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = shipped {
                    tracing::warn!(error = %e, "shipping a scope's metadata to the object store failed; it is retried");
                    {
                        let mut st = ship.state.lock();
                        st.error = Some(e.to_string());
                        st.failures += 1;
                    }
                    ship.shipped_cv.notify_all();
                    tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
                }
            }
        });
    }

    /// Ships everything queued now (and whatever a first look or a snapshot needs first).
    async fn ship_pending(&self, engine: &Weak<ScopeEngine>) -> EngineResult<()> {
        let quiet = self.storage.settings.metadata_sync.unwrap_or_default();
        loop {
            let step = {
                let mut st = self.state.lock();
                if st.deposed {
                    return Err(deposed());
                }
                if !st.open {
                    return Ok(());
                }
                if st.compact_due && st.last_batch.is_none_or(|t| t.elapsed() >= quiet) {
                    st.need_snapshot = true;
                }
                if st.gen.is_none() {
                    Step::Look
                } else if st.need_snapshot {
                    Step::Snapshot
                } else if st.queue.front().is_some_and(|b| b.seq != st.shipped + 1) {
                    st.need_snapshot = true;
                    Step::Snapshot
                } else if st.queue.is_empty() {
                    return Ok(());
                } else {
                    Step::Log(st.take_all())
                }
            };
            match step {
                Step::Look => self.look().await?,
                Step::Snapshot => self.snapshot(engine).await?,
                Step::Log(batches) => self.put_log(batches).await?,
            }
            self.shipped_cv.notify_all();
        }
    }

    /// Reads where the scope's chain stands in the bucket: continues its newest generation when
    /// that ends where the database opened, else starts the next one with a snapshot.
    async fn look(&self) -> EngineResult<()> {
        let objects = self.storage.with_retry(self.storage.settings.store_attempts, || async {
            self.storage.store.list(&prefix(&self.scope)).await
        });
        let found: Vec<Shipped> = objects.await?.iter().filter_map(|o| Shipped::parse(&self.scope, &o.key)).collect();
        if let Some(fence) = self.storage.fence() {
            let scope = self.scope.clone();
            let fence2 = fence.clone();
            let ownership = tokio::task::spawn_blocking(move || (fence2.epoch(&scope), fence2.recorded(&scope)))
                .await
                .map_err(|e| EngineError::Io(std::io::Error::other(e)))?;
            return self.look_fenced(&found, ownership);
        }
        let newest = found.iter().map(Shipped::gen).max();
        let head = newest.and_then(|g| found.iter().filter(|o| o.gen() == g).map(Shipped::head).max());
        let mut st = self.state.lock();
        let keys = |gen: Option<u64>| -> Vec<String> {
            found.iter().filter(|o| gen.is_none_or(|g| o.gen() != g)).map(|o| o.key(&self.scope)).collect()
        };
        if head.is_some() && head == Some(st.base) {
            st.gen = newest;
            st.shipped = st.base.0;
            st.stale = keys(newest);
            st.current = found.iter().filter(|o| Some(o.gen()) == newest).map(|o| o.key(&self.scope)).collect();
        } else {
            st.gen = Some(newest.map_or(1, |g| g + 1));
            st.stale = keys(None);
            st.need_snapshot = true;
        }
        Ok(())
    }

    /// `look` with a fence: continues the recorded generation only when it is of this node's epoch
    /// and ends where the database opened; else starts the next generation of the epoch with a
    /// snapshot. Objects past the recorded head were never the scope's state: stale.
    fn look_fenced(
        &self,
        found: &[Shipped],
        (epoch, recorded): (Option<u64>, Result<Option<Head>, String>),
    ) -> EngineResult<()> {
        let mut st = self.state.lock();
        let Some(epoch) = epoch else {
            st.deposed = true;
            return Err(deposed());
        };
        let recorded = recorded.map_err(|e| EngineError::Store(StoreError::Unavailable(e)))?;
        let newest = found.iter().map(Shipped::gen).max();
        if newest.is_some_and(|g| epoch_of(g) > epoch) {
            // A later epoch wrote here: another node serves the scope.
            st.deposed = true;
            return Err(deposed());
        }
        st.epoch = Some(epoch);
        let keys = |keep: &dyn Fn(&Shipped) -> bool| -> Vec<String> {
            found.iter().filter(|o| keep(o)).map(|o| o.key(&self.scope)).collect()
        };
        match recorded {
            Some((gen, seq, state)) if epoch_of(gen) == epoch && (seq, state) == st.base => {
                let live = |o: &Shipped| o.gen() == gen && o.head().0 <= seq;
                st.gen = Some(gen);
                st.shipped = seq;
                st.current = keys(&live);
                st.stale = keys(&|o| !live(o));
            }
            _ => {
                let next = newest.filter(|g| epoch_of(*g) == epoch).map_or(first_gen(epoch), |g| g + 1);
                st.gen = Some(next);
                st.stale = keys(&|_| true);
                st.need_snapshot = true;
            }
        }
        Ok(())
    }

    /// With a fence, records `head` as the scope's state; a refusal marks this shipper deposed.
    async fn record(&self, head: Head) -> EngineResult<()> {
        let (Some(fence), Some(epoch)) = (self.storage.fence(), self.state.lock().epoch) else { return Ok(()) };
        let scope = self.scope.clone();
        let fence = fence.clone();
        let recorded = tokio::task::spawn_blocking(move || fence.record(&scope, epoch, head))
            .await
            .map_err(|e| EngineError::Io(std::io::Error::other(e)))?;
        match recorded {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.state.lock().deposed = true;
                self.shipped_cv.notify_all();
                Err(deposed())
            }
            Err(e) => Err(EngineError::Store(StoreError::Unavailable(e))),
        }
    }

    /// Puts a snapshot of the database as it is now, then deletes what it supersedes.
    async fn snapshot(&self, engine: &Weak<ScopeEngine>) -> EngineResult<()> {
        let _one_at_a_time = SNAPSHOTS.acquire().await.map_err(|e| EngineError::Io(std::io::Error::other(e)))?;
        let engine = engine.upgrade().ok_or(EngineError::Invalid("scope engine is closing"))?;
        let path = self.storage.scope_meta_dir(&self.scope).join("meta.sqlite3-ship");
        let copied = tokio::task::spawn_blocking(move || -> EngineResult<(u64, u64, Vec<u8>, u64)> {
            let mut meta = engine.meta.lock()?;
            // From the lock's taking: waiting for it is not holding the scope's operations up.
            let held = Instant::now();
            let (seq, state) = meta.scratch_snapshot_to(&path)?;
            let held = u64::try_from(held.elapsed().as_micros()).unwrap_or(u64::MAX);
            drop(meta);
            drop(engine);
            let bytes = super::meta::shipped::compact_copy(&path).and_then(|()| Ok(std::fs::read(&path)?));
            let _ = crate::db_files::remove_with(&path, &["", "-wal", "-shm"]);
            Ok((seq, state, deflate(&bytes?), held))
        });
        let (seq, state, bytes, held) = copied.await.map_err(|e| EngineError::Io(std::io::Error::other(e)))??;
        SNAPSHOTS_COPIED.fetch_add(1, Ordering::Relaxed);
        SNAPSHOT_HELD_MICROS.fetch_add(held, Ordering::Relaxed);
        tracing::info!(held_us = held, bytes = bytes.len(), seq, "copied a scope's metadata snapshot for shipping");
        let gen = self.state.lock().gen.unwrap_or(1);
        let object = Shipped::Snapshot { gen, seq, state };
        let key = object.key(&self.scope);
        let size = bytes.len() as u64;
        self.put(&key, Bytes::from(bytes)).await?;
        self.record((gen, seq, state)).await?;
        let superseded = {
            let mut st = self.state.lock();
            while st.queue.front().is_some_and(|b| b.seq <= seq) {
                st.pop_front();
            }
            st.shipped = st.shipped.max(seq);
            st.need_snapshot = false;
            st.compact_due = false;
            st.log_bytes = 0;
            st.snapshot_bytes = size;
            let mut old = std::mem::take(&mut st.stale);
            old.append(&mut st.current);
            st.current.push(key);
            old
        };
        self.shipped_cv.notify_all();
        for key in superseded {
            // Left behind on failure: a restore reads only the newest generation's newest chain.
            if let Err(e) = self.storage.store.delete(&key).await {
                tracing::debug!(error = %e, "deleting a superseded metadata object failed");
            }
        }
        Ok(())
    }

    /// Puts queued batches as one log object (put back in front of the queue when that fails).
    async fn put_log(&self, batches: Vec<Batch>) -> EngineResult<()> {
        let (first, last) = match (batches.first(), batches.last()) {
            (Some(f), Some(l)) => (f.seq, (l.seq, l.state)),
            _ => return Ok(()),
        };
        let gen = self.state.lock().gen.unwrap_or(1);
        let object = Shipped::Log { gen, first, last: last.0, state: last.1 };
        let key = object.key(&self.scope);
        // Compressed off the runtime's threads (a queue's worth takes tens of milliseconds).
        let compressed = tokio::task::spawn_blocking(move || {
            let body = deflate(&encode_log(&batches));
            (batches, body)
        });
        let (batches, body) = match compressed.await {
            Ok(done) => done,
            Err(e) => {
                // The batches went with the task: a snapshot covers them.
                self.state.lock().need_snapshot = true;
                return Err(EngineError::Io(std::io::Error::other(e)));
            }
        };
        let size = body.len() as u64;
        let shipped = match self.put(&key, Bytes::from(body)).await {
            Ok(()) => self.record((gen, last.0, last.1)).await,
            Err(e) => Err(e),
        };
        if let Err(e) = shipped {
            let mut st = self.state.lock();
            for b in batches.into_iter().rev() {
                st.push_front(b);
            }
            return Err(e);
        }
        let mut st = self.state.lock();
        st.shipped = last.0;
        st.current.push(key);
        st.log_bytes += size;
        // Snapshots cost at most half the bytes logs do, whatever the database's size; a busy
        // scope's compaction waits for a quiet moment, within a bound.
        let due = 2 * st.snapshot_bytes.max(COMPACT_MIN_BYTES);
        st.compact_due |= st.log_bytes > due;
        st.need_snapshot |= st.log_bytes > COMPACT_DEFER_FACTOR * due;
        Ok(())
    }

    async fn put(&self, key: &str, body: Bytes) -> EngineResult<()> {
        let attempts = self.storage.settings.store_attempts;
        let size = body.len() as u64;
        self.storage.with_retry(attempts, || self.storage.store.put(key, body.clone())).await?;
        OBJECTS_SHIPPED.fetch_add(1, Ordering::Relaxed);
        BYTES_SHIPPED.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }
}

/// What a deposed shipper answers: the program is told its data did not reach the scope's state.
fn deposed() -> EngineError {
    EngineError::Store(StoreError::Unavailable("another node serves this scope now (a newer epoch)".into()))
}
