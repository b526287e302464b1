//! `ScopeService`: scope lifecycle across the registry, the file engine and the mount manager (synchronous; no HTTP).
//!
//! Provisioning is a saga recorded in the registry: the scope row and an
//! `applying` operation are written first, then the scope's filesystem is opened
//! and mounted, then the scope becomes `draft` and the operation `completed` in
//! one transaction. If opening or mounting fails the operation is marked
//! `failed` (with an error code) and the scope stays `provisioning`; it is
//! finished by the next provision request for the same operation or thread, by
//! the mount route, or at the next daemon start (`recover`). Nothing is ever
//! compensated away: a provisioning scope only ever moves forward to `draft`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scopefs::engine::{EngineError, Quota, ScopeEngine, Storage, Usage};
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::{
    Lease, NewOwner, OwnerRecord, OwnerType, OwnerUpdate, Registry, RegistryError, Reservation, RunRequestRecord,
    RunReserve, RunUpdate, ScopeRecord, ScopeState,
};
use scopefs_fs::{MountError, MountManager};

use crate::lifecycle::{failpoint, LifecycleSettings};

/// Failures of scope lifecycle work.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no such scope")]
    ScopeNotFound,
    #[error("scope is {0}; only draft and active scopes can be mounted")]
    NotMountable(ScopeState),
    #[error("operation id must be 1-128 characters of [A-Za-z0-9_.:-]")]
    BadOperationId,
    #[error("a scope can only be moved to active or deleting")]
    StateNotRequestable,
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("file engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Mount(#[from] MountError),
}

impl ServiceError {
    /// A short snake_case code recorded with a failed operation.
    pub fn code(&self) -> &'static str {
        match self {
            ServiceError::ScopeNotFound => "scope_not_found",
            ServiceError::NotMountable(_) => "scope_not_mountable",
            ServiceError::BadOperationId => "invalid_operation_id",
            ServiceError::StateNotRequestable => "invalid_state_transition",
            ServiceError::Registry(_) => "registry_error",
            ServiceError::Engine(_) => "engine_error",
            ServiceError::Mount(_) => "mount_failed",
        }
    }
}

/// A scope record with its current usage.
#[derive(Debug, Clone)]
pub struct ScopeStatus {
    pub record: ScopeRecord,
    pub usage: Usage,
}

/// Validates an idempotency key: 1-128 characters of `[A-Za-z0-9_.:-]`.
pub fn validate_operation_id(op: &str) -> Result<(), ServiceError> {
    let ok = (1..=128).contains(&op.len())
        && op.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    ok.then_some(()).ok_or(ServiceError::BadOperationId)
}

/// Everything the daemon needs to run scopes of one deployment.
pub struct ScopeService {
    pub(crate) deployment: String,
    default_quota: Quota,
    pub(crate) registry: Arc<Registry>,
    pub(crate) storage: Arc<Storage>,
    pub(crate) mounts: MountManager,
    /// Open engines, kept alive while the daemon runs (the storage only holds weak references).
    pub(crate) engines: Mutex<HashMap<ScopeId, Arc<ScopeEngine>>>,
    /// Serializes provisioning completion so one scope is never finished twice at once.
    provisioning: Mutex<()>,
    /// Serializes delete completion and purges (see `lifecycle`).
    pub(crate) lifecycle_lock: Mutex<()>,
    pub(crate) lifecycle: LifecycleSettings,
    /// Runs object-store work (purge) from blocking threads.
    pub(crate) rt: tokio::runtime::Handle,
    ready: AtomicBool,
    /// Limits and sources of the `/api/workspace*` routes.
    workspace: WorkspaceSettings,
    /// The sandbox executor (SPEC §8); `None`: compute tools answer 503.
    pub(crate) compute: Option<crate::executor::Compute>,
    /// Compute preflight (plan, minutes, cash) of environments; none means no billing checks.
    pub(crate) billing: Option<Arc<crate::billing_loop::BillingService>>,
}

impl ScopeService {
    pub fn new(
        deployment: String,
        default_quota: Quota,
        registry: Arc<Registry>,
        storage: Arc<Storage>,
        mounts: MountManager,
        lifecycle: LifecycleSettings,
        rt: tokio::runtime::Handle,
    ) -> ScopeService {
        ScopeService {
            deployment,
            default_quota,
            registry,
            storage,
            mounts,
            engines: Mutex::new(HashMap::new()),
            provisioning: Mutex::new(()),
            lifecycle_lock: Mutex::new(()),
            lifecycle,
            rt,
            ready: AtomicBool::new(false),
            workspace: WorkspaceSettings::default(),
            compute: None,
            billing: None,
        }
    }

    /// Runs environments through `compute` (see `executor`).
    pub fn with_billing(mut self, billing: Arc<crate::billing_loop::BillingService>) -> ScopeService {
        self.billing = Some(billing);
        self
    }

    pub fn with_compute(mut self, compute: crate::executor::Compute) -> ScopeService {
        self.compute = Some(compute);
        self
    }

    /// Sets the limits of the workspace file routes (default: `WorkspaceSettings::default()`).
    pub fn with_workspace(mut self, settings: WorkspaceSettings) -> ScopeService {
        self.workspace = settings;
        self
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release)
    }

    /// The open engine of a scope, opening it if needed.
    pub(crate) fn engine(&self, rec: &ScopeRecord) -> Result<Arc<ScopeEngine>, ServiceError> {
        let mut engines = self.engines.lock();
        if let Some(engine) = engines.get(&rec.scope_id) {
            return Ok(engine.clone());
        }
        let engine = self.storage.open_scope(&rec.scope_id, rec.quota_or(self.default_quota))?;
        engines.insert(rec.scope_id.clone(), engine.clone());
        Ok(engine)
    }

    /// Opens and mounts a `provisioning` scope, then records it as `draft` (see the module docs).
    fn finish_provisioning(&self, rec: &ScopeRecord) -> Result<ScopeRecord, ServiceError> {
        let _one_at_a_time = self.provisioning.lock();
        let mounted = self.engine(rec).and_then(|engine| Ok(self.mounts.mount(engine)?));
        if mounted.is_ok() {
            failpoint("provision_after_mount");
        }
        match mounted {
            Ok(_) => Ok(self.registry.complete_provision(&self.deployment, &rec.scope_id)?),
            Err(e) => {
                if let Err(re) = self.registry.fail_provision(&self.deployment, &rec.scope_id, e.code()) {
                    tracing::error!(scope_id = %rec.scope_id, error = %re, "recording a failed provisioning failed");
                }
                Err(e)
            }
        }
    }

    /// The scope of a primary thread and its open engine, for file work through the API.
    /// `ScopeNotFound` for an unknown thread or a scope that is not draft/active (deleted ones are gone),
    /// `NotMountable(Deleting)` while it is being deleted (the API answers 409).
    pub fn engine_for_thread(&self, thread: &ThreadId) -> Result<(ScopeRecord, Arc<ScopeEngine>), ServiceError> {
        let rec = self.registry.find_by_thread(&self.deployment, thread)?.ok_or(ServiceError::ScopeNotFound)?;
        match rec.state {
            ScopeState::Draft | ScopeState::Active => {
                let engine = self.engine(&rec)?;
                Ok((rec, engine))
            }
            ScopeState::Deleting => Err(ServiceError::NotMountable(ScopeState::Deleting)),
            _ => Err(ServiceError::ScopeNotFound),
        }
    }

    /// Registers an owner (`reserved`) in a draft or active scope; `true` if it is new.
    pub fn create_owner(&self, scope: &ScopeId, new: &NewOwner) -> Result<(OwnerRecord, bool), ServiceError> {
        Ok(self.registry.create_owner(&self.deployment, scope, new)?)
    }

    /// Attaches a resource to an owner and/or changes its state.
    pub fn update_owner(
        &self,
        scope: &ScopeId,
        owner: &str,
        update: &OwnerUpdate,
    ) -> Result<OwnerRecord, ServiceError> {
        Ok(self.registry.update_owner(&self.deployment, scope, owner, update)?)
    }

    /// The owner of an external resource within `scope`.
    pub fn owner_by_resource(
        &self,
        scope: &ScopeId,
        resource: &str,
        owner_type: Option<OwnerType>,
    ) -> Result<OwnerRecord, ServiceError> {
        Ok(self.registry.owner_by_resource(&self.deployment, scope, resource, owner_type)?)
    }

    /// Idempotent run reservation (a draft scope becomes active with its first one).
    pub fn reserve_run(&self, scope: &ScopeId, req: &RunReserve) -> Result<Reservation, ServiceError> {
        Ok(self.registry.reserve_run(&self.deployment, scope, req)?)
    }

    /// Attaches `run_id` and/or changes a run request's state.
    pub fn update_run(&self, scope: &ScopeId, run: &str, update: &RunUpdate) -> Result<RunRequestRecord, ServiceError> {
        Ok(self.registry.update_run(&self.deployment, scope, run, update)?)
    }

    /// Takes a deployment lease for `ttl`.
    pub fn acquire_lease(&self, name: &str, operation_id: &str, ttl: Duration) -> Result<Lease, ServiceError> {
        Ok(self.registry.acquire_lease(&self.deployment, name, operation_id, duration_ms(ttl))?)
    }

    /// Extends a lease held by `operation_id`.
    pub fn renew_lease(&self, name: &str, operation_id: &str, ttl: Duration) -> Result<Lease, ServiceError> {
        Ok(self.registry.renew_lease(&self.deployment, name, operation_id, duration_ms(ttl))?)
    }

    /// Releases a lease held by `operation_id`; `false` if it was not held at all.
    pub fn release_lease(&self, name: &str, operation_id: &str) -> Result<bool, ServiceError> {
        Ok(self.registry.release_lease(&self.deployment, name, operation_id)?)
    }

    /// Idempotent provisioning (operation id and thread); returns the scope and whether it is new.
    pub fn provision(&self, operation_id: &str, thread: &ThreadId) -> Result<(ScopeRecord, bool), ServiceError> {
        validate_operation_id(operation_id)?;
        let p = self.registry.provision(&self.deployment, operation_id, thread, None)?;
        failpoint("provision_after_record");
        let rec = if p.scope.state == ScopeState::Provisioning { self.finish_provisioning(&p.scope)? } else { p.scope };
        if p.created {
            tracing::info!(scope_id = %rec.scope_id, operation_id, "scope provisioned");
        }
        Ok((rec, p.created))
    }

    /// The scope bound to `thread` with its usage, if any.
    pub fn by_thread(&self, thread: &ThreadId) -> Result<Option<ScopeStatus>, ServiceError> {
        let Some(record) = self.registry.find_by_thread(&self.deployment, thread)? else {
            return Ok(None);
        };
        let usage = match record.state {
            ScopeState::Draft | ScopeState::Active | ScopeState::Deleting => self.engine(&record)?.usage()?,
            ScopeState::Provisioning | ScopeState::Deleted => Usage::default(),
        };
        Ok(Some(ScopeStatus { record, usage }))
    }

    /// Mounts the scope if it is not mounted yet (finishing its provisioning if needed); returns the real
    /// mount, the path a container binds (the host view is `mounts.mountpoint`).
    pub fn mount(&self, scope: &ScopeId) -> Result<(ScopeRecord, PathBuf), ServiceError> {
        let mut rec = self.registry.get(&self.deployment, scope)?.ok_or(ServiceError::ScopeNotFound)?;
        if rec.state == ScopeState::Provisioning {
            rec = self.finish_provisioning(&rec)?;
        }
        if !rec.state.is_mountable() {
            return Err(ServiceError::NotMountable(rec.state));
        }
        let path = self.mounts.mount(self.engine(&rec)?)?;
        Ok((rec, path))
    }

    /// Startup: finishes scopes left in `provisioning` and remounts every draft and active scope.
    /// A scope that cannot be mounted is logged and skipped (the mount route retries it).
    pub fn recover(&self) -> Result<RecoveryReport, ServiceError> {
        let mut report = RecoveryReport::default();
        for rec in self.registry.list(&self.deployment)? {
            let result = match rec.state {
                ScopeState::Provisioning => self.finish_provisioning(&rec).map(|_| ()),
                ScopeState::Draft | ScopeState::Active => {
                    self.engine(&rec).and_then(|engine| Ok(self.mounts.mount(engine).map(|_| ())?))
                }
                ScopeState::Deleting | ScopeState::Deleted => continue,
            };
            match result {
                Ok(()) => report.mounted += 1,
                Err(e) => {
                    tracing::error!(scope_id = %rec.scope_id, state = %rec.state, error = %e, "scope could not be mounted at startup");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// Shutdown: waits (bounded by `timeout` overall) for every scope's uploads — what remains stays
    /// journaled and is uploaded after the next start — then unmounts every scope.
    pub fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let engines: Vec<_> = self.engines.lock().values().cloned().collect();
        for engine in &engines {
            let left = deadline.saturating_duration_since(Instant::now());
            if !engine.wait_uploads(left) {
                tracing::warn!(
                    scope_id = %engine.scope_id(),
                    pending = engine.pending_uploads(),
                    "uploads still pending at shutdown; they stay journaled"
                );
            }
        }
        self.mounts.unmount_all();
        self.engines.lock().clear();
    }

    /// A restart: like `shutdown`, but every mount stays for the next daemon process (its
    /// connection is kept by the service manager). Uploads are awaited (bounded); what is left
    /// stays journaled and the next process resumes it.
    pub fn release(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        // No kernel request reaches an engine any more: those not answered yet go to the next
        // process (resent by the kernel), so none runs twice and none is lost.
        if !scopefs_fs::pause::pause_all(timeout) {
            tracing::warn!("FUSE operations still running at restart; the next process may repeat them");
        }
        let engines: Vec<_> = self.engines.lock().values().cloned().collect();
        for engine in &engines {
            // Open files' written data is committed: the next process adopts their handles.
            if let Err(e) = engine.commit_open_files() {
                tracing::warn!(scope_id = %engine.scope_id(), error = %e, "committing open files at restart failed");
            }
        }
        for engine in &engines {
            if !engine.wait_uploads(deadline.saturating_duration_since(Instant::now())) {
                tracing::warn!(scope_id = %engine.scope_id(), "uploads still pending at restart; they stay journaled");
            }
        }
    }
}

/// Signed `/tools/*` requests (seed 003 §4.3): the registry clock, single-use nonces, and the scope
/// a request's thread acts in.
impl ScopeService {
    /// Now by the registry's clock (Unix milliseconds), so windows and nonce expiry agree.
    pub fn now_ms(&self) -> i64 {
        self.registry.now_ms()
    }

    /// Records a verified request's nonce until `expires_at_ms`; `false` if it was used before.
    pub fn consume_nonce(&self, nonce: &str, expires_at_ms: i64) -> Result<bool, ServiceError> {
        Ok(self.registry.consume_nonce(&self.deployment, nonce, expires_at_ms)?)
    }

    /// The scope `thread` acts in (its primary thread, or a live thread owner of it) with its open
    /// engine. `ScopeNotFound` for an unknown thread or a scope that is not draft/active,
    /// `NotMountable(Deleting)` while it is being deleted.
    pub fn tool_scope(
        &self,
        thread: &ThreadId,
    ) -> Result<(scopefs::registry::nonces::ThreadBinding, Arc<ScopeEngine>), ServiceError> {
        let binding = self.registry.thread_binding(&self.deployment, thread)?.ok_or(ServiceError::ScopeNotFound)?;
        match binding.scope.state {
            ScopeState::Draft | ScopeState::Active => {
                let engine = self.engine(&binding.scope)?;
                Ok((binding, engine))
            }
            ScopeState::Deleting => Err(ServiceError::NotMountable(ScopeState::Deleting)),
            _ => Err(ServiceError::ScopeNotFound),
        }
    }
}

/// Creates a scope and its filesystem without mounting it (CLI `scope create`; needs no mount
/// manager, so it never touches the mounts of a running daemon).
pub fn create_unmounted(
    deployment: &str,
    default_quota: Quota,
    registry: &Registry,
    storage: &Arc<Storage>,
    thread: &ThreadId,
) -> Result<ScopeRecord, ServiceError> {
    let rec = registry.create_scope(deployment, thread, None)?;
    storage.open_scope(&rec.scope_id, rec.quota_or(default_quota))?;
    Ok(registry.complete_provision(deployment, &rec.scope_id)?)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// What `recover` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    pub mounted: usize,
    pub failed: usize,
}

/// Limits and sources of the `/api/workspace*` routes (from the config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceSettings {
    /// Largest single upload, file write or import, in bytes.
    pub max_upload_bytes: u64,
    /// The read-only legacy shared workspace files can be imported from, if any.
    pub legacy_root: Option<PathBuf>,
}

impl Default for WorkspaceSettings {
    fn default() -> Self {
        let cfg = scopefs::config::Config::default();
        WorkspaceSettings { max_upload_bytes: cfg.max_upload_bytes, legacy_root: cfg.legacy_root }
    }
}

impl WorkspaceSettings {
    pub fn from_config(cfg: &scopefs::config::Config) -> WorkspaceSettings {
        WorkspaceSettings { max_upload_bytes: cfg.max_upload_bytes, legacy_root: cfg.legacy_root.clone() }
    }
}

/// The owner given to files the HTTP API creates: the owner of the scope's root directory, so that
/// whoever owns the workspace (e.g. a container's user) owns what is uploaded into it.
pub fn api_owner(engine: &ScopeEngine) -> Result<scopefs::engine::Owner, EngineError> {
    let root = engine.getattr(scopefs::engine::ROOT_INO)?;
    Ok(scopefs::engine::Owner { uid: root.uid, gid: root.gid })
}

/// A reader that hashes what passes through it.
struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
    len: u64,
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

impl<R: std::io::Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        use sha2::Digest;
        HashingReader { inner, hasher: sha2::Sha256::new(), len: 0 }
    }

    /// Reads the rest, then returns (bytes read in total, SHA-256 hex).
    fn finish(mut self) -> std::io::Result<(u64, String)> {
        use sha2::Digest;
        std::io::copy(&mut self, &mut std::io::sink())?;
        Ok((self.len, hex::encode(self.hasher.finalize())))
    }
}

/// Reads a regular file of a scope by inode, from one open handle (one version), in chunks.
pub struct EngineFileReader {
    engine: Arc<ScopeEngine>,
    ino: scopefs::engine::Ino,
    fh: scopefs::engine::Fh,
    pos: u64,
    end: u64,
}

impl EngineFileReader {
    /// Opens `ino` for reading bytes `start..end`.
    pub fn open(
        engine: Arc<ScopeEngine>,
        ino: scopefs::engine::Ino,
        start: u64,
        end: u64,
    ) -> Result<Self, EngineError> {
        let opened = engine.open(ino, scopefs::engine::OpenFlags::default())?;
        Ok(EngineFileReader { engine, ino, fh: opened.fh, pos: start, end })
    }
}

impl std::io::Read for EngineFileReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.end || buf.is_empty() {
            return Ok(0);
        }
        let want = (self.end - self.pos).min(buf.len() as u64).min(1 << 20) as u32;
        let chunk = self.engine.read(self.ino, self.fh, self.pos, want).map_err(std::io::Error::other)?;
        buf[..chunk.len()].copy_from_slice(&chunk);
        self.pos += chunk.len() as u64;
        if chunk.is_empty() {
            self.end = self.pos;
        }
        Ok(chunk.len())
    }
}

impl Drop for EngineFileReader {
    fn drop(&mut self) {
        if let Err(e) = self.engine.release(self.ino, self.fh) {
            tracing::warn!(scope_id = %self.engine.scope_id(), error = %e, "releasing a read handle failed");
        }
    }
}

/// The result of a legacy import: the audit record and whether it was recorded by an earlier request.
#[derive(Debug, Clone)]
pub struct ImportOutcome {
    pub record: scopefs::registry::imports::ImportRecord,
    pub replayed: bool,
}

impl ScopeService {
    pub fn workspace_settings(&self) -> &WorkspaceSettings {
        &self.workspace
    }

    /// Copies one regular file from the read-only legacy workspace into the thread's scope, recorded
    /// under its idempotency key (seed 000 §11.1). Paths are already normalized. The same key again
    /// returns the recorded import without a second copy; a source that is missing, a symlink
    /// anywhere on its path, or not a regular file is `NotFound`, like a missing file.
    pub fn import_legacy(
        &self,
        thread: &ThreadId,
        req: scopefs::registry::imports::ImportRequest,
    ) -> Result<ImportOutcome, ServiceError> {
        use scopefs::registry::imports::{ImportBegin, ImportState};
        let root = self.workspace.legacy_root.clone().ok_or(ServiceError::Engine(EngineError::NotFound))?;
        let (rec, engine) = self.engine_for_thread(thread)?;
        let retry = match self.registry.begin_import(&self.deployment, &rec.scope_id, &req)? {
            ImportBegin::Existing(done) if done.state == ImportState::Completed => {
                return Ok(ImportOutcome { record: done, replayed: true });
            }
            // Interrupted by a crash, or racing a request with the same key: copying again is safe.
            ImportBegin::Existing(_) => true,
            ImportBegin::Reserved(_) => false,
        };
        match self.copy_legacy(&root, &engine, &req, retry) {
            Ok((size, sha256)) => {
                let record = self.registry.complete_import(
                    &self.deployment,
                    &rec.scope_id,
                    &req.idempotency_key,
                    size,
                    &sha256,
                )?;
                tracing::info!(scope_id = %rec.scope_id, target = %req.target_path, "legacy file imported");
                Ok(ImportOutcome { record, replayed: retry })
            }
            Err(e) => {
                if let Err(re) = self.registry.abandon_import(&self.deployment, &rec.scope_id, &req.idempotency_key) {
                    tracing::error!(scope_id = %rec.scope_id, error = %re, "abandoning a failed import failed");
                }
                Err(e)
            }
        }
    }

    /// The copy of one import; returns the size and SHA-256 of what the target holds.
    fn copy_legacy(
        &self,
        root: &std::path::Path,
        engine: &Arc<ScopeEngine>,
        req: &scopefs::registry::imports::ImportRequest,
        retry: bool,
    ) -> Result<(u64, String), ServiceError> {
        use scopefs::engine::WriteMode;
        let open_source = || {
            scopefs::vpath::open_regular_beneath(root, &req.source_path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => EngineError::NotFound,
                _ => EngineError::Io(e),
            })
        };
        let owner = api_owner(engine)?;
        if let Some((parent, _)) = req.target_path.rsplit_once('/') {
            engine.make_dirs(parent, owner)?;
        }
        let mode = if req.overwrite { WriteMode::Replace } else { WriteMode::CreateNew };
        let mut source = HashingReader::new(open_source()?);
        match engine.write_path(&req.target_path, &mut source, self.workspace.max_upload_bytes, mode, owner) {
            Ok(_) => Ok(source.finish().map_err(EngineError::Io)?),
            Err(EngineError::Exists) if retry => {
                // An interrupted earlier attempt may have linked the file already: done if it matches.
                let want = HashingReader::new(open_source()?).finish().map_err(EngineError::Io)?;
                let target = engine.resolve_path(&req.target_path)?;
                let have = HashingReader::new(EngineFileReader::open(engine.clone(), target.ino, 0, target.size)?)
                    .finish()
                    .map_err(EngineError::Io)?;
                if have == want {
                    Ok(want)
                } else {
                    Err(EngineError::Exists.into())
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}
