//! Several daemons, one deployment (issue 23 item 3): this node's registration, the scopes it
//! serves and their fencing epochs, claiming a scope (a takeover, a drained scope arriving, an
//! unplaced one), letting one go (deposed, or handed away by a drain), placing a new scope, and
//! where a request for a scope must go. The periodic work (heartbeat, takeover, drain) is in
//! `cluster_tick.rs`.
//!
//! A scope is served by the node its placement names, at the placement's epoch. A node opens and
//! mounts only the scopes it serves (the gate of `OpenScopes`); its shipped metadata counts only
//! once the registry recorded it at that epoch (`scopefs::engine::fence`), so a deposed node's late
//! writes never become the scope's state. A node claiming a scope drops any local copy served under
//! another epoch and restores the recorded head from the bucket.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use scopefs::engine::fence::{Head, ShipFence};
use scopefs::ids::ScopeId;
use scopefs::registry::nodes::{Placement, ShippedHead};
use scopefs::registry::DeploymentRegistry;

use super::open_scopes::{OpenScopes, ServesScope};
use super::{ComputeService, ServiceError};

/// This node's part in the deployment (`[node]` of the configuration).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node: String,
    pub api_address: String,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub max_scopes: u64,
    pub takeover_parallelism: usize,
}

impl ClusterSettings {
    /// `None` when the daemon runs alone (no `node.id`).
    pub fn from_config(cfg: &scopefs::config::Config) -> Option<ClusterSettings> {
        Some(ClusterSettings {
            node: cfg.node.id.clone()?,
            api_address: cfg.node.api_address.clone()?.trim_end_matches('/').to_string(),
            lease: Duration::from_millis(cfg.node.lease_ms),
            heartbeat: Duration::from_millis(cfg.node.heartbeat_ms),
            max_scopes: cfg.node.max_scopes,
            takeover_parallelism: cfg.node.takeover_parallelism,
        })
    }
}

/// Where a request for a scope goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node serves it (or nobody serves it yet and this node may).
    Local,
    /// The node at this base URL serves it.
    Forward(String),
    /// Its node's lease ran out and no node has taken it over yet: retry shortly.
    Moving,
}

/// This node and the scopes it serves.
pub struct Cluster {
    pub(super) settings: ClusterSettings,
    pub(super) registry: DeploymentRegistry,
    pub(super) open: Arc<OpenScopes>,
    pub(super) compute: Arc<ComputeService>,
    /// Scopes this node serves, with the epoch it serves each under.
    pub(super) owned: Mutex<HashMap<ScopeId, u64>>,
    /// Held while a scope is admitted, claimed or let go: the heartbeat and a request opening the
    /// scope never act on it at once (one would drop what the other just opened).
    pub(super) moving: scopefs::scope_locks::ScopeLocks,
}

impl Cluster {
    pub fn new(
        settings: ClusterSettings,
        registry: DeploymentRegistry,
        open: Arc<OpenScopes>,
        compute: Arc<ComputeService>,
    ) -> Arc<Cluster> {
        let cluster = Arc::new(Cluster {
            settings,
            registry,
            open,
            compute,
            owned: Mutex::new(HashMap::new()),
            moving: Default::default(),
        });
        cluster.open.storage().set_ship_fence(cluster.clone());
        cluster.open.set_gate(cluster.clone());
        let node = Arc::downgrade(&cluster);
        cluster
            .compute
            .set_local_scopes(Arc::new(move |scope| node.upgrade().is_some_and(|c| c.is_placed_here(scope))));
        cluster
    }

    pub fn node_id(&self) -> &str {
        &self.settings.node
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// Scopes this node serves now.
    pub fn served(&self) -> usize {
        self.owned.lock().len()
    }

    /// Whether `scope` is placed on this node (served, or about to be).
    pub fn is_placed_here(&self, scope: &ScopeId) -> bool {
        self.serves_now(scope)
            || self.registry.placement(scope).ok().flatten().is_some_and(|p| p.node_id == self.settings.node)
    }

    /// Whether this node serves `scope` now.
    pub fn serves_now(&self, scope: &ScopeId) -> bool {
        self.owned.lock().contains_key(scope)
    }

    /// Startup: registers the node (a fresh lease) and claims every scope placed on it; a local
    /// copy served under the same epoch is kept (a restart), any other is restored from the bucket.
    /// Returns (claimed, failed).
    pub fn start(&self) -> Result<(usize, usize), ServiceError> {
        let s = &self.settings;
        self.registry.register_node(&s.node, &s.api_address, s.max_scopes, s.lease)?;
        let placed = self.registry.placements_on(&s.node)?;
        Ok(self.claim_all(&placed))
    }

    /// Claims `placements` (each already naming this node) on `takeover_parallelism` threads.
    pub(super) fn claim_all(&self, placements: &[Placement]) -> (usize, usize) {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (ok, failed) = (std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0));
        std::thread::scope(|sc| {
            for _ in 0..self.settings.takeover_parallelism.clamp(1, placements.len().max(1)) {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(p) = placements.get(i) else { return };
                    match self.claim(p) {
                        Ok(()) => ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        Err(e) => {
                            tracing::error!(scope_id = %p.scope_id, epoch = p.epoch, error = %e, "claiming a scope failed; retried at the next heartbeat");
                            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        }
                    };
                });
            }
        });
        (ok.into_inner(), failed.into_inner())
    }

    /// Starts serving a scope placed on this node at `p.epoch`: a local copy of another epoch is
    /// dropped, the recorded head restored, and a draft or active scope mounted; its first
    /// snapshot at the new epoch is shipped and recorded at once (the proof it is served here). A
    /// local copy of this epoch (this node restarted) is mounted as it is.
    pub(super) fn claim(&self, p: &Placement) -> Result<(), ServiceError> {
        let _moving = self.moving.of(&p.scope_id).lock();
        if self.owned.lock().get(&p.scope_id) == Some(&p.epoch) {
            return Ok(());
        }
        let storage = self.open.storage().clone();
        // The local copy is this epoch's (a restart of this node): kept as it is, nothing to prove.
        let moved = storage.local_epoch(&p.scope_id) != Some(p.epoch);
        if moved {
            self.open.close(&p.scope_id)?;
            storage.remove_scope_local(&p.scope_id)?;
        }
        self.owned.lock().insert(p.scope_id.clone(), p.epoch);
        let result = (|| {
            let Some(rec) = self.registry.get(&p.scope_id)? else { return Ok(()) };
            if rec.state.is_mountable() {
                self.open.mount(&rec)?;
                if moved {
                    let engine = self.open.get(&p.scope_id).ok_or(ServiceError::ScopeNotFound)?;
                    engine.sync()?;
                    storage.set_local_epoch(&p.scope_id, p.epoch)?;
                }
            }
            Ok(())
        })();
        if result.is_err() {
            self.owned.lock().remove(&p.scope_id);
        }
        result
    }

    /// Stops serving `scope` if the registry no longer places it here at the epoch this node
    /// serves it under (checked again under the scope's lock); whether it did.
    pub(super) fn let_go_if_moved(&self, scope: &ScopeId) -> Result<bool, ServiceError> {
        let _moving = self.moving.of(scope).lock();
        let Some(epoch) = self.owned.lock().get(scope).copied() else { return Ok(false) };
        let p = self.registry.placement(scope)?;
        if p.is_some_and(|p| p.node_id == self.settings.node && p.epoch == epoch) {
            return Ok(false);
        }
        tracing::warn!(scope_id = %scope, epoch, "another node serves this scope now; letting it go");
        self.let_go(scope);
        Ok(true)
    }

    /// Stops serving a scope another node serves now (this one was deposed, or handed it away):
    /// its environments end, its mount goes, its local copy is dropped.
    pub(super) fn let_go(&self, scope: &ScopeId) {
        self.owned.lock().remove(scope);
        if let Err(e) = self.compute.stop_scope_compute(scope) {
            tracing::warn!(scope_id = %scope, error = %e, "stopping the environments of a scope served elsewhere failed");
        }
        if let Err(e) = self.open.remove_local(scope) {
            tracing::warn!(scope_id = %scope, error = %e, "dropping the local copy of a scope served elsewhere failed");
        }
    }

    /// Where a request for `scope` goes.
    pub fn route(&self, scope: &ScopeId) -> Result<Route, ServiceError> {
        if self.serves_now(scope) {
            return Ok(Route::Local);
        }
        let Some(p) = self.registry.placement(scope)? else { return Ok(Route::Local) };
        if p.node_id == self.settings.node {
            // Placed here, not claimed yet (startup, or the next heartbeat claims it).
            return Ok(Route::Moving);
        }
        match self.registry.node(&p.node_id)? {
            Some(n) if n.is_live(self.registry.now_ms()) => Ok(Route::Forward(n.api_address)),
            _ => Ok(Route::Moving),
        }
    }

    /// The scope `thread` acts in (its primary thread, or a live thread owner of it).
    pub fn scope_of_thread(&self, thread: &scopefs::ids::ThreadId) -> Result<Option<ScopeId>, ServiceError> {
        Ok(self.registry.thread_binding(thread)?.map(|b| b.scope.scope_id))
    }

    /// Where a new scope goes: the node placement chooses (this one when it is the choice, or
    /// when no node has room: the provision is then refused by the registry's bound elsewhere).
    pub fn route_new(&self) -> Result<Route, ServiceError> {
        match self.registry.choose_node()? {
            Some(n) if n.node_id != self.settings.node => Ok(Route::Forward(n.api_address)),
            _ => Ok(Route::Local),
        }
    }
}

impl ServesScope for Cluster {
    /// A scope placed on this node and claimed, or one no node serves yet (placed here now).
    fn admit(&self, scope: &ScopeId) -> Result<(), ServiceError> {
        if self.serves_now(scope) {
            return Ok(());
        }
        let _moving = self.moving.of(scope).lock();
        if self.serves_now(scope) {
            return Ok(());
        }
        let p = self.registry.place(scope, &self.settings.node)?;
        if p.node_id != self.settings.node {
            return Err(ServiceError::ServedElsewhere);
        }
        let storage = self.open.storage();
        if storage.local_epoch(scope) != Some(p.epoch) && p.head.is_some() {
            // A copy of another epoch is not the scope's state.
            storage.remove_scope_local(scope)?;
        }
        self.owned.lock().insert(scope.clone(), p.epoch);
        Ok(())
    }

    fn opened(&self, scope: &ScopeId) {
        let epoch = self.owned.lock().get(scope).copied();
        if let Some(epoch) = epoch {
            if let Err(e) = self.open.storage().set_local_epoch(scope, epoch) {
                tracing::warn!(scope_id = %scope, error = %e, "noting the epoch of a scope's local copy failed");
            }
        }
    }
}

impl ShipFence for Cluster {
    fn epoch(&self, scope: &str) -> Option<u64> {
        let id = ScopeId::parse(scope).ok()?;
        self.owned.lock().get(&id).copied()
    }

    fn recorded(&self, scope: &str) -> Result<Option<Head>, String> {
        let id = ScopeId::parse(scope).map_err(|e| e.to_string())?;
        let p = self.registry.placement(&id).map_err(|e| e.to_string())?;
        Ok(p.and_then(|p| p.head).map(|h| (h.gen, h.seq, h.state)))
    }

    fn record(&self, scope: &str, epoch: u64, (gen, seq, state): Head) -> Result<bool, String> {
        let id = ScopeId::parse(scope).map_err(|e| e.to_string())?;
        let head = ShippedHead { gen, seq, state };
        self.registry.record_shipped(&id, &self.settings.node, epoch, head).map_err(|e| e.to_string())
    }
}
