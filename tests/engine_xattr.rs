//! Extended attributes and `fallocate` at the engine: `user.*` storage, flags, Linux's name and
//! value rules, refused namespaces, the byte quota and per-inode bounds, ctime; fallocate's modes,
//! holes and quota.

pub mod engine_support;

use std::time::Duration;

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;

fn file(e: &ScopeEngine, path: &str, data: &[u8]) -> Ino {
    write_file(e, path, data).unwrap();
    resolve(e, path).unwrap()
}

fn scope_with_quota(storage: &std::sync::Arc<Storage>, bytes: u64) -> std::sync::Arc<ScopeEngine> {
    storage.open_scope(&ScopeId::generate(), Quota { bytes, inodes: 1000 }).unwrap()
}

fn assert_consistent(e: &ScopeEngine) {
    assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new());
}

#[test]
fn user_xattrs_are_set_read_listed_and_removed_with_linux_flags() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let ino = file(&e, "f", b"data");
    e.setxattr(ino, b"user.b", b"two", XattrMode::Either).unwrap();
    e.setxattr(ino, b"user.a", b"\0binary\xff", XattrMode::Create).unwrap();
    e.setxattr(ino, b"user.empty", b"", XattrMode::Either).unwrap();
    assert_eq!(e.getxattr(ino, b"user.a").unwrap(), b"\0binary\xff");
    assert_eq!(e.getxattr(ino, b"user.empty").unwrap(), b"");
    assert_eq!(e.listxattr(ino).unwrap(), b"user.a\0user.b\0user.empty\0");

    // XATTR_CREATE on an existing name, XATTR_REPLACE on a missing one, both flags.
    assert!(matches!(e.setxattr(ino, b"user.a", b"x", XattrMode::Create), Err(EngineError::Exists)));
    assert!(matches!(e.setxattr(ino, b"user.zz", b"x", XattrMode::Replace), Err(EngineError::NoData)));
    assert!(matches!(e.setxattr(ino, b"user.a", b"x", XattrMode::CreateAndReplace), Err(EngineError::Exists)));
    assert!(matches!(e.setxattr(ino, b"user.zz", b"x", XattrMode::CreateAndReplace), Err(EngineError::NoData)));
    assert!(matches!(e.getxattr(ino, b"user.zz"), Err(EngineError::NoData)));
    e.setxattr(ino, b"user.b", b"replaced", XattrMode::Replace).unwrap();
    assert_eq!(e.getxattr(ino, b"user.b").unwrap(), b"replaced");

    e.removexattr(ino, b"user.a").unwrap();
    assert!(matches!(e.getxattr(ino, b"user.a"), Err(EngineError::NoData)));
    assert!(matches!(e.removexattr(ino, b"user.a"), Err(EngineError::NoData)));
    assert_eq!(e.listxattr(ino).unwrap(), b"user.b\0user.empty\0");

    // Directories carry them too; the contents of the file are untouched.
    let dir = e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap().ino;
    e.setxattr(dir, b"user.tag", b"dir", XattrMode::Either).unwrap();
    assert_eq!(e.getxattr(dir, b"user.tag").unwrap(), b"dir");
    assert_eq!(read_file(&e, "f").unwrap(), b"data");
    assert!(matches!(e.getxattr(9_999_999, b"user.a"), Err(EngineError::NotFound)));
    assert!(matches!(e.listxattr(9_999_999), Err(EngineError::NotFound)));
    assert_consistent(&e);
}

#[test]
fn names_and_values_follow_linux_bounds() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let ino = file(&e, "f", b"");
    let longest = [b"user.".as_slice(), &[b'n'; XATTR_NAME_MAX - 5]].concat();
    e.setxattr(ino, &longest, b"v", XattrMode::Either).unwrap();
    assert_eq!(e.getxattr(ino, &longest).unwrap(), b"v");
    let too_long = [longest.as_slice(), b"x"].concat();
    assert!(matches!(e.setxattr(ino, &too_long, b"v", XattrMode::Either), Err(EngineError::Range)));
    assert!(matches!(e.getxattr(ino, &too_long), Err(EngineError::Range)));
    assert!(matches!(e.setxattr(ino, b"", b"v", XattrMode::Either), Err(EngineError::Range)));
    assert!(matches!(e.setxattr(ino, b"user.", b"v", XattrMode::Either), Err(EngineError::Invalid(_))));

    e.setxattr(ino, b"user.big", &vec![7u8; XATTR_SIZE_MAX], XattrMode::Either).unwrap();
    assert_eq!(e.getxattr(ino, b"user.big").unwrap().len(), XATTR_SIZE_MAX);
    let r = e.setxattr(ino, b"user.bigger", &vec![7u8; XATTR_SIZE_MAX + 1], XattrMode::Either);
    assert!(matches!(r, Err(EngineError::ValueTooLarge)), "{r:?}");
    assert!(matches!(e.getxattr(ino, b"user.bigger"), Err(EngineError::NoData)));
}

#[test]
fn trusted_security_and_system_are_refused_cleanly() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let ino = file(&e, "f", b"x");
    for name in [
        b"trusted.overlay.opaque".as_slice(),
        b"security.selinux",
        b"security.capability",
        b"system.posix_acl_access",
        b"system.posix_acl_default",
    ] {
        let set = e.setxattr(ino, name, b"v", XattrMode::Either);
        assert!(matches!(set, Err(EngineError::Unsupported(_))), "set {name:?}: {set:?}");
        assert!(matches!(e.getxattr(ino, name), Err(EngineError::NoData)), "get {name:?}");
        assert!(matches!(e.removexattr(ino, name), Err(EngineError::NoData)), "remove {name:?}");
    }
    // A namespace Linux does not know at all.
    assert!(matches!(e.setxattr(ino, b"os2.x", b"v", XattrMode::Either), Err(EngineError::Unsupported(_))));
    assert!(matches!(e.getxattr(ino, b"os2.x"), Err(EngineError::Unsupported(_))));
    assert_eq!(e.listxattr(ino).unwrap(), b"");
    assert_eq!(e.usage().unwrap().bytes, 1);
}

#[test]
fn symlinks_and_special_files_take_no_user_attributes() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let link = e.symlink(ROOT_INO, b"l", b"target", OWNER).unwrap().ino;
    let fifo = e.mknod(ROOT_INO, b"p", FileKind::Fifo, 0o644, 0, OWNER).unwrap().ino;
    for ino in [link, fifo] {
        let r = e.setxattr(ino, b"user.a", b"v", XattrMode::Either);
        assert!(matches!(r, Err(EngineError::NotPermitted(_))), "{r:?}");
        assert!(matches!(e.removexattr(ino, b"user.a"), Err(EngineError::NotPermitted(_))));
        assert!(matches!(e.getxattr(ino, b"user.a"), Err(EngineError::NoData)));
        assert_eq!(e.listxattr(ino).unwrap(), b"");
    }
}

#[test]
fn attributes_are_charged_to_the_byte_quota_and_released_with_the_inode() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = scope_with_quota(&storage, 100);
    let ino = file(&e, "f", &[1u8; 40]);
    assert_eq!(e.usage().unwrap().bytes, 40);
    e.setxattr(ino, b"user.k", &[2u8; 20], XattrMode::Either).unwrap();
    assert_eq!(e.usage().unwrap().bytes, 40 + 6 + 20);
    // A replacement is charged the difference.
    e.setxattr(ino, b"user.k", &[2u8; 4], XattrMode::Either).unwrap();
    assert_eq!(e.usage().unwrap().bytes, 40 + 6 + 4);
    // 50 used; 6 + 45 more would be 101 > 100: refused before anything is written.
    let r = e.setxattr(ino, b"user.v", &[3u8; 45], XattrMode::Either);
    assert!(matches!(r, Err(EngineError::QuotaExceeded(_))), "{r:?}");
    assert!(matches!(e.getxattr(ino, b"user.v"), Err(EngineError::NoData)));
    assert_eq!(e.usage().unwrap().bytes, 50);
    // Exactly up to the quota is fine; a shrinking replacement always is.
    e.setxattr(ino, b"user.v", &[3u8; 44], XattrMode::Either).unwrap();
    assert_eq!(e.usage().unwrap().bytes, 100);
    e.setxattr(ino, b"user.v", b"", XattrMode::Either).unwrap();
    e.removexattr(ino, b"user.k").unwrap();
    assert_eq!(e.usage().unwrap().bytes, 46);
    assert_consistent(&e);
    // Deleting the file releases its attributes.
    e.setxattr(ino, b"user.k", &[2u8; 10], XattrMode::Either).unwrap();
    e.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(e.usage().unwrap().bytes, 0);
    assert_consistent(&e);
}

#[test]
fn attributes_of_a_file_unlinked_while_open_go_with_its_last_close() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let ino = file(&e, "f", b"abc");
    let opened = e.open(ino, OpenFlags::default()).unwrap();
    e.setxattr(ino, b"user.k", b"value", XattrMode::Either).unwrap();
    e.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(e.getxattr(ino, b"user.k").unwrap(), b"value");
    e.release(ino, opened.fh).unwrap();
    assert_eq!(e.usage().unwrap().bytes, 0);
    assert_consistent(&e);
}

#[test]
fn per_inode_bounds_refuse_more_attributes() {
    let h = Harness::new(StorageSettings {
        block_size: 64,
        max_xattrs_per_inode: 2,
        max_xattr_bytes_per_inode: 40,
        ..StorageSettings::default()
    });
    let e = new_scope(&h.storage());
    let ino = file(&e, "f", b"");
    e.setxattr(ino, b"user.a", b"1", XattrMode::Either).unwrap();
    e.setxattr(ino, b"user.b", b"2", XattrMode::Either).unwrap();
    assert!(matches!(e.setxattr(ino, b"user.c", b"3", XattrMode::Either), Err(EngineError::XattrsFull)));
    // Replacing one keeps the count; its bytes still count: 7 + 6 + 28 = 41 > 40.
    let r = e.setxattr(ino, b"user.a", &[0u8; 28], XattrMode::Either);
    assert!(matches!(r, Err(EngineError::XattrsFull)), "{r:?}");
    e.setxattr(ino, b"user.a", &[0u8; 27], XattrMode::Either).unwrap();
    // Another inode has its own room.
    let other = file(&e, "g", b"");
    e.setxattr(other, b"user.c", b"3", XattrMode::Either).unwrap();
    // The default bounds admit one attribute of the largest size.
    let l = scopefs::limits::LimitsConfig::default();
    assert!(l.validate().is_ok() && l.max_xattr_bytes_per_inode > XATTR_SIZE_MAX as u64 + XATTR_NAME_MAX as u64);
}

#[test]
fn set_and_remove_change_ctime_not_mtime_and_survive_a_restart() {
    let h = Harness::small_blocks();
    let id = ScopeId::generate();
    let ino;
    {
        let storage = h.storage();
        let e = storage.open_scope(&id, big_quota()).unwrap();
        ino = file(&e, "f", b"x");
        let before = e.getattr(ino).unwrap();
        e.setxattr(ino, b"user.k", b"v", XattrMode::Either).unwrap();
        let after_set = e.getattr(ino).unwrap();
        assert!(after_set.ctime > before.ctime, "setxattr updates ctime");
        assert_eq!(after_set.mtime, before.mtime, "setxattr leaves mtime");
        e.setxattr(ino, b"user.gone", b"v", XattrMode::Either).unwrap();
        let before_rm = e.getattr(ino).unwrap();
        e.removexattr(ino, b"user.gone").unwrap();
        assert!(e.getattr(ino).unwrap().ctime > before_rm.ctime, "removexattr updates ctime");
        assert!(e.wait_uploads(Duration::from_secs(10)));
    }
    let storage = h.storage();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    assert_eq!(e.getxattr(ino, b"user.k").unwrap(), b"v");
    assert_eq!(e.usage().unwrap().bytes, 1 + 6 + 1);
    assert_consistent(&e);
    e.set_read_only(true);
    assert!(matches!(e.setxattr(ino, b"user.k", b"w", XattrMode::Either), Err(EngineError::ReadOnly)));
    assert!(matches!(e.removexattr(ino, b"user.k"), Err(EngineError::ReadOnly)));
    assert_eq!(e.getxattr(ino, b"user.k").unwrap(), b"v");
}

// --- fallocate ---

/// Opens `path` for writing, runs `f`, closes (a commit).
fn with_handle(e: &ScopeEngine, path: &str, f: impl FnOnce(Ino, Fh) -> EngineResult<()>) -> EngineResult<()> {
    let ino = resolve(e, path)?;
    let opened = e.open(ino, OpenFlags { write: true, truncate: false, exclusive: false })?;
    let r = f(ino, opened.fh);
    e.release(ino, opened.fh)?;
    r
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 + 1).collect()
}

#[test]
fn allocate_grows_the_size_with_zeros_and_charges_the_quota() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = scope_with_quota(&storage, 1000);
    file(&e, "f", b"abc");
    let mtime = e.getattr(resolve(&e, "f").unwrap()).unwrap().mtime;
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 100, 200, AllocMode::Allocate { keep_size: false })).unwrap();
    let attr = e.getattr(resolve(&e, "f").unwrap()).unwrap();
    assert_eq!(attr.size, 300);
    assert!(attr.mtime > mtime, "a size change updates mtime");
    let mut expect = b"abc".to_vec();
    expect.resize(300, 0);
    assert_eq!(read_file(&e, "f").unwrap(), expect);
    assert_eq!(e.usage().unwrap().bytes, 300);
    // A range inside the file changes nothing.
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 0, 10, AllocMode::Allocate { keep_size: false })).unwrap();
    assert_eq!(e.getattr(attr.ino).unwrap().mtime, attr.mtime);
    assert_eq!(read_file(&e, "f").unwrap(), expect);

    // Beyond the quota: refused before anything changes.
    let r = with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 0, 1001, AllocMode::Allocate { keep_size: false }));
    assert!(matches!(r, Err(EngineError::QuotaExceeded(_))), "{r:?}");
    assert_eq!(e.getattr(attr.ino).unwrap().size, 300);
    // Past the largest file size, or an empty range.
    let r = with_handle(&e, "f", |ino, fh| {
        e.fallocate(ino, fh, u64::MAX - 5, 10, AllocMode::Allocate { keep_size: false })
    });
    assert!(matches!(r, Err(EngineError::TooLarge)), "{r:?}");
    let r = with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 0, 0, AllocMode::Allocate { keep_size: false }));
    assert!(matches!(r, Err(EngineError::Invalid(_))), "{r:?}");
    // Only a handle open for writing may allocate.
    let ro = e.open(attr.ino, OpenFlags::default()).unwrap();
    let r = e.fallocate(attr.ino, ro.fh, 0, 400, AllocMode::Allocate { keep_size: false });
    assert!(matches!(r, Err(EngineError::BadHandle)), "{r:?}");
    e.release(attr.ino, ro.fh).unwrap();
    assert_consistent(&e);
}

#[test]
fn keep_size_changes_nothing_but_checks_the_quota() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = scope_with_quota(&storage, 1000);
    let ino = file(&e, "f", &pattern(100));
    let before = e.getattr(ino).unwrap();
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 50, 900, AllocMode::Allocate { keep_size: true })).unwrap();
    let after = e.getattr(ino).unwrap();
    assert_eq!((after.size, after.mtime, after.version), (before.size, before.mtime, before.version));
    assert_eq!(read_file(&e, "f").unwrap(), pattern(100));
    let r = with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 50, 951, AllocMode::Allocate { keep_size: true }));
    assert!(matches!(r, Err(EngineError::QuotaExceeded(_))), "{r:?}");
    assert_eq!(e.usage().unwrap().bytes, 100);
}

#[test]
fn punch_hole_reads_zeros_and_keeps_the_size() {
    // 64-byte blocks: a 300-byte file has blocks 0..=4 (the last one 44 bytes).
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let data = pattern(300);
    let ino = file(&e, "f", &data);
    let before = e.getattr(ino).unwrap();
    // 10..200: partial block 0, whole blocks 1 and 2, partial block 3.
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 10, 190, AllocMode::PunchHole)).unwrap();
    let mut expect = data.clone();
    expect[10..200].fill(0);
    assert_eq!(read_file(&e, "f").unwrap(), expect);
    let after = e.getattr(ino).unwrap();
    assert_eq!(after.size, 300);
    assert!(after.mtime > before.mtime && after.version > before.version);
    assert_eq!(e.usage().unwrap().bytes, 300);

    // Punching the tail to past the end, then on uncommitted data inside one open handle.
    with_handle(&e, "f", |ino, fh| {
        e.fallocate(ino, fh, 250, 1000, AllocMode::PunchHole)?;
        e.write(ino, fh, 0, &[9u8; 64])?;
        e.fallocate(ino, fh, 5, 10, AllocMode::PunchHole)?;
        let got = e.read(ino, fh, 0, 20)?;
        assert_eq!(&got[..5], &[9u8; 5]);
        assert_eq!(&got[5..15], &[0u8; 10]);
        assert_eq!(&got[15..], &[9u8; 5]);
        Ok(())
    })
    .unwrap();
    expect[250..].fill(0);
    expect[..64].fill(9);
    expect[5..15].fill(0);
    assert_eq!(read_file(&e, "f").unwrap(), expect);
    assert_eq!(e.getattr(ino).unwrap().size, 300);
    // Entirely past the end: nothing changes.
    let v = e.getattr(ino).unwrap().version;
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 400, 10, AllocMode::PunchHole)).unwrap();
    assert_eq!(e.getattr(ino).unwrap().version, v);
    assert_consistent(&e);
}

#[test]
fn zero_range_zeros_and_may_grow() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = scope_with_quota(&storage, 1000);
    let data = pattern(100);
    file(&e, "f", &data);
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 90, 60, AllocMode::ZeroRange { keep_size: false })).unwrap();
    let mut expect = data.clone();
    expect[90..].fill(0);
    expect.resize(150, 0);
    assert_eq!(read_file(&e, "f").unwrap(), expect);
    with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 0, 500, AllocMode::ZeroRange { keep_size: true })).unwrap();
    assert_eq!(read_file(&e, "f").unwrap(), vec![0u8; 150]);
    let r = with_handle(&e, "f", |ino, fh| e.fallocate(ino, fh, 0, 2000, AllocMode::ZeroRange { keep_size: false }));
    assert!(matches!(r, Err(EngineError::QuotaExceeded(_))), "{r:?}");
    assert_eq!(e.usage().unwrap().bytes, 150);
    assert_consistent(&e);
}

#[test]
fn unprivileged_writes_and_flagged_setattrs_clear_set_id_bits() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let ino = file(&e, "f", b"data");
    let perm = |e: &ScopeEngine| e.getattr(ino).unwrap().perm;
    let chmod = |mode: u32| e.setattr(ino, &SetAttr { perm: Some(mode), ..Default::default() }).unwrap();
    chmod(0o6775);
    let flags = OpenFlags { write: true, truncate: false, exclusive: false };
    let h1 = e.open(ino, flags).unwrap();
    // A privileged write keeps the bits; an unprivileged one takes both (group-executable).
    e.write(ino, h1.fh, 0, b"D").unwrap();
    assert_eq!(perm(&e), 0o6775);
    e.write_unprivileged(ino, h1.fh, 1, b"A").unwrap();
    assert_eq!(perm(&e), 0o0775);
    // Set again while open: the handle's next unprivileged write looks again.
    chmod(0o4775);
    e.write_unprivileged(ino, h1.fh, 2, b"T").unwrap();
    assert_eq!(perm(&e), 0o0775);
    // Set-group-ID without group execute marks mandatory locking: it stays.
    chmod(0o6765);
    e.write_unprivileged(ino, h1.fh, 3, b"A").unwrap();
    assert_eq!(perm(&e), 0o2765);
    e.release(ino, h1.fh).unwrap();
    assert_eq!(read_file(&e, "f").unwrap(), b"DATA");
    // A setattr the kernel flags (a truncate without CAP_FSETID, a chown) clears after its changes.
    chmod(0o6775);
    let attr = e.setattr(ino, &SetAttr { size: Some(2), kill_suidgid: true, ..Default::default() }).unwrap();
    assert_eq!((attr.perm, attr.size), (0o0775, 2));
    // With other changes (a chown) they go in the same update.
    chmod(0o4775);
    let attr = e.setattr(ino, &SetAttr { uid: Some(7), kill_suidgid: true, ..Default::default() }).unwrap();
    assert_eq!((attr.perm, attr.uid), (0o0775, 7));
    // A directory keeps them.
    e.mkdir(ROOT_INO, b"d", 0o2775, OWNER).unwrap();
    let d = resolve(&e, "d").unwrap();
    let attr = e.setattr(d, &SetAttr { uid: Some(7), kill_suidgid: true, ..Default::default() }).unwrap();
    assert_eq!(attr.perm, 0o2775);
    assert_consistent(&e);
}
