//! `BlockCache`: a size-bounded LRU of verified blocks under `<data_dir>/cache/`: a block of up to
//! 128 KiB is a row of the cache's pack database (no inode per small block), a larger one the file
//! `<scope>/<sha256>`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::store::pack::{Pack, PACK_FILE, PACK_MAX_BYTES};
use crate::store::ObjectInfo;

type Key = (String, String);

#[derive(Default)]
struct Index {
    entries: HashMap<Key, (u64, u64)>, // key -> (size, tick); a size up to PACK_MAX_BYTES: packed
    by_tick: BTreeMap<u64, Key>,
    total: u64,
    tick: u64,
}

impl Index {
    fn touch(&mut self, key: &Key) -> bool {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(key) {
            Some((_, t)) => {
                self.by_tick.remove(t);
                *t = tick;
                self.by_tick.insert(tick, key.clone());
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, key: Key, size: u64) {
        if self.touch(&key) {
            return;
        }
        self.entries.insert(key.clone(), (size, self.tick));
        self.by_tick.insert(self.tick, key);
        self.total += size;
    }

    fn remove(&mut self, key: &Key) -> bool {
        match self.entries.remove(key) {
            Some((size, tick)) => {
                self.by_tick.remove(&tick);
                self.total -= size;
                true
            }
            None => false,
        }
    }
}

/// Cache hit/miss counters.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

pub struct BlockCache {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
    /// Blocks of up to `PACK_MAX_BYTES` (not flushed at each put: a cache entry lost to a power
    /// loss is only a miss; a database left unreadable is set aside at open, `open_pack`).
    pack: Pack,
    pub stats: CacheStats,
}

/// The pack key of a cached block.
fn pack_key(scope: &str, sha: &str) -> String {
    format!("{scope}/{sha}")
}

fn packed(size: u64) -> bool {
    size <= PACK_MAX_BYTES as u64
}

/// Opens the cache's pack database and lists what it holds. A database that cannot be opened or
/// read (a power loss damaged it) is moved aside with its WAL as `<name>.corrupt-<n>`, logged, and
/// an empty one takes its place: a cache is never a reason for the daemon not to start (review D10).
fn open_pack(dir: &Path) -> io::Result<(Pack, Vec<ObjectInfo>)> {
    let opened = Pack::open(dir, false).and_then(|pack| {
        let rows = pack.list("")?;
        Ok((pack, rows))
    });
    match opened {
        Ok(found) => Ok(found),
        Err(e) => {
            let aside = set_aside(dir)?;
            tracing::error!(error = %e, aside, "the block cache's database is unreadable; moved aside, starting with an empty cache");
            let pack = Pack::open(dir, false).map_err(|e| io::Error::other(e.to_string()))?;
            Ok((pack, Vec::new()))
        }
    }
}

/// Renames the pack database and its WAL and shared-memory files to the first free
/// `<name>.corrupt-<n>` (`-wal`, `-shm`): a WAL left beside a new database would be replayed
/// into it. Returns that name.
fn set_aside(dir: &Path) -> io::Result<String> {
    let mut n = 1u32;
    let aside = loop {
        let name = format!("{PACK_FILE}.corrupt-{n}");
        if !dir.join(&name).exists() {
            break name;
        }
        n += 1;
    };
    for suffix in ["", "-wal", "-shm"] {
        match fs::rename(dir.join(format!("{PACK_FILE}{suffix}")), dir.join(format!("{aside}{suffix}"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(aside)
}

impl BlockCache {
    /// Opens the cache directory and indexes what it already holds (oldest first by mtime).
    pub fn open(dir: PathBuf, max_bytes: u64) -> io::Result<BlockCache> {
        super::storage::private_dir(&dir)?;
        let mut found = Vec::new();
        for scope in fs::read_dir(&dir)? {
            let scope = scope?;
            if !scope.file_type()?.is_dir() {
                continue;
            }
            let scope_name = scope.file_name().to_string_lossy().into_owned();
            for f in fs::read_dir(scope.path())? {
                let f = f?;
                let name = f.file_name().to_string_lossy().into_owned();
                let meta = f.metadata()?;
                if name.len() != 64 || !meta.is_file() {
                    let _ = fs::remove_file(f.path()); // leftover temporary file
                    continue;
                }
                if packed(meta.len()) {
                    // A small block as a file (written before blocks were packed): dropped.
                    let _ = fs::remove_file(f.path());
                    continue;
                }
                found.push((meta.modified()?, scope_name.clone(), name, meta.len()));
            }
        }
        found.sort();
        let (pack, rows) = open_pack(&dir)?;
        let cache =
            BlockCache { dir, max_bytes, index: Mutex::new(Index::default()), pack, stats: CacheStats::default() };
        {
            let mut idx = cache.index.lock();
            for row in rows {
                if let Some((scope, sha)) = row.key.split_once('/') {
                    idx.insert((scope.to_string(), sha.to_string()), row.size);
                }
            }
            for (_, scope, sha, size) in found {
                idx.insert((scope, sha), size);
            }
        }
        cache.evict();
        Ok(cache)
    }

    fn path(&self, scope: &str, sha: &str) -> PathBuf {
        self.dir.join(scope).join(sha)
    }

    /// Marks a block as recently used; false when it is not cached.
    #[cfg(test)]
    fn touch(&self, scope: &str, sha: &str) -> bool {
        self.index.lock().touch(&(scope.to_string(), sha.to_string()))
    }

    /// The size of a cached block, without counting a use; `None` when it is not cached.
    pub fn size_of(&self, scope: &str, sha: &str) -> Option<u64> {
        self.index.lock().entries.get(&(scope.to_string(), sha.to_string())).map(|(size, _)| *size)
    }

    /// Copies `buf.len()` bytes at `offset` of a cached block into `buf`, counting a use; `false`
    /// on a miss (or a block too short, or one evicted meanwhile).
    pub fn read_at(&self, scope: &str, sha: &str, offset: u64, buf: &mut [u8]) -> bool {
        use std::os::unix::fs::FileExt;
        let key = (scope.to_string(), sha.to_string());
        let size = {
            let mut idx = self.index.lock();
            idx.touch(&key).then(|| idx.entries.get(&key).map(|e| e.0)).flatten()
        };
        let counter = if size.is_some() { &self.stats.hits } else { &self.stats.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        let Some(size) = size else { return false };
        if packed(size) {
            let Ok(Some(data)) = self.pack.get(&pack_key(scope, sha)) else { return false };
            let start = offset as usize;
            match data.get(start..start + buf.len()) {
                Some(part) => {
                    buf.copy_from_slice(part);
                    true
                }
                None => false,
            }
        } else {
            fs::File::open(self.path(scope, sha)).and_then(|f| f.read_exact_at(buf, offset)).is_ok()
        }
    }

    /// Stores verified bytes of a block.
    pub fn insert_bytes(&self, scope: &str, sha: &str, data: &[u8]) -> io::Result<()> {
        self.insert_many(scope, &[(sha, data)])
    }

    /// Stores verified bytes of several blocks of a scope (the small ones in one transaction).
    pub fn insert_many(&self, scope: &str, blocks: &[(&str, &[u8])]) -> io::Result<()> {
        let keys: Vec<String> = blocks.iter().map(|(sha, _)| pack_key(scope, sha)).collect();
        let small: Vec<(&str, &[u8])> = blocks
            .iter()
            .zip(&keys)
            .filter(|((_, data), _)| packed(data.len() as u64))
            .map(|((_, data), key)| (key.as_str(), *data))
            .collect();
        self.pack.put_all(&small).map_err(|e| io::Error::other(e.to_string()))?;
        for (sha, data) in blocks.iter().filter(|(_, data)| !packed(data.len() as u64)) {
            self.write_file(scope, sha, data)?;
        }
        {
            let mut idx = self.index.lock();
            for (sha, data) in blocks {
                idx.insert((scope.to_string(), sha.to_string()), data.len() as u64);
            }
        }
        self.evict();
        Ok(())
    }

    fn write_file(&self, scope: &str, sha: &str, data: &[u8]) -> io::Result<()> {
        let dir = self.dir.join(scope);
        super::storage::private_dir(&dir)?;
        let tmp = dir.join(format!("{sha}.tmp{}", rand::random::<u32>()));
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        if let Err(e) = file.write_all(data) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, dir.join(sha))
    }

    /// Moves an already verified local file (an uploaded staging block) into the cache (a small
    /// one into the pack).
    pub fn adopt_file(&self, scope: &str, sha: &str, src: &Path) -> io::Result<()> {
        let size = fs::metadata(src)?.len();
        if packed(size) {
            self.insert_bytes(scope, sha, &fs::read(src)?)?;
            return fs::remove_file(src);
        }
        let dir = self.dir.join(scope);
        super::storage::private_dir(&dir)?;
        fs::rename(src, dir.join(sha))?;
        self.index.lock().insert((scope.to_string(), sha.to_string()), size);
        self.evict();
        Ok(())
    }

    /// Moves a cached block back to `dst` (out of the cache); `Ok(false)` when it is not cached.
    pub fn take_back(&self, scope: &str, sha: &str, dst: &Path) -> io::Result<bool> {
        let key = (scope.to_string(), sha.to_string());
        let mut idx = self.index.lock();
        let Some(&(size, _)) = idx.entries.get(&key) else { return Ok(false) };
        if packed(size) {
            let data = self.pack.get(&pack_key(scope, sha)).map_err(|e| io::Error::other(e.to_string()))?;
            let Some(data) = data else { return Ok(false) };
            fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dst)?.write_all(&data)?;
            self.forget(std::slice::from_ref(&key));
        } else {
            fs::rename(self.path(scope, sha), dst)?;
        }
        idx.remove(&key);
        Ok(true)
    }

    pub fn remove(&self, scope: &str, sha: &str) {
        let key = (scope.to_string(), sha.to_string());
        if self.index.lock().remove(&key) {
            self.forget(&[key]);
        }
    }

    /// Drops every cached block of a scope.
    pub fn remove_scope(&self, scope: &str) {
        let mut idx = self.index.lock();
        let keys: Vec<Key> = idx.entries.keys().filter(|k| k.0 == scope).cloned().collect();
        for k in &keys {
            idx.remove(k);
        }
        drop(idx);
        self.forget(&keys);
        let _ = fs::remove_dir_all(self.dir.join(scope));
    }

    /// Deletes the stored bytes of blocks that have left the index (rows and files).
    fn forget(&self, keys: &[Key]) {
        let rows: Vec<String> = keys.iter().map(|(scope, sha)| pack_key(scope, sha)).collect();
        let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
        if let Err(e) = self.pack.remove(&rows) {
            tracing::warn!(error = %e, "removing blocks from the cache's pack database failed");
        }
        for (scope, sha) in keys {
            // An open reader keeps its descriptor; a later reader re-downloads.
            let _ = fs::remove_file(self.path(scope, sha));
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.index.lock().total
    }

    fn evict(&self) {
        let mut victims = Vec::new();
        {
            let mut idx = self.index.lock();
            while idx.total > self.max_bytes && idx.entries.len() > 1 {
                let Some((_, key)) = idx.by_tick.iter().next().map(|(t, k)| (*t, k.clone())) else { break };
                idx.remove(&key);
                victims.push(key);
            }
        }
        if !victims.is_empty() {
            self.forget(&victims);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_and_reindexes() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::open(dir.path().join("c"), 10).unwrap();
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let d = "d".repeat(64);
        c.insert_bytes("s", &a, b"1234").unwrap();
        c.insert_bytes("s", &b, b"1234").unwrap();
        assert!(c.touch("s", &a));
        c.insert_bytes("s", &d, b"1234").unwrap();
        assert!(c.touch("s", &a));
        assert!(!c.touch("s", &b), "b was least recently used");
        assert!(c.size_of("s", &b).is_none());
        assert_eq!(c.total_bytes(), 8);
        drop(c);
        let c = BlockCache::open(dir.path().join("c"), 10).unwrap();
        assert_eq!(c.total_bytes(), 8);
        assert!(c.touch("s", &d));
    }

    #[test]
    fn small_blocks_are_packed_large_ones_are_files_and_both_read_back_and_move_out() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::open(dir.path().join("c"), 1 << 30).unwrap();
        let (small, large) = ("1".repeat(64), "2".repeat(64));
        let big = vec![7u8; PACK_MAX_BYTES + 10];
        c.insert_many("s", &[(&small, b"small bytes"), (&large, &big)]).unwrap();
        assert!(!dir.path().join("c/s").join(&small).exists(), "a small block is a pack row");
        assert!(dir.path().join("c/s").join(&large).exists(), "a large one a file");
        let mut buf = [0u8; 5];
        assert!(c.read_at("s", &small, 6, &mut buf));
        assert_eq!(&buf, b"bytes");
        assert!(c.read_at("s", &large, PACK_MAX_BYTES as u64, &mut buf));
        assert_eq!(buf, [7u8; 5]);
        assert!(!c.read_at("s", &small, 8, &mut buf), "past the block's end is a miss");
        // A small staged file adopted goes into the pack; a packed block moves back out as a file.
        let staged = dir.path().join("staged");
        fs::write(&staged, b"adopted").unwrap();
        let adopted = "3".repeat(64);
        c.adopt_file("s", &adopted, &staged).unwrap();
        assert!(!staged.exists() && !dir.path().join("c/s").join(&adopted).exists());
        let back = dir.path().join("back");
        assert!(c.take_back("s", &adopted, &back).unwrap());
        assert_eq!(fs::read(&back).unwrap(), b"adopted");
        assert_eq!(c.size_of("s", &adopted), None);
        // Reopened, the cache finds both kinds again; a scope's removal drops both.
        drop(c);
        let c = BlockCache::open(dir.path().join("c"), 1 << 30).unwrap();
        assert_eq!((c.size_of("s", &small), c.size_of("s", &large)), (Some(11), Some(big.len() as u64)));
        c.remove_scope("s");
        assert_eq!(c.total_bytes(), 0);
        assert!(!c.read_at("s", &small, 0, &mut buf));
    }
}
