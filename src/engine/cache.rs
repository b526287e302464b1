//! `BlockCache`: a size-bounded LRU of verified blocks as local files under `<data_dir>/cache/<scope>/<sha256>`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

type Key = (String, String);

#[derive(Default)]
struct Index {
    entries: HashMap<Key, (u64, u64)>, // key -> (size, tick)
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
    pub stats: CacheStats,
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
                found.push((meta.modified()?, scope_name.clone(), name, meta.len()));
            }
        }
        found.sort();
        let cache = BlockCache { dir, max_bytes, index: Mutex::new(Index::default()), stats: CacheStats::default() };
        {
            let mut idx = cache.index.lock();
            for (_, scope, sha, size) in found {
                idx.insert((scope, sha), size);
            }
        }
        cache.evict();
        Ok(cache)
    }

    pub fn path(&self, scope: &str, sha: &str) -> PathBuf {
        self.dir.join(scope).join(sha)
    }

    /// Marks a block as recently used; false when it is not cached.
    pub fn touch(&self, scope: &str, sha: &str) -> bool {
        let hit = self.index.lock().touch(&(scope.to_string(), sha.to_string()));
        let counter = if hit { &self.stats.hits } else { &self.stats.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Stores verified bytes of a block.
    pub fn insert_bytes(&self, scope: &str, sha: &str, data: &[u8]) -> io::Result<()> {
        let dir = self.dir.join(scope);
        super::storage::private_dir(&dir)?;
        let tmp = dir.join(format!("{sha}.tmp{}", rand::random::<u32>()));
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        if let Err(e) = file.write_all(data) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, dir.join(sha))?;
        self.index.lock().insert((scope.to_string(), sha.to_string()), data.len() as u64);
        self.evict();
        Ok(())
    }

    /// Moves an already verified local file (an uploaded staging block) into the cache.
    pub fn adopt_file(&self, scope: &str, sha: &str, src: &Path) -> io::Result<()> {
        let dir = self.dir.join(scope);
        super::storage::private_dir(&dir)?;
        let size = fs::metadata(src)?.len();
        fs::rename(src, dir.join(sha))?;
        self.index.lock().insert((scope.to_string(), sha.to_string()), size);
        self.evict();
        Ok(())
    }

    /// Moves a cached block back to `dst` (out of the cache); `Ok(false)` when it is not cached.
    pub fn take_back(&self, scope: &str, sha: &str, dst: &Path) -> io::Result<bool> {
        let key = (scope.to_string(), sha.to_string());
        let mut idx = self.index.lock();
        if !idx.entries.contains_key(&key) {
            return Ok(false);
        }
        fs::rename(self.path(scope, sha), dst)?;
        idx.remove(&key);
        Ok(true)
    }

    pub fn remove(&self, scope: &str, sha: &str) {
        if self.index.lock().remove(&(scope.to_string(), sha.to_string())) {
            let _ = fs::remove_file(self.path(scope, sha));
        }
    }

    /// Drops every cached block of a scope.
    pub fn remove_scope(&self, scope: &str) {
        let mut idx = self.index.lock();
        let keys: Vec<Key> = idx.entries.keys().filter(|k| k.0 == scope).cloned().collect();
        for k in keys {
            idx.remove(&k);
        }
        drop(idx);
        let _ = fs::remove_dir_all(self.dir.join(scope));
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
        for (scope, sha) in victims {
            // An open reader keeps its descriptor; a later reader re-downloads.
            let _ = fs::remove_file(self.path(&scope, &sha));
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
        assert!(!c.path("s", &b).exists());
        assert_eq!(c.total_bytes(), 8);
        drop(c);
        let c = BlockCache::open(dir.path().join("c"), 10).unwrap();
        assert_eq!(c.total_bytes(), 8);
        assert!(c.touch("s", &d));
    }
}
