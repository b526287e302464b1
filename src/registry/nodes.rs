//! SQL of `nodes` and `scope_placement`: the daemons of a deployment (registration, heartbeats
//! and leases, drain), which node serves each scope under which fencing epoch, placement of new
//! scopes, moves, and the head of each scope's shipped metadata chain (recorded only by its owner
//! at its epoch: a deposed node's late objects never become the scope's state).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::ids::ScopeId;
use crate::registry::db::{params, Conn, OptionalExtension, Row};

use super::{to_i64, to_u64, validate_key, DeploymentRegistry, RegistryError};

string_enum!(
    /// A node's state: `active` takes new scopes, `draining` hands its scopes away, `removed` is out
    /// of the deployment (transitions in `node_state_transitions`).
    NodeState, "node state", {
    Active => "active",
    Draining => "draining",
    Removed => "removed",
});

/// One row of `nodes`, with the number of scopes placed on it. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct NodeRecord {
    pub node_id: String,
    pub api_address: String,
    pub state: NodeState,
    pub max_scopes: u64,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub lease_until: i64,
    pub bytes_used: u64,
    pub environments: u64,
    pub scopes: u64,
}

impl NodeRecord {
    /// Whether its lease is still running at `now`.
    pub fn is_live(&self, now: i64) -> bool {
        self.lease_until > now
    }
}

/// The head of a scope's shipped metadata chain: generation, last batch and its state id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShippedHead {
    pub gen: u64,
    pub seq: u64,
    pub state: u64,
}

/// Which node serves a scope, under which epoch, and the chain that is its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub scope_id: ScopeId,
    pub node_id: String,
    pub epoch: u64,
    pub head: Option<ShippedHead>,
}

/// What a node reports with each heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLoad {
    pub bytes_used: u64,
    pub environments: u64,
}

const NODE_COLUMNS: &str = "n.node_id, n.api_address, n.state, n.max_scopes, n.started_at, n.heartbeat_at, \
     n.lease_until, n.bytes_used, n.environments, \
     (SELECT COUNT(*) FROM scope_placement p WHERE p.deployment_id = n.deployment_id AND p.node_id = n.node_id) AS scopes";
const PLACEMENT_COLUMNS: &str = "scope_id, node_id, epoch, meta_gen, meta_seq, meta_state";

fn node_row(r: &Row<'_>) -> crate::registry::db::Result<Result<NodeRecord, RegistryError>> {
    let state: String = r.get("state")?;
    let max_scopes: i64 = r.get("max_scopes")?;
    let bytes: i64 = r.get("bytes_used")?;
    let envs: i64 = r.get("environments")?;
    let scopes: i64 = r.get("scopes")?;
    let (node_id, api_address) = (r.get("node_id")?, r.get("api_address")?);
    let (started_at, heartbeat_at, lease_until) = (r.get("started_at")?, r.get("heartbeat_at")?, r.get("lease_until")?);
    Ok((|| {
        Ok(NodeRecord {
            node_id,
            api_address,
            state: state.parse()?,
            max_scopes: to_u64(max_scopes, "max_scopes")?,
            started_at,
            heartbeat_at,
            lease_until,
            bytes_used: to_u64(bytes, "bytes_used")?,
            environments: to_u64(envs, "environments")?,
            scopes: to_u64(scopes, "scopes")?,
        })
    })())
}

fn placement_row(r: &Row<'_>) -> crate::registry::db::Result<Result<Placement, RegistryError>> {
    let scope: String = r.get("scope_id")?;
    let epoch: i64 = r.get("epoch")?;
    let (gen, seq, state): (Option<i64>, Option<i64>, Option<i64>) =
        (r.get("meta_gen")?, r.get("meta_seq")?, r.get("meta_state")?);
    let node_id = r.get("node_id")?;
    Ok((|| {
        let head = match (gen, seq, state) {
            // Generation and state ids are stored as the bits of a signed integer.
            (Some(g), Some(s), Some(st)) => {
                Some(ShippedHead { gen: g as u64, seq: to_u64(s, "meta_seq")?, state: st as u64 })
            }
            _ => None,
        };
        Ok(Placement {
            scope_id: ScopeId::parse(&scope)
                .map_err(|_| RegistryError::Corrupt("scope_id in scope_placement".into()))?,
            node_id,
            epoch: to_u64(epoch, "epoch")?,
            head,
        })
    })())
}

fn get_node_in(conn: &Conn<'_>, deployment: &str, node: &str) -> Result<Option<NodeRecord>, RegistryError> {
    let sql = format!("SELECT {NODE_COLUMNS} FROM nodes n WHERE n.deployment_id = ?1 AND n.node_id = ?2");
    conn.query_row(&sql, params![deployment, node], node_row).optional()?.transpose()
}

fn get_placement_in(conn: &Conn<'_>, deployment: &str, scope: &ScopeId) -> Result<Option<Placement>, RegistryError> {
    let sql = format!("SELECT {PLACEMENT_COLUMNS} FROM scope_placement WHERE deployment_id = ?1 AND scope_id = ?2");
    conn.query_row(&sql, params![deployment, scope.as_str()], placement_row).optional()?.transpose()
}

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 4)
}

impl DeploymentRegistry {
    /// Registers this node at its start (or again after a restart): its address, its bound and a
    /// fresh lease. A removed node that starts again is active; a draining one stays draining.
    pub fn register_node(
        &self,
        node: &str,
        api_address: &str,
        max_scopes: u64,
        lease: Duration,
    ) -> Result<NodeRecord, RegistryError> {
        validate_key("node_id", node)?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO nodes (deployment_id, node_id, api_address, state, max_scopes, started_at, heartbeat_at, lease_until)
             VALUES (?1, ?2, ?3, 'active', ?4, ?5, ?5, ?6)
             ON CONFLICT (deployment_id, node_id) DO UPDATE SET
                 api_address = excluded.api_address, max_scopes = excluded.max_scopes,
                 started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
                 lease_until = excluded.lease_until,
                 state = CASE WHEN nodes.state = 'removed' THEN 'active' ELSE nodes.state END",
            params![self.id(), node, api_address, to_i64(max_scopes), now, now + lease_ms(lease)],
        )?;
        let rec = get_node_in(&tx, self.id(), node)?.ok_or_else(|| RegistryError::Corrupt("new node".into()))?;
        tx.commit()?;
        Ok(rec)
    }

    /// Renews this node's lease and records its load; `None` when the node is not registered.
    pub fn heartbeat(&self, node: &str, lease: Duration, load: NodeLoad) -> Result<Option<NodeRecord>, RegistryError> {
        let now = self.now_ms();
        let conn = self.db.conn()?;
        conn.execute(
            "UPDATE nodes SET heartbeat_at = ?3, lease_until = ?4, bytes_used = ?5, environments = ?6
             WHERE deployment_id = ?1 AND node_id = ?2",
            params![self.id(), node, now, now + lease_ms(lease), to_i64(load.bytes_used), to_i64(load.environments)],
        )?;
        get_node_in(&conn, self.id(), node)
    }

    /// One node.
    pub fn node(&self, node: &str) -> Result<Option<NodeRecord>, RegistryError> {
        get_node_in(&self.db.conn()?, self.id(), node)
    }

    /// Every node of the deployment, by id.
    pub fn nodes(&self) -> Result<Vec<NodeRecord>, RegistryError> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes n WHERE n.deployment_id = ?1 ORDER BY n.node_id");
        let conn = self.db.conn()?;
        let rows = conn.query_rows(&sql, params![self.id()])?;
        rows.iter().map(|r| node_row(r)?).collect()
    }

    /// Moves a node's state along `node_state_transitions` (drain, undrain, remove).
    pub fn set_node_state(&self, node: &str, to: NodeState) -> Result<NodeRecord, RegistryError> {
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_node_in(&tx, self.id(), node)?.ok_or(RegistryError::NodeNotFound)?;
        if rec.state != to {
            let allowed: i64 = tx.query_row(
                "SELECT COUNT(*) FROM node_state_transitions WHERE from_state = ?1 AND to_state = ?2",
                params![rec.state.as_str(), to.as_str()],
                |r| r.get(0),
            )?;
            if allowed == 0 {
                return Err(RegistryError::NodeTransition { current: rec.state, requested: to });
            }
            if to == NodeState::Removed && rec.scopes > 0 {
                return Err(RegistryError::NodeHasScopes(rec.scopes));
            }
            tx.execute(
                "UPDATE nodes SET state = ?3 WHERE deployment_id = ?1 AND node_id = ?2",
                params![self.id(), node, to.as_str()],
            )?;
        }
        let rec = get_node_in(&tx, self.id(), node)?.ok_or(RegistryError::NodeNotFound)?;
        tx.commit()?;
        Ok(rec)
    }

    /// Where a scope is served (`None`: never placed).
    pub fn placement(&self, scope: &ScopeId) -> Result<Option<Placement>, RegistryError> {
        get_placement_in(&self.db.conn()?, self.id(), scope)
    }

    /// Every scope placed on `node`.
    pub fn placements_on(&self, node: &str) -> Result<Vec<Placement>, RegistryError> {
        let sql = format!(
            "SELECT {PLACEMENT_COLUMNS} FROM scope_placement WHERE deployment_id = ?1 AND node_id = ?2 ORDER BY scope_id"
        );
        let conn = self.db.conn()?;
        let rows = conn.query_rows(&sql, params![self.id(), node])?;
        rows.iter().map(|r| placement_row(r)?).collect()
    }

    /// Scopes placed on nodes whose lease ended before now (at most `limit`), for a takeover.
    pub fn orphaned_placements(&self, limit: usize) -> Result<Vec<Placement>, RegistryError> {
        let sql = format!(
            "SELECT {PLACEMENT_COLUMNS} FROM scope_placement p WHERE p.deployment_id = ?1 AND p.node_id IN
                 (SELECT node_id FROM nodes WHERE deployment_id = ?1 AND lease_until <= ?2)
             ORDER BY p.scope_id LIMIT ?3"
        );
        let conn = self.db.conn()?;
        let rows = conn.query_rows(&sql, params![self.id(), self.now_ms(), to_i64(limit as u64)])?;
        rows.iter().map(|r| placement_row(r)?).collect()
    }

    /// Places a scope that has no placement on `node` at epoch 1; a placed scope keeps its own
    /// (returned as it is).
    pub fn place(&self, scope: &ScopeId, node: &str) -> Result<Placement, RegistryError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        if let Some(p) = get_placement_in(&tx, self.id(), scope)? {
            return Ok(p);
        }
        tx.execute(
            "INSERT INTO scope_placement (deployment_id, scope_id, node_id, epoch, updated_at) VALUES (?1, ?2, ?3, 1, ?4)",
            params![self.id(), scope.as_str(), node, now],
        )?;
        let p =
            get_placement_in(&tx, self.id(), scope)?.ok_or_else(|| RegistryError::Corrupt("new placement".into()))?;
        tx.commit()?;
        Ok(p)
    }

    /// Moves a scope from `from` (at `epoch`) to node `to` under the next epoch; `None` when it is
    /// no longer at (`from`, `epoch`) (another node moved it first). Its shipped head is kept: the
    /// new node restores from it.
    pub fn move_scope(
        &self,
        scope: &ScopeId,
        from: &str,
        epoch: u64,
        to: &str,
    ) -> Result<Option<Placement>, RegistryError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let moved = tx.execute(
            "UPDATE scope_placement SET node_id = ?5, epoch = epoch + 1, updated_at = ?6
             WHERE deployment_id = ?1 AND scope_id = ?2 AND node_id = ?3 AND epoch = ?4",
            params![self.id(), scope.as_str(), from, to_i64(epoch), to, now],
        )?;
        let p = if moved == 1 { get_placement_in(&tx, self.id(), scope)? } else { None };
        tx.commit()?;
        Ok(p)
    }

    /// Records the head of a scope's shipped chain, if `node` still serves it at `epoch`; `false`
    /// when it does not (the node was deposed: what it shipped is not the scope's state).
    pub fn record_shipped(
        &self,
        scope: &ScopeId,
        node: &str,
        epoch: u64,
        head: ShippedHead,
    ) -> Result<bool, RegistryError> {
        let conn = self.db.conn()?;
        let n = conn.execute(
            "UPDATE scope_placement SET meta_gen = ?5, meta_seq = ?6, meta_state = ?7, updated_at = ?8
             WHERE deployment_id = ?1 AND scope_id = ?2 AND node_id = ?3 AND epoch = ?4",
            params![
                self.id(),
                scope.as_str(),
                node,
                to_i64(epoch),
                head.gen as i64,
                to_i64(head.seq),
                head.state as i64,
                self.now_ms()
            ],
        )?;
        Ok(n == 1)
    }

    /// The live, active node with the most room for a new scope (see `choose_node`).
    pub fn choose_node(&self) -> Result<Option<NodeRecord>, RegistryError> {
        let now = self.now_ms();
        Ok(choose_node(&self.nodes()?, now))
    }
}

/// Placement of a new scope: among active nodes whose lease runs and that are below their
/// `max_scopes`, the one with the fewest scopes plus four per live environment, then the fewest
/// bytes, then the smallest id (deterministic).
pub fn choose_node(nodes: &[NodeRecord], now: i64) -> Option<NodeRecord> {
    nodes
        .iter()
        .filter(|n| n.state == NodeState::Active && n.is_live(now) && n.scopes < n.max_scopes)
        .min_by_key(|n| (n.scopes + 4 * n.environments, n.bytes_used, n.node_id.clone()))
        .cloned()
}
