//! Open files across a restart: every uncommitted change of an open file is logged in the scope's
//! open-file log (`openlog.rs`) before the request that made it is answered, and a scope opened after
//! its process died replays the log onto each file's committed version and commits the result
//! before it serves anything, so a handle the kernel hands the next process finds everything it was
//! told was written.
//!
//! A child module of `fileio` (declared there), so it works on the open-file state directly.

use std::borrow::Cow;
use std::os::unix::fs::FileExt;

use super::OpenFile;
use crate::engine::meta::now_ns;
use crate::engine::openlog::{self, Change, Entry, OPEN_LOG};
use crate::engine::{EngineError, EngineResult, FileKind, Ino, ScopeEngine};

impl ScopeEngine {
    /// Marks the file changed now (its mtime too). A file that had no uncommitted change keeps the
    /// open-file log's generation until it commits (`OpenLog::settled`).
    pub(super) fn mark_changed(&self, f: &mut OpenFile) {
        f.mtime_ns = now_ns();
        if f.changed.is_none() {
            f.changed = Some(std::time::Instant::now());
            self.open_log.dirtied();
            self.arm_writeback();
        }
    }

    /// Logs `data`, just written at `offset`: per block, its bytes (a block kept in memory) or the
    /// name of the working file that holds them.
    pub(super) fn log_write(&self, ino: Ino, f: &mut OpenFile, offset: u64, data: &[u8]) -> EngineResult<()> {
        let bs = self.block_size();
        let end = offset + data.len() as u64;
        let mut pos = offset;
        let mut changes = Vec::new();
        while pos < end {
            let n = (bs - pos % bs).min(end - pos);
            let change = match f.dirty.get(&(pos / bs)).and_then(|d| d.working_name()) {
                Some(file) => Change::WriteIn { offset: pos, len: n, file: Cow::Owned(file) },
                None => {
                    let at = (pos - offset) as usize;
                    Change::Write { offset: pos, data: Cow::Borrowed(&data[at..at + n as usize]) }
                }
            };
            changes.push(change);
            pos += n;
        }
        self.log_changes(ino, f, changes)
    }

    /// Logs the changes one request made to an open file (marked changed), with the version they
    /// build on, as one record; with the log at its bound, commits the file instead (as durable
    /// against a killed process, and nothing of it left for the log to carry).
    pub(super) fn log_changes(&self, ino: Ino, f: &mut OpenFile, changes: Vec<Change<'_>>) -> EngineResult<()> {
        if self.open_log_full() {
            return self.commit_locked(ino, f).map(drop);
        }
        let entries: Vec<Entry<'_>> =
            changes.into_iter().map(|change| Entry { ino, version: f.version, mtime_ns: f.mtime_ns, change }).collect();
        self.open_log.append(self.staging_dir(), &entries)?;
        Ok(())
    }

    fn staging_dir(&self) -> &std::path::Path {
        self.open_dir.parent().unwrap_or(&self.open_dir)
    }

    /// Replays the open-file log an earlier process left: each file's changes onto its committed
    /// version, committed as a new version; then empties the log durably. A file whose changes
    /// cannot be put back is reported to its handles (`errseq.rs`) and named in the log.
    pub(crate) fn replay_open_log(&self) -> EngineResult<()> {
        let path = self.staging_dir().join(OPEN_LOG);
        let Ok(meta) = std::fs::metadata(&path) else { return Ok(()) };
        if meta.len() == 0 {
            return Ok(());
        }
        let (mut files, mut changes) = (0usize, 0usize);
        for (ino, entries) in openlog::read(&path)? {
            match self.replay_file(ino, &entries) {
                Ok(0) => {}
                Ok(n) => {
                    files += 1;
                    changes += n;
                }
                Err(e) => {
                    self.errors.inode_error(ino);
                    tracing::error!(scope = %self.scope_id, ino, error = %e, "putting back an open file's changes failed; its handles are told");
                }
            }
        }
        openlog::clear(&path)?;
        self.staging_sub(meta.len());
        if files > 0 {
            tracing::info!(scope = %self.scope_id, files, changes, "open files' changes replayed from the open-file log");
        }
        Ok(())
    }

    /// Replays the changes of one file; how many it applied.
    fn replay_file(&self, ino: Ino, entries: &[Entry<'static>]) -> EngineResult<usize> {
        let row = match self.meta.lock()?.inode(ino) {
            Ok(row) if row.kind == FileKind::File => row,
            // Deleted since (or never committed): nothing to put back.
            Ok(_) | Err(EngineError::NotFound) => return Ok(0),
            Err(e) => return Err(e),
        };
        let todo = openlog::to_apply(entries, row.version);
        if todo.is_empty() {
            return Ok(0);
        }
        let file = self.acquire(ino)?;
        let result = (|| {
            let mut f = file.lock();
            for e in todo {
                self.replay_change(&mut f, ino, &e.change)?;
                self.mark_changed(&mut f);
                f.mtime_ns = e.mtime_ns;
            }
            self.commit_locked(ino, &mut f)
        })();
        self.drop_handle_ref(ino);
        result.map(|_| todo.len())
    }

    fn replay_change(&self, f: &mut OpenFile, ino: Ino, change: &Change<'_>) -> EngineResult<()> {
        match change {
            Change::Write { offset, data } => self.replay_bytes(f, ino, *offset, data),
            Change::WriteIn { offset, len, file } => {
                // The working file holds the block's newest bytes; gone, it was committed (or cut
                // away by a later change of this log).
                let Ok(working) = std::fs::File::open(self.open_dir.join(file.as_ref())) else { return Ok(()) };
                let mut buf = vec![0u8; *len as usize];
                let in_block = offset % self.block_size();
                let mut got = 0;
                while got < buf.len() {
                    match working.read_at(&mut buf[got..], in_block + got as u64)? {
                        0 => break,
                        n => got += n,
                    }
                }
                self.replay_bytes(f, ino, *offset, &buf)
            }
            Change::SetSize { size } => self.truncate_locked(f, *size),
            Change::Zero { start, end } => self.zero_range(f, ino, *start, *end).map(drop),
        }
    }

    /// Puts bytes back (the quota was checked when they were first written).
    fn replay_bytes(&self, f: &mut OpenFile, ino: Ino, offset: u64, data: &[u8]) -> EngineResult<()> {
        let end = offset + data.len() as u64;
        if end > f.size {
            *self.pending_growth.lock() += (end - f.size) as i64;
        }
        self.write_blocks(f, ino, offset, data).1
    }
}
