//! Online garbage collection of the scopes this daemon has open (`[gc]`, issue 24 item 7): one
//! scope at a time, each pass bounded (`gc.blocks_per_pass`) and each page of it under one of the
//! scope's upload shares and one of the daemon's slots; the engine's rules (`engine/gc.rs`) make
//! it safe while the scope is written, read and mounted.

use scopefs::engine::GcReport;
use scopefs::ids::ScopeId;

use super::scopes::Scopes;
use super::{require_open_state, ServiceError};

/// What one pass over the open scopes did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcPassReport {
    pub scopes: usize,
    /// Scopes whose pass failed (logged; their blocks wait for the next pass).
    pub failed: usize,
    pub blocks_deleted: u64,
    pub bytes_deleted: u64,
    pub blocks_deferred: u64,
}

impl Scopes {
    /// Seconds between the daemon's passes, `None` when online gc is off.
    pub fn gc_interval(&self) -> Option<std::time::Duration> {
        self.gc.interval()
    }

    /// One pass over every open scope. A scope whose pass fails (its store down, its durability
    /// point failing) is logged and counted; the others go on.
    pub fn gc_pass(&self) -> GcPassReport {
        let cfg = &self.gc;
        let mut out = GcPassReport::default();
        for engine in self.open.engines() {
            out.scopes += 1;
            match engine.collect_garbage_online(cfg.grace(), cfg.blocks_per_pass) {
                Ok(r) => {
                    out.blocks_deleted += r.blocks_deleted;
                    out.bytes_deleted += r.bytes_deleted;
                    out.blocks_deferred += r.blocks_deferred;
                }
                Err(e) => {
                    out.failed += 1;
                    tracing::warn!(scope_id = %engine.scope_id(), error = %e, "online gc of a scope failed; the next pass retries");
                }
            }
        }
        out
    }

    /// One pass over one draft or active scope now (`POST /internal/workspace-scopes/{scope_id}/gc`), opening
    /// it if needed; `ServedElsewhere` when another node serves it.
    pub fn gc_scope(&self, scope: &ScopeId) -> Result<GcReport, ServiceError> {
        let cfg = &self.gc;
        let rec = self.registry.get(scope)?.ok_or(ServiceError::ScopeNotFound)?;
        require_open_state(rec.state)?;
        let engine = self.open.engine(&rec)?;
        Ok(engine.collect_garbage_online(cfg.grace(), cfg.blocks_per_pass)?)
    }
}
