//! scopefs patch: one pool of worker threads serving the `/dev/fuse` descriptors of many sessions.
//!
//! `Session::run` gives every session its own threads, each with a request buffer of
//! `MAX_WRITE_SIZE`: a process serving thousands of mostly idle mounts pays threads and buffers per
//! mount. A [`SessionPool`] instead waits on every registered descriptor with one epoll set
//! (level-triggered, `EPOLLONESHOT`): a worker that is told a descriptor is readable reads one
//! request from it (non-blocking), re-arms the descriptor at once (so another worker can take the
//! session's next request while this one is served) and dispatches the request to that session's
//! filesystem. Each worker owns one request buffer, an anonymous mapping: only the pages the kernel
//! has written are resident, but for the first bytes, which hold every request up to the size the
//! pool is made for and are present (locked when allowed) before the worker reads anything (a
//! request copied into a page the kernel must fault in fails with `EIO` when the process is being
//! killed; see `FuseReadBuf::resident`). Threads and buffers are sized by the pool, not by the
//! sessions.
//!
//! One session holds at most `max_busy_per_session` workers: the worker that takes a session's
//! request while that many of its requests are being served leaves the descriptor disarmed, and the
//! worker that finishes one of them re-arms it. A mount whose requests block (a storm of `fsync`s
//! waiting on uploads) then waits in the kernel's queue for its own share while the other workers
//! serve the other mounts.
//!
//! A session ends when its connection does (`ENODEV` on read: unmounted or aborted), on
//! `FUSE_DESTROY`, or on a request that cannot be parsed; its filesystem's `destroy` then runs and
//! its [`PooledSession`] handle learns the result.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::mnt::Mount;
use crate::notify::Notifier;
use crate::read_buf::FuseReadBuf;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// The epoll token of the pool's stop event (session tokens count up from 0).
const STOP_TOKEN: u64 = u64::MAX;

/// How many of a session's requests are being served, and whether its descriptor was left
/// disarmed because that reached the pool's share.
#[derive(Default)]
struct Busy {
    serving: usize,
    parked: bool,
}

/// What a pool's workers are doing, readable while the pool runs (`SessionPool::counters`).
#[derive(Debug, Default)]
pub struct PoolCounters {
    busy_workers: AtomicUsize,
    share_waits: AtomicU64,
}

impl PoolCounters {
    /// Workers serving a request now.
    pub fn busy_workers(&self) -> usize {
        self.busy_workers.load(Ordering::Relaxed)
    }

    /// Times a session reached its share of workers (its further requests then wait until one of
    /// them is done; counts up).
    pub fn share_waits(&self) -> u64 {
        self.share_waits.load(Ordering::Relaxed)
    }
}

/// Whether a worker already reported that its request buffer could not be locked.
static UNLOCKED_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One session as the pool sees it (type-erased over the filesystem).
trait Served: Send + Sync {
    fn raw_fd(&self) -> RawFd;
    /// Serves one request; `Some` when the session ends with it.
    fn serve(&self, data: &[u8]) -> Option<io::Result<()>>;
    /// Records how the session ended (reported once the last reference is gone).
    fn ended(&self, result: io::Result<()>);
    /// The session's requests being served.
    fn busy(&self) -> &Mutex<Busy>;
}

/// A registered session: its event loop state and where its end is reported.
struct Entry<FS: Filesystem> {
    event_loop: SessionEventLoop<FS>,
    result: Mutex<Option<io::Result<()>>>,
    done: Mutex<Option<mpsc::Sender<io::Result<()>>>>,
    busy: Mutex<Busy>,
}

impl<FS: Filesystem> Served for Entry<FS> {
    fn raw_fd(&self) -> RawFd {
        self.event_loop.ch.as_fd().as_raw_fd()
    }

    fn serve(&self, data: &[u8]) -> Option<io::Result<()>> {
        match RequestWithSender::new(self.event_loop.ch.sender(), data) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                    Some(Ok(()))
                } else {
                    req.dispatch(&self.event_loop);
                    None
                }
            }
            None => Some(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "Invalid request",
            ))),
        }
    }

    fn ended(&self, result: io::Result<()>) {
        self.result.lock().get_or_insert(result);
    }

    fn busy(&self) -> &Mutex<Busy> {
        &self.busy
    }
}

impl<FS: Filesystem> Drop for Entry<FS> {
    /// The last worker let go of the session: destroy the filesystem, then report the end.
    fn drop(&mut self) {
        if let Some(holder) = Arc::get_mut(&mut self.event_loop.filesystem) {
            holder.destroy();
        }
        let result = self.result.lock().take().unwrap_or(Ok(()));
        if let Some(done) = self.done.lock().take() {
            let _ = done.send(result);
        }
    }
}

struct PoolInner {
    /// Bytes of each worker's request buffer that are present before its first read.
    resident: usize,
    /// Workers one session may hold at once.
    max_busy_per_session: usize,
    /// What the pool's workers are doing (shared with whoever reports it).
    counters: Arc<PoolCounters>,
    epoll: OwnedFd,
    stop: OwnedFd,
    sessions: Mutex<HashMap<u64, Arc<dyn Served>>>,
    next: AtomicU64,
}

impl PoolInner {
    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: token,
        };
        // SAFETY: epoll_ctl on our epoll descriptor with a valid event struct.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Ends a session: it leaves the epoll set and the table; `destroy` runs when the last
    /// worker serving one of its requests is done.
    fn remove(&self, token: u64, result: io::Result<()>) {
        let entry = self.sessions.lock().remove(&token);
        if let Some(entry) = entry {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, entry.raw_fd(), token);
            entry.ended(result);
        }
    }

    /// A worker's loop; `started` learns that its request buffer is ready.
    fn work(self: Arc<Self>, started: mpsc::Sender<()>) {
        // Mapped: only the pages the kernel writes become resident, but for the first
        // `resident` bytes (see `FuseReadBuf::resident`).
        let (mut buf, locked) = FuseReadBuf::resident(self.resident);
        if let Err(e) = locked {
            if !UNLOCKED_WARNED.swap(true, Ordering::Relaxed) {
                warn!(
                    "FUSE request buffers could not be locked in memory (mlock: {e}); their pages are present but may be swapped out"
                );
            }
        }
        let _ = started.send(());
        drop(started);
        loop {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: waits for one event into `ev`.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut ev, 1, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                warn!("FUSE pool worker stops: epoll_wait: {e}");
                return;
            }
            if n == 0 {
                continue;
            }
            let token = ev.u64;
            if token == STOP_TOKEN {
                return;
            }
            let entry = self.sessions.lock().get(&token).cloned();
            let Some(entry) = entry else { continue };
            let fd = entry.raw_fd();
            let data = buf.as_mut();
            // SAFETY: reads into our own buffer of `data.len()` bytes.
            let size = unsafe { libc::read(fd, data.as_mut_ptr().cast(), data.len()) };
            if size < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::EINTR | libc::ENOENT) => self.rearm(token, fd),
                    Some(libc::ENODEV) => self.remove(token, Ok(())),
                    _ => self.remove(token, Err(e)),
                }
                continue;
            }
            self.take_share(&*entry, token, fd);
            self.counters.busy_workers.fetch_add(1, Ordering::Relaxed);
            #[allow(clippy::cast_sign_loss)]
            let ended = entry.serve(&data[..size as usize]);
            self.counters.busy_workers.fetch_sub(1, Ordering::Relaxed);
            self.give_share(&*entry, token, fd);
            if let Some(result) = ended {
                self.remove(token, result);
            }
        }
    }

    /// Counts the request just read against its session's share: the descriptor is re-armed at
    /// once (another worker may take the session's next request) unless the session now has its
    /// whole share of workers, in which case it stays disarmed until one of them is done. The
    /// re-arm (a system call) is made after the count's lock is released: the other workers of the
    /// session take and give back their share meanwhile (a disarmed descriptor is re-armed exactly
    /// once: by the worker that disarmed it being under the share, or by the one that unparks it).
    fn take_share(&self, entry: &dyn Served, token: u64, fd: RawFd) {
        let rearm = {
            let mut busy = entry.busy().lock();
            busy.serving += 1;
            if busy.serving >= self.max_busy_per_session {
                busy.parked = true;
                self.counters.share_waits.fetch_add(1, Ordering::Relaxed);
                false
            } else {
                true
            }
        };
        if rearm {
            self.rearm(token, fd);
        }
    }

    /// A request of the session was served: a descriptor left disarmed is re-armed (after the
    /// count's lock is released).
    fn give_share(&self, entry: &dyn Served, token: u64, fd: RawFd) {
        let parked = {
            let mut busy = entry.busy().lock();
            busy.serving -= 1;
            std::mem::take(&mut busy.parked)
        };
        if parked {
            self.rearm(token, fd);
        }
    }

    fn rearm(&self, token: u64, fd: RawFd) {
        if let Err(e) = self.ctl(libc::EPOLL_CTL_MOD, fd, token) {
            // ENOENT: the session was removed meanwhile.
            if e.raw_os_error() != Some(libc::ENOENT) {
                warn!("FUSE pool cannot re-arm a session: {e}");
                self.remove(token, Err(e));
            }
        }
    }
}

/// Worker threads shared by many FUSE sessions (see the module documentation). Dropping the
/// pool stops its workers once they finish the request at hand; sessions still registered then
/// are no longer served (unmount them first).
#[derive(Debug)]
pub struct SessionPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolInner")
            .field("sessions", &self.sessions.lock().len())
            .finish()
    }
}

impl SessionPool {
    /// Starts `workers` threads (at least one), each with `stack_size` bytes of stack and a
    /// request buffer whose first `resident_request_bytes` are present (and locked when the
    /// process may lock memory) before it reads a request: at least the largest request the
    /// sessions negotiate (`max_write` and the headers of a write). One session holds at most
    /// `max_busy_per_session` workers at once (at least one). Returns once every worker's buffer
    /// is in place.
    pub fn new(
        workers: usize,
        stack_size: usize,
        resident_request_bytes: usize,
        max_busy_per_session: usize,
    ) -> io::Result<SessionPool> {
        // SAFETY: plain syscalls creating descriptors we own at once.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `epoll` is a fresh descriptor.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        // SAFETY: as above.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `stop` is a fresh descriptor.
        let stop = unsafe { OwnedFd::from_raw_fd(stop) };
        let inner = Arc::new(PoolInner {
            resident: resident_request_bytes,
            max_busy_per_session: max_busy_per_session.max(1),
            counters: Arc::default(),
            epoll,
            stop,
            sessions: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        });
        // The stop event is level-triggered and never re-armed: once signalled, every worker sees it.
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: STOP_TOKEN,
        };
        // SAFETY: registers our eventfd with our epoll set.
        if unsafe {
            libc::epoll_ctl(
                inner.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                inner.stop.as_raw_fd(),
                &mut ev,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        let pool = SessionPool { inner };
        let (started, ready) = mpsc::channel();
        for i in 0..workers.max(1) {
            let inner = pool.inner.clone();
            let started = started.clone();
            std::thread::Builder::new()
                .name(format!("fuse-pool-{i}"))
                .stack_size(stack_size)
                .spawn(move || inner.work(started))?;
        }
        drop(started);
        // Every worker's buffer is in place before any session is registered.
        while ready.recv().is_ok() {}
        Ok(pool)
    }

    /// Sessions being served.
    pub fn sessions(&self) -> usize {
        self.inner.sessions.lock().len()
    }

    /// What the workers are doing, readable for as long as the caller keeps it.
    pub fn counters(&self) -> Arc<PoolCounters> {
        self.inner.counters.clone()
    }

    pub(crate) fn register<FS: Filesystem>(
        &self,
        event_loop: SessionEventLoop<FS>,
        mount: Option<Mount>,
    ) -> io::Result<PooledSession> {
        let fd = event_loop.ch.as_fd().as_raw_fd();
        // SAFETY: fcntl on a descriptor the session owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let sender = event_loop.ch.sender();
        let (tx, rx) = mpsc::channel();
        let entry: Arc<dyn Served> = Arc::new(Entry {
            event_loop,
            result: Mutex::new(None),
            done: Mutex::new(Some(tx)),
            busy: Mutex::new(Busy::default()),
        });
        let token = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let mut sessions = self.inner.sessions.lock();
        sessions.insert(token, entry);
        if let Err(e) = self.inner.ctl(libc::EPOLL_CTL_ADD, fd, token) {
            sessions.remove(&token);
            return Err(e);
        }
        Ok(PooledSession {
            sender,
            mount,
            done: rx,
        })
    }
}

impl Drop for SessionPool {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to our eventfd.
        let _ = unsafe {
            libc::write(
                self.inner.stop.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// A session served by a [`SessionPool`]. Dropping the handle unmounts a mount this session made
/// (like `BackgroundSession`); the session itself is served until its connection ends.
#[derive(Debug)]
pub struct PooledSession {
    sender: ChannelSender,
    mount: Option<Mount>,
    done: mpsc::Receiver<io::Result<()>>,
}

impl PooledSession {
    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.sender.clone())
    }

    /// Waits up to `timeout` for the session to end (its filesystem destroyed); `None` on timeout.
    /// A mount this session made is not unmounted first.
    pub fn wait(self, timeout: Duration) -> Option<io::Result<()>> {
        let PooledSession {
            sender,
            mount,
            done,
        } = self;
        drop(sender);
        // The connection is gone already: dropping the handle finds nothing to unmount.
        drop(mount);
        match done.recv_timeout(timeout) {
            Ok(result) => Some(result),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Ok(())),
        }
    }
}
