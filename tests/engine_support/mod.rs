//! Shared helpers of the engine-level tests: a storage over an in-memory store, path resolution, whole-file I/O.

use std::path::PathBuf;
use std::sync::Arc;
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
