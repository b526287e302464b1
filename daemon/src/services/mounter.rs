//! `Mounter`: how the services mount and unmount a scope, behind a trait — the real FUSE mount
//! manager in production, `FakeMounter` (plain directories, injectable failures) in unit tests, so
//! the services are tested without `/dev/fuse`.

use std::path::PathBuf;
use std::sync::Arc;

use scopefs::engine::ScopeEngine;
use scopefs::ids::ScopeId;
use scopefs_fs::{MountError, MountManager};

/// Mounts scopes. Implementations are idempotent: mounting a mounted scope and unmounting an
/// unmounted one succeed and change nothing.
pub trait Mounter: Send + Sync {
    /// Mounts the engine's scope; returns the path a container binds.
    fn mount(&self, engine: Arc<ScopeEngine>) -> Result<PathBuf, MountError>;
    /// Unmounts a scope (and ends its connection).
    fn unmount(&self, scope: &ScopeId) -> Result<(), MountError>;
    /// The host view of a scope, the path the API reports as its mountpoint.
    fn view(&self, scope: &ScopeId) -> PathBuf;
    /// Unmounts every scope (a real stop), logging failures.
    fn unmount_all(&self);
    /// Scopes whose mount a previous daemon process handed over and that are not resumed yet.
    fn inherited_scopes(&self) -> Vec<ScopeId>;
    /// Whether `scope`'s mount will be resumed (handed over by a previous process): its engine is
    /// then opened knowing that the kernel may hold its files open.
    fn will_resume(&self, _scope: &ScopeId) -> bool {
        false
    }
    /// Takes down every inherited mount no scope claimed.
    fn drop_unclaimed(&self);
}

impl Mounter for MountManager {
    fn mount(&self, engine: Arc<ScopeEngine>) -> Result<PathBuf, MountError> {
        MountManager::mount(self, engine)
    }

    fn unmount(&self, scope: &ScopeId) -> Result<(), MountError> {
        MountManager::unmount(self, scope)
    }

    fn view(&self, scope: &ScopeId) -> PathBuf {
        self.mountpoint(scope)
    }

    fn unmount_all(&self) {
        MountManager::unmount_all(self)
    }

    fn inherited_scopes(&self) -> Vec<ScopeId> {
        MountManager::inherited_scopes(self)
    }

    fn will_resume(&self, scope: &ScopeId) -> bool {
        MountManager::will_resume(self, scope)
    }

    fn drop_unclaimed(&self) {
        MountManager::drop_unclaimed(self)
    }
}

#[cfg(test)]
pub use fake::FakeMounter;

#[cfg(test)]
mod fake {
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use parking_lot::Mutex;
    use scopefs::engine::ScopeEngine;
    use scopefs::ids::ScopeId;
    use scopefs_fs::MountError;

    /// A mounter without the kernel: a "mount" is a directory under `root` and an entry in a set.
    pub struct FakeMounter {
        root: PathBuf,
        mounted: Mutex<HashSet<ScopeId>>,
        /// Mount calls to refuse before mounts succeed again.
        fail_mounts: AtomicUsize,
        mounts_made: AtomicUsize,
    }

    impl FakeMounter {
        pub fn new(root: &Path) -> FakeMounter {
            FakeMounter {
                root: root.to_path_buf(),
                mounted: Mutex::new(HashSet::new()),
                fail_mounts: AtomicUsize::new(0),
                mounts_made: AtomicUsize::new(0),
            }
        }

        /// The next `n` mounts fail.
        pub fn fail_next_mounts(&self, n: usize) {
            self.fail_mounts.store(n, Ordering::SeqCst);
        }

        pub fn is_mounted(&self, scope: &ScopeId) -> bool {
            self.mounted.lock().contains(scope)
        }

        /// Mounts made so far (a repeated mount of a mounted scope makes none).
        pub fn mounts_made(&self) -> usize {
            self.mounts_made.load(Ordering::SeqCst)
        }
    }

    impl super::Mounter for FakeMounter {
        fn mount(&self, engine: Arc<ScopeEngine>) -> Result<PathBuf, MountError> {
            let scope = engine.scope_id().clone();
            let path = self.root.join(scope.as_str());
            let refuse =
                self.fail_mounts.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            if refuse {
                let source = std::io::Error::other("injected mount failure");
                return Err(MountError::Mount { scope: scope.to_string(), source });
            }
            let mut mounted = self.mounted.lock();
            if mounted.insert(scope.clone()) {
                std::fs::create_dir_all(&path)
                    .map_err(|source| MountError::Mountpoint { scope: scope.to_string(), source })?;
                self.mounts_made.fetch_add(1, Ordering::SeqCst);
            }
            Ok(path)
        }

        fn unmount(&self, scope: &ScopeId) -> Result<(), MountError> {
            self.mounted.lock().remove(scope);
            Ok(())
        }

        fn view(&self, scope: &ScopeId) -> PathBuf {
            self.root.join(scope.as_str())
        }

        fn unmount_all(&self) {
            self.mounted.lock().clear();
        }

        fn inherited_scopes(&self) -> Vec<ScopeId> {
            Vec::new()
        }

        fn drop_unclaimed(&self) {}
    }
}
