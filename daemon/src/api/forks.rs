//! `/internal/workspace-scopes/{scope_id}/fork` and `.../snapshots`: forks and snapshots of a scope
//! (issue 23 item 5; `services::forks`). A snapshot's files are read through `/api/workspace*`
//! with `snapshotId`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Json;
use scopefs::ids::ThreadId;
use scopefs::registry::forks::SnapshotRecord;
use serde::Deserialize;

use super::extract::{ApiJson, ScopePath};
use super::routes::{Auth, RouteTable};
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
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/snapshots",
            Auth::Service,
            "Record a read-only point in time of the scope (draft or active); idempotent on \
             snapshot_id (not beginning with `out.`: the daemon's). Body {snapshot_id}; 201: {snapshot_id, scope_id, snapshot_scope_id, created_at}. \
             Read it with /api/workspace* and snapshotId",
            post(create_snapshot),
        )
        .add(
            "GET",
            "/internal/workspace-scopes/{scope_id}/snapshots",
            Auth::Service,
            "The scope's snapshots, oldest first: {snapshots: [...]}",
            get(list_snapshots),
        )
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/snapshots/{snapshot_id}/restore",
            Auth::Service,
            "Make the scope's files the snapshot's (its mount is replaced; 409 scope_busy while an \
             environment of the scope runs); answers the scope's view",
            post(restore_snapshot),
        )
}

#[derive(Debug, Deserialize)]
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
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let thread = ThreadId::parse(&req.primary_thread_id)?;
    let scopes = st.scopes.clone();
    let from = parent.clone();
    let (rec, created) =
        blocking(Internal, move || scopes.fork(&from, &req.operation_id, &thread, req.user_id.as_deref())).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let mut view = serde_json::to_value(super::internal::scope_view(rec))
        .map_err(|e| ApiError::internal("answer_not_serialized", &e))?;
    view["created"] = created.into();
    view["forked_from"] = parent.as_str().into();
    Ok((status, Json(view)))
}

#[derive(Debug, Deserialize)]
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
) -> Result<Json<serde_json::Value>, ApiError> {
    let scopes = st.scopes.clone();
    let snaps = blocking(Internal, move || scopes.snapshots(&scope)).await?;
    Ok(Json(serde_json::json!({ "snapshots": snaps })))
}

async fn restore_snapshot(
    State(st): State<AppState>,
    ScopePath(scope, snapshot): ScopePath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let scopes = st.scopes.clone();
    let rec = blocking(Internal, move || scopes.restore_snapshot(&scope, &snapshot)).await?;
    serde_json::to_value(super::internal::scope_view(rec))
        .map(Json)
        .map_err(|e| ApiError::internal("answer_not_serialized", &e))
}
