//! `/internal/workspace-scopes/{scope_id}/fork` and `.../snapshots`: forks and snapshots of a scope
//! (issue 23 item 5; `services::forks`). A snapshot's files are read through `/api/workspace*`
//! with `snapshotId`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Json;
use scopefs::ids::ThreadId;
use scopefs::registry::forks::SnapshotRecord;
use serde::{Deserialize, Serialize};

use super::error::ErrorCode as E;
use super::extract::{ApiJson, ScopePath};
use super::internal::ScopeView;
use super::routes::{Auth, Doc, RouteTable};
use super::{blocking, ApiError, AppState};
use crate::pools::RouteClass::Internal;

/// Adds the fork and snapshot routes to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/fork",
            Auth::Service,
            "Fork the scope (draft or active) into a new scope of another thread whose files are the \
             scope's now (a conversation's branch; its metadata is copied, no block); idempotent on \
             operation_id. Body {operation_id, primary_thread_id, user_id?}; 201 new / 200 existing: \
             the new scope's view with `created` and `forked_from`",
            post(fork),
        )
        .doc(Doc::new()
            .body::<ForkRequest>()
            .ok::<ForkView>(201)
            .ok::<ForkView>(200)
            .errors(SCOPE_ERRORS)
            .errors(&[E::InvalidThreadId, E::InvalidRequest, E::IdempotencyKeyConflict, E::ThreadAlreadyBound]))
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/snapshots",
            Auth::Service,
            "Record a read-only point in time of the scope (draft or active); idempotent on \
             snapshot_id (not beginning with `out.`: the daemon's). Body {snapshot_id}; 201: {snapshot_id, scope_id, snapshot_scope_id, created_at}. \
             Read it with /api/workspace* and snapshotId",
            post(create_snapshot),
        )
        .doc(Doc::new()
            .body::<SnapshotRequest>()
            .ok::<SnapshotRecord>(201)
            .errors(SCOPE_ERRORS)
            .errors(&[E::InvalidRequest, E::IdempotencyKeyConflict]))
        .add(
            "GET",
            "/internal/workspace-scopes/{scope_id}/snapshots",
            Auth::Service,
            "The scope's snapshots, oldest first: {snapshots: [...]}",
            get(list_snapshots),
        )
        .doc(Doc::new().ok::<SnapshotsView>(200).errors(SCOPE_ERRORS))
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/snapshots/{snapshot_id}/restore",
            Auth::Service,
            "Make the scope's files the snapshot's (its mount is replaced; 409 scope_busy while an \
             environment of the scope runs); answers the scope's view",
            post(restore_snapshot),
        )
        .doc(Doc::new().no_body().ok::<ScopeView>(200).errors(SCOPE_ERRORS).errors(&[E::NotFound, E::InvalidRequest]))
}

/// A scope's errors on these routes.
const SCOPE_ERRORS: &[E] = &[
    E::InvalidScopeId,
    E::ScopeNotFound,
    E::ScopeNotMountable,
    E::ScopeDeleting,
    E::ScopeDeleted,
    E::ScopeProvisioning,
    E::ScopeBusy,
    E::ScopeUnavailable,
    E::ObjectStoreUnavailable,
    E::EngineError,
    E::RegistryError,
];

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ForkRequest {
    operation_id: String,
    primary_thread_id: String,
    #[serde(default)]
    user_id: Option<String>,
}

async fn fork(
    State(st): State<AppState>,
    ScopePath(parent, ()): ScopePath,
    ApiJson(req): ApiJson<ForkRequest>,
) -> Result<(StatusCode, Json<ForkView>), ApiError> {
    let thread = ThreadId::parse(&req.primary_thread_id)?;
    let scopes = st.scopes.clone();
    let from = parent.clone();
    let (rec, created) =
        blocking(Internal, move || scopes.fork(&from, &req.operation_id, &thread, req.user_id.as_deref())).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let view = ForkView { scope: super::internal::scope_view(rec, Some(created)), forked_from: parent.to_string() };
    Ok((status, Json(view)))
}

/// The new scope of a fork: its view, `created`, and the scope it was forked from.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ForkView {
    #[serde(flatten)]
    scope: ScopeView,
    forked_from: String,
}

/// A scope's snapshots, oldest first.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct SnapshotsView {
    snapshots: Vec<SnapshotRecord>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct SnapshotRequest {
    snapshot_id: String,
}

async fn create_snapshot(
    State(st): State<AppState>,
    ScopePath(scope, ()): ScopePath,
    ApiJson(req): ApiJson<SnapshotRequest>,
) -> Result<(StatusCode, Json<SnapshotRecord>), ApiError> {
    // `out.…` names the snapshots that keep environments' outputs (`services::compute::outputs`).
    if req.snapshot_id.starts_with("out.") {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "snapshot ids beginning with \"out.\" are the daemon's (they keep environments' outputs)",
        ));
    }
    let scopes = st.scopes.clone();
    let snap = blocking(Internal, move || scopes.snapshot(&scope, &req.snapshot_id)).await?;
    Ok((StatusCode::CREATED, Json(snap)))
}

async fn list_snapshots(
    State(st): State<AppState>,
    ScopePath(scope, ()): ScopePath,
) -> Result<Json<SnapshotsView>, ApiError> {
    let scopes = st.scopes.clone();
    let snapshots = blocking(Internal, move || scopes.snapshots(&scope)).await?;
    Ok(Json(SnapshotsView { snapshots }))
}

async fn restore_snapshot(
    State(st): State<AppState>,
    ScopePath(scope, snapshot): ScopePath<String>,
) -> Result<Json<ScopeView>, ApiError> {
    let scopes = st.scopes.clone();
    let rec = blocking(Internal, move || scopes.restore_snapshot(&scope, &snapshot)).await?;
    Ok(Json(super::internal::scope_view(rec, None)))
}
