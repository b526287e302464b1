//! POSIX behaviour of scopes through real FUSE mounts: isolation, I/O, rename, symlink and name rules, quotas, read-only.

#[path = "support/fuse_harness.rs"]
pub mod harness;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use harness::*;
use scopefs::engine::{Quota, StorageSettings};
use scopefs_fs::MountOptions;

fn harness() -> Harness {
    Harness::new(small_block_settings(), MountOptions::default())
}

fn read(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[test]
fn scopes_mounted_side_by_side_are_isolated() {
    let h = harness();
    let (_a, ma) = h.scope(big_quota());
    let (_b, mb) = h.scope(big_quota());
    assert_ne!(ma, mb);
    fs::write(ma.join("only-in-a"), b"secret of a").unwrap();
    assert_eq!(errno_of(fs::metadata(mb.join("only-in-a")), "stat in B"), libc::ENOENT);
    fs::write(ma.join("same"), b"content A").unwrap();
    fs::write(mb.join("same"), b"content B, longer").unwrap();
    assert_eq!(read(&ma.join("same")), b"content A");
    assert_eq!(read(&mb.join("same")), b"content B, longer");
    let names = |m: &Path| {
        let mut v: Vec<String> =
            fs::read_dir(m).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&ma), vec!["only-in-a", "same"]);
    assert_eq!(names(&mb), vec!["same"]);
}

#[test]
fn writes_at_offsets_leave_zero_filled_holes() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    let p = m.join("f");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    f.write_all_at(b"hello world", 0).unwrap();
    f.write_all_at(b"XYZ", 3).unwrap();
    f.write_all_at(b"end", 100).unwrap();
    drop(f);
    let mut expect = b"helXYZworld".to_vec();
    expect.resize(100, 0);
    expect.extend_from_slice(b"end");
    assert_eq!(read(&p), expect);
    assert_eq!(fs::metadata(&p).unwrap().len(), 103);

    // A hole spanning several blocks reads as zeros too.
    let big = 3 * 64 * 1024 + 17;
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"tail", big).unwrap();
    drop(f);
    let got = read(&p);
    assert_eq!(got.len() as u64, big + 4);
    assert_eq!(&got[..103], &expect[..]);
    assert!(got[103..big as usize].iter().all(|&b| b == 0));
    assert_eq!(&got[big as usize..], b"tail");
}

#[test]
fn append_writes_go_to_the_end() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    let p = m.join("log");
    fs::write(&p, b"start;").unwrap();
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    a.write_all(b"one;").unwrap();
    // Another writer extends the file; O_APPEND must still land at the new end.
    let other = OpenOptions::new().write(true).open(&p).unwrap();
    other.write_all_at(b"two;", 10).unwrap();
    drop(other);
    a.write_all(b"three;").unwrap();
    drop(a);
    assert_eq!(read(&p), b"start;one;two;three;");
}

#[test]
fn truncate_shrinks_and_grows() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    let p = m.join("t");
    let data = pattern(200_000, 7);
    fs::write(&p, &data).unwrap();
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(70_000).unwrap();
    drop(f);
    assert_eq!(read(&p), &data[..70_000]);
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(150_000).unwrap();
    drop(f);
    let got = read(&p);
    assert_eq!(got.len(), 150_000);
    assert_eq!(&got[..70_000], &data[..70_000]);
    assert!(got[70_000..].iter().all(|&b| b == 0), "grown part must be zeros");
    // O_TRUNC on open empties the file.
    drop(OpenOptions::new().write(true).truncate(true).open(&p).unwrap());
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
}

#[test]
fn rename_files_and_directories() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    fs::write(m.join("a"), b"AAA").unwrap();
    fs::write(m.join("b"), b"B").unwrap();
    fs::rename(m.join("a"), m.join("b")).unwrap();
    assert_eq!(read(&m.join("b")), b"AAA");
    assert_eq!(errno_of(fs::metadata(m.join("a")), "old name"), libc::ENOENT);

    fs::create_dir(m.join("d1")).unwrap();
    fs::write(m.join("d1/inner"), b"in").unwrap();
    fs::create_dir(m.join("other")).unwrap();
    fs::rename(m.join("d1"), m.join("other/d2")).unwrap();
    assert_eq!(read(&m.join("other/d2/inner")), b"in");
    assert_eq!(errno_of(fs::metadata(m.join("d1")), "old dir"), libc::ENOENT);

    // RENAME_NOREPLACE refuses an existing target.
    fs::write(m.join("x"), b"x").unwrap();
    fs::write(m.join("y"), b"yy").unwrap();
    assert_eq!(errno_of(renameat2(&m.join("x"), &m.join("y"), libc::RENAME_NOREPLACE), "noreplace"), libc::EEXIST);
    renameat2(&m.join("x"), &m.join("z"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(read(&m.join("z")), b"x");

    // RENAME_EXCHANGE swaps two names atomically.
    renameat2(&m.join("z"), &m.join("y"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(read(&m.join("z")), b"yy");
    assert_eq!(read(&m.join("y")), b"x");
}

#[test]
fn unlinked_open_file_stays_readable_until_closed() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    let p = m.join("doomed");
    let data = pattern(300_000, 3);
    fs::write(&p, &data).unwrap();
    let mut f = File::open(&p).unwrap();
    fs::remove_file(&p).unwrap();
    assert_eq!(errno_of(fs::metadata(&p), "stat unlinked"), libc::ENOENT);
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert_eq!(got, data);
    f.seek(SeekFrom::Start(1000)).unwrap();
    let mut buf = [0u8; 16];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, &data[1000..1016]);
    drop(f);
    // The name can be reused for a new file.
    fs::write(&p, b"new").unwrap();
    assert_eq!(read(&p), b"new");
}

#[test]
fn rmdir_of_non_empty_directory_fails() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    fs::create_dir(m.join("d")).unwrap();
    fs::write(m.join("d/f"), b"x").unwrap();
    assert_eq!(errno_of(fs::remove_dir(m.join("d")), "rmdir"), libc::ENOTEMPTY);
    fs::remove_file(m.join("d/f")).unwrap();
    fs::remove_dir(m.join("d")).unwrap();
    assert!(!m.join("d").exists());
}

/// Any target POSIX allows is accepted (the review's M5: lexical confinement did not confine);
/// the host view of the mount never follows a link, the real mount (what containers bind) does.
#[test]
fn every_symlink_target_is_allowed_and_the_host_view_never_follows_one() {
    let h = harness();
    let (e, m) = h.scope(big_quota());
    let view = h.mounts.mountpoint(e.scope_id());
    assert_ne!(view, m, "the host view is not the real mount");
    fs::create_dir(m.join("d")).unwrap();
    fs::write(m.join("d/target"), b"through the link").unwrap();
    let links = [
        ("target", "d/rel"),
        ("../d/target", "d/up-and-back"),
        ("/etc/hostname", "d/abs"),
        ("../../x", "d/escape"),
        ("../x", "escape-from-root"),
        (".", "s"),
        ("s/s/s/s/../../../../etc/hostname", "chain"),
    ];
    for (target, link) in links {
        std::os::unix::fs::symlink(target, m.join(link)).unwrap_or_else(|e| panic!("symlink -> {target}: {e}"));
        assert_eq!(fs::read_link(m.join(link)).unwrap(), Path::new(target));
        assert_eq!(fs::read_link(view.join(link)).unwrap(), Path::new(target), "readlink through the view");
    }
    // Through the real mount links resolve as POSIX says.
    assert_eq!(read(&m.join("d/rel")), b"through the link");
    assert_eq!(read(&m.join("d/up-and-back")), b"through the link");
    assert_eq!(read(&m.join("d/abs")), read(Path::new("/etc/hostname")));
    // Through the host view no link is followed, as last or as middle component.
    assert_eq!(read(&view.join("d/target")), b"through the link");
    for path in ["d/rel", "d/abs", "chain", "s/d/target", "s/s/s"] {
        assert_eq!(errno_of(fs::read(view.join(path)), &format!("read {path} through the view")), libc::ELOOP);
    }
    assert_eq!(errno_of(fs::read_dir(view.join("s")), "list s/ through the view"), libc::ELOOP);
}

#[test]
fn name_rules_are_enforced() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    for bad in ["a\nb", "tab\there", "bell\u{7}", "del\u{7f}"] {
        assert_eq!(errno_of(File::create(m.join(bad)), "create control name"), libc::EINVAL, "{bad:?}");
        assert_eq!(errno_of(fs::create_dir(m.join(bad)), "mkdir control name"), libc::EINVAL, "{bad:?}");
    }
    let long255 = "n".repeat(255);
    let long256 = "n".repeat(256);
    fs::write(m.join(&long255), b"ok").unwrap();
    assert_eq!(read(&m.join(&long255)), b"ok");
    assert_eq!(errno_of(File::create(m.join(&long256)), "256-byte name"), libc::ENAMETOOLONG);
    for reserved in [".control", ".secrets", "__evosci_internal__"] {
        assert_eq!(errno_of(fs::create_dir(m.join(reserved)), reserved), libc::EINVAL);
        assert_eq!(errno_of(File::create(m.join(reserved)), reserved), libc::EINVAL);
    }
    // Reserved names are only reserved at the top level.
    fs::create_dir(m.join("sub")).unwrap();
    fs::create_dir(m.join("sub/.control")).unwrap();
}

#[test]
fn device_nodes_are_inert_hard_links_share_a_file_and_fifos_work() {
    let h = harness();
    let (_e, m) = h.scope(big_quota());
    // A fifo is no device: it exists in the scope and the kernel serves its pipe.
    mknod(&m.join("fifo"), libc::S_IFIFO | 0o644, 0).unwrap();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(fs::symlink_metadata(m.join("fifo")).unwrap().file_type().is_fifo());
    let fifo = m.join("fifo");
    let reader = std::thread::spawn(move || fs::read(fifo).unwrap());
    fs::write(m.join("fifo"), b"through the pipe").unwrap();
    assert_eq!(reader.join().unwrap(), b"through the pipe");
    // Device nodes exist with their numbers, but the mount is nodev: they open as nothing.
    mknod(&m.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    mknod(&m.join("blk"), libc::S_IFBLK | 0o660, libc::makedev(7, 0)).unwrap();
    let null = fs::symlink_metadata(m.join("null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(null.rdev(), libc::makedev(1, 3));
    assert!(fs::symlink_metadata(m.join("blk")).unwrap().file_type().is_block_device());
    assert_eq!(errno_of(File::open(m.join("null")), "open chr"), libc::EACCES);
    // mknod of a regular file works.
    mknod(&m.join("plain"), libc::S_IFREG | 0o640, 0).unwrap();
    let md = fs::metadata(m.join("plain")).unwrap();
    assert!(md.is_file());
    assert_eq!(md.len(), 0);

    // A hard link is a second name of the same file.
    fs::write(m.join("orig"), b"o").unwrap();
    fs::hard_link(m.join("orig"), m.join("link")).unwrap();
    let (orig, link) = (fs::metadata(m.join("orig")).unwrap(), fs::metadata(m.join("link")).unwrap());
    assert_eq!((orig.ino(), orig.nlink()), (link.ino(), 2));
    fs::write(m.join("link"), b"changed").unwrap();
    assert_eq!(fs::read(m.join("orig")).unwrap(), b"changed");
    fs::remove_file(m.join("orig")).unwrap();
    assert_eq!(fs::metadata(m.join("link")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.join("link")).unwrap(), b"changed");
    // Directories cannot be hard-linked.
    fs::create_dir(m.join("d")).unwrap();
    assert_eq!(errno_of(fs::hard_link(m.join("d"), m.join("d2")), "link dir"), libc::EPERM);
}

#[test]
fn multi_block_files_survive_a_cold_remount() {
    let mut h = harness();
    let (e, m) = h.scope(big_quota());
    let len = 4 * 1024 * 1024 + 3 * 64 * 1024 + 12_345;
    let data = pattern(len, 99);
    let mut f = File::create(m.join("big")).unwrap();
    // Uneven chunk sizes so writes straddle block boundaries.
    let mut off = 0;
    let mut step = 1;
    while off < len {
        let n = (7919 * step % 200_000 + 1).min(len - off);
        f.write_all(&data[off..off + n]).unwrap();
        off += n;
        step += 1;
    }
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(read(&m.join("big")), data);
    let (_e2, m2) = h.remount_cold(e);
    assert_eq!(m2, m);
    let got = read(&m2.join("big"));
    assert_eq!(got.len(), data.len());
    assert!(got == data, "content differs after remount");
    // Random reads across block boundaries.
    let f = File::open(m2.join("big")).unwrap();
    for (i, at) in [0usize, 65_535, 65_536, 1_000_000, len - 10].iter().enumerate() {
        let mut buf = vec![0u8; 10 + i * 70_000];
        let n = f.read_at(&mut buf, *at as u64).unwrap();
        assert_eq!(&buf[..n], &data[*at..(*at + n).min(len)]);
        assert!(n > 0);
    }
}

#[test]
fn byte_quota_is_enforced_on_write() {
    let h = harness();
    let quota = Quota { bytes: 1024 * 1024, inodes: 100 };
    let (e, m) = h.scope(quota);
    let mut f = File::create(m.join("fill")).unwrap();
    let chunk = vec![0xabu8; 64 * 1024];
    let mut written: u64 = 0;
    let err = loop {
        match f.write(&chunk) {
            Ok(n) => {
                written += n as u64;
                assert!(written <= quota.bytes, "wrote past the quota: {written}");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "write error: {err}");
    drop(f);
    assert!(written >= quota.bytes - chunk.len() as u64, "written {written}");
    let size = fs::metadata(m.join("fill")).unwrap().len();
    assert_eq!(size, written);
    assert_eq!(e.usage().unwrap().bytes, written);
    // A second file cannot grow past the quota either.
    let mut g = File::create(m.join("more")).unwrap();
    assert_eq!(errno_of(g.write_all(&chunk), "write over quota"), libc::EDQUOT);
}

#[test]
fn inode_quota_is_enforced_on_create() {
    let h = harness();
    let quota = Quota { bytes: 1 << 30, inodes: 10 };
    let (e, m) = h.scope(quota);
    fs::create_dir(m.join("d")).unwrap();
    let mut created = 1;
    let err = loop {
        match File::create(m.join(format!("d/f{created}"))) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created <= 10, "created past the inode quota");
    };
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "create error: {err}");
    assert_eq!(created, 10);
    assert_eq!(e.usage().unwrap().inodes, 10);
    assert_eq!(errno_of(fs::create_dir(m.join("d2")), "mkdir over quota"), libc::EDQUOT);
    assert_eq!(errno_of(std::os::unix::fs::symlink("d", m.join("s")), "symlink over quota"), libc::EDQUOT);
    // Deleting frees an inode: once its last handle is released. The kernel sends `release` after
    // `close` returns, in the background, so it may still be on its way when the unlink arrives;
    // until it is, the unlinked file is open and counts.
    fs::remove_file(m.join("d/f1")).unwrap();
    wait_until("the unlinked file's inode to be freed", || e.usage().unwrap().inodes <= 9);
    File::create(m.join("again")).unwrap();
}

#[test]
fn statfs_reports_quota_and_exact_usage() {
    let h = harness();
    let quota = Quota { bytes: 64 * 1024 * 1024, inodes: 1000 };
    let (e, m) = h.scope(quota);
    let st = statvfs(&m);
    let frsize = st.f_frsize;
    assert!(frsize > 0);
    let total = st.f_blocks * frsize;
    assert!(total <= quota.bytes && quota.bytes - total < frsize, "total {total} vs quota {}", quota.bytes);
    assert_eq!(st.f_files, quota.inodes);
    assert_eq!(st.f_ffree, quota.inodes);

    fs::write(m.join("a"), pattern(1_000_000, 1)).unwrap();
    fs::write(m.join("b"), pattern(300_000, 2)).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    let u = e.usage().unwrap();
    assert_eq!((u.bytes, u.inodes), (1_300_000, 3));
    // Overwrite with less data, delete one.
    fs::write(m.join("a"), pattern(10, 3)).unwrap();
    fs::remove_file(m.join("b")).unwrap();
    let u = e.usage().unwrap();
    assert_eq!((u.bytes, u.inodes, u.files), (10, 2, 1));
    let st = statvfs(&m);
    let free = st.f_bfree * st.f_frsize;
    let used = quota.bytes - free;
    assert!(used >= 10 && used <= st.f_frsize, "statvfs used {used} for 10 bytes of data");
    assert_eq!(st.f_ffree, quota.inodes - 2);
}

#[test]
fn read_only_scope_answers_erofs() {
    let h = harness();
    let (e, m) = h.scope(big_quota());
    fs::write(m.join("f"), b"before").unwrap();
    fs::create_dir(m.join("d")).unwrap();
    let open_fd = OpenOptions::new().write(true).open(m.join("f")).unwrap();
    e.set_read_only(true);
    assert_eq!(errno_of(open_fd.write_at(b"x", 0), "write on open fd"), libc::EROFS);
    drop(open_fd);
    assert_eq!(errno_of(OpenOptions::new().write(true).open(m.join("f")), "open for write"), libc::EROFS);
    assert_eq!(errno_of(File::create(m.join("new")), "create"), libc::EROFS);
    assert_eq!(errno_of(fs::create_dir(m.join("nd")), "mkdir"), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(m.join("f")), "unlink"), libc::EROFS);
    assert_eq!(errno_of(fs::remove_dir(m.join("d")), "rmdir"), libc::EROFS);
    assert_eq!(errno_of(fs::rename(m.join("f"), m.join("g")), "rename"), libc::EROFS);
    // Reads still work.
    assert_eq!(read(&m.join("f")), b"before");
    e.set_read_only(false);
    fs::write(m.join("f"), b"after").unwrap();
    assert_eq!(read(&m.join("f")), b"after");
}

#[test]
fn settings_with_default_blocks_also_work() {
    // Production block size (4 MiB) with a file spanning two blocks.
    let h = Harness::new(StorageSettings::default(), MountOptions::default());
    let (_e, m) = h.scope(big_quota());
    let data = pattern(4 * 1024 * 1024 + 5, 11);
    fs::write(m.join("two-blocks"), &data).unwrap();
    assert!(read(&m.join("two-blocks")) == data);
}

/// Set by `stale_mount_of_a_killed_daemon_is_detached` for the child it kills.
const HOLD_ENV: &str = "SCOPEFS_TEST_HOLD_MOUNT_DIR";

/// Child half of the stale-mount test: mounts a scope under `$HOLD_ENV/mnt`, writes a
/// durable file, reports the mountpoint, then waits to be killed with SIGKILL.
#[test]
#[ignore = "spawned by stale_mount_of_a_killed_daemon_is_detached"]
fn child_hold_mount_until_killed() {
    let dir = std::path::PathBuf::from(std::env::var_os(HOLD_ENV).expect("spawned by the parent"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store: std::sync::Arc<dyn scopefs::store::ObjectStore> =
        std::sync::Arc::new(scopefs::store::LocalDirStore::new(dir.join("store")).unwrap());
    let storage =
        scopefs::engine::Storage::new(store, small_block_settings(), &dir.join("data"), rt.handle().clone()).unwrap();
    let engine = storage.open_scope(&scopefs::ids::ScopeId::generate(), big_quota()).unwrap();
    let mounts = scopefs_fs::MountManager::new(&dir.join("mnt"), MountOptions::default()).unwrap();
    let mnt = mounts.mount(engine.clone()).unwrap();
    let mut f = File::create(mnt.join("survivor")).unwrap();
    f.write_all(b"written before the kill").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let report = format!("{}\n{}", engine.scope_id(), mnt.display());
    fs::write(dir.join("ready.tmp"), report).unwrap();
    fs::rename(dir.join("ready.tmp"), dir.join("ready")).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(600));
}

#[test]
fn stale_mount_of_a_killed_daemon_is_detached() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_hold_mount_until_killed", "--test-threads=1"])
        .env(HOLD_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready = dir.path().join("ready");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("child exited before mounting: {status}");
        }
        assert!(std::time::Instant::now() < deadline, "child never mounted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let report = fs::read_to_string(&ready).unwrap();
    let (scope, mnt) = report.split_once('\n').unwrap();
    let mnt = std::path::PathBuf::from(mnt);
    assert_eq!(read(&mnt.join("survivor")), b"written before the kill");
    // The mount carries the options of SPEC §6.
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = table.lines().find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap())).expect("mount in the table");
    let (before, after) = line.split_once(" - ").unwrap();
    assert!(before.contains("nosuid") && before.contains("nodev"), "{line}");
    assert!(after.starts_with(&format!("fuse.scopefs scopefs:{scope} ")), "{line}");
    assert!(after.contains("default_permissions") && after.contains("allow_other"), "{line}");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(errno_of(fs::metadata(mnt.join("survivor")), "stat after kill"), libc::ENOTCONN);

    // A new manager over the same root detaches the dead mount...
    let mounts = scopefs_fs::MountManager::new(&dir.path().join("mnt"), MountOptions::default()).unwrap();
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(mnt.to_str().unwrap()), "stale mount still in the mount table");
    assert!(fs::metadata(&mnt).unwrap().is_dir());
    // ...and the scope mounts again with its durable data.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store: std::sync::Arc<dyn scopefs::store::ObjectStore> =
        std::sync::Arc::new(scopefs::store::LocalDirStore::new(dir.path().join("store")).unwrap());
    let storage =
        scopefs::engine::Storage::new(store, small_block_settings(), &dir.path().join("data"), rt.handle().clone())
            .unwrap();
    let engine = storage.open_scope(&scopefs::ids::ScopeId::parse(scope).unwrap(), big_quota()).unwrap();
    let again = mounts.mount(engine).unwrap();
    assert_eq!(again, mnt);
    assert_eq!(read(&again.join("survivor")), b"written before the kill");
    drop(mounts);
}

#[test]
fn busy_unmount_detaches_and_the_scope_mounts_again() {
    let h = harness();
    let (e, m) = h.scope(big_quota());
    fs::write(m.join("kept"), b"open during unmount").unwrap();
    let mut busy = File::open(m.join("kept")).unwrap();
    let scope = e.scope_id().clone();
    h.mounts.unmount(&scope).expect("busy unmount detaches lazily");
    assert!(!h.mounts.is_mounted(&scope));
    // The open file still reads through the detached mount.
    let mut got = Vec::new();
    busy.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"open during unmount");
    drop(busy);
    // Mounting again is idempotent and serves the same data.
    let again = h.mounts.mount(e.clone()).unwrap();
    assert_eq!(h.mounts.mount(e).unwrap(), again);
    assert!(h.mounts.is_mounted(&scope));
    assert_eq!(read(&again.join("kept")), b"open during unmount");
}

#[test]
fn changes_made_beside_the_mount_show_after_invalidation() {
    use scopefs::engine::{OpenFlags, RenameMode, ROOT_INO};
    let h = harness(); // production TTL: the kernel caches entries and attributes for 60 s
    let (e, m) = h.scope(big_quota());
    let scope = e.scope_id().clone();
    fs::write(m.join("x"), b"old").unwrap();
    assert_eq!(read(&m.join("x")), b"old");
    // Now the kernel caches the attributes.
    assert_eq!(fs::metadata(m.join("x")).unwrap().len(), 3);
    // Change the file through the engine, as the HTTP API does.
    let ino = e.lookup(ROOT_INO, b"x").unwrap().ino;
    let opened = e.open(ino, OpenFlags { write: true, truncate: true, exclusive: false }).unwrap();
    e.write(ino, opened.fh, 0, b"newer content").unwrap();
    e.flush(ino, opened.fh).unwrap();
    e.release(ino, opened.fh).unwrap();
    h.mounts.invalidate_inode(&scope, ino);
    assert_eq!(fs::metadata(m.join("x")).unwrap().len(), 13);
    assert_eq!(read(&m.join("x")), b"newer content");
    // Rename it beside the mount; the old name disappears once invalidated.
    e.rename(ROOT_INO, b"x", ROOT_INO, b"z", RenameMode::Replace).unwrap();
    h.mounts.invalidate_entry(&scope, ROOT_INO, b"x");
    assert_eq!(errno_of(fs::metadata(m.join("x")), "stat renamed"), libc::ENOENT);
    assert_eq!(read(&m.join("z")), b"newer content");
}

/// Issue 21: a full data disk answers `ENOSPC` (not `EIO`), and every file closed before it reads
/// back intact: the data directory and the local object directory on a 24 MiB tmpfs, files of
/// 1 MiB written and fsynced until the disk is full.
#[test]
fn a_full_data_disk_answers_enospc_and_loses_nothing_closed() {
    use std::sync::Arc;
    let disk = tempfile::tempdir().unwrap();
    let tmpfs = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs"])
        .arg(disk.path())
        .status()
        .expect("mount(8)");
    assert!(tmpfs.success(), "mounting a tmpfs (needs root)");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(disk.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store: Arc<dyn scopefs::store::ObjectStore> =
        Arc::new(scopefs::store::LocalDirStore::new(disk.path().join("store")).unwrap());
    let settings = StorageSettings { block_size: 256 * 1024, ..StorageSettings::default() };
    let storage =
        scopefs::engine::Storage::new(store, settings, &disk.path().join("data"), rt.handle().clone()).unwrap();
    let mnt_root = tempfile::tempdir().unwrap();
    let mounts = scopefs_fs::MountManager::new(mnt_root.path(), MountOptions::default()).unwrap();
    let engine = storage.open_scope(&scopefs::ids::ScopeId::generate(), big_quota()).unwrap();
    let m = mounts.mount(engine.clone()).unwrap();
    let mut closed = Vec::new();
    let mut failure = None;
    for i in 0..64u64 {
        let data = pattern(1 << 20, i);
        let p = m.join(format!("f{i}"));
        let written = (|| -> std::io::Result<()> {
            let mut f = File::create(&p)?;
            f.write_all(&data)?;
            f.sync_all()?;
            drop(f);
            Ok(())
        })();
        match written {
            Ok(()) => closed.push((p, data)),
            Err(e) => {
                failure = Some(e.raw_os_error());
                break;
            }
        }
    }
    assert_eq!(failure, Some(Some(libc::ENOSPC)), "a full disk is ENOSPC ({} files fitted)", closed.len());
    assert!(closed.len() >= 4, "the disk held only {} files", closed.len());
    for (p, data) in &closed {
        assert!(read(p) == *data, "{} changed after the disk filled", p.display());
    }
    drop(m);
    mounts.unmount_all();
}
