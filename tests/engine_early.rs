//! Issue 23 f, at the engine: a block a sequential writer fills is uploaded while the file is still
//! being written (early upload), so `fsync` uploads only what is left; a block changed again after
//! its early upload is never what the file reads, and gc deletes the early copy; a store that fails
//! the early uploads costs nothing but their time (the commit uploads as before); with the setting
//! off nothing is uploaded before the commit. Every check reads every byte back, after a restart too.

pub mod engine_support;

use std::time::{Duration, Instant};

use engine_support::*;
use scopefs::engine::*;
use scopefs::store::block_key;
use sha2::{Digest, Sha256};

const BLOCK: usize = 64 * 1024;

fn settings(early: bool) -> StorageSettings {
    StorageSettings {
        block_size: BLOCK as u64,
        inline_block_max_bytes: 0,
        upload_delay: Duration::from_secs(3600),
        dirty_writeback: Duration::from_secs(3600),
        store_timeout: Duration::from_secs(2),
        early_upload: early,
        ..StorageSettings::default()
    }
}

const RW: OpenFlags = OpenFlags { write: true, truncate: false, exclusive: false };

fn create_open(e: &ScopeEngine, name: &str) -> (Ino, Fh) {
    let (attr, opened) = e.create(ROOT_INO, name.as_bytes(), 0o644, RW, OWNER).unwrap();
    (attr.ino, opened.fh)
}

fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn block_keys(h: &Harness) -> Vec<String> {
    h.store.keys().into_iter().filter(|k| k.contains("/blocks/")).collect()
}

fn key_of(e: &ScopeEngine, data: &[u8]) -> String {
    block_key(e.scope_id().as_str(), &hex::encode(Sha256::digest(data)))
}

/// Eight full blocks and a tail written in 16 KiB writes: the eight are in the store before the
/// file is fsynced or closed, and recorded as early uploads; fsync then stores one object (the tail).
#[test]
fn full_blocks_are_stored_while_the_file_is_written_and_fsync_uploads_the_rest() {
    let h = Harness::new(settings(true));
    let storage = h.storage();
    let e = new_scope(&storage);
    let data = unique(8 * BLOCK + 1000, 7);
    let (ino, fh) = create_open(&e, "big");
    for (i, chunk) in data.chunks(16 * 1024).enumerate() {
        assert_eq!(e.write(ino, fh, (i * 16 * 1024) as u64, chunk).unwrap() as usize, chunk.len());
    }
    wait_until(Duration::from_secs(10), "eight early uploads recorded", || e.early_uploads() == 8);
    let keys = block_keys(&h);
    for b in 0..8 {
        let key = key_of(&e, &data[b * BLOCK..(b + 1) * BLOCK]);
        assert!(keys.contains(&key), "block {b} is not in the store before fsync");
    }
    let puts = h.store.put_count();
    e.fsync(ino, Some(fh)).unwrap();
    assert!(block_keys(&h).contains(&key_of(&e, &data[8 * BLOCK..])), "the tail is stored by fsync");
    assert_eq!(block_keys(&h).len(), 9, "one object per block");
    assert_eq!(h.store.put_count() - puts, 1, "fsync stored the tail only, no full block again");
    e.release(ino, fh).unwrap();
    assert_eq!(read_file(&e, "big").unwrap(), data);
    assert!(e.fsck(false).unwrap().orphan_objects.is_empty(), "every early object is referenced");
    let dir = tempfile::tempdir().unwrap();
    let after = killed_now(&h, dir.path()).open_scope(e.scope_id(), big_quota()).unwrap();
    assert_eq!(read_file(&after, "big").unwrap(), data, "after a killed process");
}

/// A block is stored early, then its first byte changes before the commit: the file reads the new
/// bytes, the early copy is an unreferenced block (not what the file refers to), and gc deletes it;
/// the file's blocks survive gc and a restart.
#[test]
fn a_block_changed_after_its_early_upload_is_collected_and_never_read() {
    let h = Harness::new(settings(true));
    let storage = h.storage();
    let e = new_scope(&storage);
    let mut data = unique(2 * BLOCK, 3);
    let (ino, fh) = create_open(&e, "f");
    e.write(ino, fh, 0, &data).unwrap();
    wait_until(Duration::from_secs(10), "two early uploads", || e.early_uploads() == 2);
    let early_first = key_of(&e, &data[..BLOCK]);
    data[0] ^= 0xff;
    e.write(ino, fh, 0, &data[..1]).unwrap();
    e.fsync(ino, Some(fh)).unwrap();
    e.release(ino, fh).unwrap();
    assert_eq!(read_file(&e, "f").unwrap(), data);
    assert!(block_keys(&h).contains(&early_first), "the early copy stays until gc");
    let report = e.collect_garbage(Duration::ZERO).unwrap();
    assert_eq!(report.blocks_deleted, 1, "gc deletes the early copy nobody refers to");
    let keys = block_keys(&h);
    assert!(!keys.contains(&early_first));
    assert!(keys.contains(&key_of(&e, &data[..BLOCK])) && keys.contains(&key_of(&e, &data[BLOCK..])));
    let fsck = e.fsck(false).unwrap();
    assert!(fsck.damaged_files.is_empty() && fsck.orphan_objects.is_empty(), "{fsck:?}");
    let dir = tempfile::tempdir().unwrap();
    let after = killed_now(&h, dir.path()).open_scope(e.scope_id(), big_quota()).unwrap();
    assert_eq!(read_file(&after, "f").unwrap(), data, "after a killed process");
}

/// A store that refuses every early upload: fsync uploads every block itself, and nothing is lost.
#[test]
fn failed_early_uploads_leave_the_commit_to_upload_every_block() {
    let h = Harness::new(settings(true));
    let storage = h.storage();
    let e = new_scope(&storage);
    let data = unique(4 * BLOCK, 9);
    let (ino, fh) = create_open(&e, "f");
    h.store.set_unavailable(true);
    e.write(ino, fh, 0, &data).unwrap();
    wait_until(Duration::from_secs(10), "the early attempts end", || e.early_uploads_in_flight() == 0);
    h.store.set_unavailable(false);
    assert_eq!(e.early_uploads(), 0);
    e.fsync(ino, Some(fh)).unwrap();
    e.release(ino, fh).unwrap();
    assert_eq!(block_keys(&h).len(), 4);
    assert_eq!(read_file(&e, "f").unwrap(), data);
    let fsck = e.fsck(false).unwrap();
    assert!(fsck.damaged_files.is_empty() && fsck.orphan_objects.is_empty(), "{fsck:?}");
}

/// With `early_upload` off, nothing reaches the store before the file's fsync.
#[test]
fn with_the_setting_off_blocks_wait_for_the_commit() {
    let h = Harness::new(settings(false));
    let storage = h.storage();
    let e = new_scope(&storage);
    let data = unique(4 * BLOCK, 5);
    let (ino, fh) = create_open(&e, "f");
    e.write(ino, fh, 0, &data).unwrap();
    assert_eq!(e.pending_uploads(), 0);
    assert!(block_keys(&h).is_empty(), "an early upload happened with the setting off");
    e.fsync(ino, Some(fh)).unwrap();
    e.release(ino, fh).unwrap();
    assert_eq!(block_keys(&h).len(), 4);
    assert_eq!(e.early_uploads(), 0);
    assert_eq!(read_file(&e, "f").unwrap(), data);
}
