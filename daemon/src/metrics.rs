//! The Prometheus text exposition of `GET /metrics` (SPEC §11; the route is `api::metrics`) and the
//! counters behind it.
//!
//! Labels carry ids and names only (scope ids, operation names, states), never paths or secrets.
//! The route needs the service token (review L9): it names every scope and costs a registry walk.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use scopefs::engine::Refusal;
use scopefs::engine::{ScopeEngine, Storage};
use scopefs::registry::{DeploymentRegistry, RegistryError, ScopeRecord, ScopeState};
use scopefs::store::{ObjectInfo, ObjectStore, StoreError};

const OPS: [&str; 5] = ["put", "get", "head", "delete", "list"];
static STORE_REQUESTS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static STORE_ERRORS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static API_REFUSED_PATH: AtomicU64 = AtomicU64::new(0);
static API_REFUSED_SYMLINK: AtomicU64 = AtomicU64::new(0);
static CROSS_SCOPE: AtomicU64 = AtomicU64::new(0);
static MAINTENANCE_PASSES: AtomicU64 = AtomicU64::new(0);
static MAINTENANCE_SKIPPED: AtomicU64 = AtomicU64::new(0);
static GC_PASSES: AtomicU64 = AtomicU64::new(0);
static RUNS_WITHOUT_SCOPE: AtomicU64 = AtomicU64::new(0);
static ORPHAN_DIRECTORIES: AtomicU64 = AtomicU64::new(0);
static METADATA_MISMATCHES_NOW: AtomicU64 = AtomicU64::new(0);
static METADATA_MISMATCH_TOTAL: AtomicU64 = AtomicU64::new(0);
/// Scopes already counted in `METADATA_MISMATCH_TOTAL` (each mismatching scope counts once).
static MISMATCHED_SCOPES: parking_lot::Mutex<std::collections::BTreeSet<String>> =
    parking_lot::Mutex::new(std::collections::BTreeSet::new());

/// Counts a maintenance pass skipped because someone else held the `maintenance` lease.
pub fn note_maintenance_skipped() {
    MAINTENANCE_SKIPPED.fetch_add(1, Ordering::SeqCst);
}

/// (runs without scope, metadata mismatches counted, maintenance passes skipped) so far.
pub fn consistency_counters() -> (u64, u64, u64) {
    (
        RUNS_WITHOUT_SCOPE.load(Ordering::Relaxed),
        METADATA_MISMATCH_TOTAL.load(Ordering::Relaxed),
        MAINTENANCE_SKIPPED.load(Ordering::SeqCst),
    )
}

/// Counts a tool or run request whose thread resolves to no scope (answered 404; seed 000 §17).
pub fn note_run_without_scope() {
    RUNS_WITHOUT_SCOPE.fetch_add(1, Ordering::Relaxed);
}

/// Local scope directories with no registry row, as the last maintenance pass found them.
pub fn set_orphan_directories(n: usize) {
    ORPHAN_DIRECTORIES.store(n as u64, Ordering::Relaxed);
}

/// The scopes whose registry state and local metadata disagree, as the last pass found them:
/// sets the current gauge and counts each scope not seen mismatching before.
pub fn note_metadata_mismatches(scopes: &[String]) {
    METADATA_MISMATCHES_NOW.store(scopes.len() as u64, Ordering::Relaxed);
    let mut seen = MISMATCHED_SCOPES.lock();
    let new = scopes.iter().filter(|s| seen.insert((*s).clone())).count();
    METADATA_MISMATCH_TOTAL.fetch_add(new as u64, Ordering::Relaxed);
}

/// Counts one finished periodic maintenance pass (whatever its outcome): tests wait for N more.
pub fn note_maintenance_pass() {
    MAINTENANCE_PASSES.fetch_add(1, Ordering::SeqCst);
}

/// Counts a finished online gc pass (`[gc]`).
pub fn note_gc_pass() {
    GC_PASSES.fetch_add(1, Ordering::SeqCst);
}

/// Counts a path or symlink refusal answered through the HTTP API (the mounts count their own).
pub fn note_api_refusal(kind: Refusal) {
    match kind {
        Refusal::Path => API_REFUSED_PATH.fetch_add(1, Ordering::Relaxed),
        Refusal::Symlink => API_REFUSED_SYMLINK.fetch_add(1, Ordering::Relaxed),
    };
}

/// Counts a request that named another scope's environment or process (answered 404 like a
/// missing id).
pub fn note_cross_scope() {
    CROSS_SCOPE.fetch_add(1, Ordering::Relaxed);
}

/// An object store that counts requests and errors per operation (process-wide).
pub struct CountingStore(pub Arc<dyn ObjectStore>);

fn count<T>(op: usize, r: Result<T, StoreError>) -> Result<T, StoreError> {
    STORE_REQUESTS[op].fetch_add(1, Ordering::Relaxed);
    if r.is_err() {
        STORE_ERRORS[op].fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// Counts one read of an object; a missing object is an answer, not a failed request.
fn count_get<T>(r: &Result<T, StoreError>) {
    STORE_REQUESTS[1].fetch_add(1, Ordering::Relaxed);
    if matches!(r, Err(ref e) if !matches!(e, StoreError::NotFound { .. })) {
        STORE_ERRORS[1].fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        count(0, self.0.put(key, data).await)
    }
    async fn put_hashed(&self, key: &str, data: Bytes, sha256_hex: &str) -> Result<(), StoreError> {
        count(0, self.0.put_hashed(key, data, sha256_hex).await)
    }
    async fn put_many(&self, items: Vec<(String, Bytes)>, concurrency: usize) -> Vec<Result<(), StoreError>> {
        let results = self.0.put_many(items, concurrency).await;
        results.into_iter().map(|r| count(0, r)).collect()
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let r = self.0.get(key).await;
        count_get(&r);
        r
    }
    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        count(2, self.0.head(key).await)
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        count(3, self.0.delete(key).await)
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        count(4, self.0.list(prefix).await)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn reads_are_local(&self) -> bool {
        self.0.reads_are_local()
    }
    fn get_now(&self, key: &str) -> Option<Result<Bytes, StoreError>> {
        let r = self.0.get_now(key)?;
        count_get(&r);
        Some(r)
    }
    fn read_at_now(&self, key: &str, offset: u64, buf: &mut [u8]) -> Option<Result<(), StoreError>> {
        let r = self.0.read_at_now(key, offset, buf)?;
        count_get(&r);
        Some(r)
    }
}

/// Prometheus text writer: one `# HELP`/`# TYPE` per family, then its samples.
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let body: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = write!(self.0, "{{{}}}", body.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Renders every metric (blocking: reads the registry and each open scope's metadata).
pub fn render(
    registry: &DeploymentRegistry,
    engines: &[Arc<ScopeEngine>],
    storage: &Storage,
) -> Result<String, RegistryError> {
    let mut t = Text(String::new());
    scope_families(&mut t, &registry.list()?, engines);
    fuse_families(&mut t);
    unsupported_families(&mut t);
    store_families(&mut t, storage);
    shipping_families(&mut t);
    node_families(&mut t, registry)?;
    refusal_families(&mut t);
    compute_families(&mut t, registry)?;
    consistency_families(&mut t);
    supervisor_families(&mut t);
    Ok(t.0)
}

/// The configuration's memory bound (`memory_bound`), set at startup.
static MEMORY_BOUND: AtomicU64 = AtomicU64::new(0);

pub fn set_memory_bound(bytes: u64) {
    MEMORY_BOUND.store(bytes, Ordering::Relaxed);
}

/// What the supervisor told this worker (`scopefs serve` outside systemd): a crash loop shows as a
/// growing count and restart delay while the kept mounts wait.
fn supervisor_families(t: &mut Text) {
    let (crashes, delay_ms) = crate::supervisor::worker_history();
    t.family(
        "scopefs_worker_crashes_total",
        "counter",
        "Workers of this supervisor that died unasked before this one started (their mounts were kept).",
    );
    t.sample("scopefs_worker_crashes_total", &[], crashes);
    t.family(
        "scopefs_worker_restart_delay_seconds",
        "gauge",
        "How long the supervisor waited before starting this worker (doubles over consecutive crashes).",
    );
    t.sample("scopefs_worker_restart_delay_seconds", &[], delay_ms as f64 / 1000.0);
    t.family(
        "scopefs_memory_bound_bytes",
        "gauge",
        "Memory the configuration lets the daemon hold (scopefs serve --print-config), besides mounted scopes.",
    );
    t.sample("scopefs_memory_bound_bytes", &[], MEMORY_BOUND.load(Ordering::Relaxed));
}

/// Scopes by state; files, bytes, queued uploads and unshipped metadata batches of the open ones.
fn scope_families(t: &mut Text, scopes: &[ScopeRecord], engines: &[Arc<ScopeEngine>]) {
    t.family("scopefs_scopes", "gauge", "Scopes of this deployment by state.");
    for &state in ScopeState::ALL {
        let n = scopes.iter().filter(|s| s.state == state).count();
        t.sample("scopefs_scopes", &[("state", state.as_str())], n);
    }
    // Seed 000 §17's trash: deleted and not purged yet (`state="deleted"` counts purged ones too).
    t.family("scopefs_scopes_in_trash", "gauge", "Deleted scopes whose data is kept until the retention ends.");
    let trash = scopes.iter().filter(|s| s.state == ScopeState::Deleted && s.purged_at.is_none()).count();
    t.sample("scopefs_scopes_in_trash", &[], trash);

    let engines: Vec<_> = engines.iter().map(|e| (e.scope_id().clone(), e.clone())).collect();
    let mut usages = Vec::new();
    let mut upload_queue = 0usize;
    let mut metadata_queue = 0u64;
    for (id, engine) in &engines {
        // An idle scope's database is not opened for a scrape: a closed one answers from its note.
        if let Ok(Some(u)) = engine.usage_known() {
            usages.push((id.as_str().to_owned(), u));
        }
        upload_queue += engine.pending_uploads();
        metadata_queue += engine.pending_metadata_batches();
    }
    usages.sort_by(|a, b| a.0.cmp(&b.0));
    t.family(
        "scopefs_open_scope_databases",
        "gauge",
        "Scope metadata databases open now (limits.max_open_scope_databases).",
    );
    t.sample("scopefs_open_scope_databases", &[], scopefs::engine::open_databases());
    t.family(
        "scopefs_scope_files",
        "gauge",
        "Regular files per scope (its open metadata database, or what the closed one noted).",
    );
    for (id, u) in &usages {
        t.sample("scopefs_scope_files", &[("scope_id", id)], u.files);
    }
    t.family(
        "scopefs_scope_bytes",
        "gauge",
        "Logical bytes of files per scope (its open metadata database, or what the closed one noted).",
    );
    for (id, u) in &usages {
        t.sample("scopefs_scope_bytes", &[("scope_id", id)], u.bytes);
    }
    t.family("scopefs_upload_queue_blocks", "gauge", "Blocks written but not yet uploaded.");
    t.sample("scopefs_upload_queue_blocks", &[], upload_queue);
    let (dropped, dropped_bytes) = scopefs::engine::unneeded_upload_totals();
    t.family(
        "scopefs_upload_unneeded_blocks_total",
        "counter",
        "Small blocks never uploaded: no file referred to them any more when their upload's turn came.",
    );
    t.sample("scopefs_upload_unneeded_blocks_total", &[], dropped);
    t.family("scopefs_upload_unneeded_bytes_total", "counter", "Bytes of the blocks never uploaded as unneeded.");
    t.sample("scopefs_upload_unneeded_bytes_total", &[], dropped_bytes);
    t.family(
        "scopefs_metadata_unshipped_batches",
        "gauge",
        "Committed metadata batches of open scopes not yet in the object store (metadata_sync_interval_ms).",
    );
    t.sample("scopefs_metadata_unshipped_batches", &[], metadata_queue);
}

/// Scopes this process took over from nodes whose lease ran out, and let go (deposed or drained).
static TAKEN_OVER: AtomicU64 = AtomicU64::new(0);
static LET_GO: AtomicU64 = AtomicU64::new(0);

pub fn note_node_moves(taken_over: usize, let_go: usize) {
    TAKEN_OVER.fetch_add(taken_over as u64, Ordering::Relaxed);
    LET_GO.fetch_add(let_go as u64, Ordering::Relaxed);
}

/// Several nodes: each node's placed scopes, liveness and reported load; this process's moves.
fn node_families(t: &mut Text, registry: &DeploymentRegistry) -> Result<(), RegistryError> {
    let nodes = registry.nodes()?;
    if nodes.is_empty() {
        return Ok(());
    }
    let now = registry.now_ms();
    t.family("scopefs_node_scopes", "gauge", "Scopes placed on each node of the deployment.");
    for n in &nodes {
        t.sample("scopefs_node_scopes", &[("node_id", &n.node_id), ("state", n.state.as_str())], n.scopes);
    }
    t.family("scopefs_node_live", "gauge", "Whether each node's lease is running (1) or ran out (0).");
    for n in &nodes {
        t.sample("scopefs_node_live", &[("node_id", &n.node_id)], u64::from(n.is_live(now)));
    }
    t.family("scopefs_node_bytes", "gauge", "Bytes of the scopes open on each node, as its last heartbeat reported.");
    for n in &nodes {
        t.sample("scopefs_node_bytes", &[("node_id", &n.node_id)], n.bytes_used);
    }
    t.family("scopefs_node_environments", "gauge", "Live environments on each node, as its last heartbeat reported.");
    for n in &nodes {
        t.sample("scopefs_node_environments", &[("node_id", &n.node_id)], n.environments);
    }
    t.family("scopefs_node_scopes_taken_over_total", "counter", "Scopes this process took over from expired nodes.");
    t.sample("scopefs_node_scopes_taken_over_total", &[], TAKEN_OVER.load(Ordering::Relaxed));
    t.family(
        "scopefs_node_scopes_let_go_total",
        "counter",
        "Scopes this process stopped serving (deposed or drained).",
    );
    t.sample("scopefs_node_scopes_let_go_total", &[], LET_GO.load(Ordering::Relaxed));
    Ok(())
}

/// What metadata shipping put in the object store, and what of the registry it has yet to.
fn shipping_families(t: &mut Text) {
    let shipped = scopefs::engine::shipped_totals();
    t.family(
        "scopefs_metadata_shipped_objects_total",
        "counter",
        "Metadata objects (logs, snapshots) put in the object store.",
    );
    t.sample("scopefs_metadata_shipped_objects_total", &[], shipped.objects);
    t.family("scopefs_metadata_shipped_bytes_total", "counter", "Bytes of metadata objects put in the object store.");
    t.sample("scopefs_metadata_shipped_bytes_total", &[], shipped.bytes);
    t.family(
        "scopefs_metadata_snapshots_total",
        "counter",
        "Snapshots of a scope's database copied for shipping (the first of a generation, or a compaction).",
    );
    t.sample("scopefs_metadata_snapshots_total", &[], shipped.snapshots);
    t.family(
        "scopefs_metadata_snapshot_held_seconds_total",
        "counter",
        "Time snapshot copies held a scope's database (its operations wait meanwhile).",
    );
    t.sample("scopefs_metadata_snapshot_held_seconds_total", &[], shipped.snapshot_held_micros as f64 / 1e6);
    let (blocks, freed) = scopefs::engine::gc_totals();
    t.family("scopefs_gc_passes_total", "counter", "Online gc passes over the open scopes.");
    t.sample("scopefs_gc_passes_total", &[], GC_PASSES.load(Ordering::SeqCst));
    t.family("scopefs_gc_blocks_deleted_total", "counter", "Unreferenced blocks gc deleted.");
    t.sample("scopefs_gc_blocks_deleted_total", &[], blocks);
    t.family("scopefs_gc_bytes_deleted_total", "counter", "Bytes of the blocks gc deleted.");
    t.sample("scopefs_gc_bytes_deleted_total", &[], freed);
    t.family(
        "scopefs_registry_unshipped_changes",
        "gauge",
        "Registry changes not yet in the object store (0: its newest copy is shipped).",
    );
    t.sample("scopefs_registry_unshipped_changes", &[], crate::registry_ship::unshipped_changes());
}

/// FUSE operations: counts, errors and latency histograms.
fn fuse_families(t: &mut Text) {
    let ops = scopefs_fs::metrics::snapshot();
    t.family("scopefs_fuse_operations_total", "counter", "FUSE operations answered, by operation.");
    for (op, s) in &ops {
        t.sample("scopefs_fuse_operations_total", &[("op", op)], s.count);
    }
    t.family("scopefs_fuse_errors_total", "counter", "FUSE operations answered with an error, by operation.");
    for (op, s) in &ops {
        t.sample("scopefs_fuse_errors_total", &[("op", op)], s.errors);
    }
    t.family("scopefs_fuse_operation_seconds", "histogram", "Latency of FUSE operations in the engine.");
    for (op, s) in &ops {
        for (bound, n) in scopefs_fs::metrics::LATENCY_BUCKETS.iter().zip(&s.cumulative) {
            t.sample("scopefs_fuse_operation_seconds_bucket", &[("op", op), ("le", &bound.to_string())], n);
        }
        t.sample("scopefs_fuse_operation_seconds_bucket", &[("op", op), ("le", "+Inf")], s.count);
        t.sample("scopefs_fuse_operation_seconds_sum", &[("op", op)], s.sum_seconds);
        t.sample("scopefs_fuse_operation_seconds_count", &[("op", op)], s.count);
    }
    let (busy, share_waits) = scopefs_fs::metrics::pool();
    t.family("scopefs_fuse_workers_busy", "gauge", "FUSE workers serving a request now (of fuse.threads).");
    t.sample("scopefs_fuse_workers_busy", &[], busy);
    t.family(
        "scopefs_fuse_mount_share_waits_total",
        "counter",
        "Times a mount reached fuse.max_workers_per_mount busy workers (its further requests wait until one is done).",
    );
    t.sample("scopefs_fuse_mount_share_waits_total", &[], share_waits);
}

/// FUSE requests the file system does not support (answered with an error), by operation.
fn unsupported_families(t: &mut Text) {
    t.family(
        "scopefs_fuse_unsupported_total",
        "counter",
        "FUSE requests for operations or flags scopefs does not support, by operation.",
    );
    for (op, n) in scopefs_fs::metrics::unsupported() {
        t.sample("scopefs_fuse_unsupported_total", &[("op", op)], n);
    }
}

/// Object-store requests, staging and the block cache.
fn store_families(t: &mut Text, storage: &Storage) {
    t.family("scopefs_object_store_requests_total", "counter", "Object-store requests, by operation.");
    for (i, op) in OPS.iter().enumerate() {
        t.sample("scopefs_object_store_requests_total", &[("op", op)], STORE_REQUESTS[i].load(Ordering::Relaxed));
    }
    t.family("scopefs_object_store_errors_total", "counter", "Failed object-store requests, by operation.");
    for (i, op) in OPS.iter().enumerate() {
        t.sample("scopefs_object_store_errors_total", &[("op", op)], STORE_ERRORS[i].load(Ordering::Relaxed));
    }

    t.family("scopefs_staging_bytes", "gauge", "Bytes held in local staging.");
    t.sample("scopefs_staging_bytes", &[], storage.staging_bytes());
    t.family(
        "scopefs_listing_bytes",
        "gauge",
        "Bytes of listings held now (of limits.listing_memory_max_bytes), by requests and zip streams.",
    );
    t.sample("scopefs_listing_bytes", &[], storage.listing_bytes_held());
    t.family("scopefs_cache_bytes", "gauge", "Bytes held by the local block cache.");
    t.sample("scopefs_cache_bytes", &[], storage.cache_bytes());
    let (hits, misses) = storage.cache_counts();
    t.family("scopefs_cache_hits_total", "counter", "Block cache hits.");
    t.sample("scopefs_cache_hits_total", &[], hits);
    t.family("scopefs_cache_misses_total", "counter", "Block cache misses.");
    t.sample("scopefs_cache_misses_total", &[], misses);
}

/// Refused path, symlink and cross-scope attempts so far: `(kind, via, count)` (what
/// `scopefs_refused_total` renders, and the admin page shows beside the `[limits]` refusals).
pub fn refused_counts() -> [(&'static str, &'static str, u64); 5] {
    let (path, symlink) = scopefs_fs::metrics::refused();
    [
        ("path", "mount", path),
        ("symlink", "mount", symlink),
        ("path", "api", API_REFUSED_PATH.load(Ordering::Relaxed)),
        ("symlink", "api", API_REFUSED_SYMLINK.load(Ordering::Relaxed)),
        ("cross_scope", "api", CROSS_SCOPE.load(Ordering::Relaxed)),
    ]
}

/// Refused paths, symlinks, cross-scope ids and `[limits]` bounds.
fn refusal_families(t: &mut Text) {
    t.family(
        "scopefs_refused_total",
        "counter",
        "Refused path, symlink and cross-scope attempts, through the mounts and through the API.",
    );
    for (kind, via, n) in refused_counts() {
        t.sample("scopefs_refused_total", &[("kind", kind), ("via", via)], n);
    }

    t.family(
        "scopefs_limit_refused_total",
        "counter",
        "Work refused because a configured [limits] bound was reached, by bound.",
    );
    for (bound, n) in scopefs::limits::refusals() {
        t.sample("scopefs_limit_refused_total", &[("bound", bound)], n);
    }
}

/// Environments, maintenance passes and settlements.
fn compute_families(t: &mut Text, registry: &DeploymentRegistry) -> Result<(), RegistryError> {
    let running = registry.live_environments()?.len();
    t.family("scopefs_environments_running", "gauge", "Sandbox environments creating or running.");
    t.sample("scopefs_environments_running", &[], running);

    t.family("scopefs_maintenance_passes_total", "counter", "Periodic maintenance passes finished.");
    t.sample("scopefs_maintenance_passes_total", &[], MAINTENANCE_PASSES.load(Ordering::SeqCst));

    let (settled, failed, pending) = settlements(registry);
    t.family("scopefs_settlements", "gauge", "Compute usage records by settlement result.");
    t.sample("scopefs_settlements", &[("result", "settled")], settled);
    t.sample("scopefs_settlements", &[("result", "failed_attempts")], failed);
    t.family("scopefs_pending_usage", "gauge", "Compute usage records not settled yet.");
    t.sample("scopefs_pending_usage", &[], pending);
    Ok(())
}

/// Seed 000 §17: runs that found no scope, registry/metadata mismatches, orphan directories,
/// and maintenance passes skipped for an operator's lease.
fn consistency_families(t: &mut Text) {
    t.family(
        "scopefs_runs_without_scope_total",
        "counter",
        "Tool or run requests whose thread resolved to no scope (answered 404).",
    );
    t.sample("scopefs_runs_without_scope_total", &[], RUNS_WITHOUT_SCOPE.load(Ordering::Relaxed));
    t.family(
        "scopefs_metadata_mismatch_total",
        "counter",
        "Scopes found by maintenance whose registry state and local metadata disagree (each counted once).",
    );
    t.sample("scopefs_metadata_mismatch_total", &[], METADATA_MISMATCH_TOTAL.load(Ordering::Relaxed));
    t.family(
        "scopefs_metadata_mismatches",
        "gauge",
        "Registry/metadata mismatches found by the last maintenance pass.",
    );
    t.sample("scopefs_metadata_mismatches", &[], METADATA_MISMATCHES_NOW.load(Ordering::Relaxed));
    t.family(
        "scopefs_orphan_directories",
        "gauge",
        "Local scope directories (metadata or staging) with no registry scope, found by the last maintenance pass.",
    );
    t.sample("scopefs_orphan_directories", &[], ORPHAN_DIRECTORIES.load(Ordering::Relaxed));
    t.family(
        "scopefs_maintenance_skipped_total",
        "counter",
        "Maintenance passes skipped because another holder had the maintenance lease.",
    );
    t.sample("scopefs_maintenance_skipped_total", &[], MAINTENANCE_SKIPPED.load(Ordering::SeqCst));
}

/// (settled usages, failed settlement attempts of pending usages, pending usages); zeros when unreadable.
fn settlements(registry: &DeploymentRegistry) -> (usize, i64, usize) {
    let settled = registry.billing_audit().map(|a| a.settled_usages).unwrap_or(0);
    let pending = registry.pending_usage(100_000, false).unwrap_or_default();
    (settled, pending.iter().map(|u| u.settle_failures).sum(), pending.len())
}
