//! `MountManager`: one FUSE session per scope (all served by one shared worker pool) under a private
//! mount root, its host view (`crate::layout`: a `nosymfollow` bind), stale-mount cleanup, bounded
//! unmount (the connection is aborted when a bind survives elsewhere) and kernel-cache coherence for
//! changes made outside the mount.
//!
//! Coherence: the kernel caches entries, attributes and pages for `attr_ttl` (60 s in production). A
//! change made through the engine's path-level API (the HTTP routes) is reported by the engine's
//! observer, which `mount` installs: `Change::Entry` drops the kernel's dentry (and the parent's
//! attributes), `Change::Inode` drops an inode's attributes and pages. The engine reports changes only
//! from path-level calls, never from inside a FUSE callback, and after releasing its locks, so a
//! notification never waits on a request that waits on us. A failed notification is logged, not fatal.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, INodeNo, MountOption, Notifier, PooledSession, Session, SessionACL, SessionPool};
use parking_lot::Mutex;
use scopefs::engine::{Change, Ino, ScopeEngine};
use scopefs::ids::ScopeId;
use scopefs::scope_locks::ScopeLocks;

use crate::adapter::ScopeFs;
use crate::keep::{self, FdKeeper};
use crate::layout::{self, lazy_unmount};

/// How long `unmount` waits for a session thread to end after its connection is gone.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Stack of each FUSE worker (the engine's callbacks run SQLite on it). Few workers serve every
/// mount, so this is a per-daemon cost.
pub const WORKER_STACK: usize = 2 << 20;

/// Bytes of each FUSE worker's request buffer kept present (`fuser::SessionPool::new`): the
/// largest request a mount of this process negotiates, a write of `max_write` or an extended
/// attribute's value (at most 64 KiB), with room for headers and names. A mount resumed from a
/// process that negotiated a larger `max_write` still works; its larger requests fault pages in.
pub fn resident_request_bytes(max_write: u32) -> usize {
    (max_write as usize).max(64 << 10) + (8 << 10)
}

/// Filesystem type the kernel records for our mounts (`fuse.<subtype>`).
const FS_TYPE: &str = "fuse.scopefs";

/// How scopes are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// Entry and attribute cache lifetime handed to the kernel.
    pub attr_ttl: Duration,
    /// FUSE worker threads, shared by every mount (one pool; see `fuser::SessionPool`).
    pub threads: usize,
    /// Workers one mount may hold at once (`fuse.max_workers_per_mount`); its further requests
    /// wait in the kernel until one of them is done.
    pub max_workers_per_mount: usize,
    /// Let every user (containers' users included) use the mount.
    pub allow_other: bool,
    /// Open directory handles per mount (`limits.max_dir_handles_per_mount`).
    pub max_dir_handles: u64,
    /// Kernel fast paths (`[fuse]` max_write_kib, keep_cache, writeback_cache).
    pub fast_paths: crate::adapter::FastPaths,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_ttl: Duration::from_secs(60),
            threads: 16,
            max_workers_per_mount: 8,
            allow_other: true,
            max_dir_handles: scopefs::limits::LimitsConfig::default().max_dir_handles_per_mount,
            fast_paths: crate::adapter::FastPaths::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot prepare the mount root: {0}")]
    MountRoot(#[source] io::Error),
    #[error("cannot read the mount table: {0}")]
    MountTable(#[source] io::Error),
    #[error("cannot prepare the mountpoint of scope {scope}: {source}")]
    Mountpoint {
        scope: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot mount scope {scope}: {source}")]
    Mount {
        scope: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot unmount scope {scope}: {source}")]
    Unmount {
        scope: String,
        #[source]
        source: io::Error,
    },
}

/// Mounts scopes, one FUSE session each, all served by one pool of workers sized by the daemon: the
/// real mount at `<real_root>/<scope_id>` (what containers bind) and its host view at
/// `<mount_root>/<scope_id>` (see `crate::layout`).
pub struct MountManager {
    root: PathBuf,
    real_root: PathBuf,
    opts: MountOptions,
    sessions: Mutex<HashMap<ScopeId, Mounted>>,
    /// Where new mounts' descriptors are kept for the next daemon process (`crate::keep`).
    keeper: Option<Arc<dyn FdKeeper>>,
    /// Live connections inherited from a previous daemon process, not resumed yet.
    inherited: Mutex<HashMap<ScopeId, OwnedFd>>,
    /// The workers serving every session; dropped last (after `Drop` unmounted everything).
    pool: SessionPool,
    /// Host views found mounted at start (read once: a resumed scope must not read the mount
    /// table again, which grows with the number of scopes).
    live_views: std::collections::HashSet<PathBuf>,
    /// Serializes mounting and unmounting of one scope (striped by scope id) while different
    /// scopes mount in parallel: the `sessions` table is locked only to look up and insert.
    scope_locks: ScopeLocks,
}

/// One live mount: its session and the engine whose observer feeds the session's notifier.
struct Mounted {
    session: PooledSession,
    engine: Arc<ScopeEngine>,
    /// The connection's fuse control directory name, when it could be read.
    conn: Option<layout::Connection>,
}

impl MountManager {
    /// Prepares `mount_root` and its real-mount root (both `0700`) and lazily detaches stale
    /// scopefs mounts left below them by a daemon that was killed (views first).
    pub fn new(mount_root: &Path, opts: MountOptions) -> Result<MountManager, MountError> {
        MountManager::resuming(mount_root, opts, HashMap::new(), None)
    }

    /// `new`, keeping the mounts whose live connection a previous daemon process handed over
    /// (`inherited`: each scope's `/dev/fuse` descriptor); `mount` resumes them instead of mounting
    /// again. An inherited descriptor whose real mount is gone is closed. New mounts' descriptors
    /// go to `keeper`, so they survive this process too.
    pub fn resuming(
        mount_root: &Path,
        opts: MountOptions,
        mut inherited: HashMap<ScopeId, OwnedFd>,
        keeper: Option<Arc<dyn FdKeeper>>,
    ) -> Result<MountManager, MountError> {
        let private_dir = |dir: &Path| -> io::Result<PathBuf> {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            dir.canonicalize()
        };
        let root = private_dir(mount_root).map_err(MountError::MountRoot)?;
        let real_root = private_dir(&layout::real_root_of(&root)).map_err(MountError::MountRoot)?;
        // Read once: with thousands of mounts the table is megabytes, and nothing below changes
        // what it says of the two roots except the detaches it asks for.
        let table = std::fs::read_to_string("/proc/self/mountinfo").map_err(MountError::MountTable)?;
        let mounts = parse_mountinfo(&table);
        // A set: thousands of inherited connections are each looked up here.
        let live: std::collections::HashSet<PathBuf> = stale_mounts(&mounts, &real_root).into_iter().collect();
        inherited.retain(|scope, _| {
            let alive = live.contains(&real_root.join(scope.to_string()));
            if !alive {
                tracing::info!(%scope, "an inherited connection has no mount any more; closed");
                forget(keeper.as_deref(), scope);
            }
            alive
        });
        let resumed = |p: &PathBuf| {
            let scope = p.file_name().and_then(|n| n.to_str()).and_then(|n| ScopeId::parse(n).ok());
            let parent = p.parent().map(Path::to_path_buf);
            scope.is_some_and(|s| inherited.contains_key(&s))
                && (parent == Some(root.clone()) || parent == Some(real_root.clone()))
        };
        let mut live_views = std::collections::HashSet::new();
        for dir in [&root, &real_root] {
            for stale in stale_mounts(&mounts, dir) {
                if resumed(&stale) {
                    if stale.parent() == Some(root.as_path()) {
                        live_views.insert(stale);
                    }
                    continue;
                }
                if let Err(err) = lazy_unmount(&stale) {
                    tracing::warn!(error = %err, "could not detach a stale scopefs mount");
                } else {
                    tracing::info!("detached a stale scopefs mount");
                }
            }
        }
        if let Err(err) = layout::ensure_fusectl(&table) {
            tracing::warn!(error = %err, "fuse control filesystem unavailable; a surviving bind cannot be aborted");
        }
        let pool = SessionPool::new(
            opts.threads.max(1),
            WORKER_STACK,
            resident_request_bytes(opts.fast_paths.max_write),
            opts.max_workers_per_mount,
        )
        .map_err(MountError::MountRoot)?;
        crate::metrics::set_pool(pool.counters());
        crate::offload::set_max(opts.threads.max(1));
        Ok(MountManager {
            pool,
            live_views,
            root,
            real_root,
            opts,
            sessions: Mutex::new(HashMap::new()),
            keeper,
            inherited: Mutex::new(inherited),
            scope_locks: ScopeLocks::default(),
        })
    }

    /// FUSE workers serving a request now (of `threads`).
    pub fn busy_workers(&self) -> usize {
        self.pool.counters().busy_workers()
    }

    pub fn mount_root(&self) -> &Path {
        &self.root
    }

    /// The root-only directory holding the real mounts.
    pub fn real_root(&self) -> &Path {
        &self.real_root
    }

    /// The host view of a scope: `<mount_root>/<scope_id>`, where symlinks are never followed.
    pub fn mountpoint(&self, scope: &ScopeId) -> PathBuf {
        self.root.join(scope.to_string())
    }

    /// The real mount of a scope, what a container binds (symlinks resolve in its namespace).
    pub fn real_mountpoint(&self, scope: &ScopeId) -> PathBuf {
        self.real_root.join(scope.to_string())
    }

    pub fn is_mounted(&self, scope: &ScopeId) -> bool {
        self.sessions.lock().contains_key(scope)
    }

    /// Mounts the engine's scope and its host view (a no-op when it is already mounted).
    /// Returns the real mount ([`Self::real_mountpoint`]): the path a container binds.
    pub fn mount(&self, engine: Arc<ScopeEngine>) -> Result<PathBuf, MountError> {
        let scope = engine.scope_id().clone();
        let path = self.real_mountpoint(&scope);
        let view = self.mountpoint(&scope);
        let _this_scope = self.scope_locks.of(&scope).lock();
        if self.sessions.lock().contains_key(&scope) {
            return Ok(path);
        }
        let fs = ScopeFs::new(engine.clone(), self.opts.attr_ttl, self.opts.max_dir_handles)
            .with_fast_paths(self.opts.fast_paths)
            .with_fsync_threads(self.opts.max_workers_per_mount);
        if let Some(fd) = self.inherited.lock().remove(&scope) {
            let mounted = self.resume(&scope, fs, fd, &engine)?;
            engine.set_observer(Some(observer(scope.clone(), mounted.session.notifier())));
            engine.set_kernel_probe(Some(kernel_probe(mounted.session.notifier())));
            tracing::info!(%scope, "scope mount resumed");
            self.sessions.lock().insert(scope, mounted);
            return Ok(path);
        }
        let mp_err = |source| MountError::Mountpoint { scope: scope.to_string(), source };
        prepare_mountpoint(&path).map_err(mp_err)?;
        prepare_mountpoint(&view).map_err(mp_err)?;
        let mount_err = |source| MountError::Mount { scope: scope.to_string(), source };
        let session = Session::new(fs, &path, &self.session_config(&scope)).map_err(mount_err)?;
        if let Some(keeper) = &self.keeper {
            if let Err(e) = keeper.keep(&keep::fuse_fd_name(&scope), session.as_fd()) {
                tracing::warn!(%scope, error = %e, "cannot keep the mount's connection; it will not survive a restart");
            }
        }
        let session = session.spawn_in(&self.pool).map_err(mount_err)?;
        if let Err(e) = layout::set_readahead(&path, self.opts.fast_paths.readahead_kib) {
            tracing::warn!(%scope, error = %e, "cannot set the mount's readahead; the kernel's default applies");
        }
        let conn = layout::connection_of(&path).ok();
        let mounted = Mounted { session, engine: engine.clone(), conn };
        if let Err(source) = layout::bind_view(&path, &view) {
            // No view, no mount: a half-made layout is taken down again.
            forget(self.keeper.as_deref(), &scope);
            self.finish(&scope, mounted, false);
            return Err(MountError::Mount { scope: scope.to_string(), source });
        }
        engine.set_observer(Some(observer(scope.clone(), mounted.session.notifier())));
        tracing::info!(%scope, "scope mounted");
        self.sessions.lock().insert(scope, mounted);
        Ok(path)
    }

    /// Serves an inherited connection again: no mount, no INIT; the requests its previous server
    /// had read but not answered are asked for again. The view is bound if it is missing.
    fn resume(
        &self,
        scope: &ScopeId,
        fs: ScopeFs,
        fd: OwnedFd,
        engine: &Arc<ScopeEngine>,
    ) -> Result<Mounted, MountError> {
        let path = self.real_mountpoint(scope);
        let mount_err = |source| MountError::Mount { scope: scope.to_string(), source };
        let config = self.session_config(scope);
        if let Err(e) = keep::request_resend(fd.as_fd()) {
            tracing::warn!(%scope, error = %e, "the kernel cannot resend unanswered requests; their callers wait");
        }
        let session = Session::resume_fd(fs, fd, config.acl, config).spawn_in(&self.pool).map_err(mount_err)?;
        let conn = layout::connection_of(&path).ok();
        let mounted = Mounted { session, engine: engine.clone(), conn };
        let view = self.mountpoint(scope);
        if !self.live_views.contains(&view) {
            if let Err(source) = prepare_mountpoint(&view).and_then(|()| layout::bind_view(&path, &view)) {
                forget(self.keeper.as_deref(), scope);
                self.finish(scope, mounted, false);
                return Err(mount_err(source));
            }
        }
        Ok(mounted)
    }

    /// Whether `scope`'s live connection was inherited and is not resumed yet.
    pub fn will_resume(&self, scope: &ScopeId) -> bool {
        self.inherited.lock().contains_key(scope)
    }

    /// Scopes whose live connection was inherited and is not resumed yet.
    pub fn inherited_scopes(&self) -> Vec<ScopeId> {
        self.inherited.lock().keys().cloned().collect()
    }

    /// Takes down every inherited mount that was not resumed (its scope is no longer mounted by
    /// this daemon): views and real mounts are detached and the connections closed.
    pub fn drop_unclaimed(&self) {
        let left: Vec<(ScopeId, OwnedFd)> = self.inherited.lock().drain().collect();
        for (scope, fd) in left {
            for p in [self.mountpoint(&scope), self.real_mountpoint(&scope)] {
                if let Err(e) = lazy_unmount(&p) {
                    tracing::warn!(%scope, error = %e, "could not detach an unclaimed mount");
                }
            }
            forget(self.keeper.as_deref(), &scope);
            drop(fd);
            tracing::info!(%scope, "unclaimed inherited mount taken down");
        }
    }

    /// The session settings of a scope's mount (fresh or resumed). One `/dev/fuse` file serves
    /// every thread (no cloned descriptors): a kept duplicate of that file then holds every
    /// unanswered request, which a resumed daemon asks the kernel to resend.
    fn session_config(&self, scope: &ScopeId) -> Config {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(format!("scopefs:{scope}")),
            // The pure-Rust mount passes only kernel options; this makes the type `fuse.scopefs`.
            MountOption::CUSTOM("subtype=scopefs".to_string()),
            MountOption::DefaultPermissions,
            MountOption::NoDev,
            MountOption::NoSuid,
        ];
        config.acl = if self.opts.allow_other { SessionACL::All } else { SessionACL::Owner };
        config.clone_fd = false;
        config
    }

    /// Unmounts a scope (its view first, then the real mount) and waits, bounded, for its session
    /// to end. A mount busy here (an open file, a working directory) is detached lazily and its
    /// session left to end when the last user lets go, as a local filesystem would. Otherwise a
    /// connection that survives both unmounts is held by a bind elsewhere (a container the executor
    /// could not remove, an orchestrator's bind): it is aborted, so the survivors get `ENOTCONN`
    /// instead of reading a deleted scope, and the unmount never blocks on them.
    pub fn unmount(&self, scope: &ScopeId) -> Result<(), MountError> {
        let _this_scope = self.scope_locks.of(scope).lock();
        let Some(mounted) = self.sessions.lock().remove(scope) else {
            return Ok(());
        };
        mounted.engine.set_observer(None);
        mounted.engine.set_kernel_probe(None);
        forget(self.keeper.as_deref(), scope);
        let err = |source| MountError::Unmount { scope: scope.to_string(), source };
        let view = layout::unmount_path(&self.mountpoint(scope));
        let real = layout::unmount_path(&self.real_mountpoint(scope));
        let busy = matches!(view, Ok(true)) || matches!(real, Ok(true));
        if busy {
            tracing::warn!(%scope, "mount busy; detached lazily");
        }
        self.finish(scope, mounted, busy);
        view.map_err(err)?;
        real.map_err(err).map(drop)
    }

    /// Ends a session whose mounts are gone or detached. Unless `busy` (a lazily detached mount
    /// still in use here), a connection that survives is aborted and the session's end (its
    /// filesystem destroyed) awaited for at most `JOIN_TIMEOUT`.
    fn finish(&self, scope: &ScopeId, mounted: Mounted, busy: bool) {
        let Mounted { session, engine, conn } = mounted;
        drop(engine);
        if let Err(e) = layout::unmount_path(&self.real_mountpoint(scope)) {
            tracing::warn!(%scope, error = %e, "unmount failed");
        }
        if busy {
            // The pool serves the session until the last user of the mount lets go.
            drop(session);
            return;
        }
        match conn.as_ref().map(layout::Connection::abort) {
            Some(Ok(true)) => tracing::warn!(%scope, "the mount survived elsewhere; its FUSE connection was aborted"),
            Some(Err(e)) => tracing::warn!(%scope, error = %e, "aborting the FUSE connection failed"),
            Some(Ok(false)) | None => {}
        }
        match session.wait(JOIN_TIMEOUT) {
            Some(Ok(())) => tracing::info!(%scope, "scope unmounted"),
            Some(Err(e)) => tracing::warn!(%scope, error = %e, "the FUSE session ended with an error"),
            None => tracing::warn!(%scope, "the FUSE session did not end in time; left to finish in the background"),
        }
    }

    /// Unmounts every scope, logging failures.
    pub fn unmount_all(&self) {
        let scopes: Vec<ScopeId> = self.sessions.lock().keys().cloned().collect();
        for scope in scopes {
            if let Err(err) = self.unmount(&scope) {
                tracing::warn!(%scope, error = %err, "unmount failed");
            }
        }
    }

    /// Drops the kernel's cached entry `name` in directory `parent` (after an HTTP change).
    pub fn invalidate_entry(&self, scope: &ScopeId, parent: Ino, name: &[u8]) {
        let notifier = self.sessions.lock().get(scope).map(|m| m.session.notifier());
        if let Some(n) = notifier {
            apply(scope, &n, &Change::Entry { parent, name: name.to_vec() });
        }
    }

    /// Drops the kernel's cached attributes and pages of `ino` (after an HTTP change).
    pub fn invalidate_inode(&self, scope: &ScopeId, ino: Ino) {
        let notifier = self.sessions.lock().get(scope).map(|m| m.session.notifier());
        if let Some(n) = notifier {
            apply(scope, &n, &Change::Inode(ino));
        }
    }
}

/// Tells the keeper to close a scope's kept connection (logged on failure).
fn forget(keeper: Option<&dyn FdKeeper>, scope: &ScopeId) {
    if let Some(keeper) = keeper {
        if let Err(e) = keeper.forget(&keep::fuse_fd_name(scope)) {
            tracing::warn!(%scope, error = %e, "cannot drop the kept connection of an unmounted scope");
        }
    }
}

/// The engine observer of one mount: every change becomes kernel invalidations on its session.
fn observer(scope: ScopeId, notifier: Notifier) -> scopefs::engine::ChangeObserver {
    Arc::new(move |change: &Change| apply(&scope, &notifier, change))
}

/// Sends the invalidations of one change. An entry change also drops the parent directory's
/// attributes (size, times, link count) and cached listing pages.
/// Asks the kernel whether it holds an inode: an invalidation of its attributes only (offset -1
/// leaves its pages) answers `ENOENT` for an inode the kernel does not have.
fn kernel_probe(notifier: Notifier) -> scopefs::engine::KernelProbe {
    Arc::new(move |ino: Ino| match notifier.inval_inode(INodeNo(ino), -1, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
        // Held, or unknown (a failed notification): kept until the kernel forgets it.
        _ => true,
    })
}

fn apply(scope: &ScopeId, notifier: &Notifier, change: &Change) {
    match change {
        Change::Entry { parent, name } => {
            report(scope, "entry", notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name)));
            report(scope, "inode", notifier.inval_inode(INodeNo(*parent), 0, 0));
        }
        Change::Inode(ino) => report(scope, "inode", notifier.inval_inode(INodeNo(*ino), 0, 0)),
    }
}

/// `ENOENT` means the kernel had nothing cached; anything else is logged (the next TTL expiry heals it).
fn report(scope: &ScopeId, what: &'static str, result: io::Result<()>) {
    match result {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => tracing::warn!(%scope, what, error = %e, "kernel cache invalidation failed"),
    }
}

impl Drop for MountManager {
    fn drop(&mut self) {
        self.unmount_all();
    }
}

/// Creates the mountpoint directory, first detaching a dead mount found there.
fn prepare_mountpoint(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => lazy_unmount(path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Mountpoints of scopefs mounts strictly below `root` among `mounts` (this mount namespace's
/// table), deepest first.
fn stale_mounts(mounts: &[MountEntry], root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| is_ours(m) && m.mountpoint.starts_with(root) && m.mountpoint != root)
        .map(|m| m.mountpoint.clone())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// What we need of one mountinfo line.
#[derive(Debug, PartialEq, Eq)]
struct MountEntry {
    mountpoint: PathBuf,
    fstype: String,
    source: String,
}

/// A scopefs mount: our FUSE type, or a FUSE mount whose source names a scope.
fn is_ours(m: &MountEntry) -> bool {
    m.fstype == FS_TYPE || (m.fstype.starts_with("fuse") && m.source.starts_with("scopefs:"))
}

/// The entries of a mountinfo table.
fn parse_mountinfo(table: &str) -> Vec<MountEntry> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mountpoint = fields.get(4)?;
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?;
            let source = fields.get(sep + 2).copied().unwrap_or("");
            let raw: std::ffi::OsString = OsStringExt::from_vec(unescape(mountpoint));
            Some(MountEntry {
                mountpoint: PathBuf::from(raw),
                fstype: (*fstype).to_string(),
                source: String::from_utf8_lossy(&unescape(source)).into_owned(),
            })
        })
        .collect()
}

/// Decodes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_yield_mountpoint_and_type() {
        let table = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - fuse.scopefs scopefs:x rw,user_id=0\n\
                     37 35 98:1 / /srv ro shared:2 - ext4 /dev/sda1 rw\n\
                     38 35 0:41 / /m/s rw,nosuid - fuse scopefs:y rw\n\
                     39 35 0:42 / /m/t rw,nosuid - fuse other rw\n";
        let parsed = parse_mountinfo(table);
        let entry = |mp: &str, t: &str, src: &str| MountEntry {
            mountpoint: PathBuf::from(mp),
            fstype: t.to_string(),
            source: src.to_string(),
        };
        assert_eq!(
            parsed,
            vec![
                entry("/mnt/a b", "fuse.scopefs", "scopefs:x"),
                entry("/srv", "ext4", "/dev/sda1"),
                entry("/m/s", "fuse", "scopefs:y"),
                entry("/m/t", "fuse", "other"),
            ]
        );
        let ours: Vec<bool> = parsed.iter().map(is_ours).collect();
        assert_eq!(ours, vec![true, false, true, false]);
    }

    #[test]
    fn unescape_leaves_plain_text_alone() {
        assert_eq!(unescape("/a/b"), b"/a/b".to_vec());
        assert_eq!(unescape("/a\\134b"), b"/a\\b".to_vec());
        assert_eq!(unescape("/a\\"), b"/a\\".to_vec());
    }

    #[test]
    fn default_options_match_production() {
        let o = MountOptions::default();
        assert_eq!(o.attr_ttl, Duration::from_secs(60));
        assert_eq!(o.threads, 16);
        assert!(o.allow_other);
    }
}
