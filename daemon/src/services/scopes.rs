//! `Scopes`: provisioning (a saga recorded in the registry), mounts, owners, runs and leases of
//! one deployment's scopes; startup recovery, shutdown and restart hand-over. The lifecycle
//! (delete, purge, maintenance) is in `lifecycle`.
//!
//! Provisioning: the scope row and an `applying` operation are written first, then the scope's
//! filesystem is opened and mounted, then the scope becomes `draft` and the operation `completed`
//! in one transaction. If opening or mounting fails the operation is marked `failed` (with an
//! error code) and the scope stays `provisioning`; it is finished by the next provision request for
//! the same operation or thread, by the mount route, or at the next daemon start (`recover`, which
//! drives every open operation of the registry, see `sagas`); one that still cannot be finished
//! after the draft TTL is compensated (undone, the scope `deleted`). In cutover mode `required`, a
//! thread without a scope is provisioned only once the migration report checks out (`sagas`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scopefs::engine::{Quota, Storage, Usage};
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::{
    DeploymentRegistry, Lease, NewOwner, OwnerRecord, OwnerType, OwnerUpdate, Reservation, RunRequestRecord,
    RunReserve, RunUpdate, ScopeRecord, ScopeState, BLOCKING_LEASES,
};

use super::lifecycle::LifecycleSettings;
use super::open_scopes::OpenScopes;
use super::sagas::CutoverGate;
use super::{failpoint, validate_operation_id, ComputeService, RecoveryReport, ScopeStatus, ServiceError};

/// Threads mounting scopes at startup: a mount mostly waits on the kernel, and different scopes
/// mount side by side (a restart with thousands of scopes is bounded by this, not by one core).
const STARTUP_MOUNT_THREADS: usize = 8;

/// Scopes of one deployment and their lifecycle (see the module docs).
pub struct Scopes {
    pub(super) registry: DeploymentRegistry,
    pub(super) open: Arc<OpenScopes>,
    /// A deleted scope's environments and processes are stopped through it.
    pub(super) compute: Arc<ComputeService>,
    /// Serializes provisioning completion (and compensation) so one scope is never finished twice at once.
    pub(super) provisioning: Mutex<()>,
    /// Serializes delete completion and purges (see `lifecycle`).
    pub(super) lifecycle_lock: Mutex<()>,
    pub(super) lifecycle: LifecycleSettings,
    pub(super) cutover: CutoverGate,
    /// With several nodes: this node (startup claims the scopes placed on it).
    pub(super) cluster: Option<Arc<super::cluster::Cluster>>,
    /// Online garbage collection (`[gc]`, `gc.rs`).
    pub(super) gc: scopefs::config::GcConfig,
    ready: AtomicBool,
}

/// Who asks for a provision, for the lease and cutover checks (`Scopes::provision_as`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProvisionBy<'a> {
    /// The `operation_id` of the caller's blocking lease (a cutover migrating its threads).
    pub lease_holder: Option<&'a str>,
    /// The caller creates a new conversation (seed 000 §5.3), not one that existed before the
    /// cutover: in cutover mode `required` only these get a scope without the cutover.
    pub new_thread: bool,
}

impl Scopes {
    pub fn new(
        registry: DeploymentRegistry,
        open: Arc<OpenScopes>,
        compute: Arc<ComputeService>,
        lifecycle: LifecycleSettings,
    ) -> Scopes {
        Scopes {
            registry,
            open,
            compute,
            provisioning: Mutex::new(()),
            lifecycle_lock: Mutex::new(()),
            lifecycle,
            cutover: CutoverGate::default(),
            cluster: None,
            gc: Default::default(),
            ready: AtomicBool::new(false),
        }
    }

    /// This daemon is one node of several (`[node]`).
    pub fn with_cluster(mut self, cluster: Option<Arc<super::cluster::Cluster>>) -> Scopes {
        self.cluster = cluster;
        self
    }

    /// Sets online garbage collection (config `[gc]`).
    pub fn with_gc(mut self, gc: scopefs::config::GcConfig) -> Scopes {
        self.gc = gc;
        self
    }

    /// Sets the cutover gate (config `[cutover]`; off by default).
    pub fn with_cutover(mut self, gate: CutoverGate) -> Scopes {
        self.cutover = gate;
        self
    }

    pub fn registry(&self) -> &DeploymentRegistry {
        &self.registry
    }

    pub fn open_scopes(&self) -> &Arc<OpenScopes> {
        &self.open
    }

    pub fn lifecycle_settings(&self) -> &LifecycleSettings {
        &self.lifecycle
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release)
    }

    /// Opens and mounts a `provisioning` scope, then records it as `draft` (see the module docs).
    pub(super) fn finish_provisioning(&self, rec: &ScopeRecord) -> Result<ScopeRecord, ServiceError> {
        // A copy (fork, snapshot) is finished by copying, never as an empty scope.
        if let Some(parent) = self.registry.forked_from(&rec.scope_id)? {
            return self.finish_fork(rec, &parent);
        }
        let _one_at_a_time = self.provisioning.lock();
        let mounted = self.open.mount(rec).and_then(|_| Ok(self.open.engine(rec)?.open_database()?));
        if mounted.is_ok() {
            failpoint("provision_after_mount");
        }
        match mounted {
            Ok(_) => Ok(self.registry.complete_provision(&rec.scope_id)?),
            Err(e) => {
                if let Err(re) = self.registry.fail_provision(&rec.scope_id, e.code()) {
                    tracing::error!(scope_id = %rec.scope_id, error = %re, "recording a failed provisioning failed");
                }
                Err(e)
            }
        }
    }

    /// Registers an owner (`reserved`) in a draft or active scope; `true` if it is new. `holder`:
    /// the `operation_id` of the caller's blocking lease, which does not refuse its own holder.
    pub fn create_owner(
        &self,
        scope: &ScopeId,
        new: &NewOwner,
        holder: Option<&str>,
    ) -> Result<(OwnerRecord, bool), ServiceError> {
        Ok(self.registry.create_owner_under_lease(scope, new, holder)?)
    }

    /// Attaches a resource to an owner and/or changes its state.
    pub fn update_owner(
        &self,
        scope: &ScopeId,
        owner: &str,
        update: &OwnerUpdate,
    ) -> Result<OwnerRecord, ServiceError> {
        Ok(self.registry.update_owner(scope, owner, update)?)
    }

    /// The owner of an external resource within `scope`.
    pub fn owner_by_resource(
        &self,
        scope: &ScopeId,
        resource: &str,
        owner_type: Option<OwnerType>,
    ) -> Result<OwnerRecord, ServiceError> {
        Ok(self.registry.owner_by_resource(scope, resource, owner_type)?)
    }

    /// Idempotent run reservation (a draft scope becomes active with its first one).
    pub fn reserve_run(&self, scope: &ScopeId, req: &RunReserve) -> Result<Reservation, ServiceError> {
        Ok(self.registry.reserve_run(scope, req)?)
    }

    /// Attaches `run_id` and/or changes a run request's state.
    pub fn update_run(&self, scope: &ScopeId, run: &str, update: &RunUpdate) -> Result<RunRequestRecord, ServiceError> {
        Ok(self.registry.update_run(scope, run, update)?)
    }

    /// Takes a deployment lease for `ttl`.
    pub fn acquire_lease(&self, name: &str, operation_id: &str, ttl: Duration) -> Result<Lease, ServiceError> {
        Ok(self.registry.acquire_lease(name, operation_id, duration_ms(ttl))?)
    }

    /// Extends a lease held by `operation_id`.
    pub fn renew_lease(&self, name: &str, operation_id: &str, ttl: Duration) -> Result<Lease, ServiceError> {
        Ok(self.registry.renew_lease(name, operation_id, duration_ms(ttl))?)
    }

    /// Releases a lease held by `operation_id`; `false` if it was not held at all.
    pub fn release_lease(&self, name: &str, operation_id: &str) -> Result<bool, ServiceError> {
        Ok(self.registry.release_lease(name, operation_id)?)
    }

    /// Idempotent provisioning (operation id and thread) of a new conversation; returns the scope and
    /// whether it is new. `MigrationRequired` for a thread without a scope while the cutover gate is
    /// closed.
    pub fn provision(&self, operation_id: &str, thread: &ThreadId) -> Result<(ScopeRecord, bool), ServiceError> {
        self.provision_as(operation_id, thread, ProvisionBy { new_thread: true, ..ProvisionBy::default() })
    }

    /// `provision` as `by` says: by the holder of a blocking lease (`lease_holder`: its
    /// `operation_id`), which that lease does not refuse (the holder of `workspace-cutover` is the
    /// migration itself, so the cutover gate does not wait for its report either: seed 000 §11.1,
    /// the cutover creates the scopes of the threads it migrates); for a new conversation or for a
    /// thread that existed before (`new_thread`: the `required` gate refuses the latter).
    pub fn provision_as(
        &self,
        operation_id: &str,
        thread: &ThreadId,
        by: ProvisionBy<'_>,
    ) -> Result<(ScopeRecord, bool), ServiceError> {
        validate_operation_id(operation_id)?;
        let holder = by.lease_holder;
        let cutover = match holder {
            Some(h) => self.registry.lease(BLOCKING_LEASES[0])?.is_some_and(|l| l.operation_id == h),
            None => false,
        };
        if !cutover {
            self.check_cutover_gate(thread, by.new_thread)?;
        }
        let p = self.registry.provision_under_lease(operation_id, thread, None, holder)?;
        failpoint("provision_after_record");
        let rec = if p.scope.state == ScopeState::Provisioning { self.finish_provisioning(&p.scope)? } else { p.scope };
        if p.created {
            tracing::info!(scope_id = %rec.scope_id, operation_id, "scope provisioned");
        }
        Ok((rec, p.created))
    }

    /// `provision`, then the scope belongs to `user` when one is named (a scope of another user
    /// is `ScopeNotFound`, as for a tool request: `services::peers`).
    pub fn provision_for_user(
        &self,
        operation_id: &str,
        thread: &ThreadId,
        user: Option<&str>,
        by: ProvisionBy<'_>,
    ) -> Result<(ScopeRecord, bool), ServiceError> {
        let (rec, created) = self.provision_as(operation_id, thread, by)?;
        match user {
            Some(u) => {
                super::peers::bind_user(&self.registry, &rec, u)?;
                let rec = self.registry.get(&rec.scope_id)?.ok_or(ServiceError::ScopeNotFound)?;
                Ok((rec, created))
            }
            None => Ok((rec, created)),
        }
    }

    /// The scope bound to `thread` with its usage, if any.
    pub fn by_thread(&self, thread: &ThreadId) -> Result<Option<ScopeStatus>, ServiceError> {
        let Some(record) = self.registry.find_by_thread(thread)? else {
            return Ok(None);
        };
        let usage = match record.state {
            ScopeState::Draft | ScopeState::Active | ScopeState::Deleting => self.open.engine(&record)?.usage()?,
            ScopeState::Provisioning | ScopeState::Deleted => Usage::default(),
        };
        Ok(Some(ScopeStatus { record, usage }))
    }

    /// Mounts the scope if it is not mounted yet (finishing its provisioning if needed); returns the real
    /// mount, the path a container binds (the host view is `Mounter::view`).
    pub fn mount(&self, scope: &ScopeId) -> Result<(ScopeRecord, PathBuf), ServiceError> {
        let mut rec = self.registry.get(scope)?.ok_or(ServiceError::ScopeNotFound)?;
        if rec.state == ScopeState::Provisioning {
            rec = self.finish_provisioning(&rec)?;
        }
        if !rec.state.is_mountable() {
            return Err(ServiceError::NotMountable(rec.state));
        }
        let path = self.open.mount(&rec)?;
        Ok((rec, path))
    }

    /// Startup: finishes or compensates every open operation (`recover_operations`), finishes any
    /// scope still left in `provisioning` without one, and remounts every draft and active scope.
    /// A scope that cannot be mounted is logged and skipped (the mount route retries it).
    pub fn recover(&self) -> Result<RecoveryReport, ServiceError> {
        let mut report = RecoveryReport::default();
        let ops = self.recover_operations()?;
        if ops != Default::default() {
            tracing::info!(?ops, "open operations recovered");
        }
        if let Some(cluster) = &self.cluster {
            // The scopes placed on this node (restored when the local copy is not theirs).
            let (claimed, failed) = cluster.start()?;
            report.mounted += claimed;
            report.failed += failed;
        }
        let snapshots = self.registry.snapshot_scopes()?;
        let (provisioning, mountable): (Vec<_>, Vec<_>) = self
            .registry
            .list()?
            .into_iter()
            .filter(|rec| rec.state == ScopeState::Provisioning || rec.state.is_mountable())
            .filter(|rec| self.placed_nowhere(&rec.scope_id))
            // Snapshots are read through the API, never mounted.
            .filter(|rec| !snapshots.contains(&rec.scope_id))
            .partition(|rec| rec.state == ScopeState::Provisioning);
        let mut results: Vec<_> = provisioning
            .iter()
            .map(|rec| (rec.scope_id.clone(), rec.state, self.finish_provisioning(rec).map(|_| ())))
            .collect();
        let states: std::collections::HashMap<_, _> = mountable.iter().map(|r| (r.scope_id.clone(), r.state)).collect();
        for (scope, result) in self.open.mount_all(&mountable, STARTUP_MOUNT_THREADS) {
            let state = states[&scope];
            results.push((scope, state, result.map(|_| ())));
        }
        for (scope, state, result) in results {
            match result {
                Ok(()) => report.mounted += 1,
                Err(e) => {
                    tracing::error!(scope_id = %scope, %state, error = %e, "scope could not be mounted at startup");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// Whether no node serves `scope` (always, for a daemon alone): startup finishes and mounts it.
    fn placed_nowhere(&self, scope: &ScopeId) -> bool {
        self.cluster.is_none() || matches!(self.registry.placement(scope), Ok(None))
    }

    /// Shutdown: ends (and bills) every live environment, so no container is left on a dead mount;
    /// waits (bounded by `timeout` overall) for every scope's uploads — what remains stays
    /// journaled and is uploaded after the next start — then unmounts every scope.
    pub fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let ended = self.compute.end_all_environments();
        if ended > 0 {
            tracing::info!(environments = ended, "environments ended by the stop");
        }
        for engine in &self.open.engines() {
            let left = deadline.saturating_duration_since(Instant::now());
            if !engine.wait_uploads(left) {
                tracing::warn!(
                    scope_id = %engine.scope_id(),
                    pending = engine.pending_uploads(),
                    "uploads still pending at shutdown; they stay journaled"
                );
            }
        }
        self.open.close_all();
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
        let engines = self.open.engines();
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
            // The process ends without closing its databases (the mounts must stay): their batches
            // commit now, so the next process has little of their redo logs to replay.
            if let Err(e) = engine.hand_over_metadata() {
                tracing::warn!(scope_id = %engine.scope_id(), error = %e, "committing metadata at restart failed; its redo log keeps it");
            }
        }
    }
}

/// Creates a scope and its filesystem without mounting it (CLI `scope create`; needs no mount
/// manager, so it never touches the mounts of a running daemon).
pub fn create_unmounted(
    default_quota: Quota,
    registry: &DeploymentRegistry,
    storage: &Arc<Storage>,
    thread: &ThreadId,
) -> Result<ScopeRecord, ServiceError> {
    let rec = registry.create_scope(thread, None)?;
    storage.open_scope(&rec.scope_id, rec.quota_or(default_quota))?.open_database()?;
    Ok(registry.complete_provision(&rec.scope_id)?)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
