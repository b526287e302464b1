//! Acceptance h: random operation sequences driven through the engine (no kernel) agree with a simple
//! in-memory model — hard links included (names share a file; the engine's inodes partition the names
//! exactly as the model's files do); online gc passes anywhere in a sequence change nothing a path shows, and a
//! last one leaves every file intact (`fsck`).

pub mod engine_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use engine_support::*;
use proptest::prelude::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;

/// A name in the model: a file (by number: hard links share one) or a directory.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Node {
    File(u32),
    Dir,
}

/// What a path shows: a file's contents or a directory.
#[derive(Debug, Clone, PartialEq)]
enum Shown {
    File(Vec<u8>),
    Dir,
}

#[derive(Debug, Clone)]
enum Op {
    Create(&'static str),
    Mkdir(&'static str),
    Write(&'static str, u16, Vec<u8>),
    Truncate(&'static str, u16),
    Read(&'static str, u16, u16),
    Rename(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Link(&'static str, &'static str),
    Restart,
    /// An online gc pass (no grace): it changes nothing any path shows.
    Gc,
}

const PATHS: &[&str] = &["a", "b", "x", "y", "x/a", "x/b", "y/a", "x/y", "x/y/a"];

fn path() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(PATHS)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => path().prop_map(Op::Create),
        2 => path().prop_map(Op::Mkdir),
        4 => (path(), 0u16..400, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(p, o, d)| Op::Write(p, o, d)),
        2 => (path(), 0u16..500).prop_map(|(p, n)| Op::Truncate(p, n)),
        2 => (path(), 0u16..500, 0u16..300).prop_map(|(p, o, n)| Op::Read(p, o, n)),
        3 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
        2 => path().prop_map(Op::Unlink),
        1 => path().prop_map(Op::Rmdir),
        2 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => Just(Op::Restart),
        2 => Just(Op::Gc),
    ]
}

/// Error classes compared between model and engine (a missing parent and a parent that is a file agree).
fn class(e: &EngineError) -> &'static str {
    match e {
        EngineError::NotFound | EngineError::NotDir => "missing-or-notdir",
        EngineError::Exists => "exists",
        EngineError::IsDir => "isdir",
        EngineError::NotEmpty => "notempty",
        EngineError::Invalid(_) => "invalid",
        EngineError::NotPermitted(_) => "notpermitted",
        other => panic!("unexpected engine error {other:?}"),
    }
}

type Outcome = Result<Option<Vec<u8>>, &'static str>;

#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    contents: BTreeMap<u32, Vec<u8>>,
    next: u32,
}

fn parent_of(p: &str) -> &str {
    p.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}

impl Model {
    fn dir_ok(&self, d: &str) -> bool {
        d.is_empty() || self.nodes.get(d) == Some(&Node::Dir)
    }

    fn has_children(&self, d: &str) -> bool {
        let prefix = format!("{d}/");
        self.nodes.keys().any(|k| k.starts_with(&prefix))
    }

    fn file_mut(&mut self, p: &str) -> Result<&mut Vec<u8>, &'static str> {
        if !self.dir_ok(parent_of(p)) {
            return Err("missing-or-notdir");
        }
        match self.nodes.get(p) {
            Some(Node::File(id)) => Ok(self.contents.get_mut(id).expect("file contents")),
            Some(Node::Dir) => Err("isdir"),
            None => Err("missing-or-notdir"),
        }
    }

    /// Every path with what it shows.
    fn shown(&self) -> BTreeMap<String, Shown> {
        let show = |n: &Node| match n {
            Node::File(id) => Shown::File(self.contents[id].clone()),
            Node::Dir => Shown::Dir,
        };
        self.nodes.iter().map(|(p, n)| (p.clone(), show(n))).collect()
    }

    /// The names of each file, as sets (hard links share a set).
    fn name_sets(&self) -> BTreeSet<BTreeSet<String>> {
        let mut by_id: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for (p, n) in &self.nodes {
            if let Node::File(id) = n {
                by_id.entry(*id).or_default().insert(p.clone());
            }
        }
        by_id.into_values().collect()
    }

    fn link(&mut self, a: &str, b: &str) -> Outcome {
        if !self.dir_ok(parent_of(a)) || !self.nodes.contains_key(a) || !self.dir_ok(parent_of(b)) {
            return Err("missing-or-notdir");
        }
        let Node::File(id) = self.nodes[a] else { return Err("notpermitted") };
        if self.nodes.contains_key(b) {
            return Err("exists");
        }
        self.nodes.insert(b.to_string(), Node::File(id));
        Ok(None)
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        match op {
            Op::Create(p) | Op::Mkdir(p) => {
                if !self.dir_ok(parent_of(p)) {
                    return Err("missing-or-notdir");
                }
                if self.nodes.contains_key(*p) {
                    return Err("exists");
                }
                let node = if matches!(op, Op::Create(_)) {
                    self.next += 1;
                    self.contents.insert(self.next, Vec::new());
                    Node::File(self.next)
                } else {
                    Node::Dir
                };
                self.nodes.insert(p.to_string(), node);
                Ok(None)
            }
            Op::Write(p, off, data) => {
                let f = self.file_mut(p)?;
                let end = *off as usize + data.len();
                if data.is_empty() {
                    return Ok(None);
                }
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[*off as usize..end].copy_from_slice(data);
                Ok(None)
            }
            Op::Truncate(p, n) => {
                self.file_mut(p)?.resize(*n as usize, 0);
                Ok(None)
            }
            Op::Read(p, off, n) => {
                let f = self.file_mut(p)?;
                let start = (*off as usize).min(f.len());
                let end = (start + *n as usize).min(f.len());
                Ok(Some(f[start..end].to_vec()))
            }
            Op::Unlink(p) => match self.nodes.get(*p) {
                _ if !self.dir_ok(parent_of(p)) => Err("missing-or-notdir"),
                Some(Node::File(_)) => {
                    self.nodes.remove(*p);
                    Ok(None)
                }
                Some(Node::Dir) => Err("isdir"),
                None => Err("missing-or-notdir"),
            },
            Op::Rmdir(p) => match self.nodes.get(*p) {
                _ if !self.dir_ok(parent_of(p)) => Err("missing-or-notdir"),
                Some(Node::Dir) if self.has_children(p) => Err("notempty"),
                Some(Node::Dir) => {
                    self.nodes.remove(*p);
                    Ok(None)
                }
                Some(Node::File(_)) => Err("missing-or-notdir"),
                None => Err("missing-or-notdir"),
            },
            Op::Rename(a, b) => self.rename(a, b),
            Op::Link(a, b) => self.link(a, b),
            Op::Restart | Op::Gc => Ok(None),
        }
    }

    fn rename(&mut self, a: &str, b: &str) -> Outcome {
        if !self.dir_ok(parent_of(a)) || !self.nodes.contains_key(a) || !self.dir_ok(parent_of(b)) {
            return Err("missing-or-notdir");
        }
        let src_dir = self.nodes[a] == Node::Dir;
        if src_dir && b.starts_with(&format!("{a}/")) {
            return Err("invalid");
        }
        // The same name, or two names of one file: nothing happens (POSIX).
        if a == b
            || matches!((self.nodes.get(a), self.nodes.get(b)), (Some(Node::File(x)), Some(Node::File(y))) if x == y)
        {
            return Ok(None);
        }
        match self.nodes.get(b) {
            Some(Node::Dir) if !src_dir => return Err("isdir"),
            Some(Node::File(_)) if src_dir => return Err("missing-or-notdir"),
            Some(Node::Dir) if self.has_children(b) => return Err("notempty"),
            _ => {}
        }
        self.nodes.remove(b);
        let prefix = format!("{a}/");
        let moved: Vec<String> = self.nodes.keys().filter(|k| *k == a || k.starts_with(&prefix)).cloned().collect();
        for k in moved {
            let node = self.nodes.remove(&k).unwrap();
            self.nodes.insert(format!("{b}{}", &k[a.len()..]), node);
        }
        Ok(None)
    }
}

fn run_engine(e: &ScopeEngine, op: &Op) -> Outcome {
    let r: EngineResult<Option<Vec<u8>>> = (|| match op {
        Op::Create(p) => {
            let (parent, name) = split(e, p)?;
            let flags = OpenFlags { write: true, truncate: false, exclusive: true };
            let (attr, opened) = e.create(parent, name.as_bytes(), 0o644, flags, OWNER)?;
            e.release(attr.ino, opened.fh)?;
            Ok(None)
        }
        Op::Mkdir(p) => {
            let (parent, name) = split(e, p)?;
            e.mkdir(parent, name.as_bytes(), 0o755, OWNER).map(|_| None)
        }
        Op::Write(p, off, data) => {
            let ino = resolve(e, p)?;
            let opened = e.open(ino, OpenFlags { write: true, ..Default::default() })?;
            let r = e.write(ino, opened.fh, *off as u64, data).and_then(|_| e.flush(ino, opened.fh));
            e.release(ino, opened.fh)?;
            r.map(|_| None)
        }
        Op::Truncate(p, n) => {
            let ino = resolve(e, p)?;
            e.setattr(ino, &SetAttr { size: Some(*n as u64), ..Default::default() }).map(|_| None)
        }
        Op::Read(p, off, n) => {
            let ino = resolve(e, p)?;
            let opened = e.open(ino, OpenFlags::default())?;
            let r = e.read(ino, opened.fh, *off as u64, *n as u32);
            e.release(ino, opened.fh)?;
            r.map(Some)
        }
        Op::Unlink(p) => {
            let (parent, name) = split(e, p)?;
            e.unlink(parent, name.as_bytes()).map(|_| None)
        }
        Op::Rmdir(p) => {
            let (parent, name) = split(e, p)?;
            e.rmdir(parent, name.as_bytes()).map(|_| None)
        }
        Op::Rename(a, b) => {
            let (pa, na) = split(e, a)?;
            let (pb, nb) = split(e, b).map_err(|_| EngineError::NotFound)?;
            e.rename(pa, na.as_bytes(), pb, nb.as_bytes(), RenameMode::Replace).map(|_| None)
        }
        Op::Link(a, b) => {
            let ino = resolve(e, a)?;
            let (pb, nb) = split(e, b)?;
            e.link(ino, pb, nb.as_bytes()).map(|_| None)
        }
        Op::Restart => Ok(None),
        Op::Gc => e.collect_garbage_online(std::time::Duration::ZERO, u64::MAX).map(|_| None),
    })();
    r.map_err(|e| class(&e))
}

/// Every path of the engine's tree with what it shows, and the names of each file inode, read
/// through the engine.
fn snapshot(e: &ScopeEngine) -> (BTreeMap<String, Shown>, BTreeSet<BTreeSet<String>>) {
    let mut out = BTreeMap::new();
    let mut names: BTreeMap<Ino, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((ino, prefix)) = stack.pop() {
        for entry in e.readdir(ino).unwrap() {
            let name = String::from_utf8(entry.name).unwrap();
            let p = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            match entry.attr.kind {
                FileKind::Dir => {
                    stack.push((entry.attr.ino, p.clone()));
                    out.insert(p, Shown::Dir);
                }
                _ => {
                    let data = read_file(e, &p).unwrap();
                    assert_eq!(data.len() as u64, entry.attr.size, "size of {p}");
                    out.insert(p.clone(), Shown::File(data));
                    names.entry(entry.attr.ino).or_default().insert(p);
                }
            }
        }
    }
    for (ino, set) in &names {
        assert_eq!(e.getattr(*ino).unwrap().nlink as usize, set.len(), "link count of {set:?}");
    }
    (out, names.into_values().collect())
}

fn check_usage(e: &ScopeEngine, model: &Model) {
    let u = e.usage().unwrap();
    let ids: BTreeSet<u32> =
        model.nodes.values().filter_map(|n| if let Node::File(id) = n { Some(*id) } else { None }).collect();
    let names = model.nodes.values().filter(|n| matches!(n, Node::File(_))).count() as u64;
    let dirs = model.nodes.len() as u64 - names;
    let files = ids.len() as u64;
    let bytes: u64 = ids.iter().map(|id| model.contents[id].len() as u64).sum();
    assert_eq!((u.files, u.bytes, u.inodes, u.links), (files, bytes, dirs + files, names - files), "usage");
    assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_model(ops in proptest::collection::vec(op(), 1..40)) {
        let h = Harness::small_blocks();
        let mut storage = h.storage();
        let scope = ScopeId::generate();
        let mut engine: Arc<ScopeEngine> = storage.open_scope(&scope, big_quota()).unwrap();
        let mut model = Model::default();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Restart = op {
                assert!(engine.wait_uploads(std::time::Duration::from_secs(10)));
                drop(engine);
                drop(storage);
                storage = h.storage();
                engine = storage.open_scope(&scope, big_quota()).unwrap();
            }
            let expected = model.apply(op);
            let got = run_engine(&engine, op);
            prop_assert_eq!(&got, &expected, "step {} {:?}", i, op);
            let (shown, name_sets) = snapshot(&engine);
            prop_assert_eq!(shown, model.shown(), "tree after step {} {:?}", i, op);
            prop_assert_eq!(name_sets, model.name_sets(), "hard links after step {} {:?}", i, op);
        }
        check_usage(&engine, &model);
        prop_assert!(engine.wait_uploads(std::time::Duration::from_secs(10)));
        // Everything stored: a last pass leaves exactly what the files use, all of it intact.
        engine.collect_garbage_online(std::time::Duration::ZERO, u64::MAX).unwrap();
        let report = engine.fsck(false).unwrap();
        prop_assert!(report.damaged_files.is_empty() && report.orphan_objects.is_empty(), "{:?}", report);
    }
}

#[test]
fn append_uploads_only_the_tail_block() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "f", &[7u8; 64 * 10]).unwrap();
    assert!(e.wait_uploads(std::time::Duration::from_secs(5)));
    let before = h.store.put_count();
    let ino = resolve(&e, "f").unwrap();
    let opened = e.open(ino, OpenFlags { write: true, ..Default::default() }).unwrap();
    e.write(ino, opened.fh, 640, b"tail").unwrap();
    e.fsync(ino, Some(opened.fh)).unwrap();
    e.release(ino, opened.fh).unwrap();
    assert!(e.wait_uploads(std::time::Duration::from_secs(5)));
    assert_eq!(h.store.put_count() - before, 1, "an append re-uploads only the new tail block");
    let mut expect = vec![7u8; 640];
    expect.extend_from_slice(b"tail");
    assert_eq!(read_file(&e, "f").unwrap(), expect);
}

#[test]
fn unlinked_open_file_stays_readable_until_released() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "f", b"still here after unlink").unwrap();
    let ino = resolve(&e, "f").unwrap();
    let opened = e.open(ino, OpenFlags::default()).unwrap();
    e.unlink(ROOT_INO, b"f").unwrap();
    assert!(matches!(e.lookup(ROOT_INO, b"f"), Err(EngineError::NotFound)));
    assert_eq!(e.read(ino, opened.fh, 0, 100).unwrap(), b"still here after unlink");
    assert_eq!(e.usage().unwrap().files, 1, "counted until released");
    e.release(ino, opened.fh).unwrap();
    assert!(matches!(e.getattr(ino), Err(EngineError::NotFound)));
    assert_eq!(e.usage().unwrap(), Usage::default());
}

#[test]
fn deduplicated_blocks_are_collected_only_when_unreferenced() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "a", &[1u8; 128]).unwrap();
    write_file(&e, "b", &[1u8; 128]).unwrap();
    assert!(e.wait_uploads(std::time::Duration::from_secs(5)));
    assert_eq!(h.store.keys().len(), 1, "two identical blocks in two files are one object");
    e.unlink(ROOT_INO, b"a").unwrap();
    assert_eq!(e.collect_garbage(std::time::Duration::ZERO).unwrap().blocks_deleted, 0);
    e.unlink(ROOT_INO, b"b").unwrap();
    let report = e.collect_garbage(std::time::Duration::ZERO).unwrap();
    assert_eq!((report.blocks_deleted, report.bytes_deleted), (1, 64), "one 64-byte block, stored once");
    assert!(h.store.keys().is_empty());
}

#[test]
fn concurrent_writers_readers_and_stat_callers_do_not_deadlock() {
    let h = Harness::small_blocks();
    let storage = h.storage();
    let e = new_scope(&storage);
    write_file(&e, "shared", &[0u8; 1000]).unwrap();
    let ino = resolve(&e, "shared").unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for t in 0..4u8 {
        let (e, done) = (e.clone(), done_tx.clone());
        std::thread::spawn(move || {
            for i in 0..150u32 {
                match t {
                    0 | 1 => {
                        let h = e.open(ino, OpenFlags { write: true, ..Default::default() }).unwrap();
                        e.write(ino, h.fh, u64::from(i % 7) * 100, &[t; 300]).unwrap();
                        e.release(ino, h.fh).unwrap();
                    }
                    2 => {
                        e.getattr(ino).unwrap();
                        e.readdir(ROOT_INO).unwrap();
                        e.lookup(ROOT_INO, b"shared").unwrap();
                    }
                    _ => {
                        let h = e.open(ino, OpenFlags::default()).unwrap();
                        e.read(ino, h.fh, 0, 4096).unwrap();
                        e.fsync(ino, Some(h.fh)).unwrap();
                        e.release(ino, h.fh).unwrap();
                    }
                }
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..4 {
        done_rx.recv_timeout(std::time::Duration::from_secs(120)).expect("a worker is stuck: deadlock");
    }
    assert!(e.consistency_problems().unwrap().is_empty());
}
