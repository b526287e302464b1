//! Scope lifecycle of the daemon (SPEC §10): state changes requested by the WebUI, delete with a bounded drain,
//! draft expiry, purge after retention and the maintenance pass (`Scopes` methods).
//!
//! Every step is recorded in the registry first (see `scopefs::registry`'s
//! lifecycle module) and is idempotent, so a crash at any point is finished by
//! the next maintenance pass, which also runs once at startup before readiness:
//! a `deleting` scope is retried, a deleted one past retention is purged (again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use scopefs::config::Config;
use scopefs::ids::ScopeId;
use scopefs::registry::{DeleteStep, RegistryError, ScopeRecord, ScopeState};

use super::{failpoint, Scopes, ServiceError};

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
    pub failed: usize,
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
    fn freeze(&self, scope: &ScopeId) {
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
    fn purge(&self, rec: &ScopeRecord) -> Result<(), ServiceError> {
        let _one_at_a_time = self.lifecycle_lock.lock();
        let scope = &rec.scope_id;
        self.registry.begin_purge(scope)?;
        self.open.close(scope)?;
        self.open.storage().purge_objects(scope)?;
        failpoint("purge_after_objects");
        self.open.remove_local(scope)?;
        self.registry.complete_purge(scope)?;
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
        for rec in self.registry.list()?.into_iter().filter(|r| r.state == ScopeState::Deleting) {
            let r = {
                self.freeze(&rec.scope_id);
                self.try_finish_delete(&rec.scope_id)
            };
            count(&mut report, &rec.scope_id, r);
        }
        let now = self.registry.now_ms();
        let draft_cutoff = now.saturating_sub(ms(self.lifecycle.draft_ttl));
        for rec in self.registry.expired_drafts(draft_cutoff)? {
            match self.registry.begin_draft_expiry(&rec.scope_id, draft_cutoff) {
                Ok(Some(_)) => {
                    report.drafts_expired += 1;
                    tracing::info!(scope_id = %rec.scope_id, "draft expired; deleting");
                    let r = {
                        self.freeze(&rec.scope_id);
                        self.try_finish_delete(&rec.scope_id)
                    };
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
        for rec in self.registry.purge_due(purge_cutoff)? {
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
