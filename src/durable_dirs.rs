//! Private directories whose names survive power loss: each directory this process creates (0700)
//! has its parent fsynced once, at creation (review D13), so a file made durable in it later is
//! reachable after a power loss, however many ancestors were new.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// Held while a directory is created and its parent synced, and taken once by a caller that
/// found the directory already there: no caller returns while a concurrent creation of the same
/// directory has yet to make its name durable.
static CREATING: Mutex<()> = Mutex::new(());

/// Parents synced by `create_private_dir` (tests read it: `synced_below`).
#[cfg(test)]
static SYNCED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Creates `dir` and its missing ancestors with mode 0700 (existing ones keep their mode) and
/// fsyncs the parent of each directory it created, deepest first; returns those parents. An
/// existing `dir` costs one `mkdir` attempt and nothing else.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let _creating = CREATING.lock();
    let mut created = Vec::new();
    make(dir, &mut created)?;
    let mut synced: Vec<PathBuf> = Vec::with_capacity(created.len());
    for made in created.iter().rev() {
        let Some(parent) = made.parent().filter(|p| !p.as_os_str().is_empty()) else { continue };
        if synced.iter().any(|p| p == parent) {
            continue;
        }
        std::fs::File::open(parent)?.sync_all()?;
        #[cfg(test)]
        SYNCED.lock().push(parent.to_path_buf());
        synced.push(parent.to_path_buf());
    }
    Ok(synced)
}

/// `mkdir -p` of `dir`, recording in `created` (top first) each directory this call made.
fn make(dir: &Path, created: &mut Vec<PathBuf>) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            created.push(dir.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if std::fs::metadata(dir)?.is_dir() {
                Ok(())
            } else {
                Err(e)
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).ok_or(e)?;
            make(parent, created)?;
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {
                    created.push(dir.to_path_buf());
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The parents `create_private_dir` synced so far at or below `root` (any thread), in order.
#[cfg(test)]
pub(crate) fn synced_below(root: &Path) -> Vec<PathBuf> {
    SYNCED.lock().iter().filter(|p| p.starts_with(root)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_new_directory_has_its_parent_synced_once_and_an_existing_one_costs_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let deep = root.join("a/b/c");
        let synced = create_private_dir(&deep).unwrap();
        assert_eq!(synced, vec![root.join("a/b"), root.join("a"), root.to_path_buf()]);
        assert!(deep.is_dir());
        use std::os::unix::fs::PermissionsExt;
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(std::fs::metadata(root.join(d)).unwrap().permissions().mode() & 0o777, 0o700, "{d}");
        }
        assert!(create_private_dir(&deep).unwrap().is_empty(), "an existing directory syncs nothing");
        // A sibling of an existing directory: only the parent that gained a name.
        assert_eq!(create_private_dir(&root.join("a/b/d")).unwrap(), vec![root.join("a/b")]);
        assert_eq!(synced_below(root).len(), 4);
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        assert!(create_private_dir(&tmp.path().join("f")).is_err());
        assert!(create_private_dir(&tmp.path().join("f/sub")).is_err());
    }
}
