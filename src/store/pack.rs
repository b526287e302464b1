//! A pack database: objects up to `PACK_MAX_BYTES` as rows of one SQLite database in a directory
//! instead of files, so a small block costs the host file system no inode. The local object
//! directory keeps its small objects in one (durable: a group of puts is one flush instead of two
//! per object), the block cache its small blocks (not flushed).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{ObjectInfo, StoreError};

/// Largest object kept in the pack; larger ones are files.
pub(crate) const PACK_MAX_BYTES: usize = 128 * 1024;
/// File name of the pack database in the object directory (a reserved name: never a key).
pub(crate) const PACK_FILE: &str = ".scopefs-pack.sqlite3";
/// Reader connections kept open between reads (more are opened while reads overlap).
const IDLE_READERS: usize = 4;

/// One object directory's pack: a writer connection and a few reader connections (WAL mode, so
/// reads never wait for a write's flush).
pub(crate) struct Pack {
    path: PathBuf,
    durable: bool,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
}

impl std::fmt::Debug for Pack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pack")
    }
}

fn pack_error(e: rusqlite::Error) -> StoreError {
    StoreError::Io(io::Error::other(format!("pack database: {e}")))
}

fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    // A page cache of 256 KiB per connection: the pack is read by key, never scanned.
    conn.pragma_update(None, "cache_size", -256)?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

/// The `synchronous` mode of a durable pack (an object store) or of a cache's.
fn sync_mode(durable: bool) -> &'static str {
    if durable {
        "FULL"
    } else {
        "NORMAL"
    }
}

/// Deletes the rows of `keys` in one transaction; how many there were.
fn delete_keys(conn: &mut Connection, keys: &[&str]) -> rusqlite::Result<usize> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut removed = 0;
    {
        let mut st = tx.prepare_cached("DELETE FROM objects WHERE key = ?1")?;
        for key in keys {
            removed += st.execute([key])?;
        }
    }
    tx.commit()?;
    Ok(removed)
}

impl Pack {
    /// Opens (creating and migrating) the pack in directory `root`. With `durable`, a put is
    /// flushed before it returns (an object store); without, only checkpoints flush (a cache).
    pub fn open(root: &Path, durable: bool) -> Result<Pack, StoreError> {
        let path = root.join(PACK_FILE);
        let mut conn = connect(&path).map_err(pack_error)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        // Space of deleted objects is given back in steps (`remove`); only a new database takes it.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").map_err(pack_error)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(pack_error)?;
        // FULL: a put's commit flushes the WAL, so a stored object survives power loss. NORMAL (a
        // cache): nothing is flushed at a commit, but a checkpoint flushes the WAL before it copies
        // it into the database, so a power loss may lose recent entries, never corrupt the file
        // (OFF could: review D10).
        conn.pragma_update(None, "synchronous", sync_mode(durable)).map_err(pack_error)?;
        crate::migrate::apply(&mut conn, crate::migrate::STORE_PACK)
            .map_err(|e| StoreError::Io(io::Error::other(format!("pack database: {e}"))))?;
        if durable {
            // The WAL file exists now: make its name (and the database's) durable once.
            std::fs::File::open(root)?.sync_all()?;
        }
        Ok(Pack { path, writer: Mutex::new(conn), readers: Mutex::new(Vec::new()), durable })
    }

    /// Stores every item in one transaction; durable when it returns.
    pub fn put_all(&self, items: &[(&str, &[u8])]) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        let mut conn = self.writer.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(pack_error)?;
        {
            let mut st = tx
                .prepare_cached("INSERT OR REPLACE INTO objects (key, size, data) VALUES (?1, ?2, ?3)")
                .map_err(pack_error)?;
            for (key, data) in items {
                st.execute(params![key, data.len() as i64, data]).map_err(pack_error)?;
            }
        }
        tx.commit().map_err(pack_error)
    }

    /// Removes the keys that are in the pack (one transaction, not flushed: a removal lost to a
    /// power loss leaves an object that nothing references, which gc collects again), and gives
    /// back some free pages.
    pub fn remove(&self, keys: &[&str]) -> Result<(), StoreError> {
        let mut conn = self.writer.lock();
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(pack_error)?;
        let removed = delete_keys(&mut conn, keys).map_err(pack_error);
        let restored = conn.pragma_update(None, "synchronous", sync_mode(self.durable)).map_err(pack_error);
        if removed? == 0 {
            return restored;
        }
        restored?;
        let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0)).map_err(pack_error)?;
        if free > 1024 {
            conn.execute_batch("PRAGMA incremental_vacuum(256)").map_err(pack_error)?;
        }
        Ok(())
    }

    fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let idle = self.readers.lock().pop();
        let conn = match idle {
            Some(c) => c,
            None => connect(&self.path).map_err(pack_error)?,
        };
        let out = f(&conn).map_err(pack_error);
        let mut readers = self.readers.lock();
        if readers.len() < IDLE_READERS {
            readers.push(conn);
        }
        out
    }

    /// The bytes of `key`, when the pack holds it.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT data FROM objects WHERE key = ?1")?.query_row([key], |r| r.get(0)).optional()
        })
    }

    /// The size of `key`, when the pack holds it.
    pub fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT size FROM objects WHERE key = ?1")?
                .query_row([key], |r| r.get::<_, i64>(0))
                .optional()
                .map(|s| s.map(|s| s as u64))
        })
    }

    /// Every packed object whose key starts with `prefix`, by key.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.with_reader(|c| {
            let mut st = c.prepare_cached("SELECT key, size FROM objects WHERE key >= ?1 ORDER BY key")?;
            let mut rows = st.query([prefix])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let key: String = row.get(0)?;
                if !key.starts_with(prefix) {
                    break;
                }
                out.push(ObjectInfo { key, size: row.get::<_, i64>(1)? as u64 });
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PRAGMA synchronous` of the pack's writer: 1 NORMAL, 2 FULL (0 would be OFF).
    fn sync_level(pack: &Pack) -> i64 {
        pack.writer.lock().query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_cache_pack_is_never_unsynchronized_and_a_store_pack_always_full() {
        let dir = tempfile::tempdir().unwrap();
        let (cache_dir, store_dir) = (dir.path().join("cache"), dir.path().join("store"));
        std::fs::create_dir_all(&cache_dir).unwrap();
        std::fs::create_dir_all(&store_dir).unwrap();
        let (cache, store) = (Pack::open(&cache_dir, false).unwrap(), Pack::open(&store_dir, true).unwrap());
        for pack in [&cache, &store] {
            pack.put_all(&[("k", b"v")]).unwrap();
            pack.remove(&["k"]).unwrap(); // switches to NORMAL for the removal and back
        }
        assert_eq!((sync_level(&cache), sync_level(&store)), (1, 2));
    }
}
