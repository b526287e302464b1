//! A SQLite database's files on disk: its companion files (`-wal`, `-shm`, the redo log's `-redo`)
//! removed together, so a WAL left beside an earlier file is never read into a new one; and a
//! database file put in place from bytes durably (written privately beside it and flushed, then
//! renamed over it, its directory flushed).

use std::io;
use std::path::{Path, PathBuf};

/// A database's WAL and shared-memory files.
pub const WAL_AND_SHM: [&str; 2] = ["-wal", "-shm"];

/// `path` with `suffix` appended to its file name (`meta.sqlite3` → `meta.sqlite3-wal`).
pub fn companion(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Removes `path` + each of `suffixes` (`""`: the file itself); a missing one is no error.
pub fn remove_with(path: &Path, suffixes: &[&str]) -> io::Result<()> {
    for suffix in suffixes {
        match std::fs::remove_file(companion(path, suffix)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Writes `bytes` to `<path>-restore` (mode 0600, flushed; what an earlier attempt left there,
/// WAL included, removed first; the directory created privately if missing) and returns that
/// path: a copy to work on before `replace_with` puts it in place.
pub fn staged_copy(path: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::durable_dirs::create_private_dir(dir)?;
    }
    let staged = companion(path, "-restore");
    remove_with(&staged, &["", WAL_AND_SHM[0], WAL_AND_SHM[1]])?;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&staged)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(staged)
}

/// Puts the complete database file `staged` at `path`: `path`'s `companions` are removed first
/// (a WAL or log of the file it replaces must not be read into it), then the rename, then a flush
/// of the directory.
pub fn replace_with(path: &Path, staged: &Path, companions: &[&str]) -> io::Result<()> {
    remove_with(path, companions)?;
    std::fs::rename(staged, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_copy_replaces_the_file_and_no_wal_of_either_survives() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("new/db.sqlite3");
        std::fs::create_dir_all(db.parent().unwrap()).unwrap();
        for stale in ["-wal", "-shm", "-restore", "-restore-wal"] {
            std::fs::write(companion(&db, stale), b"stale").unwrap();
        }
        let staged = staged_copy(&db, b"fresh").unwrap();
        assert!(!companion(&staged, "-wal").exists(), "an earlier attempt's WAL is gone");
        replace_with(&db, &staged, &WAL_AND_SHM).unwrap();
        assert_eq!(std::fs::read(&db).unwrap(), b"fresh");
        for gone in ["-wal", "-shm", "-restore"] {
            assert!(!companion(&db, gone).exists(), "{gone}");
        }
    }
}
