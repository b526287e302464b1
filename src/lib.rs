//! scopefs core: ids, configuration, registry, object stores and the file engine.
//!
//! Core knows nothing of FUSE, HTTP or Docker: adapters in `scopefs-fs` and
//! `scopefs-daemon` call into it and map its errors in one place each.

pub mod billing;
pub mod clock;
pub mod config;
pub mod db_files;
pub(crate) mod durable_dirs;
pub mod engine;
pub mod executor;
pub mod ids;
pub mod limits;
pub mod migrate;
pub mod names;
pub mod registry;
pub mod scope_locks;
pub mod signing;
pub mod store;
pub mod testhooks;
pub mod vpath;
