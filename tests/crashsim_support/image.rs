//! An in-memory image of a recorded directory tree (inodes by `FileId`, directories as name
//! maps): taken from disk when recording starts, changed by replaying logged operations (all of
//! them, or a subset, or a torn write), hashed to deduplicate crash states, and written out as a
//! real directory for an engine to open.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::ops::{FileId, Op, RENAME_EXCHANGE, ROOT};

#[derive(Clone, Debug)]
pub enum Node {
    Dir(BTreeMap<OsString, FileId>),
    /// Contents, and a fingerprint of how they were derived (the file and the ops applied to
    /// it): equal fingerprints mean equal contents, so each is hashed once (`HashCache`).
    File(Arc<Vec<u8>>, u128),
    Symlink(OsString),
}

/// Content hashes of files by (file, derivation fingerprint).
#[derive(Default)]
pub struct HashCache(HashMap<(FileId, u128), [u8; 32]>);

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The fingerprint `h` extended by `v` (two independent 64-bit lanes).
fn mix(h: u128, v: u64) -> u128 {
    let (a, b) = ((h >> 64) as u64, h as u64);
    let a = splitmix(a ^ v.wrapping_mul(0xff51_afd7_ed55_8ccd));
    let b = splitmix(b.rotate_left(23) ^ v ^ 0xc4ce_b9fe_1a85_ec53);
    (u128::from(a) << 64) | u128::from(b)
}

/// A new empty file's node (`seed` tells files found at the snapshot from files made later).
fn new_file(id: FileId, seed: u64, data: Vec<u8>) -> Node {
    Node::File(Arc::new(data), mix(mix(0, seed), id))
}

/// A directory tree by inode. Unreachable inodes (unlinked, or created by an operation whose
/// name was dropped) stay in the table and are simply not written out.
#[derive(Clone, Debug, Default)]
pub struct Image {
    nodes: HashMap<FileId, Node>,
}

impl Image {
    /// An empty root directory.
    pub fn empty() -> Image {
        Image { nodes: HashMap::from([(ROOT, Node::Dir(BTreeMap::new()))]) }
    }

    /// The contents of the file at `path` (`None`: no file there).
    pub fn read(&self, path: &str) -> Option<&[u8]> {
        let mut id = ROOT;
        for part in path.split('/') {
            match self.nodes.get(&id) {
                Some(Node::Dir(d)) => id = *d.get(OsStr::new(part))?,
                _ => return None,
            }
        }
        match self.nodes.get(&id) {
            Some(Node::File(d, _)) => Some(d.as_slice()),
            _ => None,
        }
    }

    /// Reads the tree below `root` (which gets `ROOT`); `id_of` names every other inode by its
    /// backing inode number (hard links get one id); files `volatile` says so about are taken as
    /// empty (SQLite's shared-memory index, rebuilt by whoever opens the database first).
    pub fn snapshot(
        root: &Path,
        mut id_of: impl FnMut(u64) -> FileId,
        volatile: impl Fn(&OsStr) -> bool,
    ) -> std::io::Result<Image> {
        let mut image = Image::default();
        image.nodes.insert(ROOT, Node::Dir(BTreeMap::new()));
        let mut todo = vec![(root.to_path_buf(), ROOT)];
        while let Some((dir, dir_id)) = todo.pop() {
            let mut entries = BTreeMap::new();
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let m = fs::symlink_metadata(entry.path())?;
                let id = id_of(m.ino());
                entries.insert(entry.file_name(), id);
                if image.nodes.contains_key(&id) {
                    continue;
                }
                let node = if m.is_dir() {
                    todo.push((entry.path(), id));
                    Node::Dir(BTreeMap::new())
                } else if m.file_type().is_symlink() {
                    Node::Symlink(fs::read_link(entry.path())?.into_os_string())
                } else if volatile(&entry.file_name()) {
                    new_file(id, 1, Vec::new())
                } else {
                    new_file(id, 1, fs::read(entry.path())?)
                };
                image.nodes.insert(id, node);
            }
            image.nodes.insert(dir_id, Node::Dir(entries));
        }
        Ok(image)
    }

    /// Applies logged operation number `j`. An entry operation whose source is not what it was
    /// when it ran (an earlier operation was left out) does nothing.
    pub fn apply(&mut self, j: usize, op: &Op) {
        match op {
            Op::Write { file, offset, data } => self.write(*file, *offset, data, mix(0, j as u64)),
            Op::Truncate { file, size } => {
                if let Node::File(d, h) = self.file_node(*file) {
                    Arc::make_mut(d).resize(*size as usize, 0);
                    *h = mix(*h, j as u64);
                }
            }
            Op::Create { dir, name, file } => {
                self.nodes.entry(*file).or_insert_with(|| new_file(*file, 2, Vec::new()));
                self.set_entry(*dir, name, *file);
            }
            Op::Mkdir { dir, name, new } => {
                self.nodes.entry(*new).or_insert_with(|| Node::Dir(BTreeMap::new()));
                self.set_entry(*dir, name, *new);
            }
            Op::Symlink { dir, name, target, new } => {
                self.nodes.entry(*new).or_insert_with(|| Node::Symlink(target.clone()));
                self.set_entry(*dir, name, *new);
            }
            Op::Link { file, dir, name } => {
                if self.nodes.contains_key(file) {
                    self.set_entry(*dir, name, *file);
                }
            }
            Op::Unlink { dir, name, file } | Op::Rmdir { dir, name, file } => {
                if self.entry(*dir, name) == Some(*file) {
                    self.dir_mut(*dir).map(|d| d.remove(name));
                }
            }
            Op::Rename { from_dir, from_name, to_dir, to_name, file, other, flags } => {
                if self.entry(*from_dir, from_name) != Some(*file) || self.dir_mut(*to_dir).is_none() {
                    return;
                }
                if flags & RENAME_EXCHANGE != 0 {
                    let Some(other) = other.filter(|o| self.entry(*to_dir, to_name) == Some(*o)) else { return };
                    self.set_entry(*from_dir, from_name, other);
                } else {
                    self.dir_mut(*from_dir).map(|d| d.remove(from_name));
                }
                self.set_entry(*to_dir, to_name, *file);
            }
            Op::Fsync { .. } | Op::FsyncDir { .. } => {}
        }
    }

    /// Applies only `keep` (a byte range within the write, relative to its offset) of write
    /// number `j`: what a torn write leaves.
    pub fn apply_torn(&mut self, j: usize, op: &Op, keep: std::ops::Range<usize>) {
        if let Op::Write { file, offset, data } = op {
            let how = mix(mix(mix(0, j as u64), keep.start as u64 + 1), keep.end as u64);
            self.write(*file, offset + keep.start as u64, &data[keep], how);
        }
    }

    /// Writes `data` at `offset` of `file`; `how` identifies the write in the fingerprint.
    fn write(&mut self, file: FileId, offset: u64, data: &[u8], how: u128) {
        if let Node::File(d, h) = self.file_node(file) {
            *h = mix(*h ^ how, 1);
            if data.is_empty() {
                return;
            }
            let d = Arc::make_mut(d);
            let end = offset as usize + data.len();
            if d.len() < end {
                d.resize(end, 0);
            }
            d[offset as usize..end].copy_from_slice(data);
        }
    }

    fn file_node(&mut self, file: FileId) -> &mut Node {
        self.nodes.entry(file).or_insert_with(|| new_file(file, 2, Vec::new()))
    }

    fn dir_mut(&mut self, dir: FileId) -> Option<&mut BTreeMap<OsString, FileId>> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir(d)) => Some(d),
            _ => None,
        }
    }

    fn entry(&self, dir: FileId, name: &OsStr) -> Option<FileId> {
        match self.nodes.get(&dir) {
            Some(Node::Dir(d)) => d.get(name).copied(),
            _ => None,
        }
    }

    fn set_entry(&mut self, dir: FileId, name: &OsStr, id: FileId) {
        if let Some(d) = self.dir_mut(dir) {
            d.insert(name.to_os_string(), id);
        }
    }

    /// The reachable tree: (path, id) in path order, each directory before what it holds; a
    /// directory reached a second time is not entered again.
    fn walk(&self) -> Vec<(PathBuf, FileId)> {
        let mut out = Vec::new();
        let mut seen_dirs = HashSet::from([ROOT]);
        let mut todo = vec![(PathBuf::new(), ROOT)];
        while let Some((path, dir)) = todo.pop() {
            let Some(Node::Dir(entries)) = self.nodes.get(&dir) else { continue };
            for (name, id) in entries.iter().rev() {
                let p = path.join(name);
                if matches!(self.nodes.get(id), Some(Node::Dir(_))) {
                    if seen_dirs.insert(*id) {
                        todo.push((p.clone(), *id));
                    } else {
                        continue;
                    }
                }
                out.push((p, *id));
            }
        }
        out.sort();
        out
    }

    /// A hash of what the tree shows: names, kinds, contents, which names are links of one file.
    pub fn hash(&self, cache: &mut HashCache) -> [u8; 32] {
        let mut h = Sha256::new();
        let mut first: HashMap<FileId, usize> = HashMap::new();
        for (i, (path, id)) in self.walk().into_iter().enumerate() {
            h.update(path.as_os_str().as_bytes());
            h.update([0]);
            match self.nodes.get(&id) {
                Some(Node::Dir(_)) => h.update(b"d"),
                Some(Node::Symlink(t)) => {
                    h.update(b"l");
                    h.update(t.as_bytes());
                }
                Some(Node::File(data, how)) => match first.get(&id) {
                    Some(j) => h.update(format!("h{j}").as_bytes()),
                    None => {
                        first.insert(id, i);
                        h.update(b"f");
                        h.update((data.len() as u64).to_le_bytes());
                        h.update(cache.0.entry((id, *how)).or_insert_with(|| Sha256::digest(data.as_slice()).into()));
                    }
                },
                None => h.update(b"?"),
            }
            h.update([0]);
        }
        h.finalize().into()
    }

    /// Writes the tree out below `dest` (created; must not exist). Hard links stay links.
    pub fn materialize(&self, dest: &Path) -> std::io::Result<()> {
        fs::create_dir_all(dest)?;
        let mut first: HashMap<FileId, PathBuf> = HashMap::new();
        for (path, id) in self.walk() {
            let target = dest.join(&path);
            match self.nodes.get(&id) {
                Some(Node::Dir(_)) => fs::create_dir(&target)?,
                Some(Node::Symlink(t)) => std::os::unix::fs::symlink(t, &target)?,
                Some(Node::File(data, _)) => match first.get(&id) {
                    Some(p) => fs::hard_link(p, &target)?,
                    None => {
                        fs::write(&target, data.as_slice())?;
                        first.insert(id, target);
                    }
                },
                None => {}
            }
        }
        Ok(())
    }

    /// Writes the image for `decode` (`wire`).
    pub fn encode(&self, o: &mut super::wire::Out) {
        o.u64(self.nodes.len() as u64);
        for (id, node) in &self.nodes {
            o.u64(*id);
            match node {
                Node::Dir(entries) => {
                    o.u8(0).u64(entries.len() as u64);
                    for (name, child) in entries {
                        o.name(name).u64(*child);
                    }
                }
                Node::File(data, how) => {
                    o.u8(1).bytes(data).u128(*how);
                }
                Node::Symlink(t) => {
                    o.u8(2).name(t);
                }
            }
        }
    }

    pub fn decode(i: &mut super::wire::In) -> std::io::Result<Image> {
        let mut nodes = HashMap::new();
        for _ in 0..i.u64()? {
            let id = i.u64()?;
            let node = match i.u8()? {
                0 => {
                    let mut entries = BTreeMap::new();
                    for _ in 0..i.u64()? {
                        entries.insert(i.name()?, i.u64()?);
                    }
                    Node::Dir(entries)
                }
                1 => Node::File(Arc::new(i.bytes()?), i.u128()?),
                _ => Node::Symlink(i.name()?),
            };
            nodes.insert(id, node);
        }
        Ok(Image { nodes })
    }
}
