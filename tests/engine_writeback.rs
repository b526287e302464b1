//! Issue 22 item 1, at the engine (no kernel): a file held open does not hold what its changes
//! cost for as long as the program keeps it open. Its changes are committed (and their blocks
//! uploaded) after `dirty_writeback`; a write that finds staging full writes back instead of
//! failing; the open-file log stays within its bound however often an open file is rewritten; and
//! one scope's open files take at most its share of the in-memory dirty blocks. Each is checked with
//! every byte, through the handles, and after a killed process where it matters.

pub mod engine_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use sha2::{Digest, Sha256};

const BLOCK: usize = 64 * 1024;
const RW: OpenFlags = OpenFlags { write: true, truncate: false, exclusive: false };

/// Blocks of 64 KiB, the ones up to 16 KiB kept in memory; nothing written back or uploaded on its
/// own unless a test says so.
fn settings() -> StorageSettings {
    StorageSettings {
        block_size: BLOCK as u64,
        inline_block_max_bytes: 16 * 1024,
        upload_delay: Duration::from_secs(3600),
        dirty_writeback: Duration::from_secs(3600),
        store_timeout: Duration::from_secs(2),
        ..StorageSettings::default()
    }
}

fn create_open(e: &ScopeEngine, name: &str) -> (Ino, Fh) {
    let (attr, opened) = e.create(ROOT_INO, name.as_bytes(), 0o644, RW, OWNER).unwrap();
    (attr.ino, opened.fh)
}

fn open_log(h: &Harness, id: &ScopeId) -> PathBuf {
    h.data_dir().join("staging").join(id.as_str()).join("open-log")
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Polls `done` every 20 ms until it holds; fails the test after `within`.
fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The open-file log keeps, per open file, what it was told was written and not yet committed. A
/// program that rewrites a file it holds open (a log, a database) must not grow it without end: past
/// `open_log_max_bytes` each change is committed instead of logged. Nothing is lost: a process
/// killed after the last write leaves both files, the rewritten one and one changed once and then
/// left alone, as their handles were told.
#[test]
fn rewriting_a_file_held_open_keeps_the_open_file_log_within_its_bound() {
    const BOUND: u64 = 256 * 1024;
    const WRITE: usize = 8 * 1024;
    let h = Harness::new(StorageSettings { open_log_max_bytes: BOUND, ..settings() });
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    let (idle, idle_fh) = create_open(&e, "idle");
    e.write(idle, idle_fh, 0, b"changed once, then left open").unwrap();
    let (held, held_fh) = create_open(&e, "held");
    let mut largest = 0;
    // 8 MiB of changes, 32 times the bound, into one block kept in memory (each change logged whole).
    let rounds = 1_000u32;
    for round in 0..rounds {
        let data = pattern(WRITE, round as u8);
        assert_eq!(e.write(held, held_fh, (round as u64 % 2) * WRITE as u64, &data).unwrap(), WRITE as u32);
        largest = largest.max(file_len(&open_log(&h, &id)));
    }
    assert!(largest > 0, "the open-file log was never written");
    assert!(largest <= BOUND + WRITE as u64 + 1024, "the open-file log reached {largest} bytes (bound {BOUND})");
    let mut expect = vec![0u8; 2 * WRITE];
    for round in rounds - 2..rounds {
        let at = (round as usize % 2) * WRITE;
        expect[at..at + WRITE].copy_from_slice(&pattern(WRITE, round as u8));
    }

    let dir = tempfile::tempdir().unwrap();
    let next = killed_now(&h, dir.path());
    let e2 = next.open_scope_resumed(&id, big_quota()).unwrap();
    let got = e2.read(held, held_fh, 0, (8 * WRITE) as u32).unwrap();
    assert!(got == expect, "the rewritten file after a killed process ({} bytes)", got.len());
    assert_eq!(e2.read(idle, idle_fh, 0, 100).unwrap(), b"changed once, then left open");
    drop(e);
}

/// A file a program holds open (a log it appends to, a download in progress) is committed once its
/// changes are `dirty_writeback` old: its blocks reach the object store, staging and the in-memory
/// budget get back what they held, and a successor that has lost the open-file log still has every
/// byte — while the handle stays open and goes on writing.
#[test]
fn changes_of_a_file_held_open_are_committed_and_uploaded_after_the_bound() {
    let h = Harness::new(StorageSettings {
        dirty_writeback: Duration::from_millis(300),
        upload_delay: Duration::from_millis(10),
        ..settings()
    });
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    let (large, large_fh) = create_open(&e, "large");
    let big = pattern(BLOCK + 40 * 1024, 7);
    e.write(large, large_fh, 0, &big).unwrap();
    let (small, small_fh) = create_open(&e, "small");
    e.write(small, small_fh, 0, b"a few bytes kept in memory").unwrap();
    assert!(e.staging_bytes() > 0 && storage.dirty_memory_bytes() > 0, "the writes are held uncommitted first");

    wait_until(Duration::from_secs(30), "staging and dirty memory given back", || {
        e.staging_bytes() == 0 && storage.dirty_memory_bytes() == 0
    });
    let keys = h.store.keys();
    for chunk in big.chunks(BLOCK) {
        let key = scopefs::store::block_key(id.as_str(), &hex::encode(Sha256::digest(chunk)));
        assert!(keys.contains(&key), "a block of the file held open is not in the store");
    }

    // Committed, not only logged: a successor without the open-file log has it all.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&h.data_dir(), dir.path());
    std::fs::remove_file(dir.path().join("staging").join(id.as_str()).join("open-log")).ok();
    let store: std::sync::Arc<dyn scopefs::store::ObjectStore> = h.store.clone();
    let next = Storage::new(store, h.settings.clone(), dir.path(), h.rt.handle().clone()).unwrap();
    let e2 = next.open_scope(&id, big_quota()).unwrap();
    assert!(read_file(&e2, "large").unwrap() == big, "the large file as committed by the write-back");
    assert_eq!(read_file(&e2, "small").unwrap(), b"a few bytes kept in memory");
    drop((e2, next));

    // The handles go on: a later write and the close commit over the written-back version.
    e.write(small, small_fh, 2, b"FEW").unwrap();
    for (ino, fh) in [(large, large_fh), (small, small_fh)] {
        e.flush(ino, fh).unwrap();
        e.release(ino, fh).unwrap();
    }
    assert!(read_file(&e, "large").unwrap() == big);
    assert_eq!(read_file(&e, "small").unwrap(), b"a FEW bytes kept in memory");
}

/// One open file larger than the scope's staging share: when a write finds no room, the file is
/// committed and the scope's staged blocks uploaded, and the write goes on, where it used to answer
/// `ENOSPC` with the object store empty. Staging never holds more than the share.
#[test]
fn a_file_larger_than_the_staging_share_is_written_through_one_open_handle() {
    const SHARE: u64 = 512 * 1024;
    let h = Harness::new(StorageSettings { staging_max_bytes_per_scope: SHARE, ..settings() });
    let storage = h.storage();
    let e = new_scope(&storage);
    let (ino, fh) = create_open(&e, "big");
    let data = pattern(4 << 20, 3);
    // One write of twice the share into the file with no change yet, then pieces of 32 KiB.
    let first = 2 * SHARE as usize;
    assert_eq!(e.write(ino, fh, 0, &data[..first]).expect("a first write of twice the share"), first as u32);
    for (i, piece) in data[first..].chunks(32 * 1024).enumerate() {
        let at = first + i * 32 * 1024;
        let written = e.write(ino, fh, at as u64, piece);
        assert_eq!(written.unwrap_or_else(|err| panic!("write at {} KiB: {err}", at >> 10)), piece.len() as u32);
        assert!(e.staging_bytes() <= SHARE, "staging holds {} bytes, past the share", e.staging_bytes());
    }
    let got = e.read(ino, fh, 0, data.len() as u32).unwrap();
    assert!(got == data, "read back through the handle that wrote it");
    e.flush(ino, fh).unwrap();
    e.release(ino, fh).unwrap();
    assert!(read_file(&e, "big").unwrap() == data, "read back after the close");
}

/// Scope A holds many small files open with changes (each kept in memory): it takes at most its
/// share of the in-memory budget (the rest of its blocks are staging files), so scope B's small
/// file is still kept in memory. Every byte of A reads back through its handles and after its closes.
#[test]
fn one_scope_holds_at_most_its_share_of_the_in_memory_dirty_blocks() {
    const SHARE: u64 = 256 * 1024;
    let h = Harness::new(StorageSettings {
        dirty_memory_max_bytes: 1 << 20,
        dirty_memory_per_scope_bytes: SHARE,
        ..settings()
    });
    let storage = h.storage();
    let a = new_scope(&storage);
    let files: Vec<(Ino, Fh, Vec<u8>)> = (0..64u8)
        .map(|i| {
            let (ino, fh) = create_open(&a, &format!("f{i}"));
            let data = pattern(16 * 1024, i);
            a.write(ino, fh, 0, &data).unwrap();
            (ino, fh, data)
        })
        .collect();
    assert!(
        storage.dirty_memory_bytes() <= SHARE,
        "scope A holds {} bytes of dirty memory",
        storage.dirty_memory_bytes()
    );
    assert!(a.staging_bytes() > 0, "A's blocks past its share are staging files");

    let b = new_scope(&storage);
    let (ino, fh) = create_open(&b, "bystander");
    b.write(ino, fh, 0, &pattern(16 * 1024, 99)).unwrap();
    assert_eq!(b.staging_bytes(), 0, "B's small block was pushed out of memory by A");
    b.release(ino, fh).unwrap();

    for (ino, fh, data) in &files {
        assert!(a.read(*ino, *fh, 0, data.len() as u32).unwrap() == *data);
        a.release(*ino, *fh).unwrap();
    }
    assert_eq!(storage.dirty_memory_bytes(), 0, "every charge given back");
    for (i, (_, _, data)) in files.iter().enumerate() {
        assert!(read_file(&a, &format!("f{i}")).unwrap() == *data);
    }
}
