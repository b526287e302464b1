//! Hard links and device nodes in the engine (issue 10): link counts, names that share one file,
//! unlink and rename of any name, quota charged once, the link bound, paged listings of every
//! name, and inert device nodes.

pub mod engine_support;

use std::collections::BTreeMap;

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;

fn nlink(e: &ScopeEngine, path: &str) -> u32 {
    e.getattr(resolve(e, path).unwrap()).unwrap().nlink
}

fn assert_consistent(e: &ScopeEngine) {
    let problems = e.consistency_problems().unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn names_share_one_file_and_its_bytes_are_charged_once() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    write_file(&e, "a", b"hello world").unwrap();
    let ino = resolve(&e, "a").unwrap();
    let before = e.usage().unwrap();
    let d = resolve(&e, "d").unwrap();
    let attr = e.link(ino, d, b"b").unwrap();
    assert_eq!((attr.ino, attr.nlink), (ino, 2));
    assert_eq!(nlink(&e, "a"), 2);
    assert_eq!(resolve(&e, "d/b").unwrap(), ino);
    let after = e.usage().unwrap();
    assert_eq!((after.bytes, after.files, after.inodes), (before.bytes, before.files, before.inodes));
    assert_eq!(after.links, before.links + 1);
    // A write through one name is read through the other.
    write_file(&e, "d/b", b"changed").unwrap();
    assert_eq!(read_file(&e, "a").unwrap(), b"changed");
    assert_eq!(e.usage().unwrap().bytes, before.bytes - 4);
    assert_consistent(&e);
}

#[test]
fn unlinking_any_name_keeps_the_others_until_the_last() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    write_file(&e, "first", &[7u8; 300]).unwrap();
    let ino = resolve(&e, "first").unwrap();
    e.link(ino, ROOT_INO, b"second").unwrap();
    e.link(ino, ROOT_INO, b"third").unwrap();
    assert_eq!(nlink(&e, "third"), 3);
    let ctime = e.getattr(ino).unwrap().ctime;
    // The first name goes: the file lives on under the others.
    e.unlink(ROOT_INO, b"first").unwrap();
    assert_eq!(e.lookup(ROOT_INO, b"first").unwrap_err().to_string(), EngineError::NotFound.to_string());
    assert_eq!(nlink(&e, "second"), 2);
    assert!(e.getattr(ino).unwrap().ctime >= ctime);
    assert_eq!(read_file(&e, "third").unwrap(), vec![7u8; 300]);
    e.unlink(ROOT_INO, b"third").unwrap();
    assert_eq!(nlink(&e, "second"), 1);
    assert_eq!(read_file(&e, "second").unwrap(), vec![7u8; 300]);
    assert_consistent(&e);
    // The last name takes the file and its bytes.
    e.unlink(ROOT_INO, b"second").unwrap();
    assert!(matches!(e.getattr(ino), Err(EngineError::NotFound)));
    let u = e.usage().unwrap();
    assert_eq!((u.bytes, u.files, u.inodes, u.links), (0, 0, 0, 0));
    assert_consistent(&e);
}

#[test]
fn an_open_file_outlives_its_last_name() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    write_file(&e, "a", b"kept").unwrap();
    let ino = resolve(&e, "a").unwrap();
    e.link(ino, ROOT_INO, b"b").unwrap();
    let opened = e.open(ino, OpenFlags::default()).unwrap();
    e.unlink(ROOT_INO, b"a").unwrap();
    e.unlink(ROOT_INO, b"b").unwrap();
    assert_eq!(e.getattr(ino).unwrap().nlink, 0);
    assert_eq!(e.read(ino, opened.fh, 0, 100).unwrap(), b"kept");
    // An unlinked inode cannot get a name back through link(2).
    assert!(matches!(e.link(ino, ROOT_INO, b"c"), Err(EngineError::NotFound)));
    e.release(ino, opened.fh).unwrap();
    assert!(matches!(e.getattr(ino), Err(EngineError::NotFound)));
    assert_eq!(e.usage().unwrap().bytes, 0);
    assert_consistent(&e);
}

#[test]
fn renaming_a_linked_name_moves_only_that_name() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let d = resolve(&e, "d").unwrap();
    write_file(&e, "a", b"x").unwrap();
    write_file(&e, "other", b"y").unwrap();
    let ino = resolve(&e, "a").unwrap();
    e.link(ino, ROOT_INO, b"b").unwrap();
    // A further name moves; the first stays.
    e.rename(ROOT_INO, b"b", d, b"moved", RenameMode::Replace).unwrap();
    assert_eq!(resolve(&e, "d/moved").unwrap(), ino);
    assert_eq!(resolve(&e, "a").unwrap(), ino);
    // The first name moves over another file, which goes.
    e.rename(ROOT_INO, b"a", ROOT_INO, b"other", RenameMode::Replace).unwrap();
    assert_eq!(resolve(&e, "other").unwrap(), ino);
    assert_eq!(nlink(&e, "other"), 2);
    // Renaming one name of a file onto another name of the same file changes nothing (POSIX).
    e.rename(d, b"moved", ROOT_INO, b"other", RenameMode::Replace).unwrap();
    assert_eq!(resolve(&e, "d/moved").unwrap(), ino);
    assert_eq!(nlink(&e, "other"), 2);
    // Exchange a further name with a plain file.
    write_file(&e, "plain", b"z").unwrap();
    let plain = resolve(&e, "plain").unwrap();
    e.rename(d, b"moved", ROOT_INO, b"plain", RenameMode::Exchange).unwrap();
    assert_eq!(resolve(&e, "plain").unwrap(), ino);
    assert_eq!(resolve(&e, "d/moved").unwrap(), plain);
    // Replacing a further name with another file drops one link.
    e.rename(d, b"moved", ROOT_INO, b"plain", RenameMode::Replace).unwrap();
    assert_eq!(nlink(&e, "other"), 1);
    assert_eq!(read_file(&e, "plain").unwrap(), b"z");
    assert_consistent(&e);
}

#[test]
fn links_are_refused_for_directories_existing_names_and_past_the_bounds() {
    let mut settings = Harness::small_blocks().settings;
    settings.max_links_per_file = 3;
    let h = Harness::new(settings);
    let storage = h.storage();
    let e = storage.open_scope(&ScopeId::generate(), Quota { bytes: 1 << 20, inodes: 6 }).unwrap();
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    write_file(&e, "f", b"1").unwrap();
    let f = resolve(&e, "f").unwrap();
    let d = resolve(&e, "d").unwrap();
    assert!(matches!(e.link(d, ROOT_INO, b"d2"), Err(EngineError::NotPermitted(_))));
    assert!(matches!(e.link(f, ROOT_INO, b"d"), Err(EngineError::Exists)));
    assert!(matches!(e.link(f, f, b"x"), Err(EngineError::NotDir)));
    assert!(matches!(e.link(f, ROOT_INO, b"."), Err(EngineError::InvalidName(_))));
    e.link(f, ROOT_INO, b"f2").unwrap();
    e.link(f, ROOT_INO, b"f3").unwrap();
    assert!(matches!(e.link(f, ROOT_INO, b"f4"), Err(EngineError::TooManyLinks)));
    // Names count against the inode quota: 2 inodes + 2 links of 6; two more names fill it.
    write_file(&e, "g", b"2").unwrap();
    let g = resolve(&e, "g").unwrap();
    e.link(g, ROOT_INO, b"g2").unwrap();
    assert!(matches!(e.link(g, ROOT_INO, b"g3"), Err(EngineError::QuotaExceeded("inodes"))));
    assert!(matches!(e.mkdir(ROOT_INO, b"e", 0o755, OWNER), Err(EngineError::QuotaExceeded("inodes"))));
    assert_eq!(e.statfs().unwrap().free_inodes, 0);
    assert_consistent(&e);
}

#[test]
fn paged_listings_return_every_name_once_and_directories_with_links_are_not_empty() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    e.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let d = resolve(&e, "d").unwrap();
    write_file(&e, "src", b"s").unwrap();
    let src = resolve(&e, "src").unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..7 {
        let name = format!("file{i}");
        write_file(&e, &format!("d/{name}"), b"f").unwrap();
        expected.insert(name.clone(), resolve(&e, &format!("d/{name}")).unwrap());
        let link = format!("link{i}");
        e.link(src, d, link.as_bytes()).unwrap();
        expected.insert(link, src);
    }
    let mut seen = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = e.readdir_page(d, after, 3).unwrap();
        for entry in &page {
            let name = String::from_utf8(entry.name.clone()).unwrap();
            assert!(seen.insert(name.clone(), entry.attr.ino).is_none(), "{name} listed twice");
        }
        match page.last() {
            Some(last) if page.len() == 3 => after = last.cursor,
            _ => break,
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(e.readdir(d).unwrap().len(), 14);
    // Only links left in a directory: not empty; a recursive delete takes them.
    for i in 0..7 {
        e.unlink(d, format!("file{i}").as_bytes()).unwrap();
    }
    assert!(matches!(e.rmdir(ROOT_INO, b"d"), Err(EngineError::NotEmpty)));
    assert_eq!(nlink(&e, "src"), 8);
    e.remove_path("/d", true).unwrap();
    assert_eq!(nlink(&e, "src"), 1);
    assert_consistent(&e);
}

#[test]
fn device_nodes_are_inert_inodes_that_keep_their_number() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let id = ScopeId::generate();
    let e = storage.open_scope(&id, big_quota()).unwrap();
    let rdev = (8 << 8) | 1;
    let c = e.mknod(ROOT_INO, b"chr", FileKind::CharDevice, 0o600, rdev, OWNER).unwrap();
    let b = e.mknod(ROOT_INO, b"blk", FileKind::BlockDevice, 0o640, 7, OWNER).unwrap();
    assert_eq!((c.kind, c.rdev, c.size), (FileKind::CharDevice, rdev, 0));
    assert_eq!((b.kind, b.rdev), (FileKind::BlockDevice, 7));
    // No content: opening one as a file is refused by the engine (the kernel never asks: nodev).
    assert!(e.open(c.ino, OpenFlags::default()).is_err());
    e.link(c.ino, ROOT_INO, b"chr2").unwrap();
    assert_eq!(e.getattr(c.ino).unwrap().nlink, 2);
    assert_eq!(e.usage().unwrap().bytes, 0);
    drop(e);
    // Kept across a restart.
    let e = h.storage().open_scope(&id, big_quota()).unwrap();
    let again = e.lookup(ROOT_INO, b"chr2").unwrap();
    assert_eq!((again.kind, again.rdev, again.nlink), (FileKind::CharDevice, rdev, 2));
    assert_consistent(&e);
}

#[test]
fn an_unnamed_tmpfile_can_be_named_once_and_is_gone_if_never_named() {
    let h = Harness::small_blocks();
    let e = new_scope(&h.storage());
    let flags = OpenFlags { write: true, truncate: false, exclusive: false };
    let (attr, opened) = e.tmpfile(ROOT_INO, 0o600, flags, OWNER).unwrap();
    assert_eq!(attr.nlink, 0);
    e.write(attr.ino, opened.fh, 0, b"tmp").unwrap();
    assert!(e.readdir(ROOT_INO).unwrap().is_empty());
    e.link(attr.ino, ROOT_INO, b"named").unwrap();
    assert_eq!(nlink(&e, "named"), 1);
    e.release(attr.ino, opened.fh).unwrap();
    assert_eq!(read_file(&e, "named").unwrap(), b"tmp");
    // An inode unlinked while open is no tmpfile: link(2) cannot bring it back.
    let ino = resolve(&e, "named").unwrap();
    let again = e.open(ino, OpenFlags::default()).unwrap();
    e.unlink(ROOT_INO, b"named").unwrap();
    assert!(matches!(e.link(ino, ROOT_INO, b"back"), Err(EngineError::NotFound)));
    e.release(ino, again.fh).unwrap();
    // Never named: deleted at its last release.
    let (scratch, opened) = e.tmpfile(ROOT_INO, 0o600, flags, OWNER).unwrap();
    e.write(scratch.ino, opened.fh, 0, b"scratch").unwrap();
    e.release(scratch.ino, opened.fh).unwrap();
    assert!(matches!(e.getattr(scratch.ino), Err(EngineError::NotFound)));
    assert_eq!(e.usage().unwrap(), Usage::default());
    write_file(&e, "file", b"f").unwrap();
    assert!(matches!(e.tmpfile(resolve(&e, "file").unwrap(), 0o600, flags, OWNER), Err(EngineError::NotDir)));
    assert_consistent(&e);
}
