//! Issue 10 item 5: idle scopes cost the daemon no threads of their own. Every scope's FUSE
//! session is served by one pool of workers sized by the daemon (`fuse.threads`), so mounting
//! many scopes adds mounts, not threads; every mount is still served, concurrently, and an
//! unmounted scope's session ends.
//!
//! Issue 22 N1: one mount holds at most `max_workers_per_mount` of those workers, so a scope whose
//! requests block leaves the other scopes theirs.

#[path = "support/fuse_harness.rs"]
pub mod harness;

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// Tests of this file that start threads run one at a time: the first counts the process's threads.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn many_mounts_share_one_pool_of_fuse_workers() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

/// Issue 22 N1, from the review's reproduction: sixteen `fsync`s in scope A, each waiting in the
/// foreground on an object store that does not answer (each holds the worker that serves it while
/// it uploads). Scope A holds at most its share of the sixteen workers (8); scope B's lookup,
/// create, write, close, stat, read and listing are all answered while every one of A's fsyncs is
/// still waiting. With no share (every worker A's) B's first request waits until A's fsyncs give
/// up on the store (the assertion on their order fails).
#[test]
fn fsyncs_waiting_on_the_store_in_one_scope_leave_the_other_scopes_their_workers() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (store, h, share) = over_a_store_to_stall();
    let (_a, mnt_a) = h.scope(big_quota());
    let (_b, mnt_b) = h.scope(big_quota());
    let waiting_in_a = kernel_waiting(&mnt_a);
    store.set_stall(Some(Duration::from_secs(600)));
    let fsyncs_returned = AtomicUsize::new(0);
    // Every file is created and written before any fsync: creates in one directory take turns in
    // the kernel, so that all sixteen fsyncs are asked for at once.
    let written = std::sync::Barrier::new(16);
    std::thread::scope(|s| {
        fsync_writers(s, &mnt_a, 16, &fsyncs_returned, &written);
        // All sixteen fsyncs are in the daemon or its queue, and A's share of workers is busy.
        wait_until("scope A's sixteen fsyncs to wait", || waiting_in_a() >= 16);
        wait_until("scope A's fsyncs to hold its share of the workers", || h.mounts.busy_workers() >= share);
        // Scope B meanwhile: every kind of request, each answered by a worker A does not hold.
        let body = pattern(100 << 10, 99);
        fs::write(mnt_b.join("b.bin"), &body).expect("write in scope B");
        assert_eq!(fs::metadata(mnt_b.join("b.bin")).expect("stat in scope B").len(), body.len() as u64);
        assert_eq!(fs::read(mnt_b.join("b.bin")).expect("read in scope B"), body);
        assert_eq!(fs::read_dir(&mnt_b).expect("list scope B").count(), 1);
        assert_eq!(
            fsyncs_returned.load(Ordering::SeqCst),
            0,
            "scope B's requests were answered only after scope A's fsyncs gave up: A held every worker"
        );
        store.set_stall(None);
    });
}

/// Issue 22 item 1: fsyncs wait for their uploads off the FUSE workers (the reply goes out when
/// the upload is done). Scope A's eight fsyncs (its share of the workers) wait on an object store
/// that does not answer; A's own stat, read, write and listing are answered meanwhile. Before, each
/// waiting fsync held one of A's workers, and A's every other request waited until the store gave
/// up (the assertion on their order fails).
#[test]
fn a_scopes_own_requests_are_answered_while_its_fsyncs_wait_on_the_store() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (store, h, share) = over_a_store_to_stall();
    let (_a, mnt_a) = h.scope(big_quota());
    fs::write(mnt_a.join("kept"), b"written before the store stalled").expect("write in scope A");
    let waiting_in_a = kernel_waiting(&mnt_a);
    store.set_stall(Some(Duration::from_secs(600)));
    let fsyncs_returned = AtomicUsize::new(0);
    let written = std::sync::Barrier::new(share);
    std::thread::scope(|s| {
        fsync_writers(s, &mnt_a, share, &fsyncs_returned, &written);
        wait_until("scope A's fsyncs to wait", || waiting_in_a() >= share as u64);
        assert_eq!(fs::read(mnt_a.join("kept")).expect("read in scope A"), b"written before the store stalled");
        fs::write(mnt_a.join("new"), b"while fsyncs wait").expect("write in scope A");
        assert_eq!(fs::metadata(mnt_a.join("new")).expect("stat in scope A").len(), 17);
        assert_eq!(fs::read_dir(&mnt_a).expect("list scope A").count(), share + 2);
        assert_eq!(
            fsyncs_returned.load(Ordering::SeqCst),
            0,
            "scope A's requests were answered only after its fsyncs gave up: the fsyncs held its workers"
        );
        store.set_stall(None);
    });
}

/// Starts `n` threads in `s`, each creating `f<i>` in `mnt` and writing 64 KiB into it, then (once
/// all have written) fsyncing it; `returned` counts the fsyncs that have returned.
fn fsync_writers<'scope, 'env>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    mnt: &'env std::path::Path,
    n: usize,
    returned: &'env AtomicUsize,
    written: &'env std::sync::Barrier,
) {
    for i in 0..n as u64 {
        s.spawn(move || {
            let mut f = fs::File::create(mnt.join(format!("f{i}"))).expect("create in scope A");
            f.write_all(&pattern(64 << 10, i)).expect("write in scope A");
            written.wait();
            // Fails once the store request gives up (the store never answers): not the point.
            let _ = f.sync_all();
            returned.fetch_add(1, Ordering::SeqCst);
        });
    }
}

/// Mounts with the default options over a memory store the test stalls, whose requests give up
/// after 5 s, once (fsyncs waiting on it end with EIO soon after the test); and a mount's share of
/// the workers.
fn over_a_store_to_stall() -> (Arc<scopefs::store::MemoryStore>, Harness, usize) {
    let store = Arc::new(scopefs::store::MemoryStore::new());
    let settings =
        StorageSettings { store_timeout: Duration::from_secs(5), store_attempts: 1, ..StorageSettings::default() };
    let opts = MountOptions::default();
    let share = opts.max_workers_per_mount;
    assert!(share < opts.threads, "the default share leaves workers to the other mounts");
    let h = Harness::with_store(settings, opts, Some(store.clone()));
    (store, h, share)
}

/// Requests the kernel holds for the FUSE connection mounted at `mnt`, queued or being served
/// (`/sys/fs/fuse/connections/<id>/waiting`), read anew at each call.
fn kernel_waiting(mnt: &std::path::Path) -> impl Fn() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(mnt).expect("stat of the mount").dev();
    let id = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
    let path = PathBuf::from(format!("/sys/fs/fuse/connections/{id}/waiting"));
    move || fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}
