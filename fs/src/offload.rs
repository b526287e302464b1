//! `fsync`s answered off the FUSE workers. An fsync waits until its file's blocks are in the object
//! store (seconds on a slow store, up to `store_attempts` × `store_timeout_ms` on a dead one), so it
//! runs on a thread of its own and its worker goes back to the pool at once; the reply is sent when
//! the fsync is done. One mount runs at most its share (`fuse.max_workers_per_mount`) of such
//! threads, and the daemon at most `fuse.threads`; past either, an fsync runs on its worker as before
//! (where the mount's share of the workers bounds it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// Off-worker threads running, daemon-wide, and their bound (set by the mount manager).
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static MAX: AtomicUsize = AtomicUsize::new(0);

/// Sets the daemon-wide bound of off-worker threads (`fuse.threads`).
pub(crate) fn set_max(threads: usize) {
    MAX.store(threads, Ordering::Release);
}

/// Takes one of `max` places counted by `count`; `false` when none is free.
fn take(count: &AtomicUsize, max: usize) -> bool {
    count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok()
}

fn give(count: &AtomicUsize) {
    count.fetch_sub(1, Ordering::AcqRel);
}

/// One mount's share of the off-worker threads.
#[derive(Debug, Default)]
pub(crate) struct Offload {
    running: Arc<AtomicUsize>,
    max: usize,
}

impl Offload {
    pub(crate) fn new(max: usize) -> Offload {
        Offload { running: Arc::default(), max }
    }

    /// Runs `job` on a thread of its own when the mount's share and the daemon's bound have room;
    /// otherwise (or when no thread can be started) runs it here.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        if !take(&self.running, self.max) {
            return job();
        }
        if !take(&RUNNING, MAX.load(Ordering::Acquire)) {
            give(&self.running);
            return job();
        }
        // Kept where this thread can take it back if the new thread cannot start.
        let slot = Arc::new(Mutex::new(Some(job)));
        let (theirs, mount) = (slot.clone(), self.running.clone());
        let spawned = std::thread::Builder::new()
            .name("scopefs-fsync".into())
            .stack_size(crate::mount::WORKER_STACK)
            .spawn(move || {
                if let Some(job) = theirs.lock().take() {
                    job();
                }
                give(&mount);
                give(&RUNNING);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting an fsync thread failed; the fsync runs on its worker");
            give(&self.running);
            give(&RUNNING);
            if let Some(job) = slot.lock().take() {
                job();
            }
        }
    }
}
