//! A scope's metadata database restored from the bucket alone (issue 23): the newest generation's
//! newest snapshot (`ship.rs`), the log objects that follow it without a gap run onto it in order,
//! and the blocks it names checked against the store. Used by `scopefs restore` and by a daemon
//! asked to serve a scope it has no local database of.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::fence::Head;
use super::meta::shipped::Rebuild;
use super::ship_objects::{self as ship, Shipped};
use super::{EngineError, EngineResult};
use crate::db_files;
use crate::store::{block_key_at, ObjectStore, StoreError};

/// What a restore found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoredScope {
    /// The batch number the database was restored to.
    pub seq: u64,
    /// Objects read: the snapshot and the logs after it.
    pub objects: usize,
    /// Batches run onto the snapshot.
    pub batches: u64,
    /// Staged blocks the store does not hold (their files read as damaged).
    pub blocks_missing: u64,
}

/// Attempts of each store request of a restore.
const ATTEMPTS: u32 = 4;
/// Bound on each store request of a restore.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

async fn retried<T, F, Fut>(op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    super::storage::retry_store(REQUEST_TIMEOUT, ATTEMPTS, op).await
}

/// Restores the database of `scope` at `db_path` from the bucket; `None` when the bucket holds no
/// metadata of it (nothing is written then). Whatever was at `db_path` (and its WAL and redo log)
/// is replaced once the rebuilt copy is complete; its directory is created if missing.
///
/// `upto`: with several nodes, the head the registry recorded (`Some(None)`: nothing recorded,
/// so nothing is the scope's state yet); the restore rebuilds exactly it, from its generation
/// only. Without (`None`), the newest generation's whole chain.
pub async fn restore_scope(
    store: &dyn ObjectStore,
    scope: &str,
    db_path: &Path,
    upto: Option<Option<Head>>,
) -> EngineResult<Option<RestoredScope>> {
    let prefix = ship::prefix(scope);
    let listed = retried(|| store.list(&prefix)).await?;
    let found: Vec<Shipped> = listed.iter().filter_map(|o| Shipped::parse(scope, &o.key)).collect();
    let recorded = match upto {
        Some(None) => return Ok(None),
        Some(Some(head)) => Some(head),
        None => None,
    };
    // The newest snapshot of the generation to restore (a generation's first object is its
    // snapshot): the recorded one, at or before the recorded batch; else the newest generation.
    let Some((gen, seq, state)) = found
        .iter()
        .filter_map(|o| match *o {
            Shipped::Snapshot { gen, seq, state } => Some((gen, seq, state)),
            Shipped::Log { .. } => None,
        })
        .filter(|&(g, s, _)| recorded.is_none_or(|(rg, rs, _)| g == rg && s <= rs))
        .max()
    else {
        return match recorded {
            Some(_) => Err(EngineError::Invalid("the recorded metadata chain has no snapshot in the bucket")),
            None => Ok(None),
        };
    };
    let last = recorded.map_or(u64::MAX, |(_, s, _)| s);
    let logs: BTreeMap<u64, Shipped> = found
        .iter()
        .filter_map(|o| match *o {
            Shipped::Log { gen: g, first, last: l, .. } if g == gen && first > seq && l <= last => Some((first, *o)),
            _ => None,
        })
        .collect();
    let snapshot = Shipped::Snapshot { gen, seq, state }.key(scope);
    let body = retried(|| store.get(&snapshot)).await?;
    let bytes = ship::inflate(&body).ok_or(EngineError::Invalid("a shipped metadata snapshot is damaged"))?;
    let tmp = db_files::staged_copy(db_path, &bytes)?;
    drop(bytes);
    let restored = match rebuild(store, scope, &tmp, &logs, seq).await {
        Ok(r) if recorded.is_some_and(|(_, s, _)| s != r.seq) => {
            let _ = db_files::remove_with(&tmp, &["", "-wal", "-shm"]);
            return Err(EngineError::Invalid("the recorded metadata chain is incomplete in the bucket"));
        }
        Ok(r) => r,
        Err(e) => {
            let _ = db_files::remove_with(&tmp, &["", "-wal", "-shm"]);
            return Err(e);
        }
    };
    db_files::replace_with(db_path, &tmp, &["-wal", "-shm", "-redo"])?;
    Ok(Some(restored))
}

/// Runs the chain of logs after the snapshot (batch `seq`) onto the copy at `tmp`, then settles
/// the staged blocks it names.
async fn rebuild(
    store: &dyn ObjectStore,
    scope: &str,
    tmp: &Path,
    logs: &BTreeMap<u64, Shipped>,
    seq: u64,
) -> EngineResult<RestoredScope> {
    let db = Rebuild::open(tmp)?;
    let mut out = RestoredScope { seq: db.head()?.0, objects: 1, ..Default::default() };
    if out.seq != seq {
        return Err(EngineError::Invalid("a shipped metadata snapshot is not at the batch its name says"));
    }
    while let Some(log) = logs.get(&(out.seq + 1)) {
        let key = log.key(scope);
        let body = retried(|| store.get(&key)).await?;
        let batches = ship::inflate(&body)
            .and_then(|raw| ship::decode_log(&raw))
            .ok_or(EngineError::Invalid("a shipped metadata log is damaged"))?;
        for b in &batches {
            if b.seq != out.seq + 1 {
                return Err(EngineError::Invalid("a shipped metadata log does not follow its snapshot"));
            }
            db.apply(b)?;
            out.seq = b.seq;
            out.batches += 1;
        }
        out.objects += 1;
    }
    // Rows changed here and not by a shipped batch: the restored database is a new state.
    let mut changed = false;
    for block in db.staged_blocks()? {
        let key = block_key_at(scope, block.key_epoch, &block.sha256);
        let present = match block.inline {
            // The copy holds its bytes (shipped by an earlier version): put them where they belong.
            Some(data) => retried(|| store.put(&key, bytes::Bytes::from(data.clone()))).await.map(|()| true)?,
            // In the store if it got there before the host was lost (shipped metadata never
            // carries a file's bytes).
            None => retried(|| store.head(&key)).await?.is_some(),
        };
        if present {
            db.mark_uploaded(&block.sha256)?;
            changed = true;
        } else if !block.referenced {
            db.forget_unreferenced(&block.sha256)?;
            changed = true;
        } else {
            out.blocks_missing += 1;
        }
    }
    // An unreferenced block whose object is gone (gc deleted it after the newest batch the bucket
    // holds) must not stay named as stored: the same bytes written again would count as in the
    // bucket and never be uploaded.
    for block in db.unreferenced_uploaded()? {
        let key = block.key(scope);
        if retried(|| store.head(&key)).await?.is_none() {
            db.forget_unreferenced(&block.sha256)?;
            changed = true;
        }
    }
    if changed {
        db.diverge()?;
    }
    db.finish()?;
    std::fs::File::open(tmp)?.sync_all()?;
    Ok(out)
}
