//! `LocalDirStore`: objects under a local directory (the embedded default backend): large ones as
//! files, small ones packed in one database there (`pack.rs`).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::pack::{Pack, PACK_MAX_BYTES};
use super::{ObjectInfo, ObjectStore, StoreError};

/// Name prefix of the directory's own files (temporary files, the pack database); never a valid
/// key component, skipped by `list`.
const RESERVED_PREFIX: &str = ".scopefs-";
/// Name prefix of in-flight temporary files.
const TMP_PREFIX: &str = ".scopefs-tmp-";

/// Objects under a directory. An object of up to `PACK_MAX_BYTES` is a row of the directory's
/// pack database (one transaction and one flush per group of puts); a larger one with key `a/b/c`
/// is the file `<root>/a/b/c`, written to a temporary file, fsynced and renamed into place, so
/// readers see either the old or the new object. A key lives in one place: a put removes it from
/// the other.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    root: PathBuf,
    pack: Arc<Pack>,
}

impl LocalDirStore {
    /// Opens (creating if needed) the object directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Result<LocalDirStore, StoreError> {
        let root = path.into();
        if root.as_os_str().is_empty() {
            return Err(StoreError::Config("local object directory path is empty".into()));
        }
        private_dir(&root)?;
        if !fs::metadata(&root)?.is_dir() {
            return Err(StoreError::Config("local object directory path is not a directory".into()));
        }
        // Every tenant's blocks live here: readable by the daemon's user only.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))?;
        let pack = Arc::new(Pack::open(&root, true)?);
        Ok(LocalDirStore { root, pack })
    }

    /// The object directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &str) -> Result<PathBuf, StoreError> {
        validate_key(key)?;
        Ok(self.root.join(key))
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Path) -> Result<T, StoreError> + Send + 'static,
    {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || f(&root))
            .await
            .map_err(|e| StoreError::Io(io::Error::other(format!("local store task failed: {e}"))))?
    }
}

/// Accepts relative keys made of non-empty, non-dot components.
fn validate_key(key: &str) -> Result<(), StoreError> {
    let bad = |why: &str| Err(StoreError::Rejected(format!("invalid object key ({why})")));
    if key.is_empty() {
        return bad("empty");
    }
    if key.starts_with('/') {
        return bad("absolute");
    }
    if key.contains('\0') {
        return bad("NUL byte");
    }
    for part in key.split('/') {
        if part.is_empty() {
            return bad("empty component");
        }
        if part == "." || part == ".." {
            return bad("dot component");
        }
        if part.starts_with(RESERVED_PREFIX) {
            return bad("reserved name");
        }
    }
    Ok(())
}

/// Creates `dir` and its missing parents with mode 0700 (existing directories keep their mode),
/// fsyncing the parent of each new one (`durable_dirs`): an object's name is only as durable as
/// every directory above it, and a put fsyncs only the object's own directory.
fn private_dir(dir: &Path) -> io::Result<()> {
    crate::durable_dirs::create_private_dir(dir).map(drop)
}

/// The files of a group of puts: each written to a temporary file and fsynced, renamed into place,
/// then each directory that gained a name fsynced once for the group. A name never points at bytes
/// that were not flushed.
fn write_group(items: &[(PathBuf, Bytes)]) -> Vec<io::Result<()>> {
    let mut results: Vec<io::Result<()>> = Vec::with_capacity(items.len());
    let mut dirs: Vec<&Path> = Vec::new();
    for (path, data) in items {
        let placed = write_temporary(path, data).and_then(|(tmp, file)| {
            let done = file.sync_all().and_then(|()| fs::rename(&tmp, path));
            if done.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            done
        });
        if placed.is_ok() {
            if let Some(dir) = path.parent().filter(|d| !dirs.contains(d)) {
                dirs.push(dir);
            }
        }
        results.push(placed);
    }
    for dir in dirs {
        if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
            // The names in it may not be durable: those objects failed (a put again is harmless).
            for ((path, _), r) in items.iter().zip(results.iter_mut()) {
                if r.is_ok() && path.parent() == Some(dir) {
                    *r = Err(io::Error::new(e.kind(), e.to_string()));
                }
            }
        }
    }
    results
}

/// Writes `data` to a new temporary sibling of `path` (not flushed); returns its path and file.
fn write_temporary(path: &Path, data: &[u8]) -> io::Result<(PathBuf, fs::File)> {
    let dir = path.parent().ok_or_else(|| io::Error::other("object path has no parent"))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("object");
    let mut attempt = 0;
    loop {
        attempt += 1;
        private_dir(dir)?;
        let tmp = dir.join(format!("{TMP_PREFIX}{name}-{:016x}", rand::random::<u64>()));
        let created = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp);
        let mut file = match created {
            Ok(f) => f,
            // A concurrent delete may have removed the (then empty) directory.
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 4 => continue,
            Err(e) => return Err(e),
        };
        if let Err(e) = file.write_all(data) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        return Ok((tmp, file));
    }
}

/// Removes now-empty directories from `dir` up to (not including) `root`.
fn prune_empty_dirs(root: &Path, mut dir: &Path) {
    while dir != root && dir.starts_with(root) {
        if fs::remove_dir(dir).is_err() {
            break;
        }
        match dir.parent() {
            Some(parent) => dir = parent,
            None => break,
        }
    }
}

/// Collects every object file under `dir` (whose key prefix is `rel`).
fn walk(dir: &Path, rel: &str, out: &mut Vec<ObjectInfo>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if name.starts_with(RESERVED_PREFIX) {
            continue;
        }
        let key = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            walk(&entry.path(), &key, out)?;
        } else if file_type.is_file() {
            match entry.metadata() {
                Ok(meta) => out.push(ObjectInfo { key, size: meta.len() }),
                // Deleted between readdir and stat.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The whole object `key`: from the pack, or else its file at `path`.
fn read_whole(pack: &Pack, path: &Path, key: &str) -> Result<Bytes, StoreError> {
    match pack.get(key)? {
        Some(data) => Ok(Bytes::from(data)),
        None => fs::read(path).map(Bytes::from).map_err(|e| not_found_as(key, e)),
    }
}

fn not_found_as(key: &str, e: io::Error) -> StoreError {
    if e.kind() == io::ErrorKind::NotFound {
        StoreError::NotFound { key: key.to_string() }
    } else {
        StoreError::Io(e)
    }
}

/// Removes the file of `path` if there is one (a key put into the pack again), pruning emptied
/// directories up to `root`.
fn remove_file_of(root: &Path, path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {
            if let Some(parent) = path.parent() {
                prune_empty_dirs(root, parent);
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Stores a group: small objects in one pack transaction, large ones as files (their pack rows
/// removed after). One result per item, in order.
fn store_group(root: &Path, pack: &Pack, items: Vec<(String, PathBuf, Bytes)>) -> Vec<Result<(), StoreError>> {
    let (small, large): (Vec<usize>, Vec<usize>) = (0..items.len()).partition(|&i| items[i].2.len() <= PACK_MAX_BYTES);
    let mut results: Vec<Result<(), StoreError>> = items.iter().map(|_| Ok(())).collect();
    let rows: Vec<(&str, &[u8])> = small.iter().map(|&i| (items[i].0.as_str(), &items[i].2[..])).collect();
    match pack.put_all(&rows) {
        Ok(()) => {
            for &i in &small {
                results[i] = remove_file_of(root, &items[i].1).map_err(StoreError::Io);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            for &i in &small {
                results[i] = Err(StoreError::Io(io::Error::other(msg.clone())));
            }
        }
    }
    let files: Vec<(PathBuf, Bytes)> = large.iter().map(|&i| (items[i].1.clone(), items[i].2.clone())).collect();
    let written = write_group(&files);
    let mut placed = Vec::new();
    for (&i, r) in large.iter().zip(written) {
        match r {
            Ok(()) => placed.push(i),
            Err(e) => results[i] = Err(StoreError::Io(e)),
        }
    }
    let keys: Vec<&str> = placed.iter().map(|&i| items[i].0.as_str()).collect();
    if let Err(e) = pack.remove(&keys) {
        let msg = e.to_string();
        for &i in &placed {
            results[i] = Err(StoreError::Io(io::Error::other(msg.clone())));
        }
    }
    results
}

#[async_trait]
impl ObjectStore for LocalDirStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let mut results = self.put_many(vec![(key.to_string(), data)], 1).await;
        results.pop().unwrap_or_else(|| Err(StoreError::Io(io::Error::other("put: no result"))))
    }

    /// One pack transaction (one flush) for the group's small objects.
    async fn put_many(&self, items: Vec<(String, Bytes)>, _concurrency: usize) -> Vec<Result<(), StoreError>> {
        let mut results: Vec<Option<Result<(), StoreError>>> = Vec::with_capacity(items.len());
        let mut valid = Vec::new();
        let mut slots = Vec::new();
        for (key, data) in items {
            match self.path_of(&key) {
                Ok(path) => {
                    slots.push(results.len());
                    valid.push((key, path, data));
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let pack = self.pack.clone();
        let stored = match self.blocking(move |root| Ok(store_group(root, &pack, valid))).await {
            Ok(stored) => stored,
            Err(e) => slots.iter().map(|_| Err(StoreError::Io(io::Error::other(e.to_string())))).collect(),
        };
        for (slot, r) in slots.into_iter().zip(stored) {
            results[slot] = Some(r);
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(StoreError::Io(io::Error::other("not written"))))).collect()
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        let pack = self.pack.clone();
        self.blocking(move |_| read_whole(&pack, &path, &key)).await
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        let pack = self.pack.clone();
        self.blocking(move |_| {
            if let Some(size) = pack.size(&key)? {
                return Ok(Some(size));
            }
            match fs::metadata(&path) {
                Ok(meta) if meta.is_file() => Ok(Some(meta.len())),
                Ok(_) => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(StoreError::Io(e)),
            }
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        let pack = self.pack.clone();
        self.blocking(move |root| {
            pack.remove(&[key.as_str()])?;
            Ok(remove_file_of(root, &path)?)
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        // Walk only the deepest directory the prefix names in full.
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        if !dir_part.is_empty() {
            validate_key(dir_part)?;
        }
        let dir_part = dir_part.to_string();
        let prefix = prefix.to_string();
        let pack = self.pack.clone();
        self.blocking(move |root| {
            let mut out = Vec::new();
            let start = if dir_part.is_empty() { root.to_path_buf() } else { root.join(&dir_part) };
            walk(&start, &dir_part, &mut out)?;
            out.retain(|o| o.key.starts_with(&prefix));
            out.extend(pack.list(&prefix)?);
            out.sort_by(|a, b| a.key.cmp(&b.key));
            // A key caught between the two places by a concurrent put is listed once.
            out.dedup_by(|a, b| a.key == b.key);
            Ok(out)
        })
        .await
    }

    fn describe(&self) -> String {
        "local object directory".to_string()
    }

    fn reads_are_local(&self) -> bool {
        true
    }

    fn read_at_now(&self, key: &str, offset: u64, buf: &mut [u8]) -> Option<Result<(), StoreError>> {
        let path = match self.path_of(key) {
            Ok(path) => path,
            Err(e) => return Some(Err(e)),
        };
        let short = || StoreError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "object shorter than the read"));
        Some(match self.pack.get(key) {
            Ok(Some(data)) => {
                let range = usize::try_from(offset).ok().and_then(|at| data.get(at..at.checked_add(buf.len())?));
                range.map(|r| buf.copy_from_slice(r)).ok_or_else(short)
            }
            Ok(None) => fs::File::open(&path)
                .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, buf, offset))
                .map_err(|e| if e.kind() == io::ErrorKind::UnexpectedEof { short() } else { not_found_as(key, e) }),
            Err(e) => Err(e),
        })
    }

    fn get_now(&self, key: &str) -> Option<Result<Bytes, StoreError>> {
        Some(self.path_of(key).and_then(|path| read_whole(&self.pack, &path, key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// An object too large for the pack: it is a file.
    fn large(fill: u8) -> Bytes {
        Bytes::from(vec![fill; PACK_MAX_BYTES + 1])
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = match fs::read_dir(dir) {
            Ok(entries) => entries.map(|e| e.unwrap().file_name().into_string().unwrap()).collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    #[test]
    fn small_objects_are_packed_large_ones_are_files_and_a_key_lives_in_one_place() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path().join("objects")).unwrap();
        let blocks = dir.path().join("objects/scopes/x/blocks");
        rt().block_on(async {
            s.put("scopes/x/blocks/aa", Bytes::from_static(b"first")).await.unwrap();
            assert!(names_in(&blocks).is_empty(), "a small object makes no file");
            s.put("scopes/x/blocks/aa", large(7)).await.unwrap();
            assert_eq!(names_in(&blocks), vec!["aa".to_string()], "a large one is a file, no temporary left");
            assert_eq!(s.get("scopes/x/blocks/aa").await.unwrap(), large(7), "the file, not the old packed row");
            assert_eq!(s.head("scopes/x/blocks/aa").await.unwrap(), Some(PACK_MAX_BYTES as u64 + 1));
            s.put("scopes/x/blocks/aa", Bytes::from_static(b"second!")).await.unwrap();
            assert_eq!(s.get("scopes/x/blocks/aa").await.unwrap(), Bytes::from_static(b"second!"));
            assert_eq!(s.head("scopes/x/blocks/aa").await.unwrap(), Some(7));
            assert!(!blocks.exists(), "the file went (and its emptied directories)");
            assert_eq!(s.head("scopes/x/blocks/bb").await.unwrap(), None);
            assert!(matches!(s.get("scopes/x/blocks/bb").await, Err(StoreError::NotFound { .. })));
        });
        // Another store over the same directory (another process) reads what this one stored.
        let again = LocalDirStore::new(dir.path().join("objects")).unwrap();
        assert_eq!(rt().block_on(again.get("scopes/x/blocks/aa")).unwrap(), Bytes::from_static(b"second!"));
    }

    #[test]
    fn a_group_stores_small_and_large_objects_and_answers_each() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path()).unwrap();
        let items = vec![
            ("scopes/x/blocks/1".to_string(), Bytes::from_static(b"one")),
            ("../escape".to_string(), Bytes::from_static(b"no")),
            ("scopes/x/blocks/2".to_string(), large(2)),
            ("scopes/x/blocks/3".to_string(), Bytes::from_static(b"three")),
        ];
        let results = rt().block_on(s.put_many(items, 4));
        assert!(results[0].is_ok() && results[2].is_ok() && results[3].is_ok(), "{results:?}");
        assert!(matches!(results[1], Err(StoreError::Rejected(_))));
        let listed: Vec<(String, u64)> =
            rt().block_on(s.list("scopes/x/")).unwrap().into_iter().map(|o| (o.key, o.size)).collect();
        assert_eq!(
            listed,
            vec![
                ("scopes/x/blocks/1".to_string(), 3),
                ("scopes/x/blocks/2".to_string(), PACK_MAX_BYTES as u64 + 1),
                ("scopes/x/blocks/3".to_string(), 5),
            ]
        );
        assert_eq!(rt().block_on(s.get("scopes/x/blocks/2")).unwrap(), large(2));
    }

    #[test]
    fn objects_and_directories_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("objects");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap(); // a pre-existing path
        let s = LocalDirStore::new(&root).unwrap();
        rt().block_on(s.put("scopes/x/blocks/aa", large(1))).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for d in ["", "scopes", "scopes/x", "scopes/x/blocks"] {
            assert_eq!(mode(&root.join(d)), 0o700, "{d}");
        }
        assert_eq!(mode(&root.join("scopes/x/blocks/aa")), 0o600);
        assert_eq!(mode(&root.join(super::super::pack::PACK_FILE)), 0o600, "the pack database");
    }

    #[test]
    fn new_directories_of_an_object_have_their_names_synced() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("objects");
        let s = LocalDirStore::new(&root).unwrap();
        rt().block_on(s.put("scopes/x/blocks/aa", large(1))).unwrap();
        let synced = crate::durable_dirs::synced_below(dir.path());
        // The root's name in its parent, then each new ancestor's in the one above it (the
        // object's own directory is synced by the put itself).
        for parent in [dir.path().to_path_buf(), root.clone(), root.join("scopes"), root.join("scopes/x")] {
            assert!(synced.contains(&parent), "{} never synced: {synced:?}", parent.display());
        }
        rt().block_on(s.put("scopes/x/blocks/bb", large(2))).unwrap();
        assert_eq!(crate::durable_dirs::synced_below(dir.path()).len(), synced.len(), "nothing new was created");
    }

    #[test]
    fn rejects_escaping_and_reserved_keys() {
        // The store's root is a directory of its own, so what an escape would write (`../x`) lands
        // in this test's directory, not in a shared one another program may use.
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path().join("root")).unwrap();
        rt().block_on(async {
            let reserved = [".scopefs-pack.sqlite3", "a/.scopefs-tmp-1", ".scopefs-pack.sqlite3-wal"];
            for key in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/"].into_iter().chain(reserved) {
                let res = s.put(key, Bytes::from_static(b"v")).await;
                assert!(matches!(res, Err(StoreError::Rejected(_))), "key {key:?} accepted");
                assert!(matches!(s.get(key).await, Err(StoreError::Rejected(_))), "key {key:?} accepted");
            }
            assert!(matches!(s.list("../").await, Err(StoreError::Rejected(_))));
            assert!(s.list("").await.unwrap().is_empty(), "the pack's own files are never listed");
        });
        assert!(!dir.path().join("x").exists());
    }

    #[test]
    fn list_by_prefix_recursive_and_delete_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path()).unwrap();
        rt().block_on(async {
            for key in ["scopes/a/blocks/1", "scopes/ab/blocks/3", "scopes/b/meta"] {
                s.put(key, Bytes::from(key.as_bytes().to_vec())).await.unwrap();
            }
            s.put("scopes/a/blocks/2", large(2)).await.unwrap();
            let keys = |v: Vec<ObjectInfo>| v.into_iter().map(|o| o.key).collect::<Vec<_>>();
            assert_eq!(keys(s.list("scopes/a/").await.unwrap()), vec!["scopes/a/blocks/1", "scopes/a/blocks/2"]);
            assert_eq!(
                keys(s.list("scopes/a").await.unwrap()),
                vec!["scopes/a/blocks/1", "scopes/a/blocks/2", "scopes/ab/blocks/3"]
            );
            assert_eq!(s.list("").await.unwrap().len(), 4);
            assert!(s.list("nothing/here/").await.unwrap().is_empty());
            let listed = s.list("scopes/b/").await.unwrap();
            assert_eq!(listed, vec![ObjectInfo { key: "scopes/b/meta".into(), size: 13 }]);

            s.delete("scopes/a/blocks/1").await.unwrap();
            s.delete("scopes/a/blocks/1").await.unwrap();
            s.delete("scopes/a/blocks/2").await.unwrap();
            assert!(s.list("scopes/a/").await.unwrap().is_empty());
            assert!(matches!(s.get("scopes/a/blocks/1").await, Err(StoreError::NotFound { .. })));
            s.delete("never/existed").await.unwrap();
        });
        // Emptied directories are pruned, the root stays.
        assert!(!dir.path().join("scopes/a").exists());
        assert!(dir.path().exists());
    }

    #[test]
    fn new_rejects_a_file_as_root() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(LocalDirStore::new(&file).is_err());
    }
}
