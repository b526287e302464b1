//! Extended attributes, `fallocate` and `O_TMPFILE` through real FUSE mounts, as `setfattr`,
//! `getfattr`, `fallocate(1)` and `mkstemp`-style tools call them (libc calls, errno checked).

#[path = "support/fuse_harness.rs"]
pub mod harness;

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use harness::*;
use scopefs::engine::Quota;
use scopefs_fs::MountOptions;

fn harness() -> Harness {
    Harness::new(small_block_settings(), MountOptions::default())
}

fn cname(name: &str) -> CString {
    CString::new(name).expect("name without NUL")
}

fn check(rc: isize) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<usize> {
    let (p, n) = (cpath(p), cname(name));
    // SAFETY: valid NUL-terminated strings and a value slice that outlive the call.
    check(unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) } as isize)
}

fn lsetxattr(p: &Path, name: &str, value: &[u8]) -> io::Result<usize> {
    let (p, n) = (cpath(p), cname(name));
    // SAFETY: as `setxattr`.
    check(unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) } as isize)
}

/// `getxattr(2)` with a buffer of `size` bytes; with `size` 0 the answer is the value's length.
fn getxattr_sized(p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let (p, n) = (cpath(p), cname(name));
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has `size` writable bytes; the strings outlive the call.
    let got = check(unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) })?;
    buf.truncate(got.min(size));
    Ok((got, buf))
}

fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    getxattr_sized(p, name, 64 * 1024).map(|(_, v)| v)
}

fn lgetxattr(p: &Path, name: &str) -> io::Result<usize> {
    let (p, n) = (cpath(p), cname(name));
    let mut buf = [0u8; 64];
    // SAFETY: `buf` is writable for its length.
    check(unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

fn listxattr_sized(p: &Path, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let p = cpath(p);
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has `size` writable bytes.
    let got = check(unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), size) })?;
    buf.truncate(got.min(size));
    Ok((got, buf))
}

fn removexattr(p: &Path, name: &str) -> io::Result<usize> {
    let (p, n) = (cpath(p), cname(name));
    // SAFETY: valid NUL-terminated strings.
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } as isize)
}

fn fallocate(f: &fs::File, mode: i32, offset: u64, len: u64) -> io::Result<usize> {
    // SAFETY: a valid open descriptor.
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) } as isize)
}

fn ctime_ns(p: &Path) -> i128 {
    let m = fs::symlink_metadata(p).expect("stat");
    i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())
}

#[test]
fn user_xattrs_work_with_linux_flags_and_size_probing() {
    let h = harness();
    let (engine, m) = h.scope(big_quota());
    let f = m.join("f");
    fs::write(&f, b"contents").unwrap();
    let before = ctime_ns(&f);
    setxattr(&f, "user.mime_type", b"text/plain", 0).unwrap();
    assert!(ctime_ns(&f) > before, "setxattr updates ctime");
    assert_eq!(getxattr(&f, "user.mime_type").unwrap(), b"text/plain");
    setxattr(&f, "user.empty", b"", 0).unwrap();
    assert_eq!(getxattr(&f, "user.empty").unwrap(), b"");

    // Size probing (size 0 answers the length) and ERANGE for a short buffer.
    assert_eq!(getxattr_sized(&f, "user.mime_type", 0).unwrap().0, 10);
    assert_eq!(errno_of(getxattr_sized(&f, "user.mime_type", 4), "short getxattr"), libc::ERANGE);
    let (len, _) = listxattr_sized(&f, 0).unwrap();
    assert_eq!(len, b"user.empty\0user.mime_type\0".len());
    assert_eq!(errno_of(listxattr_sized(&f, 5), "short listxattr"), libc::ERANGE);
    assert_eq!(listxattr_sized(&f, 4096).unwrap().1, b"user.empty\0user.mime_type\0");

    // XATTR_CREATE / XATTR_REPLACE.
    assert_eq!(errno_of(setxattr(&f, "user.mime_type", b"x", libc::XATTR_CREATE), "create existing"), libc::EEXIST);
    assert_eq!(errno_of(setxattr(&f, "user.absent", b"x", libc::XATTR_REPLACE), "replace missing"), libc::ENODATA);
    setxattr(&f, "user.mime_type", b"text/markdown", libc::XATTR_REPLACE).unwrap();
    setxattr(&f, "user.new", b"1", libc::XATTR_CREATE).unwrap();
    assert_eq!(getxattr(&f, "user.mime_type").unwrap(), b"text/markdown");

    // removexattr, then ENODATA for the gone and the never-set.
    let before = ctime_ns(&f);
    removexattr(&f, "user.new").unwrap();
    assert!(ctime_ns(&f) > before, "removexattr updates ctime");
    assert_eq!(errno_of(getxattr(&f, "user.new"), "get removed"), libc::ENODATA);
    assert_eq!(errno_of(removexattr(&f, "user.new"), "remove removed"), libc::ENODATA);

    // Linux's bounds: a 256-byte name is ERANGE, a value over 64 KiB E2BIG.
    let long = format!("user.{}", "n".repeat(251));
    assert_eq!(errno_of(setxattr(&f, &long, b"v", 0), "long name"), libc::ERANGE);
    let longest = format!("user.{}", "n".repeat(250));
    setxattr(&f, &longest, b"v", 0).unwrap();
    assert_eq!(errno_of(setxattr(&f, "user.big", &vec![1u8; 65537], 0), "big value"), libc::E2BIG);
    setxattr(&f, "user.big", &vec![1u8; 65536], 0).unwrap();
    assert_eq!(getxattr(&f, "user.big").unwrap(), vec![1u8; 65536]);

    // Directories carry them; symlinks refuse user.* like Linux (EPERM) and have none.
    let d = m.join("d");
    fs::create_dir(&d).unwrap();
    setxattr(&d, "user.k", b"dir", 0).unwrap();
    assert_eq!(getxattr(&d, "user.k").unwrap(), b"dir");
    let l = m.join("l");
    std::os::unix::fs::symlink("f", &l).unwrap();
    assert_eq!(errno_of(lsetxattr(&l, "user.k", b"v"), "lsetxattr on a symlink"), libc::EPERM);
    assert_eq!(errno_of(lgetxattr(&l, "user.k"), "lgetxattr on a symlink"), libc::ENODATA);
    // Through the link, the target's.
    assert_eq!(getxattr(&l, "user.mime_type").unwrap(), b"text/markdown");

    // The attributes live in the scope's metadata (the engine sees them).
    let ino = fs::metadata(&f).unwrap().ino();
    assert_eq!(engine.getxattr(ino, b"user.mime_type").unwrap(), b"text/markdown");
}

#[test]
fn trusted_security_and_acl_names_are_refused_quietly() {
    let h = harness();
    let (_engine, m) = h.scope(big_quota());
    let f = m.join("f");
    fs::write(&f, b"x").unwrap();
    for name in ["trusted.overlay.opaque", "security.selinux", "security.capability"] {
        assert_eq!(errno_of(getxattr(&f, name), name), libc::ENODATA, "get {name}");
    }
    // (security.capability values are parsed by the kernel first: only these two reach the daemon.)
    for name in ["trusted.overlay.opaque", "security.selinux"] {
        assert_eq!(errno_of(setxattr(&f, name, b"v", 0), name), libc::EOPNOTSUPP, "set {name}");
    }
    // POSIX ACLs: none to read (getfacl, ls -l, cp -a stay quiet), none can be set.
    assert_eq!(errno_of(getxattr(&f, "system.posix_acl_access"), "get acl"), libc::ENODATA);
    assert_eq!(errno_of(getxattr(&m, "system.posix_acl_default"), "get default acl"), libc::ENODATA);
    // A valid ACL blob: version 2, user::rw-, group::r--, other::r--.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(0x01u16, 6u16), (0x04, 4), (0x20, 4)] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    assert_eq!(errno_of(setxattr(&f, "system.posix_acl_access", &acl, 0), "set acl"), libc::EOPNOTSUPP);
    assert_eq!(listxattr_sized(&f, 4096).unwrap().1, b"");
    // `cp -a`-style copying of the attributes finds nothing to fail on.
    assert_eq!(listxattr_sized(&f, 0).unwrap().0, 0);
}

#[test]
fn xattrs_count_against_the_byte_quota_and_leave_with_the_file() {
    let h = harness();
    let (engine, m) = h.scope(Quota { bytes: 200, inodes: 100 });
    let f = m.join("f");
    fs::write(&f, [7u8; 100]).unwrap();
    assert_eq!(errno_of(setxattr(&f, "user.big", &[1u8; 150], 0), "over quota"), libc::EDQUOT);
    assert_eq!(errno_of(getxattr(&f, "user.big"), "refused attribute"), libc::ENODATA);
    setxattr(&f, "user.big", &[1u8; 92], 0).unwrap();
    assert_eq!(engine.usage().unwrap().bytes, 200);
    // The quota is full: one more attribute byte is refused.
    assert_eq!(errno_of(setxattr(&f, "user.x", b"", 0), "full quota"), libc::EDQUOT);
    fs::remove_file(&f).unwrap();
    assert_eq!(engine.usage().unwrap().bytes, 0);
    assert_eq!(engine.consistency_problems().unwrap(), Vec::<String>::new());
}

#[test]
fn fallocate_allocates_keeps_size_and_punches_holes() {
    const BLOCK: u64 = 64 * 1024;
    let mut h = harness();
    let (engine, m) = h.scope(Quota { bytes: 1 << 20, inodes: 100 });
    let p = m.join("f");
    let data = pattern(3 * BLOCK as usize + 100, 7);
    fs::write(&p, &data).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();

    // PUNCH_HOLE|KEEP_SIZE from inside block 0 to inside block 2: zeros, same size.
    let before = fs::metadata(&p).unwrap().mtime_nsec() + fs::metadata(&p).unwrap().mtime() * 1_000_000_000;
    fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 1000, 2 * BLOCK).unwrap();
    let mut expect = data.clone();
    expect[1000..1000 + 2 * BLOCK as usize].fill(0);
    assert_eq!(fs::read(&p).unwrap(), expect);
    assert_eq!(fs::metadata(&p).unwrap().len(), data.len() as u64);
    let after = fs::metadata(&p).unwrap();
    assert!(after.mtime() * 1_000_000_000 + after.mtime_nsec() > before, "punching a hole updates mtime");
    // PUNCH_HOLE without KEEP_SIZE and the modes a scope does not do: EOPNOTSUPP.
    assert_eq!(errno_of(fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 10), "punch alone"), libc::EOPNOTSUPP);
    assert_eq!(errno_of(fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, BLOCK), "collapse"), libc::EOPNOTSUPP);

    // KEEP_SIZE: no change.
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 8 * BLOCK).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), data.len() as u64);
    // Mode 0: the size grows, the new part reads as zeros, the quota is charged.
    fallocate(&f, 0, 4 * BLOCK, BLOCK).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 5 * BLOCK);
    expect.resize(5 * BLOCK as usize, 0);
    assert_eq!(fs::read(&p).unwrap(), expect);
    // Past the quota: EDQUOT, size unchanged; also for KEEP_SIZE.
    assert_eq!(errno_of(fallocate(&f, 0, 0, 2 << 20), "allocate over quota"), libc::EDQUOT);
    assert_eq!(errno_of(fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 2 << 20), "keep size over quota"), libc::EDQUOT);
    assert_eq!(fs::metadata(&p).unwrap().len(), 5 * BLOCK);
    // Writing into the allocated range works.
    f.write_all_at(b"end", 5 * BLOCK - 3).unwrap();
    drop(f);
    expect[5 * BLOCK as usize - 3..].copy_from_slice(b"end");
    assert_eq!(engine.usage().unwrap().bytes, 5 * BLOCK);

    // What was committed reads back the same from the object store.
    let (_engine, m) = h.remount_cold(engine);
    assert_eq!(fs::read(m.join("f")).unwrap(), expect);
}

#[test]
fn o_tmpfile_makes_an_unnamed_file_that_linkat_names() {
    let h = harness();
    let (engine, m) = h.scope(big_quota());
    let dir = cpath(&m);
    let open_tmp = || {
        // SAFETY: a valid NUL-terminated path.
        let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
        assert!(fd >= 0, "O_TMPFILE: {}", io::Error::last_os_error());
        // SAFETY: `fd` was just returned by open and is owned here.
        unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) }
    };
    let inodes = engine.usage().unwrap().inodes;
    // Unnamed while open: nothing in the listing, its link count is 0, it counts as an inode.
    let tmp = open_tmp();
    tmp.write_all_at(b"made in the dark", 0).unwrap();
    assert_eq!(tmp.metadata().unwrap().nlink(), 0);
    assert_eq!(fs::read_dir(&m).unwrap().count(), 0);
    assert_eq!(engine.usage().unwrap().inodes, inodes + 1);
    // linkat(AT_EMPTY_PATH) gives it a name (what `open(O_TMPFILE)` + `linkat` users do).
    let name = cpath(&m.join("named"));
    let empty = cname("");
    // SAFETY: valid descriptor and NUL-terminated paths.
    let rc =
        unsafe { libc::linkat(tmp.as_raw_fd(), empty.as_ptr(), libc::AT_FDCWD, name.as_ptr(), libc::AT_EMPTY_PATH) };
    assert_eq!(rc, 0, "linkat: {}", io::Error::last_os_error());
    drop(tmp);
    assert_eq!(fs::read(m.join("named")).unwrap(), b"made in the dark");
    assert_eq!(fs::metadata(m.join("named")).unwrap().nlink(), 1);
    // One never named is gone with its last close.
    let gone = open_tmp();
    gone.write_all_at(b"scratch", 0).unwrap();
    drop(gone);
    // The kernel sends RELEASE after close(2) returns.
    wait_until("the unnamed file's release", || engine.usage().unwrap().inodes == inodes + 1);
    assert!(engine.consistency_problems().unwrap().is_empty());
}

/// Runs `f` on a thread whose filesystem user and group are `nobody` (65534): Linux takes
/// `CAP_FSETID` and the other file capabilities off a thread whose filesystem uid leaves 0.
fn as_nobody<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: plain system calls on the calling thread's credentials only.
            unsafe {
                libc::setfsgid(65534);
                libc::setfsuid(65534);
            }
            f()
        })
        .join()
        .expect("the unprivileged thread panicked")
    })
}

#[test]
fn writes_truncates_and_chowns_clear_set_id_bits_as_linux_does() {
    use std::os::unix::fs::PermissionsExt;
    let h = harness();
    let (engine, m) = h.scope(big_quota());
    let file = |name: &str, mode: u32| {
        let p = m.join(name);
        fs::write(&p, b"x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    };
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    // A write by a caller without CAP_FSETID: both bits go (the file is group-executable).
    let w = file("w", 0o6777);
    let f = OpenOptions::new().append(true).open(&w).unwrap();
    as_nobody(|| (&f).write_all(b"more")).unwrap();
    assert_eq!(mode(&w), 0o0777);
    // Set again while the file is open: the next unprivileged write clears them again.
    fs::set_permissions(&w, fs::Permissions::from_mode(0o4777)).unwrap();
    as_nobody(|| (&f).write_all(b"!")).unwrap();
    drop(f);
    assert_eq!(mode(&w), 0o0777);
    assert_eq!(fs::read(&w).unwrap(), b"xmore!");
    // An unprivileged truncate clears them too.
    let t = file("t", 0o4777);
    let f = OpenOptions::new().write(true).open(&t).unwrap();
    as_nobody(|| f.set_len(0)).unwrap();
    drop(f);
    assert_eq!(mode(&t), 0o0777);
    // A caller with CAP_FSETID keeps them.
    let r = file("r", 0o6777);
    fs::write(&r, b"root").unwrap();
    assert_eq!(mode(&r), 0o6777);
    // A chown takes set-user-ID away, whoever makes it.
    let c = file("c", 0o4755);
    std::os::unix::fs::chown(&c, Some(65534), None).unwrap();
    assert_eq!(mode(&c), 0o0755);
    assert!(engine.consistency_problems().unwrap().is_empty());
}

#[test]
fn the_kernel_asks_for_file_capabilities_once_per_file_not_before_every_write() {
    let h = harness();
    let (engine, m) = h.scope(big_quota());
    let mut f = fs::File::create(m.join("many-writes")).unwrap();
    let before = engine.privileged_attribute_reads();
    for _ in 0..20 {
        f.write_all(&[7; 4096]).unwrap();
    }
    drop(f);
    let asked = engine.privileged_attribute_reads() - before;
    assert!(asked <= 1, "security.capability was asked for {asked} times in 20 writes");
    assert_eq!(fs::metadata(m.join("many-writes")).unwrap().len(), 20 * 4096);
}
