//! Issue 23 item 5, at the engine: a fork copies its parent's metadata and no block; its reads come
//! from the parent's blocks, its writes stay its own; gc and purge of a scope keep the blocks a fork
//! still refers to, and a shared block is deleted once neither refers to it.

pub mod engine_support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use engine_support::*;
use parking_lot::Mutex;
use scopefs::engine::*;
use scopefs::ids::ScopeId;
use sha2::{Digest, Sha256};

/// The registry's `block_holds` and purged scopes, in memory.
#[derive(Default)]
struct Holds {
    holders: Mutex<HashMap<(String, String), HashSet<String>>>,
    purged: Mutex<HashSet<String>>,
}

impl Holds {
    fn hold(&self, holder: &ScopeId, blocks: &[(String, String)]) {
        let mut h = self.holders.lock();
        for b in blocks {
            h.entry(b.clone()).or_default().insert(holder.as_str().to_string());
        }
    }
}

impl SharedBlocks for Holds {
    fn held(&self, home: &str, sha: &str) -> Result<bool, String> {
        Ok(self.holders.lock().get(&(home.to_string(), sha.to_string())).is_some_and(|s| !s.is_empty()))
    }
    fn release(&self, holder: &str, home: &str, sha: &str) -> Result<bool, String> {
        let mut h = self.holders.lock();
        let key = (home.to_string(), sha.to_string());
        let left = h.get_mut(&key).map(|s| {
            s.remove(holder);
            s.len()
        });
        if left == Some(0) {
            h.remove(&key);
        }
        Ok(left.unwrap_or(0) == 0 && self.purged.lock().contains(home))
    }
    fn held_blocks(&self, home: &str) -> Result<HashSet<String>, String> {
        Ok(self.holders.lock().keys().filter(|(h, _)| h == home).map(|(_, s)| s.clone()).collect())
    }
}

fn harness() -> Harness {
    Harness::new(StorageSettings {
        block_size: 64 * 1024,
        inline_block_max_bytes: 16 * 1024,
        upload_delay: Duration::from_millis(10),
        ..StorageSettings::default()
    })
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn blocks_under(h: &Harness, scope: &ScopeId) -> usize {
    let prefix = format!("scopes/{}/blocks/", scope.as_str());
    h.store.keys().iter().filter(|k| k.starts_with(&prefix)).count()
}

fn has_block(h: &Harness, scope: &ScopeId, data: &[u8]) -> bool {
    h.store.keys().contains(&format!("scopes/{}/blocks/{}", scope.as_str(), sha(data)))
}

#[test]
fn a_fork_reads_its_parents_blocks_uploads_none_and_writes_apart() {
    let h = harness();
    let storage = h.storage();
    let holds = Arc::new(Holds::default());
    storage.set_shared_blocks(holds.clone());
    let parent = new_scope(&storage);
    let files: Vec<(String, Vec<u8>)> =
        (0..20).map(|i| (format!("f{i}"), pattern(40_000 + i * 1000, i as u8))).collect();
    for (p, d) in &files {
        write_file(&parent, p, d).unwrap();
    }
    parent.sync().unwrap();
    let child = ScopeId::generate();
    let shared = storage.fork_scope(&parent, &child).unwrap();
    assert_eq!(shared.len(), files.len(), "every block is shared, none copied");
    assert!(shared.iter().all(|(home, _)| home == parent.scope_id().as_str()));
    holds.hold(&child, &shared);
    let fork = storage.open_scope(&child, big_quota()).unwrap();
    fork.sync().unwrap();
    assert_eq!(blocks_under(&h, &child), 0, "a fork uploads no block");
    for (p, d) in &files {
        assert_eq!(&read_file(&fork, p).unwrap(), d, "{p}");
    }
    // Writes stay apart, both ways.
    write_file(&fork, "f0", b"changed in the fork").unwrap();
    write_file(&fork, "new", &pattern(30_000, 99)).unwrap();
    write_file(&parent, "f1", b"changed in the parent").unwrap();
    assert_eq!(read_file(&parent, "f0").unwrap(), files[0].1);
    assert!(resolve(&parent, "new").is_err());
    assert_eq!(read_file(&fork, "f1").unwrap(), files[1].1);
    fork.sync().unwrap();
    assert_eq!(blocks_under(&h, &child), 2, "only the fork's two new blocks are its own");
    // A cold fork (no cache) reads its parent's blocks from the store.
    drop(fork);
    drop(storage);
    let storage = h.storage();
    storage.set_shared_blocks(holds.clone());
    let fork = storage.open_scope(&child, big_quota()).unwrap();
    for (p, d) in files.iter().skip(2) {
        assert_eq!(&read_file(&fork, p).unwrap(), d, "{p}");
    }
    let report = fork.fsck(false).unwrap();
    assert!(report.damaged_files.is_empty() && report.metadata_problems.is_empty(), "{report:?}");
}

#[test]
fn a_shared_block_is_deleted_only_once_neither_scope_refers_to_it() {
    let h = harness();
    let storage = h.storage();
    let holds = Arc::new(Holds::default());
    storage.set_shared_blocks(holds.clone());
    let parent = new_scope(&storage);
    let (x, y) = (pattern(40_000, 1), pattern(41_000, 2));
    write_file(&parent, "x", &x).unwrap();
    write_file(&parent, "y", &y).unwrap();
    parent.sync().unwrap();
    let child = ScopeId::generate();
    holds.hold(&child, &storage.fork_scope(&parent, &child).unwrap());
    let fork = storage.open_scope(&child, big_quota()).unwrap();
    let pid = parent.scope_id().clone();

    // The parent lets go of x: the fork still refers to it, so its block stays.
    parent.unlink(ROOT_INO, b"x").unwrap();
    parent.collect_garbage(Duration::ZERO).unwrap();
    assert!(has_block(&h, &pid, &x), "deleted while the fork refers to it");
    assert_eq!(read_file(&fork, "x").unwrap(), x);
    // The fork lets go too: the parent's next gc deletes it.
    fork.unlink(ROOT_INO, b"x").unwrap();
    fork.collect_garbage(Duration::ZERO).unwrap();
    assert!(has_block(&h, &pid, &x), "the fork deletes nothing of a live parent");
    parent.collect_garbage(Duration::ZERO).unwrap();
    assert!(!has_block(&h, &pid, &x), "nobody refers to it any more");

    // The parent is purged: y, which the fork refers to, stays; the fork's last reference deletes it.
    drop(parent);
    storage.purge_objects(&pid).unwrap();
    holds.purged.lock().insert(pid.as_str().to_string());
    assert!(has_block(&h, &pid, &y), "purge deleted a block the fork refers to");
    assert_eq!(read_file(&fork, "y").unwrap(), y);
    fork.unlink(ROOT_INO, b"y").unwrap();
    fork.collect_garbage(Duration::ZERO).unwrap();
    assert!(!has_block(&h, &pid, &y), "the last holder of a purged scope's block deletes it");
    assert_eq!(blocks_under(&h, &pid), 0);
}

/// A fork is the parent's files as a program sees them: what a file held open was told was written
/// (a small block kept in memory, a large one in staging) is in the copy, as it would be in the
/// state a `kill -9` leaves; the program's handle goes on writing its own file afterwards.
#[test]
fn a_fork_holds_what_files_held_open_were_told_was_written() {
    let h = harness();
    let storage = h.storage();
    storage.set_shared_blocks(Arc::new(Holds::default()));
    let parent = new_scope(&storage);
    write_file(&parent, "closed", b"closed before").unwrap();
    let flags = OpenFlags { write: true, truncate: true, exclusive: false };
    let (small, small_fh) = parent.create(ROOT_INO, b"small", 0o644, flags, OWNER).unwrap();
    parent.write(small.ino, small_fh.fh, 0, b"written, not closed").unwrap();
    let big = pattern(150_000, 7);
    let (large, large_fh) = parent.create(ROOT_INO, b"large", 0o644, flags, OWNER).unwrap();
    parent.write(large.ino, large_fh.fh, 0, &big).unwrap();

    let child = ScopeId::generate();
    storage.fork_scope(&parent, &child).unwrap();
    parent.write(small.ino, small_fh.fh, 19, b", then more").unwrap();
    parent.release(small.ino, small_fh.fh).unwrap();
    parent.release(large.ino, large_fh.fh).unwrap();

    let fork = storage.open_scope(&child, big_quota()).unwrap();
    assert_eq!(read_file(&fork, "closed").unwrap(), b"closed before");
    assert_eq!(read_file(&fork, "small").unwrap(), b"written, not closed", "the fork lacks a held file's write");
    assert_eq!(read_file(&fork, "large").unwrap(), big);
    assert_eq!(read_file(&parent, "small").unwrap(), b"written, not closed, then more");
    assert_eq!(read_file(&parent, "large").unwrap(), big);
}
