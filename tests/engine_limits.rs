//! Engine bounds and accounting from the security review: staging counted per file on disk and per
//! scope (H1), quota arithmetic at extreme sizes (L2), symlink targets in the byte quota (L4), path
//! depth/length at creation and iterative deep walks (M2), private data directories (L5), and API
//! paths naming exactly the listed entry (L8); a create at the inode quota waits for a closed,
//! unlinked file's release (which the kernel sends after `close()` returns).

pub mod engine_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;

/// Opens `path` for writing (created if missing), runs `f` on the handle, then closes it (a commit).
fn with_open(e: &ScopeEngine, path: &str, f: impl FnOnce(Ino, Fh) -> EngineResult<()>) -> EngineResult<()> {
    let (parent, name) = split(e, path)?;
    let flags = OpenFlags { write: true, truncate: false, exclusive: false };
    let (attr, opened) = e.create(parent, name.as_bytes(), 0o644, flags, OWNER)?;
    let r = f(attr.ino, opened.fh);
    e.release(attr.ino, opened.fh)?;
    r
}

/// One byte at the end of each of `n` blocks: `n` identical sparse blocks.
fn identical_blocks(e: &ScopeEngine, path: &str, n: u64, bs: u64) -> EngineResult<()> {
    with_open(e, path, |ino, fh| {
        for i in 1..=n {
            e.write(ino, fh, i * bs - 1, b"x")?;
        }
        Ok(())
    })
}

#[test]
fn identical_blocks_leave_no_staging_behind() {
    let mut settings = Harness::small_blocks().settings;
    settings.staging_max_bytes = 64 * 64;
    let h = Harness::new(settings);
    let storage = h.storage();
    let e = new_scope(&storage);
    // One commit with 50 identical blocks: one staged file, counted once.
    identical_blocks(&e, "z", 50, 64).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert_eq!(storage.staging_bytes(), 0, "staging returns to 0 once the block is uploaded");
    assert_eq!(e.staging_bytes(), 0);
    // So another scope still has the whole budget (a leak of 49 blocks would leave it 15).
    let other = new_scope(&storage);
    let distinct: Vec<u8> = (0..64 * 20).map(|i| (i / 64) as u8).collect();
    write_file(&other, "f", &distinct).unwrap();
    assert!(other.wait_uploads(Duration::from_secs(10)));

    // Across commits while the block is still staged (the store is down): still one file.
    h.store.set_unavailable(true);
    identical_blocks(&e, "a", 10, 64).unwrap();
    identical_blocks(&e, "b", 10, 64).unwrap();
    write_file(&e, "c", &[7u8; 64 * 3]).unwrap();
    write_file(&e, "d", &[7u8; 64 * 3]).unwrap();
    // '…x' was uploaded already (its sealed copies are dropped); the 7s block is staged once.
    assert_eq!(storage.staging_bytes(), 64);
    assert_eq!(e.staging_bytes(), 64);
    h.store.set_unavailable(false);
    assert!(e.wait_uploads(Duration::from_secs(20)));
    assert_eq!(storage.staging_bytes(), 0);

    for name in ["z", "a", "b", "c", "d"] {
        e.unlink(ROOT_INO, name.as_bytes()).unwrap();
    }
    e.collect_garbage(Duration::ZERO).unwrap();
    assert_eq!(storage.staging_bytes(), 0);
    assert_eq!(e.usage().unwrap(), Usage::default());
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn one_scope_cannot_hold_the_whole_staging_budget() {
    let mut settings = Harness::small_blocks().settings;
    settings.staging_max_bytes = 64 * 100;
    settings.staging_max_bytes_per_scope = 64 * 10;
    let h = Harness::new(settings);
    let storage = h.storage();
    let (a, b) = (new_scope(&storage), new_scope(&storage));
    h.store.set_unavailable(true); // nothing leaves staging
    let distinct: Vec<u8> = (0..64 * 20).map(|i| (i / 64) as u8).collect();
    assert!(matches!(write_file(&a, "big", &distinct), Err(EngineError::NoSpace)));
    assert!(a.staging_bytes() <= 64 * 10);
    write_file(&b, "ok", &distinct[..64 * 5]).unwrap();
    assert_eq!(b.staging_bytes(), 64 * 5);
    let refused = scopefs::limits::refusals().into_iter().find(|(l, _)| *l == "staging_per_scope").unwrap().1;
    assert!(refused >= 1);
    h.store.set_unavailable(false);
}

#[test]
fn extreme_sizes_are_refused_and_the_scope_stays_usable() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = storage.open_scope(&ScopeId::generate(), Quota { bytes: 1000, inodes: 10 }).unwrap();
    write_file(&e, "a", &[1; 10]).unwrap();
    write_file(&e, "b", b"").unwrap();
    let b = resolve(&e, "b").unwrap();
    let size = |s: u64| SetAttr { size: Some(s), ..Default::default() };
    assert!(matches!(e.setattr(b, &size(i64::MAX as u64)), Err(EngineError::QuotaExceeded("bytes"))));
    assert!(matches!(e.setattr(b, &size(u64::MAX)), Err(EngineError::TooLarge)));
    assert!(matches!(e.setattr(b, &size(1 << 63)), Err(EngineError::TooLarge)));
    let far = with_open(&e, "b", |ino, fh| e.write(ino, fh, u64::MAX - 1, b"x").map(|_| ()));
    assert!(matches!(far, Err(EngineError::TooLarge)), "{far:?}");
    assert_eq!(e.usage().unwrap().bytes, 10);
    assert!(e.consistency_problems().unwrap().is_empty());
    write_file(&e, "c", &[2; 990]).unwrap();
    assert!(matches!(write_file(&e, "d", b"x"), Err(EngineError::QuotaExceeded("bytes"))));

    // A quota beyond what SQLite stores is capped: usage never leaves the integers.
    let huge = storage.open_scope(&ScopeId::generate(), Quota { bytes: u64::MAX, inodes: 10 }).unwrap();
    write_file(&huge, "x", b"").unwrap();
    write_file(&huge, "y", b"").unwrap();
    let x = resolve(&huge, "x").unwrap();
    huge.setattr(x, &size(i64::MAX as u64)).unwrap();
    assert_eq!(huge.usage().unwrap().bytes, i64::MAX as u64);
    let y = resolve(&huge, "y").unwrap();
    assert!(matches!(huge.setattr(y, &size(1)), Err(EngineError::QuotaExceeded("bytes"))));
    huge.unlink(ROOT_INO, b"x").unwrap();
    write_file(&huge, "y", b"again").unwrap();
    assert_eq!(huge.usage().unwrap().bytes, 5);
    assert!(huge.consistency_problems().unwrap().is_empty());
}

#[test]
fn concurrent_writers_never_commit_past_the_byte_quota() {
    // Usage and pending growth are read under one lock: commits moving bytes from one to the other
    // cannot make a quota check undercount. (The race is narrow; this checks the invariant under
    // load rather than reproducing a specific interleaving.)
    let h = Harness::small_blocks();
    let storage = h.storage();
    let quota = Quota { bytes: 64 * 20, inodes: 1000 };
    let e = storage.open_scope(&ScopeId::generate(), quota).unwrap();
    std::thread::scope(|s| {
        for t in 0..6 {
            let e = &e;
            s.spawn(move || {
                let mut mine = Vec::new();
                for i in 0..60 {
                    let name = format!("t{t}-{i}");
                    match write_file(e, &name, &[t as u8; 64 * 3]) {
                        Ok(()) => mine.push(name),
                        Err(EngineError::QuotaExceeded(_)) => {
                            let _ = e.unlink(ROOT_INO, format!("t{t}-{i}").as_bytes());
                        }
                        Err(other) => panic!("{other:?}"),
                    }
                    if mine.len() > 1 {
                        e.unlink(ROOT_INO, mine.remove(0).as_bytes()).unwrap();
                    }
                    assert!(e.usage().unwrap().bytes <= quota.bytes, "committed past the quota");
                }
            });
        }
    });
    assert!(e.usage().unwrap().bytes <= quota.bytes);
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn a_create_at_the_inode_quota_waits_for_an_unlinked_files_release() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = storage.open_scope(&ScopeId::generate(), Quota { bytes: 1 << 20, inodes: 1 }).unwrap();
    let flags = OpenFlags { write: true, truncate: false, exclusive: false };
    // A program closed `a` and unlinked it; the kernel's release of its handle is still on its way.
    let (a, a_fh) = e.create(ROOT_INO, b"a", 0o644, flags, OWNER).unwrap();
    e.write(a.ino, a_fh.fh, 0, b"x").unwrap();
    e.flush(a.ino, a_fh.fh).unwrap();
    e.unlink(ROOT_INO, b"a").unwrap();
    std::thread::scope(|s| {
        let creator = s.spawn(|| e.create(ROOT_INO, b"b", 0o644, flags, OWNER));
        while e.inode_quota_waits() == 0 && !creator.is_finished() {
            std::thread::yield_now();
        }
        e.release(a.ino, a_fh.fh).unwrap();
        let (b, b_fh) = creator.join().unwrap().expect("the create goes on once the release deleted the inode");
        e.release(b.ino, b_fh.fh).unwrap();
    });
    assert_eq!(e.inode_quota_waits(), 1, "the create waited for the release");
    // An unlinked file held open for good still counts: a create is refused once the grace is over.
    let b = e.lookup(ROOT_INO, b"b").unwrap().ino;
    let b_fh = e.open(b, flags).unwrap();
    e.unlink(ROOT_INO, b"b").unwrap();
    assert!(matches!(e.create(ROOT_INO, b"c", 0o644, flags, OWNER), Err(EngineError::QuotaExceeded("inodes"))));
    assert_eq!(e.inode_quota_waits(), 2);
    e.release(b, b_fh.fh).unwrap();
    let (c, c_fh) = e.create(ROOT_INO, b"c", 0o644, flags, OWNER).unwrap();
    e.release(c.ino, c_fh.fh).unwrap();
    assert_eq!(e.inode_quota_waits(), 2, "nothing unlinked was open: refused or not, nobody waited");
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn symlink_targets_count_toward_the_byte_quota() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = storage.open_scope(&ScopeId::generate(), Quota { bytes: 100, inodes: 10 }).unwrap();
    let target = vec![b'a'; 60];
    e.symlink(ROOT_INO, b"s1", &target, OWNER).unwrap();
    assert_eq!(e.usage().unwrap().bytes, 60);
    assert!(matches!(e.symlink(ROOT_INO, b"s2", &target, OWNER), Err(EngineError::QuotaExceeded("bytes"))));
    assert!(matches!(write_file(&e, "f", &[0; 50]), Err(EngineError::QuotaExceeded("bytes"))));
    write_file(&e, "f", &[0; 40]).unwrap();
    assert!(e.consistency_problems().unwrap().is_empty(), "the recount charges symlinks too");
    e.unlink(ROOT_INO, b"s1").unwrap();
    assert_eq!(e.usage().unwrap().bytes, 40);
    e.symlink(ROOT_INO, b"s2", &target, OWNER).unwrap();
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn upgraded_databases_charge_existing_symlinks() {
    let h = Harness::small_blocks();
    let scope = ScopeId::generate();
    drop(h.storage().open_scope(&scope, big_quota()).unwrap());
    // What a database written before symlinks were charged (schema 2) looks like: a 60-byte
    // symlink and an empty file, with only the file's (zero) bytes in the usage counter.
    let dir = h.data_dir().join("scopes").join(scope.as_str());
    for f in ["meta.sqlite3", "meta.sqlite3-wal", "meta.sqlite3-shm"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let mut conn = rusqlite::Connection::open(dir.join("meta.sqlite3")).unwrap();
    scopefs::migrate::apply(&mut conn, &scopefs::migrate::SCOPE_META[..2]).unwrap();
    conn.execute_batch(&format!(
        "INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
             VALUES (1, NULL, NULL, 'dir', 493, 0, 0, 0, 0, 0);
         INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns, symlink_target)
             VALUES (2, 1, X'73', 'symlink', 511, 0, 0, 60, 0, 0, 0, X'{}');
         INSERT INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
             VALUES (3, 1, X'66', 'file', 420, 0, 0, 0, 0, 0);
         UPDATE usage SET files = 1, bytes = 0, inodes = 2;",
        "61".repeat(60)
    ))
    .unwrap();
    drop(conn);
    let e = h.storage().open_scope(&scope, big_quota()).unwrap();
    assert_eq!(e.usage().unwrap().bytes, 60);
    assert!(e.consistency_problems().unwrap().is_empty(), "{:?}", e.consistency_problems());
    write_file(&e, "f", &[1; 10]).unwrap();
    e.unlink(ROOT_INO, b"s").unwrap();
    assert_eq!(e.usage().unwrap().bytes, 10);
}

fn bounded(depth: u32, bytes: u32, walk: u64) -> Harness {
    let mut settings = Harness::small_blocks().settings;
    settings.max_path_depth = depth;
    settings.max_path_bytes = bytes;
    settings.max_walk_entries = walk;
    Harness::new(settings)
}

#[test]
fn paths_deeper_or_longer_than_the_bounds_cannot_be_created_or_moved_in() {
    let h = bounded(4, 40, 1000);
    let storage = h.storage();
    let e = new_scope(&storage);
    let d4 = e.make_dirs("a/b/c/d", OWNER).unwrap();
    let too_long = |r: EngineResult<Attr>| matches!(r, Err(EngineError::PathTooLong));
    assert!(too_long(e.mkdir(d4, b"e", 0o755, OWNER)));
    assert!(too_long(e.symlink(d4, b"s", b"x", OWNER)));
    assert!(too_long(e.mknod(d4, b"p", FileKind::Fifo, 0o644, 0, OWNER)));
    let flags = OpenFlags { write: true, ..Default::default() };
    assert!(matches!(e.create(d4, b"f", 0o644, flags, OWNER), Err(EngineError::PathTooLong)));
    assert!(matches!(e.make_dirs("a/b/c/d/e", OWNER), Err(EngineError::PathTooLong)));
    let write = |p: &str| e.write_path(p, &mut &b"x"[..], 10, WriteMode::Replace, OWNER);
    assert!(too_long(write("a/b/c/d/f")));
    write("a/b/c/f4").unwrap(); // depth 4 is allowed
                                // Bytes: 30 + '/' + 10 = 41 > 40.
    let long = "l".repeat(30);
    let l = e.mkdir(ROOT_INO, long.as_bytes(), 0o755, OWNER).unwrap();
    assert!(too_long(e.mkdir(l.ino, &[b'm'; 10], 0o755, OWNER)));
    e.mkdir(l.ino, &[b'm'; 9], 0o755, OWNER).unwrap();

    // Moving a directory: everything below it must fit where it lands.
    e.make_dirs("m/n", OWNER).unwrap();
    let c = resolve(&e, "a/b/c").unwrap();
    let b = resolve(&e, "a/b").unwrap();
    let mv = |parent, name: &str| e.rename(ROOT_INO, b"m", parent, name.as_bytes(), RenameMode::NoReplace);
    assert!(matches!(mv(c, "m"), Err(EngineError::PathTooLong)), "a/b/c/m/n is 5 deep");
    assert!(resolve(&e, "m/n").is_ok(), "the refused move changed nothing");
    mv(b, "m").unwrap();
    assert!(resolve(&e, "a/b/m/n").is_ok());
    // Renaming in place (no deeper) is always fine.
    e.rename(b, b"m", b, b"m2", RenameMode::NoReplace).unwrap();
    // API paths beyond the bounds are refused before any lookup.
    assert!(matches!(e.resolve_path("a/b/c/d/e/f"), Err(EngineError::PathTooLong)));
    assert!(matches!(e.resolve_path(&"x".repeat(41)), Err(EngineError::PathTooLong)));
}

/// A new scope holding a chain of `depth` directories `d/d/…/d` with a file at the bottom, written
/// directly into its metadata (a legacy tree made before the depth bound existed) while no engine
/// has the database open.
fn scope_with_chain(storage: &Arc<Storage>, h: &Harness, depth: usize) -> Arc<ScopeEngine> {
    let id = ScopeId::generate();
    drop(storage.open_scope(&id, big_quota()).unwrap());
    let db = h.data_dir().join("scopes").join(id.as_str()).join("meta.sqlite3");
    let mut conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    let tx = conn.transaction().unwrap();
    let mut parent: i64 = 1;
    for i in 0..=depth {
        let (name, kind) = if i == depth { ("f", "file") } else { ("d", "dir") };
        tx.execute(
            "INSERT INTO inodes (parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
             VALUES (?1, ?2, ?3, 493, 0, 0, 0, 0, 0)",
            rusqlite::params![parent, name.as_bytes(), kind],
        )
        .unwrap();
        parent = tx.last_insert_rowid();
    }
    tx.execute("UPDATE usage SET inodes = inodes + ?1, files = files + 1 WHERE id = 1", [depth as i64 + 1]).unwrap();
    tx.commit().unwrap();
    drop(conn);
    storage.open_scope(&id, big_quota()).unwrap()
}

/// Runs `f` on a thread with a small stack: a walk that recursed per level would overflow it.
fn small_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| std::thread::Builder::new().stack_size(512 * 1024).spawn_scoped(s, f).unwrap().join())
        .unwrap()
}

#[test]
fn deep_chains_are_listed_and_removed_without_recursion() {
    let h = bounded(512, 64 * 1024, 100_000);
    let storage = h.storage();
    let depth = 5000;
    let e = scope_with_chain(&storage, &h, depth);
    let listed = small_stack(|| e.list_path("", true)).unwrap();
    assert_eq!(listed.len(), depth + 1);
    small_stack(|| e.remove_path("d", true)).unwrap();
    assert!(e.readdir(ROOT_INO).unwrap().is_empty());
    assert_eq!(e.usage().unwrap(), Usage::default());
    assert!(e.consistency_problems().unwrap().is_empty());
}

#[test]
fn walks_past_the_entry_bound_are_refused_before_any_work() {
    let h = bounded(512, 16 * 1024, 100);
    let storage = h.storage();
    let e = scope_with_chain(&storage, &h, 150);
    assert!(matches!(e.list_path("", true), Err(EngineError::TooManyEntries)));
    assert!(matches!(e.remove_path("d", true), Err(EngineError::TooManyEntries)));
    assert_eq!(e.usage().unwrap().inodes, 151, "nothing was removed");
    // Within the bound both work.
    let sub = (0..100).map(|_| "d").collect::<Vec<_>>().join("/");
    assert_eq!(e.list_path(&sub, true).unwrap().len(), 51);
    e.remove_path(&sub, true).unwrap();
    assert_eq!(e.usage().unwrap().inodes, 99);
    let stats = scopefs::limits::refusals().into_iter().find(|(l, _)| *l == "walk_entries").unwrap().1;
    assert!(stats >= 2);
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

#[test]
fn data_directories_and_files_are_private() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    let id = e.scope_id().as_str().to_string();
    write_file(&e, "up", &[3u8; 100]).unwrap();
    assert!(e.wait_uploads(Duration::from_secs(10)));
    assert_eq!(read_file(&e, "up").unwrap(), vec![3u8; 100]);
    h.store.set_unavailable(true);
    write_file(&e, "staged", &[4u8; 10]).unwrap();
    let d = h.data_dir();
    for dir in [
        d.join("staging"),
        d.join("staging").join(&id),
        d.join("staging").join(&id).join("blocks"),
        d.join("staging").join(&id).join("open"),
        d.join("cache"),
        d.join("scopes"),
        d.join("scopes").join(&id),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    let files =
        |dir: std::path::PathBuf| std::fs::read_dir(dir).unwrap().map(|f| f.unwrap().path()).collect::<Vec<_>>();
    let mut all = files(d.join("staging").join(&id).join("blocks"));
    // The cache holds small blocks in its pack database (and its WAL).
    all.extend(files(d.join("cache")).into_iter().filter(|f| f.is_file()));
    all.extend(files(d.join("scopes").join(&id)));
    assert!(all.len() >= 4, "{all:?}");
    for f in all {
        assert_eq!(mode(&f) & 0o077, 0, "{}", f.display());
    }
    h.store.set_unavailable(false);
}

#[test]
fn api_paths_name_exactly_the_listed_entry() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    // Created through FUSE: two distinct names whose NFC forms are equal.
    write_file(&e, "Key.txt", b"ascii").unwrap();
    write_file(&e, "\u{212A}ey.txt", b"kelvin").unwrap();
    let listed: Vec<String> = e.list_path("", false).unwrap().into_iter().map(|p| p.path).collect();
    assert_eq!(listed.len(), 2);
    let kelvin = scopefs::vpath::normalize("\u{212A}ey.txt").unwrap();
    assert_eq!(e.read_path(&kelvin, 0, 100).unwrap(), b"kelvin");
    e.remove_path(&kelvin, false).unwrap();
    assert_eq!(read_file(&e, "Key.txt").unwrap(), b"ascii", "Key.txt is untouched");
    assert!(matches!(e.read_path(&kelvin, 0, 100), Err(EngineError::NotFound)));
    assert!(matches!(e.remove_path(&kelvin, false), Err(EngineError::NotFound)));
    assert_eq!(read_file(&e, "Key.txt").unwrap(), b"ascii");
}

/// Creates `n` empty files under a chain of `depth` directories with 200-byte names; the chain's path.
fn files_under_long_prefix(e: &ScopeEngine, depth: usize, n: usize) -> String {
    let prefix = (0..depth).map(|i| format!("{i}{}", "d".repeat(199))).collect::<Vec<_>>().join("/");
    let dir = e.make_dirs(&prefix, OWNER).unwrap();
    let flags = OpenFlags { write: true, truncate: false, exclusive: true };
    for i in 0..n {
        let (attr, opened) = e.create(dir, format!("{i:06}").as_bytes(), 0o644, flags, OWNER).unwrap();
        e.release(attr.ino, opened.fh).unwrap();
    }
    prefix
}

/// Review N2: a listing is bounded by the bytes it builds, not only its entry count: 400 files
/// under a 1.6 KB prefix (well within max_walk_entries and max_path_bytes) build ~700 KB of
/// paths, so with max_listing_bytes = 256 KiB both a recursive listing and a listing of that
/// directory alone are refused (ListingTooLarge, counted under listing_bytes) and hold nothing
/// after; a small directory is still listed.
#[test]
fn a_listing_is_bounded_by_the_bytes_it_builds() {
    let mut settings = Harness::small_blocks().settings;
    settings.max_listing_bytes = 256 * 1024;
    let h = Harness::new(settings);
    let storage = h.storage();
    let e = new_scope(&storage);
    let prefix = files_under_long_prefix(&e, 8, 400);
    e.make_dirs("small", OWNER).unwrap();
    let before = scopefs::limits::refusals().into_iter().find(|(l, _)| *l == "listing_bytes").unwrap().1;
    assert!(matches!(e.list_path("", true), Err(EngineError::ListingTooLarge)));
    assert!(matches!(e.list_path(&prefix, false), Err(EngineError::ListingTooLarge)));
    let after = scopefs::limits::refusals().into_iter().find(|(l, _)| *l == "listing_bytes").unwrap().1;
    assert!(after >= before + 2, "refusals counted: {before} -> {after}");
    assert_eq!(storage.listing_bytes_held(), 0, "a refused listing holds nothing");
    assert_eq!(e.list_path("", false).unwrap().len(), 2);
}

/// Listings held at once share their scope's share and the daemon's budget: a scope holding its
/// share (two listings) gets `Busy` for one more while another scope still lists; when the daemon's budget is
/// held every scope gets `Busy`; dropping a listing gives its bytes back.
#[test]
fn listings_held_at_once_share_the_scopes_and_the_daemons_listing_memory() {
    let one = {
        let h = Harness::new(Harness::small_blocks().settings);
        let storage = h.storage();
        let e = new_scope(&storage);
        let prefix = files_under_long_prefix(&e, 2, 50);
        let held = e.list_path(&prefix, false).unwrap();
        assert_eq!(held.len(), 50);
        storage.listing_bytes_held()
    };
    assert!(one > 50 * 400, "each entry is charged its path: {one}");
    let mut settings = Harness::small_blocks().settings;
    // Room for a listing's transient bytes (the directory read, ~a fifth of it) at its peak.
    (settings.max_listing_bytes, settings.listing_memory_per_scope_bytes) = (2 * one, 2 * one + one / 2);
    settings.listing_memory_max_bytes = 3 * one + one / 2;
    let h = Harness::new(settings);
    let storage = h.storage();
    let (a, b) = (new_scope(&storage), new_scope(&storage));
    let (pa, pb) = (files_under_long_prefix(&a, 2, 50), files_under_long_prefix(&b, 2, 50));
    let a1 = a.list_path(&pa, false).unwrap();
    let a2 = a.list_path(&pa, false).unwrap();
    assert!(matches!(a.list_path(&pa, false), Err(EngineError::ScopeBusy(_))), "a's share is held");
    let b1 = b.list_path(&pb, false).unwrap();
    assert_eq!(storage.listing_bytes_held(), 3 * one);
    assert!(matches!(b.list_path(&pb, false), Err(EngineError::Busy(_))), "the daemon's budget is held");
    drop(a1);
    assert_eq!(b.list_path(&pb, false).unwrap().len(), 50, "given back when dropped");
    drop((a2, b1));
    assert_eq!(storage.listing_bytes_held(), 0);
}

/// A directory of more than two listing pages (4,096 names each) is listed whole, each name once,
/// the hard links (read after the first names) included.
#[test]
fn a_directory_of_several_pages_is_listed_whole() {
    let h = Harness::new(Harness::small_blocks().settings);
    let storage = h.storage();
    let e = new_scope(&storage);
    let prefix = files_under_long_prefix(&e, 1, 9000);
    let dir = resolve(&e, &prefix).unwrap();
    for i in 0..5 {
        let target = resolve(&e, &format!("{prefix}/{i:06}")).unwrap();
        e.link(target, dir, format!("link-{i}").as_bytes()).unwrap();
    }
    let names: Vec<String> = e.list_path(&prefix, false).unwrap().iter().map(|p| p.path.clone()).collect();
    let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!((names.len(), distinct.len()), (9005, 9005));
    assert!(names.contains(&format!("{prefix}/link-4")) && names.contains(&format!("{prefix}/008999")));
    assert_eq!(e.list_path("", true).unwrap().len(), 9006);
}

/// Review N6: while a file is open, a dirty block's working file is charged the pages written into
/// it, not its length up to the last byte: scope A holding a file open with one byte at the end of
/// each of 32 blocks of 256 KiB (8 MiB of length) holds 32 pages of staging, and scope B keeps its
/// room (before, A's fifth byte was refused and A held its whole share). A close charges each block its whole length (as every staged block
/// is charged until it is uploaded): refused with `NoSpace` when staging has no room for that,
/// with everything A was charged given back; within room, the file commits, reads back and its
/// staging drains.
#[test]
fn sparse_files_held_open_are_charged_by_the_pages_written() {
    const BS: u64 = 256 * 1024;
    const PAGE: u64 = 4096;
    let settings = StorageSettings {
        block_size: BS,
        inline_block_max_bytes: 0,
        staging_max_bytes: 2 << 20,
        staging_max_bytes_per_scope: 1 << 20,
        ..Harness::small_blocks().settings
    };
    let h = Harness::new(settings);
    let storage = h.storage();
    let (a, b) = (new_scope(&storage), new_scope(&storage));
    let flags = OpenFlags { write: true, truncate: false, exclusive: false };

    let (attr, opened) = a.create(ROOT_INO, b"sparse", 0o644, flags, OWNER).unwrap();
    for i in 1..=32 {
        a.write(attr.ino, opened.fh, i * BS - 1, b"x").unwrap();
    }
    assert_eq!(a.staging_bytes(), 32 * PAGE, "one page per block written");
    assert_eq!(storage.staging_bytes(), 32 * PAGE);
    write_file(&b, "dense", &vec![7u8; 1 << 20]).unwrap();
    assert!(b.wait_uploads(Duration::from_secs(10)));
    assert_eq!(b.staging_bytes(), 0);

    a.write(attr.ino, opened.fh, 0, b"head").unwrap();
    assert_eq!(a.staging_bytes(), 33 * PAGE);
    // The cut commits the file: one staged block of 100 bytes, charged its length until uploaded.
    a.setattr(attr.ino, &SetAttr { size: Some(100), ..Default::default() }).unwrap();
    assert!(a.wait_uploads(Duration::from_secs(10)));
    assert_eq!(a.staging_bytes(), 0);
    for i in 1..=32 {
        a.write(attr.ino, opened.fh, i * BS - 1, b"y").unwrap();
    }
    assert!(
        matches!(a.release(attr.ino, opened.fh), Err(EngineError::NoSpace)),
        "33 blocks of 256 KiB do not fit a 1 MiB share once sealed"
    );
    assert_eq!(a.staging_bytes(), 0, "a refused close gives back all it was charged");
    assert_eq!(storage.staging_bytes(), 0);

    let (attr, opened) = a.create(ROOT_INO, b"fits", 0o644, flags, OWNER).unwrap();
    for i in 1..=3 {
        a.write(attr.ino, opened.fh, i * BS - 1, &[i as u8]).unwrap();
    }
    assert_eq!(a.staging_bytes(), 3 * PAGE);
    a.release(attr.ino, opened.fh).unwrap();
    let mut want = vec![0u8; 3 * BS as usize];
    for i in 1..=3 {
        want[(i * BS - 1) as usize] = i as u8;
    }
    assert_eq!(read_file(&a, "fits").unwrap(), want);
    assert!(a.wait_uploads(Duration::from_secs(10)));
    assert_eq!((a.staging_bytes(), storage.staging_bytes()), (0, 0));
    assert!(a.consistency_problems().unwrap().is_empty());
}
