//! Extended attributes of a scope's inodes: the `user.*` namespace is stored (and charged to the
//! byte quota); `trusted.*`, `security.*` and `system.*` are refused; Linux's name and value rules.

use super::error::{EngineError, EngineResult};
use super::meta::XattrBounds;
use super::scope::ScopeEngine;
use super::types::Ino;

/// Longest attribute name (Linux `XATTR_NAME_MAX`); longer or empty names are `Range` (`ERANGE`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest attribute value (Linux `XATTR_SIZE_MAX`); larger is `ValueTooLarge` (`E2BIG`).
pub const XATTR_SIZE_MAX: usize = 64 * 1024;

const USER_PREFIX: &[u8] = b"user.";
/// Namespaces Linux knows that a scope does not store: reading answers `NoData`, writing `Unsupported`.
const REFUSED_PREFIXES: [&[u8]; 3] = [b"trusted.", b"security.", b"system."];

/// How `setxattr` treats an existing attribute (`XATTR_CREATE` / `XATTR_REPLACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Either,
    /// Fail with `Exists` when the attribute exists.
    Create,
    /// Fail with `NoData` when the attribute does not exist.
    Replace,
    /// Both flags (as on Linux, always fails): `Exists` when present, else `NoData`.
    CreateAndReplace,
}

/// Which namespace a name is in.
enum Namespace {
    User,
    /// `trusted.`, `security.`, `system.` (POSIX ACLs included).
    Refused,
    Unknown,
}

fn namespace(name: &[u8]) -> EngineResult<Namespace> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(EngineError::Range);
    }
    if let Some(rest) = name.strip_prefix(USER_PREFIX) {
        if rest.is_empty() {
            return Err(EngineError::Invalid("extended attribute name without a name after its namespace"));
        }
        return Ok(Namespace::User);
    }
    if REFUSED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Ok(Namespace::Refused);
    }
    Ok(Namespace::Unknown)
}

/// The error for a namespace that is not stored: `NoData` when reading a namespace Linux knows
/// (so `ls -l`, `cp -a` and ACL probes see "no attribute"), else `Unsupported`.
fn not_stored(ns: Namespace, reading: bool) -> EngineError {
    match ns {
        Namespace::Refused if reading => EngineError::NoData,
        _ => EngineError::Unsupported("only user.* extended attributes are stored"),
    }
}

impl ScopeEngine {
    /// Sets extended attribute `name` of `ino` (updates its ctime). Only `user.*` on regular files
    /// and directories; the name and value count against the byte quota (`QuotaExceeded`).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], mode: XattrMode) -> EngineResult<()> {
        if self.resent_answer().is_some() {
            return Ok(());
        }
        self.check_writable()?;
        match namespace(name)? {
            Namespace::User => {}
            other => return Err(not_stored(other, false)),
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(EngineError::ValueTooLarge);
        }
        let s = &self.storage.settings;
        let bounds = XattrBounds { max_count: s.max_xattrs_per_inode, max_bytes: s.max_xattr_bytes_per_inode };
        // Committed usage and pending growth are read under the metadata lock (see `reserve_growth`).
        let mut meta = self.meta.lock()?;
        meta.set_xattr(ino, name, value, mode, bounds, &|committed, growth| {
            let pending = *self.pending_growth.lock();
            self.check_bytes(committed, pending, growth)
        })
    }

    /// The value of extended attribute `name` of `ino`; `NoData` when it has none.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> EngineResult<Vec<u8>> {
        match namespace(name)? {
            Namespace::User => self.meta.lock()?.xattr(ino, name),
            // Answered without the metadata lock: the kernel asks for `security.capability`
            // before a file's first write (to drop file capabilities), on inodes it knows exist.
            other => {
                self.privileged_attribute_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(not_stored(other, true))
            }
        }
    }

    /// The names of the extended attributes of `ino`, each followed by a NUL byte (`listxattr`'s format).
    pub fn listxattr(&self, ino: Ino) -> EngineResult<Vec<u8>> {
        let names = self.meta.lock()?.xattr_names(ino)?;
        let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    /// Removes extended attribute `name` of `ino` (updates its ctime); `NoData` when absent.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> EngineResult<()> {
        if self.resent_answer().is_some() {
            return Ok(());
        }
        self.check_writable()?;
        match namespace(name)? {
            Namespace::User => self.meta.lock()?.remove_xattr(ino, name),
            other => {
                self.meta.lock()?.xattr_owner_kind(ino)?;
                Err(not_stored(other, true))
            }
        }
    }
}
