//! FUSE adapter over the scopefs file engine, and the per-scope mount manager.

pub mod adapter;
pub mod errno;
pub mod keep;
pub mod layout;
pub mod metrics;
pub mod mount;
mod offload;
pub mod pause;

pub use adapter::{FastPaths, ScopeFs};
pub use mount::{MountError, MountManager, MountOptions};
