//! Forks and snapshots of scopes (issue 23 item 5). A fork is a new scope (a conversation's branch)
//! whose files are its parent's at one instant; a snapshot is a read-only point in time of a scope,
//! kept as a scope of its own that is never mounted, read through the file API and restorable into
//! its scope. Both copy the parent's metadata and no block (`Storage::fork_scope`); the registry
//! records the copy with its provisioning (a crash mid-copy makes it again) and which blocks it
//! shares (`block_holds`: gc and purge keep a shared block until no scope refers to it).

use std::sync::Arc;

use scopefs::engine::{ScopeEngine, SharedBlocks};
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::forks::SnapshotRecord;
use scopefs::registry::{DeploymentRegistry, RegistryError, ScopeRecord, ScopeState};

use super::{require_open_state, validate_operation_id, Scopes, ServiceError};

/// The registry's record of shared blocks, as the engine asks for it.
pub struct RegistryHolds(pub DeploymentRegistry);

impl SharedBlocks for RegistryHolds {
    fn held(&self, home: &str, sha: &str) -> Result<bool, String> {
        self.0.block_held(home, sha).map_err(|e| e.to_string())
    }

    fn release(&self, holder: &str, home: &str, sha: &str) -> Result<bool, String> {
        self.0.release_block(holder, home, sha).map_err(|e| e.to_string())
    }

    fn held_blocks(&self, home: &str) -> Result<std::collections::HashSet<String>, String> {
        self.0.held_blocks(home).map_err(|e| e.to_string())
    }
}

/// Lets `scopes`' compute service keep an ended environment's outputs in snapshots of their stores
/// (issue 24 item 6: an artifact's bytes stay as recorded however its file changes after).
pub fn keep_outputs_in_snapshots(scopes: &Arc<Scopes>) {
    let weak = Arc::downgrade(scopes);
    scopes.compute.set_output_snapshots(Arc::new(move |scope: &ScopeId, snapshot_id: &str| {
        let scopes = weak.upgrade().ok_or(ServiceError::Busy("the daemon is stopping"))?;
        Ok(scopes.snapshot(scope, snapshot_id)?.snapshot_scope_id)
    }));
}

/// The thread id of the scope that keeps snapshot `id`.
fn snapshot_thread(id: &str) -> Result<ThreadId, ServiceError> {
    Ok(ThreadId::parse(&format!("snap.{id}")).map_err(|_| RegistryError::Invalid {
        field: "snapshot_id",
        reason: "must be 1-123 characters of [A-Za-z0-9_.:-]",
    })?)
}

impl Scopes {
    /// Forks `parent` (draft or active) into a new scope of `thread`, idempotent on
    /// `operation_id`: its files are the parent's at this instant; it belongs to the parent's user
    /// (`user`, if given, must be that user). Returns the new scope and whether it is new.
    pub fn fork(
        &self,
        parent: &ScopeId,
        operation_id: &str,
        thread: &ThreadId,
        user: Option<&str>,
    ) -> Result<(ScopeRecord, bool), ServiceError> {
        validate_operation_id(operation_id)?;
        let parent_rec = self.registry.get(parent)?.ok_or(ServiceError::ScopeNotFound)?;
        require_open_state(parent_rec.state)?;
        if user.is_some_and(|u| parent_rec.user_id.as_deref().is_some_and(|p| p != u)) {
            return Err(ServiceError::ScopeNotFound);
        }
        let p = self.registry.provision_fork(operation_id, thread, parent)?;
        let rec = if p.scope.state == ScopeState::Provisioning { self.finish_fork(&p.scope, parent)? } else { p.scope };
        if let Some(u) = parent_rec.user_id.as_deref().or(user) {
            super::peers::bind_user(&self.registry, &rec, u)?;
        }
        if p.created {
            tracing::info!(scope_id = %rec.scope_id, parent = %parent, "scope forked");
        }
        Ok((self.registry.get(&rec.scope_id)?.ok_or(ServiceError::ScopeNotFound)?, p.created))
    }

    /// Completes a copy being provisioned: any partial copy a crash left is dropped, the parent's
    /// database copied (every block it names put in the store first), the shared blocks held,
    /// provisioning finished. Runs again after a crash (startup, the mount route, maintenance).
    pub(super) fn finish_fork(&self, child: &ScopeRecord, parent: &ScopeId) -> Result<ScopeRecord, ServiceError> {
        let _one_at_a_time = self.provisioning.lock();
        let current = self.registry.get(&child.scope_id)?.ok_or(ServiceError::ScopeNotFound)?;
        if current.state != ScopeState::Provisioning {
            return Ok(current);
        }
        let parent_rec = self.registry.get(parent)?.ok_or(ServiceError::ScopeNotFound)?;
        require_open_state(parent_rec.state)?;
        let parent_engine = self.open.engine(&parent_rec)?;
        let storage = self.open.storage().clone();
        self.open.close(&child.scope_id)?;
        storage.remove_scope_local(&child.scope_id)?;
        let shared = storage.fork_scope(&parent_engine, &child.scope_id)?;
        self.registry.hold_blocks(&child.scope_id, &shared)?;
        // Opened here (with several nodes: placed on the parent's node, where its copy is) and
        // its metadata shipped, so the bucket alone restores it from now on.
        self.open.engine(&current)?.sync()?;
        Ok(self.registry.complete_provision(&child.scope_id)?)
    }

    /// Takes snapshot `snapshot_id` of `scope` (draft or active): a read-only copy of its files now.
    pub fn snapshot(&self, scope: &ScopeId, snapshot_id: &str) -> Result<SnapshotRecord, ServiceError> {
        if let Some(existing) = self.registry.snapshot(snapshot_id)? {
            return match existing.scope_id == *scope {
                true => Ok(existing),
                false => Err(RegistryError::OperationConflict.into()),
            };
        }
        let thread = snapshot_thread(snapshot_id)?;
        let (rec, _) = self.fork(scope, &format!("snapshot-{snapshot_id}"), &thread, None)?;
        // Active: a snapshot never expires as an unused draft.
        if rec.state == ScopeState::Draft {
            self.registry.transition(&rec.scope_id, rec.revision, ScopeState::Active)?;
        }
        Ok(self.registry.record_snapshot(scope, snapshot_id, &rec.scope_id)?)
    }

    /// The snapshots of `scope`, oldest first.
    pub fn snapshots(&self, scope: &ScopeId) -> Result<Vec<SnapshotRecord>, ServiceError> {
        self.registry.get(scope)?.ok_or(ServiceError::ScopeNotFound)?;
        Ok(self.registry.snapshots(scope)?)
    }

    /// The read-only engine of snapshot `snapshot_id` of `scope`.
    pub fn snapshot_engine(&self, scope: &ScopeId, snapshot_id: &str) -> Result<Arc<ScopeEngine>, ServiceError> {
        let snap =
            self.registry.snapshot(snapshot_id)?.filter(|s| s.scope_id == *scope).ok_or(ServiceError::ScopeNotFound)?;
        let rec = self.registry.get(&snap.snapshot_scope_id)?.ok_or(ServiceError::ScopeNotFound)?;
        let engine = self.open.engine(&rec)?;
        engine.set_read_only(true);
        Ok(engine)
    }

    /// Restores snapshot `snapshot_id` into `scope`: its files become the snapshot's. Refused while
    /// an environment of the scope runs (its containers bind the mount, which is replaced).
    pub fn restore_snapshot(&self, scope: &ScopeId, snapshot_id: &str) -> Result<ScopeRecord, ServiceError> {
        let rec = self.registry.get(scope)?.ok_or(ServiceError::ScopeNotFound)?;
        require_open_state(rec.state)?;
        let snap =
            self.registry.snapshot(snapshot_id)?.filter(|s| s.scope_id == *scope).ok_or(ServiceError::ScopeNotFound)?;
        if self.registry.environments(scope)?.iter().any(|e| e.state.is_live()) {
            return Err(ServiceError::Busy("the scope has live environments: destroy them before a restore"));
        }
        let _one_at_a_time = self.provisioning.lock();
        let snap_rec = self.registry.get(&snap.snapshot_scope_id)?.ok_or(ServiceError::ScopeNotFound)?;
        let snap_engine = self.open.engine(&snap_rec)?;
        let storage = self.open.storage().clone();
        let was_mounted = self.open.is_mounted(scope);
        // Only the metadata is replaced: the scope's own blocks the snapshot names are its own
        // again; those written since stay in the store as orphans (`scopefs fsck --repair`).
        self.open.close(scope)?;
        storage.remove_scope_local(scope)?;
        let shared = storage.fork_scope(&snap_engine, scope)?;
        self.registry.hold_blocks(scope, &shared)?;
        if was_mounted {
            self.open.mount(&rec)?;
        }
        tracing::info!(scope_id = %scope, snapshot_id, "snapshot restored");
        Ok(rec)
    }
}
