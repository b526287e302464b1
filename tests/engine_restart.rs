//! Issue 21 item 3, at the engine (no kernel): a process killed while programs hold files open
//! leaves nothing they were told was written, and its successor, handed the same open handles (a
//! resumed mount), serves them on: writes not yet closed (D7), files unlinked while open and
//! `O_TMPFILE` files (D3), and requests the kernel hands it again after they were applied (D5).
//!
//! A kill is a copy of the data directory taken while the engine runs (the page cache survives a
//! killed process); the successor opens the copy with `open_scope_resumed`.

pub mod engine_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::ObjectStore;

/// Blocks of 64 KiB (the inline bound of 16 KiB: smaller blocks are kept in memory, larger ones in
/// working files); uploads wait long, so a kill finds them journaled.
/// Uploads wait (a staged block stays staged until a test uploads it): no background uploads, none
/// while a file is written (`early_upload`).
fn harness() -> Harness {
    Harness::new(StorageSettings {
        block_size: 64 * 1024,
        inline_block_max_bytes: 16 * 1024,
        upload_delay: Duration::from_secs(3600),
        early_upload: false,
        store_timeout: Duration::from_secs(2),
        ..StorageSettings::default()
    })
}

/// D7: every write a handle was answered for, into a block kept in memory, a block in a working file,
/// over committed bytes, and a truncate and a punched hole, is in the file the successor serves
/// through the same handle; closing it there commits it.
#[test]
fn writes_not_yet_closed_survive_a_killed_process_under_their_handles() {
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    write_file(&e, "committed", &pattern(150_000, 1)).unwrap();
    for name in ["small", "large"] {
        e.create(ROOT_INO, name.as_bytes(), 0o644, OpenFlags { write: true, ..Default::default() }, OWNER).unwrap();
    }
    let mut expect = std::collections::BTreeMap::new();
    let (small, small_fh) = open_rw(&e, "small");
    e.write(small, small_fh, 0, b"kept in memory").unwrap();
    expect.insert("small", b"kept in memory".to_vec());
    let (large, large_fh) = open_rw(&e, "large");
    let big = pattern(200_000, 2);
    e.write(large, large_fh, 0, &big).unwrap();
    expect.insert("large", big);
    let (over, over_fh) = open_rw(&e, "committed");
    let mut changed = pattern(150_000, 1);
    e.write(over, over_fh, 70_000, b"overwritten in the middle").unwrap();
    changed[70_000..70_025].copy_from_slice(b"overwritten in the middle");
    e.setattr(over, &SetAttr { size: Some(140_000), ..Default::default() }).unwrap();
    changed.truncate(140_000);
    e.fallocate(over, over_fh, 1_000, 80_000, AllocMode::PunchHole).unwrap();
    changed[1_000..81_000].fill(0);
    e.write(over, over_fh, 139_990, b"grown past the end").unwrap();
    changed.truncate(139_990);
    changed.extend_from_slice(b"grown past the end");
    expect.insert("committed", changed);

    let dir = tempfile::tempdir().unwrap();
    let next = killed_now(&h, dir.path());
    let e2 = next.open_scope_resumed(&id, big_quota()).unwrap();
    for (name, fh) in [("small", small_fh), ("large", large_fh), ("committed", over_fh)] {
        let ino = resolve(&e2, name).unwrap();
        let size = e2.getattr(ino).unwrap().size as usize;
        let got = e2.read(ino, fh, 0, size as u32 + 10).unwrap();
        assert_eq!(got.len(), expect[name].len(), "{name}: length through the handle of the dead process");
        assert!(got == expect[name], "{name}: content through the handle of the dead process");
        e2.flush(ino, fh).unwrap();
        e2.release(ino, fh).unwrap();
    }
    drop((e2, next));
    // Closed in the successor: committed for good.
    let dir2 = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), dir2.path());
    let store: Arc<dyn ObjectStore> = h.store.clone();
    let third = Storage::new(store, h.settings.clone(), dir2.path(), h.rt.handle().clone()).unwrap();
    let e3 = third.open_scope(&id, big_quota()).unwrap();
    for (name, data) in &expect {
        assert!(read_file(&e3, name).unwrap() == *data, "{name} after a clean restart");
    }
    let report = e3.fsck(false).unwrap();
    assert!(report.damaged_files.is_empty() && report.metadata_problems.is_empty(), "{report:?}");
    drop(e);
}

/// D3: a file unlinked while open and an `O_TMPFILE` file outlive a killed process under a resumed
/// mount (read through the old handle; the tmpfile linked), until the kernel forgets them; a fresh
/// mount collects what nobody holds.
#[test]
fn unlinked_and_tmpfile_inodes_outlive_a_restart_until_the_kernel_forgets_them() {
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    write_file(&e, "doomed", b"unlinked but open").unwrap();
    let (doomed, doomed_fh) = open_rw(&e, "doomed");
    e.unlink(ROOT_INO, b"doomed").unwrap();
    let rw = OpenFlags { write: true, ..Default::default() };
    let (tmp, tmp_opened) = e.tmpfile(ROOT_INO, 0o600, rw, OWNER).unwrap();
    e.write(tmp.ino, tmp_opened.fh, 0, b"anonymous until linked").unwrap();
    e.fsync(tmp.ino, Some(tmp_opened.fh)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let next = killed_now(&h, dir.path());
    let e2 = next.open_scope_resumed(&id, big_quota()).unwrap();
    assert_eq!(e2.read(doomed, doomed_fh, 0, 100).unwrap(), b"unlinked but open");
    assert_eq!(e2.read(tmp.ino, tmp_opened.fh, 0, 100).unwrap(), b"anonymous until linked");
    e2.link(tmp.ino, ROOT_INO, b"linked-later").unwrap();
    assert_eq!(read_file(&e2, "linked-later").unwrap(), b"anonymous until linked");
    // The last handle of this process goes: the kernel may hold others of the dead one.
    e2.release(doomed, doomed_fh).unwrap();
    assert!(e2.getattr(doomed).is_ok(), "kept while the kernel may hold it");
    let files_before = e2.usage().unwrap().files;
    e2.forget(doomed);
    assert!(matches!(e2.getattr(doomed), Err(EngineError::NotFound)), "deleted when the kernel forgets it");
    assert_eq!(e2.usage().unwrap().files, files_before - 1);
    e2.forget(tmp.ino);
    assert!(e2.getattr(tmp.ino).is_ok(), "a linked inode is never deleted by a forget");

    // A fresh mount of the same state: no kernel holds anything, inodes without a name go.
    let dir2 = tempfile::tempdir().unwrap();
    let fresh = killed_now(&h, dir2.path());
    let e3 = fresh.open_scope(&id, big_quota()).unwrap();
    assert!(matches!(e3.getattr(doomed), Err(EngineError::NotFound)));
    assert_eq!(e3.usage().unwrap().files, 0, "the unlinked file and the unlinked tmpfile are collected");
    drop(e);
}

/// D5: requests the dead process applied but never answered are answered as they were when the
/// kernel hands them to the successor, not run again.
#[test]
fn resent_requests_are_answered_as_they_were_not_run_again() {
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    write_file(&e, "a", b"A").unwrap();
    write_file(&e, "b", b"B").unwrap();
    write_file(&e, "gone", b"G").unwrap();
    let excl = OpenFlags { write: true, truncate: false, exclusive: true };
    // Each runs as a request whose answer never leaves the dying process.
    let dir_attr = {
        let _r = e.begin_request(11, false);
        e.mkdir(ROOT_INO, b"lockdir", 0o755, OWNER).unwrap()
    };
    let _r12 = e.begin_request(12, false);
    e.rename(ROOT_INO, b"a", ROOT_INO, b"b", RenameMode::Exchange).unwrap();
    drop(_r12);
    let _r13 = e.begin_request(13, false);
    e.unlink(ROOT_INO, b"gone").unwrap();
    let _r14 = e.begin_request(14, false);
    let (created, _) = e.create(ROOT_INO, b"lockfile", 0o644, excl, OWNER).unwrap();
    let _r15 = e.begin_request(15, false);
    e.setxattr(created.ino, b"user.owner", b"me", XattrMode::Create).unwrap();
    // Killed now: 13, 14 and 15 are logged and unanswered (11 and 12 were answered: a resend of
    // them cannot happen, and is not what this test asks).
    let dir = tempfile::tempdir().unwrap();
    let next = killed_now(&h, dir.path());
    let e2 = next.open_scope_resumed(&id, big_quota()).unwrap();
    {
        let _r = e2.begin_request(13, true);
        e2.unlink(ROOT_INO, b"gone").expect("an unlink applied before is answered as done");
    }
    {
        let _r = e2.begin_request(14, true);
        let (again, opened) = e2.create(ROOT_INO, b"lockfile", 0o644, excl, OWNER).expect("not EEXIST");
        assert_eq!(again.ino, created.ino, "the file the first run created");
        e2.release(again.ino, opened.fh).unwrap();
    }
    {
        let _r = e2.begin_request(15, true);
        e2.setxattr(created.ino, b"user.owner", b"me", XattrMode::Create).expect("not EEXIST");
    }
    // A resent request that was never applied runs.
    {
        let _r = e2.begin_request(16, true);
        e2.mkdir(ROOT_INO, b"new", 0o755, OWNER).unwrap();
    }
    assert_eq!(read_file(&e2, "a").unwrap(), b"B", "the exchange happened once");
    assert_eq!(read_file(&e2, "b").unwrap(), b"A");
    assert!(matches!(e2.lookup(ROOT_INO, b"gone"), Err(EngineError::NotFound)));
    assert_eq!(e2.lookup(ROOT_INO, b"lockdir").unwrap().ino, dir_attr.ino);
    // An unapplied mutation whose name now exists still fails as it should.
    {
        let _r = e2.begin_request(17, true);
        assert!(matches!(e2.mkdir(ROOT_INO, b"new", 0o755, OWNER), Err(EngineError::Exists)));
    }
    drop((_r15, _r14, _r13));
}

/// D11: a staged block whose file is gone (a power loss took it before a flush) never counts as
/// uploaded: fsync of its file fails while the store lacks it; when the store has it (its upload
/// finished, the mark was lost) it is marked uploaded and reads work.
#[test]
fn a_missing_staged_block_is_never_taken_for_uploaded() {
    use sha2::Digest;
    let h = harness();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    let lost = pattern(100_000, 7);
    let kept = pattern(100_000, 8);
    write_file(&e, "lost", &lost).unwrap();
    write_file(&e, "kept", &kept).unwrap();
    let blocks = h.data_dir().join("staging").join(id.as_str()).join("blocks");
    let sha = |d: &[u8]| hex::encode(sha2::Sha256::digest(d));
    for data in [&lost[..65536], &kept[..65536]] {
        std::fs::remove_file(blocks.join(sha(data))).unwrap();
    }
    // The store has `kept`'s first block (uploaded before the power loss), not `lost`'s.
    h.rt.block_on(
        h.store.put(&scopefs::store::block_key(id.as_str(), &sha(&kept[..65536])), kept[..65536].to_vec().into()),
    )
    .unwrap();
    let lost_ino = resolve(&e, "lost").unwrap();
    assert!(e.fsync(lost_ino, None).is_err(), "fsync of a file whose block is gone must fail");
    let kept_ino = resolve(&e, "kept").unwrap();
    e.fsync(kept_ino, None).expect("the store has it: marked uploaded");
    assert_eq!(read_file(&e, "kept").unwrap(), kept);
    assert!(read_file(&e, "lost").is_err(), "never wrong bytes");
}

/// Bytes of the files below `dir`.
fn walked_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| if e.file_type().unwrap().is_dir() { walked_bytes(&e.path()) } else { e.metadata().unwrap().len() })
        .sum()
}

/// A restart opens thousands of scopes at once: the census taken at startup is what each scope's
/// first open uses (it counts every byte a walk counts), each scope opens once however many threads
/// ask for it, and each is recovered and counted as when one thread opens it.
#[test]
fn scopes_opened_at_once_after_a_kill_open_once_and_count_their_staging_once() {
    let h = harness();
    let storage = h.storage();
    let ids: Vec<ScopeId> = (0..6).map(|_| ScopeId::generate()).collect();
    let mut held = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let e = storage.open_scope(id, big_quota()).unwrap();
        // Half of them hold staged blocks (uploads wait), the others only committed metadata.
        if i % 2 == 0 {
            write_file(&e, "big", &pattern(200_000, i as u8)).unwrap();
        }
        held.push(e);
    }
    let dir = tempfile::tempdir().unwrap();
    let next = killed_now(&h, dir.path());
    let staging = dir.path().join("staging");
    let first = walked_bytes(&staging.join(ids[0].as_str()));
    assert!(first > 64 * 1024, "its full block is staged (the three are one): {first}");
    assert_eq!(next.staging_bytes(), walked_bytes(&staging), "the startup census counts every byte");

    // The same kill, opened by one thread: what each scope counts then is what it must count here.
    let alone_dir = tempfile::tempdir().unwrap();
    let alone = killed_now(&h, alone_dir.path());
    let counted_alone: Vec<u64> =
        ids.iter().map(|id| alone.open_scope_resumed(id, big_quota()).unwrap().staging_bytes()).collect();

    let opened: Vec<Vec<Arc<ScopeEngine>>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|_| s.spawn(|| ids.iter().map(|id| next.open_scope_resumed(id, big_quota()).unwrap()).collect()))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (i, id) in ids.iter().enumerate() {
        let first = &opened[0][i];
        assert!(opened.iter().all(|per_thread| Arc::ptr_eq(&per_thread[i], first)), "{id} opened more than once");
        assert_eq!(first.staging_bytes(), counted_alone[i], "{id}: recovered and counted once");
        if i % 2 == 0 {
            assert_eq!(read_file(first, "big").unwrap(), pattern(200_000, i as u8));
        }
    }
    assert_eq!(next.staging_bytes(), alone.staging_bytes(), "daemon-wide, too");
    drop(held);
}
