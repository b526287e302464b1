//! What the admin page shows, gathered through the services the JSON routes call: registry reads
//! (scopes, environments, processes, accounts, ledger, usage, artifacts), the engine's listing of
//! `/api/workspace/list`, billing's cost so far, the executor's ping and the store's probe. No SQL
//! and no rule of its own: each function runs blocking on the caller's pool and only collects.

use std::time::{Duration, SystemTime};

use scopefs::billing::{BillingError, Charge};
use scopefs::engine::{Quota, Usage};
use scopefs::ids::ScopeId;
use scopefs::registry::billing::{Account, LedgerEntry, UsageRecord};
use scopefs::registry::environments::{EnvironmentRecord, ProcessRecord};
use scopefs::registry::{ScopeRecord, ScopeState};

use crate::api::{ApiError, AppState};
use crate::services::ServiceError;

/// Most rows one table of the page shows (the rest are counted, not listed).
pub const MAX_ROWS: usize = 500;
/// Most processes shown per environment, and ledger entries per account.
pub const MAX_DETAIL_ROWS: usize = 100;
/// How long the health page waits for the store's put/get/delete probe.
const PROBE_BOUND: Duration = Duration::from_secs(10);

/// One scope as the page lists it.
pub struct ScopeRow {
    pub scope_id: String,
    pub thread_id: String,
    pub user_id: Option<String>,
    pub state: ScopeState,
    /// Files and bytes, when the scope is open (a closed scope's database is not opened for this).
    pub usage: Option<Usage>,
    pub quota: Quota,
    /// The node that serves it (a daemon alone: `this daemon`).
    pub node: String,
}

/// Every scope, by state.
pub struct ScopesView {
    pub total: usize,
    pub groups: Vec<(ScopeState, Vec<ScopeRow>)>,
}

fn registry_error(e: scopefs::registry::RegistryError) -> ServiceError {
    ServiceError::Registry(e)
}

fn scope_row(st: &AppState, rec: ScopeRecord) -> Result<ScopeRow, ServiceError> {
    let open = st.scopes.open_scopes();
    let engine = open.get(&rec.scope_id);
    let usage = engine.as_ref().and_then(|e| e.usage_known().ok().flatten());
    let quota = engine.map_or_else(|| rec.quota_or(open.default_quota()), |e| e.quota());
    let node = match &st.cluster {
        None => "this daemon".to_owned(),
        Some(_) => st
            .scopes
            .registry()
            .placement(&rec.scope_id)
            .map_err(registry_error)?
            .map_or_else(|| "not placed".to_owned(), |p| p.node_id),
    };
    Ok(ScopeRow {
        scope_id: rec.scope_id.to_string(),
        thread_id: rec.primary_thread_id.to_string(),
        user_id: rec.user_id,
        state: rec.state,
        usage,
        quota,
        node,
    })
}

/// The scopes page: every scope (most recently changed first, at most [`MAX_ROWS`]) by state.
pub fn scopes(st: &AppState) -> Result<ScopesView, ServiceError> {
    let mut all = st.scopes.registry().list().map_err(registry_error)?;
    let total = all.len();
    all.sort_by_key(|r| std::cmp::Reverse(r.updated_at));
    all.truncate(MAX_ROWS);
    let mut groups: Vec<(ScopeState, Vec<ScopeRow>)> = ScopeState::ALL.iter().map(|s| (*s, Vec::new())).collect();
    for rec in all {
        let row = scope_row(st, rec)?;
        if let Some((_, rows)) = groups.iter_mut().find(|(s, _)| *s == row.state) {
            rows.push(row);
        }
    }
    Ok(ScopesView { total, groups })
}

/// One entry of a directory listing.
pub struct FileRow {
    pub name: String,
    /// From the scope's root, with a leading `/` (what `/api/workspace` calls a path).
    pub path: String,
    pub kind: &'static str,
    pub size: u64,
    pub modified: Option<SystemTime>,
}

/// One scope: its row, one directory's entries (or why not) and its environments.
pub struct ScopeView {
    pub scope: ScopeRow,
    pub dir: String,
    pub files: Result<Vec<FileRow>, ApiError>,
    /// More entries than shown.
    pub more_files: usize,
    pub environments: Vec<EnvironmentRecord>,
}

/// The scope page: `dir` listed through the engine of the scope's thread, as
/// `GET /api/workspace/list` does (the same listing bounds), and every environment of the scope.
pub fn scope(st: &AppState, scope: &ScopeId, dir: &str) -> Result<ScopeView, ApiError> {
    let rec = st.scopes.registry().get(scope).map_err(registry_error)?.ok_or(ServiceError::ScopeNotFound)?;
    let thread = rec.primary_thread_id.clone();
    let environments = st.compute.registry().environments(scope).map_err(registry_error)?;
    let row = scope_row(st, rec)?;
    let mut more_files = 0;
    let files = st
        .files
        .engine_for_thread_at(&thread, None)
        .and_then(|(_, engine)| Ok(engine.list_path(dir, false)?))
        .map_err(ApiError::workspace)
        .map(|listing| {
            let (entries, _charge) = listing.into_parts();
            more_files = entries.len().saturating_sub(MAX_ROWS);
            entries
                .into_iter()
                .take(MAX_ROWS)
                .map(|e| FileRow {
                    name: scopefs::vpath::file_name(&e.path).to_owned(),
                    path: format!("/{}", e.path.trim_start_matches('/')),
                    kind: crate::api::file_kind_name(e.attr.kind),
                    size: e.attr.size,
                    modified: Some(e.attr.mtime),
                })
                .collect()
        });
    Ok(ScopeView { scope: row, dir: dir.to_owned(), files, more_files, environments })
}

/// One live environment with its processes and what it would cost if it ended now.
pub struct EnvRow {
    pub env: EnvironmentRecord,
    pub processes: Vec<ProcessRecord>,
    /// The currency and the charge (`BillingService::cost_so_far`), or why it is unknown.
    pub cost: Result<(String, Charge), String>,
}

/// The environments page: live environments (at most [`MAX_ROWS`]), `now_ms` the registry's clock.
pub fn environments(st: &AppState) -> Result<(i64, usize, Vec<EnvRow>), ServiceError> {
    let registry = st.compute.registry();
    let now = registry.now_ms();
    let mut live = registry.live_environments().map_err(registry_error)?;
    let total = live.len();
    live.truncate(MAX_ROWS);
    let mut rows = Vec::with_capacity(live.len());
    for env in live {
        let mut processes = registry.processes(&env.scope_id, Some(&env.environment_id)).map_err(registry_error)?;
        processes.truncate(MAX_DETAIL_ROWS);
        let cost = st.billing.cost_so_far(&env, now).map_err(|e| e.to_string());
        rows.push(EnvRow { env, processes, cost });
    }
    Ok((now, total, rows))
}

/// The accounts page: most recently changed first.
pub fn accounts(st: &AppState) -> Result<Vec<Account>, BillingError> {
    st.billing.registry.accounts(MAX_ROWS)
}

/// One account and its newest ledger entries; `None` when there is no such account.
pub fn account(st: &AppState, user: &str) -> Result<Option<(Account, Vec<LedgerEntry>)>, BillingError> {
    let Some(account) = st.billing.registry.account(user)? else { return Ok(None) };
    let ledger = st.billing.registry.ledger(user, MAX_DETAIL_ROWS, None)?;
    Ok(Some((account, ledger)))
}

/// A usage record with its artifacts' paths (relative to `/workspace`, or `/__global__/…`).
pub struct UsageRow {
    pub usage: UsageRecord,
    pub artifacts: Vec<String>,
}

/// The usage page: pending records (least recently attempted first) and settled ones (oldest
/// first), as `/admin/pending-usage` lists them.
pub fn usage(st: &AppState) -> Result<(Vec<UsageRow>, Vec<UsageRow>), BillingError> {
    let billing = &st.billing;
    let with_artifacts = |records: Vec<UsageRecord>| -> Result<Vec<UsageRow>, BillingError> {
        records
            .into_iter()
            .map(|usage| {
                let rows = billing.registry.artifact_manifest(&usage.environment_id)?;
                Ok(UsageRow { artifacts: rows.into_iter().map(|r| r.entry.path).collect(), usage })
            })
            .collect()
    };
    let pending = with_artifacts(billing.registry.pending_usage(MAX_DETAIL_ROWS, false)?)?;
    let settled = with_artifacts(billing.registry.usage_by_state(true, MAX_DETAIL_ROWS)?)?;
    Ok((pending, settled))
}

/// Refusals counted for `/metrics`.
pub struct Refusals {
    /// `[limits]` bounds (`scopefs_limit_refused_total`): (bound, count).
    pub bounds: Vec<(&'static str, u64)>,
    /// Path, symlink and cross-scope refusals (`scopefs_refused_total`): (kind, via, count).
    pub kinds: Vec<(&'static str, &'static str, u64)>,
}

/// The refusals page, as `/metrics` counts them.
pub fn refusals() -> Refusals {
    Refusals { bounds: scopefs::limits::refusals(), kinds: crate::metrics::refused_counts().to_vec() }
}

/// One line of the health page.
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// The checks that need no I/O beyond the registry and the executor (blocking): readiness, the
/// registry, the Docker engine, open scopes and live environments. Failures are logged with their
/// detail; the page says only that they failed (an error may name a host path or socket).
pub fn health(st: &AppState) -> Vec<Check> {
    let ready = st.scopes.is_ready();
    let mut out = vec![Check {
        name: "ready",
        ok: ready,
        detail: if ready { "mounts and recovery done" } else { "starting or stopping" }.into(),
    }];
    let reg = &st.billing.registry;
    let registry = st.scopes.registry().nodes();
    out.push(Check {
        name: "registry",
        ok: registry.is_ok(),
        detail: match registry {
            Ok(_) => format!("{} answers (schema version {})", reg.backend_name(), reg.schema_version()),
            Err(e) => failed("registry", &e),
        },
    });
    let docker = st.compute.executor_ping();
    out.push(Check {
        name: "docker",
        ok: docker.is_ok(),
        detail: match docker {
            Ok(()) => "the executor's engine answers its ping".into(),
            Err(e) => failed("docker", &e),
        },
    });
    let counts = st.scopes.open_scopes().counts();
    out.push(Check { name: "scopes", ok: true, detail: format!("{} open, {} mounted", counts.open, counts.mounted) });
    let live = st.compute.live_environment_count();
    out.push(Check {
        name: "environments",
        ok: live.is_ok(),
        detail: match live {
            Ok(n) => format!("{n} live on this node"),
            Err(e) => failed("environments", &e),
        },
    });
    out
}

/// The object store's put/get/delete probe (what startup and `scopefs doctor` run), bounded.
pub async fn store_check(st: &AppState) -> Check {
    let store = st.scopes.open_scopes().storage().store().clone();
    let started = std::time::Instant::now();
    match crate::setup::probe_store(store.as_ref(), PROBE_BOUND).await {
        Ok(()) => Check {
            name: "object store",
            ok: true,
            detail: format!("put/get/delete probe passed in {} ms", started.elapsed().as_millis()),
        },
        Err(e) => Check { name: "object store", ok: false, detail: failed("object store", &e) },
    }
}

/// Logs a failed check with its detail; the text the page shows instead.
fn failed(check: &str, e: &dyn std::fmt::Display) -> String {
    tracing::warn!(check, error = %e, "admin page health check failed");
    "failed (the detail is in the daemon log)".into()
}
