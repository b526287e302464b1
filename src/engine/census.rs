//! The staging census: one walk of a scope's staging directory that says what opening the scope
//! needs to know (bytes held, recovery work left, which directories exist), and the daemon-wide
//! walk at startup that takes every scope's census at once, on several threads, so that opening
//! thousands of scopes after a restart walks nothing again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::journal::INLINE_MARKER;
use super::openlog::OPEN_LOG;

/// What one scope's staging directory holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct StagingCensus {
    /// Bytes of every file below the directory.
    pub bytes: u64,
    /// The scope's staging directory exists.
    pub dir: bool,
    /// `blocks/` and `open/` exist.
    pub blocks_dir: bool,
    pub open_dir: bool,
    /// Something is in `blocks/` (staged blocks) or `open/` (write buffers), or unreadable.
    pub staged_blocks: bool,
    pub write_buffers: bool,
    /// The inline journal's marker is there.
    pub inline_journal: bool,
    /// The open-file log holds records.
    pub open_log: bool,
}

impl StagingCensus {
    /// Whether opening the scope has recovery to do.
    pub fn has_work(&self) -> bool {
        self.staged_blocks || self.write_buffers || self.inline_journal || self.open_log
    }

    /// Takes the census of the staging directory `dir` of one scope.
    pub fn of(dir: &Path) -> StagingCensus {
        let mut census = StagingCensus::default();
        let Ok(entries) = std::fs::read_dir(dir) else { return census };
        census.dir = true;
        for e in entries.flatten() {
            let name = e.file_name();
            match e.file_type() {
                Ok(t) if t.is_dir() => {
                    let (bytes, readable, nonempty) = tree_size(&e.path());
                    census.bytes += bytes;
                    // An unreadable directory counts as holding work: recovery reports it.
                    let work = nonempty || !readable;
                    if name == "blocks" {
                        census.blocks_dir = true;
                        census.staged_blocks = work;
                    } else if name == "open" {
                        census.open_dir = true;
                        census.write_buffers = work;
                    }
                }
                Ok(_) => {
                    let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                    census.bytes += len;
                    if name == INLINE_MARKER {
                        census.inline_journal = true;
                    } else if name == OPEN_LOG {
                        census.open_log = len > 0;
                    }
                }
                Err(_) => {}
            }
        }
        census
    }
}

/// Bytes of the files below `dir` (walked with an explicit stack), whether `dir` itself could be
/// read, and whether it holds anything.
pub(crate) fn tree_size(dir: &Path) -> (u64, bool, bool) {
    let Ok(top) = std::fs::read_dir(dir) else { return (0, false, false) };
    let mut total = 0;
    let mut nonempty = false;
    let mut todo: Vec<PathBuf> = Vec::new();
    let mut add = |entries: std::fs::ReadDir, todo: &mut Vec<PathBuf>| {
        for e in entries.flatten() {
            nonempty = true;
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(_) => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                Err(_) => {}
            }
        }
    };
    add(top, &mut todo);
    while let Some(d) = todo.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            add(entries, &mut todo);
        }
    }
    (total, true, nonempty)
}

/// Every scope's census below the staging root `root` (keyed by directory name), and the bytes of
/// everything below `root`, walked on up to `threads` threads.
pub(crate) fn take_all(root: &Path, threads: usize) -> (HashMap<String, StagingCensus>, u64) {
    let mut dirs = Vec::new();
    let mut loose = 0;
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(e.file_name().to_string_lossy().into_owned()),
                Ok(_) => loose += e.metadata().map(|m| m.len()).unwrap_or(0),
                Err(_) => {}
            }
        }
    }
    let threads = threads.clamp(1, dirs.len().max(1));
    let chunk = dirs.len().div_ceil(threads).max(1);
    let found: Vec<(String, StagingCensus)> = std::thread::scope(|s| {
        let walkers: Vec<_> = dirs
            .chunks(chunk)
            .map(|names| s.spawn(move || names.iter().map(|n| (n.clone(), StagingCensus::of(&root.join(n)))).collect()))
            .collect();
        walkers.into_iter().flat_map(|w| w.join().unwrap_or_else(|_| Vec::new())).collect()
    });
    let total = loose + found.iter().map(|(_, c)| c.bytes).sum::<u64>();
    (found.into_iter().collect(), total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_census_sees_bytes_work_and_directories_in_one_walk() {
        let root = tempfile::tempdir().unwrap();
        let idle = root.path().join("idle");
        for d in ["blocks", "open"] {
            std::fs::create_dir_all(idle.join(d)).unwrap();
        }
        std::fs::write(idle.join(OPEN_LOG), b"").unwrap();
        let busy = root.path().join("busy");
        std::fs::create_dir_all(busy.join("blocks/ab")).unwrap();
        std::fs::write(busy.join("blocks/ab/cd"), [1u8; 10]).unwrap();
        std::fs::write(busy.join(OPEN_LOG), [2u8; 5]).unwrap();
        std::fs::write(busy.join(INLINE_MARKER), [3u8; 1]).unwrap();
        std::fs::write(root.path().join("stray"), [0u8; 7]).unwrap();

        let c = StagingCensus::of(&idle);
        assert!(c.dir && c.blocks_dir && c.open_dir && !c.has_work() && c.bytes == 0, "{c:?}");
        let c = StagingCensus::of(&busy);
        assert!(c.dir && c.blocks_dir && !c.open_dir, "{c:?}");
        assert!(c.staged_blocks && !c.write_buffers && c.inline_journal && c.open_log, "{c:?}");
        assert_eq!(c.bytes, 16);
        assert_eq!(StagingCensus::of(&root.path().join("none")), StagingCensus::default());

        for threads in [1, 2, 8] {
            let (all, total) = take_all(root.path(), threads);
            assert_eq!(all.len(), 2);
            assert_eq!(all["busy"], StagingCensus::of(&busy));
            assert_eq!(all["idle"], StagingCensus::of(&idle));
            assert_eq!(total, 23, "every byte below the root, loose files included");
        }
    }
}
