//! `fuser::Filesystem` over one scope's `ScopeEngine`: each callback makes one engine call and maps its result.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, PollEvents, PollFlags, PollNotifier, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use scopefs::engine::{Attr, Ino, ScopeEngine, SetAttr};

use crate::errno::{is_internal, Failure};

/// Conversions between kernel and engine types.
#[path = "adapter_convert.rs"]
mod convert;
/// Extended attributes and `fallocate` (their callbacks' bodies).
#[path = "adapter_xattr.rs"]
mod xattr;

use convert::*;

/// The kernel fast paths a mount asks for (the `[fuse]` configuration section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastPaths {
    /// Largest write the kernel may send in one request, bytes (the kernel may cap it lower).
    pub max_write: u32,
    /// Keep a file's cached pages across opens (`FOPEN_KEEP_CACHE`); changes made outside the
    /// mount drop them through the notifier (`crate::mount`).
    pub keep_cache: bool,
    /// `FUSE_WRITEBACK_CACHE`: the kernel buffers writes; a refused write surfaces on the
    /// `flush` of `close` or on `fsync` (the kernel writes dirty pages back before both).
    pub writeback_cache: bool,
    /// Readahead of the mount's backing device, KiB (`crate::mount` sets it after mounting).
    pub readahead_kib: u32,
}

impl Default for FastPaths {
    fn default() -> Self {
        FastPaths { max_write: 1024 * 1024, keep_cache: true, writeback_cache: false, readahead_kib: 1024 }
    }
}
/// Inode numbers are never reused, so the generation is always 0.
const GENERATION: Generation = Generation(0);
/// The bit the kernel sets in the id of a request it hands a server again after its previous
/// server died (`FUSE_UNIQUE_RESEND`, Linux 6.9, after `FUSE_NOTIFY_RESEND`).
const RESEND_BIT: u64 = 1 << 63;

/// Runs one engine call; an engine error becomes its errno, a panic becomes `EIO`. Every call is
/// counted with its latency, refusals and unsupported requests by kind (`crate::metrics`).
fn call<T, E: Into<Failure>>(op: &'static str, f: impl FnOnce() -> Result<T, E>) -> Result<T, Errno> {
    let _running = crate::pause::enter();
    let started = std::time::Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| f().map_err(Into::into)));
    crate::metrics::record(op, started.elapsed(), matches!(outcome, Ok(Ok(_))));
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => {
            match &failure {
                Failure::Engine(err) if is_internal(err) => tracing::warn!(op, error = %err, "engine operation failed"),
                Failure::Engine(err) => {
                    crate::metrics::note_refusal(err);
                    tracing::debug!(op, error = %err, "engine operation refused");
                }
                Failure::Unsupported(_) | Failure::NotImplemented => {
                    crate::metrics::note_unsupported(op);
                    tracing::debug!(op, ?failure, "unsupported request");
                }
            }
            Err(failure.errno())
        }
        Err(_) => {
            tracing::error!(op, "engine operation panicked; answering EIO");
            Err(Errno::EIO)
        }
    }
}

/// Answers an operation this filesystem does not implement (`ENOSYS`), through `call`.
fn not_implemented(op: &'static str) -> Errno {
    call(op, || Err::<(), _>(Failure::NotImplemented)).err().unwrap_or(Errno::ENOSYS)
}

/// Directory-stream offsets (the kernel's cookies). A stream is stateless: 0 starts at `.`,
/// [`DOTDOT_COOKIE`] resumes at `..`, and `CHILD_COOKIE_BASE + cursor` resumes after the entry with that engine cursor.
/// Children come from the engine in inode order, a page at a time, and inode numbers are never
/// reused, so a cookie stays valid whatever happens to the directory: no child is returned twice,
/// a walk always ends, and an open handle costs the daemon no memory.
const DOTDOT_COOKIE: u64 = 1;
const CHILD_COOKIE_BASE: u64 = 2;
/// Children fetched from the engine per page (a kernel buffer holds fewer; the rest are fetched again).
const READDIR_PAGE: usize = 128;

/// One entry of a directory stream, as handed to a reply: inode, cookie of the next entry,
/// type, name, and attributes (none for `.` and `..`).
type StreamEntry<'a> = (Ino, u64, FileType, &'a [u8], Option<&'a Attr>);

/// One mounted scope.
pub struct ScopeFs {
    engine: Arc<ScopeEngine>,
    ttl: Duration,
    /// Open directory handles; `opendir` beyond `max_dir_handles` answers `ENFILE`.
    open_dirs: AtomicU64,
    max_dir_handles: u64,
    fast: FastPaths,
    /// This mount's share of the threads that answer fsyncs off the workers.
    offload: crate::offload::Offload,
}

impl ScopeFs {
    /// `max_dir_handles` bounds the open directory handles of this mount (`limits.max_dir_handles_per_mount`).
    pub fn new(engine: Arc<ScopeEngine>, ttl: Duration, max_dir_handles: u64) -> ScopeFs {
        ScopeFs {
            engine,
            ttl,
            open_dirs: AtomicU64::new(0),
            max_dir_handles,
            fast: FastPaths::default(),
            offload: crate::offload::Offload::new(0),
        }
    }

    /// Lets up to `n` of this mount's fsyncs at once wait for their uploads off the FUSE workers
    /// (`offload.rs`; 0: every fsync runs on its worker).
    pub fn with_fsync_threads(mut self, n: usize) -> ScopeFs {
        self.offload = crate::offload::Offload::new(n);
        self
    }

    /// The kernel fast paths this mount asks for at `init` and in its open replies.
    pub fn with_fast_paths(mut self, fast: FastPaths) -> ScopeFs {
        self.fast = fast;
        self
    }

    /// Runs a mutating request as one the engine can answer again if the kernel resends it to a
    /// later process (`ScopeEngine::begin_request`); held until the reply is sent.
    fn request(&self, req: &Request) -> scopefs::engine::RequestScope<'_> {
        let unique = req.unique().0;
        self.engine.begin_request(unique & !RESEND_BIT, unique & RESEND_BIT != 0)
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<Attr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&self.ttl, &file_attr(&attr), GENERATION),
            Err(e) => reply.error(e),
        }
    }

    /// Takes one directory handle, or refuses with `ENFILE` at the bound.
    fn take_dir_handle(&self) -> Result<(), Errno> {
        let max = self.max_dir_handles;
        match self.open_dirs.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)) {
            Ok(_) => Ok(()),
            Err(_) => {
                scopefs::limits::refuse(scopefs::limits::Bound::DirHandles);
                tracing::debug!("directory handle bound reached; answering ENFILE");
                Err(Errno::ENFILE)
            }
        }
    }

    fn give_dir_handle(&self) {
        let _ = self.open_dirs.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Feeds the stream of directory `ino` from `offset` to `add` until `add` reports the reply
    /// full or the directory ends. Each page is read from the engine when it is needed.
    fn stream(&self, ino: Ino, offset: u64, mut add: impl FnMut(StreamEntry<'_>) -> bool) -> Result<(), Errno> {
        if offset == 0 && add((ino, DOTDOT_COOKIE, FileType::Directory, b".", None)) {
            return Ok(());
        }
        if offset <= DOTDOT_COOKIE {
            let parent = call("parent_of", || self.engine.parent_of(ino))?;
            if add((parent, CHILD_COOKIE_BASE, FileType::Directory, b"..", None)) {
                return Ok(());
            }
        }
        let mut after = offset.saturating_sub(CHILD_COOKIE_BASE);
        loop {
            let page = call("readdir", || self.engine.readdir_page(ino, after, READDIR_PAGE))?;
            for e in &page {
                let next = e.cursor.saturating_add(CHILD_COOKIE_BASE);
                if add((e.attr.ino, next, file_type(e.attr.kind), e.name.as_slice(), Some(&e.attr))) {
                    return Ok(());
                }
            }
            match page.last() {
                Some(last) if page.len() == READDIR_PAGE => after = last.cursor,
                _ => return Ok(()),
            }
        }
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for ScopeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let mut wanted = vec![
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // The engine clears set-user/group-ID bits on the requests the kernel flags
            // (`privs.rs`), so the kernel stops asking for `security.capability` before each write.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ];
        // Without it a quota error (EDQUOT) surfaces on write(); with it, on close() or fsync().
        if self.fast.writeback_cache {
            wanted.push(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        for flag in wanted {
            if config.add_capabilities(flag).is_err() {
                tracing::debug!(?flag, "kernel lacks FUSE capability");
            }
        }
        if let Err(nearest) = config.set_max_write(self.fast.max_write) {
            let _ = config.set_max_write(nearest);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        crate::pause::test_stall(name.as_bytes());
        match call("lookup", || self.engine.lookup(parent.0, name.as_bytes())) {
            // A missing name is cached by the kernel as a negative entry (inode 0) for the entry
            // TTL: tools that look for the same absent files again (git's ignore files, a build's
            // probes) ask once. Names created through the mount replace it at once; a change made
            // through the HTTP API invalidates it (`crate::mount`).
            Err(Errno::ENOENT) if !self.ttl.is_zero() => reply.entry(&self.ttl, &dot_attr(0), GENERATION),
            r => self.reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // Inode numbers are never reused, so nothing is released, except on a resumed mount an
        // inode without a name kept for the kernel (the kernel forgets an inode once, whole).
        self.engine.forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match call("getattr", || self.engine.getattr(ino.0)) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
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
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let changes = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            kill_suidgid,
        };
        match call("setattr", || self.engine.setattr(ino.0, &changes)) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match call("readlink", || self.engine.readlink(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _request = self.request(req);
        let r = call("mknod", || -> Result<Attr, Failure> {
            Ok(self.engine.mknod(parent.0, name.as_bytes(), mknod_kind(mode)?, mode & 0o7777, rdev, owner(req))?)
        });
        self.reply_entry(reply, r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let _request = self.request(req);
        let r = call("mkdir", || self.engine.mkdir(parent.0, name.as_bytes(), mode & 0o7777, owner(req)));
        crate::pause::test_stall_after(name.as_bytes());
        self.reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _request = self.request(req);
        reply_empty(reply, call("unlink", || self.engine.unlink(parent.0, name.as_bytes())));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _request = self.request(req);
        reply_empty(reply, call("rmdir", || self.engine.rmdir(parent.0, name.as_bytes())));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        let _request = self.request(req);
        let r = call("symlink", || {
            self.engine.symlink(parent.0, link_name.as_bytes(), target.as_os_str().as_bytes(), owner(req))
        });
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _request = self.request(req);
        let r = call("rename", || -> Result<(), Failure> {
            let mode = rename_mode(flags.bits())?;
            Ok(self.engine.rename(parent.0, name.as_bytes(), newparent.0, newname.as_bytes(), mode)?)
        });
        crate::pause::test_stall_after(newname.as_bytes());
        reply_empty(reply, r);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _request = self.request(req);
        let r = call("link", || self.engine.link(ino.0, newparent.0, newname.as_bytes()));
        self.reply_entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: fuser::OpenFlags, reply: ReplyOpen) {
        match call("open", || self.engine.open(ino.0, open_flags(flags.0))) {
            Ok(opened) => reply.opened(FileHandle(opened.fh), fopen_flags(&self.fast, &opened)),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match call("read", || self.engine.read(ino.0, fh.0, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // `FUSE_HANDLE_KILLPRIV_V2`: the caller lacks CAP_FSETID, so set-user/group-ID bits go.
        let written = if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            call("write", || self.engine.write_unprivileged(ino.0, fh.0, offset, data))
        } else {
            call("write", || self.engine.write(ino.0, fh.0, offset, data))
        };
        match written {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply_empty(reply, call("flush", || self.engine.flush(ino.0, fh.0)));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, call("release", || self.engine.release(ino.0, fh.0)));
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let engine = self.engine.clone();
        self.offload.run(move || reply_empty(reply, call("fsync", || engine.fsync(ino.0, Some(fh.0)))));
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        match self.take_dir_handle() {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let streamed = self.stream(ino.0, offset, |(child, next, kind, name, _)| {
            reply.add(INodeNo(child), next, kind, OsStr::from_bytes(name))
        });
        match streamed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let streamed = self.stream(ino.0, offset, |(child, next, _, name, attr)| {
            let attr = attr.map(file_attr).unwrap_or_else(|| dot_attr(child));
            reply.add(INodeNo(child), next, OsStr::from_bytes(name), &self.ttl, &attr, GENERATION)
        });
        match streamed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _flags: fuser::OpenFlags, reply: ReplyEmpty) {
        self.give_dir_handle();
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, call("fsyncdir", || self.engine.fsync_dir()));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match call("statfs", || self.engine.statfs()) {
            Ok(st) => reply.statfs(
                st.total_blocks,
                st.free_blocks,
                st.free_blocks,
                st.total_inodes,
                st.free_inodes,
                st.block_size,
                st.max_name_len,
                st.block_size,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _request = self.request(req);
        self.do_setxattr(ino, name, value, flags, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.do_getxattr(ino, name, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.do_listxattr(ino, size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _request = self.request(req);
        self.do_removexattr(ino, name, reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions makes the kernel check modes; answer for existing inodes.
        reply_empty(reply, call("access", || self.engine.getattr(ino.0).map(drop)));
    }

    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, _umask: u32, flags: i32, reply: ReplyCreate) {
        let _request = self.request(req);
        let r = call("tmpfile", || self.engine.tmpfile(parent.0, mode & 0o7777, open_flags(flags), owner(req)));
        match r {
            // The kernel takes the one link it is told of away itself (`d_tmpfile`).
            Ok((attr, opened)) => reply.created(
                &self.ttl,
                &FileAttr { nlink: 1, ..file_attr(&attr) },
                GENERATION,
                FileHandle(opened.fh),
                fopen_flags(&self.fast, &opened),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _request = self.request(req);
        let r = call("create", || {
            self.engine.create(parent.0, name.as_bytes(), mode & 0o7777, open_flags(flags), owner(req))
        });
        crate::pause::test_stall_after(name.as_bytes());
        match r {
            Ok((attr, opened)) => reply.created(
                &self.ttl,
                &file_attr(&attr),
                GENERATION,
                FileHandle(opened.fh),
                fopen_flags(&self.fast, &opened),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.do_fallocate(ino, fh, offset, length, mode, reply);
    }

    // Operations this filesystem does not implement: `ENOSYS` as fuser's defaults, but counted.

    fn lseek(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: i64, _whence: i32, reply: ReplyLseek) {
        reply.error(not_implemented("lseek"));
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(not_implemented("copy_file_range"));
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(not_implemented("ioctl"));
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        reply.error(not_implemented("poll"));
    }
}

#[cfg(test)]
mod tests {
    use scopefs::engine::EngineResult;

    use super::*;

    #[test]
    fn a_panicking_engine_call_answers_eio() {
        let r: Result<(), Errno> = call("test", || -> EngineResult<()> { panic!("boom") });
        assert_eq!(r, Err(Errno::EIO));
        let r: Result<u32, Errno> = call("test", || EngineResult::Ok(7));
        assert_eq!(r, Ok(7));
        let r: Result<u32, Errno> = call("test", || Err(scopefs::engine::EngineError::NotEmpty));
        assert_eq!(r, Err(Errno::ENOTEMPTY));
    }

    #[test]
    fn unsupported_requests_go_through_call_and_are_counted_by_operation() {
        let count = |op| crate::metrics::unsupported().into_iter().find(|(o, _)| *o == op).map_or(0, |(_, n)| n);
        let stats =
            |op| crate::metrics::snapshot().into_iter().find(|(o, _)| *o == op).map(|(_, s)| (s.count, s.errors));
        assert_eq!(not_implemented("test-unimplemented"), Errno::ENOSYS);
        let r: Result<(), Errno> = call("test-rename", || rename_mode(libc::RENAME_WHITEOUT).map(drop));
        assert_eq!(r, Err(Errno::EINVAL));
        let r: Result<(), Errno> = call("test-engine", || Err(scopefs::engine::EngineError::NotEmpty));
        assert_eq!(r, Err(Errno::ENOTEMPTY));
        assert_eq!((count("test-unimplemented"), count("test-rename"), count("test-engine")), (1, 1, 0));
        assert_eq!(stats("test-unimplemented"), Some((1, 1)), "counted as a failed operation too");
    }
}
