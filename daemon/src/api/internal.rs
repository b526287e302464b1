//! `/internal/*`: the WebUI server's scope registry routes (SPEC §7.1) — scopes, owners, run reservations, leases.
//!
//! JSON shapes mirror the registry columns (snake_case); times are Unix milliseconds.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, patch, post};
use axum::Json;
use scopefs::engine::Usage;
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::{
    Lease, NewOwner, OwnerRecord, OwnerState, OwnerType, OwnerUpdate, RunRequestRecord, RunRequestState, RunReserve,
    RunUpdate, ScopeRecord, ScopeState,
};
use serde::{Deserialize, Serialize};

use super::error::ErrorCode as E;
use super::extract::{ApiJson, ApiPath, ApiQuery, ScopePath};
use super::routes::{Auth, Doc, RouteTable};
use super::{blocking, ApiError, AppState};
use crate::pools::RouteClass::Internal;
use crate::services::ProvisionBy;

/// Adds the `/internal` routes to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
        .add(
            "POST",
            "/internal/workspace-scopes/provision",
            Auth::Service,
            "Create (or return) the draft scope of a primary thread; idempotent on operation_id. \
             Body {operation_id, primary_thread_id, user_id?, lease_operation_id?, new_thread?} (user_id: the \
             user the scope belongs to; a scope of another user is 404; new_thread: the caller creates a new \
             conversation); 201 new / 200 existing: scope view with `created`. 503 cutover-in-progress while a \
             blocking lease is held by another operation than lease_operation_id (its holder works under it); \
             409 migration-required for a thread without a scope while cutover.mode is required, unless it is a \
             new_thread and the migration report is verified (not for the holder of workspace-cutover)",
            post(provision),
        )
        .doc(Doc::new()
            .body::<ProvisionRequest>()
            .ok::<ScopeView>(201)
            .ok::<ScopeView>(200)
            .errors(&[E::InvalidThreadId, E::InvalidUserId, E::InvalidRequest, E::IdempotencyKeyConflict, E::ThreadAlreadyBound, E::ScopeNotFound, E::CutoverInProgress, E::MigrationRequired, E::RegistryError]))
        .add(
            "POST",
            "/internal/workspace-cutover/report",
            Auth::Service,
            "Record the configured migration report (cutover.report: passed, this deployment) as the deployment's \
             cutover operation with its SHA-256, which opens the required-mode gate. No body; \
             {operation_id, result_sha256, state}; 409 migration-required if the report does not check out",
            post(record_cutover),
        )
        .doc(Doc::new().no_body().ok::<CutoverView>(200).errors(&[E::MigrationRequired, E::RegistryError]))
        .add(
            "GET",
            "/internal/workspace-scopes/by-thread/{thread_id}",
            Auth::Service,
            "The scope of a primary thread: {scope_id, primary_thread_id, state, revision, usage, \
             delete_blocked_by?, deleted_at?, purged_at?} or 404 scope_not_found",
            get(by_thread),
        )
        .doc(Doc::new().ok::<ScopeView>(200).errors(&[E::InvalidThreadId, E::ScopeNotFound, E::RegistryError]))
        .add(
            "PATCH",
            "/internal/workspace-scopes/{scope_id}",
            Auth::Service,
            "Revision compare-and-set: body {expected_revision, state}, state active (activate a draft) or \
             deleting (freeze, drain owners, then deleted). 409 revision_conflict / invalid_state_transition",
            patch(patch_scope),
        )
        .doc(Doc::new()
            .body::<PatchScopeRequest>()
            .ok::<ScopeView>(200)
            .errors(&[E::InvalidScopeId, E::ScopeNotFound, E::RevisionConflict, E::InvalidStateTransition, E::CutoverInProgress, E::ScopeBusy, E::RegistryError]))
        .add(
            "GET",
            "/internal/workspace-scopes/{scope_id}/mount",
            Auth::Service,
            "Host view and container bind source of a scope for an external orchestrator (mounts if needed)",
            get(mount),
        )
        .doc(Doc::new().ok::<MountView>(200).errors(&[E::InvalidScopeId, E::ScopeNotFound, E::ScopeNotMountable, E::ScopeUnavailable, E::MountFailed, E::RegistryError]))
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/gc",
            Auth::Service,
            "Online garbage collection of a draft or active scope now, while it stays in use (the daemon also \
             runs it every gc.interval_secs): deletes up to gc.blocks_per_pass blocks no file has referenced for \
             gc.grace_secs; answers {blocks_deleted, bytes_deleted, blocks_deferred} (deferred: not stored yet, \
             an upload in flight, held by a fork, or past the bound)",
            post(collect_garbage),
        )
        .doc(Doc::new().no_body().ok::<GcView>(200).errors(&[E::InvalidScopeId, E::ScopeNotFound, E::ScopeNotMountable, E::ScopeBusy, E::ObjectStoreUnavailable, E::ScopeUnavailable, E::EngineError, E::RegistryError]))
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/owners",
            Auth::Service,
            "Register an owner (state reserved). Body {owner_type, resource_id?, parent_owner_id?, \
             lease_operation_id?}; 201 owner (200 if this resource is already registered in this scope). \
             409 resource_already_owned, 409 scope_deleting, 503 cutover-in-progress (not for the holder \
             of the blocking lease, lease_operation_id)",
            post(create_owner),
        )
        .doc(Doc::new()
            .body::<CreateOwnerRequest>()
            .ok::<OwnerView>(201)
            .ok::<OwnerView>(200)
            .errors(&[E::InvalidScopeId, E::InvalidRequest, E::ScopeNotFound, E::OwnerNotFound, E::ResourceAlreadyOwned, E::ScopeDeleting, E::ScopeDeleted, E::ScopeProvisioning, E::CutoverInProgress, E::RegistryError]))
        .add(
            "PATCH",
            "/internal/workspace-scopes/{scope_id}/owners/{owner_id}",
            Auth::Service,
            "Attach resource_id and/or change state. Body {expected_revision?, resource_id?, state?}; owner. \
             terminal/quarantined never become active (409 invalid_state_transition)",
            patch(update_owner),
        )
        .doc(Doc::new()
            .body::<UpdateOwnerRequest>()
            .ok::<OwnerView>(200)
            .errors(&[E::InvalidScopeId, E::InvalidRequest, E::ScopeNotFound, E::OwnerNotFound, E::RevisionConflict, E::InvalidStateTransition, E::ResourceIdAlreadySet, E::ResourceAlreadyOwned, E::RegistryError]))
        .add(
            "GET",
            "/internal/workspace-scopes/{scope_id}/owners/by-resource/{resource_id}",
            Auth::Service,
            "The owner of an external resource in this scope (query owner_type? to disambiguate) or 404 owner_not_found",
            get(owner_by_resource),
        )
        .doc(Doc::new()
            .query::<ByResourceQuery>()
            .ok::<OwnerView>(200)
            .errors(&[E::InvalidScopeId, E::ScopeNotFound, E::OwnerNotFound, E::AmbiguousResource, E::RegistryError]))
        .add(
            "POST",
            "/internal/workspace-scopes/{scope_id}/runs/reserve",
            Auth::Service,
            "Idempotent run reservation. Body {run_request_id, turn_id, interrupt_key?, request_hash}; 201 new / \
             200 existing: run request with created, scope_state, scope_revision. 409 idempotency_key_conflict, \
             409 interrupt_already_resolved, 409 scope_deleting, 503 cutover-in-progress",
            post(reserve_run),
        )
        .doc(Doc::new()
            .body::<ReserveRequest>()
            .ok::<ReservationView>(201)
            .ok::<ReservationView>(200)
            .errors(&[E::InvalidScopeId, E::InvalidRequest, E::ScopeNotFound, E::IdempotencyKeyConflict, E::InterruptAlreadyResolved, E::ScopeDeleting, E::ScopeDeleted, E::ScopeProvisioning, E::CutoverInProgress, E::RegistryError]))
        .add(
            "PATCH",
            "/internal/workspace-scopes/{scope_id}/runs/{run_request_id}",
            Auth::Service,
            "Attach run_id and/or change state (started, completed, failed, cancelled). Body {run_id?, state?}",
            patch(update_run),
        )
        .doc(Doc::new()
            .body::<UpdateRunRequest>()
            .ok::<ReservationView>(200)
            .errors(&[E::InvalidScopeId, E::InvalidRequest, E::ScopeNotFound, E::RunRequestNotFound, E::InvalidStateTransition, E::ResourceIdAlreadySet, E::RegistryError]))
        .add(
            "POST",
            "/internal/leases/{lock_name}",
            Auth::Service,
            "Acquire a lease: body {operation_id, ttl_seconds}; granted if free, expired or already ours, \
             else 409 lease_held. Returns {lock_name, operation_id, expires_at, created_at}",
            post(change_lease::<ACQUIRE>),
        )
        .doc(Doc::new().body::<LeaseRequest>().ok::<Lease>(200).errors(&[E::InvalidRequest, E::LeaseHeld, E::RegistryError]))
        .add(
            "PATCH",
            "/internal/leases/{lock_name}",
            Auth::Service,
            "Renew a lease: body {operation_id, ttl_seconds}; only its holder, before expiry (else 409 lease_not_held)",
            patch(change_lease::<RENEW>),
        )
        .doc(Doc::new().body::<LeaseRequest>().ok::<Lease>(200).errors(&[E::InvalidRequest, E::LeaseNotHeld, E::RegistryError]))
        .add(
            "DELETE",
            "/internal/leases/{lock_name}",
            Auth::Service,
            "Release a lease: query operation_id; {released: bool}; 409 lease_not_held if another operation holds it",
            axum::routing::delete(release_lease),
        )
        .doc(Doc::new().query::<ReleaseQuery>().ok::<ReleasedView>(200).errors(&[E::LeaseNotHeld, E::RegistryError]))
}

/// A scope as the API shows it (no physical paths).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct ScopeView {
    scope_id: ScopeId,
    primary_thread_id: ThreadId,
    state: ScopeState,
    revision: u64,
    created_at: i64,
    updated_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    delete_blocked_by: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    purged_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<String>,
}

impl ScopeView {
    fn of(rec: ScopeRecord) -> ScopeView {
        ScopeView {
            scope_id: rec.scope_id,
            primary_thread_id: rec.primary_thread_id,
            state: rec.state,
            revision: rec.revision,
            created_at: rec.created_at,
            updated_at: rec.updated_at,
            usage: None,
            created: None,
            delete_blocked_by: rec.delete_blocked_by,
            deleted_at: rec.deleted_at,
            purged_at: rec.purged_at,
            user_id: rec.user_id,
        }
    }
}

/// The JSON view of a scope record (for routes of other modules), with `created` if given.
pub(super) fn scope_view(rec: ScopeRecord, created: Option<bool>) -> ScopeView {
    ScopeView { created, ..ScopeView::of(rec) }
}

fn created_status(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ProvisionRequest {
    operation_id: String,
    primary_thread_id: String,
    /// The user the scope belongs to (seed 003 §3.7); a scope of another user is 404.
    #[serde(default)]
    user_id: Option<String>,
    /// The `operation_id` of the caller's blocking lease (a cutover provisioning the threads it
    /// migrates): that lease does not refuse its holder.
    #[serde(default)]
    lease_operation_id: Option<String>,
    /// The caller is creating a new conversation (seed 000 §5.3). In cutover mode `required` a
    /// thread without a scope is provisioned only so; any other is one the cutover missed (409
    /// `migration-required`). Ignored in mode `off`.
    #[serde(default)]
    new_thread: bool,
}

async fn provision(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<ProvisionRequest>,
) -> Result<(StatusCode, Json<ScopeView>), ApiError> {
    let thread = ThreadId::parse(&req.primary_thread_id)?;
    if req.user_id.as_ref().is_some_and(|u| u.is_empty() || u.len() > 256) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_user_id", "user_id must be 1-256 bytes"));
    }
    let provision = move || {
        let by = ProvisionBy { lease_holder: req.lease_operation_id.as_deref(), new_thread: req.new_thread };
        st.scopes.provision_for_user(&req.operation_id, &thread, req.user_id.as_deref(), by)
    };
    let (rec, created) = blocking(Internal, provision).await?;
    Ok((created_status(created), Json(ScopeView { created: Some(created), ..ScopeView::of(rec) })))
}

async fn by_thread(State(st): State<AppState>, ApiPath(raw): ApiPath<String>) -> Result<Json<ScopeView>, ApiError> {
    let thread = ThreadId::parse(&raw)?;
    let status = blocking(Internal, move || st.scopes.by_thread(&thread)).await?;
    let status =
        status.ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "scope_not_found", "no scope for this thread"))?;
    Ok(Json(ScopeView { usage: Some(status.usage), ..ScopeView::of(status.record) }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct PatchScopeRequest {
    expected_revision: u64,
    state: ScopeState,
}

async fn patch_scope(
    State(st): State<AppState>,
    ScopePath(scope, ()): ScopePath,
    ApiJson(req): ApiJson<PatchScopeRequest>,
) -> Result<Json<ScopeView>, ApiError> {
    let rec = blocking(Internal, move || st.scopes.request_state(&scope, req.expected_revision, req.state)).await?;
    Ok(Json(ScopeView::of(rec)))
}

/// Where a mounted scope is. `bind_source` is the real mount: what an orchestrator binds into a
/// container (symlinks resolve in the container's namespace). `mountpoint` is the host view, a
/// `nosymfollow` bind of it: host tools read it without ever following a scope's symlink.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct MountView {
    scope_id: ScopeId,
    mountpoint: String,
    bind_source: String,
    /// Several nodes: the node that serves (and mounted) the scope; its paths are on that host.
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
}

/// What one online garbage collection of a scope did.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct GcView {
    blocks_deleted: u64,
    bytes_deleted: u64,
    /// Not stored yet, an upload in flight, held by a fork, or past the bound.
    blocks_deferred: u64,
}

async fn collect_garbage(
    State(st): State<AppState>,
    ScopePath(scope, ()): ScopePath,
) -> Result<Json<GcView>, ApiError> {
    let service = st.scopes.clone();
    let r = blocking(Internal, move || service.gc_scope(&scope)).await?;
    Ok(Json(GcView {
        blocks_deleted: r.blocks_deleted,
        bytes_deleted: r.bytes_deleted,
        blocks_deferred: r.blocks_deferred,
    }))
}

/// The one route that returns host paths: for the orchestrator that bind-mounts a scope into a container.
async fn mount(State(st): State<AppState>, ScopePath(scope, ()): ScopePath) -> Result<Json<MountView>, ApiError> {
    let service = st.scopes.clone();
    let (rec, bind_source) = blocking(Internal, move || service.mount(&scope)).await?;
    let utf8 = |p: std::path::PathBuf| {
        p.into_os_string()
            .into_string()
            .map_err(|_| ApiError::internal("mount_failed", &"mountpoint is not valid UTF-8"))
    };
    let mountpoint = utf8(st.scopes.open_scopes().mounter().view(&rec.scope_id))?;
    let bind_source = utf8(bind_source)?;
    let node_id = st.cluster.as_ref().map(|c| c.node_id().to_string());
    Ok(Json(MountView { scope_id: rec.scope_id, mountpoint, bind_source, node_id }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct CreateOwnerRequest {
    owner_type: OwnerType,
    resource_id: Option<String>,
    parent_owner_id: Option<String>,
    /// As for provisioning: the caller's blocking lease, which does not refuse its holder.
    #[serde(default)]
    lease_operation_id: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct OwnerView {
    #[serde(flatten)]
    owner: OwnerRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
}

async fn create_owner(
    State(st): State<AppState>,
    ScopePath(scope, ()): ScopePath,
    ApiJson(req): ApiJson<CreateOwnerRequest>,
) -> Result<(StatusCode, Json<OwnerView>), ApiError> {
    let new =
        NewOwner { owner_type: req.owner_type, resource_id: req.resource_id, parent_owner_id: req.parent_owner_id };
    let holder = req.lease_operation_id;
    let (owner, created) = blocking(Internal, move || st.scopes.create_owner(&scope, &new, holder.as_deref())).await?;
    Ok((created_status(created), Json(OwnerView { owner, created: Some(created) })))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct UpdateOwnerRequest {
    expected_revision: Option<u64>,
    resource_id: Option<String>,
    state: Option<OwnerState>,
}

async fn update_owner(
    State(st): State<AppState>,
    ScopePath(scope, owner): ScopePath<String>,
    ApiJson(req): ApiJson<UpdateOwnerRequest>,
) -> Result<Json<OwnerView>, ApiError> {
    let update =
        OwnerUpdate { expected_revision: req.expected_revision, resource_id: req.resource_id, state: req.state };
    let owner = blocking(Internal, move || st.scopes.update_owner(&scope, &owner, &update)).await?;
    Ok(Json(OwnerView { owner, created: None }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ByResourceQuery {
    owner_type: Option<OwnerType>,
}

async fn owner_by_resource(
    State(st): State<AppState>,
    ScopePath(scope, resource): ScopePath<String>,
    ApiQuery(q): ApiQuery<ByResourceQuery>,
) -> Result<Json<OwnerView>, ApiError> {
    let owner = blocking(Internal, move || st.scopes.owner_by_resource(&scope, &resource, q.owner_type)).await?;
    Ok(Json(OwnerView { owner, created: None }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ReserveRequest {
    run_request_id: String,
    turn_id: String,
    interrupt_key: Option<String>,
    request_hash: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ReservationView {
    #[serde(flatten)]
    run: RunRequestRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope_state: Option<ScopeState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope_revision: Option<u64>,
}

async fn reserve_run(
    State(st): State<AppState>,
    ScopePath(scope, ()): ScopePath,
    ApiJson(req): ApiJson<ReserveRequest>,
) -> Result<(StatusCode, Json<ReservationView>), ApiError> {
    let req = RunReserve {
        run_request_id: req.run_request_id,
        turn_id: req.turn_id,
        interrupt_key: req.interrupt_key,
        request_hash: req.request_hash,
    };
    let r = blocking(Internal, move || st.scopes.reserve_run(&scope, &req)).await?;
    let view = ReservationView {
        run: r.run,
        created: Some(r.created),
        scope_state: Some(r.scope.state),
        scope_revision: Some(r.scope.revision),
    };
    Ok((created_status(r.created), Json(view)))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct UpdateRunRequest {
    run_id: Option<String>,
    state: Option<RunRequestState>,
}

async fn update_run(
    State(st): State<AppState>,
    ScopePath(scope, run): ScopePath<String>,
    ApiJson(req): ApiJson<UpdateRunRequest>,
) -> Result<Json<ReservationView>, ApiError> {
    let update = RunUpdate { run_id: req.run_id, state: req.state };
    let run = blocking(Internal, move || st.scopes.update_run(&scope, &run, &update)).await?;
    Ok(Json(ReservationView { run, created: None, scope_state: None, scope_revision: None }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct LeaseRequest {
    operation_id: String,
    ttl_seconds: u64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ReleaseQuery {
    operation_id: String,
}

/// `change_lease::<ACQUIRE>`: take a free, expired or already held lease.
const ACQUIRE: bool = false;
/// The recorded cutover operation (no physical path).
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct CutoverView {
    operation_id: String,
    result_sha256: Option<String>,
    state: String,
}

async fn record_cutover(State(st): State<AppState>) -> Result<Json<CutoverView>, ApiError> {
    let op = blocking(Internal, move || st.scopes.record_cutover_report()).await?;
    Ok(Json(CutoverView {
        operation_id: op.operation_id,
        result_sha256: op.result_sha256,
        state: op.state.to_string(),
    }))
}

/// `change_lease::<RENEW>`: extend a lease its holder still holds.
const RENEW: bool = true;

/// Acquires (`POST`) or renews (`PATCH`) a lease: the same request and answer.
async fn change_lease<const RENEWAL: bool>(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<LeaseRequest>,
) -> Result<Json<Lease>, ApiError> {
    let ttl = Duration::from_secs(req.ttl_seconds);
    let lease = blocking(Internal, move || {
        if RENEWAL {
            st.scopes.renew_lease(&name, &req.operation_id, ttl)
        } else {
            st.scopes.acquire_lease(&name, &req.operation_id, ttl)
        }
    })
    .await?;
    Ok(Json(lease))
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ReleasedView {
    released: bool,
}

async fn release_lease(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReleaseQuery>,
) -> Result<Json<ReleasedView>, ApiError> {
    let released = blocking(Internal, move || st.scopes.release_lease(&name, &q.operation_id)).await?;
    Ok(Json(ReleasedView { released }))
}
