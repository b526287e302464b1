//! `scopefs node ls|drain|undrain|remove`: the nodes of a deployment, straight from the shared
//! registry (issue 23). A drain is carried out by the draining node itself (`services::cluster_tick`):
//! its scopes move, a batch per heartbeat, to the nodes placement chooses; `--wait` follows it.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use scopefs::config::Config;
use scopefs::registry::nodes::NodeState;
use scopefs::registry::DeploymentRegistry;

fn registry(cfg: &Config) -> anyhow::Result<DeploymentRegistry> {
    if cfg.registry.url.is_none() {
        bail!("nodes share a PostgreSQL registry: set [registry] url (this daemon runs alone)");
    }
    let registry = crate::setup::open_registry(cfg).context("opening the registry")?;
    Ok(std::sync::Arc::new(registry).deployment(&cfg.deployment_id))
}

/// Lists the nodes: state, liveness, scopes placed on each, load reported with the last heartbeat.
pub fn ls(cfg: &Config) -> anyhow::Result<()> {
    let registry = registry(cfg)?;
    let now = registry.now_ms();
    println!(
        "{:<20}  {:<9}  {:<5}  {:>7}  {:>10}  {:>12}  {:>5}  API_ADDRESS",
        "NODE", "STATE", "LIVE", "SCOPES", "MAX_SCOPES", "BYTES", "ENVS"
    );
    for n in registry.nodes().context("listing nodes")? {
        println!(
            "{:<20}  {:<9}  {:<5}  {:>7}  {:>10}  {:>12}  {:>5}  {}",
            n.node_id,
            n.state,
            if n.is_live(now) { "yes" } else { "no" },
            n.scopes,
            n.max_scopes,
            n.bytes_used,
            n.environments,
            n.api_address
        );
    }
    Ok(())
}

/// Marks `node` draining; with `wait`, follows until no scope is placed on it (bounded by `timeout`).
pub fn drain(cfg: &Config, node: &str, wait: bool, timeout: Duration) -> anyhow::Result<()> {
    let registry = registry(cfg)?;
    let rec = registry.set_node_state(node, NodeState::Draining).context("draining the node")?;
    println!("node {node}: draining ({} scopes to move)", rec.scopes);
    if !wait {
        return Ok(());
    }
    let deadline = Instant::now() + timeout;
    let mut last = rec.scopes;
    loop {
        let left = registry.node(node)?.context("the node disappeared")?.scopes;
        if left != last {
            println!("node {node}: {left} scopes left");
            last = left;
        }
        if left == 0 {
            println!("node {node}: drained");
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("node {node}: {left} scopes still placed after {}s (is the node running?)", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Takes a drained node back into placement.
pub fn undrain(cfg: &Config, node: &str) -> anyhow::Result<()> {
    registry(cfg)?.set_node_state(node, NodeState::Active).context("undraining the node")?;
    println!("node {node}: active");
    Ok(())
}

/// Removes a node that serves no scope (drain it first).
pub fn remove(cfg: &Config, node: &str) -> anyhow::Result<()> {
    registry(cfg)?.set_node_state(node, NodeState::Removed).context("removing the node")?;
    println!("node {node}: removed");
    Ok(())
}
