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
    #[error("invalid name: {0}")]
    InvalidName(&'static str),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
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
    /// errors (missing files, quotas, store failures) are not refusals.
    pub fn refusal(&self) -> Option<Refusal> {
        let about_symlink = |m: &str| m.contains("symlink");
        match self {
            EngineError::NotPermitted(m) | EngineError::Invalid(m) if about_symlink(m) => Some(Refusal::Symlink),
            EngineError::InvalidName(_)
            | EngineError::NameTooLong
            | EngineError::PathTooLong
            | EngineError::NotPermitted(_) => Some(Refusal::Path),
            _ => None,
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
        assert_eq!(EngineError::NotPermitted("absolute symlink targets").refusal(), Some(Refusal::Symlink));
        assert_eq!(EngineError::Invalid("symlink target leaves the scope").refusal(), Some(Refusal::Symlink));
        for other in
            [EngineError::NotFound, EngineError::Invalid("offset"), EngineError::TooLarge, EngineError::ReadOnly]
        {
            assert_eq!(other.refusal(), None, "{other}");
        }
    }
}
