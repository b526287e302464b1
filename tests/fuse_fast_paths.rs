//! The kernel fast paths of a mount (`[fuse]` max_write_kib, keep_cache, writeback_cache,
//! readahead_kib): each one keeps the mount's semantics — quota errors stay visible, pages cached
//! across opens are dropped when the HTTP API replaces a file, and data written in any request size
//! reads back intact.

#[path = "support/fuse_harness.rs"]
pub mod support;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::IntoRawFd;

use scopefs::engine::{Owner, Quota, WriteMode};
use scopefs_fs::{FastPaths, MountOptions};
use support::*;

fn harness(fast: FastPaths) -> Harness {
    Harness::new(small_block_settings(), MountOptions { fast_paths: fast, ..MountOptions::default() })
}

fn writeback() -> FastPaths {
    FastPaths { writeback_cache: true, ..FastPaths::default() }
}

/// Writes `chunk` until a write fails or `limit` bytes were accepted; returns the write error, if any.
fn fill(f: &mut File, chunk: &[u8], limit: u64) -> Option<std::io::Error> {
    let mut written = 0u64;
    while written < limit {
        match f.write(chunk) {
            Ok(n) => written += n as u64,
            Err(e) => return Some(e),
        }
    }
    None
}

#[test]
fn writeback_cache_reports_quota_errors_on_fsync() {
    let h = harness(writeback());
    let quota = Quota { bytes: 1024 * 1024, inodes: 100 };
    let (e, m) = h.scope(quota);
    let mut f = File::create(m.join("fill")).unwrap();
    let chunk = vec![0xabu8; 64 * 1024];
    // With the writeback cache the page cache accepts writes past the quota (the daemon sees them
    // later, so write(2) cannot fail: this also shows the kernel enabled the cache) ...
    let early = fill(&mut f, &chunk, 4 * quota.bytes);
    assert!(early.is_none(), "write failed at once ({early:?}): is FUSE_WRITEBACK_CACHE on?");
    // ... but the refusal is not lost: fsync reports it with its own errno.
    let err = f.sync_all().expect_err("fsync must report the refused writes");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "fsync error: {err}");
    drop(f);
    assert!(e.usage().unwrap().bytes <= quota.bytes, "usage past the quota");
}

#[test]
fn writeback_cache_reports_quota_errors_on_close() {
    let h = harness(writeback());
    let quota = Quota { bytes: 1024 * 1024, inodes: 100 };
    let (e, m) = h.scope(quota);
    let mut f = File::create(m.join("fill")).unwrap();
    let chunk = vec![0xcdu8; 64 * 1024];
    let early = fill(&mut f, &chunk, 4 * quota.bytes);
    assert!(early.is_none(), "write failed at once ({early:?}): is FUSE_WRITEBACK_CACHE on?");
    // close(2) flushes the dirty pages first; a refused write-back fails the close.
    let fd = f.into_raw_fd();
    // SAFETY: fd was just taken from the File and is closed exactly once.
    let closed = unsafe { libc::close(fd) };
    let close_errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(closed, -1, "close must report the refused writes");
    // The kernel's flush path folds every write-back error but ENOSPC into EIO.
    assert!(matches!(close_errno, Some(libc::EDQUOT) | Some(libc::EIO)), "close errno {close_errno:?}");
    assert!(e.usage().unwrap().bytes <= quota.bytes, "usage past the quota");
}

#[test]
fn writeback_cache_keeps_data_sizes_and_mtimes() {
    let h = harness(writeback());
    let (e, m) = h.scope(big_quota());
    let data = pattern(3 * 64 * 1024 + 123, 7);
    let mut f = File::create(m.join("f")).unwrap();
    // Unaligned pieces: the kernel merges them into pages and writes them back later.
    for piece in data.chunks(1000) {
        f.write_all(piece).unwrap();
    }
    drop(f);
    assert_eq!(fs::read(m.join("f")).unwrap(), data);
    let attr = e.resolve_path("f").unwrap();
    assert_eq!(attr.size, data.len() as u64, "the engine has the whole file after close");
    // Append through a second handle and overwrite in the middle.
    let mut g = OpenOptions::new().append(true).open(m.join("f")).unwrap();
    g.write_all(b"tail").unwrap();
    drop(g);
    let mut expected = data.clone();
    expected.extend_from_slice(b"tail");
    assert_eq!(fs::read(m.join("f")).unwrap(), expected);
    assert_eq!(e.resolve_path("f").unwrap().size, expected.len() as u64);
}

#[test]
fn kept_pages_are_dropped_when_the_http_api_replaces_a_file() {
    let h = harness(FastPaths { keep_cache: true, ..FastPaths::default() });
    let (e, m) = h.scope(big_quota());
    let owner = Owner { uid: 0, gid: 0 };
    let old = pattern(100_000, 1);
    e.write_path("doc", &mut &old[..], 1 << 20, WriteMode::CreateNew, owner).unwrap();
    // Read it twice through the mount: the second open keeps the first one's pages.
    assert_eq!(fs::read(m.join("doc")).unwrap(), old);
    assert_eq!(fs::read(m.join("doc")).unwrap(), old);
    let new = pattern(100_000, 2);
    e.write_path("doc", &mut &new[..], 1 << 20, WriteMode::Replace, owner).unwrap();
    assert_eq!(fs::read(m.join("doc")).unwrap(), new, "the mount must not serve the old pages");
    // An already-open descriptor keeps reading the version it opened (rename-over semantics).
    let mut held = File::open(m.join("doc")).unwrap();
    let newer = pattern(50_000, 3);
    e.write_path("doc", &mut &newer[..], 1 << 20, WriteMode::Replace, owner).unwrap();
    let mut seen = Vec::new();
    held.read_to_end(&mut seen).unwrap();
    assert_eq!(seen, new);
    assert_eq!(fs::read(m.join("doc")).unwrap(), newer);
}

#[test]
fn every_max_write_reads_back_intact() {
    for kib in [4u32, 128, 1024] {
        let h = harness(FastPaths { max_write: kib * 1024, ..FastPaths::default() });
        let (_e, m) = h.scope(big_quota());
        let data = pattern(3 * 1024 * 1024 + 17, u64::from(kib));
        let mut f = File::create(m.join("big")).unwrap();
        for piece in data.chunks(1 << 20) {
            f.write_all(piece).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(fs::read(m.join("big")).unwrap(), data, "max_write {kib} KiB");
    }
}

/// The configured readahead is set on the mount's backing device (FUSE's INIT can only lower the
/// kernel's 128 KiB), and a file larger than it reads back intact.
#[test]
fn the_configured_readahead_is_the_mounts_and_reads_stay_intact() {
    use std::os::unix::fs::MetadataExt;
    for kib in [64u32, 2048] {
        let h = harness(FastPaths { readahead_kib: kib, ..FastPaths::default() });
        let (_e, m) = h.scope(big_quota());
        let dev = fs::metadata(&m).unwrap().dev();
        let knob = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
        assert_eq!(fs::read_to_string(&knob).unwrap().trim(), kib.to_string(), "{knob}");
        let data = pattern(5 * 1024 * 1024 + 3, u64::from(kib));
        fs::write(m.join("f"), &data).unwrap();
        assert_eq!(fs::read(m.join("f")).unwrap(), data, "readahead {kib} KiB");
    }
}
