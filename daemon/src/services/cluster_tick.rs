//! The periodic work of a node (issue 23 item 3), every `node.heartbeat_ms`: renew the lease and
//! report the load (a loop of its own, never delayed by the rest); let go of scopes placed elsewhere now (this node was deposed: it stops serving
//! them within one heartbeat); claim scopes placed here and not served yet (a drained scope
//! arriving); take over this node's share of the scopes of nodes whose lease ran out; and, while
//! draining, hand scopes to other nodes one batch at a time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use scopefs::ids::ScopeId;
use scopefs::registry::nodes::{choose_node, NodeLoad, NodeRecord, NodeState, Placement};

use super::cluster::Cluster;
use super::ServiceError;

/// Scopes considered for a takeover, and handed away while draining, per heartbeat.
const TAKEOVER_BATCH: usize = 2_000;
const DRAIN_BATCH: usize = 16;
/// How long a drain waits for the new node to serve a scope before it lets go anyway.
const HANDOFF_WAIT: Duration = Duration::from_secs(60);

/// What one heartbeat did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TickReport {
    pub let_go: usize,
    pub claimed: usize,
    pub taken_over: usize,
    pub handed_away: usize,
    pub failed: usize,
}

impl TickReport {
    pub fn is_quiet(&self) -> bool {
        *self == TickReport::default()
    }
}

impl Cluster {
    /// Renews the lease every heartbeat, and runs `tick` every heartbeat, until `stop`. The two
    /// loops are apart: a long takeover or drain never delays the lease.
    pub async fn run(self: std::sync::Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let renew = {
            let node = self.clone();
            let stop = stop.clone();
            Self::every(node, stop, |node| node.renew().map(|_| TickReport::default()))
        };
        tokio::join!(renew, Self::every(self, stop, |node| node.tick()));
    }

    async fn every(
        self: std::sync::Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        work: fn(&Cluster) -> Result<TickReport, ServiceError>,
    ) {
        let mut every = tokio::time::interval(self.settings.heartbeat);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let node = self.clone();
            match tokio::task::spawn_blocking(move || work(&node)).await {
                Ok(Ok(r)) if !r.is_quiet() => tracing::info!(?r, "node heartbeat"),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "node heartbeat failed"),
                Err(e) => tracing::error!(error = %e, "node heartbeat panicked"),
            }
        }
    }

    /// Renews this node's lease (registering it again if its row is gone) and reports its load.
    fn renew(&self) -> Result<NodeRecord, ServiceError> {
        let s = &self.settings;
        Ok(match self.registry.heartbeat(&s.node, s.lease, self.load())? {
            Some(me) => me,
            None => self.registry.register_node(&s.node, &s.api_address, s.max_scopes, s.lease)?,
        })
    }

    /// One heartbeat (see the module docs).
    pub fn tick(&self) -> Result<TickReport, ServiceError> {
        let s = &self.settings;
        let me = self.renew()?;
        let mut report = TickReport::default();
        // Owned first: a scope admitted after this snapshot is not judged by the older placements.
        let owned: Vec<(ScopeId, u64)> = self.owned.lock().iter().map(|(k, v)| (k.clone(), *v)).collect();
        let placed: HashMap<ScopeId, Placement> =
            self.registry.placements_on(&s.node)?.into_iter().map(|p| (p.scope_id.clone(), p)).collect();
        for (scope, epoch) in owned {
            // Checked again under the scope's lock, with its placement read anew.
            if placed.get(&scope).map(|p| p.epoch) != Some(epoch) && self.let_go_if_moved(&scope)? {
                report.let_go += 1;
            }
        }
        let arrived: Vec<Placement> = {
            let owned = self.owned.lock();
            placed.values().filter(|p| !owned.contains_key(&p.scope_id)).cloned().collect()
        };
        let (ok, failed) = self.claim_all(&arrived);
        report.claimed += ok;
        report.failed += failed;
        match me.state {
            NodeState::Active => {
                let (ok, failed) = self.take_over()?;
                report.taken_over += ok;
                report.failed += failed;
            }
            NodeState::Draining => report.handed_away += self.drain_some()?,
            NodeState::Removed => {}
        }
        crate::metrics::note_node_moves(report.taken_over, report.let_go + report.handed_away);
        Ok(report)
    }

    /// What placement weighs: bytes of the scopes served here (open or noted) and live environments.
    fn load(&self) -> NodeLoad {
        let bytes_used =
            self.open.engines().iter().filter_map(|e| e.usage_known().ok().flatten()).map(|u| u.bytes).sum();
        let environments = self.compute.live_environment_count().unwrap_or(0);
        NodeLoad { bytes_used, environments }
    }

    /// Claims this node's share of the scopes of nodes whose lease ran out: a scope is taken by
    /// the live node its hash picks among the live active ones, or by any live node once its
    /// owner's lease has been over for two leases (the picked one may be gone too). The move is a
    /// compare-and-set on the old node and epoch: two takers never both win.
    fn take_over(&self) -> Result<(usize, usize), ServiceError> {
        let orphans = self.registry.orphaned_placements(TAKEOVER_BATCH)?;
        if orphans.is_empty() {
            return Ok((0, 0));
        }
        let now = self.registry.now_ms();
        let nodes = self.registry.nodes()?;
        let live: Vec<&NodeRecord> = nodes.iter().filter(|n| n.state == NodeState::Active && n.is_live(now)).collect();
        let Some(mine) = live.iter().position(|n| n.node_id == self.settings.node) else { return Ok((0, 0)) };
        let lease_ms = i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX / 4);
        let expired_long_ago =
            |node: &str| nodes.iter().find(|n| n.node_id == node).is_some_and(|n| n.lease_until + 2 * lease_ms <= now);
        let mut moved = Vec::new();
        for p in orphans {
            let picked = (fnv(p.scope_id.as_str()) % live.len() as u64) as usize == mine;
            if !picked && !expired_long_ago(&p.node_id) {
                continue;
            }
            if let Some(to) = self.registry.move_scope(&p.scope_id, &p.node_id, p.epoch, &self.settings.node)? {
                tracing::info!(scope_id = %p.scope_id, from = %p.node_id, epoch = to.epoch, "taking over a scope");
                moved.push(to);
            }
        }
        Ok(self.claim_all(&moved))
    }

    /// While draining: hands up to `DRAIN_BATCH` scopes to the nodes placement chooses. Each is
    /// made read-only here (programs are told, nothing is written that cannot be kept), flushed
    /// and shipped, moved at the next epoch, and let go once the new node serves it (its
    /// environments end here only then).
    fn drain_some(&self) -> Result<usize, ServiceError> {
        let mut handed = 0;
        for p in self.registry.placements_on(&self.settings.node)?.into_iter().take(DRAIN_BATCH) {
            let now = self.registry.now_ms();
            let others: Vec<NodeRecord> =
                self.registry.nodes()?.into_iter().filter(|n| n.node_id != self.settings.node).collect();
            let Some(target) = choose_node(&others, now) else {
                tracing::warn!("draining: no other live active node has room; waiting");
                return Ok(handed);
            };
            if let Some(engine) = self.open.get(&p.scope_id) {
                engine.set_read_only(true);
                if let Err(e) = engine.commit_open_files().and_then(|()| engine.sync()) {
                    tracing::error!(scope_id = %p.scope_id, error = %e, "draining: flushing a scope failed; it stays here");
                    engine.set_read_only(false);
                    continue;
                }
            }
            let Some(moved) = self.registry.move_scope(&p.scope_id, &self.settings.node, p.epoch, &target.node_id)?
            else {
                continue;
            };
            self.owned.lock().remove(&p.scope_id);
            let _ = self.renew();
            let deadline = Instant::now() + HANDOFF_WAIT;
            while Instant::now() < deadline {
                let served = self.registry.placement(&p.scope_id)?.and_then(|q| q.head).map(|h| h.gen);
                if served.is_some_and(|g| scopefs::engine::fence::epoch_of(g) >= moved.epoch) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            self.let_go(&p.scope_id);
            handed += 1;
        }
        Ok(handed)
    }
}

/// FNV-1a of a scope id: which live node takes it over.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
