//! A power-loss model in software: a FUSE pass-through filesystem over a backing directory that
//! remembers, per file, the content it had at its last `fsync`/`fdatasync`, and can produce the
//! image a power loss would leave: every regular file holds its last fsynced content (empty if it
//! was never fsynced). Namespace operations (create, mkdir, rename, link, unlink) count as durable
//! at once (the lenient side of the model); file data counts only once fsynced (the strict side,
//! which is what a filesystem's durability contract is about). It also counts the flushes it
//! receives, so a test can assert that a path issues none.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, MountOption,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

const TTL: Duration = Duration::ZERO;

#[derive(Default)]
struct State {
    /// FUSE inode → (parent inode, name): the name it was last seen under.
    names: HashMap<u64, (u64, OsString)>,
    /// Backing inode number → content at its last fsync.
    durable: HashMap<u64, Vec<u8>>,
    handles: HashMap<u64, File>,
    next_fh: u64,
}

/// What the test keeps: the model's state and counters, shared with the mounted filesystem.
pub struct Model {
    backing: PathBuf,
    root_ino: u64,
    state: Mutex<State>,
    /// `fsync`/`fdatasync` of regular files received.
    pub file_syncs: AtomicU64,
    /// `fsync` of directories received.
    pub dir_syncs: AtomicU64,
}

struct PowerLossFs(Arc<Model>);

/// A mounted model; unmounts on drop.
pub struct PowerLossMount {
    pub model: Arc<Model>,
    pub mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl PowerLossMount {
    /// Mounts the model of `backing` at `mountpoint` (both must exist). Files already in `backing`
    /// count as durable with their current content.
    pub fn mount(backing: &Path, mountpoint: &Path) -> PowerLossMount {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: the power-loss model is a FUSE filesystem (run as root on a FUSE-capable host)"
        );
        let root_ino = fs::metadata(backing).expect("backing dir").ino();
        let model = Arc::new(Model {
            backing: backing.to_path_buf(),
            root_ino,
            state: Mutex::new(State::default()),
            file_syncs: AtomicU64::new(0),
            dir_syncs: AtomicU64::new(0),
        });
        for (ino, path) in walk_files(backing) {
            let data = fs::read(&path).expect("read existing backing file");
            model.state.lock().durable.insert(ino, data);
        }
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("powerloss-model".into()), MountOption::NoDev];
        let session = fuser::spawn_mount(PowerLossFs(model.clone()), mountpoint, &config).expect("mount the model");
        PowerLossMount { model, mountpoint: mountpoint.to_path_buf(), session: Some(session) }
    }

    /// Flushes received so far (file fsyncs plus directory fsyncs).
    pub fn flushes(&self) -> u64 {
        self.model.file_syncs.load(Ordering::SeqCst) + self.model.dir_syncs.load(Ordering::SeqCst)
    }

    /// Writes what a power loss now would leave into `dest` (created): the directory tree as it is,
    /// each regular file with its last fsynced content, or empty when never fsynced.
    pub fn power_loss_image(&self, dest: &Path) {
        let st = self.model.state.lock();
        let mut todo = vec![(self.model.backing.clone(), dest.to_path_buf())];
        while let Some((src, dst)) = todo.pop() {
            fs::create_dir_all(&dst).unwrap();
            let mode = fs::metadata(&src).unwrap().mode() & 0o7777;
            fs::set_permissions(&dst, fs::Permissions::from_mode(mode)).unwrap();
            for e in fs::read_dir(&src).unwrap().flatten() {
                let m = fs::symlink_metadata(e.path()).unwrap();
                let target = dst.join(e.file_name());
                if m.is_dir() {
                    todo.push((e.path(), target));
                } else if m.is_file() {
                    let data = st.durable.get(&m.ino()).map(Vec::as_slice).unwrap_or(&[]);
                    fs::write(&target, data).unwrap();
                    fs::set_permissions(&target, fs::Permissions::from_mode(m.mode() & 0o7777)).unwrap();
                }
            }
        }
    }

    /// Detaches the mount (files still open keep the connection until they close) and waits for
    /// the serving thread to end.
    pub fn unmount(mut self) {
        self.detach();
        if let Some(s) = self.session.take() {
            s.join().expect("the model's session ends");
        }
    }

    fn detach(&self) {
        let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; umount2 does not keep it.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Drop for PowerLossMount {
    fn drop(&mut self) {
        if self.session.is_some() {
            // A failed test: detach and leave the serving thread to end with the last open file.
            self.detach();
        }
    }
}

/// (inode, path) of every regular file below `dir`.
fn walk_files(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else if m.is_file() {
                out.push((m.ino(), e.path()));
            }
        }
    }
    out
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Model {
    fn fuse_ino(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_ino {
            1
        } else {
            backing_ino
        }
    }

    fn path_of(&self, st: &State, ino: u64) -> Result<PathBuf, Errno> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != 1 {
            let (parent, name) = st.names.get(&cur).ok_or(Errno::ESTALE)?;
            parts.push(name.clone());
            cur = *parent;
        }
        let mut p = self.backing.clone();
        for part in parts.iter().rev() {
            p.push(part);
        }
        Ok(p)
    }

    fn attr(&self, m: &fs::Metadata) -> FileAttr {
        let kind = if m.is_dir() {
            FileType::Directory
        } else if m.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        let t = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        FileAttr {
            ino: INodeNo(self.fuse_ino(m.ino())),
            size: m.size(),
            blocks: m.blocks(),
            atime: t(m.atime(), m.atime_nsec()),
            mtime: t(m.mtime(), m.mtime_nsec()),
            ctime: t(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    /// Stats `parent/name`, records the name and returns its attributes.
    fn entry(&self, st: &mut State, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let p = self.path_of(st, parent)?.join(name);
        let m = fs::symlink_metadata(&p).map_err(errno)?;
        let attr = self.attr(&m);
        st.names.insert(attr.ino.0, (parent, name.to_os_string()));
        Ok(attr)
    }
}

impl Filesystem for PowerLossFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.0.state.lock();
        match self.0.entry(&mut st, parent.0, name) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.0.state.lock();
        let m = match fh.and_then(|fh| st.handles.get(&fh.0)) {
            Some(f) => f.metadata().map_err(errno),
            None => self.0.path_of(&st, ino.0).and_then(|p| fs::symlink_metadata(p).map_err(errno)),
        };
        match m {
            Ok(m) => reply.attr(&TTL, &self.0.attr(&m)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let st = self.0.state.lock();
        let result = (|| -> Result<fs::Metadata, Errno> {
            let p = self.0.path_of(&st, ino.0);
            if let Some(size) = size {
                match fh.and_then(|fh| st.handles.get(&fh.0)) {
                    Some(f) => f.set_len(size).map_err(errno)?,
                    None => {
                        OpenOptions::new().write(true).open(p.clone()?).and_then(|f| f.set_len(size)).map_err(errno)?
                    }
                }
            }
            if let Some(mode) = mode {
                fs::set_permissions(p.clone()?, fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::chown(p.clone()?, uid, gid).map_err(errno)?;
            }
            match fh.and_then(|fh| st.handles.get(&fh.0)) {
                Some(f) => f.metadata().map_err(errno),
                None => fs::symlink_metadata(p?).map_err(errno),
            }
        })();
        match result {
            Ok(m) => reply.attr(&TTL, &self.0.attr(&m)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut st = self.0.state.lock();
        let result = self.0.path_of(&st, parent.0).and_then(|p| {
            let p = p.join(name);
            fs::create_dir(&p).map_err(errno)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(mode & !umask & 0o7777)).map_err(errno)
        });
        match result.and_then(|()| self.0.entry(&mut st, parent.0, name)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let st = self.0.state.lock();
        match self.0.path_of(&st, parent.0).and_then(|p| fs::remove_file(p.join(name)).map_err(errno)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let st = self.0.state.lock();
        match self.0.path_of(&st, parent.0).and_then(|p| fs::remove_dir(p.join(name)).map_err(errno)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let mut st = self.0.state.lock();
        let result = (|| -> Result<(), Errno> {
            let from = self.0.path_of(&st, parent.0)?.join(name);
            let to = self.0.path_of(&st, newparent.0)?.join(newname);
            let ino = self.0.fuse_ino(fs::symlink_metadata(&from).map_err(errno)?.ino());
            fs::rename(&from, &to).map_err(errno)?;
            st.names.insert(ino, (newparent.0, newname.to_os_string()));
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let mut st = self.0.state.lock();
        let result = (|| -> Result<FileAttr, Errno> {
            let from = self.0.path_of(&st, ino.0)?;
            let to = self.0.path_of(&st, newparent.0)?.join(newname);
            fs::hard_link(&from, &to).map_err(errno)?;
            self.0.entry(&mut st, newparent.0, newname)
        })();
        match result {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.0.state.lock();
        let write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        let opened = self.0.path_of(&st, ino.0).and_then(|p| {
            OpenOptions::new()
                .read(true)
                .write(write)
                .truncate(write && flags.0 & libc::O_TRUNC != 0)
                .open(p)
                .map_err(errno)
        });
        match opened {
            Ok(f) => {
                st.next_fh += 1;
                let fh = st.next_fh;
                st.handles.insert(fh, f);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.0.state.lock();
        let result = (|| -> Result<(FileAttr, File), Errno> {
            let p = self.0.path_of(&st, parent.0)?.join(name);
            let existed = p.exists();
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .create_new(flags & libc::O_EXCL != 0)
                .truncate(flags & libc::O_TRUNC != 0)
                .mode(mode & !umask & 0o7777)
                .open(&p)
                .map_err(errno)?;
            let m = f.metadata().map_err(errno)?;
            if !existed {
                // A new inode: whatever an earlier file of that number had fsynced is not its content.
                st.durable.remove(&m.ino());
            }
            let attr = self.0.attr(&m);
            st.names.insert(attr.ino.0, (parent.0, name.to_os_string()));
            Ok((attr, f))
        })();
        match result {
            Ok((attr, f)) => {
                st.next_fh += 1;
                let fh = st.next_fh;
                st.handles.insert(fh, f);
                reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.0.state.lock();
        let Some(f) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match f.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return reply.error(errno(e)),
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let st = self.0.state.lock();
        let Some(f) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        match f.write_all_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.state.lock().handles.remove(&fh.0);
        reply.ok();
    }

    /// The durability point of the model: the file's current content becomes what survives.
    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.0.file_syncs.fetch_add(1, Ordering::SeqCst);
        let mut st = self.0.state.lock();
        let Some(f) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        let snapshot = f.metadata().and_then(|m| {
            let mut data = vec![0u8; m.size() as usize];
            f.read_exact_at(&mut data, 0).map(|()| (m.ino(), data))
        });
        match snapshot {
            Ok((ino, data)) => {
                st.durable.insert(ino, data);
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut st = self.0.state.lock();
        let dir = match self.0.path_of(&st, ino.0) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let mut entries =
            vec![(ino.0, FileType::Directory, OsString::from(".")), (1, FileType::Directory, "..".into())];
        let listed = match fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        let mut children: Vec<_> = listed.flatten().collect();
        children.sort_by_key(|e| e.file_name());
        for e in children {
            let Ok(m) = fs::symlink_metadata(e.path()) else { continue };
            let attr = self.0.attr(&m);
            st.names.insert(attr.ino.0, (ino.0, e.file_name()));
            entries.push((attr.ino.0, attr.kind, e.file_name()));
        }
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    /// Names are durable at once in this model; only counted.
    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.0.dir_syncs.fetch_add(1, Ordering::SeqCst);
        reply.ok();
    }
}

/// An object store that holds back uploads: while held, a `put` of a key outside `allowed`
/// waits until `release` (so those blocks exist only in local staging), others go through.
pub struct HeldStore {
    inner: Arc<dyn scopefs::store::ObjectStore>,
    held: std::sync::atomic::AtomicBool,
    allowed: Mutex<std::collections::HashSet<String>>,
    released: tokio::sync::Notify,
}

impl HeldStore {
    pub fn new(inner: Arc<dyn scopefs::store::ObjectStore>) -> Arc<HeldStore> {
        Arc::new(HeldStore {
            inner,
            held: std::sync::atomic::AtomicBool::new(true),
            allowed: Mutex::new(Default::default()),
            released: tokio::sync::Notify::new(),
        })
    }

    /// Lets uploads of the blocks of `data` (cut in `block_size` pieces) of `scope` through.
    pub fn allow_content(&self, scope: &str, data: &[u8], block_size: usize) {
        use sha2::Digest;
        for chunk in data.chunks(block_size) {
            let key = scopefs::store::block_key(scope, &hex::encode(sha2::Sha256::digest(chunk)));
            self.allowed.lock().insert(key);
        }
    }

    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }
}

#[async_trait::async_trait]
impl scopefs::store::ObjectStore for HeldStore {
    async fn put(&self, key: &str, data: bytes::Bytes) -> Result<(), scopefs::store::StoreError> {
        loop {
            let wait = self.released.notified();
            if !self.held.load(Ordering::SeqCst) || self.allowed.lock().contains(key) {
                break;
            }
            wait.await;
        }
        self.inner.put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<bytes::Bytes, scopefs::store::StoreError> {
        self.inner.get(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<u64>, scopefs::store::StoreError> {
        self.inner.head(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), scopefs::store::StoreError> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<scopefs::store::ObjectInfo>, scopefs::store::StoreError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "held-store".into()
    }
}
