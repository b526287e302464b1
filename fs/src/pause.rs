//! Pausing every mount of this process before a restart hands them to the next process: from
//! `pause_all` on, a kernel request is parked before the engine sees it (never answered here, so
//! the next process gets it through `FUSE_NOTIFY_RESEND` and runs it exactly once), and
//! `pause_all` returns once no engine operation is running any more.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

static PAUSED: AtomicBool = AtomicBool::new(false);
/// Engine operations running. `enter` counts before it checks `PAUSED` and `pause_all` sets
/// `PAUSED` before it reads the count (both `SeqCst`), so one of them always sees the other.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// Held by `pause_all` from reading the count to waiting, and taken to notify it.
static WAITER: Mutex<()> = Mutex::new(());
static IDLE: Condvar = Condvar::new();

/// One engine operation of a kernel request; ends when dropped.
pub(crate) struct Running(());

/// Admits one engine operation, or parks the calling FUSE thread for good once paused.
pub(crate) fn enter() -> Running {
    RUNNING.fetch_add(1, SeqCst);
    let running = Running(());
    if PAUSED.load(SeqCst) {
        drop(running);
        loop {
            std::thread::park();
        }
    }
    running
}

impl Drop for Running {
    fn drop(&mut self) {
        if RUNNING.fetch_sub(1, SeqCst) == 1 && PAUSED.load(SeqCst) {
            let _guard = WAITER.lock();
            IDLE.notify_all();
        }
    }
}

/// Stops admitting engine operations and waits, for at most `limit`, until the running ones end.
/// Returns whether they all ended. Irreversible: the process is about to exit.
pub fn pause_all(limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    PAUSED.store(true, SeqCst);
    let mut guard = WAITER.lock();
    while RUNNING.load(SeqCst) > 0 {
        if IDLE.wait_until(&mut guard, deadline).timed_out() {
            return RUNNING.load(SeqCst) == 0;
        }
    }
    true
}

/// Name whose lookup the test hook stalls before the engine sees it.
const STALL_NAME: &[u8] = b"stall-me";
/// Name whose mutation (mkdir, create, rename's new name, ...) the test hook stalls after the engine
/// applied it, before the answer goes out.
const STALL_AFTER_NAME: &[u8] = b"stall-after-me";

/// Test hook, honoured by test builds only (`scopefs::testhooks`, feature `test-hooks`): when
/// `SCOPEFS_TEST_FUSE_STALL` names a marker file that exists, a lookup of `stall-me` renames the
/// marker to `<marker>.reached` and is never answered (its thread parks): a request in flight when
/// the process is killed.
pub(crate) fn test_stall(name: &[u8]) {
    if name == STALL_NAME {
        stall_if_armed();
    }
}

/// Like `test_stall`, for a mutation of `stall-after-me` once the engine applied it: a request the
/// process dies before answering, which the kernel then resends to the next one.
pub(crate) fn test_stall_after(name: &[u8]) {
    if name == STALL_AFTER_NAME {
        stall_if_armed();
    }
}

fn stall_if_armed() {
    let Some(marker) = scopefs::testhooks::fuse_stall_marker() else { return };
    let mut reached = marker.clone();
    reached.push(".reached");
    if std::fs::rename(&marker, &reached).is_ok() {
        loop {
            std::thread::park();
        }
    }
}
