//! Scope lifecycle of the daemon (SPEC §10): state changes requested by the WebUI, delete with a bounded drain,
//! draft expiry, purge after retention, the maintenance pass, and test-only failpoints.
//!
//! Every step is recorded in the registry first (see `scopefs::registry`'s
//! lifecycle module) and is idempotent, so a crash at any point is finished by
//! the next maintenance pass, which also runs once at startup before readiness:
//! a `deleting` scope is retried, a deleted one past retention is purged (again).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use scopefs::config::Config;
use scopefs::ids::ScopeId;
use scopefs::registry::{DeleteStep, RegistryError, ScopeRecord, ScopeState};
use scopefs::store::scope_prefix;

use crate::service::{ScopeService, ServiceError};

/// Variable naming a failpoint at which the daemon aborts (tests of crash recovery only).
pub const FAILPOINT_ENV: &str = "SCOPEFS_FAILPOINT";

/// Bound on waiting for a deleted scope's queued uploads before it is unmounted.
const UPLOAD_WAIT_AT_DELETE: Duration = Duration::from_secs(10);

/// Whether the test hooks (`SCOPEFS_FAILPOINT`, `SCOPEFS_TEST_CLOCK_FILE`) are honoured: only in
/// debug builds, which the integration tests use; a release build (the package) ignores them, so
/// whoever can set the daemon's environment or write a clock file cannot abort it or move its
/// signature window (review L11).
pub const fn test_hooks_enabled() -> bool {
    cfg!(debug_assertions)
}

/// Aborts the process (like `kill -9`: no cleanup; with its supervisor, if any) when `SCOPEFS_FAILPOINT` equals `name`.
/// Without that variable, or in a release build, this does nothing.
pub fn failpoint(name: &str) {
    if !test_hooks_enabled() {
        return;
    }
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var(FAILPOINT_ENV).ok().filter(|v| !v.is_empty()));
    if armed.as_deref() == Some(name) {
        eprintln!("scopefs: failpoint {name} reached; aborting");
        if crate::notify::supervised() {
            // The whole service crashes, as the tests of crash recovery mean: the supervisor too
            // (a worker crash alone is survived, see `supervisor`; its kept mounts end with it).
            // SAFETY: kill(2) of our parent, the supervisor that started this worker.
            unsafe { libc::kill(libc::getppid(), libc::SIGKILL) };
        }
        std::process::abort();
    }
}

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
    pub failed: usize,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl ScopeService {
    /// `PATCH /internal/workspace-scopes/{scopeId}`: revision CAS to `active` (explicit activation of a
    /// draft) or `deleting` (starts the delete; see `start_delete`). Other targets are refused.
    pub fn request_state(
        self: &Arc<Self>,
        scope: &ScopeId,
        expected_revision: u64,
        to: ScopeState,
    ) -> Result<ScopeRecord, ServiceError> {
        match to {
            ScopeState::Active => Ok(self.registry.transition(&self.deployment, scope, expected_revision, to)?),
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
        let rec = self.registry.begin_delete(&self.deployment, scope, expected_revision)?;
        tracing::info!(scope_id = %scope, "scope deleting");
        failpoint("delete_after_mark");
        self.freeze(scope)?;
        match self.try_finish_delete(scope)? {
            DeleteStep::Deleted(rec) => Ok(rec),
            DeleteStep::Blocked(_) => {
                let svc = self.clone();
                let scope = scope.clone();
                std::thread::Builder::new()
                    .name("scopefs-drain".into())
                    .spawn(move || svc.wait_for_drain(&scope))
                    .map_err(|e| ServiceError::Registry(RegistryError::Io(e)))?;
                Ok(self.registry.get(&self.deployment, &rec.scope_id)?.unwrap_or(rec))
            }
        }
    }

    /// Blocks writes and stops the daemon's own work in a deleting scope.
    fn freeze(&self, scope: &ScopeId) -> Result<(), ServiceError> {
        if let Some(engine) = self.engines.lock().get(scope) {
            engine.set_read_only(true);
        }
        self.stop_daemon_work(scope)
    }

    /// Stops every environment and process the daemon itself runs in `scope` and marks their
    /// owners settled (see `executor`); a failure is logged and retried by the maintenance pass.
    fn stop_daemon_work(&self, scope: &ScopeId) -> Result<(), ServiceError> {
        if let Err(e) = self.stop_scope_compute(scope) {
            tracing::error!(scope_id = %scope, error = %e, "stopping the scope's environments failed; retried by maintenance");
        }
        Ok(())
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
        let Some(rec) = self.registry.get(&self.deployment, scope)? else {
            return Err(ServiceError::ScopeNotFound);
        };
        match rec.state {
            ScopeState::Deleted => return Ok(DeleteStep::Deleted(rec)),
            ScopeState::Deleting => {}
            other => return Err(ServiceError::Registry(RegistryError::ScopeUnavailable(other))),
        }
        let blockers = self.registry.delete_blockers(&self.deployment, scope)?;
        if !blockers.is_empty() {
            if rec.delete_blocked_by != blockers {
                self.registry.record_delete_blocked(&self.deployment, scope, &blockers)?;
            }
            return Ok(DeleteStep::Blocked(blockers));
        }
        let engine = self.engines.lock().get(scope).cloned();
        if let Some(engine) = &engine {
            engine.set_read_only(true);
            if !engine.wait_uploads(UPLOAD_WAIT_AT_DELETE) {
                tracing::warn!(scope_id = %scope, "uploads still pending at delete; the purge collects them");
            }
        }
        self.mounts.unmount(scope)?;
        self.engines.lock().remove(scope);
        failpoint("delete_after_unmount");
        let step = self.registry.complete_delete(&self.deployment, scope)?;
        if matches!(step, DeleteStep::Deleted(_)) {
            tracing::info!(scope_id = %scope, "scope deleted");
        }
        Ok(step)
    }

    /// Deletes every object under the scope's prefix and its local metadata, staging and cache,
    /// then records it purged. Idempotent; recorded as the operation `purge-<scope_id>`.
    fn purge(&self, rec: &ScopeRecord) -> Result<(), ServiceError> {
        let _one_at_a_time = self.lifecycle_lock.lock();
        let scope = &rec.scope_id;
        self.registry.begin_purge(&self.deployment, scope)?;
        self.mounts.unmount(scope)?;
        self.engines.lock().remove(scope);
        let store = self.storage.store().clone();
        let prefix = scope_prefix(scope.as_str());
        self.rt
            .block_on(async {
                let objects = store.list(&prefix).await?;
                for obj in objects {
                    store.delete(&obj.key).await?;
                }
                Ok::<_, scopefs::store::StoreError>(())
            })
            .map_err(|e| ServiceError::Engine(e.into()))?;
        failpoint("purge_after_objects");
        self.storage.remove_scope_local(scope)?;
        self.registry.complete_purge(&self.deployment, scope)?;
        tracing::info!(scope_id = %scope, "scope purged");
        Ok(())
    }

    /// One maintenance pass: retries deletes left `deleting`, deletes expired drafts, purges deleted
    /// scopes past the retention. Errors are logged per scope and counted.
    pub fn maintenance_pass(&self) -> Result<MaintenanceReport, ServiceError> {
        let mut report = MaintenanceReport::default();
        let count = |report: &mut MaintenanceReport, scope: &ScopeId, r: Result<DeleteStep, ServiceError>| match r {
            Ok(DeleteStep::Deleted(_)) => report.deleted += 1,
            Ok(DeleteStep::Blocked(_)) => report.still_deleting += 1,
            Err(e) => {
                tracing::error!(scope_id = %scope, error = %e, "maintenance: delete step failed");
                report.failed += 1;
            }
        };
        for rec in self.registry.list(&self.deployment)?.into_iter().filter(|r| r.state == ScopeState::Deleting) {
            let r = self.freeze(&rec.scope_id).and_then(|_| self.try_finish_delete(&rec.scope_id));
            count(&mut report, &rec.scope_id, r);
        }
        let now = self.registry.now_ms();
        let draft_cutoff = now.saturating_sub(ms(self.lifecycle.draft_ttl));
        for rec in self.registry.expired_drafts(&self.deployment, draft_cutoff)? {
            match self.registry.begin_draft_expiry(&self.deployment, &rec.scope_id, draft_cutoff) {
                Ok(Some(_)) => {
                    report.drafts_expired += 1;
                    tracing::info!(scope_id = %rec.scope_id, "draft expired; deleting");
                    let r = self.freeze(&rec.scope_id).and_then(|_| self.try_finish_delete(&rec.scope_id));
                    count(&mut report, &rec.scope_id, r);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(scope_id = %rec.scope_id, error = %e, "maintenance: draft expiry failed");
                    report.failed += 1;
                }
            }
        }
        let purge_cutoff = now.saturating_sub(ms(self.lifecycle.trash_retention));
        for rec in self.registry.purge_due(&self.deployment, purge_cutoff)? {
            match self.purge(&rec) {
                Ok(()) => report.purged += 1,
                Err(e) => {
                    tracing::error!(scope_id = %rec.scope_id, error = %e, "maintenance: purge failed");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
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
