//! `[limits]`: every bound a request, a kernel operation or a container controls, and the
//! process-wide count of refusals per bound (rendered by `/metrics` as
//! `scopefs_limit_refused_total{bound}`).
//!
//! A bound is checked before the work it bounds is done. When it is hit the caller refuses the
//! request (HTTP 413/429/503, errno `E2BIG`/`ENAMETOOLONG`/`ENFILE`/`ENOSPC`…) and calls
//! [`refuse`] with the [`Bound`] it hit, so an operator sees which limit a tenant ran into.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use serde::{Deserialize, Serialize};

/// `[limits]` of the configuration file. Every key is documented in `packaging/scopefs.toml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    // --- file engine (core) ---
    /// Bytes one scope may hold staged (written, not yet uploaded); the global budget is
    /// `staging_max_bytes`.
    pub staging_max_bytes_per_scope: u64,
    /// Bytes of in-memory dirty blocks one scope may hold (of `dirty_memory_max_bytes`); past it
    /// the scope's dirty blocks are staging files.
    pub dirty_memory_per_scope_bytes: u64,
    /// Bytes of a scope's open-file log (what open files were told was written and not yet
    /// committed); past it each change of an open file is committed at once instead of logged,
    /// and every open file's changes are committed so the log starts over.
    pub open_log_max_bytes_per_scope: u64,
    /// Bytes of `fetch_memory_max_bytes` (blocks being downloaded) one scope may hold; past it its
    /// readers wait for its own downloads and its readahead is skipped (at least one download).
    pub fetch_memory_per_scope_bytes: u64,
    /// Bytes of committed metadata batches one scope may hold waiting to be shipped to the object
    /// store; past it they are dropped for a snapshot of the scope's database (which covers them).
    pub metadata_queue_per_scope_bytes: u64,
    /// The same, for every scope of the daemon together.
    pub metadata_queue_max_bytes: u64,
    /// Components of a path from the scope root (mkdir, rename, symlink and API paths).
    pub max_path_depth: u32,
    /// Bytes of a path from the scope root.
    pub max_path_bytes: u32,
    /// Entries a recursive listing, recursive delete or zip download may visit.
    pub max_walk_entries: u64,
    /// Bytes of entries (paths plus `engine::listing::ENTRY_OVERHEAD_BYTES` each) one listing
    /// may build; the queue of a grep/glob walk too.
    pub max_listing_bytes: u64,
    /// Bytes of listings one scope may hold at once.
    pub listing_memory_per_scope_bytes: u64,
    /// Bytes of listings the daemon holds at once.
    pub listing_memory_max_bytes: u64,
    /// Extended attributes (`user.*`) one inode may carry; one more is refused with `ENOSPC`.
    pub max_xattrs_per_inode: u64,
    /// Bytes (names plus values) of one inode's extended attributes; more is refused with `ENOSPC`.
    pub max_xattr_bytes_per_inode: u64,
    /// Names (hard links) one file may have; one more is refused with `EMLINK`.
    pub max_links_per_file: u32,
    /// Open files the daemon may hold (`RLIMIT_NOFILE`, raised at start as far as the kernel's
    /// `nr_open` allows). Each mounted scope holds about four.
    pub max_open_files: u64,
    /// Scope metadata databases open at once (three descriptors and a page cache each); past it
    /// the one opened longest ago and not in use is closed. A scope opens its database on first use.
    pub max_open_scope_databases: usize,

    // --- FUSE adapter ---
    /// Open directory handles per mount.
    pub max_dir_handles_per_mount: u64,

    // --- HTTP API ---
    /// Connections the HTTP server serves at once; more wait in the listen backlog.
    pub http_max_connections: usize,
    /// Time a client has to send a request's headers (seconds).
    pub http_header_timeout_secs: u64,
    /// Time a request (headers, body and answer) may take before it is cancelled (seconds);
    /// `execute_command` and uploads have their own larger limits.
    pub http_request_timeout_secs: u64,
    /// Time a client may take no bytes of an answer being sent before its connection is closed
    /// (seconds): what the answer holds (a budget's charge, a stream's buffers) is given back.
    pub http_send_timeout_secs: u64,
    /// `/tools/*` bodies read and verified at once, before authentication (the rest wait).
    pub tools_max_unauthenticated_bodies: usize,
    /// Bytes of `/tools` request bodies the daemon holds at once, from the first byte read until
    /// the request is answered (waiting for a worker included), and of the answers that can be
    /// large until sent; a request that finds no room within `http_header_timeout_secs` is 503
    /// `busy`.
    pub tools_body_memory_bytes: u64,
    /// Bytes of `tools_body_memory_bytes` one user's answers hold at once (past it: 429
    /// `user_busy`), so one caller that does not read its answers cannot hold the whole budget.
    pub tools_body_memory_per_user_bytes: u64,
    /// JSON values (objects, arrays, strings, numbers…) a signed body may contain.
    pub tools_max_json_values: u64,
    /// Nesting depth of a signed body's JSON.
    pub tools_max_json_depth: u32,
    /// Blocking worker threads per route class (`api`, `tools`, `exec`: commands of
    /// `execute_command`, `internal`).
    pub workers_per_route_class: usize,
    /// Workers of one route class one scope (or WebUI thread) may hold at once; its further
    /// requests wait for its own.
    pub route_workers_per_scope: usize,
    /// Workers of one route class one user's signed requests may hold at once, across scopes.
    pub route_workers_per_user: usize,
    /// Signed `/tools` requests plus `/api` streams (downloads, uploads, zip) one scope may have in
    /// flight at once.
    pub max_inflight_per_scope: usize,
    /// Bytes of a `grep_files` pattern.
    pub grep_max_pattern_bytes: u64,
    /// Bytes of a `glob_files` pattern.
    pub glob_max_pattern_bytes: u64,
    /// Bytes a compiled `grep_files` regular expression may take (its program and its lazy DFA
    /// cache each): a pattern that compiles larger is refused before any file is searched.
    pub grep_max_regex_bytes: u64,
    /// Bytes of the unified diff `edit_file` returns; a longer diff is cut there and says so.
    pub edit_max_diff_bytes: u64,

    // --- executor ---
    /// `execute_command` calls one scope may run at once.
    pub max_concurrent_execs_per_scope: u64,
    /// Background processes one scope may have running at once.
    pub max_live_processes_per_scope: u64,
    /// Background-process logs one scope keeps (the oldest finished ones are removed beyond).
    pub max_process_logs_per_scope: u64,
    /// Files one `destroy_environment` turns into artifacts (seed 003 §3.8); with more, nothing is
    /// read or recorded (the environment ends all the same, its answer names the paths).
    pub max_artifact_files: u64,
    /// Total bytes of those files (each is read once to hash it).
    pub max_artifact_bytes: u64,
    /// Snapshots one scope keeps of environments' outputs (each costs the scope's metadata); past
    /// them, outputs are hashed in the live scope and name no snapshot.
    pub max_output_snapshots_per_scope: u64,
    /// Entries of a `create_environment`/`destroy_environment` path list (`default_output_paths`,
    /// `output_paths`), and the views (`/threads/{id}`, `/__global__`) one `input_objects` grants.
    pub max_environment_paths: u64,
    /// Entries of one `create_environment`'s `input_objects` (seed 003 §3.7's manifest lists every
    /// active file of the conversation; only a count and the views it grants are recorded).
    pub max_input_objects: u64,

    // --- shared compute (seed 003 §5, §15) ---
    /// Shared-pool environments one user may have live at once (seed §15.2
    /// `max_user_concurrency`); one more shared request is 429 before anything runs. 0 turns
    /// shared compute off (every environment gets a dedicated container).
    pub max_shared_environments_per_user: u64,
    /// Longest runtime a shared environment may ask for (seconds); a request asking more (or
    /// naming no runtime) is not eligible and gets a dedicated container.
    pub shared_max_runtime_secs: u64,
    /// Seconds a warm shared container may stay unused before it is removed.
    pub shared_idle_secs: u64,
    /// Total `size_bytes` of a shared request's `input_objects`.
    pub shared_max_input_bytes: u64,
    /// `limits.max_output_bytes` (artifact bytes) of a shared environment, at most and by default.
    pub shared_max_output_bytes: u64,
    /// `limits.max_stdout_stderr_bytes` of a shared environment, at most and by default.
    pub shared_max_stdout_stderr_bytes: u64,
    /// `limits.max_files` (input objects, artifacts) of a shared environment, at most and by default.
    pub shared_max_files: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            staging_max_bytes_per_scope: 2 * 1024 * 1024 * 1024,
            dirty_memory_per_scope_bytes: 16 * 1024 * 1024,
            open_log_max_bytes_per_scope: 64 * 1024 * 1024,
            fetch_memory_per_scope_bytes: 64 * 1024 * 1024,
            metadata_queue_per_scope_bytes: 16 * 1024 * 1024,
            metadata_queue_max_bytes: 64 * 1024 * 1024,
            max_path_depth: 512,
            max_path_bytes: 16 * 1024,
            max_walk_entries: 200_000,
            max_listing_bytes: 64 * 1024 * 1024,
            listing_memory_per_scope_bytes: 128 * 1024 * 1024,
            listing_memory_max_bytes: 256 * 1024 * 1024,
            max_xattrs_per_inode: 128,
            max_xattr_bytes_per_inode: 256 * 1024,
            max_links_per_file: 65_000,
            max_open_files: 1 << 20,
            max_open_scope_databases: 2048,
            max_dir_handles_per_mount: 1024,
            http_max_connections: 1024,
            http_header_timeout_secs: 10,
            http_request_timeout_secs: 120,
            http_send_timeout_secs: 60,
            tools_max_unauthenticated_bodies: 16,
            tools_body_memory_bytes: 128 * 1024 * 1024,
            tools_body_memory_per_user_bytes: 64 * 1024 * 1024,
            tools_max_json_values: 1_000_000,
            tools_max_json_depth: 64,
            workers_per_route_class: 64,
            max_inflight_per_scope: 16,
            route_workers_per_scope: 8,
            route_workers_per_user: 16,
            grep_max_pattern_bytes: 1024,
            glob_max_pattern_bytes: 1024,
            grep_max_regex_bytes: 1024 * 1024,
            edit_max_diff_bytes: 64 * 1024,
            max_concurrent_execs_per_scope: 4,
            max_live_processes_per_scope: 16,
            max_process_logs_per_scope: 64,
            max_artifact_files: 1000,
            max_artifact_bytes: 1024 * 1024 * 1024,
            max_output_snapshots_per_scope: 64,
            max_environment_paths: 64,
            max_input_objects: 10_000,
            max_shared_environments_per_user: 2,
            shared_max_runtime_secs: 60,
            shared_idle_secs: 120,
            shared_max_input_bytes: 10 * 1024 * 1024,
            shared_max_output_bytes: 10 * 1024 * 1024,
            shared_max_stdout_stderr_bytes: 1024 * 1024,
            shared_max_files: 100,
        }
    }
}

impl LimitsConfig {
    /// Refuses zero values (a bound of 0 would refuse everything), naming the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let checks: [(&'static str, u64); 49] = [
            ("limits.staging_max_bytes_per_scope", self.staging_max_bytes_per_scope),
            ("limits.metadata_queue_per_scope_bytes", self.metadata_queue_per_scope_bytes),
            ("limits.metadata_queue_max_bytes", self.metadata_queue_max_bytes),
            ("limits.dirty_memory_per_scope_bytes", self.dirty_memory_per_scope_bytes),
            ("limits.open_log_max_bytes_per_scope", self.open_log_max_bytes_per_scope),
            ("limits.fetch_memory_per_scope_bytes", self.fetch_memory_per_scope_bytes),
            ("limits.max_path_depth", u64::from(self.max_path_depth)),
            ("limits.max_path_bytes", u64::from(self.max_path_bytes)),
            ("limits.max_walk_entries", self.max_walk_entries),
            ("limits.max_listing_bytes", self.max_listing_bytes),
            ("limits.listing_memory_per_scope_bytes", self.listing_memory_per_scope_bytes),
            ("limits.listing_memory_max_bytes", self.listing_memory_max_bytes),
            ("limits.max_xattrs_per_inode", self.max_xattrs_per_inode),
            ("limits.max_xattr_bytes_per_inode", self.max_xattr_bytes_per_inode),
            ("limits.max_links_per_file", u64::from(self.max_links_per_file)),
            ("limits.max_open_files", self.max_open_files),
            ("limits.max_open_scope_databases", self.max_open_scope_databases as u64),
            ("limits.max_dir_handles_per_mount", self.max_dir_handles_per_mount),
            ("limits.http_max_connections", self.http_max_connections as u64),
            ("limits.http_header_timeout_secs", self.http_header_timeout_secs),
            ("limits.http_request_timeout_secs", self.http_request_timeout_secs),
            ("limits.http_send_timeout_secs", self.http_send_timeout_secs),
            ("limits.tools_max_unauthenticated_bodies", self.tools_max_unauthenticated_bodies as u64),
            ("limits.tools_body_memory_bytes", self.tools_body_memory_bytes),
            ("limits.tools_body_memory_per_user_bytes", self.tools_body_memory_per_user_bytes),
            ("limits.tools_max_json_values", self.tools_max_json_values),
            ("limits.tools_max_json_depth", u64::from(self.tools_max_json_depth)),
            ("limits.workers_per_route_class", self.workers_per_route_class as u64),
            ("limits.max_inflight_per_scope", self.max_inflight_per_scope as u64),
            ("limits.route_workers_per_scope", self.route_workers_per_scope as u64),
            ("limits.route_workers_per_user", self.route_workers_per_user as u64),
            ("limits.grep_max_pattern_bytes", self.grep_max_pattern_bytes),
            ("limits.glob_max_pattern_bytes", self.glob_max_pattern_bytes),
            ("limits.grep_max_regex_bytes", self.grep_max_regex_bytes),
            ("limits.edit_max_diff_bytes", self.edit_max_diff_bytes),
            ("limits.max_concurrent_execs_per_scope", self.max_concurrent_execs_per_scope),
            ("limits.max_live_processes_per_scope", self.max_live_processes_per_scope),
            ("limits.max_process_logs_per_scope", self.max_process_logs_per_scope),
            ("limits.max_artifact_files", self.max_artifact_files),
            ("limits.max_artifact_bytes", self.max_artifact_bytes),
            ("limits.max_output_snapshots_per_scope", self.max_output_snapshots_per_scope),
            ("limits.max_environment_paths", self.max_environment_paths),
            ("limits.max_input_objects", self.max_input_objects),
            ("limits.shared_max_runtime_secs", self.shared_max_runtime_secs),
            ("limits.shared_idle_secs", self.shared_idle_secs),
            ("limits.shared_max_input_bytes", self.shared_max_input_bytes),
            ("limits.shared_max_output_bytes", self.shared_max_output_bytes),
            ("limits.shared_max_stdout_stderr_bytes", self.shared_max_stdout_stderr_bytes),
            ("limits.shared_max_files", self.shared_max_files),
        ];
        match checks.iter().find(|(_, v)| *v == 0) {
            Some((key, _)) => Err((key, "must be at least 1".into())),
            None => Ok(()),
        }
    }
}

/// A bound whose refusals are counted. The label is the metric's `bound` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    StagingGlobal,
    StagingPerScope,
    PathDepth,
    PathBytes,
    WalkEntries,
    DirHandles,
    EditResult,
    BodyBytes,
    JsonValues,
    JsonDepth,
    UnauthenticatedBodies,
    InflightPerScope,
    RouteWorkers,
    GrepPattern,
    GlobPattern,
    GrepRegex,
    EditDiff,
    ConcurrentExecs,
    LiveProcesses,
    Environments,
    ArtifactFiles,
    ArtifactBytes,
    EnvironmentPaths,
    InputObjects,
    QuotaBytes,
    QuotaInodes,
    FileSize,
    InodeXattrs,
    HardLinks,
    SharedPerUser,
    ListingBytes,
    ListingMemory,
    ToolsBodyMemory,
    SendTimeout,
    ToolsBodyMemoryPerUser,
}

impl Bound {
    /// Every bound, in metric order.
    pub const ALL: [Bound; 35] = [
        Bound::StagingGlobal,
        Bound::StagingPerScope,
        Bound::PathDepth,
        Bound::PathBytes,
        Bound::WalkEntries,
        Bound::DirHandles,
        Bound::EditResult,
        Bound::BodyBytes,
        Bound::JsonValues,
        Bound::JsonDepth,
        Bound::UnauthenticatedBodies,
        Bound::InflightPerScope,
        Bound::RouteWorkers,
        Bound::GrepPattern,
        Bound::GlobPattern,
        Bound::GrepRegex,
        Bound::EditDiff,
        Bound::ConcurrentExecs,
        Bound::LiveProcesses,
        Bound::Environments,
        Bound::ArtifactFiles,
        Bound::ArtifactBytes,
        Bound::EnvironmentPaths,
        Bound::InputObjects,
        Bound::QuotaBytes,
        Bound::QuotaInodes,
        Bound::FileSize,
        Bound::InodeXattrs,
        Bound::HardLinks,
        Bound::SharedPerUser,
        Bound::ListingBytes,
        Bound::ListingMemory,
        Bound::ToolsBodyMemory,
        Bound::SendTimeout,
        Bound::ToolsBodyMemoryPerUser,
    ];

    /// The metric label of this bound.
    pub fn label(self) -> &'static str {
        match self {
            Bound::StagingGlobal => "staging_global",
            Bound::StagingPerScope => "staging_per_scope",
            Bound::PathDepth => "path_depth",
            Bound::PathBytes => "path_bytes",
            Bound::WalkEntries => "walk_entries",
            Bound::DirHandles => "dir_handles",
            Bound::EditResult => "edit_result",
            Bound::BodyBytes => "body_bytes",
            Bound::JsonValues => "json_values",
            Bound::JsonDepth => "json_depth",
            Bound::UnauthenticatedBodies => "unauthenticated_bodies",
            Bound::InflightPerScope => "inflight_per_scope",
            Bound::RouteWorkers => "route_workers",
            Bound::GrepPattern => "grep_pattern",
            Bound::GlobPattern => "glob_pattern",
            Bound::GrepRegex => "grep_regex",
            Bound::EditDiff => "edit_diff",
            Bound::ConcurrentExecs => "concurrent_execs",
            Bound::LiveProcesses => "live_processes",
            Bound::Environments => "environments",
            Bound::ArtifactFiles => "artifact_files",
            Bound::ArtifactBytes => "artifact_bytes",
            Bound::EnvironmentPaths => "environment_paths",
            Bound::InputObjects => "input_objects",
            Bound::QuotaBytes => "quota_bytes",
            Bound::QuotaInodes => "quota_inodes",
            Bound::FileSize => "file_size",
            Bound::InodeXattrs => "inode_xattrs",
            Bound::HardLinks => "hard_links",
            Bound::SharedPerUser => "shared_environments_per_user",
            Bound::ListingBytes => "listing_bytes",
            Bound::ListingMemory => "listing_memory",
            Bound::ToolsBodyMemory => "tools_body_memory",
            Bound::SendTimeout => "send_timeout",
            Bound::ToolsBodyMemoryPerUser => "tools_body_memory_per_user",
        }
    }

    fn index(self) -> usize {
        Bound::ALL.iter().position(|b| *b == self).unwrap_or(0)
    }
}

/// At most `max` holders per scope at once (commands, requests in flight…): a slot is taken before
/// the work starts and given back when the [`ScopeSlot`] is dropped.
#[derive(Debug, Clone)]
pub struct PerScopeSlots {
    held: Arc<Mutex<HashMap<String, u64>>>,
    max: u64,
    bound: Bound,
}

/// One slot of a scope in a [`PerScopeSlots`]; dropping it frees the slot.
#[derive(Debug)]
pub struct ScopeSlot {
    held: Arc<Mutex<HashMap<String, u64>>>,
    scope: String,
}

impl PerScopeSlots {
    /// Slots of at most `max` (at least 1) per scope; refusals are counted under `bound`.
    pub fn new(max: u64, bound: Bound) -> PerScopeSlots {
        PerScopeSlots { held: Arc::default(), max: max.max(1), bound }
    }

    /// One more slot of `scope`, or `None` (counted as a refusal) when it holds `max` already.
    pub fn try_acquire(&self, scope: &str) -> Option<ScopeSlot> {
        let mut held = self.held.lock();
        let n = held.entry(scope.to_string()).or_insert(0);
        if *n >= self.max {
            refuse(self.bound);
            return None;
        }
        *n += 1;
        Some(ScopeSlot { held: self.held.clone(), scope: scope.to_string() })
    }

    /// One more slot of `scope` while it holds fewer than `at_most` and `max`, else `None` (counted
    /// as a refusal).
    pub fn try_acquire_within(&self, scope: &str, at_most: u64) -> Option<ScopeSlot> {
        let mut held = self.held.lock();
        let n = held.entry(scope.to_string()).or_insert(0);
        if *n >= self.max.min(at_most) {
            refuse(self.bound);
            return None;
        }
        *n += 1;
        Some(ScopeSlot { held: self.held.clone(), scope: scope.to_string() })
    }

    /// One more slot of `scope` even beyond `max`: for work that already runs (an environment
    /// adopted after a restart), so that it counts against new work until it ends.
    pub fn acquire_running(&self, scope: &str) -> ScopeSlot {
        *self.held.lock().entry(scope.to_string()).or_insert(0) += 1;
        ScopeSlot { held: self.held.clone(), scope: scope.to_string() }
    }
}

impl Drop for ScopeSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(n) = held.get_mut(&self.scope) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.scope);
            }
        }
    }
}

static REFUSED: [AtomicU64; Bound::ALL.len()] = [const { AtomicU64::new(0) }; Bound::ALL.len()];

/// Counts one refusal because `bound` was reached.
pub fn refuse(bound: Bound) {
    REFUSED[bound.index()].fetch_add(1, Ordering::Relaxed);
}

/// Refusals so far, per bound (every bound, zeros included).
pub fn refusals() -> Vec<(&'static str, u64)> {
    Bound::ALL.iter().map(|b| (b.label(), REFUSED[b.index()].load(Ordering::Relaxed))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique_and_counts_grow() {
        let mut labels: Vec<_> = Bound::ALL.iter().map(|b| b.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Bound::ALL.len());
        let before = refusals().iter().find(|(l, _)| *l == "grep_pattern").map(|(_, n)| *n).unwrap_or(0);
        refuse(Bound::GrepPattern);
        let after = refusals().iter().find(|(l, _)| *l == "grep_pattern").map(|(_, n)| *n).unwrap_or(0);
        assert!(after > before);
    }

    #[test]
    fn per_scope_slots_bound_each_scope_alone_and_come_back_on_drop() {
        let slots = PerScopeSlots::new(2, Bound::ConcurrentExecs);
        let (a1, a2) = (slots.try_acquire("a").unwrap(), slots.try_acquire("a").unwrap());
        assert!(slots.try_acquire("a").is_none());
        let b = slots.try_acquire("b");
        assert!(b.is_some());
        drop(a1);
        assert!(slots.try_acquire("a").is_some());
        drop((a2, b));
        assert!(slots.held.lock().is_empty());
    }

    #[test]
    fn zero_bounds_are_refused_by_name() {
        let l = LimitsConfig { max_path_depth: 0, ..LimitsConfig::default() };
        assert_eq!(l.validate().unwrap_err().0, "limits.max_path_depth");
        assert!(LimitsConfig::default().validate().is_ok());
    }
}
