//! `/tools/*` compute routes (seed 003 §4.5–4.7, seed 000 §9.6): environments, commands and
//! background processes of the scope the signed thread acts in. Thin handlers: parse, one
//! `ComputeService` call on a blocking thread, map the result (errors in `api::error`).
//!
//! Ids of another scope's environments and processes answer 404 exactly like unknown ids; there
//! is no listing across scopes.
//!
//! Within a scope (review M4, L12): a thread that may not write (a memory worker, SPEC §8) runs
//! commands and processes only in read-only environments it created itself (else 403
//! `read_only`); an environment, and its processes, are ended only by the thread (and user) that
//! created it (else 403 `not_owner`); environments of another user are listed without their
//! `user_id`, `thread_id` and `owner_id`. Without a reachable engine every route answers 503
//! `compute_unavailable` and nothing runs — on the host or anywhere else.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Json;
use scopefs::executor::ExecOutput;
use scopefs::ids::ScopeId;
use scopefs::registry::environments::{EnvironmentRecord, EnvironmentState, ProcessRecord};
use serde::{Deserialize, Serialize};

use super::super::error::ErrorCode as E;
use super::super::held_answer::HeldAnswer;
use super::super::routes::{Auth, Doc, RouteTable};
use super::super::{blocking_as, ApiError, AppState};
use super::auth::SignedRequest;
use crate::pools::RouteClass::Tools;
use crate::services::compute::shared::Execution;
use crate::services::compute::Caller;
use crate::services::peers::View;
use crate::services::{ComputeService, ServiceError};

mod seed;
use super::super::artifacts::ArtifactView;
use seed::{CreateParams, DestroyParams};

/// A dedicated container's `backend_type` (shared ones: `services::compute::shared`).
const BACKEND_TYPE: &str = "docker";

/// What every compute tool can answer (besides the signed routes' own codes).
const COMPUTE_ERRORS: &[E] = &[
    E::ComputeUnavailable,
    E::EnvironmentNotFound,
    E::EnvironmentNotRunning,
    E::ComputeCapacityExceeded,
    E::ReadOnly,
    E::NotOwner,
    E::ObjectScopeDenied,
    E::ScopeDeleting,
    E::ExecutorError,
    E::RuntimeAreaError,
    E::RegistryError,
];

pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
        .add(
            "POST",
            "/tools/create_environment",
            Auth::Signed,
            "Create a sandbox environment bound to the thread's scope (seed 003 §4.5 fields: {max_runtime_seconds?, resource_class?, backend_policy?, execution_mode?, shared_compute_eligible?, image_ref?, limits?, input_objects?, artifact_prefix?, default_output_paths?, budget_snapshot?})",
            post(create_environment),
        )
        .doc(Doc::new()
            .signed_body::<CreateParams>()
            .ok::<EnvView>(200)
            .errors(COMPUTE_ERRORS)
            .errors(&[E::ImageNotAllowed, E::ComputeQuotaExceeded, E::InsufficientComputeBalance, E::UnknownPlan, E::AmountOutOfRange]))
        .add(
            "POST",
            "/tools/destroy_environment",
            Auth::Signed,
            "Destroy an environment ({environment_id, persist_outputs?, output_paths?, force_destroy?, artifact_prefix?}); its outputs become artifacts; again is harmless",
            post(destroy_environment),
        )
        .doc(Doc::new()
            .signed_body::<DestroyParams>()
            .ok::<DestroyedView>(200)
            .errors(COMPUTE_ERRORS)
            .errors(&[E::ArtifactLimit, E::InvalidPath, E::QuotaExceeded, E::NoSpace, E::EngineError]))
        .add("POST", "/tools/list_environments", Auth::Signed, "The scope's environments", post(list_environments))
        .doc(Doc::new().signed_body::<NoParams>().ok::<EnvListView>(200).errors(COMPUTE_ERRORS))
        .add(
            "POST",
            "/tools/get_environment_status",
            Auth::Signed,
            "One environment's state, runtime and end reason ({environment_id})",
            post(get_environment_status),
        )
        .doc(Doc::new().signed_body::<EnvParams>().ok::<EnvView>(200).errors(COMPUTE_ERRORS))
        .add(
            "POST",
            "/tools/execute_command",
            Auth::Signed,
            "Run a command in an environment ({environment_id, command, timeout_seconds?, max_output_bytes?})",
            post(execute_command),
        )
        .doc(Doc::new().signed_body::<ExecParams>().ok::<ExecView>(200).errors(COMPUTE_ERRORS))
        .add(
            "POST",
            "/tools/start_process",
            Auth::Signed,
            "Start a background process ({command, environment_id?}); its log stays outside the workspace",
            post(start_process),
        )
        .doc(Doc::new().signed_body::<StartParams>().ok::<ProcessRecord>(200).errors(COMPUTE_ERRORS))
        .add(
            "POST",
            "/tools/check_process",
            Auth::Signed,
            "A background process's state, exit code and log tail ({process_id, tail_bytes?})",
            post(check_process),
        )
        .doc(Doc::new()
            .signed_body::<CheckParams>()
            .ok::<CheckedView>(200)
            .errors(COMPUTE_ERRORS)
            .errors(&[E::ProcessNotFound]))
        .add(
            "POST",
            "/tools/stop_process",
            Auth::Signed,
            "Kill a background process ({process_id})",
            post(stop_process),
        )
        .doc(Doc::new()
            .signed_body::<ProcParams>()
            .ok::<ProcessRecord>(200)
            .errors(COMPUTE_ERRORS)
            .errors(&[E::ProcessNotFound]))
        .add(
            "POST",
            "/tools/list_processes",
            Auth::Signed,
            "The scope's background processes ({environment_id?})",
            post(list_processes),
        )
        .doc(Doc::new().signed_body::<ListProcParams>().ok::<ProcListView>(200).errors(COMPUTE_ERRORS))
}

/// The calling thread, as far as environments are concerned.
struct Who {
    user_id: String,
    thread_id: String,
    may_write: bool,
}

impl Who {
    fn of<T>(req: &SignedRequest<T>) -> Who {
        Who { user_id: req.user_id.clone(), thread_id: req.thread_id.as_str().to_string(), may_write: req.may_write() }
    }

    fn created(&self, env: &EnvironmentRecord) -> bool {
        env.thread_id == self.thread_id && env.user_id == self.user_id
    }
}

/// What a caller does with an environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    /// execute_command, start_process.
    Run,
    /// destroy_environment, stop_process.
    End,
}

fn run_refused() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "read_only",
        "this thread may only run commands in read-only environments it created",
    )
}

/// Whether `who` may `what` in `env` (see the module docs).
fn permit(who: &Who, env: &EnvironmentRecord, what: Use) -> Result<(), ApiError> {
    match what {
        Use::Run if who.may_write || (who.created(env) && env.read_only) => Ok(()),
        Use::Run => Err(run_refused()),
        Use::End if who.created(env) => Ok(()),
        Use::End => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_owner",
            "only the thread that created the environment may end it or its processes",
        )),
    }
}

/// Checks `what` on environment `env_id` of the request's scope; an unknown id is left to the
/// service, which answers it (and another scope's id) as not found.
fn permit_id<T>(svc: &ComputeService, req: &SignedRequest<T>, env_id: &str, what: Use) -> Result<(), ApiError> {
    let env = svc
        .registry()
        .environment(&req.scope.scope_id, env_id)
        .map_err(|e| ApiError::from(ServiceError::Registry(e)))?;
    match env {
        Some(env) => {
            permit(&Who::of(req), &env, what)?;
            // A command reaches the whole `/workspace`: the signed object_scope must cover it.
            match what {
                Use::Run => req.permit_command(env.read_only),
                Use::End => Ok(()),
            }
        }
        None => Ok(()),
    }
}

/// An environment as a caller sees it: the registry row (without its container) and `status`
/// (its state's name); another user's `owner_id`, `user_id` and `thread_id` are left out.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct EnvView {
    environment_id: String,
    scope_id: ScopeId,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread_id: Option<String>,
    read_only: bool,
    state: EnvironmentState,
    status: &'static str,
    revision: u64,
    requested_max_runtime_seconds: Option<u64>,
    effective_max_runtime_seconds: u64,
    created_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    runtime_seconds: Option<u64>,
    end_reason: Option<String>,
    /// Seed 003 §5: `standard` (a dedicated container) or the shared mode it was asked with.
    execution_mode: String,
    backend_type: &'static str,
    /// Names the environment's backend resource (never the container id).
    resource_ref: String,
}

impl EnvView {
    /// `env` as `who` sees it.
    fn seen_by(env: EnvironmentRecord, who: &Who, run: Execution) -> EnvView {
        let own = env.user_id == who.user_id;
        EnvView::of(env, own, run)
    }

    /// `env`, with or without its identities, running as `run`.
    fn of(env: EnvironmentRecord, with_identity: bool, run: Execution) -> EnvView {
        let shown = |id: String| with_identity.then_some(id);
        let resource_ref = match run.resource_ref {
            Some(r) => r.to_string(),
            None => format!("{BACKEND_TYPE}/dedicated/{}", env.environment_id),
        };
        EnvView {
            environment_id: env.environment_id,
            scope_id: env.scope_id,
            owner_id: shown(env.owner_id),
            user_id: shown(env.user_id),
            thread_id: shown(env.thread_id),
            read_only: env.read_only,
            state: env.state,
            status: env.state.as_str(),
            revision: env.revision,
            requested_max_runtime_seconds: env.requested_max_runtime_seconds,
            effective_max_runtime_seconds: env.effective_max_runtime_seconds,
            created_at: env.created_at,
            started_at: env.started_at,
            ended_at: env.ended_at,
            runtime_seconds: env.runtime_seconds,
            end_reason: env.end_reason,
            execution_mode: run.mode,
            backend_type: run.backend_type,
            resource_ref,
        }
    }
}

/// What destroy_environment answers.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct DestroyedView {
    #[serde(flatten)]
    env: EnvView,
    /// The environment had ended before this request.
    already_ended: bool,
    /// The manifest of its outputs (seed 003 §3.8): files under the output paths.
    artifacts: Vec<ArtifactView>,
    /// `force_destroy` left output files uncollected, or they were past the bounds.
    artifacts_lost: bool,
    /// Output paths whose files were not recorded (past the artifact bounds; the environment ended
    /// and is billed all the same).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    outputs_not_recorded: Vec<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct EnvListView {
    environments: Vec<EnvView>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ExecView {
    environment_id: String,
    stdout: String,
    stderr: String,
    exit_code: Option<i64>,
    truncated: bool,
    timed_out: bool,
}

impl ExecView {
    /// The answer without its output (marked `truncated`).
    fn without_output(&self) -> ExecView {
        ExecView {
            environment_id: self.environment_id.clone(),
            stdout: String::new(),
            stderr: String::new(),
            truncated: true,
            ..*self
        }
    }

    fn of(environment_id: String, out: ExecOutput) -> ExecView {
        ExecView {
            environment_id,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.exit_code,
            truncated: out.truncated,
            timed_out: out.timed_out,
        }
    }
}

/// What check_process answers: the process and the tail of its log.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct CheckedView {
    #[serde(flatten)]
    process: ProcessRecord,
    log_tail: String,
    log_bytes: u64,
    log_truncated: bool,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ProcListView {
    processes: Vec<ProcessRecord>,
}

async fn create_environment(
    State(st): State<AppState>,
    req: SignedRequest<CreateParams>,
) -> Result<Json<EnvView>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let caller = Caller {
            user_id: req.user_id.clone(),
            thread_id: req.thread_id.as_str().to_string(),
            read_only: !req.may_write(),
        };
        let mut create = req.body.into_request()?;
        for grant in &mut create.views {
            let root = grant.view.root();
            super::object_scope::check_read(req.grant.as_ref(), &root)?;
            // Writable only as far as `object_scope` lets the request write (services::peers).
            grant.writable &= req.grant.as_ref().is_none_or(|g| g.may_write(&root));
        }
        // The global store's changes are collected only when it is bound read-write.
        let global = !caller.read_only && create.views.iter().any(|g| g.writable && g.view == View::Global);
        super::object_scope::check_outputs(req.grant.as_ref(), &create.options.default_output_paths, global)?;
        let env = svc.create_environment(&req.scope.scope_id, &caller, &create)?;
        let run = svc.execution_of(&env.environment_id);
        Ok(Json(EnvView::of(env, true, run)))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EnvParams {
    environment_id: String,
}

async fn destroy_environment(
    State(st): State<AppState>,
    req: SignedRequest<DestroyParams>,
) -> Result<Json<DestroyedView>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        permit_id(&svc, &req, &req.body.environment_id, Use::End)?;
        let params = req.body.to_request()?;
        let (outputs, global) = svc.destroy_output_paths(&req.scope.scope_id, &req.body.environment_id, &params)?;
        super::object_scope::check_outputs(req.grant.as_ref(), &outputs, global)?;
        let done = svc.destroy_environment(&req.scope.scope_id, &req.body.environment_id, &params)?;
        let (env_id, thread, user) = (&done.env.environment_id, &done.env.thread_id, &done.env.user_id);
        let artifacts = done.artifacts.into_iter().map(|a| ArtifactView::of(a, env_id, thread, user)).collect();
        let env = EnvView::seen_by(done.env, &Who::of(&req), svc.execution_of(&req.body.environment_id));
        Ok(Json(DestroyedView {
            env,
            already_ended: !done.ended_now,
            artifacts,
            artifacts_lost: done.artifacts_lost,
            outputs_not_recorded: done.outputs_not_recorded,
        }))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoParams {}

async fn list_environments(
    State(st): State<AppState>,
    req: SignedRequest<NoParams>,
) -> Result<Json<EnvListView>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let envs = svc.list_environments(&req.scope.scope_id)?;
        let who = Who::of(&req);
        Ok(Json(EnvListView {
            environments: envs
                .into_iter()
                .map(|e| {
                    let run = svc.execution_of(&e.environment_id);
                    EnvView::seen_by(e, &who, run)
                })
                .collect(),
        }))
    })
    .await
}

async fn get_environment_status(
    State(st): State<AppState>,
    req: SignedRequest<EnvParams>,
) -> Result<Json<EnvView>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let env = svc.environment_status(&req.scope.scope_id, &req.body.environment_id)?;
        let run = svc.execution_of(&env.environment_id);
        Ok(Json(EnvView::seen_by(env, &Who::of(&req), run)))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecParams {
    environment_id: String,
    command: String,
    timeout_seconds: Option<u64>,
    max_output_bytes: Option<u64>,
}

async fn execute_command(State(st): State<AppState>, req: SignedRequest<ExecParams>) -> Result<HeldAnswer, ApiError> {
    let (svc, tools) = (st.compute.clone(), st.tools.clone());
    // Commands have a class of their own: they may run for minutes, and /tools stays free.
    blocking_as(crate::pools::RouteClass::Exec, req.share(), move || -> Result<_, ApiError> {
        let b = &req.body;
        permit_id(&svc, &req, &b.environment_id, Use::Run)?;
        let out = svc.execute_command(
            &req.scope.scope_id,
            &b.environment_id,
            &b.command,
            b.timeout_seconds,
            b.max_output_bytes,
        )?;
        // Output is bounded by `executor.max_output_bytes`; the answer is charged to the body
        // budget until the client has taken it. The command has run: without room for its output
        // the answer still says how it ended, its output cut (`truncated`), rather than a 503 that
        // a retry would answer by running it again.
        let view = ExecView::of(b.environment_id.clone(), out);
        tools.held_json(&req.user_id, &view).or_else(|_| {
            tracing::warn!(scope_id = %req.scope.scope_id, "no room for a command's output in tools_body_memory_bytes; answered without it");
            HeldAnswer::json(&view.without_output(), ())
        })
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct StartParams {
    command: String,
    environment_id: Option<String>,
}

async fn start_process(
    State(st): State<AppState>,
    req: SignedRequest<StartParams>,
) -> Result<Json<ProcessRecord>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let who = Who::of(&req);
        let env_id = match &req.body.environment_id {
            Some(id) => {
                permit_id(&svc, &req, id, Use::Run)?;
                Some(id.clone())
            }
            // A writer whose object_scope covers a writable `/workspace` may use any environment.
            None if who.may_write && req.permit_command(false).is_ok() => None,
            // The newest running environment this thread may use (the service's own default
            // could be another thread's read-write one).
            None => {
                let envs = svc.list_environments(&req.scope.scope_id)?;
                let mine = envs.iter().rev().find(|e| {
                    e.state == EnvironmentState::Running
                        && permit(&who, e, Use::Run).is_ok()
                        && req.permit_command(e.read_only).is_ok()
                });
                Some(mine.map(|e| e.environment_id.clone()).ok_or_else(run_refused)?)
            }
        };
        let p = svc.start_process(&req.scope.scope_id, env_id.as_deref(), &req.body.command)?;
        Ok(Json(p))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CheckParams {
    process_id: String,
    tail_bytes: Option<u64>,
}

async fn check_process(
    State(st): State<AppState>,
    req: SignedRequest<CheckParams>,
) -> Result<Json<CheckedView>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let (process, tail) = svc.check_process(&req.scope.scope_id, &req.body.process_id, req.body.tail_bytes)?;
        Ok(Json(CheckedView { process, log_tail: tail.text, log_bytes: tail.log_bytes, log_truncated: tail.truncated }))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProcParams {
    process_id: String,
}

async fn stop_process(
    State(st): State<AppState>,
    req: SignedRequest<ProcParams>,
) -> Result<Json<ProcessRecord>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let process = svc.registry().process(&req.scope.scope_id, &req.body.process_id);
        if let Some(p) = process.map_err(|e| ApiError::from(ServiceError::Registry(e)))? {
            permit_id(&svc, &req, &p.environment_id, Use::End)?;
        }
        Ok(Json(svc.stop_process(&req.scope.scope_id, &req.body.process_id)?))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListProcParams {
    environment_id: Option<String>,
}

async fn list_processes(
    State(st): State<AppState>,
    req: SignedRequest<ListProcParams>,
) -> Result<Json<ProcListView>, ApiError> {
    let svc = st.compute.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let list = svc.list_processes(&req.scope.scope_id, req.body.environment_id.as_deref())?;
        Ok(Json(ProcListView { processes: list }))
    })
    .await
}

#[cfg(test)]
mod tests;
