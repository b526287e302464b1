//! Scope lifecycle of the daemon (SPEC §10): state changes requested by the WebUI, delete with a bounded drain,
//! draft expiry, purge after retention and the maintenance pass (`Scopes` methods).
//!
//! Every step is recorded in the registry first (see `scopefs::registry`'s
//! lifecycle module) and is idempotent, so a crash at any point is finished by
//! the next maintenance pass, which also runs once at startup before readiness:
//! every open operation is finished or compensated (`sagas`), so a `deleting`
//! scope is retried and a deleted one past retention is purged (again).
//!
//! The pass shares the deployment's `maintenance` lease with operators (seed 000
//! §11.1): when it has registry work to do it takes the lease (which refuses new
//! drafts, runs and owners with 503 while held), renews it before each scope it
//! expires or purges and releases it after; if an operator holds it, or the cutover
//! holds `workspace-cutover`, the pass is skipped and counted.
//! Every pass also compares the local scope directories with the registry
//! (orphan directories, missing local metadata) for `/metrics`; nothing is deleted. And every
//! pass, without the lease, stops the environments past their admitted runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use scopefs::config::Config;
use scopefs::engine::EngineError;
use scopefs::ids::ScopeId;
use scopefs::registry::{
    DeleteStep, OperationRecord, RegistryError, ScopeRecord, ScopeState, CRON_KIND, PROVISION_KIND, RUN_KIND,
};

use super::{failpoint, Scopes, ServiceError};

/// How long an open provisioning must have gone untouched before a maintenance pass treats it as
/// left over (a request finishes its own in well under this).
const OPERATION_LEFT_OVER_AFTER: Duration = Duration::from_secs(120);

/// The deployment lease the maintenance pass shares with operators.
pub const MAINTENANCE_LEASE: &str = "maintenance";
/// The cutover's lease: while it is held, a maintenance pass does no registry work.
const CUTOVER_LEASE: &str = "workspace-cutover";
/// The daemon's own holder id of the `maintenance` lease: a restarted daemon takes back a lease
/// its previous process left behind instead of waiting for it to expire.
pub const MAINTENANCE_HOLDER: &str = "scopefs-daemon-maintenance";
/// How long one grant (or renewal) of the lease lasts; the pass renews it between phases.
const MAINTENANCE_LEASE_TTL: Duration = Duration::from_secs(120);

/// Bound on waiting for a deleted scope's queued uploads before it is unmounted.
const UPLOAD_WAIT_AT_DELETE: Duration = Duration::from_secs(10);

/// Timing of the lifecycle, from the configuration (`draft_ttl_hours`, `trash_retention_days`,
/// `delete_drain_secs`, `maintenance_interval_secs`; `SCOPEFS_*` variables override them there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifecycleSettings {
    pub draft_ttl: Duration,
    pub trash_retention: Duration,
    /// How long a delete waits for owners to settle before it records why it cannot finish.
    pub drain_timeout: Duration,
    pub drain_poll: Duration,
    pub maintenance_interval: Duration,
}

impl LifecycleSettings {
    pub fn from_config(cfg: &Config) -> Self {
        LifecycleSettings {
            draft_ttl: Duration::from_secs(cfg.draft_ttl_hours.saturating_mul(3600)),
            trash_retention: Duration::from_secs(cfg.trash_retention_days.saturating_mul(86_400)),
            drain_timeout: Duration::from_secs(cfg.delete_drain_secs),
            drain_poll: Duration::from_millis(250),
            maintenance_interval: Duration::from_secs(cfg.maintenance_interval_secs.max(1)),
        }
    }
}

/// What one maintenance pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub deleted: usize,
    pub still_deleting: usize,
    pub drafts_expired: usize,
    pub purged: usize,
    /// Open operations compensated (see `sagas`).
    pub compensated: usize,
    pub failed: usize,
    /// Local scope directories (metadata or staging) with no registry row (left in place).
    pub orphan_directories: usize,
    /// Draft, active or deleting scopes whose local metadata directory is missing.
    pub metadata_mismatches: usize,
    /// Live environments past their admitted runtime, stopped by the pass.
    pub environments_overdue: usize,
    /// The `maintenance` lease was held by someone else: no registry work was done.
    pub skipped: bool,
}

impl MaintenanceReport {
    /// Whether the pass changed nothing and was not skipped (the local scan's gauges aside).
    pub fn is_quiet(&self) -> bool {
        MaintenanceReport { orphan_directories: 0, metadata_mismatches: 0, ..*self } == MaintenanceReport::default()
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Scopes {
    /// `PATCH /internal/workspace-scopes/{scopeId}`: revision CAS to `active` (explicit activation of a
    /// draft) or `deleting` (starts the delete; see `start_delete`). Other targets are refused.
    pub fn request_state(
        self: &Arc<Self>,
        scope: &ScopeId,
        expected_revision: u64,
        to: ScopeState,
    ) -> Result<ScopeRecord, ServiceError> {
        match to {
            ScopeState::Active => Ok(self.registry.transition(scope, expected_revision, to)?),
            ScopeState::Deleting => self.start_delete(scope, expected_revision),
            _ => Err(ServiceError::StateNotRequestable),
        }
    }

    /// Moves the scope to `deleting` (CAS), freezes its files (read-only engine: FUSE answers EROFS,
    /// the file API 409), stops what the daemon runs in it, and tries to finish at once; if owners
    /// are still live a background waiter retries until `drain_timeout`, then leaves the reason.
    pub fn start_delete(
        self: &Arc<Self>,
        scope: &ScopeId,
        expected_revision: u64,
    ) -> Result<ScopeRecord, ServiceError> {
        let rec = self.registry.begin_delete(scope, expected_revision)?;
        tracing::info!(scope_id = %scope, "scope deleting");
        failpoint("delete_after_mark");
        self.freeze(scope);
        match self.try_finish_delete(scope)? {
            DeleteStep::Deleted(rec) => Ok(rec),
            DeleteStep::Blocked(_) => {
                let svc = self.clone();
                let scope = scope.clone();
                std::thread::Builder::new()
                    .name("scopefs-drain".into())
                    .spawn(move || svc.wait_for_drain(&scope))
                    .map_err(|e| ServiceError::Registry(RegistryError::Io(e)))?;
                Ok(self.registry.get(&rec.scope_id)?.unwrap_or(rec))
            }
        }
    }

    /// Blocks writes and stops the daemon's own work in a deleting scope.
    pub(super) fn freeze(&self, scope: &ScopeId) {
        if let Some(engine) = self.open.get(scope) {
            engine.set_read_only(true);
        }
        self.stop_daemon_work(scope);
    }

    /// Stops every environment and process the daemon itself runs in `scope` and marks their
    /// owners settled (see `executor`); a failure is logged and retried by the maintenance pass.
    fn stop_daemon_work(&self, scope: &ScopeId) {
        if let Err(e) = self.compute.stop_scope_compute(scope) {
            tracing::error!(scope_id = %scope, error = %e, "stopping the scope's environments failed; retried by maintenance");
        }
    }

    /// Waits (bounded by `drain_timeout`) for the scope's owners to settle, finishing the delete as
    /// soon as they have; the reason stays recorded when they have not.
    fn wait_for_drain(&self, scope: &ScopeId) {
        let deadline = Instant::now() + self.lifecycle.drain_timeout;
        loop {
            std::thread::sleep(self.lifecycle.drain_poll);
            match self.try_finish_delete(scope) {
                Ok(DeleteStep::Deleted(_)) => return,
                Ok(DeleteStep::Blocked(owners)) if Instant::now() >= deadline => {
                    tracing::warn!(scope_id = %scope, blocking_owners = owners.len(), "delete drain timed out; scope stays deleting");
                    return;
                }
                Ok(DeleteStep::Blocked(_)) => {}
                Err(e) => {
                    tracing::error!(scope_id = %scope, error = %e, "finishing a delete failed; maintenance retries it");
                    return;
                }
            }
        }
    }

    /// One attempt to finish a delete: if owners other than the primary thread are unsettled, records
    /// them on the scope (`delete_blocked_by`) and returns `Blocked`; otherwise waits (bounded) for
    /// queued uploads, unmounts, closes the engine and marks the scope `deleted`.
    pub fn try_finish_delete(&self, scope: &ScopeId) -> Result<DeleteStep, ServiceError> {
        let _one_at_a_time = self.lifecycle_lock.lock();
        let Some(rec) = self.registry.get(scope)? else {
            return Err(ServiceError::ScopeNotFound);
        };
        match rec.state {
            ScopeState::Deleted => return Ok(DeleteStep::Deleted(rec)),
            ScopeState::Deleting => {}
            other => return Err(ServiceError::Registry(RegistryError::ScopeUnavailable(other))),
        }
        let blockers = self.registry.delete_blockers(scope)?;
        if !blockers.is_empty() {
            if rec.delete_blocked_by != blockers {
                self.registry.record_delete_blocked(scope, &blockers)?;
            }
            return Ok(DeleteStep::Blocked(blockers));
        }
        let engine = self.open.get(scope);
        if let Some(engine) = &engine {
            engine.set_read_only(true);
            if !engine.wait_uploads(UPLOAD_WAIT_AT_DELETE) {
                tracing::warn!(scope_id = %scope, "uploads still pending at delete; the purge collects them");
            }
        }
        self.open.close(scope)?;
        failpoint("delete_after_unmount");
        let step = self.registry.complete_delete(scope)?;
        if matches!(step, DeleteStep::Deleted(_)) {
            tracing::info!(scope_id = %scope, "scope deleted");
        }
        Ok(step)
    }

    /// Deletes every object under the scope's prefix and its local metadata, staging and cache,
    /// then records it purged. Idempotent; recorded as the operation `purge-<scope_id>`.
    pub(super) fn purge(&self, rec: &ScopeRecord) -> Result<(), ServiceError> {
        let _one_at_a_time = self.lifecycle_lock.lock();
        let scope = &rec.scope_id;
        self.registry.begin_purge(scope)?;
        self.open.close(scope)?;
        self.open.storage().purge_objects(scope)?;
        failpoint("purge_after_objects");
        self.open.remove_local(scope)?;
        self.registry.complete_purge(scope)?;
        // Blocks of other scopes it shared (a fork, a snapshot): let go; the last holder of a
        // purged scope's block deletes it.
        for (home, sha) in self.registry.holds_of(scope)? {
            if self.registry.release_block(scope.as_str(), &home, &sha)? {
                self.open.storage().delete_block_object(&home, &sha)?;
            }
        }
        tracing::info!(scope_id = %scope, "scope purged");
        Ok(())
    }

    /// One maintenance pass (see the module docs): compares local directories with the registry,
    /// then, if there is registry work, takes the `maintenance` lease, finishes or compensates open
    /// operations, expires drafts and purges deleted scopes past the retention, and releases it.
    pub fn maintenance_pass(&self) -> Result<MaintenanceReport, ServiceError> {
        let mut report = MaintenanceReport::default();
        self.scan_local(&mut report)?;
        // This host's containers: no lease needed, and an environment past its runtime never waits.
        match self.compute.end_overdue_environments() {
            Ok(n) => report.environments_overdue = n,
            Err(e) => tracing::error!(error = %e, "maintenance: ending overdue environments failed"),
        }
        if !self.maintenance_due()? {
            return Ok(report);
        }
        // A cutover in progress owns the deployment's lifecycle: nothing expires, is deleted or
        // purged under it (seed 000 §11.1).
        if self.registry.lease(CUTOVER_LEASE)?.is_some() {
            tracing::info!("the cutover lease is held; maintenance pass skipped");
            crate::metrics::note_maintenance_skipped();
            report.skipped = true;
            return Ok(report);
        }
        let ttl = ms(MAINTENANCE_LEASE_TTL);
        match self.registry.acquire_lease(MAINTENANCE_LEASE, MAINTENANCE_HOLDER, ttl) {
            Ok(_) => {}
            Err(RegistryError::LeaseHeld) => {
                tracing::info!("maintenance lease is held by an operator; pass skipped");
                crate::metrics::note_maintenance_skipped();
                report.skipped = true;
                return Ok(report);
            }
            Err(e) => return Err(e.into()),
        }
        let result = self.maintenance_work(&mut report);
        if let Err(e) = self.registry.release_lease(MAINTENANCE_LEASE, MAINTENANCE_HOLDER) {
            tracing::warn!(error = %e, "releasing the maintenance lease failed; it expires");
        }
        result.map(|()| report)
    }

    /// Whether the registry has anything for a pass to do (so the lease is only taken then).
    fn maintenance_due(&self) -> Result<bool, ServiceError> {
        let cutoff = self.left_over_cutoff();
        let left_over = |op: &OperationRecord| op.kind != PROVISION_KIND || op.updated_at < cutoff;
        for op in self.registry.open_operations()?.into_iter().filter(left_over) {
            let Some(scope) = &op.scope_id else { continue };
            let waiting = (op.kind == RUN_KIND || op.kind == CRON_KIND)
                && self.registry.get(scope)?.is_some_and(|r| r.state.is_mountable());
            if !waiting {
                return Ok(true);
            }
        }
        let now = self.registry.now_ms();
        Ok(!self.registry.expired_drafts(now.saturating_sub(ms(self.lifecycle.draft_ttl)))?.is_empty()
            || !self.registry.purge_due(now.saturating_sub(ms(self.lifecycle.trash_retention)))?.is_empty())
    }

    /// A provisioning updated after this (registry clock) may be in the hands of its request right
    /// now: a pass neither drives it nor takes the lease for it, so normal traffic (provisioning
    /// in flight) never makes the pass refuse other requests with 503.
    fn left_over_cutoff(&self) -> i64 {
        self.registry.now_ms().saturating_sub(ms(OPERATION_LEFT_OVER_AFTER))
    }

    /// Renews the lease between phases; a lost lease stops the pass (seed 000 §11.1).
    fn renew_maintenance_lease(&self) -> Result<(), ServiceError> {
        Ok(self.registry.renew_lease(MAINTENANCE_LEASE, MAINTENANCE_HOLDER, ms(MAINTENANCE_LEASE_TTL)).map(|_| ())?)
    }

    /// The registry work of a pass, under the lease.
    fn maintenance_work(&self, report: &mut MaintenanceReport) -> Result<(), ServiceError> {
        let ops = self.recover_operations_untouched_since(Some(self.left_over_cutoff()))?;
        report.deleted += ops.deleted;
        report.still_deleting += ops.still_deleting;
        report.compensated += ops.compensated;
        report.failed += ops.failed;
        self.renew_maintenance_lease()?;
        let now = self.registry.now_ms();
        let draft_cutoff = now.saturating_sub(ms(self.lifecycle.draft_ttl));
        for rec in self.registry.expired_drafts(draft_cutoff)? {
            self.renew_maintenance_lease()?;
            match self.registry.begin_draft_expiry(&rec.scope_id, draft_cutoff) {
                Ok(Some(_)) => {
                    report.drafts_expired += 1;
                    tracing::info!(scope_id = %rec.scope_id, "draft expired; deleting");
                    self.freeze(&rec.scope_id);
                    match self.try_finish_delete(&rec.scope_id) {
                        Ok(DeleteStep::Deleted(_)) => report.deleted += 1,
                        Ok(DeleteStep::Blocked(_)) => report.still_deleting += 1,
                        Err(e) => {
                            tracing::error!(scope_id = %rec.scope_id, error = %e, "maintenance: delete step failed");
                            report.failed += 1;
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(scope_id = %rec.scope_id, error = %e, "maintenance: draft expiry failed");
                    report.failed += 1;
                }
            }
        }
        let purge_cutoff = now.saturating_sub(ms(self.lifecycle.trash_retention));
        for rec in self.registry.purge_due(purge_cutoff)? {
            // Renewed before each scope: a pass holds its lease while it works, however many.
            self.renew_maintenance_lease()?;
            match self.purge(&rec) {
                Ok(()) => report.purged += 1,
                Err(e) => {
                    tracing::error!(scope_id = %rec.scope_id, error = %e, "maintenance: purge failed");
                    report.failed += 1;
                }
            }
        }
        Ok(())
    }

    /// Compares the local scope directories with the registry: directories of no registry scope
    /// (orphans, left in place) and open scopes without local metadata (mismatches); both go to
    /// `/metrics`.
    fn scan_local(&self, report: &mut MaintenanceReport) -> Result<(), ServiceError> {
        let scopes = self.registry.list()?;
        let known: std::collections::HashSet<&str> = scopes.iter().map(|r| r.scope_id.as_str()).collect();
        let storage = self.open.storage();
        let dirs = storage.local_scope_dirs().map_err(EngineError::from)?;
        report.orphan_directories = dirs.iter().filter(|d| !known.contains(d.as_str())).count();
        let mismatched: Vec<String> = scopes
            .iter()
            .filter(|r| matches!(r.state, ScopeState::Draft | ScopeState::Active | ScopeState::Deleting))
            // Several nodes: only the scopes this node serves have metadata here.
            .filter(|r| self.cluster.as_ref().is_none_or(|c| c.serves_now(&r.scope_id)))
            .filter(|r| !storage.has_local_metadata(&r.scope_id))
            .map(|r| r.scope_id.to_string())
            .collect();
        report.metadata_mismatches = mismatched.len();
        if !mismatched.is_empty() {
            tracing::warn!(scopes = mismatched.len(), "scopes without local metadata found by maintenance");
        }
        crate::metrics::set_orphan_directories(report.orphan_directories);
        crate::metrics::note_metadata_mismatches(&mismatched);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_config() {
        let cfg = Config {
            draft_ttl_hours: 2,
            trash_retention_days: 3,
            delete_drain_secs: 5,
            maintenance_interval_secs: 7,
            ..Config::default()
        };
        let s = LifecycleSettings::from_config(&cfg);
        assert_eq!(s.draft_ttl, Duration::from_secs(7200));
        assert_eq!(s.trash_retention, Duration::from_secs(3 * 86_400));
        assert_eq!(s.drain_timeout, Duration::from_secs(5));
        assert_eq!(s.maintenance_interval, Duration::from_secs(7));
        let env = vec![("SCOPEFS_DELETE_DRAIN_SECS".to_string(), "2".to_string())];
        let cfg = Config::load(None, env).unwrap();
        assert_eq!(LifecycleSettings::from_config(&cfg).drain_timeout, Duration::from_secs(2));
        let bad = vec![("SCOPEFS_DELETE_DRAIN_SECS".to_string(), "soon".to_string())];
        assert!(Config::load(None, bad).is_err());
    }
}
