//! Creates at the inode quota while a closed, unlinked file's release is on its way. The kernel
//! sends FUSE `release` after `close()` has returned, so a program that closes a file, unlinks it
//! and creates another can find the unlinked inode still counted (kept for a handle the kernel has
//! not let go yet) and get `EDQUOT`, which no local filesystem answers. A create refused for the
//! inode quota while an unlinked file is open in this process waits for a release to delete one
//! (at most `RELEASE_GRACE` in all) and is tried again; with none coming it is refused as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{EngineError, EngineResult, Ino, ScopeEngine};

/// Longest a create at the inode quota waits for releases of unlinked files.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_millis(100);

/// Unlinked inodes deleted since the scope was opened, a wake for whoever waits on them, and how
/// many times a create waited (once per release it waited for).
#[derive(Default)]
pub(crate) struct Releases {
    deleted: Mutex<u64>,
    changed: Condvar,
    waits: AtomicU64,
}

impl Releases {
    fn seen(&self) -> u64 {
        *self.deleted.lock()
    }

    /// An unlinked inode was deleted (its last handle released, or the kernel forgot it).
    pub(crate) fn deleted(&self) {
        *self.deleted.lock() += 1;
        self.changed.notify_all();
    }

    /// Waits until an inode is deleted after `seen` was read, or `deadline`; whether one was.
    fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        let mut deleted = self.deleted.lock();
        while *deleted == seen {
            if self.changed.wait_until(&mut deleted, deadline).timed_out() {
                break;
            }
        }
        *deleted != seen
    }
}

impl ScopeEngine {
    /// Runs `insert` (which takes and releases the metadata lock itself); refused for the inode
    /// quota while an unlinked file is open here, it waits for a release and runs again.
    pub(crate) fn within_inode_quota<T>(&self, mut insert: impl FnMut() -> EngineResult<T>) -> EngineResult<T> {
        let deadline = Instant::now() + RELEASE_GRACE;
        loop {
            let seen = self.releases.seen();
            match insert() {
                Err(EngineError::QuotaExceeded("inodes")) if self.unlinked_open() => {
                    self.releases.waits.fetch_add(1, Ordering::Relaxed);
                    if !self.releases.wait_past(seen, deadline) {
                        return Err(EngineError::QuotaExceeded("inodes"));
                    }
                }
                result => return result,
            }
        }
    }

    /// Deletes `ino` if it still has no name (its last holder let go of it) and wakes the creates
    /// waiting at the inode quota. A failure is logged: the inode stays, counted, until the next
    /// start of the scope on a fresh mount collects it.
    pub(crate) fn delete_unlinked(&self, ino: Ino) {
        match self.meta.lock().and_then(|mut m| m.delete_detached(ino)) {
            Ok(true) => self.releases.deleted(),
            Ok(false) => {}
            Err(e) => tracing::warn!(scope = %self.scope_id, ino, error = %e, "deleting an unlinked inode failed"),
        }
    }

    /// Whether a file without a name is held open by a handle of this process.
    fn unlinked_open(&self) -> bool {
        self.open_files.lock().values().any(|e| e.detached)
    }

    /// Times a create at the inode quota waited for an unlinked file's release (a create still
    /// refused after one release waits again, within the same grace).
    pub fn inode_quota_waits(&self) -> u64 {
        self.releases.waits.load(Ordering::Relaxed)
    }
}
