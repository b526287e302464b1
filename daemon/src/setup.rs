//! Shared start-up pieces of every command: config file resolution, logging, data paths, store and mount settings.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use scopefs::config::{Config, StoreConfig};
use scopefs::store::{LocalDirStore, ObjectStore, S3Settings, S3Store, StoreError};
use scopefs_fs::MountOptions;

/// The config file used when `--config`/`SCOPEFS_CONFIG` is not given, if it exists.
pub const DEFAULT_CONFIG: &str = "/etc/scopefs/scopefs.toml";

/// Loads the configuration: the given file, else `DEFAULT_CONFIG` if present, else embedded
/// defaults; `SCOPEFS_*` environment variables override it.
pub fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    let default = Path::new(DEFAULT_CONFIG);
    let path = path.or_else(|| default.exists().then_some(default));
    Config::load(path, std::env::vars()).context("loading the configuration")
}

/// Installs the tracing subscriber: human-readable, or JSON with `SCOPEFS_LOG_FORMAT=json`;
/// the filter comes from `SCOPEFS_LOG` (default `default_level`).
pub fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SCOPEFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let json = std::env::var("SCOPEFS_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// `<data_dir>/control`, created 0700 (registry and token files live there). `data_dir` itself is
/// made 0700 too, whoever created it (review L5): every tenant's staged blocks live below it.
pub fn control_dir(cfg: &Config) -> std::io::Result<PathBuf> {
    let dir = cfg.data_dir.join("control");
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    std::fs::set_permissions(&cfg.data_dir, std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// Path of the registry database.
pub fn registry_path(cfg: &Config) -> PathBuf {
    cfg.data_dir.join("control").join("registry.sqlite3")
}

/// Opens the registry `[registry]` names: PostgreSQL when `url` is set, else the embedded SQLite
/// file at [`registry_path`].
pub fn open_registry(cfg: &Config) -> Result<scopefs::registry::Registry, scopefs::registry::RegistryError> {
    use scopefs::registry::{PgSettings, Registry};
    match &cfg.registry.url {
        Some(url) => Registry::open_postgres(&PgSettings {
            url: url.clone(),
            pool_size: cfg.registry.pool_size,
            schema: cfg.registry.schema.clone(),
        }),
        None => Registry::open(&registry_path(cfg)),
    }
}

/// Builds the object store the configuration describes. Must run inside a Tokio runtime context.
pub fn build_store(cfg: &Config) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Ok(match &cfg.store {
        StoreConfig::Local { path } => {
            let path = path.clone().unwrap_or_else(|| cfg.data_dir.join("objects"));
            Arc::new(LocalDirStore::new(path)?)
        }
        StoreConfig::S3 { endpoint, region, bucket, prefix, path_style, access_key_id, secret_access_key } => {
            Arc::new(S3Store::new(S3Settings {
                endpoint: endpoint.clone(),
                region: region.clone(),
                bucket: bucket.clone(),
                prefix: prefix.clone(),
                path_style: *path_style,
                access_key_id: access_key_id.clone(),
                secret_access_key: secret_access_key.clone(),
            })?)
        }
    })
}

/// Runs the store probe (put/get/delete) with an overall bound.
pub async fn probe_store(store: &dyn ObjectStore, bound: Duration) -> Result<(), StoreError> {
    match tokio::time::timeout(bound, scopefs::store::probe(store)).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(bound)),
    }
}

/// How long the startup probe may take at most.
pub fn probe_bound(cfg: &Config) -> Duration {
    Duration::from_millis(cfg.store_timeout_ms.saturating_mul(u64::from(cfg.store_attempts)))
        .max(Duration::from_secs(5))
}

/// Mount settings from the configuration.
pub fn mount_options(cfg: &Config) -> MountOptions {
    MountOptions {
        attr_ttl: Duration::from_millis(cfg.fuse.attr_ttl_ms),
        threads: cfg.fuse.threads,
        max_workers_per_mount: cfg.fuse.max_workers_per_mount,
        allow_other: cfg.fuse.allow_other,
        max_dir_handles: cfg.limits.max_dir_handles_per_mount,
        fast_paths: scopefs_fs::FastPaths {
            max_write: cfg.fuse.max_write_kib.saturating_mul(1024),
            keep_cache: cfg.fuse.keep_cache,
            writeback_cache: cfg.fuse.writeback_cache,
            readahead_kib: cfg.fuse.readahead_kib,
        },
    }
}

/// The runtime that carries the HTTP server and every object-store request.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("scopefs-rt")
        .build()
        .context("starting the async runtime")
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_data_dir_made_by_someone_else_is_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = Config { data_dir: data.clone(), ..Config::default() };
        let control = control_dir(&cfg).unwrap();
        for dir in [&data, &control] {
            assert_eq!(std::fs::metadata(dir).unwrap().permissions().mode() & 0o777, 0o700, "{}", dir.display());
        }
    }
}
