//! `/tools/*` compute routes (seed 003 §4.5–4.7, seed 000 §9.6): environments, commands and
//! background processes of the scope the signed thread acts in. Thin handlers: parse, one
//! `ScopeService` call on a blocking thread, map the result (errors in `api::error`).
//!
//! Ids of another scope's environments and processes answer 404 exactly like unknown ids; there
//! is no listing across scopes. Without a reachable engine every route answers 503
//! `compute_unavailable` and nothing runs — on the host or anywhere else.

use axum::extract::State;
use axum::routing::post;
use axum::Json;
use scopefs::registry::environments::{EnvironmentRecord, ProcessRecord};
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::routes::{Auth, RouteTable};
use super::super::{ApiError, AppState};
use super::auth::{run_tool, SignedRequest};
use crate::executor::{Caller, CreateEnvironment};

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
        let (env, ended_now) = svc.destroy_environment(&req.scope.scope_id, &req.body.environment_id)?;
        let mut v = env_json(&env);
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
        Ok(Json(json!({ "environments": envs.iter().map(env_json).collect::<Vec<_>>() })))
    })
    .await
}

async fn get_environment_status(
    State(st): State<AppState>,
    req: SignedRequest<EnvParams>,
) -> Result<Json<Value>, ApiError> {
    let svc = st.service.clone();
    run_tool(move || Ok(Json(env_json(&svc.environment_status(&req.scope.scope_id, &req.body.environment_id)?)))).await
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
        let p = svc.start_process(&req.scope.scope_id, req.body.environment_id.as_deref(), &req.body.command)?;
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
    run_tool(move || Ok(Json(proc_json(&svc.stop_process(&req.scope.scope_id, &req.body.process_id)?)))).await
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
