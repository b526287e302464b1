//! Issue 10 item 5: idle scopes cost the daemon no threads of their own. Every scope's FUSE
//! session is served by one pool of workers sized by the daemon (`fuse.threads`), so mounting
//! many scopes adds mounts, not threads; every mount is still served, concurrently, and an
//! unmounted scope's session ends.

#[path = "support/fuse_harness.rs"]
pub mod harness;

use std::fs;
use std::path::PathBuf;

use harness::*;
use scopefs::engine::StorageSettings;
use scopefs_fs::MountOptions;

/// Scopes mounted by the test.
const K: usize = 50;
/// Threads the process may gain between one mount and `K` (runtime threads started on demand);
/// one session thread per mount, as before the pool, would be `K - 1` or more.
const SLACK: usize = 4;

/// The `Threads:` count of this process.
fn threads() -> usize {
    let status = fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("Threads:")).expect("a Threads line");
    line["Threads:".len()..].trim().parse().expect("a thread count")
}

/// Whether `path` is the root of a FUSE mount (answers `statfs` as FUSE).
fn is_fuse(path: &std::path::Path) -> bool {
    let c = cpath(path);
    // SAFETY: statfs into a zeroed struct with a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    rc == 0 && magic == 0x6573_5546
}

#[test]
fn many_mounts_share_one_pool_of_fuse_workers() {
    let h = Harness::new(StorageSettings::default(), MountOptions::default());
    let (_first, first) = h.scope(big_quota());
    assert!(is_fuse(&first), "the first scope is not mounted");
    fs::metadata(&first).expect("stat of the first mount");
    let one = threads();

    let mut mounts: Vec<PathBuf> = vec![first];
    let mut engines = Vec::new();
    for _ in 1..K {
        let (engine, mnt) = h.scope(big_quota());
        fs::metadata(&mnt).expect("stat of a new mount");
        engines.push(engine);
        mounts.push(mnt);
    }
    let many = threads();
    assert!(
        many <= one + SLACK,
        "{K} mounted scopes run {many} threads, one ran {one}: threads grow with the number of scopes"
    );

    // Every mount is served by the shared workers, from several clients at once.
    std::thread::scope(|s| {
        for chunk in mounts.chunks(K / 5) {
            s.spawn(move || {
                for (i, m) in chunk.iter().enumerate() {
                    let body = format!("scope {} file {i}\n", m.display());
                    fs::write(m.join("f"), &body).expect("write through a mount");
                    assert_eq!(fs::read_to_string(m.join("f")).expect("read back"), body);
                    assert_eq!(fs::read_dir(m).expect("list a mount").count(), 1);
                }
            });
        }
    });

    // An unmounted scope is gone; the others are still served.
    let scope = engines[0].scope_id().clone();
    h.mounts.unmount(&scope).expect("unmount");
    assert!(!is_fuse(&mounts[1]), "an unmounted scope still answers as a FUSE mount");
    for m in &mounts[2..] {
        assert!(m.join("f").exists(), "a mount stopped answering after another was unmounted");
    }
}

/// Scopes mount in parallel (startup mounts many at once): concurrent mounts of different scopes,
/// and of the same scope from several threads, each end with exactly one working mount per scope.
#[test]
fn scopes_mount_in_parallel_and_one_scope_mounts_once() {
    let h = Harness::new(StorageSettings::default(), MountOptions::default());
    let engines: Vec<_> = (0..24)
        .map(|_| h.storage.open_scope(&scopefs::ids::ScopeId::generate(), big_quota()).expect("open scope"))
        .collect();
    let mounted: Vec<Vec<PathBuf>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..6)
            .map(|_| {
                let (mounts, engines) = (&h.mounts, &engines);
                // Every thread mounts every scope: different scopes run side by side, and each
                // scope is raced by all six threads.
                s.spawn(move || engines.iter().map(|e| mounts.mount(e.clone()).expect("mount")).collect::<Vec<_>>())
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("mount thread")).collect()
    });
    for paths in &mounted[1..] {
        assert_eq!(paths, &mounted[0], "every thread got the same mountpoint for each scope");
    }
    let table = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    for (engine, path) in engines.iter().zip(&mounted[0]) {
        assert!(is_fuse(path), "{} is not mounted", engine.scope_id());
        let needle = format!(" {} ", path.display());
        assert_eq!(table.matches(&needle).count(), 1, "scope {} is mounted more than once", engine.scope_id());
        fs::write(path.join("f"), b"x").expect("write through a parallel mount");
    }
}
