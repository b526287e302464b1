//! The daemon configuration: one TOML file, `SCOPEFS_*` environment overrides, embedded defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::{Durability, Quota, StorageSettings};

/// The `SCOPEFS_*` environment overlay.
mod env;
mod gc;
mod nodes;

pub use env::{is_non_config_env, NON_CONFIG_ENV};
pub use gc::GcConfig;
pub use nodes::{NodeConfig, RegistryConfig};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file: {0}")]
    Read(#[source] std::io::Error),
    #[error("config file is invalid: {0}")]
    Parse(String),
    #[error("environment variable {key} has an invalid value: {reason}")]
    Env { key: String, reason: String },
    #[error("unknown environment variable {0}: no configuration key has this name (see NON_CONFIG_ENV for the other SCOPEFS_* variables)")]
    UnknownEnv(String),
    #[error("invalid configuration: {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

/// Where file bytes live.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreConfig {
    /// A local object directory (embedded default: `<data_dir>/objects`).
    Local { path: Option<PathBuf> },
    /// An S3-compatible bucket.
    S3 {
        endpoint: Option<String>,
        region: String,
        bucket: String,
        #[serde(default)]
        prefix: String,
        #[serde(default = "default_true")]
        path_style: bool,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
    },
}

fn default_true() -> bool {
    true
}

/// FUSE mount settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FuseConfig {
    /// Kernel entry/attribute cache lifetime in milliseconds (0 disables caching).
    pub attr_ttl_ms: u64,
    /// FUSE worker threads, one pool shared by every mount (idle mounts cost no thread).
    pub threads: usize,
    /// Workers one mount may hold at once: its further requests wait in the kernel until one of
    /// its requests is done, so one scope's blocking requests (a storm of `fsync`s waiting on
    /// uploads) leave the other workers to the other scopes. Above `threads` it is `threads`.
    pub max_workers_per_mount: usize,
    /// Let users other than the daemon's (containers) use the mounts.
    pub allow_other: bool,
    /// Largest write request the kernel may send, KiB (4..=16384; the kernel caps it at
    /// `/proc/sys/fs/fuse/max_pages_limit` pages, 1 MiB by default).
    pub max_write_kib: u32,
    /// Keep a file's cached pages across opens (`FOPEN_KEEP_CACHE`); changes made through the
    /// HTTP API drop them (the engine's change observer).
    pub keep_cache: bool,
    /// Let the kernel buffer writes in its page cache (`FUSE_WRITEBACK_CACHE`); a refused write
    /// (`EDQUOT`, `ENOSPC`) then surfaces on `close` (flush) or `fsync` instead of on `write`.
    pub writeback_cache: bool,
    /// Kernel readahead of each mount, KiB (0..=16384; 0: none), set on its backing device at
    /// mount: FUSE's INIT can only lower the kernel's default of 128 KiB.
    pub readahead_kib: u32,
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            attr_ttl_ms: 60_000,
            threads: 16,
            max_workers_per_mount: 8,
            allow_other: true,
            max_write_kib: 1024,
            keep_cache: true,
            writeback_cache: false,
            readahead_kib: 1024,
        }
    }
}

/// The whole daemon configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub deployment_id: String,
    pub data_dir: PathBuf,
    pub mount_root: PathBuf,
    pub listen: String,
    pub allow_remote: bool,
    pub service_token: Option<String>,
    pub admin_token: Option<String>,
    /// Secret of the HMAC-signed `/tools/*` API (seed 003 §4.3); generated into
    /// `<data_dir>/control/hmac-secret` on first start when absent.
    pub hmac_secret: Option<String>,
    /// How far `auth_context.issued_at` of a signed request may be from now, either way, in seconds.
    pub signature_window_secs: u64,
    /// Whether the file tools of one conversation reach another conversation's files
    /// (`/threads/{id}/…`) and the user's global store (`/__global__/…`) without a signed grant.
    pub peer_views: PeerViews,
    pub durability: Durability,
    pub block_size: u64,
    pub cache_max_bytes: u64,
    pub staging_max_bytes: u64,
    /// Largest dirty block kept in memory and journaled inline in the scope's metadata database
    /// at close (0: every dirty block is a staging file); at most `block_size` and 1 MiB.
    pub inline_block_max_bytes: u64,
    /// Bytes of in-memory dirty blocks across all scopes.
    pub dirty_memory_max_bytes: u64,
    /// SQLite heap of the whole daemon (the page caches of every open metadata database and the
    /// registry): a soft limit past which caches recycle pages instead of growing (0: none).
    pub metadata_cache_max_bytes: u64,
    /// Bytes of blocks being downloaded from the object store at once (see `StorageSettings`).
    pub fetch_memory_max_bytes: u64,
    pub upload_parallelism: usize,
    /// Upload slots one scope may hold at once (at most `upload_parallelism` of them are used).
    pub upload_parallelism_per_scope: usize,
    /// How long a closed file's new blocks wait before their background upload (grouping a
    /// burst of closes into a few uploads); `fsync` never waits for it.
    pub upload_delay_ms: u64,
    /// Whether a block a writer has filled is uploaded to a remote store while the file is still
    /// being written (fsync then uploads only the rest).
    pub early_upload: bool,
    /// How long a file held open may keep changes uncommitted (in memory, in staging, in the
    /// open-file log) before they are committed and its new blocks queued for upload.
    pub dirty_writeback_secs: u64,
    /// Whether each scope's committed metadata (and the registry) is shipped to the object store,
    /// so the bucket alone restores them (`scopefs restore`).
    pub metadata_shipping: bool,
    /// How long a committed metadata batch may wait before it is shipped (the bound on what a lost
    /// host loses of names and versions not `fsync`ed); `fsync` ships at once.
    pub metadata_sync_interval_ms: u64,
    pub store_timeout_ms: u64,
    pub store_attempts: u32,
    pub readahead_blocks: u64,
    pub quota_bytes: u64,
    pub quota_inodes: u64,
    pub trash_retention_days: u64,
    pub draft_ttl_hours: u64,
    /// How long a delete waits for a scope's owners to settle before it records why it cannot finish.
    pub delete_drain_secs: u64,
    /// Interval of the maintenance loop (draft expiry, delete retries, purge); at least 1.
    pub maintenance_interval_secs: u64,
    /// Largest single upload or file write through the HTTP API, in bytes.
    pub max_upload_bytes: u64,
    /// Read-only legacy shared workspace that files can be imported from (seed 000 §11.1); none by default.
    pub legacy_root: Option<PathBuf>,
    pub store: StoreConfig,
    pub fuse: FuseConfig,
    /// The sandbox executor (SPEC §8).
    pub executor: ExecutorConfig,
    /// `[pricing]`: compute billing (SPEC §9).
    pub pricing: crate::billing::PricingConfig,
    /// `[billing]`: who charges for compute (this daemon, or the gateway it reports to).
    pub billing: BillingConfig,
    /// `[limits]`: every bound a tenant's requests, kernel operations or containers control.
    pub limits: crate::limits::LimitsConfig,
    /// `[cutover]`: the required-mode gate of seed 000 §11.1 (off by default).
    pub cutover: CutoverConfig,
    /// `[registry]`: where the registry lives (embedded SQLite unless `url` names PostgreSQL).
    pub registry: RegistryConfig,
    /// `[node]`: this daemon as one node of several (off unless `id` is set).
    pub node: NodeConfig,
    /// `[gc]`: online garbage collection of unreferenced blocks.
    pub gc: GcConfig,
}

/// Who charges for compute: one billing authority per deployment (seed 003 §10.2 has the gateway
/// settle and then call `/admin/mark-settled`; a daemon that also charged would bill twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BillingMode {
    /// This daemon settles (the default): its pending-usage loop charges each record once, and
    /// `/admin/mark-settled` settles a record now (charged at most once whoever asks).
    #[default]
    Settle,
    /// The gateway settles: the daemon records usage and artifacts and never charges;
    /// `/admin/mark-settled` only marks a record settled (`reported`).
    Report,
}

/// `[billing]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BillingConfig {
    pub mode: BillingMode,
}

/// Who may reach the views outside a conversation's own `/workspace` through the file tools (seed
/// 000 §4: conversation A's tools cannot see B's files; seed 003 §3.7: peer views with permission).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerViews {
    /// Only a request whose signed `auth_context.object_scope` names the path (the default):
    /// containers already need a signed `input_objects` grant for the same views.
    #[default]
    Granted,
    /// Any request of the same user (a deployment whose conversations may read each other).
    Open,
}

/// Whether provisioning a thread that has no scope yet waits for a verified migration report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CutoverMode {
    /// Any thread may be provisioned (the default; nothing is checked).
    #[default]
    Off,
    /// A thread without a scope is provisioned only while the migration report checks out
    /// (its deployment id, `passed` status and SHA-256 match the recorded cutover operation);
    /// otherwise it is answered `409 migration-required`. The daemon does not start in this mode
    /// unless the report checks out (record it in mode `off` first).
    Required,
}

/// `[cutover]`: seed 000 §11.1's required-mode gate.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CutoverConfig {
    pub mode: CutoverMode,
    /// The migration report (JSON: `operation_id`, `deployment_id`, `status`), e.g.
    /// `<control>/cutover-reports/latest.json`; required when `mode = "required"`.
    pub report: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        let s = StorageSettings::default();
        Config {
            deployment_id: "default".into(),
            data_dir: PathBuf::from("/var/lib/scopefs"),
            mount_root: PathBuf::from("/run/scopefs/scopes"),
            listen: "127.0.0.1:7070".into(),
            allow_remote: false,
            service_token: None,
            admin_token: None,
            hmac_secret: None,
            signature_window_secs: 300,
            peer_views: PeerViews::Granted,
            durability: s.durability,
            block_size: s.block_size,
            cache_max_bytes: s.cache_max_bytes,
            staging_max_bytes: s.staging_max_bytes,
            inline_block_max_bytes: s.inline_block_max_bytes,
            dirty_memory_max_bytes: s.dirty_memory_max_bytes,
            metadata_cache_max_bytes: s.metadata_cache_max_bytes,
            fetch_memory_max_bytes: s.fetch_memory_max_bytes,
            upload_parallelism: s.upload_parallelism,
            upload_parallelism_per_scope: s.upload_parallelism_per_scope,
            upload_delay_ms: s.upload_delay.as_millis() as u64,
            early_upload: s.early_upload,
            dirty_writeback_secs: s.dirty_writeback.as_secs(),
            metadata_shipping: true,
            metadata_sync_interval_ms: 1000,
            store_timeout_ms: s.store_timeout.as_millis() as u64,
            store_attempts: s.store_attempts,
            readahead_blocks: s.readahead_blocks,
            quota_bytes: 10 * 1024 * 1024 * 1024,
            quota_inodes: 1_000_000,
            trash_retention_days: 7,
            draft_ttl_hours: 24,
            delete_drain_secs: 30,
            maintenance_interval_secs: 60,
            max_upload_bytes: 512 * 1024 * 1024,
            legacy_root: None,
            store: StoreConfig::Local { path: None },
            fuse: FuseConfig::default(),
            executor: ExecutorConfig::default(),
            pricing: crate::billing::PricingConfig::default(),
            billing: BillingConfig::default(),
            limits: crate::limits::LimitsConfig::default(),
            cutover: CutoverConfig::default(),
            registry: RegistryConfig::default(),
            node: NodeConfig::default(),
            gc: GcConfig::default(),
        }
    }
}

impl Config {
    /// Parses TOML text (unknown keys are refused, naming the key).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// Loads `path` if given (else defaults), then applies `SCOPEFS_*` overrides from `env`, then
    /// validates. `SCOPEFS_<KEY>` / `SCOPEFS_<SECTION>_<KEY>` override any key (`env` module); an
    /// unknown `SCOPEFS_*` name not listed in [`NON_CONFIG_ENV`] is refused.
    pub fn load(path: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let mut cfg = match path {
            Some(p) => Self::from_toml(&std::fs::read_to_string(p).map_err(ConfigError::Read)?)?,
            None => Config::default(),
        };
        for (k, v) in env {
            env::apply(&mut cfg, &k, &v)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Refuses values the daemon cannot run with, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| Err(ConfigError::Invalid { key, reason: reason.into() });
        if self.block_size < 64 * 1024 || self.block_size > 64 * 1024 * 1024 {
            return invalid("block_size", "must be between 64 KiB and 64 MiB");
        }
        if self.fetch_memory_max_bytes < 2 * self.block_size {
            return invalid("fetch_memory_max_bytes", "must be at least two blocks (2 x block_size)");
        }
        if self.inline_block_max_bytes > self.block_size.min(1024 * 1024) {
            return invalid("inline_block_max_bytes", "must be at most block_size and 1 MiB");
        }
        if self.upload_parallelism == 0 {
            return invalid("upload_parallelism", "must be at least 1");
        }
        if self.upload_parallelism_per_scope == 0 {
            return invalid("upload_parallelism_per_scope", "must be at least 1");
        }
        if self.upload_delay_ms > 60_000 {
            return invalid("upload_delay_ms", "must be at most 60000");
        }
        if self.store_attempts == 0 {
            return invalid("store_attempts", "must be at least 1");
        }
        if self.store_timeout_ms == 0 {
            return invalid("store_timeout_ms", "must be at least 1");
        }
        if self.cutover.mode == CutoverMode::Required && self.cutover.report.is_none() {
            return invalid("cutover.report", "must be set when cutover.mode is \"required\"");
        }
        self.registry.validate()?;
        self.node.validate(&self.registry)?;
        self.gc.validate()?;
        if self.maintenance_interval_secs == 0 {
            return invalid("maintenance_interval_secs", "must be at least 1");
        }
        if self.dirty_writeback_secs == 0 {
            return invalid("dirty_writeback_secs", "must be at least 1");
        }
        if !(10..=600_000).contains(&self.metadata_sync_interval_ms) {
            return invalid("metadata_sync_interval_ms", "must be between 10 and 600000");
        }
        if self.signature_window_secs == 0 || self.signature_window_secs > 86_400 {
            return invalid("signature_window_secs", "must be between 1 and 86400");
        }
        if self.fuse.threads == 0 {
            return invalid("fuse.threads", "must be at least 1");
        }
        if self.fuse.max_workers_per_mount == 0 {
            return invalid("fuse.max_workers_per_mount", "must be at least 1");
        }
        if !(4..=16 * 1024).contains(&self.fuse.max_write_kib) {
            return invalid("fuse.max_write_kib", "must be between 4 and 16384");
        }
        if self.fuse.readahead_kib > 16 * 1024 {
            return invalid("fuse.readahead_kib", "must be at most 16384");
        }
        if self.deployment_id.is_empty() || self.deployment_id.len() > 64 {
            return invalid("deployment_id", "must be 1-64 characters");
        }
        if let StoreConfig::S3 { bucket, .. } = &self.store {
            if bucket.is_empty() {
                return invalid("store.bucket", "must be set for an s3 store");
            }
        }
        self.pricing.validate().map_err(|e| ConfigError::Invalid { key: e.key, reason: e.reason })?;
        self.limits.validate().map_err(|(key, reason)| ConfigError::Invalid { key, reason })?;
        self.executor.validate()
    }

    /// The engine settings this configuration describes.
    pub fn storage_settings(&self) -> StorageSettings {
        StorageSettings {
            block_size: self.block_size,
            durability: self.durability,
            cache_max_bytes: self.cache_max_bytes,
            staging_max_bytes: self.staging_max_bytes,
            upload_parallelism: self.upload_parallelism,
            upload_parallelism_per_scope: self.upload_parallelism_per_scope,
            upload_delay: Duration::from_millis(self.upload_delay_ms),
            early_upload: self.early_upload,
            store_timeout: Duration::from_millis(self.store_timeout_ms),
            store_attempts: self.store_attempts,
            readahead_blocks: self.readahead_blocks,
            staging_max_bytes_per_scope: self.limits.staging_max_bytes_per_scope,
            max_path_depth: self.limits.max_path_depth,
            max_path_bytes: self.limits.max_path_bytes,
            max_walk_entries: self.limits.max_walk_entries,
            max_listing_bytes: self.limits.max_listing_bytes,
            listing_memory_per_scope_bytes: self.limits.listing_memory_per_scope_bytes,
            listing_memory_max_bytes: self.limits.listing_memory_max_bytes,
            max_xattrs_per_inode: self.limits.max_xattrs_per_inode,
            max_xattr_bytes_per_inode: self.limits.max_xattr_bytes_per_inode,
            max_links_per_file: self.limits.max_links_per_file,
            max_open_scope_databases: self.limits.max_open_scope_databases,
            inline_block_max_bytes: self.inline_block_max_bytes,
            dirty_memory_max_bytes: self.dirty_memory_max_bytes,
            dirty_memory_per_scope_bytes: self.limits.dirty_memory_per_scope_bytes,
            dirty_writeback: Duration::from_secs(self.dirty_writeback_secs),
            metadata_sync: self.metadata_shipping.then(|| Duration::from_millis(self.metadata_sync_interval_ms)),
            metadata_queue_per_scope_bytes: self.limits.metadata_queue_per_scope_bytes,
            metadata_queue_max_bytes: self.limits.metadata_queue_max_bytes,
            open_log_max_bytes: self.limits.open_log_max_bytes_per_scope,
            metadata_cache_max_bytes: self.metadata_cache_max_bytes,
            fetch_memory_max_bytes: self.fetch_memory_max_bytes,
            fetch_memory_per_scope_bytes: self.limits.fetch_memory_per_scope_bytes,
        }
    }

    /// The default quota of new scopes.
    pub fn default_quota(&self) -> Quota {
        Quota { bytes: self.quota_bytes, inodes: self.quota_inodes }
    }
}

/// The default `executor.user`: a uid:gid far above every host account range (and outside the
/// usual subuid ranges), so no host user shares it.
pub const DEFAULT_SANDBOX_USER: &str = "2000000000:2000000000";

/// How strictly the sandbox policy is enforced.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Docker missing: the daemon starts and the compute tools answer 503; weak settings are warnings.
    Optional,
    /// Refuse to start without a reachable engine, a digest-pinned image and the full container policy.
    Required,
}

/// `[executor]`: the sandbox containers agent commands run in (SPEC §8). `SCOPEFS_EXECUTOR_<KEY>`
/// variables override each key (e.g. `SCOPEFS_EXECUTOR_IMAGE`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorConfig {
    /// The sandbox image; `name@sha256:<digest>` (or an image id `sha256:<digest>`) pins it.
    pub image: String,
    /// The user commands run as: numeric `uid:gid`, never root. The default has no host account
    /// (review M6: a host user with the sandbox's uid could reach running scopes through `/proc`);
    /// strict mode refuses a uid that is in the host's `/etc/passwd`.
    pub user: String,
    /// Memory limit per environment (also the memory+swap limit: no swap).
    pub memory_bytes: u64,
    /// CPU limit per environment in billionths of a CPU.
    pub nano_cpus: u64,
    /// Process limit per environment.
    pub pids_limit: u64,
    /// Size of the tmpfs at `/tmp` (the root filesystem is read-only).
    pub tmp_bytes: u64,
    /// Docker network mode: `none` (default) or `bridge`.
    pub network: String,
    /// Largest stdout+stderr an `execute_command` returns; more is cut and flagged `truncated`.
    pub max_output_bytes: u64,
    /// Default and largest `execute_command` timeout.
    pub command_timeout_secs: u64,
    /// Largest runtime of an environment; it is killed when it is reached.
    pub max_runtime_secs: u64,
    /// Live environments one scope may have at once.
    pub max_environments_per_scope: u64,
    /// Largest log a background process keeps (bytes); output beyond it is dropped.
    pub max_process_log_bytes: u64,
    pub isolation: Isolation,
    /// The Docker engine socket: `unix:///path` or an absolute path.
    pub docker_host: String,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            image: "scopefs-sandbox:busybox".into(),
            user: DEFAULT_SANDBOX_USER.into(),
            memory_bytes: 1024 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids_limit: 256,
            tmp_bytes: 256 * 1024 * 1024,
            network: "none".into(),
            max_output_bytes: 1024 * 1024,
            command_timeout_secs: 600,
            max_runtime_secs: 4 * 3600,
            max_environments_per_scope: 4,
            max_process_log_bytes: 16 * 1024 * 1024,
            isolation: Isolation::Optional,
            docker_host: "unix:///var/run/docker.sock".into(),
        }
    }
}

impl ExecutorConfig {
    /// The socket path of `docker_host`, if it names a Unix socket.
    pub fn docker_socket(&self) -> Option<&str> {
        let path = self.docker_host.strip_prefix("unix://").unwrap_or(&self.docker_host);
        path.starts_with('/').then_some(path)
    }

    /// Refuses values no mode can run with, naming the key (strict mode checks more at startup).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| Err(ConfigError::Invalid { key, reason: reason.into() });
        if self.image.trim().is_empty() {
            return invalid("executor.image", "must name the sandbox image");
        }
        let numeric = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
        if !self.user.split_once(':').is_some_and(|(u, g)| numeric(u) && numeric(g)) {
            return invalid(
                "executor.user",
                "must be a numeric uid:gid of a non-root user (e.g. 2000000000:2000000000)",
            );
        }
        if !matches!(self.network.as_str(), "none" | "bridge") {
            return invalid("executor.network", "must be none or bridge");
        }
        if self.max_output_bytes == 0 {
            return invalid("executor.max_output_bytes", "must be at least 1");
        }
        if self.command_timeout_secs == 0 {
            return invalid("executor.command_timeout_secs", "must be at least 1");
        }
        if self.max_runtime_secs == 0 {
            return invalid("executor.max_runtime_secs", "must be at least 1");
        }
        if self.max_environments_per_scope == 0 {
            return invalid("executor.max_environments_per_scope", "must be at least 1");
        }
        if self.docker_socket().is_none() {
            return invalid("executor.docker_host", "must be a Unix socket (unix:///path or /path)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_unknown_keys_refused() {
        Config::default().validate().unwrap();
        let err = Config::from_toml("no_such_key = 1").unwrap_err().to_string();
        assert!(err.contains("no_such_key"), "{err}");
    }

    #[test]
    fn fuse_fast_path_keys_parse_and_max_write_and_readahead_are_bounded() {
        let d = Config::default().fuse;
        assert_eq!((d.max_write_kib, d.keep_cache, d.writeback_cache, d.readahead_kib), (1024, true, false, 1024));
        let cfg = Config::from_toml(
            "[fuse]\nmax_write_kib = 4096\nkeep_cache = false\nwriteback_cache = true\nreadahead_kib = 0\n",
        )
        .unwrap();
        assert_eq!(
            (cfg.fuse.max_write_kib, cfg.fuse.keep_cache, cfg.fuse.writeback_cache, cfg.fuse.readahead_kib),
            (4096, false, true, 0)
        );
        cfg.validate().unwrap();
        for bad in [0, 3, 16 * 1024 + 1] {
            let cfg = Config::from_toml(&format!("[fuse]\nmax_write_kib = {bad}\n")).unwrap();
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains("fuse.max_write_kib"), "{err}");
        }
        Config::from_toml("[fuse]\nreadahead_kib = 16384\n").unwrap().validate().unwrap();
        let cfg = Config::from_toml("[fuse]\nreadahead_kib = 16385\n").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("fuse.readahead_kib"), "{err}");
    }

    #[test]
    fn cutover_is_off_by_default_and_required_needs_a_report() {
        assert_eq!(Config::default().cutover.mode, CutoverMode::Off);
        let cfg = Config::from_toml("[cutover]\nmode = \"required\"\nreport = \"/r/latest.json\"\n").unwrap();
        cfg.validate().unwrap();
        let report = cfg.cutover.report.as_deref();
        assert_eq!((cfg.cutover.mode, report), (CutoverMode::Required, Some(std::path::Path::new("/r/latest.json"))));
        let err = Config::from_toml("[cutover]\nmode = \"required\"\n").unwrap().validate().unwrap_err().to_string();
        assert!(err.contains("cutover.report"), "{err}");
        assert!(Config::from_toml("[cutover]\nmode = \"lazy\"\n").is_err());
    }

    #[test]
    fn env_overrides() {
        let env = vec![
            ("SCOPEFS_DURABILITY".to_string(), "close".to_string()),
            ("SCOPEFS_S3_BUCKET".to_string(), "b".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ];
        let cfg = Config::load(None, env).unwrap();
        assert_eq!(cfg.durability, Durability::Close);
        assert!(matches!(cfg.store, StoreConfig::S3 { ref bucket, .. } if bucket == "b"));
        let bad = vec![("SCOPEFS_QUOTA_BYTES".to_string(), "lots".to_string())];
        let err = Config::load(None, bad).unwrap_err().to_string();
        assert!(err.contains("SCOPEFS_QUOTA_BYTES"), "{err}");
    }

    #[test]
    fn executor_section_env_and_validation() {
        let cfg = Config::from_toml("[executor]\nimage = \"img@sha256:ab\"\nisolation = \"required\"").unwrap();
        assert_eq!(cfg.executor.isolation, Isolation::Required);
        assert_eq!(cfg.executor.network, "none");
        let env = vec![
            ("SCOPEFS_EXECUTOR_NETWORK".to_string(), "bridge".to_string()),
            ("SCOPEFS_EXECUTOR_PIDS_LIMIT".to_string(), "64".to_string()),
            ("SCOPEFS_EXECUTOR_DOCKER_HOST".to_string(), "/tmp/none.sock".to_string()),
        ];
        let cfg = Config::load(None, env).unwrap();
        assert_eq!((cfg.executor.network.as_str(), cfg.executor.pids_limit), ("bridge", 64));
        assert_eq!(cfg.executor.docker_socket(), Some("/tmp/none.sock"));
        let host = vec![("SCOPEFS_EXECUTOR_NETWORK".to_string(), "host".to_string())];
        assert!(Config::load(None, host).unwrap_err().to_string().contains("executor.network"));
        let tcp = vec![("SCOPEFS_EXECUTOR_DOCKER_HOST".to_string(), "tcp://1.2.3.4:2375".to_string())];
        assert!(Config::load(None, tcp).unwrap_err().to_string().contains("executor.docker_host"));
        let typo = vec![("SCOPEFS_EXECUTOR_IMAGES".to_string(), "x".to_string())];
        assert!(Config::load(None, typo).unwrap_err().to_string().contains("SCOPEFS_EXECUTOR_IMAGES"));
        let iso = vec![("SCOPEFS_EXECUTOR_ISOLATION".to_string(), "strict".to_string())];
        assert!(Config::load(None, iso).is_err());
    }

    #[test]
    fn executor_user_must_be_a_numeric_uid_gid_with_a_high_default() {
        assert_eq!(Config::default().executor.user, "2000000000:2000000000");
        for bad in ["1000", "1000:", ":1000", "agent", "agent:agent", "1000:1000:1", "99999999999:1"] {
            let env = vec![("SCOPEFS_EXECUTOR_USER".to_string(), bad.to_string())];
            let err = Config::load(None, env).unwrap_err().to_string();
            assert!(err.contains("executor.user"), "{bad:?}: {err}");
        }
        let ok = vec![("SCOPEFS_EXECUTOR_USER".to_string(), "1234:5678".to_string())];
        assert_eq!(Config::load(None, ok).unwrap().executor.user, "1234:5678");
    }
}

#[cfg(test)]
mod pricing_tests {
    use super::*;
    use crate::billing::Micros;

    #[test]
    fn pricing_section_defaults_parse_and_refuse_a_price_not_above_zero() {
        let cfg = Config::default();
        assert_eq!(cfg.pricing.overtime_price_per_minute, Micros::from_micros(50_000));
        assert_eq!(cfg.pricing.default_plan, "starter");
        let text = "[pricing]\ncurrency = \"EUR\"\npricing_version = \"v2\"\novertime_price_per_minute = \"0.100000\"\n\
                    default_plan = \"team\"\n[pricing.plans.team]\ncompute_allowed = true\nmonthly_minutes = 30\nhard_max_runtime_seconds = 600\n";
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.pricing.plan("team").unwrap().monthly_minutes, 30);
        assert_eq!(cfg.pricing.overtime_price_per_minute.to_string(), "0.100000");
        for price in ["\"0\"", "\"0.000000\"", "\"-1.0\""] {
            let cfg = Config::from_toml(&format!("[pricing]\novertime_price_per_minute = {price}\n")).unwrap();
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains("pricing.overtime_price_per_minute"), "{err}");
        }
        // A float or excess precision never becomes money.
        for price in ["0.05", "\"0.0500001\"", "\"abc\""] {
            let err = Config::from_toml(&format!("[pricing]\novertime_price_per_minute = {price}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("overtime_price_per_minute"), "{err}");
        }
        let err =
            Config::from_toml("[pricing]\ndefault_plan = \"nope\"\n").unwrap().validate().unwrap_err().to_string();
        assert!(err.contains("pricing.default_plan"), "{err}");
    }
}
