//! `/admin/*` (SPEC §7.4, seed 003 §4.6, §11): pending usage, settlement marks, account management
//! and the admin audit log (each change audited in its own transaction: `registry::admin_audit`).
//!
//! Authenticated by `X-Admin-Token` (constant-time compare, see `require_admin_token`). Money is a
//! decimal string both ways (`"10.000000"`); a JSON number is refused.

use axum::extract::State;
use axum::routing::{get, post, put};
use axum::Json;
use scopefs::billing::{BillingError, Micros};
use scopefs::registry::admin_audit::{self, AdminAction, AuditEntry};
use scopefs::registry::billing::{Account, ArtifactsState, LedgerEntry, SettleStatus, UsageRecord};
use scopefs::registry::nodes::NodeRecord;
use serde::{Deserialize, Serialize};

use super::artifacts::ArtifactView;
use super::error::ErrorCode as E;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::routes::{Auth, Doc, RouteTable};
use super::{blocking, ApiError, AppState};
use crate::pools::RouteClass::Internal;

/// Most records one admin request lists or changes.
const MAX_BATCH: usize = 500;

/// Adds the `/admin` routes to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
        .add(
            "GET",
            "/admin/nodes",
            Auth::Admin,
            "The nodes of the deployment (several daemons): {nodes: [{node_id, api_address, state, max_scopes, \
             started_at, heartbeat_at, lease_until, bytes_used, environments, scopes}], this_node}; empty for a \
             daemon alone",
            get(nodes),
        )
        .doc(Doc::new().ok::<NodesView>(200).errors(&[E::RegistryError]))
        .add(
            "POST",
            "/admin/pending-usage",
            Auth::Admin,
            "Usage records with their artifacts (seed 003 §11.3): pending ones (settled: 0, the default) least \
             recently attempted first, or settled ones (settled: 1) oldest first. Body {settled?: 0|1, limit?: \
             1-500, default 50}; answers {usage: [{id, usage_id, artifacts_registered, output_manifest_json, \
             artifacts, ...}]}",
            post(pending_usage),
        )
        .doc(
            Doc::new()
                .body::<PendingRequest>()
                .ok::<PendingUsageView>(200)
                .errors(&[E::InvalidRequest, E::RegistryError]),
        )
        .add(
            "POST",
            "/admin/mark-settled",
            Auth::Admin,
            "Settle these usage records now (seed 003 §10.2; idempotent: each is charged at most once); with \
             [billing] mode = \"report\" only mark them settled by the gateway (nothing is charged). \
             Body {usage_ids: [..]}; answers {results: [{usage_id, status}]} with status settled | already_settled | \
             insufficient_compute_balance | artifacts_pending | not_found",
            post(mark_settled),
        )
        .doc(Doc::new().body::<UsageIds>().ok::<SettleResults>(200).errors(&[
            E::InvalidRequest,
            E::AccountNotFound,
            E::UnknownPlan,
            E::RegistryError,
        ]))
        .add(
            "POST",
            "/admin/mark-artifacts-registered",
            Auth::Admin,
            "Mark the artifacts of usage records registered (idempotent). Body: exactly one of {usage_id}, \
             {environment_id} (seed 003 §4.5) or {usage_ids: [..]}; answers {updated}",
            post(mark_artifacts_registered),
        )
        .doc(Doc::new().body::<RegisteredRequest>().ok::<UpdatedView>(200).errors(&[
            E::InvalidRequest,
            E::UsageNotFound,
            E::RegistryError,
        ]))
        .add(
            "GET",
            "/admin/accounts/{user_id}",
            Auth::Admin,
            "An account: plan, compute minutes, cash balance (decimal strings), monthly period; 404 account_not_found",
            get(read_account),
        )
        .doc(Doc::new().ok::<Account>(200).errors(&[E::AccountNotFound, E::RegistryError]))
        .add(
            "POST",
            "/admin/accounts/{user_id}/credit",
            Auth::Admin,
            "Credit cash (account created with the default plan if needed). Body {amount: \"10.000000\", \
             idempotency_key, note?}; the same key again returns the first entry, another amount is 409; \
             answers {account, entry}",
            post(credit),
        )
        .doc(Doc::new().body::<CreditRequest>().ok::<CreditView>(200).errors(&[
            E::InvalidRequest,
            E::AmountOutOfRange,
            E::IdempotencyKeyConflict,
            E::UnknownPlan,
            E::RegistryError,
        ]))
        .add(
            "PUT",
            "/admin/accounts/{user_id}/plan",
            Auth::Admin,
            "Set the plan. Body {plan}; monthly minutes become the plan's, remaining = max(0, monthly - used \
             this period); 400 unknown_plan; answers the account",
            put(set_plan),
        )
        .doc(Doc::new().body::<PlanRequest>().ok::<Account>(200).errors(&[
            E::InvalidRequest,
            E::UnknownPlan,
            E::RegistryError,
        ]))
        .add(
            "PUT",
            "/admin/accounts/{user_id}/quota-adjustment",
            Auth::Admin,
            "Set the account's compute_quota_adjustment (seed 003 §9.1): minutes added to (negative: taken \
             from) the plan's monthly quota, within ±1051200. Body {minutes}; the monthly quota becomes \
             max(0, plan's + minutes), remaining = max(0, monthly - used this period); answers the account",
            put(set_quota_adjustment),
        )
        .doc(Doc::new().body::<AdjustmentRequest>().ok::<Account>(200).errors(&[
            E::InvalidRequest,
            E::UnknownPlan,
            E::RegistryError,
        ]))
        .add(
            "GET",
            "/admin/audit-log",
            Auth::Admin,
            "The admin audit log (seed 003 exec_admin_audit_log), newest first: one row per admin request that \
             changed something (credit, set_plan, set_quota_adjustment, mark_settled, mark_artifacts_registered), \
             written with the change. Query limit (1-500, default 100), before (audit_id); answers {entries: \
             [{audit_id, action, subject, detail, created_at}]}",
            get(audit_log),
        )
        .doc(
            Doc::new()
                .query::<LedgerQuery>()
                .ok::<Entries<AuditEntry>>(200)
                .errors(&[E::InvalidRequest, E::RegistryError]),
        )
        .add(
            "GET",
            "/admin/accounts/{user_id}/ledger",
            Auth::Admin,
            "Wallet ledger entries, newest first. Query limit (1-500, default 100), before (entry_id); \
             answers {entries: [...]}",
            get(ledger),
        )
        .doc(
            Doc::new()
                .query::<LedgerQuery>()
                .ok::<Entries<LedgerEntry>>(200)
                .errors(&[E::InvalidRequest, E::RegistryError]),
        )
}

fn check_batch(ids: &[i64]) -> Result<(), ApiError> {
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(ApiError::from(BillingError::Invalid { field: "usage_ids", reason: "must list 1-500 ids".into() }));
    }
    Ok(())
}

#[derive(Debug, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PendingRequest {
    /// Seed 003 §4.5 `list_pending_usage(settled=0)`: 0 pending, 1 settled.
    settled: Option<u8>,
    limit: Option<usize>,
}

/// A usage record as the seed's poll loop reads it (§11.3): `id`, `artifacts_registered`,
/// `output_manifest_json`, plus every field of the record and its artifact paths.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct PendingView {
    /// The usage id (seed: `record.id`).
    id: i64,
    #[serde(flatten)]
    usage: UsageRecord,
    /// The artifacts need no registration before settlement: registered, none, or given up.
    artifacts_registered: bool,
    /// The manifest as a JSON string (`[{path, logical_path, size_bytes, sha256, content_type}]`),
    /// `null` when the environment produced no artifacts.
    output_manifest_json: Option<String>,
    /// Artifact paths: relative to `/workspace`, or `/__global__/…` in the user's global store.
    artifacts: Vec<String>,
}

impl PendingView {
    fn of(billing: &crate::billing_loop::BillingService, usage: UsageRecord) -> Result<PendingView, BillingError> {
        let rows = billing.registry.artifact_manifest(&usage.environment_id)?;
        let manifest: Vec<ArtifactView> = rows
            .iter()
            .map(|r| ArtifactView::of(r.entry.clone(), &usage.environment_id, &usage.thread_id, &usage.user_id))
            .collect();
        // Plain strings and numbers: serializing them cannot fail.
        let output_manifest_json = (!manifest.is_empty()).then(|| serde_json::json!(manifest).to_string());
        let artifacts = rows.into_iter().map(|r| r.entry.path).collect();
        let artifacts_registered = usage.artifacts_state != ArtifactsState::Pending;
        Ok(PendingView { id: usage.usage_id, artifacts_registered, output_manifest_json, artifacts, usage })
    }
}

/// The nodes of the deployment, and which one answers (`null` for a daemon alone).
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct NodesView {
    nodes: Vec<NodeRecord>,
    this_node: Option<String>,
}

async fn nodes(State(st): State<AppState>) -> Result<Json<NodesView>, ApiError> {
    let registry = st.scopes.registry().clone();
    let nodes = blocking(Internal, move || registry.nodes().map_err(crate::services::ServiceError::Registry)).await?;
    let this_node = st.cluster.as_ref().map(|c| c.node_id().to_string());
    Ok(Json(NodesView { nodes, this_node }))
}

/// A page of usage records.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct PendingUsageView {
    usage: Vec<PendingView>,
}

async fn pending_usage(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<PendingRequest>,
) -> Result<Json<PendingUsageView>, ApiError> {
    let limit = req.limit.unwrap_or(50);
    if !(1..=MAX_BATCH).contains(&limit) {
        return Err(BillingError::Invalid { field: "limit", reason: "must be 1-500".into() }.into());
    }
    let settled = match req.settled.unwrap_or(0) {
        0 => false,
        1 => true,
        _ => return Err(BillingError::Invalid { field: "settled", reason: "must be 0 or 1".into() }.into()),
    };
    let billing = st.billing.clone();
    let views = blocking(Internal, move || {
        let records = if settled {
            billing.registry.usage_by_state(true, limit)?
        } else {
            billing.registry.pending_usage(limit, false)?
        };
        records.into_iter().map(|usage| PendingView::of(&billing, usage)).collect::<Result<Vec<_>, BillingError>>()
    })
    .await?;
    Ok(Json(PendingUsageView { usage: views }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct UsageIds {
    usage_ids: Vec<i64>,
}

/// What settling one usage record did.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct SettleResult {
    usage_id: i64,
    /// `settled`, `already_settled`, `insufficient_compute_balance`, `artifacts_pending` or `not_found`.
    status: &'static str,
}

/// The outcome of each usage record of a `mark-settled`, in the request's order.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct SettleResults {
    results: Vec<SettleResult>,
}

async fn mark_settled(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<UsageIds>,
) -> Result<Json<SettleResults>, ApiError> {
    check_batch(&req.usage_ids)?;
    let billing = st.billing.clone();
    let results = blocking(Internal, move || {
        let mut out = Vec::with_capacity(req.usage_ids.len());
        for id in req.usage_ids {
            let status = match billing.mark_settled(id) {
                Ok(s) if s.status == SettleStatus::Settled => "settled",
                Ok(_) => "already_settled",
                Err(BillingError::InsufficientComputeBalance { .. }) => "insufficient_compute_balance",
                Err(BillingError::ArtifactsPending) => "artifacts_pending",
                Err(BillingError::UsageNotFound) => "not_found",
                Err(e) => return Err(e),
            };
            out.push(SettleResult { usage_id: id, status });
        }
        Ok(out)
    })
    .await?;
    Ok(Json(SettleResults { results }))
}

/// The body of `/admin/mark-artifacts-registered`: the seed's `usage_id` or `environment_id`, or a batch.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RegisteredRequest {
    usage_id: Option<i64>,
    environment_id: Option<String>,
    usage_ids: Option<Vec<i64>>,
}

/// How many usage records a `mark-artifacts-registered` changed.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct UpdatedView {
    updated: usize,
}

async fn mark_artifacts_registered(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<RegisteredRequest>,
) -> Result<Json<UpdatedView>, ApiError> {
    let given = [req.usage_id.is_some(), req.environment_id.is_some(), req.usage_ids.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        let reason = "give exactly one of usage_id, environment_id, usage_ids".into();
        return Err(BillingError::Invalid { field: "usage_id", reason }.into());
    }
    if let Some(ids) = &req.usage_ids {
        check_batch(ids)?;
    }
    let billing = st.billing.clone();
    let updated = blocking(Internal, move || {
        let ids = match (req.usage_id, req.environment_id, req.usage_ids) {
            (Some(id), _, _) => vec![id],
            (_, Some(env), _) => {
                vec![billing.registry.usage_by_environment(&env)?.ok_or(BillingError::UsageNotFound)?.usage_id]
            }
            (_, _, ids) => ids.unwrap_or_default(),
        };
        let subject = match ids.as_slice() {
            [one] => format!("usage:{one}"),
            _ => format!("usages:{}", ids.len()),
        };
        let detail = serde_json::json!({ "usage_ids": ids });
        let audit = AdminAction { action: admin_audit::MARK_ARTIFACTS_REGISTERED, subject, detail };
        billing.registry.mark_artifacts_registered_audited(&ids, Some(&audit))
    })
    .await?;
    Ok(Json(UpdatedView { updated }))
}

async fn read_account(State(st): State<AppState>, ApiPath(user): ApiPath<String>) -> Result<Json<Account>, ApiError> {
    let billing = st.billing.clone();
    Ok(Json(blocking(Internal, move || billing.registry.account(&user)?.ok_or(BillingError::AccountNotFound)).await?))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreditRequest {
    amount: Micros,
    idempotency_key: String,
    note: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct CreditView {
    account: Account,
    entry: LedgerEntry,
}

async fn credit(
    State(st): State<AppState>,
    ApiPath(user): ApiPath<String>,
    ApiJson(req): ApiJson<CreditRequest>,
) -> Result<Json<CreditView>, ApiError> {
    let billing = st.billing.clone();
    let (account, entry) = blocking(Internal, move || {
        billing.registry.credit_cash(&billing.pricing, &user, req.amount, &req.idempotency_key, req.note.as_deref())
    })
    .await?;
    Ok(Json(CreditView { account, entry }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PlanRequest {
    plan: String,
}

async fn set_plan(
    State(st): State<AppState>,
    ApiPath(user): ApiPath<String>,
    ApiJson(req): ApiJson<PlanRequest>,
) -> Result<Json<Account>, ApiError> {
    let billing = st.billing.clone();
    Ok(Json(blocking(Internal, move || billing.registry.set_plan(&billing.pricing, &user, &req.plan)).await?))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AdjustmentRequest {
    minutes: i64,
}

async fn set_quota_adjustment(
    State(st): State<AppState>,
    ApiPath(user): ApiPath<String>,
    ApiJson(req): ApiJson<AdjustmentRequest>,
) -> Result<Json<Account>, ApiError> {
    let billing = st.billing.clone();
    let adjusted = move || billing.registry.set_quota_adjustment(&billing.pricing, &user, req.minutes);
    Ok(Json(blocking(Internal, adjusted).await?))
}

/// `limit` of a listing query: 1-500, `default` when absent.
fn listing_limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(default);
    if !(1..=MAX_BATCH).contains(&limit) {
        return Err(BillingError::Invalid { field: "limit", reason: "must be 1-500".into() }.into());
    }
    Ok(limit)
}

/// A page of a listing, newest first.
#[derive(Debug, Serialize, schemars::JsonSchema)]
#[schemars(rename = "{T}Page")]
struct Entries<T> {
    entries: Vec<T>,
}

async fn audit_log(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<LedgerQuery>,
) -> Result<Json<Entries<AuditEntry>>, ApiError> {
    let limit = listing_limit(q.limit, 100)?;
    let billing = st.billing.clone();
    let entries =
        blocking(Internal, move || billing.registry.admin_audit(limit, q.before).map_err(BillingError::from)).await?;
    Ok(Json(Entries { entries }))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LedgerQuery {
    limit: Option<usize>,
    before: Option<i64>,
}

async fn ledger(
    State(st): State<AppState>,
    ApiPath(user): ApiPath<String>,
    ApiQuery(q): ApiQuery<LedgerQuery>,
) -> Result<Json<Entries<LedgerEntry>>, ApiError> {
    let limit = listing_limit(q.limit, 100)?;
    let billing = st.billing.clone();
    let entries = blocking(Internal, move || billing.registry.ledger(&user, limit, q.before)).await?;
    Ok(Json(Entries { entries }))
}
