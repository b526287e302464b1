//! Environments and commands of `ComputeService`: create (with billing preflight), timers and
//! watchers, stop and destroy, status, `execute_command`, stopping a scope's work, reconciliation.

use std::sync::Arc;
use std::time::Duration;

use scopefs::executor::{ContainerSpec, ExecOutput, ExecRequest, ExecutorError};
use scopefs::ids::ScopeId;
use scopefs::registry::environments::{EnvironmentRecord, EnvironmentState, NewEnvironment};

use scopefs::limits::{refuse, Bound};
use scopefs::registry::billing::ArtifactEntry;

use super::outputs::output_paths;
use super::{
    reason, Caller, Compute, ComputeError, ComputeService, CreateEnvironment, DestroyEnvironment, Destroyed,
    EnvironmentOptions, ReconcileReport,
};
use crate::services::peers::{MountedViews, ViewGrant};

/// Collects an environment's outputs once its container is gone.
type Collect<'a> = &'a dyn Fn() -> Result<Vec<ArtifactEntry>, ComputeError>;

/// Refuses a path list longer than `limits.max_environment_paths` (before any entry is looked at).
fn check_paths(compute: &Compute, field: &'static str, n: usize) -> Result<(), ComputeError> {
    let max = compute.settings.max_environment_paths;
    if n as u64 > max {
        refuse(Bound::EnvironmentPaths);
        return Err(ComputeError::Invalid(field, format!("more than {max} entries (limits.max_environment_paths)")));
    }
    Ok(())
}

/// Gives a scope's root still owned by root to the sandbox user (`executor.sandbox_owner`), so that
/// the container's non-root user can write at the top of its mount.
fn give_root(root: &std::path::Path, (uid, gid): (u32, u32)) -> Result<(), ComputeError> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(root)?.uid() == 0 {
        std::os::unix::fs::chown(root, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Checks the seed fields of a create request against the configuration: `image_ref` must be the
/// configured image, path lists are bounded and output paths valid. Returns the options to record.
fn check_create(compute: &Compute, req: &CreateEnvironment) -> Result<EnvironmentOptions, ComputeError> {
    if let Some(image) = &req.image_ref {
        if *image != compute.settings.image {
            return Err(ComputeError::Forbidden(
                "image_not_allowed",
                "image_ref names an image this daemon does not run (only executor.image is allowed)".into(),
            ));
        }
    }
    let max_inputs = compute.settings.max_input_objects;
    if req.input_objects as u64 > max_inputs {
        refuse(Bound::InputObjects);
        return Err(ComputeError::Invalid(
            "input_objects",
            format!("more than {max_inputs} entries (limits.max_input_objects)"),
        ));
    }
    check_paths(compute, "input_objects", req.views.len())?;
    check_paths(compute, "default_output_paths", req.options.default_output_paths.len())?;
    output_paths(&req.options.default_output_paths, true).map_err(|e| match e {
        ComputeError::Invalid(_, text) => ComputeError::Invalid("default_output_paths", text),
        other => other,
    })?;
    if req.options.max_output_bytes == Some(0) {
        return Err(ComputeError::Invalid("limits", "max_stdout_stderr_bytes must be at least 1".into()));
    }
    // Outputs are what changes from now on (`outputs::output_files`).
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Ok(EnvironmentOptions {
        outputs_since_ns: Some(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)),
        ..req.options.clone()
    })
}

impl ComputeService {
    /// Mounts the scope and the views the request grants (a memory worker's container writes
    /// nowhere, its global store included), and gives their writable roots to the sandbox user.
    fn mount_for_container(
        &self,
        compute: &Compute,
        scope: &ScopeId,
        caller: &Caller,
        req: &CreateEnvironment,
    ) -> Result<(std::path::PathBuf, MountedViews), ComputeError> {
        let mountpoint = self.mount_scope(scope)?;
        let grants: Vec<ViewGrant> = req
            .views
            .iter()
            .map(|g| ViewGrant { view: g.view.clone(), writable: g.writable && !caller.read_only })
            .collect();
        let views = crate::services::peers::mount_views(&self.registry, &self.open, &caller.user_id, &grants)?;
        let writable_roots = views.mounts.iter().filter(|v| !v.read_only).map(|v| &v.source);
        if let Some(owner) = compute.settings.sandbox_owner.filter(|_| !caller.read_only) {
            for root in std::iter::once(&mountpoint).chain(writable_roots) {
                give_root(root, owner)?;
            }
        }
        Ok((mountpoint, views))
    }

    /// Creates an environment: registry row and owner first, then the container (the scope's
    /// mountpoint at `/workspace`), then `running`, a max-runtime timer and a watcher that records
    /// the container's death.
    pub fn create_environment(
        self: &Arc<Self>,
        scope: &ScopeId,
        caller: &Caller,
        req: &CreateEnvironment,
    ) -> Result<EnvironmentRecord, ComputeError> {
        let compute = self.compute_ready()?;
        let max = compute.settings.max_runtime_secs;
        let requested = req.max_runtime_seconds;
        if requested == Some(0) {
            return Err(ComputeError::Invalid("max_runtime_seconds", "must be at least 1".into()));
        }
        // Seed 003 §15: the user's shared pool or a dedicated container (429 before anything runs).
        let (route, req) = self.route(compute, &caller.user_id, req)?;
        let req = &req;
        let mut options = check_create(compute, req)?;
        let (mountpoint, views) = self.mount_for_container(compute, scope, caller, req)?;
        options.global_store_scope = views.writable_global.as_ref().map(|r| r.scope_id.to_string());
        let options = serde_json::to_string(&options).map_err(|e| ComputeError::Invalid("limits", e.to_string()))?;
        let (env, effective) = {
            // Preflight and the new row under one lock: the preflight counts the user's live
            // environments (review M7), so two creations must not both see the same balance.
            let _one_at_a_time = compute.environment_admission.lock();
            // Billing preflight (seed 003 §10.1): min(requested, plan maximum, affordable), or 429.
            let (admitted, pricing_snapshot) = match &self.billing {
                Some(billing) => {
                    let (runtime, price) = billing.admit_environment(&caller.user_id, requested)?;
                    (runtime, Some(price))
                }
                None => (requested.unwrap_or(max), None),
            };
            let effective = admitted.min(max);
            let new = NewEnvironment {
                user_id: caller.user_id.clone(),
                thread_id: caller.thread_id.clone(),
                read_only: caller.read_only,
                requested_max_runtime_seconds: requested,
                effective_max_runtime_seconds: effective,
                max_live_per_scope: compute.settings.max_environments_per_scope,
                pricing_snapshot,
            };
            let env = self.registry.create_environment(scope, &new)?.ok_or(ComputeError::AtCapacity)?;
            self.registry.set_environment_options(&env.environment_id, &options)?;
            (env, effective)
        };
        let spec = ContainerSpec {
            deployment_id: self.registry.id().to_string(),
            scope_id: scope.to_string(),
            owner_id: env.owner_id.clone(),
            environment_id: env.environment_id.clone(),
            workspace: mountpoint,
            read_only_workspace: caller.read_only,
            views: views.mounts,
        };
        let (container, watch) = match self.container_for(compute, &spec, &caller.user_id, route) {
            Ok(c) => c,
            Err(e) => {
                self.registry.end_environment(&env.environment_id, true, reason::CREATE_FAILED)?;
                return Err(e.into());
            }
        };
        self.registry.attach_container(&env.environment_id, &container)?;
        let Some(running) = self.registry.environment_started(&env.environment_id)? else {
            // Ended meanwhile (scope deleted): make sure the container goes too.
            let _ = self.release_container(compute, &env.environment_id, &container, reason::CREATE_FAILED);
            return Err(ComputeError::NotRunning);
        };
        tracing::info!(scope_id = %scope, environment_id = %running.environment_id, effective_max_runtime_seconds = effective, "environment started");
        self.arm_environment(&running, &container, Duration::from_secs(effective), watch);
        Ok(running)
    }

    /// Removes an environment's container and records its end once. With `record_anyway`, the end
    /// is recorded even if the engine could not be reached (the container is then removed by the
    /// next reconciliation); otherwise such a failure is returned and the environment stays live.
    pub(crate) fn stop_environment(
        &self,
        env_id: &str,
        why: &str,
        record_anyway: bool,
    ) -> Result<(EnvironmentRecord, bool), ComputeError> {
        self.stop_collecting(env_id, why, record_anyway, None).map(|(env, now, _)| (env, now))
    }

    /// `stop_environment`; with `collect`, the outputs are collected after the container is gone
    /// and recorded with the end (and returned). A failed collection still records the end (the
    /// usage must not be lost) and is returned as the error.
    fn stop_collecting(
        &self,
        env_id: &str,
        why: &str,
        record_anyway: bool,
        collect: Option<Collect<'_>>,
    ) -> Result<(EnvironmentRecord, bool, Vec<ArtifactEntry>), ComputeError> {
        let compute =
            self.compute.as_ref().ok_or_else(|| ComputeError::Unavailable("no executor is configured".into()))?;
        let env = self.registry.environment_unscoped(env_id)?.ok_or(ComputeError::EnvironmentNotFound)?;
        if !env.state.is_live() {
            return Ok((env, false, Vec::new()));
        }
        // One stop at a time: a concurrent stop (max-runtime timer, destroy, a status check that
        // finds the container gone) leaves recording the end, and its reason, to the first one.
        if !compute.stopping.lock().insert(env_id.to_string()) {
            return Ok((env, false, Vec::new()));
        }
        let removed = match &env.container_id {
            Some(c) => self.release_container(compute, env_id, c, why),
            None => Ok(()),
        };
        let (outputs, collect_error) = match (&removed, collect) {
            (Ok(()), Some(f)) => match f() {
                Ok(v) => (v, None),
                Err(e) => (Vec::new(), Some(e)),
            },
            _ => (Vec::new(), None),
        };
        let result = match removed {
            Ok(()) => {
                self.registry.end_environment_with_outputs(env_id, false, why, &outputs).map_err(ComputeError::from)
            }
            Err(e) if record_anyway => {
                tracing::warn!(environment_id = %env_id, error = %e, "container not removed; reconciliation removes it later");
                compute.set_reconciled(false);
                self.registry.end_environment(env_id, false, why).map_err(ComputeError::from)
            }
            Err(e) => Err(e.into()),
        };
        compute.stopping.lock().remove(env_id);
        if let Ok((rec, true)) = &result {
            tracing::info!(environment_id = %env_id, reason = why, runtime_seconds = rec.runtime_seconds, artifacts = outputs.len(), "environment ended");
        }
        match collect_error {
            Some(e) => {
                tracing::error!(environment_id = %env_id, error = %e, "collecting the environment's outputs failed");
                Err(e)
            }
            None => result.map(|(rec, now)| (rec, now, outputs)),
        }
    }

    /// The options an environment was created with (defaults when none were recorded).
    fn options_of(&self, env_id: &str) -> Result<EnvironmentOptions, ComputeError> {
        match self.registry.environment_options(env_id)? {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| ComputeError::Service(scopefs::registry::RegistryError::Corrupt(e.to_string()).into())),
            None => Ok(EnvironmentOptions::default()),
        }
    }

    /// Destroys an environment of `scope` (seed 003 §4.5, §7.5). Its outputs (the regular files
    /// under `output_paths`, else its `default_output_paths`) become artifacts recorded with its
    /// usage: bounds are checked before the container is removed, the files are hashed after. Past
    /// the bounds the environment still ends (and is billed): nothing is recorded and the answer
    /// names the output paths not recorded. Destroying an ended one again returns it unchanged,
    /// and records its outputs if asked.
    pub fn destroy_environment(
        &self,
        scope: &ScopeId,
        env_id: &str,
        req: &DestroyEnvironment,
    ) -> Result<Destroyed, ComputeError> {
        let compute = self.compute_ready()?;
        let env = self.scoped_env(scope, env_id)?;
        let opts = self.options_of(&env.environment_id)?;
        let raw = req.output_paths.as_ref().unwrap_or(&opts.default_output_paths);
        check_paths(compute, "output_paths", raw.len())?;
        let paths = output_paths(raw, opts.global_store_scope.is_some())?;
        let persist = req.persist_outputs.unwrap_or(true) && !paths.is_empty();
        let id = env.environment_id.as_str();
        if req.force_destroy || !persist {
            let lost = req.force_destroy && persist && self.check_outputs(scope, &paths, &opts).map_or(true, |n| n > 0);
            let (env, ended_now) = self.stop_environment(id, reason::DESTROYED, req.force_destroy)?;
            return Ok(Destroyed {
                env,
                ended_now,
                artifacts: Vec::new(),
                artifacts_lost: lost,
                outputs_not_recorded: Vec::new(),
            });
        }
        let past_bounds = |why: String| -> Result<Destroyed, ComputeError> {
            tracing::warn!(environment_id = %id, reason = %why, "outputs past the artifact bounds are not recorded");
            let (env, ended_now) = self.stop_environment(id, reason::DESTROYED, false)?;
            Ok(Destroyed {
                env,
                ended_now,
                artifacts: Vec::new(),
                artifacts_lost: true,
                outputs_not_recorded: raw.clone(),
            })
        };
        match self.check_outputs(scope, &paths, &opts) {
            Err(ComputeError::OutputsTooLarge(why)) => return past_bounds(why),
            other => other?,
        };
        let collect = || self.collect_outputs(scope, &paths, &opts, id);
        let (env, ended_now, mut artifacts) = match self.stop_collecting(id, reason::DESTROYED, false, Some(&collect)) {
            // Grown past the bounds since the check: the end is recorded without them.
            Err(ComputeError::OutputsTooLarge(why)) => return past_bounds(why),
            other => other?,
        };
        if !ended_now {
            artifacts = collect()?;
            self.registry.registry().record_artifacts(id, &artifacts)?;
        }
        Ok(Destroyed { env, ended_now, artifacts, artifacts_lost: false, outputs_not_recorded: Vec::new() })
    }

    /// Ends an environment its max-runtime timer or its container's end stopped, recording its
    /// default outputs with the end (before anything can settle its usage); past the artifact
    /// bounds, or when they cannot be read, none are recorded (said in the log), the end and its
    /// usage are recorded all the same.
    pub(crate) fn stop_recording_outputs(
        &self,
        env_id: &str,
        why: &str,
    ) -> Result<(EnvironmentRecord, bool), ComputeError> {
        let env = self.registry.environment_unscoped(env_id)?.ok_or(ComputeError::EnvironmentNotFound)?;
        let opts = self.options_of(env_id)?;
        let paths = output_paths(&opts.default_output_paths, opts.global_store_scope.is_some()).unwrap_or_default();
        if paths.is_empty() || !env.state.is_live() {
            return self.stop_environment(env_id, why, true);
        }
        // Whatever keeps the outputs from being recorded (past the bounds, a scope closing), the
        // end and its usage are recorded: said in the log.
        let collect = || match self.collect_outputs(&env.scope_id, &paths, &opts, env_id) {
            Err(e) => {
                tracing::warn!(environment_id = %env_id, error = %e, "the environment's outputs are not recorded");
                Ok(Vec::new())
            }
            ok => ok,
        };
        self.stop_collecting(env_id, why, true, Some(&collect)).map(|(env, now, _)| (env, now))
    }

    /// The output paths (as given) a destroy of `env_id` with `req` collects: its own, else the
    /// environment's `default_output_paths`; and whether its paths in the global store are
    /// collected (it had the store read-write). For a caller to check them against its grant first.
    pub fn destroy_output_paths(
        &self,
        scope: &ScopeId,
        env_id: &str,
        req: &DestroyEnvironment,
    ) -> Result<(Vec<String>, bool), ComputeError> {
        // The same order of answers as `destroy_environment`: compute unavailable before anything else.
        self.compute_ready()?;
        let env = self.scoped_env(scope, env_id)?;
        let opts = self.options_of(&env.environment_id)?;
        let global = opts.global_store_scope.is_some();
        Ok((req.output_paths.clone().unwrap_or(opts.default_output_paths), global))
    }

    /// The environments of `scope`, oldest first.
    pub fn list_environments(&self, scope: &ScopeId) -> Result<Vec<EnvironmentRecord>, ComputeError> {
        self.compute_ready()?;
        Ok(self.registry.environments(scope)?)
    }

    /// One environment of `scope`; a running one whose container has gone is recorded as ended first.
    pub fn environment_status(&self, scope: &ScopeId, env_id: &str) -> Result<EnvironmentRecord, ComputeError> {
        let compute = self.compute_ready()?;
        let env = self.scoped_env(scope, env_id)?;
        if env.state == EnvironmentState::Running {
            if let Some(c) = &env.container_id {
                match compute.executor.is_running(c) {
                    Ok(true) => {}
                    Ok(false) | Err(ExecutorError::NoSuchContainer) => {
                        return Ok(self.stop_recording_outputs(env_id, reason::EXITED)?.0);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(env)
    }

    /// The running container of an environment of `scope`.
    pub(super) fn running_container(
        &self,
        scope: &ScopeId,
        env_id: &str,
    ) -> Result<(EnvironmentRecord, String), ComputeError> {
        let env = self.scoped_env(scope, env_id)?;
        match (&env.state, env.container_id.clone()) {
            (EnvironmentState::Running, Some(c)) => Ok((env, c)),
            _ => Err(ComputeError::NotRunning),
        }
    }

    /// Runs one command in an environment of `scope` (timeout and output limit capped by the config).
    pub fn execute_command(
        &self,
        scope: &ScopeId,
        env_id: &str,
        command: &str,
        timeout_secs: Option<u64>,
        max_output_bytes: Option<u64>,
    ) -> Result<ExecOutput, ComputeError> {
        let compute = self.compute_ready()?;
        if command.is_empty() {
            return Err(ComputeError::Invalid("command", "must not be empty".into()));
        }
        let limit = compute.settings.command_timeout;
        let timeout = match timeout_secs {
            Some(0) => return Err(ComputeError::Invalid("timeout_seconds", "must be at least 1".into())),
            Some(s) => Duration::from_secs(s).min(limit),
            None => limit,
        };
        let (_, container) = self.running_container(scope, env_id)?;
        // The environment's own cap (`limits.max_stdout_stderr_bytes` at create) applies too.
        let env_cap = self.options_of(env_id)?.max_output_bytes.unwrap_or(u64::MAX);
        let max_out = max_output_bytes.unwrap_or(u64::MAX).min(compute.settings.max_output_bytes).min(env_cap);
        // Held until the command ends: a scope cannot occupy more than its share of threads.
        let _slot = compute.exec_slot(scope.as_str())?;
        let req = ExecRequest { command: command.to_string(), timeout, max_output_bytes: max_out };
        match compute.executor.exec(&container, &req) {
            Ok(out) => Ok(out),
            Err(ExecutorError::NoSuchContainer | ExecutorError::NotRunning) => {
                self.stop_recording_outputs(env_id, reason::EXITED)?;
                Err(ComputeError::NotRunning)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Scope delete: stops every live environment of `scope` (its processes end with it) and drops
    /// the scope's runtime area. Works without an engine too: the ends are recorded and the
    /// containers are removed by the next reconciliation.
    pub(crate) fn stop_scope_compute(&self, scope: &ScopeId) -> Result<(), ComputeError> {
        let Some(compute) = self.compute.as_ref() else { return Ok(()) };
        for env in self.registry.environments(scope)?.into_iter().filter(|e| e.state.is_live()) {
            self.stop_environment(&env.environment_id, reason::SCOPE_DELETED, true)?;
        }
        self.drop_shared_scope(compute, scope.as_str());
        match std::fs::remove_dir_all(compute.settings.runtime_dir.join(scope.as_str())) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Startup, before scopes are remounted: every environment still recorded live is ended with
    /// reason `daemon_restart` (see the module docs of `executor`), then leftover containers are
    /// removed if the engine answers (else before the first compute request). Environments of the
    /// scopes in `resumed` (whose mount outlived the previous daemon process, issue 9) are adopted
    /// instead: they stay live under their limits (`adopt_environment`), and their containers are
    /// kept as known ones.
    pub fn reconcile_compute_at_startup(
        self: &Arc<Self>,
        resumed: &std::collections::HashSet<ScopeId>,
    ) -> Result<ReconcileReport, ComputeError> {
        let Some(compute) = self.compute.as_ref() else { return Ok(ReconcileReport::default()) };
        let mut report = ReconcileReport::default();
        for env in self.registry.live_environments()?.into_iter().filter(|e| self.is_local(&e.scope_id)) {
            if resumed.contains(&env.scope_id) && env.state == EnvironmentState::Running {
                if self.adopt_environment(compute, &env)? {
                    report.environments_ended += 1;
                }
                continue;
            }
            let (_, ended) = self.registry.end_environment(&env.environment_id, false, reason::DAEMON_RESTART)?;
            if ended {
                report.environments_ended += 1;
                tracing::info!(scope_id = %env.scope_id, environment_id = %env.environment_id, "environment ended by the daemon restart");
            }
        }
        compute.set_reconciled(false);
        match compute.executor.ping() {
            Ok(()) => {
                let r = self.reconcile_containers()?;
                report.containers_removed = r.containers_removed;
                report.containers_kept = r.containers_kept;
            }
            Err(e) => tracing::warn!(error = %e, "Docker not reachable: containers are reconciled once it answers"),
        }
        Ok(report)
    }

    /// Removes every container of this deployment whose environment is unknown, not live, or not
    /// the one the registry records (quarantine: their owners are marked `quarantined` if still live).
    pub fn reconcile_containers(&self) -> Result<ReconcileReport, ComputeError> {
        let compute =
            self.compute.as_ref().ok_or_else(|| ComputeError::Unavailable("no executor is configured".into()))?;
        let _one_at_a_time = compute.reconcile_guard();
        if !compute.needs_reconcile() {
            return Ok(ReconcileReport::default());
        }
        let mut report = ReconcileReport::default();
        for c in compute.executor.list(self.registry.id())? {
            let env = match &c.environment_id {
                Some(id) => self.registry.environment_unscoped(id)?,
                None => None,
            };
            let known = env
                .as_ref()
                .is_some_and(|e| e.state.is_live() && e.container_id.as_deref() == Some(c.container_id.as_str()))
                || compute.shared.holds(&c.container_id);
            if known {
                report.containers_kept += 1;
                continue;
            }
            compute.executor.remove(&c.container_id)?;
            report.containers_removed += 1;
            tracing::warn!(
                environment_id = c.environment_id.as_deref().unwrap_or("-"),
                scope_id = c.scope_id.as_deref().unwrap_or("-"),
                known_environment = env.is_some(),
                "removed a sandbox container the registry does not run (quarantine)"
            );
            if let (Some(scope), Some(owner)) = (c.scope_id.as_deref(), c.owner_id.as_deref()) {
                if let Ok(scope) = ScopeId::parse(scope) {
                    self.quarantine_owner(&scope, owner);
                }
            }
        }
        compute.set_reconciled(true);
        Ok(report)
    }

    /// Marks a container's owner `quarantined` if it is known and not settled.
    fn quarantine_owner(&self, scope: &ScopeId, owner_id: &str) {
        use scopefs::registry::{OwnerState, OwnerUpdate};
        if let Ok(owner) = self.registry.owner(scope, owner_id) {
            if !owner.state.is_settled() {
                let update = OwnerUpdate { state: Some(OwnerState::Quarantined), ..OwnerUpdate::default() };
                if let Err(e) = self.registry.update_owner(scope, owner_id, &update) {
                    tracing::error!(owner_id, error = %e, "quarantining an owner failed");
                }
            }
        }
    }
}
