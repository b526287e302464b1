//! The embedded registry in the bucket (issue 23): a consistent copy of `control/registry.sqlite3`
//! shipped to the object store as `registry/s<millis>` within `metadata_sync_interval_ms` of a
//! change (each object written once; the one it replaces deleted after), and put back from there
//! when a daemon or `scopefs restore` finds no registry on its disk.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use scopefs::db_files;
use scopefs::registry::Registry;
use scopefs::store::ObjectStore;

/// Prefix of the registry's shipped copies.
const PREFIX: &str = "registry/";

/// The registry being shipped, and its change count at its newest shipped copy (`u64::MAX`:
/// none shipped by this process yet).
static SHIPPING: OnceLock<Weak<Registry>> = OnceLock::new();
static SHIPPED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Changes of the registry made and not yet in the store (for `/metrics`: 0 once its newest
/// change is shipped; not 0 before the first copy of this process is, or without shipping).
pub fn unshipped_changes() -> u64 {
    let Some(registry) = SHIPPING.get().and_then(Weak::upgrade) else { return 1 };
    let now = registry.changes();
    match SHIPPED_AT.load(Ordering::Acquire) {
        u64::MAX => now + 1,
        at => now.saturating_sub(at),
    }
}

fn key_of(millis: u64) -> String {
    format!("{PREFIX}s{millis:016x}")
}

/// The newest shipped copy's key.
async fn newest(store: &dyn ObjectStore) -> anyhow::Result<Option<String>> {
    let listed = store.list(PREFIX).await.context("listing the registry's shipped copies")?;
    Ok(listed.into_iter().map(|o| o.key).filter(|k| k.len() == PREFIX.len() + 17).max())
}

/// Puts the newest shipped registry at `path` when no file is there; `false` when the bucket
/// holds none (a new deployment).
pub async fn restore_if_missing(store: &dyn ObjectStore, path: &Path) -> anyhow::Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    let Some(key) = newest(store).await? else { return Ok(false) };
    let bytes = store.get(&key).await.context("reading the registry's shipped copy")?;
    let staged = db_files::staged_copy(path, &bytes).context("writing the registry's copy")?;
    db_files::replace_with(path, &staged, &db_files::WAL_AND_SHM).context("putting the registry in place")?;
    tracing::info!(bytes = bytes.len(), "restored the registry from the object store");
    Ok(true)
}

/// Ships the registry every `interval` when it changed; runs until the runtime ends.
pub fn start(registry: Arc<Registry>, store: Arc<dyn ObjectStore>, copy: std::path::PathBuf, interval: Duration) {
    let _ = SHIPPING.set(Arc::downgrade(&registry));
    tokio::spawn(async move {
        let mut shipped_at = u64::MAX;
        let mut last_key: Option<String> = None;
        let mut last_millis = 0u64;
        loop {
            let changes = registry.changes();
            if changes != shipped_at {
                let millis = (registry.now_ms().max(0) as u64).max(last_millis + 1);
                match ship_once(&registry, store.as_ref(), &copy, millis).await {
                    Ok(key) => {
                        // What this copy supersedes: the previous one, or (the first of this
                        // process) every older one in the bucket.
                        let old: Vec<String> = match last_key.replace(key.clone()) {
                            Some(old) => vec![old],
                            None => store
                                .list(PREFIX)
                                .await
                                .map(|l| l.into_iter().map(|o| o.key).collect())
                                .unwrap_or_default(),
                        };
                        for k in old.into_iter().filter(|k| *k < key) {
                            let _ = store.delete(&k).await;
                        }
                        shipped_at = changes;
                        SHIPPED_AT.store(changes, Ordering::Release);
                        last_millis = millis;
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "shipping the registry to the object store failed; it is retried")
                    }
                }
            }
            tokio::time::sleep(interval).await;
        }
    });
}

async fn ship_once(registry: &Registry, store: &dyn ObjectStore, copy: &Path, millis: u64) -> anyhow::Result<String> {
    let bytes = tokio::task::block_in_place(|| -> anyhow::Result<Vec<u8>> {
        registry.snapshot_to(copy).context("copying the registry")?;
        let bytes = std::fs::read(copy)?;
        let _ = std::fs::remove_file(copy);
        Ok(bytes)
    })?;
    let key = key_of(millis);
    store.put(&key, Bytes::from(bytes)).await.context("putting the registry's copy")?;
    Ok(key)
}
