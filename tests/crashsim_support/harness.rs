//! The engine side of the crash harness: storage settings, a rig that runs an engine on the
//! recorder's mount and records a history of steps (op counter before and after each), running a
//! step through the engine as the FUSE adapter would, and opening a crash image with a fresh
//! `Storage` to read back what it holds (tree, contents, attributes, links, fsck findings).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::{LocalDirStore, ObjectStore};

use super::image::Image;
use super::model::{self, Outcome, Step};
use super::recorder::{Recorder, Recording};

pub const OWNER: Owner = Owner { uid: 0, gid: 0 };
pub const XATTR: &[u8] = b"user.k";
/// Bound on any wait for uploads (a longer one is a hang).
pub const UPLOAD_WAIT: Duration = Duration::from_secs(60);

pub fn quota() -> Quota {
    Quota { bytes: 1 << 40, inodes: 1 << 20 }
}

/// Settings of a crash run: small blocks, uploads only when waited for or at a durability point
/// (a delay of an hour), one upload group at a time (a deterministic order of store writes).
pub fn settings(block_size: u64, inline_max: u64) -> StorageSettings {
    StorageSettings {
        block_size,
        inline_block_max_bytes: inline_max,
        upload_delay: Duration::from_secs(3600),
        upload_parallelism: 1,
        store_timeout: Duration::from_secs(20),
        store_attempts: 2,
        readahead_blocks: 0,
        ..StorageSettings::default()
    }
}

/// The configurations the tests run under: blocks journaled inline when small, and every block
/// a staging file.
pub fn configs() -> Vec<(&'static str, StorageSettings)> {
    vec![("inline-1k", settings(4096, 1024)), ("staging-only", settings(4096, 0))]
}

/// A directory for scratch trees: tmpfs when there is one (crash images are many and small).
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("crashsim-").tempdir_in(base).expect("scratch directory")
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

pub fn storage_at(root: &Path, settings: &StorageSettings, rt: &tokio::runtime::Handle) -> EngineResult<Arc<Storage>> {
    let store: Arc<dyn ObjectStore> = Arc::new(LocalDirStore::new(root.join("objects")).map_err(EngineError::Store)?);
    Storage::new(store, settings.clone(), &root.join("data"), rt.clone())
}

/// One step of a recorded history: the op counter before and after it, and its outcome.
#[derive(Clone, Debug)]
pub struct StepRun {
    pub step: Step,
    pub begin: usize,
    pub end: usize,
    pub outcome: Outcome,
}

/// An engine on a recorder's mount: the data and object directories live on it.
/// Dropped (a failed test), it closes the engine before it detaches the mount, and removes its
/// directory last: a process must not exit with a file of its own FUSE mount mapped (SQLite's
/// `-shm`), or the unmap waits forever for the dead serving thread.
pub struct Rig {
    engine: Option<Arc<ScopeEngine>>,
    rt: Option<tokio::runtime::Runtime>,
    recorder: Option<Recorder>,
    dir: Option<tempfile::TempDir>,
    pub scope: ScopeId,
    pub settings: StorageSettings,
    /// Handles `Step::WriteHeld` keeps open, by inode.
    held: BTreeMap<Ino, Fh>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.close();
    }
}

impl Rig {
    /// Mounts a recorder, opens a scope on it, and starts recording: the tree the scope's
    /// creation left (its directories and empty databases) is the initial image.
    pub fn new(settings: &StorageSettings) -> Rig {
        let mut rig = Rig::mounted(settings, None);
        rig.open();
        rig.recorder().start();
        rig
    }

    /// Like `new`, but recording starts before the storage and the scope are created (the
    /// initial image is an empty directory), or on the tree `seed` (a crash image to recover).
    pub fn recording_from(settings: &StorageSettings, seed: Option<(&Image, &ScopeId)>) -> Rig {
        let mut rig = Rig::mounted(settings, seed);
        rig.recorder().start();
        rig.open();
        rig
    }

    fn mounted(settings: &StorageSettings, seed: Option<(&Image, &ScopeId)>) -> Rig {
        let dir = scratch();
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        match seed {
            Some((image, _)) => image.materialize(&backing).expect("write the seed tree"),
            None => std::fs::create_dir(&backing).unwrap(),
        }
        std::fs::create_dir(&mnt).unwrap();
        let recorder = Recorder::mount(&backing, &mnt);
        let scope = seed.map(|(_, s)| s.clone()).unwrap_or_else(ScopeId::generate);
        Rig {
            engine: None,
            rt: None,
            recorder: Some(recorder),
            dir: Some(dir),
            scope,
            settings: settings.clone(),
            held: BTreeMap::new(),
        }
    }

    /// Opens a fresh storage and the scope on the mount (with its own runtime).
    fn open(&mut self) {
        let rt = runtime();
        let storage =
            storage_at(&self.recorder().mountpoint, &self.settings, rt.handle()).expect("storage on the recorder");
        self.engine = Some(storage.open_scope(&self.scope, quota()).expect("scope on the recorder"));
        self.rt = Some(rt);
    }

    /// Drops the engine and its storage; their runtime's tasks (a waiting uploader) go with it.
    fn close(&mut self) {
        drop(self.engine.take());
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(10));
        }
    }

    pub fn recorder(&self) -> &Recorder {
        self.recorder.as_ref().expect("mounted")
    }

    pub fn engine(&self) -> &ScopeEngine {
        self.engine.as_ref().expect("engine open")
    }

    /// Runs one step (a restart here), noting the op counter around it.
    pub fn step(&mut self, step: &Step) -> StepRun {
        let begin = self.recorder().ops();
        let outcome = match step {
            Step::Restart => {
                // A graceful restart: the kernel's handles would be adopted; here they are closed.
                let closed = self.close_held();
                self.close();
                self.open();
                closed
            }
            Step::WriteHeld(p, off, len, seed) => self.write_held(p, u64::from(*off), &model::pattern(*seed, *len)),
            Step::CloseHeld => self.close_held(),
            _ => run_step(self.engine(), step),
        };
        StepRun { step: step.clone(), begin, end: self.recorder().ops(), outcome }
    }

    /// Writes through the handle kept open on `path`'s file (opened now if none is).
    fn write_held(&mut self, path: &str, offset: u64, data: &[u8]) -> Outcome {
        let e = self.engine.clone().expect("engine open");
        let r: EngineResult<()> = (|| {
            let ino = resolve(&e, path)?;
            let fh = match self.held.get(&ino) {
                Some(fh) => *fh,
                None => {
                    let opened = e.open(ino, OpenFlags { write: true, ..Default::default() })?;
                    self.held.insert(ino, opened.fh);
                    opened.fh
                }
            };
            e.write(ino, fh, offset, data).map(drop)
        })();
        r.map_err(|e| class(&e))
    }

    /// Flushes and closes every handle `write_held` keeps open; the first error.
    fn close_held(&mut self) -> Outcome {
        let held = std::mem::take(&mut self.held);
        let Some(e) = self.engine.clone() else { return Ok(()) };
        let mut first = Ok(());
        for (ino, fh) in held {
            let r = e.flush(ino, fh).and(e.release(ino, fh));
            if let (Err(err), true) = (r, first.is_ok()) {
                first = Err(class(&err));
            }
        }
        first
    }

    /// Runs `steps` in order.
    pub fn run(&mut self, steps: &[Step]) -> Vec<StepRun> {
        steps.iter().map(|s| self.step(s)).collect()
    }

    /// Closes the engine (after its uploads), unmounts, and returns the recording as it was
    /// when this was called (what the teardown does is not part of it) and the rig's directory.
    pub fn finish(self) -> (Recording, tempfile::TempDir) {
        let (recording, dir, drained) = self.finish_draining();
        assert!(drained, "uploads did not finish at teardown within {UPLOAD_WAIT:?}");
        (recording, dir)
    }

    /// `finish`, telling whether the uploads drained (within `UPLOAD_WAIT`) instead of asserting.
    pub fn finish_draining(mut self) -> (Recording, tempfile::TempDir, bool) {
        let recording = self.recorder().recording();
        let _ = self.close_held();
        let drained = self.engine.as_ref().is_none_or(|e| e.wait_uploads(UPLOAD_WAIT));
        self.close();
        self.recorder.take().expect("mounted").unmount();
        (recording, self.dir.take().expect("directory"), drained)
    }
}

/// The outcome class of an engine error: the model's classes for refusals, `io:NoSpace` for a
/// full disk, the variant's name (`io:Variant`) for anything else.
pub fn class(e: &EngineError) -> String {
    match e {
        EngineError::NotFound | EngineError::NotDir => model::MISSING.into(),
        EngineError::Exists => model::EXISTS.into(),
        EngineError::IsDir => model::ISDIR.into(),
        EngineError::NotEmpty => model::NOTEMPTY.into(),
        EngineError::Invalid(_) => model::INVALID.into(),
        EngineError::NotPermitted(_) => model::NOTPERMITTED.into(),
        // What the adapters answer ENOSPC (SQLite's SQLITE_FULL and the host's ENOSPC included).
        other if other.out_of_space() => "io:NoSpace".into(),
        other => format!("io:{}", variant(other)),
    }
}

/// The name of an error's variant (`Io`, `Metadata`, `NoSpace`, ...).
pub fn variant(e: &EngineError) -> String {
    let debug = format!("{e:?}");
    debug.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("?").to_string()
}

pub fn resolve(e: &ScopeEngine, path: &str) -> EngineResult<Ino> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = e.lookup(ino, part.as_bytes())?.ino;
    }
    Ok(ino)
}

pub fn split(e: &ScopeEngine, path: &str) -> EngineResult<(Ino, String)> {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    Ok((resolve(e, dir)?, name.to_string()))
}

/// Runs one step as the FUSE adapter calls the engine for it.
pub fn run_step(e: &ScopeEngine, step: &Step) -> Outcome {
    let r: EngineResult<()> = (|| match step {
        Step::Create(p) => {
            let (parent, name) = split(e, p)?;
            let flags = OpenFlags { write: true, truncate: false, exclusive: true };
            let (attr, opened) = e.create(parent, name.as_bytes(), 0o644, flags, OWNER)?;
            e.flush(attr.ino, opened.fh)?;
            e.release(attr.ino, opened.fh)
        }
        Step::Mkdir(p) => {
            let (parent, name) = split(e, p)?;
            e.mkdir(parent, name.as_bytes(), 0o755, OWNER).map(drop)
        }
        Step::Write(p, off, len, seed) => {
            let ino = resolve(e, p)?;
            let opened = e.open(ino, OpenFlags { write: true, ..Default::default() })?;
            let r = e
                .write(ino, opened.fh, u64::from(*off), &model::pattern(*seed, *len))
                .and_then(|_| e.flush(ino, opened.fh));
            let released = e.release(ino, opened.fh);
            r.and(released)
        }
        Step::Truncate(p, n) => {
            let ino = resolve(e, p)?;
            e.setattr(ino, &SetAttr { size: Some(u64::from(*n)), ..Default::default() }).map(drop)
        }
        Step::Rename(a, b) => {
            let (pa, na) = split(e, a)?;
            let (pb, nb) = split(e, b)?;
            e.rename(pa, na.as_bytes(), pb, nb.as_bytes(), RenameMode::Replace)
        }
        Step::Unlink(p) => {
            let (parent, name) = split(e, p)?;
            e.unlink(parent, name.as_bytes())
        }
        Step::Rmdir(p) => {
            let (parent, name) = split(e, p)?;
            e.rmdir(parent, name.as_bytes())
        }
        Step::Link(a, b) => {
            let ino = resolve(e, a)?;
            let (pb, nb) = split(e, b)?;
            e.link(ino, pb, nb.as_bytes()).map(drop)
        }
        Step::SetXattr(p, seed) => e.setxattr(resolve(e, p)?, XATTR, &model::xattr_value(*seed), XattrMode::Either),
        Step::Fsync(p) => {
            let attr = e.getattr(resolve(e, p)?)?;
            if attr.kind == FileKind::Dir {
                return e.fsync_dir();
            }
            let opened = e.open(attr.ino, OpenFlags::default())?;
            let r = e.fsync(attr.ino, Some(opened.fh));
            let released = e.release(attr.ino, opened.fh);
            r.and(released)
        }
        Step::FsyncDir => e.fsync_dir(),
        Step::Sync => e.sync(),
        Step::WaitUploads => {
            assert!(e.wait_uploads(UPLOAD_WAIT), "uploads did not drain within {UPLOAD_WAIT:?}: a hang");
            Ok(())
        }
        Step::Commit => e.commit_metadata(),
        Step::Gc => e.collect_garbage_online(Duration::ZERO, u64::MAX).map(drop),
        Step::Restart | Step::WriteHeld(..) | Step::CloseHeld => Err(EngineError::Invalid("the rig's step")),
    })();
    r.map_err(|e| class(&e))
}

/// What a path of an opened crash image shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Dir {
        xattr: Option<Vec<u8>>,
    },
    /// Contents, or the error a read gave (its variant).
    File {
        data: Result<Vec<u8>, String>,
        xattr: Option<Vec<u8>>,
    },
    Other(String),
}

/// What a crash image holds, read through a fresh engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub tree: BTreeMap<String, Seen>,
    pub link_sets: BTreeSet<BTreeSet<String>>,
    /// fsck's damaged files (paths without the leading `/`).
    pub damaged: Vec<String>,
    /// fsck's metadata problems and `consistency_problems()`.
    pub problems: Vec<String>,
    pub orphans: usize,
}

/// `Err`: the scope did not open (or the engine panicked), with why.
pub type Observation = Result<Observed, String>;

fn read_all(e: &ScopeEngine, ino: Ino, size: u64) -> EngineResult<Vec<u8>> {
    let opened = e.open(ino, OpenFlags::default())?;
    let mut out = Vec::new();
    let r = loop {
        if out.len() as u64 >= size {
            break Ok(());
        }
        match e.read(ino, opened.fh, out.len() as u64, 64 * 1024) {
            Ok(chunk) if chunk.is_empty() => break Ok(()),
            Ok(chunk) => out.extend_from_slice(&chunk),
            Err(err) => break Err(err),
        }
    };
    e.release(ino, opened.fh)?;
    r.map(|_| out)
}

fn xattr_of(e: &ScopeEngine, ino: Ino) -> EngineResult<Option<Vec<u8>>> {
    match e.getxattr(ino, XATTR) {
        Ok(v) => Ok(Some(v)),
        Err(EngineError::NoData) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Reads the whole tree of an open engine.
pub fn observe(e: &ScopeEngine) -> EngineResult<Observed> {
    let mut tree = BTreeMap::new();
    let mut names: BTreeMap<Ino, BTreeSet<String>> = BTreeMap::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        for entry in e.readdir(dir)? {
            let name = String::from_utf8_lossy(&entry.name).into_owned();
            let p = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            let seen = match entry.attr.kind {
                FileKind::Dir => {
                    todo.push((entry.attr.ino, p.clone()));
                    Seen::Dir { xattr: xattr_of(e, entry.attr.ino)? }
                }
                FileKind::File => {
                    names.entry(entry.attr.ino).or_default().insert(p.clone());
                    let data = read_all(e, entry.attr.ino, entry.attr.size).map_err(|err| variant(&err));
                    if let Ok(d) = &data {
                        if d.len() as u64 != entry.attr.size {
                            return Err(EngineError::Invalid("a file read back shorter or longer than its size"));
                        }
                    }
                    Seen::File { data, xattr: xattr_of(e, entry.attr.ino)? }
                }
                other => Seen::Other(other.as_str().into()),
            };
            tree.insert(p, seen);
        }
    }
    let mut problems = e.consistency_problems()?;
    let mut report = e.fsck(false)?;
    if !report.pending_deletes.is_empty() {
        // Objects an interrupted gc pass logged: the next pass deletes them, and nothing else.
        e.collect_garbage_online(Duration::ZERO, 0)?;
        let after = e.fsck(false)?;
        if !after.pending_deletes.is_empty() {
            problems.push(format!("{} logged gc deletes left after a pass", after.pending_deletes.len()));
        }
        report.damaged_files.extend(after.damaged_files);
        report.orphan_objects.extend(after.orphan_objects);
    }
    problems.extend(report.metadata_problems);
    let damaged = report.damaged_files.iter().map(|p| p.trim_start_matches('/').to_string()).collect();
    let link_sets = names.into_values().filter(|s| s.len() > 1).collect();
    Ok(Observed { tree, link_sets, damaged, problems, orphans: report.orphan_objects.len() })
}

/// Opens a fresh storage and the scope on the tree at `root` (`data/`, `objects/`), reads it,
/// lets the uploads it recovered finish, and checks it. A panic is reported, not propagated.
pub fn open_and_observe(
    root: &Path,
    scope: &ScopeId,
    settings: &StorageSettings,
    rt: &tokio::runtime::Handle,
) -> Observation {
    let run = || -> Result<Observed, String> {
        let storage = storage_at(root, settings, rt).map_err(|e| format!("storage did not open: {e}"))?;
        let engine = storage.open_scope(scope, quota()).map_err(|e| format!("scope did not open: {e}"))?;
        let observed = observe(&engine).map_err(|e| format!("reading the tree failed: {e}"))?;
        if !engine.wait_uploads(UPLOAD_WAIT) {
            return Err(format!("recovered uploads did not finish within {UPLOAD_WAIT:?}"));
        }
        Ok(observed)
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(p) => Err(format!(
            "the engine panicked: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// `open_and_observe` as the first start after a power loss: the next boot of the host (what the
/// engine trusts of the files a process left differs: `scopefs::testhooks::with_boot`).
pub fn open_rebooted(
    root: &Path,
    scope: &ScopeId,
    settings: &StorageSettings,
    rt: &tokio::runtime::Handle,
) -> Observation {
    scopefs::testhooks::with_boot(0x5eb0_07ed, || open_and_observe(root, scope, settings, rt))
}

/// `open_and_observe` on another host: the image's data directory is gone, only the bucket
/// (`objects/`) is left, and the scope is restored from the metadata shipped there.
pub fn open_host_lost(
    root: &Path,
    scope: &ScopeId,
    settings: &StorageSettings,
    rt: &tokio::runtime::Handle,
) -> Observation {
    match std::fs::remove_dir_all(root.join("data")) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing the lost host's data directory failed: {e}")),
    }
    open_and_observe(root, scope, settings, rt)
}

/// A fresh numbered directory below `base` for one crash image.
pub fn image_dir(base: &Path, n: usize) -> PathBuf {
    base.join(format!("image-{n}"))
}
