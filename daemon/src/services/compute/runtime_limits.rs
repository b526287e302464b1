//! Every live environment stays within its admitted runtime, whatever the daemon's history (issue
//! 22 item 4): the max-runtime timer and death watcher of a running environment; both re-armed, and
//! the shared pool's lease and user slot rebuilt, for an environment adopted after a restart or a
//! killed worker; the maintenance sweep that ends any environment past its runtime; and ending (and
//! billing) every environment before a stop unmounts their scopes.
//!
//! Time is the registry's clock: an environment's deadline is `started_at` plus its
//! `effective_max_runtime_seconds`, so a timer re-armed in a new process fires when the first one
//! would have, and the runtime billed at the end is capped at the admitted one.

use std::sync::Arc;
use std::time::Duration;

use scopefs::registry::environments::{EnvironmentRecord, EnvironmentState};

use super::{reason, Compute, ComputeError, ComputeService};

/// How long `env` may still run at `now_ms` (registry clock); `None` once its runtime is used up.
fn remaining(env: &EnvironmentRecord, now_ms: i64) -> Option<Duration> {
    let started = env.started_at?;
    let allowed = i64::try_from(env.effective_max_runtime_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    let left = started.saturating_add(allowed).saturating_sub(now_ms);
    (left > 0).then(|| Duration::from_millis(left.unsigned_abs()))
}

impl ComputeService {
    /// The max-runtime timer (firing after `runtime`) and, with `watch`, the death watcher of a
    /// running environment.
    pub(super) fn arm_environment(
        self: &Arc<Self>,
        env: &EnvironmentRecord,
        container: &str,
        runtime: Duration,
        watch: bool,
    ) {
        let Some(compute) = self.compute.as_ref() else { return };
        let svc = self.clone();
        let env_id = env.environment_id.clone();
        self.rt.spawn(async move {
            tokio::time::sleep(runtime).await;
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = svc.stop_recording_outputs(&env_id, reason::MAX_RUNTIME) {
                    tracing::error!(environment_id = %env_id, error = %e, "stopping an environment at its max runtime failed");
                }
            })
            .await;
        });
        if !watch {
            return;
        }
        let svc = self.clone();
        let env_id = env.environment_id.clone();
        let watched = compute.executor.watch(
            container,
            Box::new(move || {
                let Some(compute) = svc.compute.as_ref() else { return };
                if compute.stopping.lock().contains(&env_id) {
                    return;
                }
                match svc.registry.end_environment(&env_id, false, reason::EXITED) {
                    Ok((_, true)) => {
                        tracing::warn!(environment_id = %env_id, "environment's container stopped by itself")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(environment_id = %env_id, error = %e, "recording a stopped container failed")
                    }
                }
            }),
        );
        if let Err(e) = watched {
            tracing::warn!(environment_id = %env.environment_id, error = %e, "cannot watch the environment's container");
        }
    }

    /// Startup: a running environment whose mount was kept keeps its limits. Past its runtime it
    /// is stopped now (billed the admitted runtime); otherwise its timer fires at its deadline, its
    /// container is watched again (a container that died meanwhile ends it) and a shared one gets
    /// its lease and user slot back. Whether it ended here.
    pub(super) fn adopt_environment(
        self: &Arc<Self>,
        compute: &Compute,
        env: &EnvironmentRecord,
    ) -> Result<bool, ComputeError> {
        let id = env.environment_id.as_str();
        let Some(container) = env.container_id.as_deref() else {
            return Ok(self.stop_recording_outputs(id, reason::EXITED)?.1);
        };
        let Some(left) = remaining(env, self.registry.now_ms()) else {
            tracing::info!(scope_id = %env.scope_id, environment_id = id, "adopted environment is past its max runtime: stopping it");
            return Ok(self.stop_recording_outputs(id, reason::MAX_RUNTIME)?.1);
        };
        let shared = self.execution_of(id).resource_ref.is_some();
        if shared {
            compute.shared.adopt(id, &env.user_id, container);
            let svc = self.clone();
            let watched = container.to_string();
            let on_stop = Box::new(move || svc.shared_container_stopped(&watched));
            if let Err(e) = compute.executor.watch(container, on_stop) {
                tracing::warn!(environment_id = id, error = %e, "cannot watch an adopted shared container");
            }
        }
        if !shared && matches!(compute.executor.is_running(container), Ok(false)) {
            tracing::info!(scope_id = %env.scope_id, environment_id = id, "adopted environment's container has stopped");
            return Ok(self.stop_recording_outputs(id, reason::EXITED)?.1);
        }
        self.arm_environment(env, container, left, !shared);
        tracing::info!(
            scope_id = %env.scope_id,
            environment_id = id,
            remaining_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            "environment adopted: its workspace mount was kept"
        );
        Ok(false)
    }

    /// Maintenance: ends every live environment of the deployment that is past its runtime (a
    /// timer lost with its process, a clock that jumped). How many it ended.
    pub fn end_overdue_environments(&self) -> Result<usize, ComputeError> {
        if self.compute.is_none() {
            return Ok(0);
        }
        let now = self.registry.now_ms();
        let mut ended = 0;
        for env in self.registry.live_environments()?.into_iter().filter(|e| self.is_local(&e.scope_id)) {
            if env.state == EnvironmentState::Running && remaining(&env, now).is_none() {
                tracing::warn!(scope_id = %env.scope_id, environment_id = %env.environment_id, "environment past its max runtime found by maintenance: stopping it");
                ended += usize::from(self.stop_recording_outputs(&env.environment_id, reason::MAX_RUNTIME)?.1);
            }
        }
        Ok(ended)
    }

    /// A stop that unmounts every scope: each live environment is stopped first and its end (and
    /// runtime) recorded, so no container is left on a dead mount. A container the engine could
    /// not remove now is removed by the next start's reconciliation. How many ended.
    pub fn end_all_environments(&self) -> usize {
        if self.compute.is_none() {
            return 0;
        }
        let live = match self.registry.live_environments() {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "listing live environments at stop failed");
                return 0;
            }
        };
        let mut ended = 0;
        for env in live.into_iter().filter(|e| self.is_local(&e.scope_id)) {
            match self.stop_environment(&env.environment_id, reason::DAEMON_STOPPED, true) {
                Ok((_, now)) => ended += usize::from(now),
                Err(e) => {
                    tracing::error!(environment_id = %env.environment_id, error = %e, "ending an environment at stop failed")
                }
            }
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(started_at: Option<i64>, seconds: u64) -> EnvironmentRecord {
        EnvironmentRecord {
            environment_id: "env".into(),
            scope_id: scopefs::ids::ScopeId::generate(),
            owner_id: "o".into(),
            user_id: "u".into(),
            thread_id: "t".into(),
            container_id: None,
            read_only: false,
            state: EnvironmentState::Running,
            revision: 1,
            requested_max_runtime_seconds: None,
            effective_max_runtime_seconds: seconds,
            created_at: 0,
            started_at,
            ended_at: None,
            runtime_seconds: None,
            end_reason: None,
        }
    }

    #[test]
    fn the_deadline_is_the_start_plus_the_admitted_runtime() {
        assert_eq!(remaining(&env(Some(1_000), 60), 1_000), Some(Duration::from_secs(60)));
        assert_eq!(remaining(&env(Some(1_000), 60), 60_999), Some(Duration::from_millis(1)));
        assert_eq!(remaining(&env(Some(1_000), 60), 61_000), None);
        assert_eq!(remaining(&env(Some(1_000), 60), 900_000), None);
        assert_eq!(remaining(&env(None, 60), 0), None, "never started: nothing left to run");
        assert_eq!(remaining(&env(Some(0), u64::MAX), 5), Some(Duration::from_millis(i64::MAX as u64 - 5)));
    }
}
