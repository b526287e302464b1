//! Write-back of open files: changes a file held open has not committed are committed while it stays
//! open — after `dirty_writeback` (so its memory, staging and open-file log records do not outlive
//! the bound however long a program keeps it open), when a write finds staging full (the file is
//! committed and the scope's staged blocks uploaded before the write gives up with `NoSpace`), when
//! the open-file log passes its bound (each change is then committed at once instead of logged, and
//! every open file is committed so the log can start over), before a handover to the next process,
//! and at a whole-scope sync (a fork's copy among its callers). A commit here is the one a close
//! makes; the file's handles see no difference.
//!
//! A child module of `fileio` (declared there), so it works on the open-file state directly.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::OpenFile;
use crate::engine::{EngineError, EngineResult, Ino, ScopeEngine};

/// Shortest and longest pause of a scope's write-back task between two looks at its open files.
const TICK_MIN: Duration = Duration::from_millis(50);
const TICK_MAX: Duration = Duration::from_secs(5);

/// A scope's write-back task: whether it runs, and what wakes it before its next look (shared with
/// the task, which holds the engine only while it looks).
#[derive(Default)]
pub(crate) struct WriteBack {
    running: Mutex<bool>,
    wake: Arc<tokio::sync::Notify>,
}

impl ScopeEngine {
    /// An open file got its first uncommitted change: the scope's write-back task looks at it
    /// within `dirty_writeback` (started unless it runs).
    pub(in crate::engine) fn arm_writeback(&self) {
        let mut running = self.writeback.running.lock();
        if *running {
            return;
        }
        *running = true;
        drop(running);
        let tick = (self.storage.settings.dirty_writeback / 4).clamp(TICK_MIN, TICK_MAX);
        let (me, wake) = (self.self_ref.clone(), self.writeback.wake.clone());
        self.storage.rt.spawn(run_writeback(me, wake, tick));
    }

    /// Every open file's state, taken out of the map (its lock is not held while they are locked).
    fn open_file_states(&self) -> Vec<(Ino, Arc<Mutex<OpenFile>>)> {
        self.open_files.lock().iter().map(|(ino, e)| (*ino, e.file.clone())).collect()
    }

    /// Commits every open file whose changes are older than `dirty_writeback` (`all`: every open
    /// file with changes). A commit that fails leaves its file's changes where they were (in the
    /// open-file log): the file's close or fsync commits them or reports the error.
    fn write_back(&self, all: bool) {
        let due = Instant::now().checked_sub(self.storage.settings.dirty_writeback);
        let files = self.open_file_states();
        for (ino, file) in files {
            let mut f = file.lock();
            let Some(since) = f.changed else { continue };
            if !all && due.is_none_or(|due| since > due) {
                continue;
            }
            if let Err(e) = self.commit_locked(ino, &mut f) {
                tracing::warn!(scope = %self.scope_id, ino, error = %e, "writing back an open file failed; its changes stay logged");
            }
        }
        if self.open_log.dirty_files() == 0 {
            // Nothing uncommitted: the log's disk goes (a generation past its bound included).
            if let Err(e) = self.open_log.empty_if_settled() {
                tracing::warn!(scope = %self.scope_id, error = %e, "emptying the open-file log failed");
            }
        }
    }

    /// Whether the open-file log has reached `open_log_max_bytes`: a change is then committed at once
    /// instead of logged, and the write-back task commits every open file.
    pub(in crate::engine) fn open_log_full(&self) -> bool {
        if self.open_log.generation_bytes() < self.storage.settings.open_log_max_bytes {
            return false;
        }
        self.writeback.wake.notify_one();
        true
    }

    /// `write_blocks`, and when staging has no room for it: the file is committed and the scope's
    /// staged blocks uploaded (the room they held comes back), then the rest of the write is tried
    /// once more. Returns how far it got and whether it all went.
    pub(super) fn write_with_room(
        &self,
        f: &mut OpenFile,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> (u64, EngineResult<()>) {
        let (reached, result) = self.write_blocks(f, ino, offset, data);
        if !matches!(result, Err(EngineError::NoSpace)) || self.staging_bytes() == 0 {
            return (reached, result);
        }
        if reached > offset {
            // What got written is committed with the rest (a file with no change yet commits nothing).
            self.mark_changed(f);
        }
        if let Err(e) = self.make_staging_room(ino, f) {
            tracing::debug!(scope = %self.scope_id, error = %e, "writing back to make staging room failed");
            return (reached, result);
        }
        let end = offset + data.len() as u64;
        if end > f.size {
            if let Err(e) = self.reserve_growth(end - f.size) {
                return (reached, Err(e));
            }
        }
        self.write_blocks(f, ino, reached, &data[(reached - offset) as usize..])
    }

    /// Commits the file (its blocks become the journal's) and uploads every block the scope has
    /// staged; what fails to upload stays queued.
    fn make_staging_room(&self, ino: Ino, f: &mut OpenFile) -> EngineResult<()> {
        let new = self.commit_with(ino, f, true)?;
        let staged = self.meta.lock()?.staged_blocks()?;
        let uploaded = self.upload_now(&staged);
        if uploaded.is_err() {
            for sha in new {
                self.enqueue_upload(sha);
            }
        }
        uploaded
    }

    /// Commits the written data of every open file, and from now on each write as it happens: the
    /// process is about to hand its mounts to the next one, which knows the handles but not
    /// their uncommitted state. Returns the first commit error (the others are still tried).
    pub fn commit_open_files(&self) -> EngineResult<()> {
        self.commit_each_write.store(true, Ordering::SeqCst);
        let result = self.commit_open_changes();
        // Everything committed: the next process need not replay (nor open the scope at once).
        if let Err(e) = self.open_log.empty_if_settled() {
            tracing::warn!(scope = %self.scope_id, error = %e, "emptying the open-file log failed");
        }
        result
    }

    /// Commits what every open file's handles were told was written and is not committed yet (the
    /// files stay open; a commit here is the one a close makes), so that it is the scope's state:
    /// a whole-scope sync and a fork's copy hold every acknowledged write, as a `kill -9` image
    /// does. Returns the first commit error (the other files are still committed).
    pub fn commit_open_changes(&self) -> EngineResult<()> {
        let mut result = Ok(());
        for (ino, file) in self.open_file_states() {
            if let Err(e) = self.commit_locked(ino, &mut file.lock()) {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }
}

/// The write-back task of a scope: looks at its open files every `tick` (a quarter of
/// `dirty_writeback`, within bounds) or at once when woken, until none has uncommitted changes, or
/// the scope is gone. It holds the engine only while it looks, never while it waits.
async fn run_writeback(engine: Weak<ScopeEngine>, wake: Arc<tokio::sync::Notify>, tick: Duration) {
    loop {
        let woken = tokio::select! {
            _ = tokio::time::sleep(tick) => false,
            _ = wake.notified() => true,
        };
        let Some(e) = engine.upgrade() else { return };
        let worker = e.clone();
        if let Err(err) = tokio::task::spawn_blocking(move || worker.write_back(woken)).await {
            tracing::error!(scope = %e.scope_id, error = %err, "open-file write-back panicked");
        }
        // Checked under the flag: a file changed after this look finds the task stopped and starts it.
        let mut running = e.writeback.running.lock();
        if e.open_log.dirty_files() == 0 {
            *running = false;
            return;
        }
    }
}
