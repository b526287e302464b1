//! `LocalDirStore`: objects as files under a local directory (the embedded default backend).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

use super::{ObjectInfo, ObjectStore, StoreError};

/// Name prefix of in-flight temporary files; never a valid key component, skipped by `list`.
const TMP_PREFIX: &str = ".scopefs-tmp-";

/// Objects stored as files: key `a/b/c` is the file `<root>/a/b/c`.
///
/// A put writes a temporary file in the target directory, fsyncs it and
/// renames it into place, so readers see either the old or the new object.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    root: PathBuf,
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
        Ok(LocalDirStore { root })
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
        if part.starts_with(TMP_PREFIX) {
            return bad("reserved name");
        }
    }
    Ok(())
}

/// Creates `dir` and its missing parents with mode 0700 (existing directories keep their mode).
fn private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Writes `data` to a temporary sibling of `path`, fsyncs it and renames it over `path`.
fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
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
        let written = file.write_all(data).and_then(|()| file.sync_all()).and_then(|()| fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        // Make the rename itself durable.
        return fs::File::open(dir)?.sync_all();
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
        if name.starts_with(TMP_PREFIX) {
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

fn not_found_as(key: &str, e: io::Error) -> StoreError {
    if e.kind() == io::ErrorKind::NotFound {
        StoreError::NotFound { key: key.to_string() }
    } else {
        StoreError::Io(e)
    }
}

#[async_trait]
impl ObjectStore for LocalDirStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let path = self.path_of(key)?;
        self.blocking(move |_| Ok(write_atomic(&path, &data)?)).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let path = self.path_of(key)?;
        let key = key.to_string();
        self.blocking(move |_| fs::read(&path).map(Bytes::from).map_err(|e| not_found_as(&key, e))).await
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let path = self.path_of(key)?;
        self.blocking(move |_| match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(Some(meta.len())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Io(e)),
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path_of(key)?;
        self.blocking(move |root| {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(StoreError::Io(e)),
            }
            if let Some(parent) = path.parent() {
                prune_empty_dirs(root, parent);
            }
            Ok(())
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
        self.blocking(move |root| {
            let mut out = Vec::new();
            let start = if dir_part.is_empty() { root.to_path_buf() } else { root.join(&dir_part) };
            walk(&start, &dir_part, &mut out)?;
            out.retain(|o| o.key.starts_with(&prefix));
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
    }

    fn describe(&self) -> String {
        "local object directory".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn roundtrip_overwrite_and_head() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path().join("objects")).unwrap();
        rt().block_on(async {
            s.put("scopes/x/blocks/aa", Bytes::from_static(b"first")).await.unwrap();
            s.put("scopes/x/blocks/aa", Bytes::from_static(b"second!")).await.unwrap();
            assert_eq!(s.get("scopes/x/blocks/aa").await.unwrap(), Bytes::from_static(b"second!"));
            assert_eq!(s.head("scopes/x/blocks/aa").await.unwrap(), Some(7));
            assert_eq!(s.head("scopes/x/blocks/bb").await.unwrap(), None);
            assert!(matches!(s.get("scopes/x/blocks/bb").await, Err(StoreError::NotFound { .. })));
        });
        // No temporary file left behind next to the object.
        let names: Vec<_> = fs::read_dir(dir.path().join("objects/scopes/x/blocks"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["aa".to_string()]);
    }

    #[test]
    fn objects_and_directories_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("objects");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap(); // a pre-existing path
        let s = LocalDirStore::new(&root).unwrap();
        rt().block_on(s.put("scopes/x/blocks/aa", Bytes::from_static(b"data"))).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for d in ["", "scopes", "scopes/x", "scopes/x/blocks"] {
            assert_eq!(mode(&root.join(d)), 0o700, "{d}");
        }
        assert_eq!(mode(&root.join("scopes/x/blocks/aa")), 0o600);
    }

    #[test]
    fn rejects_escaping_keys() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path()).unwrap();
        rt().block_on(async {
            for key in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", "a/.scopefs-tmp-1"] {
                let res = s.put(key, Bytes::from_static(b"v")).await;
                assert!(matches!(res, Err(StoreError::Rejected(_))), "key {key:?} accepted");
                assert!(matches!(s.get(key).await, Err(StoreError::Rejected(_))), "key {key:?} accepted");
            }
            assert!(matches!(s.list("../").await, Err(StoreError::Rejected(_))));
        });
        assert!(!dir.path().parent().unwrap().join("x").exists());
    }

    #[test]
    fn list_by_prefix_recursive_and_delete_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::new(dir.path()).unwrap();
        rt().block_on(async {
            for key in ["scopes/a/blocks/1", "scopes/a/blocks/2", "scopes/ab/blocks/3", "scopes/b/meta"] {
                s.put(key, Bytes::from(key.as_bytes().to_vec())).await.unwrap();
            }
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
            s.delete("never/existed").await.unwrap();
        });
        // Emptied directories are pruned, the root stays.
        assert!(!dir.path().join("scopes/a").exists());
        assert!(dir.path().join("scopes/ab/blocks/3").exists());
    }

    #[test]
    fn new_rejects_a_file_as_root() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(LocalDirStore::new(&file).is_err());
    }
}
