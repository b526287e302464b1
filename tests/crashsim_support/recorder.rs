//! The recording layer, as a test sees it: a FUSE pass-through filesystem over a backing
//! directory that logs, in the order it performs them, every mutating request (writes,
//! truncates, creates, mkdir, symlink, link, unlink, rmdir, rename, fsync of files and
//! directories) as `Op`s, with an op counter, a snapshot of the tree taken when recording starts,
//! and one-shot fault injection (the k-th write or sync fails with a chosen errno without being
//! performed). The filesystem runs in a child process (`recorder_server`, which says why); it
//! serves requests on one thread, so the log is a total order. Nothing is flushed to the backing
//! disk: durability is what the crash-state constructor makes of the log.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use parking_lot::Mutex;

use super::image::Image;
use super::ops::{FaultOn, FileId, Fired, Op};
use super::recorder_server as server;
use super::wire::{self, In, Out};

/// The name of each test target's helper test that runs a recorder child (`recorder_process!`).
pub const CHILD_TEST: &str = "crashsim_recorder_process";

/// What one recording produced: the tree when it started and every operation since.
#[derive(Clone)]
pub struct Recording {
    pub initial: Image,
    pub log: Vec<Op>,
    /// A name for each file the log mentions (its last name, a block hash shown as `<sha>`).
    pub names: HashMap<FileId, String>,
    /// Ops that no power loss keeps: a file's writes not yet synced when a sync of it failed
    /// (Linux marks such pages clean after a writeback error: a later fsync, on any
    /// descriptor, reports success without writing them).
    pub lost: HashSet<usize>,
}

impl Recording {
    pub fn name(&self, id: FileId) -> &str {
        self.names.get(&id).map(String::as_str).unwrap_or("?")
    }
}

impl Recording {
    /// Writes the recording for `decode`.
    pub fn encode(&self, o: &mut Out) {
        self.initial.encode(o);
        o.u64(self.log.len() as u64);
        for op in &self.log {
            wire::put_op(o, op);
        }
        o.u64(self.names.len() as u64);
        for (id, name) in &self.names {
            o.u64(*id).bytes(name.as_bytes());
        }
        o.u64(self.lost.len() as u64);
        for j in &self.lost {
            o.u64(*j as u64);
        }
    }

    pub fn decode(i: &mut In) -> std::io::Result<Recording> {
        let initial = Image::decode(i)?;
        let log = (0..i.u64()?).map(|_| wire::get_op(i)).collect::<std::io::Result<Vec<Op>>>()?;
        let mut names = HashMap::new();
        for _ in 0..i.u64()? {
            names.insert(i.u64()?, i.string()?);
        }
        let mut lost = HashSet::new();
        for _ in 0..i.u64()? {
            lost.insert(i.u64()? as usize);
        }
        Ok(Recording { initial, log, names, lost })
    }
}

/// A mounted recorder (its serving process); unmount with `unmount` (a drop detaches the mount
/// and ends the process).
pub struct Recorder {
    child: Child,
    conn: Mutex<UnixStream>,
    socket: PathBuf,
    pub mountpoint: PathBuf,
    /// The FUSE connection's number (`/sys/fs/fuse/connections/N`).
    connection: u64,
}

impl Recorder {
    /// Mounts a recorder of `backing` at `mountpoint` (both must exist). Requests are performed
    /// but not logged until `start`.
    pub fn mount(backing: &Path, mountpoint: &Path) -> Recorder {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: the crash harness records through a FUSE filesystem (run as root on a FUSE-capable host)"
        );
        let socket = mountpoint.with_extension("sock");
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", CHILD_TEST, "--ignored", "--nocapture", "--test-threads=1"])
            .env(server::SOCKET_ENV, &socket)
            .env(server::BACKING_ENV, backing)
            .env(server::MOUNT_ENV, mountpoint)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the recorder's process");
        let stdout = BufReader::new(child.stdout.take().expect("the child's stdout"));
        let ready = stdout.lines().map_while(Result::ok).any(|l| l.trim_end().ends_with(server::READY));
        assert!(ready, "the recorder's process ended before it mounted (see its output above)");
        let conn = UnixStream::connect(&socket).expect("connect to the recorder");
        let dev =
            std::fs::metadata(mountpoint).map(|m| std::os::unix::fs::MetadataExt::dev(&m)).expect("stat the mount");
        let connection = u64::from(libc::minor(dev));
        Recorder { child, conn: Mutex::new(conn), socket, mountpoint: mountpoint.to_path_buf(), connection }
    }

    /// Sends a command and returns the answer.
    fn ask(&self, build: impl FnOnce(&mut Out)) -> In {
        let mut out = Out::default();
        build(&mut out);
        let mut conn = self.conn.lock();
        out.send(&mut *conn).expect("send a command to the recorder");
        In::recv(&mut *conn).expect("the recorder answers")
    }

    /// Starts (or restarts) recording: snapshots the backing tree as the initial image, empties
    /// the log, resets the write and sync counters and disarms any fault.
    pub fn start(&self) {
        let err = self
            .ask(|o| {
                o.u8(server::START);
            })
            .string()
            .unwrap();
        assert!(err.is_empty(), "snapshot the backing directory: {err}");
    }

    /// Operations logged since `start`: the op counter.
    pub fn ops(&self) -> usize {
        self.ask(|o| {
            o.u8(server::OPS);
        })
        .u64()
        .unwrap() as usize
    }

    /// Writes and syncs seen since `start` (faulted ones included).
    pub fn counts(&self) -> (usize, usize) {
        let mut a = self.ask(|o| {
            o.u8(server::COUNTS);
        });
        (a.u64().unwrap() as usize, a.u64().unwrap() as usize)
    }

    /// Arms a one-shot fault: the chosen request fails with `errno` and is not performed.
    pub fn arm(&self, on: FaultOn, errno: i32) {
        self.ask(|o| {
            o.u8(server::ARM);
            wire::put_fault(o, on, errno);
        });
    }

    /// The faults that fired since `start`.
    pub fn fired(&self) -> Vec<Fired> {
        let mut a = self.ask(|o| {
            o.u8(server::FIRED);
        });
        (0..a.u64().unwrap()).map(|_| wire::get_fired(&mut a).unwrap()).collect()
    }

    /// The recording so far (recording goes on).
    pub fn recording(&self) -> Recording {
        Recording::decode(&mut self.ask(|o| {
            o.u8(server::RECORDING);
        }))
        .expect("decode the recording")
    }

    /// Detaches the mount and waits for the serving process (every file on the mount must be
    /// closed first).
    pub fn unmount(mut self) {
        self.ask(|o| {
            o.u8(server::UNMOUNT);
        });
        let _ = self.child.wait();
    }

    /// A function that describes the recorder's state without waiting for it (for a report of
    /// a hang): the ops logged and the last few, or that a request holds it.
    pub fn describe_handle(&self) -> impl Fn() -> String + Send + 'static {
        let socket = self.socket.clone();
        move || {
            let ask = || -> std::io::Result<String> {
                let mut conn = UnixStream::connect(&socket)?;
                conn.set_read_timeout(Some(Duration::from_secs(5)))?;
                Out(vec![server::BRIEF]).send(&mut conn)?;
                In::recv(&mut conn)?.string()
            };
            ask().unwrap_or_else(|e| format!("the recorder did not answer: {e}"))
        }
    }

    /// A function that aborts the FUSE connection: every request in flight or to come fails at
    /// once (what a test does before giving up on a hung engine, so that nothing waits on the
    /// mount).
    pub fn abort_handle(&self) -> impl Fn() + Send + 'static {
        let path = format!("/sys/fs/fuse/connections/{}/abort", self.connection);
        move || {
            let _ = std::fs::write(&path, "1");
        }
    }
}

impl Drop for Recorder {
    /// After `unmount` the process is gone; otherwise (a failed test) closing the connection makes
    /// it detach the mount and exit.
    fn drop(&mut self) {
        let _ = self.conn.lock().shutdown(std::net::Shutdown::Both);
        let _ = self.child.wait();
    }
}
