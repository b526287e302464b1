//! A crash harness that enumerates crash states instead of sampling them (issue 21, item 5).
//!
//! **Recording** (`recorder`, `recorder_fs`, `passthrough`, `ops`). A FUSE pass-through
//! filesystem over a backing directory holds the engine's data directory *and* its object
//! directory (`LocalDirStore`), so every file the engine and SQLite touch is recorded: the
//! metadata database, its WAL and `-redo` log, staging and working files, the inline journal
//! marker, the object pack and its WAL, large object files, the block cache's pack. It logs each
//! mutating request in the order it performs them (one serving thread: a total order) with files
//! named by ids that are never reused: `write` (file, offset, bytes), `truncate`, `create` and
//! `mknod`, `mkdir`, `symlink`, `link`, `unlink`, `rmdir`, `rename` (with flags), `fsync` and
//! `fdatasync` of a file, `fsync` of a directory. Recording starts with a snapshot of the tree (the
//! initial image); the op counter (`Recorder::ops`) lets a test note the ops around each engine
//! step. One-shot faults: the k-th write or the k-th sync (file or directory) fails with a chosen
//! errno and is not performed. Nothing is flushed to the backing disk. SQLite's `-shm` index is
//! written but not logged (SQLite rebuilds it when it first opens a database).
//!
//! **Crash states** (`states`, `image`). From the initial image and the ops `0..i` issued at
//! crash point `i`:
//! - the *kill -9 state*: every op applied (the page cache survives a killed process);
//! - *power-loss states*, under POSIX ordering: guaranteed durable are a file's writes and
//!   truncates issued before a completed fsync/fdatasync of that file, and a directory's entry
//!   operations (create, link, unlink, rename in or out, mkdir, rmdir, symlink) issued before a
//!   completed fsync of that directory (a rename: of either directory). Any subset of the rest
//!   may persist; kept ops are applied in log order, and an entry operation whose source is not
//!   where it was (an earlier op left out) does nothing. A write not yet durable when a sync of
//!   its file failed is never kept (Linux marks such pages clean: "fsyncgate").
//!
//! The family enumerated at each crash point (units: a file's unsynced data ops, a directory's
//! unsynced entry ops):
//! - depth 1 (`SCOPEFS_CRASH_DEPTH` unset or 1, the tier CI runs): none of the unsynced ops; all
//!   of them; for each unit, all but its ops, and only its ops; for each file, every prefix of
//!   its unsynced op sequence with everything else kept; each file's last unsynced write torn at
//!   4 KiB boundaries of the file (the part before the first boundary, and the part from the
//!   last boundary on), everything else kept. Crash points: just before every sync op, at the
//!   end of every step, and at the end of the log. Kill -9: every op index.
//! - depth 2+: in addition, all but the ops of each *pair* of units; prefix combinations across
//!   every pair of files (at most 400 per crash point); every prefix of each file's unsynced ops
//!   *alone* (nothing else kept); the last write torn at *every* 4 KiB boundary, both sides;
//!   crash points at *every* op index; more and longer generated histories (40·depth histories
//!   of up to 20·depth steps, against 16 of up to 18 at depth 1); every power-loss state of the
//!   end of each faulted run (depth 1: none of the unsynced ops, and all but the metadata WAL's);
//!   every distinct end state of phase one is recovered and crashed again (depth 1: three).
//!
//! Identical images are deduplicated by a content hash (each distinct one is written out and
//! opened once). Each test prints its counts: crash points, kill -9 states, power-loss states
//! and how many were distinct, fault points, checks held (`--nocapture`).
//!
//! **Checks** (`check`, `model`, `harness`, `runner`, `faults`). Each state is opened by a fresh
//! `Storage` and `LocalDirStore`, read through the engine (tree, contents, `user.k`, hard links),
//! its recovered uploads drained, and fsck'ed. A kill -9 state must show the model after the
//! steps completed before `i`, or after the step in flight, exactly, with a clean fsck and no
//! consistency problems. A power-loss state must open and show the model after a prefix `k`,
//! `d <= k <=` the step in flight, `d` being the steps before the last durability point (fsync,
//! fsync of a directory, sync) completed before `i`; a file written at or after step `d` may
//! read EIO instead (never wrong bytes), and only such files may fsck name. A stale or foreign
//! redo record replayed shows up as a tree matching no prefix.
//!
//! `SCOPEFS_CRASH_SEED` changes the histories generated; `SCOPEFS_CRASH_VERBOSE=1` lists every
//! failed check; `SCOPEFS_CRASH_FAULT=write:K:ENOSPC` runs one fault point alone;
//! `SCOPEFS_CRASH_KEEP=<dir>` writes each image that failed to open or read there, as it was
//! before it was opened.

pub mod check;
pub mod faults;
pub mod harness;
pub mod image;
pub mod model;
pub mod ops;
pub mod passthrough;
pub mod recorder;
mod recorder_fs;
pub mod recorder_server;
mod recorder_state;
pub mod runner;
pub mod states;
pub mod wire;

/// Defines, in a test target that uses this harness, the helper test a recorder's serving
/// process runs (`recorder_server`); a plain run of it returns at once.
#[macro_export]
macro_rules! recorder_process {
    () => {
        #[test]
        #[ignore = "the process serving a crash harness recording mount, started by the harness"]
        fn crashsim_recorder_process() {
            crashsim_support::recorder_server::serve_if_asked();
        }
    };
}

use harness::StepRun;
use recorder::Recording;

/// `SCOPEFS_CRASH_DEPTH` (default 1).
pub fn depth() -> u32 {
    std::env::var("SCOPEFS_CRASH_DEPTH").ok().and_then(|v| v.parse().ok()).filter(|d| *d >= 1).unwrap_or(1)
}

/// The crash points whose power-loss families are checked: at depth 1, just before every sync
/// op (the most unsynced work a sync is about to cover) and at the end of every step; at depth
/// 2+, every op index.
pub fn power_points(rec: &Recording, runs: &[StepRun], depth: u32) -> Vec<usize> {
    let n = rec.log.len();
    let mut points: Vec<usize> = if depth >= 2 {
        (0..=n).collect()
    } else {
        let syncs = (0..n).filter(|&i| rec.log[i].is_sync());
        syncs.chain(runs.iter().map(|r| r.end)).chain([n]).collect()
    };
    points.sort_unstable();
    points.dedup();
    points
}
