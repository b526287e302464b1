//! The model the crash tests hold the engine to: a history of whole engine steps (create, mkdir,
//! write, a write through a handle kept open and the close of such handles, truncate, rename,
//! unlink, rmdir, link, setxattr, fsync, fsync of the root, sync, waiting for uploads, a commit, a
//! restart, a gc pass), the namespace, contents and `user.k` attributes each prefix of it leaves,
//! and the proptest strategies that generate histories.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

/// One engine step. Each changes the tree by at most one metadata mutation, so a crash leaves
/// either the state before it or the state after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An empty new file (exclusive create, then close).
    Create(String),
    Mkdir(String),
    /// open, write `len` bytes of pattern `seed` at `offset`, flush, close.
    Write(String, u32, u32, u8),
    /// Write `len` bytes of pattern `seed` at `offset` through a handle the rig keeps open on the
    /// file (opened at its first such write; never flushed here): what the write was answered for
    /// lives in the open-file log until a close or write-back commits it.
    WriteHeld(String, u32, u32, u8),
    /// Flush and close every handle `WriteHeld` keeps open (a restart does this first too).
    CloseHeld,
    Truncate(String, u32),
    Rename(String, String),
    Unlink(String),
    Rmdir(String),
    Link(String, String),
    /// setxattr `user.k` to a value of pattern `seed`.
    SetXattr(String, u8),
    /// open, fsync, close (a directory: fsync of the directory).
    Fsync(String),
    /// fsync of the root directory.
    FsyncDir,
    /// The scope's syncfs.
    Sync,
    /// Wait for the upload queue to drain (uploads otherwise wait an hour).
    WaitUploads,
    /// Commit the open metadata batch without a flush (what the idle flusher does after 200 ms).
    Commit,
    /// Close the engine and its storage (a graceful daemon restart: queued uploads stay
    /// queued) and open a fresh one on the same directories.
    Restart,
    /// An online gc pass with no grace (`collect_garbage_online`): nothing a program can see
    /// changes, and no crash state may lose a block something still refers to.
    Gc,
}

impl Step {
    /// A step that, when it returns Ok, makes every earlier step survive a power loss.
    pub fn is_durability_point(&self) -> bool {
        matches!(self, Step::Fsync(_) | Step::FsyncDir | Step::Sync)
    }
}

/// The bytes a `Write` step writes.
pub fn pattern(seed: u8, len: u32) -> Vec<u8> {
    (0..len).map(|k| (k.wrapping_mul(131).wrapping_add(u32::from(seed) * 7) % 251) as u8 ^ seed).collect()
}

pub fn xattr_value(seed: u8) -> Vec<u8> {
    format!("value-{seed}").into_bytes()
}

/// Error classes compared between model and engine.
pub const MISSING: &str = "missing-or-notdir";
pub const EXISTS: &str = "exists";
pub const ISDIR: &str = "isdir";
pub const NOTEMPTY: &str = "notempty";
pub const INVALID: &str = "invalid";
pub const NOTPERMITTED: &str = "notpermitted";

pub type Outcome = Result<(), String>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File(u32),
    Dir(u32),
}

/// What a path shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    Dir { xattr: Option<Vec<u8>> },
    File { data: Vec<u8>, xattr: Option<Vec<u8>> },
}

/// The namespace after some steps.
#[derive(Debug, Clone, Default)]
pub struct Model {
    nodes: BTreeMap<String, Node>,
    contents: BTreeMap<u32, Vec<u8>>,
    xattrs: BTreeMap<u32, Vec<u8>>,
    /// Step index of each file's last content change.
    written: BTreeMap<u32, usize>,
    next: u32,
}

fn parent_of(p: &str) -> &str {
    p.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}

fn err(class: &str) -> Outcome {
    Err(class.to_string())
}

impl Model {
    fn dir_ok(&self, d: &str) -> bool {
        d.is_empty() || matches!(self.nodes.get(d), Some(Node::Dir(_)))
    }

    fn has_children(&self, d: &str) -> bool {
        let prefix = format!("{d}/");
        self.nodes.keys().any(|k| k.starts_with(&prefix))
    }

    fn file_id(&self, p: &str) -> Result<u32, String> {
        if !self.dir_ok(parent_of(p)) {
            return Err(MISSING.into());
        }
        match self.nodes.get(p) {
            Some(Node::File(id)) => Ok(*id),
            Some(Node::Dir(_)) => Err(ISDIR.into()),
            None => Err(MISSING.into()),
        }
    }

    fn node(&self, p: &str) -> Result<Node, String> {
        if p.is_empty() {
            return Ok(Node::Dir(0));
        }
        if !self.dir_ok(parent_of(p)) {
            return Err(MISSING.into());
        }
        self.nodes.get(p).copied().ok_or_else(|| MISSING.into())
    }

    /// Applies step number `index`; the outcome the engine must give.
    pub fn apply(&mut self, step: &Step, index: usize) -> Outcome {
        match step {
            Step::Create(p) | Step::Mkdir(p) => {
                if !self.dir_ok(parent_of(p)) {
                    return err(MISSING);
                }
                if self.nodes.contains_key(p) {
                    return err(EXISTS);
                }
                self.next += 1;
                let node = if matches!(step, Step::Create(_)) {
                    self.contents.insert(self.next, Vec::new());
                    self.written.insert(self.next, index);
                    Node::File(self.next)
                } else {
                    Node::Dir(self.next)
                };
                self.nodes.insert(p.clone(), node);
                Ok(())
            }
            Step::Write(p, off, len, seed) | Step::WriteHeld(p, off, len, seed) => {
                let id = self.file_id(p)?;
                if *len > 0 {
                    let f = self.contents.get_mut(&id).expect("contents");
                    let end = (*off + *len) as usize;
                    if f.len() < end {
                        f.resize(end, 0);
                    }
                    f[*off as usize..end].copy_from_slice(&pattern(*seed, *len));
                    self.written.insert(id, index);
                }
                Ok(())
            }
            Step::Truncate(p, n) => {
                let id = self.file_id(p)?;
                self.contents.get_mut(&id).expect("contents").resize(*n as usize, 0);
                self.written.insert(id, index);
                Ok(())
            }
            Step::Unlink(p) => match self.node(p)? {
                Node::File(_) => {
                    self.nodes.remove(p);
                    Ok(())
                }
                Node::Dir(_) => err(ISDIR),
            },
            Step::Rmdir(p) => match self.node(p)? {
                Node::Dir(_) if p.is_empty() => err(INVALID),
                Node::Dir(_) if self.has_children(p) => err(NOTEMPTY),
                Node::Dir(_) => {
                    self.nodes.remove(p);
                    Ok(())
                }
                Node::File(_) => err(MISSING),
            },
            Step::Rename(a, b) => self.rename(a, b),
            Step::Link(a, b) => self.link(a, b),
            Step::SetXattr(p, seed) => {
                let id = match self.node(p)? {
                    Node::File(id) | Node::Dir(id) => id,
                };
                self.xattrs.insert(id, xattr_value(*seed));
                Ok(())
            }
            Step::Fsync(p) => self.node(p).map(drop),
            Step::FsyncDir
            | Step::Sync
            | Step::WaitUploads
            | Step::Commit
            | Step::Restart
            | Step::Gc
            | Step::CloseHeld => Ok(()),
        }
    }

    fn link(&mut self, a: &str, b: &str) -> Outcome {
        let node = self.node(a)?;
        if !self.dir_ok(parent_of(b)) {
            return err(MISSING);
        }
        let Node::File(id) = node else { return err(NOTPERMITTED) };
        if self.nodes.contains_key(b) {
            return err(EXISTS);
        }
        self.nodes.insert(b.to_string(), Node::File(id));
        Ok(())
    }

    fn rename(&mut self, a: &str, b: &str) -> Outcome {
        let src = self.node(a)?;
        if !self.dir_ok(parent_of(b)) {
            return err(MISSING);
        }
        let src_dir = matches!(src, Node::Dir(_));
        if src_dir && b.starts_with(&format!("{a}/")) {
            return err(INVALID);
        }
        if a == b || matches!((src, self.nodes.get(b)), (Node::File(x), Some(Node::File(y))) if x == *y) {
            return Ok(());
        }
        match self.nodes.get(b) {
            Some(Node::Dir(_)) if !src_dir => return err(ISDIR),
            Some(Node::File(_)) if src_dir => return err(MISSING),
            Some(Node::Dir(_)) if self.has_children(b) => return err(NOTEMPTY),
            _ => {}
        }
        self.nodes.remove(b);
        let prefix = format!("{a}/");
        let moved: Vec<String> = self.nodes.keys().filter(|k| *k == a || k.starts_with(&prefix)).cloned().collect();
        for k in moved {
            let node = self.nodes.remove(&k).unwrap();
            self.nodes.insert(format!("{b}{}", &k[a.len()..]), node);
        }
        Ok(())
    }

    /// Every path with what it shows.
    pub fn shown(&self) -> BTreeMap<String, Shown> {
        self.nodes
            .iter()
            .map(|(p, n)| {
                let shown = match n {
                    Node::File(id) => {
                        Shown::File { data: self.contents[id].clone(), xattr: self.xattrs.get(id).cloned() }
                    }
                    Node::Dir(id) => Shown::Dir { xattr: self.xattrs.get(id).cloned() },
                };
                (p.clone(), shown)
            })
            .collect()
    }

    /// The names of each file with more than one name (hard links share a set).
    pub fn link_sets(&self) -> BTreeSet<BTreeSet<String>> {
        let mut by_id: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for (p, n) in &self.nodes {
            if let Node::File(id) = n {
                by_id.entry(*id).or_default().insert(p.clone());
            }
        }
        by_id.into_values().filter(|s| s.len() > 1).collect()
    }

    /// The bytes of the file at `path` (None: not a file).
    pub fn content(&self, path: &str) -> Option<&[u8]> {
        match self.nodes.get(path) {
            Some(Node::File(id)) => self.contents.get(id).map(Vec::as_slice),
            _ => None,
        }
    }

    /// This model with the file at `path` holding `data` (under every name it has).
    pub fn with_content(&self, path: &str, data: Vec<u8>) -> Model {
        let mut m = self.clone();
        if let Some(Node::File(id)) = m.nodes.get(path) {
            m.contents.insert(*id, data);
        }
        m
    }

    /// Step index of the last content change of the file at `path` (None: not a file).
    pub fn last_write(&self, path: &str) -> Option<usize> {
        match self.nodes.get(path) {
            Some(Node::File(id)) => self.written.get(id).copied(),
            _ => None,
        }
    }
}

/// The states after each prefix of `steps` (`out[k]`: after the first k) and each step's
/// outcome.
pub fn prefixes(steps: &[Step]) -> (Vec<Model>, Vec<Outcome>) {
    let mut m = Model::default();
    let mut models = vec![m.clone()];
    let mut outcomes = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        outcomes.push(m.apply(s, i));
        models.push(m.clone());
    }
    (models, outcomes)
}

/// Paths the generated histories use (nested up to three levels).
pub const PATHS: &[&str] = &["a", "b", "x", "y", "x/a", "x/b", "y/a", "x/y", "x/y/a"];

fn path() -> impl Strategy<Value = String> {
    proptest::sample::select(PATHS).prop_map(String::from)
}

/// One generated step. Writes reach up to three 4 KiB blocks so that files have whole staged
/// blocks and small (inline) tails.
pub fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => path().prop_map(Step::Create),
        2 => path().prop_map(Step::Mkdir),
        5 => (path(), 0u32..6000, 0u32..7000, any::<u8>()).prop_map(|(p, o, l, s)| Step::Write(p, o, l, s)),
        1 => (path(), 0u32..9000).prop_map(|(p, n)| Step::Truncate(p, n)),
        2 => (path(), path()).prop_map(|(a, b)| Step::Rename(a, b)),
        2 => path().prop_map(Step::Unlink),
        1 => path().prop_map(Step::Rmdir),
        2 => (path(), path()).prop_map(|(a, b)| Step::Link(a, b)),
        1 => (path(), any::<u8>()).prop_map(|(p, s)| Step::SetXattr(p, s)),
        2 => path().prop_map(Step::Fsync),
        1 => Just(Step::FsyncDir),
        1 => Just(Step::Sync),
        1 => Just(Step::WaitUploads),
        1 => Just(Step::Commit),
        1 => Just(Step::Restart),
        1 => Just(Step::Gc),
    ]
}

/// One generated step of a history with files held open: `step()`'s, writes through handles kept
/// open, and their closes. (Kill -9 only: a write to a file held open survives a kill, and a power
/// loss only once a commit and a durability point cover it, which the prefix model does not say.)
pub fn step_held() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => step(),
        3 => (path(), 0u32..6000, 0u32..7000, any::<u8>()).prop_map(|(p, o, l, s)| Step::WriteHeld(p, o, l, s)),
        1 => Just(Step::CloseHeld),
    ]
}

/// A history: a few files and a directory up front (so that most generated steps find what they
/// name), then generated steps.
pub fn history(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    prelude_then(proptest::collection::vec(step(), len))
}

/// `history` with files held open (`step_held`).
pub fn history_held(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    prelude_then(proptest::collection::vec(step_held(), len))
}

fn prelude_then(steps: impl Strategy<Value = Vec<Step>>) -> impl Strategy<Value = Vec<Step>> {
    steps.prop_map(|steps| {
        let mut all = vec![
            Step::Create("a".into()),
            Step::Mkdir("x".into()),
            Step::Create("x/a".into()),
            Step::Write("a".into(), 0, 6000, 0),
        ];
        all.extend(steps);
        all
    })
}
