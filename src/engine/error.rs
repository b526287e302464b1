//! `EngineError`: every failure of the file engine, named by what went wrong (adapters map it to errno/HTTP).

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long (at most 255 bytes)")]
    NameTooLong,
    /// A path with more components or bytes than `limits.max_path_depth`/`max_path_bytes` allow.
    #[error("path too deep or too long")]
    PathTooLong,
    /// A recursive listing or delete would visit more than `limits.max_walk_entries` entries.
    #[error("too many entries below this directory for one request")]
    TooManyEntries,
    /// A listing would build more than `limits.max_listing_bytes` of entries.
    #[error("the listing of this directory is larger than one request may build (limits.max_listing_bytes)")]
    ListingTooLarge,
    /// A daemon-wide budget (listing memory) is in use by other requests: try again later.
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The scope's own share of a budget is in use by its other requests: try again later.
    #[error("busy: {0}")]
    ScopeBusy(&'static str),
    #[error("invalid name: {0}")]
    InvalidName(&'static str),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// A symlink target of a size outside 1..4095 bytes (`crate::names::check_symlink_target`).
    #[error("invalid argument: symlink target must be 1..4095 bytes")]
    BadSymlinkTarget,
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    #[error("the file changed since it was read")]
    Changed,
    #[error("scope is read-only (deleting)")]
    ReadOnly,
    #[error("scope quota exceeded ({0})")]
    QuotaExceeded(&'static str),
    #[error("content larger than allowed")]
    TooLarge,
    #[error("local staging space exhausted")]
    NoSpace,
    #[error("bad file handle")]
    BadHandle,
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
    /// A file already has `limits.max_links_per_file` names.
    #[error("too many links")]
    TooManyLinks,
    /// The extended attribute asked for does not exist.
    #[error("no such extended attribute")]
    NoData,
    /// A value does not fit the room given for it, or an extended attribute name is empty or
    /// longer than 255 bytes.
    #[error("result or name out of range")]
    Range,
    /// An extended attribute value larger than 64 KiB.
    #[error("extended attribute value larger than 64 KiB")]
    ValueTooLarge,
    /// An inode's extended attributes would exceed `limits.max_xattrs_per_inode` or
    /// `limits.max_xattr_bytes_per_inode`.
    #[error("no room for more extended attributes on this inode")]
    XattrsFull,
    #[error("object store: {0}")]
    Store(#[from] StoreError),
    #[error("block {sha256} failed its integrity check")]
    Corrupt { sha256: String },
    #[error("metadata database: {0}")]
    Metadata(#[from] rusqlite::Error),
    #[error("migration: {0}")]
    Migration(#[from] crate::migrate::MigrateError),
    #[error("local I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The scope's metadata lacks mutations that were acknowledged and could not be put back from
    /// its redo log yet (a full disk, an I/O error), or a durability point of the scope failed:
    /// every call fails until it is repaired (`EIO`; the HTTP API answers 503).
    #[error("scope unavailable: {0}")]
    Poisoned(&'static str),
    /// Data written through this handle may have been lost since it was last told of an error (a
    /// failed durability point, a damaged block): told once per handle (`EIO`).
    #[error("an earlier write of this file may have been lost")]
    WriteLost,
}

pub type EngineResult<T> = Result<T, EngineError>;

/// Which rule a refused request broke (counted by the adapters' metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An invalid, reserved or over-long name, or an operation the scope does not permit.
    Path,
    /// A symlink target of a size outside 1..4095 bytes (any content is allowed; SPEC §6).
    Symlink,
}

impl EngineError {
    /// The rule this error enforces, when it is a refusal of the path or symlink rules; other
    /// errors (missing files, quotas, store failures) are not refusals. Decided by the variant
    /// alone (no wildcard: a new variant must say whether it is a refusal).
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            EngineError::InvalidName(_)
            | EngineError::NameTooLong
            | EngineError::PathTooLong
            | EngineError::NotPermitted(_) => Some(Refusal::Path),
            EngineError::BadSymlinkTarget => Some(Refusal::Symlink),
            EngineError::NotFound
            | EngineError::Exists
            | EngineError::NotDir
            | EngineError::IsDir
            | EngineError::NotEmpty
            | EngineError::TooManyEntries
            | EngineError::ListingTooLarge
            | EngineError::Busy(_)
            | EngineError::ScopeBusy(_)
            | EngineError::Invalid(_)
            | EngineError::Changed
            | EngineError::ReadOnly
            | EngineError::QuotaExceeded(_)
            | EngineError::TooLarge
            | EngineError::NoSpace
            | EngineError::BadHandle
            | EngineError::Unsupported(_)
            | EngineError::TooManyLinks
            | EngineError::NoData
            | EngineError::Range
            | EngineError::ValueTooLarge
            | EngineError::XattrsFull
            | EngineError::Store(_)
            | EngineError::Corrupt { .. }
            | EngineError::Metadata(_)
            | EngineError::Migration(_)
            | EngineError::Io(_)
            | EngineError::Poisoned(_)
            | EngineError::WriteLost => None,
        }
    }

    /// Whether the error means the local disk is full (the host's `ENOSPC`/`EDQUOT`, SQLite's
    /// `SQLITE_FULL`, or the staging budget): answered `ENOSPC`, not `EIO`.
    pub fn out_of_space(&self) -> bool {
        match self {
            EngineError::NoSpace => true,
            EngineError::Io(e) => matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)),
            EngineError::Metadata(rusqlite::Error::SqliteFailure(f, _)) => f.code == rusqlite::ErrorCode::DiskFull,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart_from_other_errors() {
        assert_eq!(EngineError::InvalidName("reserved").refusal(), Some(Refusal::Path));
        assert_eq!(EngineError::NameTooLong.refusal(), Some(Refusal::Path));
        assert_eq!(EngineError::PathTooLong.refusal(), Some(Refusal::Path));
        assert_eq!(EngineError::NotPermitted("hard links").refusal(), Some(Refusal::Path));
        assert_eq!(EngineError::BadSymlinkTarget.refusal(), Some(Refusal::Symlink));
        // The words of a message decide nothing: only the variant does.
        assert_eq!(EngineError::NotPermitted("extended attributes on a symlink").refusal(), Some(Refusal::Path));
        for other in [
            EngineError::NotFound,
            EngineError::Invalid("offset"),
            EngineError::Invalid("not a symlink"),
            EngineError::TooLarge,
            EngineError::ReadOnly,
        ] {
            assert_eq!(other.refusal(), None, "{other}");
        }
    }
}
