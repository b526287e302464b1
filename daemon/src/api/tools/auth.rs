//! Authentication of `/tools/*`: the [`SignedRequest`] extractor (HMAC `auth_context`, time window,
//! single-use nonce, scope of `auth_context.thread_id`) and the settings it needs ([`ToolsAuth`]).
//!
//! Order of checks, and the answers:
//! 1. not ready → 503 `not_ready`; body over the limit → 413 `too_large`; not JSON → 400 `invalid_json`;
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

use axum::extract::{FromRequest, Request};
use futures_util::StreamExt;
use scopefs::engine::ScopeEngine;
use scopefs::ids::ThreadId;
use scopefs::registry::nonces::ThreadRole;
use scopefs::registry::{OwnerType, ScopeRecord};
use scopefs::signing::{self, SigningError};
use serde::de::DeserializeOwned;

use super::super::{ApiError, AppState};
use crate::tokens::Token;

/// Largest file content the file tools move in one request (seed 003 §6: `max_input_bytes`), and
/// never more than the configured `max_upload_bytes`.
pub const TOOL_FILE_LIMIT: u64 = 10 * 1024 * 1024;

/// The signing settings of the `/tools/*` routes.
#[derive(Debug)]
pub struct ToolsAuth {
    secret: Token,
    window_secs: u64,
    /// Largest file content of one request (see [`TOOL_FILE_LIMIT`]).
    pub file_limit: u64,
}

impl ToolsAuth {
    pub fn new(secret: Token, window_secs: u64, max_upload_bytes: u64) -> ToolsAuth {
        ToolsAuth { secret, window_secs, file_limit: TOOL_FILE_LIMIT.min(max_upload_bytes) }
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
/// - `object_scope`: `auth_context.object_scope` if present (as JSON);
/// - `scope`: the registry record of the scope (draft or active) the thread acts in;
/// - `role`: `Primary`, or `Owner { owner_id, owner_type }` for a registered thread owner;
/// - `engine`: the scope's open file engine (path API in `scopefs::engine::paths`).
///
/// For the mountpoint (containers) call `ScopeService::mount(&req.scope.scope_id)`.
#[allow(dead_code)] // Fields for the compute tools and billing.
pub struct SignedRequest<T> {
    pub body: T,
    pub user_id: String,
    pub thread_id: ThreadId,
    pub object_scope: Option<serde_json::Value>,
    pub scope: ScopeRecord,
    pub role: ThreadRole,
    pub engine: Arc<ScopeEngine>,
}

impl<T> SignedRequest<T> {
    /// Whether this thread may change files: a memory worker acts read-only (SPEC §8).
    pub fn may_write(&self) -> bool {
        !matches!(self.role, ThreadRole::Owner { owner_type: OwnerType::MemoryWorker, .. })
    }
}

/// Reads a body of at most `limit` bytes; more is 413.
async fn read_body(req: Request, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut stream = req.into_body().into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| {
            ApiError::new(axum::http::StatusCode::BAD_REQUEST, "invalid_body", "the request body could not be read")
        })?;
        if out.len() + chunk.len() > limit {
            return Err(ApiError::too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
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
    let ctx = signing::verify(auth.secret.expose().as_bytes(), method, path, bytes)?;
    signing::check_window(ctx.issued_at, now_secs, auth.window_secs)?;
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|_| ApiError::new(axum::http::StatusCode::BAD_REQUEST, "invalid_json", "body is not valid JSON"))?;
    if let Some(obj) = value.as_object_mut() {
        obj.remove("auth_context");
    }
    let body = serde_json::from_value(value).map_err(|e| {
        ApiError::new(axum::http::StatusCode::BAD_REQUEST, "invalid_request", format!("invalid parameters: {e}"))
    })?;
    Ok(Verified { ctx, body })
}

impl<T: DeserializeOwned + Send + 'static> FromRequest<AppState> for SignedRequest<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, ApiError> {
        if !st.service.is_ready() {
            return Err(ApiError::not_ready());
        }
        let method = req.method().as_str().to_owned();
        let path = req.uri().path().to_owned();
        let auth = st.tools.clone();
        let bytes = read_body(req, auth.max_body_bytes()).await?;
        let service = st.service.clone();
        let work = move || -> Result<SignedRequest<T>, ApiError> {
            let now_ms = service.now_ms();
            let Verified { ctx, body } = verify_body::<T>(&auth, &method, &path, &bytes, now_ms.div_euclid(1000))?;
            drop(bytes);
            let thread_id = ThreadId::parse(ctx.thread_id.as_deref().unwrap_or(""))?;
            let user_id = ctx.user_id.clone().filter(|u| !u.is_empty()).ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_auth_context",
                    "auth_context.user_id is required",
                )
            })?;
            let object_scope = match &ctx.object_scope {
                Some(text) => Some(serde_json::from_str(text).map_err(|_| {
                    ApiError::new(
                        axum::http::StatusCode::BAD_REQUEST,
                        "invalid_auth_context",
                        "object_scope is not plain JSON",
                    )
                })?),
                None => None,
            };
            // Remembered until the request could no longer verify (its window has passed).
            let window_ms = i64::try_from(auth.window_secs).unwrap_or(i64::MAX / 2_000).saturating_mul(1000);
            let expires = ctx.issued_at.saturating_mul(1000).saturating_add(window_ms).saturating_add(1000);
            if !service.consume_nonce(&ctx.nonce, expires).map_err(ApiError::from)? {
                return Err(SigningError::Replayed.into());
            }
            let (binding, engine) = service.tool_scope(&thread_id).map_err(ApiError::tools)?;
            Ok(SignedRequest {
                body,
                user_id,
                thread_id,
                object_scope,
                scope: binding.scope,
                role: binding.role,
                engine,
            })
        };
        match tokio::task::spawn_blocking(work).await {
            Ok(result) => result,
            Err(join) => Err(ApiError::internal("task_failed", &join)),
        }
    }
}

/// Runs engine work of a tool on a blocking thread; failures map as tool errors.
pub async fn run_tool<R, F>(f: F) -> Result<R, ApiError>
where
    R: Send + 'static,
    F: FnOnce() -> Result<R, ApiError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(join) => Err(ApiError::internal("task_failed", &join)),
    }
}
