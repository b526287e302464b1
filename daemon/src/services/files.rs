//! `WorkspaceFiles`: file work in a thread's scope for the HTTP API — resolving a thread (or a
//! signed tool request's thread, with its single-use nonce) to its scope's open engine, legacy
//! imports, and the readers the file routes stream through.

use std::path::PathBuf;
use std::sync::Arc;

use scopefs::engine::{EngineError, ScopeEngine};
use scopefs::ids::ThreadId;
use scopefs::registry::{DeploymentRegistry, ScopeRecord};

use super::open_scopes::OpenScopes;
use super::peers::{self, View};
use super::{require_open_state, ServiceError};

/// File work of the HTTP API in threads' scopes (see the module docs).
pub struct WorkspaceFiles {
    registry: DeploymentRegistry,
    open: Arc<OpenScopes>,
    settings: WorkspaceSettings,
}

impl WorkspaceFiles {
    pub fn new(registry: DeploymentRegistry, open: Arc<OpenScopes>, settings: WorkspaceSettings) -> WorkspaceFiles {
        WorkspaceFiles { registry, open, settings }
    }

    pub fn settings(&self) -> &WorkspaceSettings {
        &self.settings
    }

    /// The scope of a primary thread and its open engine, for file work through the API.
    /// `ScopeNotFound` for an unknown thread or a scope that is not draft/active (deleted ones are gone),
    /// `NotMountable(Deleting)` while it is being deleted (the API answers 409).
    pub fn engine_for_thread(&self, thread: &ThreadId) -> Result<(ScopeRecord, Arc<ScopeEngine>), ServiceError> {
        let rec = self.registry.find_by_thread(thread)?.ok_or(ServiceError::ScopeNotFound)?;
        require_open_state(rec.state)?;
        let engine = self.open.engine(&rec)?;
        Ok((rec, engine))
    }

    /// `engine_for_thread`, or with `snapshot`, the read-only engine of that snapshot of the
    /// thread's scope (`ScopeNotFound` for a snapshot of another scope).
    pub fn engine_for_thread_at(
        &self,
        thread: &ThreadId,
        snapshot: Option<&str>,
    ) -> Result<(ScopeRecord, Arc<ScopeEngine>), ServiceError> {
        let (rec, live) = self.engine_for_thread(thread)?;
        let Some(id) = snapshot else { return Ok((rec, live)) };
        let snap =
            self.registry.snapshot(id)?.filter(|s| s.scope_id == rec.scope_id).ok_or(ServiceError::ScopeNotFound)?;
        let snap_rec = self.registry.get(&snap.snapshot_scope_id)?.ok_or(ServiceError::ScopeNotFound)?;
        let engine = self.open.engine(&snap_rec)?;
        engine.set_read_only(true);
        Ok((rec, engine))
    }

    /// Now by the registry's clock (Unix milliseconds), so windows and nonce expiry agree.
    pub fn now_ms(&self) -> i64 {
        self.registry.now_ms()
    }

    /// Records a verified request's nonce until `expires_at_ms`; `false` if it was used before.
    pub fn consume_nonce(&self, nonce: &str, expires_at_ms: i64) -> Result<bool, ServiceError> {
        Ok(self.registry.consume_nonce(nonce, expires_at_ms)?)
    }

    /// The scope `thread` acts in (its primary thread, or a live thread owner of it) with its open
    /// engine, for a request of `user`: a scope no user owns yet becomes `user`'s, one of another
    /// user is `ScopeNotFound` like an unknown thread (`services::peers`). `ScopeNotFound` also for
    /// a scope that is not draft/active, `NotMountable(Deleting)` while it is being deleted.
    pub fn tool_scope(
        &self,
        thread: &ThreadId,
        user: &str,
    ) -> Result<(scopefs::registry::nonces::ThreadBinding, Arc<ScopeEngine>), ServiceError> {
        let Some(binding) = self.registry.thread_binding(thread)? else {
            crate::metrics::note_run_without_scope();
            return Err(ServiceError::ScopeNotFound);
        };
        peers::bind_user(&self.registry, &binding.scope, user)?;
        require_open_state(binding.scope.state)?;
        let engine = self.open.engine(&binding.scope)?;
        Ok((binding, engine))
    }

    /// The scope and open engine of a `/threads/{id}` or `/__global__` view for `user` (rules in
    /// `services::peers`; the global store is created on first use).
    pub fn view_engine(&self, user: &str, view: &View) -> Result<(ScopeRecord, Arc<ScopeEngine>), ServiceError> {
        let rec = peers::resolve(&self.registry, &self.open, user, view)?;
        let engine = self.open.engine(&rec)?;
        Ok((rec, engine))
    }

    /// The legacy imports recorded in `thread`'s scope, oldest first (a page: after the import
    /// under `after`, at most `limit`); `after` naming no import is `NotFound`.
    pub fn imports(
        &self,
        thread: &ThreadId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<scopefs::registry::imports::ImportRecord>, ServiceError> {
        let (rec, _) = self.engine_for_thread(thread)?;
        Ok(self.registry.list_imports(&rec.scope_id, after, limit)?)
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
        let root = self.settings.legacy_root.clone().ok_or(ServiceError::Engine(EngineError::NotFound))?;
        let (rec, engine) = self.engine_for_thread(thread)?;
        let retry = match self.registry.begin_import(&rec.scope_id, &req)? {
            ImportBegin::Existing(done) if done.state == ImportState::Completed => {
                return Ok(ImportOutcome { record: done, replayed: true });
            }
            // Interrupted by a crash, or racing a request with the same key: copying again is safe.
            ImportBegin::Existing(_) => true,
            ImportBegin::Reserved(_) => false,
        };
        match self.copy_legacy(&root, &engine, &req, retry) {
            Ok((size, sha256)) => {
                let record = self.registry.complete_import(&rec.scope_id, &req.idempotency_key, size, &sha256)?;
                tracing::info!(scope_id = %rec.scope_id, target = %req.target_path, "legacy file imported");
                Ok(ImportOutcome { record, replayed: retry })
            }
            Err(e) => {
                if let Err(re) = self.registry.abandon_import(&rec.scope_id, &req.idempotency_key) {
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
        let mode = if req.overwrite { WriteMode::Replace } else { WriteMode::CreateNew };
        let mut source = HashingReader::new(open_source()?);
        match write_creating_parents(engine, &req.target_path, &mut source, self.settings.max_upload_bytes, mode) {
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

/// Writes a whole new version of `path` (see `ScopeEngine::write_path`) as the API owner, creating
/// missing parent directories first: how every HTTP and CLI upload writes a file.
pub fn write_creating_parents(
    engine: &ScopeEngine,
    path: &str,
    content: &mut dyn std::io::Read,
    max_len: u64,
    mode: scopefs::engine::WriteMode,
) -> Result<scopefs::engine::Attr, EngineError> {
    let owner = api_owner(engine)?;
    if let Some((parent, _)) = path.rsplit_once('/') {
        engine.make_dirs(parent, owner)?;
    }
    engine.write_path(path, content, max_len, mode, owner)
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
