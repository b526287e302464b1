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
    #[error("invalid name: {0}")]
    InvalidName(&'static str),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
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
