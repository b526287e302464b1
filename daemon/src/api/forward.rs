//! Several nodes (issue 23 item 3): a request for a scope another node serves is forwarded to that
//! node, as it came (method, path, query, headers, body streamed both ways), and its answer is
//! returned as it goes; the other node authenticates it again. Which node: `services::cluster`
//! (`Cluster::route`). Scopes named in the path (`/internal/workspace-scopes/{scope_id}...`,
//! `.../by-thread/{thread_id}`) or by the `threadId` of `/api/workspace*` are routed here, before
//! the handler; a provision goes to the node placement chooses (or the one serving the thread);
//! signed `/tools/*` requests are routed by their `SignedRequest` extractor, after the signature
//! is checked and before the nonce is spent. A forwarded request carries `X-Scopefs-Forwarded-By`
//! and is never forwarded again (a node that does not serve it answers 503 `scope_moving`).

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use scopefs::ids::{ScopeId, ThreadId};

use super::{ApiError, AppState};
use crate::services::cluster::{Cluster, Route};
use crate::services::ServiceError;

/// Set on a forwarded request (the forwarding node's id).
pub const FORWARDED_BY: &str = "x-scopefs-forwarded-by";
/// Largest provision body read to find its thread.
const PROVISION_BODY_MAX: usize = 64 * 1024;
/// Connecting to the other node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [HeaderName; 6] =
    [header::CONNECTION, header::HOST, header::TE, header::TRAILER, header::TRANSFER_ENCODING, header::UPGRADE];

/// What a request names, for routing.
enum Target {
    Scope(ScopeId),
    Thread(ThreadId),
    Provision,
}

fn target_of(req: &Request) -> Option<Target> {
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/internal/workspace-scopes/") {
        if let Some(thread) = rest.strip_prefix("by-thread/") {
            return ThreadId::parse(thread.split('/').next()?).ok().map(Target::Thread);
        }
        if rest == "provision" {
            return (req.method() == Method::POST).then_some(Target::Provision);
        }
        return ScopeId::parse(rest.split('/').next()?).ok().map(Target::Scope);
    }
    if path == "/api/workspace" || path.starts_with("/api/workspace/") {
        let query = req.uri().query()?;
        // The WebUI's name (`threadId`), and the snake_case one.
        let thread =
            query.split('&').find_map(|kv| kv.strip_prefix("threadId=").or_else(|| kv.strip_prefix("thread_id=")))?;
        let thread = percent_encoding::percent_decode_str(thread).decode_utf8().ok()?;
        return ThreadId::parse(&thread).ok().map(Target::Thread);
    }
    None
}

/// The middleware of the service-token routes (after authentication).
pub async fn to_owner(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(cluster) = st.cluster.clone() else { return next.run(req).await };
    if req.headers().contains_key(FORWARDED_BY) {
        return next.run(req).await;
    }
    let Some(target) = target_of(&req) else { return next.run(req).await };
    let (req, route) = match target {
        Target::Provision => {
            let (parts, body) = req.into_parts();
            let bytes = match axum::body::to_bytes(body, PROVISION_BODY_MAX).await {
                Ok(b) => b,
                Err(_) => return ApiError::too_large().into_response(),
            };
            let thread = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("primary_thread_id")?.as_str().map(str::to_owned))
                .and_then(|t| ThreadId::parse(&t).ok());
            let route = blocking(cluster.clone(), move |c| match thread {
                Some(t) => route_thread(c, &t, true),
                None => Ok(Route::Local),
            })
            .await;
            (Request::from_parts(parts, Body::from(bytes)), route)
        }
        Target::Scope(id) => (req, blocking(cluster.clone(), move |c| c.route(&id)).await),
        Target::Thread(t) => (req, blocking(cluster.clone(), move |c| route_thread(c, &t, false)).await),
    };
    match route {
        Ok(Route::Local) => next.run(req).await,
        Ok(Route::Forward(address)) => proxy(&address, cluster.node_id(), req).await,
        Ok(Route::Moving) => moving(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// A thread's scope's route; a thread without a scope goes where a new scope would (`new`) or
/// stays here (the handler answers 404).
pub fn route_thread(c: &Cluster, thread: &ThreadId, new: bool) -> Result<Route, ServiceError> {
    match c.scope_of_thread(thread)? {
        Some(scope) => c.route(&scope),
        None if new => c.route_new(),
        None => Ok(Route::Local),
    }
}

async fn blocking<T: Send + 'static>(
    cluster: std::sync::Arc<Cluster>,
    f: impl FnOnce(&Cluster) -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, ServiceError> {
    match tokio::task::spawn_blocking(move || f(&cluster)).await {
        Ok(r) => r,
        Err(_) => Err(ServiceError::ServedElsewhere),
    }
}

/// 503 `scope_moving` with `Retry-After: 1`.
pub fn moving() -> Response {
    let mut resp = ApiError::from(ServiceError::ServedElsewhere).into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    resp
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .unwrap_or_default()
    })
}

/// Forwards `req` (body streamed) to the node at `address`.
pub async fn proxy(address: &str, node: &str, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    send(address, node, parts.method, &path, &parts.headers, body).await
}

/// Forwards a request whose body was read already.
pub async fn proxy_bytes(
    address: &str,
    node: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    send(address, node, method, path, headers, reqwest::Body::from(body)).await
}

async fn send(
    address: &str,
    node: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: reqwest::Body,
) -> Response {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        if !HOP_BY_HOP.contains(name) {
            out.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = header::HeaderValue::from_str(node) {
        out.insert(FORWARDED_BY, v);
    }
    let sent = client().request(method, format!("{address}{path}")).headers(out).body(body).send().await;
    let answer = match sent {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "forwarding a request to the node serving its scope failed");
            return moving();
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut headers = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(name) && name != header::CONTENT_LENGTH {
            headers.append(name.clone(), value.clone());
        }
    }
    let stream = answer.bytes_stream().map(|chunk| chunk.map_err(std::io::Error::other));
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}
