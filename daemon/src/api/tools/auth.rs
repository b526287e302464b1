//! Authentication of `/tools/*`: the [`SignedRequest`] extractor (HMAC `auth_context`, time window,
//! single-use nonce, scope of `auth_context.thread_id`) and the settings it needs ([`ToolsAuth`]).
//!
//! Order of checks, and the answers:
//! 1. not ready → 503 `not_ready`; a declared `Content-Length` over the body limit → 413
//!    `too_large` at once, nothing read; then the body is read only under one of
//!    `[limits] tools_max_unauthenticated_bodies` permits (held until the signature is checked): a
//!    request that finds none free within `http_header_timeout_secs` is refused with 503 `busy`
//!    (waiting briefly smooths bursts; refusing beyond keeps memory bounded: the client retries),
//!    and, before that permit, a charge of [`VERIFY_COPIES`] times its declared length (the body
//!    limit when none is declared) from `[limits] tools_body_memory_bytes`, waited for the same
//!    way (503 `busy`; room is not handed out in arrival order, so a small body is not queued
//!    behind large ones), cut to that many times the bytes read once the body has arrived, to the
//!    bytes read once it is verified (its parsed parameters), and held until the request is
//!    answered (a verified body waiting for its worker included);
//!    the body must arrive within `http_request_timeout_secs` (else 408 `body_timeout`); a body
//!    over the limit → 413 `too_large`; a body whose first byte does not open an object, or not
//!    JSON → 400 `invalid_json`; more than `tools_max_json_values` values → 413 `too_large`,
//!    deeper than `tools_max_json_depth` → 400 `invalid_json` (both refused during the parse,
//!    before more is built);
//! 2. `auth_context` missing/malformed → 401 `invalid_auth_context`; wrong signature (for this
//!    METHOD and PATH, query excluded) → 401 `invalid_signature`;
//! 3. `issued_at` more than `signature_window_secs` from now (registry clock) → 401 `signature_expired`;
//! 4. the rest of the body does not fit the route's parameters → 400 `invalid_request`;
//!    `thread_id`/`user_id` missing or malformed → 400 `invalid_thread_id` / `invalid_auth_context`;
//! 5. nonce seen before (kept in the registry until its window has passed) → 401 `nonce_replayed`;
//! 6. the thread is neither a scope's primary thread nor a live thread owner (async_thread,
//!    memory_worker, cron; `reserved` or `active`) → 404 `scope_not_found` (a thread without a
//!    workspace is a missing resource, not an ownership question: nothing else is requested yet);
//!    its scope is being deleted → 409 `scope_deleting`.
//!
//! Nothing here logs the body, the token or the secret.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use futures_util::StreamExt;
use scopefs::config::PeerViews;
use scopefs::engine::ScopeEngine;
use scopefs::ids::ThreadId;
use scopefs::limits::{self, Bound, LimitsConfig};
use scopefs::registry::nonces::ThreadRole;
use scopefs::registry::{OwnerType, ScopeRecord};
use scopefs::signing::{self, SigningError};
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Copies of a body in memory while it is verified: the bytes read, their parse and the canonical
/// form that is signed (the charge until the signature is checked).
pub const VERIFY_COPIES: u64 = 3;

/// Longest `auth_context.user_id` (the registry stores it with each scope it owns).
const MAX_USER_ID: usize = 256;

use super::super::held_answer::HeldAnswer;
use super::super::{ApiError, AppState};
use super::body_memory::{BodyCharge, BodyMemory, NoRoom};
use super::object_scope::{ObjectScope, Signer};
use crate::tokens::Token;

/// Largest file content the file tools move in one request (seed 003 §6: `max_input_bytes`), and
/// never more than the configured `max_upload_bytes`.
pub const TOOL_FILE_LIMIT: u64 = 10 * 1024 * 1024;

/// Most bytes of a file one `/tools` request moves under `max_upload_bytes`.
pub fn file_limit(max_upload_bytes: u64) -> u64 {
    TOOL_FILE_LIMIT.min(max_upload_bytes)
}

/// The signing settings of the `/tools/*` routes.
#[derive(Debug)]
pub struct ToolsAuth {
    secret: Token,
    window_secs: u64,
    /// Largest file content of one request (see [`TOOL_FILE_LIMIT`]).
    pub file_limit: u64,
    /// `[limits]` of the configuration (bodies, JSON budget, patterns, walks).
    pub limits: LimitsConfig,
    /// Permits for bodies read and verified before authentication (`tools_max_unauthenticated_bodies`).
    unauthenticated: Arc<Semaphore>,
    /// Bytes of bodies held from their first byte until answered (`tools_body_memory_bytes`).
    body_memory: Arc<BodyMemory>,
    /// Who reaches `/threads/{id}` and `/__global__` (`peer_views`; `target.rs`).
    pub peer_views: PeerViews,
}

impl ToolsAuth {
    pub fn new(secret: Token, window_secs: u64, max_upload_bytes: u64) -> ToolsAuth {
        ToolsAuth {
            secret,
            window_secs,
            file_limit: file_limit(max_upload_bytes),
            unauthenticated: Arc::new(Semaphore::new(LimitsConfig::default().tools_max_unauthenticated_bodies)),
            body_memory: {
                let l = LimitsConfig::default();
                BodyMemory::new(l.tools_body_memory_bytes, l.tools_body_memory_per_user_bytes)
            },
            limits: LimitsConfig::default(),
            peer_views: PeerViews::default(),
        }
    }

    /// The same settings with `peer_views` as configured.
    pub fn with_peer_views(mut self, peer_views: PeerViews) -> ToolsAuth {
        self.peer_views = peer_views;
        self
    }

    /// The same settings under the configured `[limits]`.
    pub fn with_limits(mut self, limits: &LimitsConfig) -> ToolsAuth {
        self.unauthenticated = Arc::new(Semaphore::new(limits.tools_max_unauthenticated_bodies));
        self.body_memory = BodyMemory::new(limits.tools_body_memory_bytes, limits.tools_body_memory_per_user_bytes);
        self.limits = limits.clone();
        self
    }

    /// Largest request body: base64 of the file limit plus room for the other fields.
    pub fn max_body_bytes(&self) -> usize {
        usize::try_from(self.file_limit / 3 * 4 + 1024 * 1024).unwrap_or(usize::MAX)
    }
}

/// A verified `/tools/*` request and the scope it acts in. Use it as the handler's only extractor:
///
/// ```ignore
/// async fn execute_command(req: SignedRequest<ExecuteParams>) -> Result<Json<Value>, ApiError> { .. }
/// ```
///
/// - `body`: the request body minus `auth_context`, deserialized into `T` (unknown fields are
///   ignored unless `T` says otherwise; a mismatch is 400 `invalid_request`);
/// - `user_id`, `thread_id`: from the signed `auth_context`;
/// - `object_scope`: `auth_context.object_scope` if present (as JSON, covered by the signature);
/// - `grant`: the same, parsed ([`ObjectScope`]: the paths the request may read and write;
///   malformed is 400 `invalid_auth_context`); every file tool checks it, and commands check it
///   with [`super::object_scope::permit_command`];
/// - `scope`: the registry record of the scope (draft or active) the thread acts in;
/// - `role`: `Primary`, or `Owner { owner_id, owner_type }` for a registered thread owner;
/// - `engine`: the scope's open file engine (path API in `scopefs::engine::paths`).
///
/// For the mountpoint (containers) call `Scopes::mount(&req.scope.scope_id)`.
pub struct SignedRequest<T> {
    pub body: T,
    pub user_id: String,
    pub thread_id: ThreadId,
    pub object_scope: Option<serde_json::Value>,
    pub grant: Option<ObjectScope>,
    pub scope: ScopeRecord,
    pub role: ThreadRole,
    pub engine: Arc<ScopeEngine>,
    /// This request's place among its scope's `max_inflight_per_scope` (held until it is answered).
    _inflight: crate::pools::InflightSlot,
    /// Its body's charge of `tools_body_memory_bytes` (held until it is answered).
    _body_memory: BodyCharge,
}

impl<T> SignedRequest<T> {
    /// Who this request's blocking work is for: its scope and its user (`crate::pools::Share`).
    pub fn share(&self) -> crate::pools::Share {
        crate::pools::Share { scope: self.scope.scope_id.to_string(), user: Some(self.user_id.clone()) }
    }

    /// Whether this thread may change files: a memory worker acts read-only (SPEC §8).
    pub fn may_write(&self) -> bool {
        !matches!(self.role, ThreadRole::Owner { owner_type: OwnerType::MemoryWorker, .. })
    }

    /// Whether this request's `object_scope` lets it run a command in an environment whose
    /// `/workspace` is read-only (`read_only`) or writable: 403 `object_scope_denied` unless it
    /// covers what a command can reach (see [`super::object_scope::permit_command`]). For the
    /// compute routes (execute_command, start_process), next to their role checks.
    pub fn permit_command(&self, read_only: bool) -> Result<(), ApiError> {
        super::object_scope::permit_command(self.grant.as_ref(), read_only)
    }
}

impl ToolsAuth {
    /// One of the `tools_max_unauthenticated_bodies` permits to read and verify a body, waiting at
    /// most `http_header_timeout_secs`; none free by then is 503 `busy`.
    async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        let wait = Duration::from_secs(self.limits.http_header_timeout_secs);
        match tokio::time::timeout(wait, self.unauthenticated.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                limits::refuse(Bound::UnauthenticatedBodies);
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "too many unauthenticated request bodies are being read; retry later",
                ))
            }
        }
    }

    /// A charge of `bytes` to `user`'s share, from a blocking worker (an answer about to be
    /// built), waiting as [`Self::charge_body`] does.
    pub fn charge_blocking(&self, user: &str, bytes: u64) -> Result<BodyCharge, ApiError> {
        tokio::runtime::Handle::current().block_on(self.charge_body(Some(user), bytes))
    }

    /// `value` as `user`'s JSON answer built on a blocking worker, then charged its bytes (waiting
    /// on the worker, so answers waiting for room are bounded by the workers) and held under the
    /// charge until the client has taken it. For answers whose bytes are bounded where they are
    /// built.
    pub fn held_json<T: serde::Serialize>(&self, user: &str, value: &T) -> Result<HeldAnswer, ApiError> {
        let bytes = serde_json::to_vec(value).map_err(|e| ApiError::internal("answer_not_serialized", &e))?;
        let charge = self.charge_blocking(user, bytes.len() as u64)?;
        Ok(HeldAnswer::new(bytes, charge))
    }

    /// A charge of `bytes` (at most the whole budget, or `holder`'s share) against
    /// `tools_body_memory_bytes`, waiting at most `http_header_timeout_secs`; no room by then is
    /// 429 `user_busy` when the holder's share was what lacked, else 503 `busy`.
    async fn charge_body(&self, holder: Option<&str>, bytes: u64) -> Result<BodyCharge, ApiError> {
        let wait = Duration::from_secs(self.limits.http_header_timeout_secs);
        match self.body_memory.charge(holder, bytes, wait).await {
            Ok(charge) => Ok(charge),
            Err(NoRoom::Share) => {
                limits::refuse(Bound::ToolsBodyMemoryPerUser);
                Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "user_busy",
                    "this user's answers already hold their share of memory; read them, then retry",
                ))
            }
            Err(NoRoom::Budget) => {
                limits::refuse(Bound::ToolsBodyMemory);
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "too many request bodies are held in memory; retry later",
                ))
            }
        }
    }
}

/// The declared `Content-Length`, if any.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
}

/// A declared `Content-Length` over `limit`: refused before anything is read.
fn declared_too_large(headers: &HeaderMap, limit: usize) -> bool {
    declared_length(headers).is_some_and(|n| n > limit as u64)
}

/// Reads a body of at most `limit` bytes; more is 413.
async fn read_body(req: Request, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut stream = req.into_body().into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", "the request body could not be read")
        })?;
        if out.len() + chunk.len() > limit {
            limits::refuse(Bound::BodyBytes);
            return Err(ApiError::too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// With several nodes: `Elsewhere` when another node serves `thread`'s scope (the request goes
/// there, its nonce unspent), 503 `scope_moving` while it moves, `None` when this node serves it.
fn served_elsewhere<S>(
    cluster: Option<&crate::services::cluster::Cluster>,
    thread: &ThreadId,
) -> Result<Option<Verdict<S>>, ApiError> {
    use crate::services::cluster::Route;
    let Some(cluster) = cluster else { return Ok(None) };
    match super::super::forward::route_thread(cluster, thread, false)? {
        Route::Local => Ok(None),
        Route::Forward(address) => Ok(Some(Verdict::Elsewhere { address, node: cluster.node_id().to_string() })),
        Route::Moving => Err(crate::services::ServiceError::ServedElsewhere.into()),
    }
}

/// What the blocking part of verification returns.
struct Verified<T> {
    ctx: signing::AuthContext,
    body: T,
}

fn verify_body<T: DeserializeOwned>(
    auth: &ToolsAuth,
    method: &str,
    path: &str,
    bytes: &[u8],
    now_secs: i64,
) -> Result<Verified<T>, ApiError> {
    let budget = signing::JsonBudget::from_limits(&auth.limits);
    let ctx = signing::verify_with(auth.secret.expose().as_bytes(), method, path, bytes, budget)?;
    signing::check_window(ctx.issued_at, now_secs, auth.window_secs)?;
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", "body is not valid JSON"))?;
    if let Some(obj) = value.as_object_mut() {
        obj.remove("auth_context");
    }
    let body = serde_json::from_value(value)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", format!("invalid parameters: {e}")))?;
    Ok(Verified { ctx, body })
}

/// A verified request: this node serves its scope, or the node at `address` does (several nodes).
enum Verdict<S> {
    Here(S),
    Elsewhere { address: String, node: String },
}

impl<T: DeserializeOwned + Send + 'static> FromRequest<AppState> for SignedRequest<T> {
    type Rejection = axum::response::Response;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, axum::response::Response> {
        use axum::response::IntoResponse;
        let method = req.method().clone();
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let headers = req.headers().clone();
        let (verdict, raw) = Self::verify(req, st).await.map_err(IntoResponse::into_response)?;
        match verdict {
            Verdict::Here(signed) => Ok(signed),
            // The other node verifies it again and spends its nonce.
            Verdict::Elsewhere { address, node } => Err(super::super::forward::proxy_bytes(
                &address,
                &node,
                method,
                &path,
                &headers,
                raw.unwrap_or_default(),
            )
            .await),
        }
    }
}

impl<T: DeserializeOwned + Send + 'static> SignedRequest<T> {
    /// Reads and verifies the request (see the module docs); with several nodes, a request for a
    /// scope another node serves comes back as `Elsewhere` with its body, its nonce unspent.
    async fn verify(req: Request, st: &AppState) -> Result<(Verdict<Self>, Option<bytes::Bytes>), ApiError> {
        if !st.scopes.is_ready() {
            return Err(ApiError::not_ready());
        }
        let cluster = st.cluster.clone().filter(|_| !req.headers().contains_key(super::super::forward::FORWARDED_BY));
        let method = req.method().as_str().to_owned();
        let path = req.uri().path().to_owned();
        let auth = st.tools.clone();
        let limit = auth.max_body_bytes();
        if declared_too_large(req.headers(), limit) {
            limits::refuse(Bound::BodyBytes);
            return Err(ApiError::too_large());
        }
        // Memory first: a body waiting for room holds no reading permit, so small bodies keep
        // being read while large ones wait (room is not handed out in arrival order).
        let declared = declared_length(req.headers()).unwrap_or(limit as u64);
        let mut body_memory = auth.charge_body(None, declared.saturating_mul(VERIFY_COPIES)).await?;
        let permit = auth.admit().await?;
        let deadline = Duration::from_secs(auth.limits.http_request_timeout_secs);
        let bytes = tokio::time::timeout(deadline, read_body(req, limit)).await.map_err(|_| {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", "the request body did not arrive in time")
        })??;
        body_memory.trim((bytes.len() as u64).saturating_mul(VERIFY_COPIES));
        let bytes = bytes::Bytes::from(bytes);
        let raw = cluster.as_ref().map(|_| bytes.clone()); // to forward it if another node serves it
        let service = st.files.clone();
        let work = move || -> Result<Verdict<SignedRequest<T>>, ApiError> {
            let now_ms = service.now_ms();
            let verified = verify_body::<T>(&auth, &method, &path, &bytes, now_ms.div_euclid(1000));
            body_memory.trim(bytes.len() as u64);
            drop((bytes, permit));
            let Verified { ctx, body } = verified?;
            let thread_id = ThreadId::parse(ctx.thread_id.as_deref().unwrap_or(""))?;
            if let Some(elsewhere) = served_elsewhere(cluster.as_deref(), &thread_id)? {
                return Ok(elsewhere);
            }
            let user_id = ctx.user_id.clone().filter(|u| !u.is_empty() && u.len() <= MAX_USER_ID).ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_auth_context",
                    "auth_context.user_id is required (at most 256 bytes)",
                )
            })?;
            let who = Signer { user_id: &user_id, thread_id: thread_id.as_str() };
            let (object_scope, grant) = parse_object_scope(ctx.object_scope.as_deref(), who)?;
            // Remembered until the request could no longer verify (its window has passed).
            let window_ms = i64::try_from(auth.window_secs).unwrap_or(i64::MAX / 2_000).saturating_mul(1000);
            let expires = ctx.issued_at.saturating_mul(1000).saturating_add(window_ms).saturating_add(1000);
            if !service.consume_nonce(&ctx.nonce, expires).map_err(ApiError::from)? {
                return Err(SigningError::Replayed.into());
            }
            let (binding, engine) = service.tool_scope(&thread_id, &user_id).map_err(ApiError::tools)?;
            let inflight = crate::pools::scope_slot(binding.scope.scope_id.as_str())?;
            Ok(Verdict::Here(SignedRequest {
                body,
                user_id,
                thread_id,
                object_scope,
                grant,
                scope: binding.scope,
                role: binding.role,
                engine,
                _inflight: inflight,
                _body_memory: body_memory,
            }))
        };
        // Not on the /tools class: its workers may all be busy with one tenant's long tools, and
        // checking a signature must not wait for them. The verification is bounded by the
        // admission permit (`tools_max_unauthenticated_bodies`); binding a verified request to its
        // scope (a nonce, a registry lookup) is short, one per connection at most.
        match tokio::task::spawn_blocking(work).await {
            Ok(result) => Ok((result?, raw)),
            Err(join) => Err(ApiError::internal("task_failed", &join)),
        }
    }
}

/// `auth_context.object_scope` as signed (plain JSON text) and as a grant of the request `who`
/// signed; 400 `invalid_auth_context` when it is not plain JSON or not an object scope.
fn parse_object_scope(
    text: Option<&str>,
    who: Signer,
) -> Result<(Option<serde_json::Value>, Option<ObjectScope>), ApiError> {
    let Some(text) = text else { return Ok((None, None)) };
    let value: serde_json::Value = serde_json::from_str(text).map_err(|_| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_auth_context", "object_scope is not plain JSON")
    })?;
    let grant = ObjectScope::parse(&value, who)?;
    Ok((Some(value), Some(grant)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(bodies: usize) -> ToolsAuth {
        let limits = LimitsConfig {
            tools_max_unauthenticated_bodies: bodies,
            http_header_timeout_secs: 1,
            ..LimitsConfig::default()
        };
        ToolsAuth::new(Token::new("secret".into()), 300, 1 << 20).with_limits(&limits)
    }

    #[tokio::test]
    async fn unauthenticated_bodies_are_limited() {
        let auth = auth(2);
        let first = auth.admit().await.expect("a permit");
        let _second = auth.admit().await.expect("a second permit");
        let refused = auth.admit().await.expect_err("no third permit");
        assert_eq!((refused.status, refused.code), (StatusCode::SERVICE_UNAVAILABLE, "busy"));
        drop(first);
        assert!(auth.admit().await.is_ok(), "a released permit is reused");
    }

    #[test]
    fn declared_lengths_over_the_limit_are_refused_unread() {
        let mut h = HeaderMap::new();
        assert!(!declared_too_large(&h, 10));
        h.insert(header::CONTENT_LENGTH, "10".parse().unwrap());
        assert!(!declared_too_large(&h, 10));
        h.insert(header::CONTENT_LENGTH, "11".parse().unwrap());
        assert!(declared_too_large(&h, 10));
    }
}
