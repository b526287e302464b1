//! Clearing a file's set-user-ID and set-group-ID bits when a caller without `CAP_FSETID` writes
//! it, truncates it or changes its owner: Linux's `file_remove_privs` rule, kept by the engine
//! because the mount negotiates `FUSE_HANDLE_KILLPRIV_V2` (the kernel then no longer asks for
//! `security.capability` before every write, a request per write; it flags the requests whose
//! caller must lose the bits instead). The rule: set-user-ID always goes; set-group-ID only on a
//! group-executable file (without group execute it marks mandatory locking, and stays).
//! `security.capability` needs nothing: scopes refuse `security.*` attributes (`xattr.rs`).

use super::meta::AttrChanges;
use super::{EngineResult, Fh, FileKind, Ino, ScopeEngine};

const SET_UID: u32 = 0o4000;
const SET_GID: u32 = 0o2000;
const GROUP_EXEC: u32 = 0o0010;

/// `perm` without the bits a write, truncate or chown by an unprivileged caller takes away.
pub(crate) fn without_privs(perm: u32) -> u32 {
    let mut perm = perm & !SET_UID;
    if perm & GROUP_EXEC != 0 {
        perm &= !SET_GID;
    }
    perm
}

impl ScopeEngine {
    /// A write whose caller lacks `CAP_FSETID` (the kernel's `FUSE_WRITE_KILL_SUIDGID`): the bits
    /// go first (as Linux removes them before the data lands), then the write runs as `write`. The
    /// open file remembers that its bits are clear, so only its first such write reads the inode
    /// (a `setattr` that changes the mode or owner makes the next one look again).
    pub fn write_unprivileged(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> EngineResult<u32> {
        self.check_writable()?;
        let file = self.file_of(ino, fh, true)?;
        {
            // The file's lock, then the metadata lock (the engine's lock order): a `setattr`
            // meanwhile either ran before the read below or forgets the mark after it.
            let mut f = file.lock();
            if !f.privs_clear {
                self.clear_privs(ino)?;
                f.privs_clear = true;
            }
        }
        self.write(ino, fh, offset, data)
    }

    /// Takes the set-user-ID and group-executable set-group-ID bits off `ino` (a directory keeps
    /// them; a mode without them is left alone, unchanged and unlogged).
    pub(crate) fn clear_privs(&self, ino: Ino) -> EngineResult<()> {
        let mut meta = self.meta.lock()?;
        let row = meta.inode(ino)?;
        if row.kind != FileKind::Dir && without_privs(row.perm) != row.perm {
            meta.set_attrs(ino, &AttrChanges { kill_suidgid: true, ..AttrChanges::default() })?;
        }
        Ok(())
    }

    /// Times an attribute outside `user.*` was read: mostly the kernel asking for
    /// `security.capability` before a write (once per file and mount since the engine clears the
    /// bits itself; it was once per write).
    pub fn privileged_attribute_reads(&self) -> u64 {
        self.privileged_attribute_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The mode or owner of `ino` changed: an open file's next unprivileged write looks again.
    pub(crate) fn forget_privs_clear(&self, ino: Ino) {
        let file = self.open_files.lock().get(&ino).map(|e| e.file.clone());
        if let Some(file) = file {
            file.lock().privs_clear = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::without_privs;

    #[test]
    fn set_uid_always_goes_set_gid_only_when_group_executable() {
        assert_eq!(without_privs(0o4755), 0o0755);
        assert_eq!(without_privs(0o6755), 0o0755);
        assert_eq!(without_privs(0o6745), 0o2745, "set-group-ID without group execute stays");
        assert_eq!(without_privs(0o2644), 0o2644);
        assert_eq!(without_privs(0o1777), 0o1777, "the sticky bit stays");
        assert_eq!(without_privs(0o0644), 0o0644);
    }
}
