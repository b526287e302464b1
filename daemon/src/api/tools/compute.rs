//! `/tools/*` compute routes (seed 003 §4.5–4.7, seed 000 §9.6): environments, commands and
//! background processes of the scope the signed thread acts in. Thin handlers: parse, one
//! `ScopeService` call on a blocking thread, map the result (errors in `api::error`).
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
use scopefs::registry::environments::{EnvironmentRecord, EnvironmentState, ProcessRecord};
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::routes::{Auth, RouteTable};
use super::super::{ApiError, AppState};
use super::auth::{run_tool, SignedRequest};
use crate::executor::{Caller, CreateEnvironment};
use crate::service::{ScopeService, ServiceError};

pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
        .add(
            "POST",
            "/tools/create_environment",
            Auth::Signed,
            "Create a sandbox environment bound to the thread's scope ({max_runtime_seconds?})",
            post(create_environment),
        )
        .add(
            "POST",
            "/tools/destroy_environment",
            Auth::Signed,
            "Destroy an environment ({environment_id}); again is harmless",
            post(destroy_environment),
        )
        .add("POST", "/tools/list_environments", Auth::Signed, "The scope's environments", post(list_environments))
        .add(
            "POST",
            "/tools/get_environment_status",
            Auth::Signed,
            "One environment's state, runtime and end reason ({environment_id})",
            post(get_environment_status),
        )
        .add(
            "POST",
            "/tools/execute_command",
            Auth::Signed,
            "Run a command in an environment ({environment_id, command, timeout_seconds?, max_output_bytes?})",
            post(execute_command),
        )
        .add(
            "POST",
            "/tools/start_process",
            Auth::Signed,
            "Start a background process ({command, environment_id?}); its log stays outside the workspace",
            post(start_process),
        )
        .add(
            "POST",
            "/tools/check_process",
            Auth::Signed,
            "A background process's state, exit code and log tail ({process_id, tail_bytes?})",
            post(check_process),
        )
        .add(
            "POST",
            "/tools/stop_process",
            Auth::Signed,
            "Kill a background process ({process_id})",
            post(stop_process),
        )
        .add(
            "POST",
            "/tools/list_processes",
            Auth::Signed,
            "The scope's background processes ({environment_id?})",
            post(list_processes),
        )
}

fn env_json(env: &EnvironmentRecord) -> Value {
    let mut v = serde_json::to_value(env).unwrap_or_else(|_| json!({}));
    v["status"] = json!(env.state.as_str());
    v
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
fn permit_id<T>(svc: &ScopeService, req: &SignedRequest<T>, env_id: &str, what: Use) -> Result<(), ApiError> {
    let env = svc
        .registry
        .environment(&svc.deployment, &req.scope.scope_id, env_id)
        .map_err(|e| ApiError::from(ServiceError::Registry(e)))?;
    match env {
        Some(env) => permit(&Who::of(req), &env, what),
        None => Ok(()),
    }
}

/// An environment as `who` sees it: another user's identities are left out.
fn env_view(env: &EnvironmentRecord, who: &Who) -> Value {
    let mut v = env_json(env);
    if env.user_id != who.user_id {
        if let Some(o) = v.as_object_mut() {
            for k in ["user_id", "thread_id", "owner_id"] {
                o.remove(k);
            }
        }
    }
    v
}

fn proc_json(p: &ProcessRecord) -> Value {
    serde_json::to_value(p).unwrap_or_else(|_| json!({}))
}

#[derive(Debug, Deserialize)]
struct CreateParams {
    max_runtime_seconds: Option<u64>,
}

async fn create_environment(
    State(st): State<AppState>,
    req: SignedRequest<CreateParams>,
) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let caller = Caller {
            user_id: req.user_id.clone(),
            thread_id: req.thread_id.as_str().to_string(),
            read_only: !req.may_write(),
        };
        let create = CreateEnvironment { max_runtime_seconds: req.body.max_runtime_seconds };
        let env = svc.create_environment(&req.scope.scope_id, &caller, &create)?;
        Ok(Json(env_json(&env)))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct EnvParams {
    environment_id: String,
}

async fn destroy_environment(
    State(st): State<AppState>,
    req: SignedRequest<EnvParams>,
) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        permit_id(&svc, &req, &req.body.environment_id, Use::End)?;
        let (env, ended_now) = svc.destroy_environment(&req.scope.scope_id, &req.body.environment_id)?;
        let mut v = env_view(&env, &Who::of(&req));
        v["already_ended"] = json!(!ended_now);
        v["artifacts"] = json!([]);
        Ok(Json(v))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct NoParams {}

async fn list_environments(State(st): State<AppState>, req: SignedRequest<NoParams>) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let envs = svc.list_environments(&req.scope.scope_id)?;
        let who = Who::of(&req);
        Ok(Json(json!({ "environments": envs.iter().map(|e| env_view(e, &who)).collect::<Vec<_>>() })))
    })
    .await
}

async fn get_environment_status(
    State(st): State<AppState>,
    req: SignedRequest<EnvParams>,
) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let env = svc.environment_status(&req.scope.scope_id, &req.body.environment_id)?;
        Ok(Json(env_view(&env, &Who::of(&req))))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct ExecParams {
    environment_id: String,
    command: String,
    timeout_seconds: Option<u64>,
    max_output_bytes: Option<u64>,
}

async fn execute_command(State(st): State<AppState>, req: SignedRequest<ExecParams>) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let b = &req.body;
        permit_id(&svc, &req, &b.environment_id, Use::Run)?;
        let out = svc.execute_command(
            &req.scope.scope_id,
            &b.environment_id,
            &b.command,
            b.timeout_seconds,
            b.max_output_bytes,
        )?;
        Ok(Json(json!({
            "environment_id": b.environment_id,
            "stdout": String::from_utf8_lossy(&out.stdout),
            "stderr": String::from_utf8_lossy(&out.stderr),
            "exit_code": out.exit_code,
            "truncated": out.truncated,
            "timed_out": out.timed_out,
        })))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct StartParams {
    command: String,
    environment_id: Option<String>,
}

async fn start_process(State(st): State<AppState>, req: SignedRequest<StartParams>) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let who = Who::of(&req);
        let env_id = match &req.body.environment_id {
            Some(id) => {
                permit_id(&svc, &req, id, Use::Run)?;
                Some(id.clone())
            }
            None if who.may_write => None,
            // The newest running environment this thread may use (the service's own default
            // could be another thread's read-write one).
            None => {
                let envs = svc.list_environments(&req.scope.scope_id)?;
                let mine = envs
                    .iter()
                    .rev()
                    .find(|e| e.state == EnvironmentState::Running && permit(&who, e, Use::Run).is_ok());
                Some(mine.map(|e| e.environment_id.clone()).ok_or_else(run_refused)?)
            }
        };
        let p = svc.start_process(&req.scope.scope_id, env_id.as_deref(), &req.body.command)?;
        Ok(Json(proc_json(&p)))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct CheckParams {
    process_id: String,
    tail_bytes: Option<u64>,
}

async fn check_process(State(st): State<AppState>, req: SignedRequest<CheckParams>) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let (p, tail) = svc.check_process(&req.scope.scope_id, &req.body.process_id, req.body.tail_bytes)?;
        let mut v = proc_json(&p);
        v["log_tail"] = json!(tail.text);
        v["log_bytes"] = json!(tail.log_bytes);
        v["log_truncated"] = json!(tail.truncated);
        Ok(Json(v))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct ProcParams {
    process_id: String,
}

async fn stop_process(State(st): State<AppState>, req: SignedRequest<ProcParams>) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let process = svc.registry.process(&svc.deployment, &req.scope.scope_id, &req.body.process_id);
        if let Some(p) = process.map_err(|e| ApiError::from(ServiceError::Registry(e)))? {
            permit_id(&svc, &req, &p.environment_id, Use::End)?;
        }
        Ok(Json(proc_json(&svc.stop_process(&req.scope.scope_id, &req.body.process_id)?)))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct ListProcParams {
    environment_id: Option<String>,
}

async fn list_processes(
    State(st): State<AppState>,
    req: SignedRequest<ListProcParams>,
) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || {
        let list = svc.list_processes(&req.scope.scope_id, req.body.environment_id.as_deref())?;
        Ok(Json(json!({ "processes": list.iter().map(proc_json).collect::<Vec<_>>() })))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use scopefs::ids::ScopeId;

    fn env(user: &str, thread: &str, read_only: bool) -> EnvironmentRecord {
        EnvironmentRecord {
            environment_id: "env_1".into(),
            scope_id: ScopeId::generate(),
            owner_id: format!("owner-of-{thread}"),
            user_id: user.into(),
            thread_id: thread.into(),
            container_id: None,
            read_only,
            state: EnvironmentState::Running,
            revision: 1,
            requested_max_runtime_seconds: None,
            effective_max_runtime_seconds: 60,
            created_at: 0,
            started_at: Some(0),
            ended_at: None,
            runtime_seconds: None,
            end_reason: None,
        }
    }

    fn who(user: &str, thread: &str, may_write: bool) -> Who {
        Who { user_id: user.into(), thread_id: thread.into(), may_write }
    }

    fn code(r: Result<(), ApiError>) -> Option<(u16, &'static str)> {
        r.err().map(|e| (e.status.as_u16(), e.code))
    }

    /// Review M4: a memory worker (may not write) runs only in read-only environments it created;
    /// ending an environment or its processes is for the creating thread only.
    #[test]
    fn read_only_callers_use_only_their_read_only_environments() {
        let primary = who("u1", "thr-a", true);
        let worker = who("u1", "mw-1", false);
        let primary_rw = env("u1", "thr-a", false);
        let worker_ro = env("u1", "mw-1", true);
        let worker_rw = env("u1", "mw-1", false);
        assert_eq!(code(permit(&worker, &primary_rw, Use::Run)), Some((403, "read_only")));
        assert_eq!(code(permit(&worker, &worker_rw, Use::Run)), Some((403, "read_only")));
        assert_eq!(code(permit(&worker, &env("u1", "thr-a", true), Use::Run)), Some((403, "read_only")));
        assert_eq!(code(permit(&worker, &worker_ro, Use::Run)), None);
        assert_eq!(code(permit(&primary, &primary_rw, Use::Run)), None);
        assert_eq!(code(permit(&primary, &worker_ro, Use::Run)), None, "a writer may run anywhere in its scope");

        assert_eq!(code(permit(&worker, &primary_rw, Use::End)), Some((403, "not_owner")));
        assert_eq!(code(permit(&primary, &worker_ro, Use::End)), Some((403, "not_owner")));
        assert_eq!(code(permit(&who("u2", "thr-a", true), &primary_rw, Use::End)), Some((403, "not_owner")));
        assert_eq!(code(permit(&worker, &worker_ro, Use::End)), None);
        assert_eq!(code(permit(&primary, &primary_rw, Use::End)), None);
    }

    /// Review L12: another user's environment is listed without its identities.
    #[test]
    fn other_users_identities_are_not_listed() {
        let mine = env_view(&env("u1", "thr-a", false), &who("u1", "thr-b", true));
        assert_eq!((mine["user_id"].as_str(), mine["thread_id"].as_str()), (Some("u1"), Some("thr-a")));
        let theirs = env_view(&env("u2", "thr-x", false), &who("u1", "thr-a", true));
        for k in ["user_id", "thread_id", "owner_id"] {
            assert!(theirs.get(k).is_none(), "{k} leaked: {theirs}");
        }
        assert_eq!((theirs["environment_id"].as_str(), theirs["status"].as_str()), (Some("env_1"), Some("running")));
    }
}
