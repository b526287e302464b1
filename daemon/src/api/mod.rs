//! The HTTP API (axum): routes, service-token authentication and JSON shapes; work runs on blocking threads.

mod error;
pub mod routes;
mod workspace;

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use scopefs::engine::Usage;
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::{ScopeRecord, ScopeState};
use serde::{Deserialize, Serialize};

pub use error::ApiError;
use routes::{Auth, RouteTable};

use crate::service::{ScopeService, ServiceError};
use crate::tokens::Token;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub service: Arc<ScopeService>,
    pub service_token: Arc<Token>,
}

/// Every route of the API (the single source of the router, `/openapi.json` and the auth tests).
pub fn route_table() -> RouteTable<AppState> {
    RouteTable::new()
        .add("GET", "/health", Auth::Public, "Liveness", get(health))
        .add("GET", "/ready", Auth::Public, "Readiness: mounts and recovery done", get(ready))
        .add("GET", "/openapi.json", Auth::Public, "This document", get(openapi_json))
        .add(
            "POST",
            "/internal/workspace-scopes/provision",
            Auth::Service,
            "Create (or return) the scope of a primary thread; idempotent on operation_id",
            post(provision),
        )
        .add(
            "GET",
            "/internal/workspace-scopes/by-thread/{thread_id}",
            Auth::Service,
            "The scope record of a primary thread",
            get(by_thread),
        )
        .add(
            "GET",
            "/internal/workspace-scopes/{scope_id}/mount",
            Auth::Service,
            "Host mountpoint of a scope for an external orchestrator (mounts if needed)",
            get(mount),
        )
        .merge_from(workspace::add_routes)
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let (groups, _) = route_table().into_groups();
    let mut app = Router::new();
    for (auth, group) in groups.into_iter().filter(|(_, g)| g.has_routes()) {
        let group = match auth {
            Auth::Public => group,
            Auth::Service => group.route_layer(middleware::from_fn_with_state(state.clone(), require_service_token)),
            // No admin or signed route exists yet: refuse until their checks are wired in.
            Auth::Admin | Auth::Signed => group.route_layer(middleware::from_fn(refuse_unauthenticated)),
        };
        app = app.merge(group);
    }
    app.fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(state)
}

async fn refuse_unauthenticated(_req: Request, _next: Next) -> Response {
    ApiError::unauthorized().into_response()
}

async fn openapi_json() -> Json<serde_json::Value> {
    Json(routes::openapi(&route_table().specs))
}

/// Runs synchronous engine/registry work on a blocking thread.
async fn blocking<T, F>(f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ServiceError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(join) => Err(ApiError::internal("task_failed", &join)),
    }
}

/// `/internal/*`: `Authorization: Bearer <service token>` (constant-time compare), and only once ready.
async fn require_service_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let presented =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if !presented.is_some_and(|t| st.service_token.matches(t.trim())) {
        return ApiError::unauthorized().into_response();
    }
    if !st.service.is_ready() {
        return ApiError::not_ready().into_response();
    }
    next.run(req).await
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn ready(State(st): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    if st.service.is_ready() {
        Ok(Json(serde_json::json!({ "status": "ready" })))
    } else {
        Err(ApiError::not_ready())
    }
}

#[derive(Debug, Deserialize)]
struct ProvisionRequest {
    operation_id: String,
    primary_thread_id: String,
}

/// A scope as the API shows it (no physical paths).
#[derive(Debug, Serialize)]
struct ScopeView {
    scope_id: ScopeId,
    primary_thread_id: ThreadId,
    state: ScopeState,
    revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
}

impl ScopeView {
    fn of(rec: ScopeRecord) -> ScopeView {
        ScopeView {
            scope_id: rec.scope_id,
            primary_thread_id: rec.primary_thread_id,
            state: rec.state,
            revision: rec.revision,
            usage: None,
            created: None,
        }
    }
}

async fn provision(
    State(st): State<AppState>,
    body: Result<Json<ProvisionRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<ScopeView>), ApiError> {
    let Json(req) = body?;
    let thread = ThreadId::parse(&req.primary_thread_id)?;
    let service = st.service.clone();
    let (rec, created) = blocking(move || service.provision(&req.operation_id, &thread)).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(ScopeView { created: Some(created), ..ScopeView::of(rec) })))
}

async fn by_thread(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ScopeView>, ApiError> {
    let Path(raw) = path?;
    let thread = ThreadId::parse(&raw)?;
    let service = st.service.clone();
    let status = blocking(move || service.by_thread(&thread)).await?;
    let status =
        status.ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "scope_not_found", "no scope for this thread"))?;
    Ok(Json(ScopeView { usage: Some(status.usage), ..ScopeView::of(status.record) }))
}

#[derive(Debug, Serialize)]
struct MountView {
    scope_id: ScopeId,
    mountpoint: String,
}

/// The one route that returns a host path: for the orchestrator that bind-mounts it into a container.
async fn mount(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<MountView>, ApiError> {
    let Path(raw) = path?;
    let scope = ScopeId::parse(&raw)?;
    let service = st.service.clone();
    let (rec, mountpoint) = blocking(move || service.mount(&scope)).await?;
    let mountpoint = mountpoint
        .into_os_string()
        .into_string()
        .map_err(|_| ApiError::internal("mount_failed", &"mountpoint is not valid UTF-8"))?;
    Ok(Json(MountView { scope_id: rec.scope_id, mountpoint }))
}
