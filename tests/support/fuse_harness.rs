//! Test harness for real FUSE mounts: a local-directory object store (or one the test gives), a
//! `Storage` and a `MountManager` in a temp dir.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use scopefs::engine::{Quota, ScopeEngine, Storage, StorageSettings};
use scopefs::ids::ScopeId;
use scopefs::store::{LocalDirStore, ObjectStore};
use scopefs_fs::{MountManager, MountOptions};

/// Everything one test needs to mount scopes. Field order is drop order:
/// mounts first, then the storage, then the runtime, then the files.
pub struct Harness {
    pub mounts: MountManager,
    pub storage: Arc<Storage>,
    pub settings: StorageSettings,
    pub rt: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
}

impl Harness {
    pub fn new(settings: StorageSettings, opts: MountOptions) -> Harness {
        Harness::with_store(settings, opts, None)
    }

    /// Like `new`, on `store` when one is given (a `MemoryStore` whose faults the test drives).
    pub fn with_store(settings: StorageSettings, opts: MountOptions, store: Option<Arc<dyn ObjectStore>>) -> Harness {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: FUSE tests need the fuse kernel module (run as root on a FUSE-capable host)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let store = store.unwrap_or_else(|| local_store(dir.path()));
        let storage = open_storage_on(store, dir.path(), &settings, &rt);
        let mounts = MountManager::new(&dir.path().join("mnt"), opts).expect("mount manager");
        Harness { mounts, storage, settings, rt, dir }
    }

    /// Opens a new scope with the given quota and mounts it.
    pub fn scope(&self, quota: Quota) -> (Arc<ScopeEngine>, PathBuf) {
        let engine = self.storage.open_scope(&ScopeId::generate(), quota).expect("open scope");
        let mnt = self.mounts.mount(engine.clone()).expect("mount scope");
        (engine, mnt)
    }

    /// Unmounts the scope, waits for its uploads, drops the engine and storage, wipes the
    /// block cache, then reopens storage and scope and mounts again (cold remount).
    pub fn remount_cold(&mut self, engine: Arc<ScopeEngine>) -> (Arc<ScopeEngine>, PathBuf) {
        let scope = engine.scope_id().clone();
        let quota = engine.quota();
        self.mounts.unmount(&scope).expect("unmount");
        assert!(engine.wait_uploads(std::time::Duration::from_secs(60)), "uploads did not finish");
        drop(engine);
        let cache = self.dir.path().join("data").join("cache");
        for entry in std::fs::read_dir(&cache).expect("cache dir").flatten() {
            let p = entry.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
        self.storage = open_storage(self.dir.path(), &self.settings, &self.rt);
        let engine = self.storage.open_scope(&scope, quota).expect("reopen scope");
        let mnt = self.mounts.mount(engine.clone()).expect("remount");
        (engine, mnt)
    }
}

fn local_store(root: &Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalDirStore::new(root.join("store")).expect("local store"))
}

fn open_storage(root: &Path, settings: &StorageSettings, rt: &tokio::runtime::Runtime) -> Arc<Storage> {
    open_storage_on(local_store(root), root, settings, rt)
}

fn open_storage_on(
    store: Arc<dyn ObjectStore>,
    root: &Path,
    settings: &StorageSettings,
    rt: &tokio::runtime::Runtime,
) -> Arc<Storage> {
    Storage::new(store, settings.clone(), &root.join("data"), rt.handle().clone()).expect("storage")
}

/// Storage settings with small blocks so ordinary files span many blocks.
pub fn small_block_settings() -> StorageSettings {
    StorageSettings { block_size: 64 * 1024, ..StorageSettings::default() }
}

pub fn big_quota() -> Quota {
    Quota { bytes: 1 << 40, inodes: 1 << 20 }
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// The errno of a failed call; panics (naming `what`) if it succeeded.
pub fn errno_of<T: std::fmt::Debug>(r: io::Result<T>, what: &str) -> i32 {
    match r {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("{what}: not an OS error: {e}")),
    }
}

/// `statvfs(2)` of a path.
pub fn statvfs(p: &Path) -> libc::statvfs {
    let c = cpath(p);
    // SAFETY: zeroed statvfs is a valid out-parameter; `c` outlives the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs failed: {}", io::Error::last_os_error());
    st
}

/// `renameat2(2)` with flags.
pub fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: valid NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `mknod(2)`.
pub fn mknod(p: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, dev) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures are reproducible.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A bind mount of a scope's mountpoint at a world-traversable path. The mount root is
/// `0700` by design, so other users reach a scope only through a bind mount of its leaf
/// (as containers do).
pub struct BindMount {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl BindMount {
    pub fn new(source: &Path) -> BindMount {
        let dir = tempfile::tempdir().expect("tempdir");
        fs_set_mode(dir.path(), 0o755);
        let path = dir.path().join("m");
        std::fs::create_dir(&path).expect("bind target");
        fs_set_mode(&path, 0o755);
        let (src, dst) = (cpath(source), cpath(&path));
        // SAFETY: valid NUL-terminated paths; null fstype/data are allowed for MS_BIND.
        let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
        assert_eq!(rc, 0, "bind mount failed: {}", io::Error::last_os_error());
        BindMount { path, _dir: dir }
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let c = cpath(&self.path);
        // SAFETY: valid NUL-terminated path.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

fn fs_set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Polls `f` until it holds, failing after 20 s: for effects the kernel delivers after a call
/// returns (a `close` sends `RELEASE` asynchronously).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
