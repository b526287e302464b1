//! The file engine: per-scope namespace and block-structured contents over an object store, with staging, journal, cache and quotas.
//!
//! `Storage` is shared by every scope of a daemon (store, block cache, runtime,
//! staging accounting); `ScopeEngine` is one scope's filesystem. Every method is
//! synchronous and safe to call from many threads; object-store calls run on the
//! storage's Tokio runtime with a timeout and bounded retries.

mod error;
mod types;

pub use error::{EngineError, EngineResult};
pub use types::*;
mod api_stub;
pub use api_stub::{FsckReport, GcReport, ScopeEngine, Storage};
