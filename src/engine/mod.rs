//! The file engine: per-scope namespace and block-structured contents over an object store, with staging, journal, cache and quotas.
//!
//! `Storage` is shared by every scope of a daemon (store, block cache, runtime,
//! staging accounting); `ScopeEngine` is one scope's filesystem. Every method is
//! synchronous and safe to call from many threads (never from inside async code:
//! use `spawn_blocking`); object-store calls run on the storage's Tokio runtime
//! with a timeout and bounded retries.
//!
//! Lock order: an open file's lock, then the metadata lock, then the open-file map.

mod cache;
mod census;
mod dirs;
mod dirty;
mod early;
mod error;
mod errseq;
pub mod fence;
mod fileio;
mod fork;
mod gc;
mod journal;
mod lazy_meta;
mod listing;
mod logfile;
mod meta;
mod note;
mod openlog;
mod paths;
mod privs;
mod release_wait;
mod requests;
pub mod restore;
mod scope;
pub(crate) mod ship;
mod ship_objects;
mod storage;
mod types;
mod unneeded;
mod upkeep;
mod upload;
mod xattr;

pub use error::{EngineError, EngineResult, Refusal};
pub use fileio::alloc::AllocMode;
pub use fork::SharedBlocks;
pub use gc::{gc_totals, GcReport};
pub use lazy_meta::open_databases;
pub use listing::{Listing, ListingMemory};
pub use paths::{Change, ChangeObserver, PathEntry, WriteMode, WRITE_FILL_BYTES};
pub use requests::RequestScope;
pub use scope::{KernelProbe, ScopeEngine};
pub use ship::{shipped_totals, ShippedTotals};
pub use storage::Storage;
pub use types::*;
pub use unneeded::unneeded_upload_totals;
pub use upkeep::FsckReport;
pub use xattr::{XattrMode, XATTR_NAME_MAX, XATTR_SIZE_MAX};
