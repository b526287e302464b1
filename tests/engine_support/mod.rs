//! Shared helpers of the engine-level tests: a storage over an in-memory store, path resolution,
//! whole-file I/O, and an action run once at one of the engine's interleaving points.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use scopefs::engine::*;
use scopefs::ids::ScopeId;
use scopefs::store::{MemoryStore, ObjectStore};

pub const OWNER: Owner = Owner { uid: 0, gid: 0 };

/// A storage rooted in a temporary directory over a shared `MemoryStore`.
pub struct Harness {
    pub rt: tokio::runtime::Runtime,
    pub store: Arc<MemoryStore>,
    pub dir: tempfile::TempDir,
    pub settings: StorageSettings,
}

impl Harness {
    pub fn new(settings: StorageSettings) -> Harness {
        Harness {
            rt: tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap(),
            store: Arc::new(MemoryStore::new()),
            dir: tempfile::tempdir().unwrap(),
            settings,
        }
    }

    pub fn small_blocks() -> Harness {
        Harness::new(StorageSettings {
            block_size: 64,
            store_timeout: Duration::from_millis(300),
            store_attempts: 2,
            ..StorageSettings::default()
        })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A fresh `Storage` over the same data directory and store (a daemon restart).
    pub fn storage(&self) -> Arc<Storage> {
        let store: Arc<dyn ObjectStore> = self.store.clone();
        Storage::new(store, self.settings.clone(), &self.data_dir(), self.rt.handle().clone()).unwrap()
    }
}

pub fn big_quota() -> Quota {
    Quota { bytes: 1 << 40, inodes: 1 << 20 }
}

pub fn new_scope(storage: &Arc<Storage>) -> Arc<ScopeEngine> {
    storage.open_scope(&ScopeId::generate(), big_quota()).unwrap()
}

/// Resolves `a/b/c` from the root; `Err` is the engine's error for the first missing component.
pub fn resolve(e: &ScopeEngine, path: &str) -> EngineResult<Ino> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = e.lookup(ino, part.as_bytes())?.ino;
    }
    Ok(ino)
}

/// Parent inode and last name of `path`.
pub fn split(e: &ScopeEngine, path: &str) -> EngineResult<(Ino, String)> {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    Ok((resolve(e, dir)?, name.to_string()))
}

pub fn write_file(e: &ScopeEngine, path: &str, data: &[u8]) -> EngineResult<()> {
    let (parent, name) = split(e, path)?;
    let flags = OpenFlags { write: true, truncate: true, exclusive: false };
    let (attr, opened) = e.create(parent, name.as_bytes(), 0o644, flags, OWNER)?;
    let r = e.write(attr.ino, opened.fh, 0, data).map(|_| ()).and_then(|_| e.flush(attr.ino, opened.fh));
    e.release(attr.ino, opened.fh)?;
    r
}

pub fn read_file(e: &ScopeEngine, path: &str) -> EngineResult<Vec<u8>> {
    let ino = resolve(e, path)?;
    let opened = e.open(ino, OpenFlags::default())?;
    let size = e.getattr(ino)?.size;
    let mut out = Vec::new();
    let r = loop {
        match e.read(ino, opened.fh, out.len() as u64, 128 * 1024) {
            Ok(chunk) if chunk.is_empty() => break Ok(()),
            Ok(chunk) => out.extend_from_slice(&chunk),
            Err(err) => break Err(err),
        }
        if out.len() as u64 >= size {
            break Ok(());
        }
    };
    e.release(ino, opened.fh)?;
    r.map(|_| out)
}

/// Copies a directory tree (a killed process leaves its files as the page cache has them).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The successor of a process killed now: a storage over a copy of the data directory (same store).
pub fn killed_now(h: &Harness, to: &std::path::Path) -> Arc<Storage> {
    copy_dir(&h.data_dir(), to);
    let store: Arc<dyn ObjectStore> = h.store.clone();
    Storage::new(store, h.settings.clone(), to, h.rt.handle().clone()).unwrap()
}

/// `len` bytes that differ with `seed` and along the way.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// `len` bytes no two blocks of which are alike (content-addressed blocks would otherwise be
/// shared), different for every `seed`.
pub fn unique(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Opens `path` for writing: its inode and handle.
pub fn open_rw(e: &ScopeEngine, path: &str) -> (Ino, Fh) {
    let ino = resolve(e, path).unwrap();
    (ino, e.open(ino, OpenFlags { write: true, ..Default::default() }).unwrap().fh)
}

/// Waits until the wall clock is in a later second than `t` (gc with metadata shipping takes only
/// blocks unreferenced before the second its pass starts in).
pub fn next_second_after(t: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() <= t {
        assert!(std::time::Instant::now() < deadline, "the clock did not move on");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Runs `action` once, the first time `point` of `e`'s operations is reached, on a thread of its
/// own (the point may be on one of the runtime's threads, where the engine's blocking calls may
/// not run); what it returns is kept.
pub fn once_at<T: Send + 'static>(
    e: &Arc<ScopeEngine>,
    point: &'static str,
    action: impl Fn(&ScopeEngine) -> T + Send + Sync + 'static,
) -> (scopefs::testhooks::Interleaving, Arc<Mutex<Option<T>>>) {
    let out = Arc::new(Mutex::new(None));
    let (ran, weak, kept) = (AtomicBool::new(false), Arc::downgrade(e), out.clone());
    let action = Arc::new(action);
    let hook = scopefs::testhooks::set_interleave(point, e.scope_id().as_str(), move || {
        let Some(engine) = weak.upgrade() else { return };
        if ran.swap(true, Ordering::SeqCst) {
            return;
        }
        let action = action.clone();
        let result = std::thread::spawn(move || action(&engine)).join().expect("the interleaved action panicked");
        *kept.lock().unwrap() = Some(result);
    });
    (hook, out)
}
