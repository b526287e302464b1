//! Path-level engine API used by the HTTP layer: no symlink following, atomic replace, no partial files, observer.

pub mod engine_support;

use std::sync::{Arc, Mutex};

use engine_support::*;
use scopefs::engine::*;

#[test]
fn write_path_replaces_atomically_and_never_leaves_partial_files() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    let seen: Arc<Mutex<Vec<Change>>> = Arc::default();
    let sink = seen.clone();
    e.set_observer(Some(Arc::new(move |c: &Change| sink.lock().unwrap().push(c.clone()))));

    e.make_dirs("docs/a", OWNER).unwrap();
    e.write_path("docs/a/r.txt", &mut &b"first"[..], 1 << 20, WriteMode::CreateNew, OWNER).unwrap();
    assert!(matches!(
        e.write_path("docs/a/r.txt", &mut &b"x"[..], 1 << 20, WriteMode::CreateNew, OWNER),
        Err(EngineError::Exists)
    ));
    // An open reader of the old version keeps it while the path is replaced.
    let old = e.resolve_path("docs/a/r.txt").unwrap();
    let reader = e.open(old.ino, OpenFlags::default()).unwrap();
    let new = e.write_path("docs/a/r.txt", &mut &b"second version"[..], 1 << 20, WriteMode::Replace, OWNER).unwrap();
    assert_ne!(new.ino, old.ino);
    assert_eq!(e.read(old.ino, reader.fh, 0, 100).unwrap(), b"first");
    e.release(old.ino, reader.fh).unwrap();
    assert_eq!(e.read_path("docs/a/r.txt", 0, 1 << 20).unwrap(), b"second version");
    assert_eq!(e.read_path("docs/a/r.txt", 7, 3).unwrap(), b"ver");

    let before = e.usage().unwrap();
    let big = vec![1u8; 5000];
    assert!(matches!(
        e.write_path("docs/a/r.txt", &mut &big[..], 4096, WriteMode::Replace, OWNER),
        Err(EngineError::TooLarge)
    ));
    assert_eq!(e.read_path("docs/a/r.txt", 0, 1 << 20).unwrap(), b"second version", "old version intact");
    assert_eq!(e.usage().unwrap(), before, "the refused upload left nothing behind");
    assert!(e.consistency_problems().unwrap().is_empty());
    assert!(seen.lock().unwrap().iter().any(|c| matches!(c, Change::Entry { name, .. } if name == b"r.txt")));
}

/// A read-modify-write replaces only the version it read: a write in between (in place, as through
/// the mount, or a whole replace, or a delete) makes it fail with `Changed` and leaves that write.
#[test]
fn replace_if_unchanged_never_loses_a_write_made_in_between() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    let unchanged = |a: &Attr| WriteMode::ReplaceIfUnchanged { ino: a.ino, version: a.version };
    let write = |data: &[u8], mode| e.write_path("notes.txt", &mut &data[..], 1 << 20, mode, OWNER);

    let read = write(b"version one", WriteMode::CreateNew).unwrap();
    // In place, through an open handle (what a write through the mount does).
    let opened = e.open(read.ino, OpenFlags { write: true, ..Default::default() }).unwrap();
    e.write(read.ino, opened.fh, 0, b"VERSION").unwrap();
    e.flush(read.ino, opened.fh).unwrap();
    e.release(read.ino, opened.fh).unwrap();
    let usage = e.usage().unwrap();
    assert!(matches!(write(b"the edit", unchanged(&read)), Err(EngineError::Changed)));
    assert_eq!(e.read_path("notes.txt", 0, 100).unwrap(), b"VERSION one", "the write in between stays");
    assert_eq!(e.usage().unwrap(), usage, "the refused edit left nothing behind");

    // Replaced as a whole (a new inode), then removed: both refuse the stale edit.
    let read = e.resolve_path("notes.txt").unwrap();
    write(b"replaced", WriteMode::Replace).unwrap();
    assert!(matches!(write(b"the edit", unchanged(&read)), Err(EngineError::Changed)));
    assert_eq!(e.read_path("notes.txt", 0, 100).unwrap(), b"replaced");
    let read = e.resolve_path("notes.txt").unwrap();
    e.remove_path("notes.txt", false).unwrap();
    assert!(matches!(write(b"the edit", unchanged(&read)), Err(EngineError::Changed)));
    assert!(matches!(e.resolve_path("notes.txt"), Err(EngineError::NotFound)), "a stale edit recreated the file");

    // Nothing in between: the edit replaces the version it read.
    let read = write(b"fresh", WriteMode::CreateNew).unwrap();
    let edited = write(b"fresh, edited", unchanged(&read)).unwrap();
    assert_ne!((edited.ino, edited.version), (read.ino, read.version));
    assert_eq!(e.read_path("notes.txt", 0, 100).unwrap(), b"fresh, edited");
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn paths_never_follow_symlinks_and_list_is_relative() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    e.make_dirs("real", OWNER).unwrap();
    e.write_path("real/f", &mut &b"data"[..], 1 << 20, WriteMode::CreateNew, OWNER).unwrap();
    e.symlink(ROOT_INO, b"link", b"real", OWNER).unwrap();
    e.symlink(ROOT_INO, b"flink", b"real/f", OWNER).unwrap();
    assert!(matches!(e.resolve_path("link/f"), Err(EngineError::NotFound)));
    assert!(matches!(e.read_path("flink", 0, 10), Err(EngineError::NotFound)));
    assert!(matches!(e.resolve_path("real/../real"), Err(EngineError::InvalidName(_))));
    let all: Vec<String> = e.list_path("", true).unwrap().into_iter().map(|p| p.path).collect();
    assert_eq!(all, vec!["flink", "link", "real", "real/f"]);
    let top: Vec<String> = e.list_path("real", false).unwrap().into_iter().map(|p| p.path).collect();
    assert_eq!(top, vec!["real/f"]);
    e.remove_path("real", true).unwrap();
    assert!(matches!(e.resolve_path("real"), Err(EngineError::NotFound)));
    assert_eq!(e.usage().unwrap().files, 0);
}
