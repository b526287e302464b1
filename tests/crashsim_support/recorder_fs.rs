//! The FUSE side of the recording layer: each request of the kernel served from the recorder's
//! state (`recorder::State`) under its lock, one request at a time.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fuser::{Errno, FileHandle, Generation, INodeNo};
use parking_lot::Mutex;

use super::passthrough as sys;
use super::recorder_state::State;

const TTL: Duration = Duration::ZERO;

/// The filesystem served by the FUSE session.
pub(super) struct RecordingFs(pub(super) Arc<Mutex<State>>);

/// Answers `reply` with the result of `f` run under the state lock.
macro_rules! serve {
    ($self:ident, $reply:ident, |$st:ident| $body:expr, |$ok:ident| $answer:expr) => {{
        let result = {
            let mut guard = $self.0.lock();
            let $st: &mut State = &mut guard;
            $body
        };
        match result {
            Ok($ok) => $answer,
            Err(e) => $reply.error(e),
        }
    }};
}

impl fuser::Filesystem for RecordingFs {
    fn lookup(&self, _req: &fuser::Request, parent: INodeNo, name: &OsStr, reply: fuser::ReplyEntry) {
        serve!(self, reply, |st| st.lookup(parent.0, name), |a| reply.entry(&TTL, &a, Generation(0)))
    }

    fn forget(&self, _req: &fuser::Request, ino: INodeNo, nlookup: u64) {
        self.0.lock().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &fuser::Request, ino: INodeNo, fh: Option<FileHandle>, reply: fuser::ReplyAttr) {
        serve!(self, reply, |st| st.getattr(ino.0, fh.map(|f| f.0)), |a| reply.attr(&TTL, &a))
    }

    fn setattr(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        _kill_suidgid: bool,
        reply: fuser::ReplyAttr,
    ) {
        let fh = fh.map(|f| f.0);
        serve!(
            self,
            reply,
            |st| (|| {
                if let Some(size) = size {
                    st.truncate(ino.0, fh, size)?;
                }
                if let Some(mode) = mode {
                    sys::chmod(st.fd(ino.0)?, mode)?;
                }
                if uid.is_some() || gid.is_some() {
                    sys::chown(st.fd(ino.0)?, uid, gid)?;
                }
                st.getattr(ino.0, fh)
            })(),
            |a| reply.attr(&TTL, &a)
        )
    }

    fn readlink(&self, _req: &fuser::Request, ino: INodeNo, reply: fuser::ReplyData) {
        serve!(self, reply, |st| st.fd(ino.0).and_then(sys::readlink), |t| reply.data(&t))
    }

    fn mknod(
        &self,
        _req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: fuser::ReplyEntry,
    ) {
        serve!(self, reply, |st| st.mknod(parent.0, name, mode & !umask), |a| reply.entry(&TTL, &a, Generation(0)))
    }

    fn mkdir(
        &self,
        _req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: fuser::ReplyEntry,
    ) {
        serve!(self, reply, |st| st.mkdir(parent.0, name, mode & !umask), |a| reply.entry(&TTL, &a, Generation(0)))
    }

    fn unlink(&self, _req: &fuser::Request, parent: INodeNo, name: &OsStr, reply: fuser::ReplyEmpty) {
        serve!(self, reply, |st| st.unlink(parent.0, name, false), |_u| reply.ok())
    }

    fn rmdir(&self, _req: &fuser::Request, parent: INodeNo, name: &OsStr, reply: fuser::ReplyEmpty) {
        serve!(self, reply, |st| st.unlink(parent.0, name, true), |_u| reply.ok())
    }

    fn symlink(&self, _req: &fuser::Request, parent: INodeNo, name: &OsStr, target: &Path, reply: fuser::ReplyEntry) {
        serve!(self, reply, |st| st.symlink(parent.0, name, target), |a| reply.entry(&TTL, &a, Generation(0)))
    }

    fn rename(
        &self,
        _req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: fuser::ReplyEmpty,
    ) {
        serve!(self, reply, |st| st.rename(parent.0, name, newparent.0, newname, flags.bits()), |_u| reply.ok())
    }

    fn link(&self, _req: &fuser::Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: fuser::ReplyEntry) {
        serve!(self, reply, |st| st.link(ino.0, newparent.0, newname), |a| reply.entry(&TTL, &a, Generation(0)))
    }

    fn open(&self, _req: &fuser::Request, ino: INodeNo, flags: fuser::OpenFlags, reply: fuser::ReplyOpen) {
        serve!(self, reply, |st| st.open(ino.0, flags.0), |fh| reply.opened(FileHandle(fh), fuser::FopenFlags::empty()))
    }

    fn create(
        &self,
        _req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        serve!(self, reply, |st| st.create(parent.0, name, mode & !umask), |r| reply.created(
            &TTL,
            &r.0,
            Generation(0),
            FileHandle(r.1),
            fuser::FopenFlags::empty()
        ))
    }

    fn read(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyData,
    ) {
        let st = self.0.lock();
        let Some(h) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match h.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return reply.error(sys::io_errno(e)),
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        serve!(self, reply, |st| st.write(fh.0, offset, data), |n| reply.written(n))
    }

    fn flush(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: fuser::LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.0.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &fuser::Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: fuser::ReplyEmpty) {
        serve!(self, reply, |st| st.fsync(fh.0, datasync), |_u| reply.ok())
    }

    fn opendir(&self, _req: &fuser::Request, _ino: INodeNo, _flags: fuser::OpenFlags, reply: fuser::ReplyOpen) {
        reply.opened(FileHandle(0), fuser::FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectory,
    ) {
        let entries = match self.0.lock().readdir(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: fuser::ReplyEmpty,
    ) {
        serve!(self, reply, |st| st.fsyncdir(ino.0), |_u| reply.ok())
    }

    fn statfs(&self, _req: &fuser::Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 29, 1 << 29, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &fuser::Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: fuser::ReplyEmpty) {
        reply.ok();
    }
}
