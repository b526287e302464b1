//! The recording layer's state, in the process that serves the FUSE mount: the kernel's inodes
//! (as `O_PATH` descriptors of the backing tree), open handles, the operation log, the initial
//! snapshot, the write and sync counters and the armed fault; one method per request kind.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Errno, FileAttr};

use super::image::Image;
use super::ops::{FaultOn, FileId, Fired, Op, ROOT};
use super::passthrough::{self as sys, Sys};
use super::recorder::Recording;

struct Node {
    fd: OwnedFd,
    lookups: u64,
}

pub(super) struct Handle {
    pub(super) file: File,
    id: FileId,
}

pub(super) struct State {
    backing: PathBuf,
    nodes: HashMap<FileId, Node>,
    by_ino: HashMap<u64, FileId>,
    next_id: FileId,
    volatile: HashSet<FileId>,
    names: HashMap<FileId, OsString>,
    pub(super) handles: HashMap<u64, Handle>,
    next_fh: u64,
    recording: bool,
    log: Vec<Op>,
    initial: Image,
    writes_seen: usize,
    syncs_seen: usize,
    fault: Option<(FaultOn, i32)>,
    fired: Vec<Fired>,
}

fn volatile_name(name: &OsStr) -> bool {
    name.as_bytes().ends_with(b"-shm")
}

/// A file's name for reports: hex block hashes shown as `<sha>`, scope ids as `<scope>`,
/// nothing else of a path.
fn role(name: &OsStr) -> String {
    let s = name.to_string_lossy();
    let uuid = s.len() == 36 && s.bytes().filter(|b| *b == b'-').count() == 4;
    if s.len() >= 32 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        "<sha>".into()
    } else if uuid && s.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()) {
        "<scope>".into()
    } else {
        s.into_owned()
    }
}

/// Backing inode numbers of every `-shm` file below `dir`.
fn collect_volatile(dir: &Path, out: &mut HashSet<u64>) {
    use std::os::unix::fs::MetadataExt;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
        if m.is_dir() {
            collect_volatile(&e.path(), out);
        } else if volatile_name(&e.file_name()) {
            out.insert(m.ino());
        }
    }
}

impl State {
    /// The state of a mount of `backing`, not recording yet.
    pub(super) fn new(backing: &Path) -> Sys<State> {
        let root = sys::open_root(backing)?;
        let root_ino = sys::fstat(root.as_raw_fd())?.st_ino;
        Ok(State {
            backing: backing.to_path_buf(),
            nodes: HashMap::from([(ROOT, Node { fd: root, lookups: 1 })]),
            by_ino: HashMap::from([(root_ino, ROOT)]),
            next_id: ROOT + 1,
            volatile: HashSet::new(),
            names: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 1,
            recording: false,
            log: Vec::new(),
            initial: Image::empty(),
            writes_seen: 0,
            syncs_seen: 0,
            fault: None,
            fired: Vec::new(),
        })
    }

    /// Starts (or restarts) recording: snapshots the backing tree as the initial image, empties
    /// the log, resets the write and sync counters and disarms any fault.
    pub(super) fn start(&mut self) -> std::io::Result<()> {
        let (by_ino, next_id) = (&mut self.by_ino, &mut self.next_id);
        let image = Image::snapshot(
            &self.backing,
            |ino| {
                *by_ino.entry(ino).or_insert_with(|| {
                    *next_id += 1;
                    *next_id - 1
                })
            },
            volatile_name,
        )?;
        let mut vol_inos = HashSet::new();
        collect_volatile(&self.backing, &mut vol_inos);
        for ino in vol_inos {
            if let Some(id) = self.by_ino.get(&ino) {
                self.volatile.insert(*id);
            }
        }
        self.initial = image;
        self.log.clear();
        self.recording = true;
        self.writes_seen = 0;
        self.syncs_seen = 0;
        self.fault = None;
        self.fired.clear();
        Ok(())
    }

    pub(super) fn ops(&self) -> usize {
        self.log.len()
    }

    pub(super) fn counts(&self) -> (usize, usize) {
        (self.writes_seen, self.syncs_seen)
    }

    pub(super) fn arm(&mut self, on: FaultOn, errno: i32) {
        self.fault = Some((on, errno));
    }

    pub(super) fn fired(&self) -> Vec<Fired> {
        self.fired.clone()
    }

    /// The recording so far (recording goes on).
    pub(super) fn recording(&self) -> Recording {
        let names = self.names.iter().map(|(id, n)| (*id, role(n))).collect();
        let mut lost = HashSet::new();
        for f in self.fired.iter().filter(|f| f.sync) {
            let durable = super::states::durable(&self.log, f.at_op);
            let writes = self.log[..f.at_op].iter().enumerate().filter(|(j, op)| {
                !durable[*j] && op.subject() == f.file && matches!(op, Op::Write { .. } | Op::Truncate { .. })
            });
            lost.extend(writes.map(|(j, _)| j));
        }
        Recording { initial: self.initial.clone(), log: self.log.clone(), names, lost }
    }

    /// The ops logged and the last few (for a report of a hang).
    pub(super) fn brief(&self) -> String {
        let n = self.log.len();
        let last: Vec<String> = self.log[n.saturating_sub(6)..]
            .iter()
            .map(|op| format!("{} of {}", op.kind(), self.describe(op.subject())))
            .collect();
        format!("{n} ops logged, the last: {last:?}")
    }

    pub(super) fn fd(&self, id: FileId) -> Sys<&OwnedFd> {
        self.nodes.get(&id).map(|n| &n.fd).ok_or(Errno::ESTALE)
    }

    fn id_of_ino(&mut self, ino: u64) -> FileId {
        let next = &mut self.next_id;
        *self.by_ino.entry(ino).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }

    /// A fresh id for a new backing inode (its number may be a deleted inode's).
    fn new_id(&mut self, ino: u64) -> FileId {
        let id = self.next_id;
        self.next_id += 1;
        self.by_ino.insert(ino, id);
        id
    }

    fn log(&mut self, op: Op) {
        if self.recording {
            self.log.push(op);
        }
    }

    /// Whether the armed fault hits this request (counting it); logs what fired.
    fn fault(&mut self, sync: bool, file: FileId) -> Sys<()> {
        if !self.recording {
            return Ok(());
        }
        let n = if sync { &mut self.syncs_seen } else { &mut self.writes_seen };
        let nth = *n;
        *n += 1;
        let hit = match self.fault {
            Some((FaultOn::Write(k), e)) if !sync && k == nth => Some(e),
            Some((FaultOn::Sync(k), e)) if sync && k == nth => Some(e),
            _ => None,
        };
        let Some(errno) = hit else { return Ok(()) };
        self.fault = None;
        let what = format!("{} of {}", if sync { "sync" } else { "write" }, self.describe(file));
        self.fired.push(Fired { at_op: self.log.len(), errno, what, file, sync });
        Err(Errno::from_i32(errno))
    }

    fn describe(&self, id: FileId) -> String {
        self.names.get(&id).map(|n| role(n)).unwrap_or_else(|| "?".into())
    }

    /// Looks `parent/name` up, takes a lookup reference on its node, and answers its attributes.
    pub(super) fn lookup(&mut self, parent: FileId, name: &OsStr) -> Sys<FileAttr> {
        let fd = sys::open_path(self.fd(parent)?, name)?;
        let st = sys::fstat(fd.as_raw_fd())?;
        let id = self.id_of_ino(st.st_ino);
        self.remember(id, fd, name, st.st_mode);
        Ok(sys::attr(id, &st))
    }

    fn remember(&mut self, id: FileId, fd: OwnedFd, name: &OsStr, mode: u32) {
        match self.nodes.get_mut(&id) {
            Some(n) => n.lookups += 1,
            None => {
                self.nodes.insert(id, Node { fd, lookups: 1 });
            }
        }
        if mode & libc::S_IFMT == libc::S_IFREG && volatile_name(name) {
            self.volatile.insert(id);
        }
        self.names.insert(id, name.to_os_string());
    }

    /// A new inode at `parent/name`: a fresh id, a node with one lookup reference.
    fn new_entry(&mut self, parent: FileId, name: &OsStr) -> Sys<(FileId, FileAttr)> {
        let fd = sys::open_path(self.fd(parent)?, name)?;
        let st = sys::fstat(fd.as_raw_fd())?;
        let id = self.new_id(st.st_ino);
        self.remember(id, fd, name, st.st_mode);
        Ok((id, sys::attr(id, &st)))
    }

    pub(super) fn forget(&mut self, id: FileId, n: u64) {
        if id == ROOT {
            return;
        }
        if let Some(node) = self.nodes.get_mut(&id) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 {
                self.nodes.remove(&id);
            }
        }
    }

    pub(super) fn getattr(&self, id: FileId, fh: Option<u64>) -> Sys<FileAttr> {
        let st = match fh.and_then(|fh| self.handles.get(&fh)) {
            Some(h) => sys::fstat(h.file.as_raw_fd())?,
            None => sys::fstat(self.fd(id)?.as_raw_fd())?,
        };
        Ok(sys::attr(id, &st))
    }

    pub(super) fn truncate(&mut self, id: FileId, fh: Option<u64>, size: u64) -> Sys<()> {
        match fh.and_then(|fh| self.handles.get(&fh)) {
            Some(h) => h.file.set_len(size).map_err(sys::io_errno)?,
            None => sys::reopen(self.fd(id)?, libc::O_WRONLY)?.set_len(size).map_err(sys::io_errno)?,
        }
        if !self.volatile.contains(&id) {
            self.log(Op::Truncate { file: id, size });
        }
        Ok(())
    }

    fn handle(&mut self, file: File, id: FileId) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle { file, id });
        fh
    }

    pub(super) fn create(&mut self, parent: FileId, name: &OsStr, mode: u32) -> Sys<(FileAttr, u64)> {
        let file = sys::create_file(self.fd(parent)?, name, mode & 0o7777)?;
        let (id, attr) = self.new_entry(parent, name)?;
        self.log(Op::Create { dir: parent, name: name.to_os_string(), file: id });
        Ok((attr, self.handle(file, id)))
    }

    pub(super) fn open(&mut self, id: FileId, flags: i32) -> Sys<u64> {
        let file = sys::reopen(self.fd(id)?, flags & libc::O_ACCMODE)?;
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.truncate(id, None, 0)?;
        }
        Ok(self.handle(file, id))
    }

    pub(super) fn write(&mut self, fh: u64, offset: u64, data: &[u8]) -> Sys<u32> {
        let id = self.handles.get(&fh).ok_or(Errno::EBADF)?.id;
        let volatile = self.volatile.contains(&id);
        if !volatile {
            self.fault(false, id)?;
        }
        let h = self.handles.get(&fh).ok_or(Errno::EBADF)?;
        h.file.write_all_at(data, offset).map_err(sys::io_errno)?;
        if !volatile {
            self.log(Op::Write { file: id, offset, data: Arc::from(data) });
        }
        Ok(data.len() as u32)
    }

    pub(super) fn fsync(&mut self, fh: u64, datasync: bool) -> Sys<()> {
        let id = self.handles.get(&fh).ok_or(Errno::EBADF)?.id;
        if self.volatile.contains(&id) {
            return Ok(());
        }
        self.fault(true, id)?;
        self.log(Op::Fsync { file: id, datasync });
        Ok(())
    }

    pub(super) fn fsyncdir(&mut self, id: FileId) -> Sys<()> {
        self.fd(id)?;
        self.fault(true, id)?;
        self.log(Op::FsyncDir { dir: id });
        Ok(())
    }

    pub(super) fn mkdir(&mut self, parent: FileId, name: &OsStr, mode: u32) -> Sys<FileAttr> {
        sys::mkdir(self.fd(parent)?, name, mode & 0o7777)?;
        let (id, attr) = self.new_entry(parent, name)?;
        self.log(Op::Mkdir { dir: parent, name: name.to_os_string(), new: id });
        Ok(attr)
    }

    pub(super) fn mknod(&mut self, parent: FileId, name: &OsStr, mode: u32) -> Sys<FileAttr> {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EPERM);
        }
        drop(sys::create_file(self.fd(parent)?, name, mode & 0o7777)?);
        let (id, attr) = self.new_entry(parent, name)?;
        self.log(Op::Create { dir: parent, name: name.to_os_string(), file: id });
        Ok(attr)
    }

    pub(super) fn symlink(&mut self, parent: FileId, name: &OsStr, target: &Path) -> Sys<FileAttr> {
        sys::symlink(self.fd(parent)?, name, target.as_os_str())?;
        let (id, attr) = self.new_entry(parent, name)?;
        self.log(Op::Symlink { dir: parent, name: name.to_os_string(), target: target.as_os_str().into(), new: id });
        Ok(attr)
    }

    pub(super) fn link(&mut self, id: FileId, parent: FileId, name: &OsStr) -> Sys<FileAttr> {
        sys::link(self.fd(id)?, self.fd(parent)?, name)?;
        let attr = self.lookup(parent, name)?;
        self.log(Op::Link { file: id, dir: parent, name: name.to_os_string() });
        Ok(attr)
    }

    pub(super) fn unlink(&mut self, parent: FileId, name: &OsStr, is_dir: bool) -> Sys<()> {
        let ino = sys::ino_at(self.fd(parent)?, name)?;
        sys::unlink(self.fd(parent)?, name, is_dir)?;
        let file = self.id_of_ino(ino);
        let name = name.to_os_string();
        self.log(if is_dir { Op::Rmdir { dir: parent, name, file } } else { Op::Unlink { dir: parent, name, file } });
        Ok(())
    }

    pub(super) fn rename(
        &mut self,
        parent: FileId,
        name: &OsStr,
        newparent: FileId,
        newname: &OsStr,
        flags: u32,
    ) -> Sys<()> {
        let ino = sys::ino_at(self.fd(parent)?, name)?;
        let other = sys::ino_at(self.fd(newparent)?, newname).ok();
        sys::rename(self.fd(parent)?, name, self.fd(newparent)?, newname, flags)?;
        let file = self.id_of_ino(ino);
        let other = other.map(|o| self.id_of_ino(o));
        self.names.insert(file, newname.to_os_string());
        self.log(Op::Rename {
            from_dir: parent,
            from_name: name.to_os_string(),
            to_dir: newparent,
            to_name: newname.to_os_string(),
            file,
            other,
            flags,
        });
        Ok(())
    }

    pub(super) fn readdir(&mut self, id: FileId) -> Sys<Vec<(u64, fuser::FileType, OsString)>> {
        let dir = sys::proc_path(self.fd(id)?);
        let mut out = vec![
            (id, fuser::FileType::Directory, OsString::from(".")),
            (ROOT, fuser::FileType::Directory, "..".into()),
        ];
        let mut children: Vec<_> = std::fs::read_dir(&dir).map_err(sys::io_errno)?.flatten().collect();
        children.sort_by_key(|e| e.file_name());
        for e in children {
            use std::os::unix::fs::{DirEntryExt, FileTypeExt};
            let Ok(t) = e.file_type() else { continue };
            let kind = if t.is_dir() {
                fuser::FileType::Directory
            } else if t.is_symlink() {
                fuser::FileType::Symlink
            } else if t.is_fifo() {
                fuser::FileType::NamedPipe
            } else {
                fuser::FileType::RegularFile
            };
            let ino = self.by_ino.get(&e.ino()).copied().unwrap_or(1 << 48 | e.ino());
            out.push((ino, kind, e.file_name()));
        }
        Ok(out)
    }
}
