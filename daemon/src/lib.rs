//! The scopefs daemon as a library: the HTTP API, the services behind it, the Docker executor and
//! the process plumbing (supervisor, descriptor store, notify). `main.rs` parses the command line
//! and calls in here; integration tests use the same modules.
//!
//! Dependencies run one way: `api` → `services` → (registry, engine, `mounter`, `executor`).

pub mod api;
pub mod bench;
pub mod billing_loop;
pub mod datadir_lock;
pub mod doctor;
pub mod executor;
pub mod fdstore;
pub mod http;
pub mod memory_bound;
pub mod metrics;
pub mod node_cmd;
pub mod notify;
pub mod ops_cmd;
pub mod pools;
pub mod registry_ship;
pub mod restore_cmd;
pub mod rlimit;
pub mod scope_cmd;
pub mod serve;
pub mod service_stop;
pub mod services;
pub mod setup;
pub mod supervisor;
pub mod tokens;

#[cfg(test)]
mod module_graph;
