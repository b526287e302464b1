//! The HTTP API (axum): routes, service-token authentication and JSON shapes; work runs on blocking threads.

mod admin;
pub mod admin_ui;
mod artifacts;
mod error;
mod extract;
mod forks;
pub mod forward;
mod held_answer;
mod internal;
pub mod openapi;
pub mod routes;
mod tools;
mod unread_body;
mod workspace;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

pub use error::ApiError;
use error::ErrorCode;
use routes::{Auth, Doc, RouteTable};
use scopefs::engine::FileKind;
pub use tools::{SignedRequest, ToolsAuth};

use crate::pools::RouteClass;
use crate::services::{ComputeService, Scopes, ServiceError, WorkspaceFiles};
use crate::tokens::Token;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub scopes: Arc<Scopes>,
    pub files: Arc<WorkspaceFiles>,
    pub compute: Arc<ComputeService>,
    pub service_token: Arc<Token>,
    /// Secret, window and limits of the signed `/tools/*` routes.
    pub tools: Arc<ToolsAuth>,
    /// `X-Admin-Token` of the `/admin/*` routes.
    pub admin_token: Arc<Token>,
    /// Live sessions of the admin page (`/admin/ui`), got by posting the admin token.
    pub admin_sessions: Arc<admin_ui::Sessions>,
    /// Accounts, usage and pricing (SPEC §9).
    pub billing: Arc<crate::billing_loop::BillingService>,
    /// With several nodes: this node, and where each scope is served (`forward`).
    pub cluster: Option<Arc<crate::services::cluster::Cluster>>,
}

/// Bytes one streamed `/api` download or upload holds outside every budget: its chunks in the
/// channel, the one being filled and the one the connection is sending (upload pieces are at most
/// `http::CONNECTION_BUFFER_BYTES`), and the engine's buffer an upload is written through.
pub fn stream_buffer_bytes() -> u64 {
    workspace::stream_buffer_bytes()
}

/// Most bytes of a file one `/tools` request moves (the tools file limit of `cfg`).
pub fn tools_file_limit(cfg: &scopefs::config::Config) -> u64 {
    tools::file_limit(cfg.max_upload_bytes)
}

/// Most bytes a command's worker holds while it builds an `execute_command` answer: stdout and
/// stderr of `executor.max_output_bytes` each, as text (an invalid byte becomes three) and as
/// JSON (a control byte escapes to six).
pub fn exec_output_bytes(cfg: &scopefs::config::Config) -> u64 {
    2 * cfg.executor.max_output_bytes * (1 + 3 + 6)
}

/// Every route of the API (the single source of the router, `/openapi.json` and the auth tests).
pub fn route_table() -> RouteTable<AppState> {
    RouteTable::new()
        .add("GET", "/health", Auth::Public, "Liveness", get(health))
        .doc(Doc::new().ok::<StatusView>(200))
        .add("GET", "/ready", Auth::Public, "Readiness: mounts and recovery done", get(ready))
        .doc(Doc::new().ok::<StatusView>(200).errors(&[ErrorCode::NotReady]))
        .add("GET", "/openapi.json", Auth::Public, "This document", get(openapi_json))
        .doc(Doc::new().ok::<serde_json::Value>(200))
        .add("GET", "/metrics", Auth::Service, "Prometheus metrics (counts and ids only)", get(metrics))
        .doc(Doc::new().ok_media(200, "text/plain").errors(&[ErrorCode::RegistryError]))
        .merge_from(internal::add_routes)
        .merge_from(forks::add_routes)
        .merge_from(workspace::add_routes)
        .merge_from(tools::add_routes)
        .merge_from(admin::add_routes)
        .merge_from(admin_ui::add_routes)
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let (groups, _) = route_table().into_groups();
    let mut app = Router::new();
    for (auth, group) in groups.into_iter().filter(|(_, g)| g.has_routes()) {
        let group = match auth {
            Auth::Public => group,
            // Authenticated first, then forwarded to the node that serves the scope (if another).
            Auth::Service => group
                .route_layer(middleware::from_fn_with_state(state.clone(), forward::to_owner))
                .route_layer(middleware::from_fn_with_state(state.clone(), require_service_token)),
            // Every signed route verifies its request in the `SignedRequest` extractor.
            Auth::Signed => group,
            Auth::Admin => group.route_layer(middleware::from_fn_with_state(state.clone(), require_admin_token)),
            // No session cookie (or an expired one): redirected to the login form.
            Auth::AdminSession => {
                group.route_layer(middleware::from_fn_with_state(state.clone(), admin_ui::require_session))
            }
        };
        app = app.merge(group);
    }
    app.fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(middleware::from_fn(unread_body::drain_unread_body))
        .layer(deadline_layer(Duration::from_secs(state.tools.limits.http_request_timeout_secs)))
        .with_state(state)
}

/// Routes bounded by their own, larger limits (`executor.command_timeout_secs`, upload and import
/// sizes and body timeouts), which `limits.http_request_timeout_secs` does not cut.
const LONG_ROUTES: [&str; 4] =
    ["/tools/execute_command", "/tools/upload_file", "/api/workspace/upload", "/api/workspace/import"];

/// A boxed middleware future.
type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>;

/// The [`request_deadline`] layer with its limit.
fn deadline_layer(
    limit: Duration,
) -> axum::middleware::FromFnLayer<impl Fn(Request, Next) -> Answer + Clone, (), (Request,)> {
    middleware::from_fn(move |req: Request, next: Next| Box::pin(request_deadline(limit, req, next)) as Answer)
}

/// Review L12: a request not answered within `limits.http_request_timeout_secs` is cancelled (its
/// future dropped; blocking work already started finishes in its bounded pool) and answered 503
/// `request_timeout`.
async fn request_deadline(limit: Duration, req: Request, next: Next) -> Response {
    if LONG_ROUTES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "request_timeout",
            "the request took longer than the server allows; retry later",
        )
        .into_response(),
    }
}

/// `/admin/*`: `X-Admin-Token: <admin token>` (constant-time compare).
async fn require_admin_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let presented = req.headers().get("x-admin-token").and_then(|v| v.to_str().ok());
    if !presented.is_some_and(|t| st.admin_token.matches(t.trim())) {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

async fn openapi_json() -> Json<serde_json::Value> {
    Json(routes::openapi(&route_table().specs))
}

/// Runs a handler's blocking service work on the bounded pool of its route `class` (never on
/// tokio's shared blocking pool, see `crate::pools`). `f`'s error becomes an [`ApiError`] through
/// its `From` impl (`ServiceError`, `BillingError`, or an `ApiError` already mapped by the caller);
/// a task that panicked is 500 `task_failed`.
pub(crate) async fn blocking<T, E, F>(class: RouteClass, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    match crate::pools::spawn(class, f).await {
        Ok(result) => result.map_err(Into::into),
        Err(join) => Err(ApiError::internal("task_failed", &join)),
    }
}

/// [`blocking`] within `share`'s part of the class (see `crate::pools`): a scope or user past its
/// share waits for its own earlier work, holding no worker.
pub(crate) async fn blocking_as<T, E, F>(class: RouteClass, share: crate::pools::Share, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    match crate::pools::spawn_as(class, share, f).await {
        Ok(result) => result.map_err(Into::into),
        Err(join) => Err(ApiError::internal("task_failed", &join)),
    }
}

/// The name of a file kind in API answers: [`FileKind::as_str`], with `directory`, `char_device`
/// and `block_device` spelled out (the one map for `/api/workspace` and the file tools).
pub(crate) fn file_kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Dir => "directory",
        FileKind::CharDevice => "char_device",
        FileKind::BlockDevice => "block_device",
        other => other.as_str(),
    }
}

/// `/internal/*`: `Authorization: Bearer <service token>` (constant-time compare), and only once ready.
async fn require_service_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let presented =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if !presented.is_some_and(|t| st.service_token.matches(t.trim())) {
        return ApiError::unauthorized().into_response();
    }
    if !st.scopes.is_ready() {
        return ApiError::not_ready().into_response();
    }
    next.run(req).await
}

/// The answer of `/health` (`ok`) and `/ready` (`ready`).
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
struct StatusView {
    status: &'static str,
}

async fn health() -> Json<StatusView> {
    Json(StatusView { status: "ok" })
}

async fn ready(State(st): State<AppState>) -> Result<Json<StatusView>, ApiError> {
    if st.scopes.is_ready() {
        Ok(Json(StatusView { status: "ready" }))
    } else {
        Err(ApiError::not_ready())
    }
}

/// `GET /metrics` (service token: counts and ids, no secrets, but every scope's id and size).
async fn metrics(State(st): State<AppState>) -> Result<Response, ApiError> {
    let text = blocking(RouteClass::Internal, move || {
        let open = st.scopes.open_scopes();
        crate::metrics::render(st.scopes.registry(), &open.engines(), open.storage()).map_err(ServiceError::Registry)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    use super::*;

    /// Review L12: a request not answered within the limit is cancelled with 503
    /// `request_timeout`; the long routes (their own limits) are not cut.
    #[tokio::test]
    async fn a_request_past_its_deadline_is_cancelled_and_long_routes_are_exempt() {
        use std::sync::atomic::{AtomicBool, Ordering};
        struct SetOnDrop(Arc<AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = dropped.clone();
        let never = move || {
            let guard = SetOnDrop(flag.clone());
            async move {
                // Resolves never; dropping it (the cancellation) drops the guard.
                let _cancelled_with_the_request = guard;
                std::future::pending::<()>().await;
            }
        };
        let late = || async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            "late but allowed"
        };
        let app: Router = Router::new()
            .route("/api/never", get(never))
            .route("/tools/execute_command", get(late))
            .layer(deadline_layer(Duration::from_secs(1)));
        let call = |path: &str| app.clone().oneshot(Request::get(path).body(Body::empty()).unwrap());
        let resp = call("/api/never").await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(dropped.load(Ordering::SeqCst), "the handler's future was dropped");
        let resp = call("/tools/execute_command").await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}
