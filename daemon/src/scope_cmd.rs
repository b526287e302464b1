//! `scopefs scope create|ls`: direct registry and engine access from the command line (no HTTP, no mounts).

use anyhow::Context;
use scopefs::config::Config;
use scopefs::ids::ThreadId;
use scopefs::registry::ScopeRecord;

use crate::ops_cmd::{open_offline, open_registry, Offline};
use crate::services::scopes;

/// Creates a scope (state `draft`) and its filesystem metadata; does not mount it. Refuses while
/// a daemon runs on the data directory (`open_offline`).
pub fn create(cfg: &Config, thread: &str) -> anyhow::Result<()> {
    let thread = ThreadId::parse(thread).context("invalid --thread")?;
    let Offline { registry, storage, .. } = &open_offline(cfg, "scope create")?;
    let rec =
        scopes::create_unmounted(cfg.default_quota(), registry, storage, &thread).context("creating the scope")?;
    println!("{}", header());
    println!("{}", row(&rec, "-"));
    Ok(())
}

/// Lists every scope of the deployment.
pub fn ls(cfg: &Config) -> anyhow::Result<()> {
    let registry = open_registry(cfg)?;
    println!("{}", header());
    for rec in registry.list().context("listing scopes")? {
        // The node that serves it (several nodes), with its fencing epoch.
        let node = match registry.placement(&rec.scope_id).context("reading the scope's placement")? {
            Some(p) => format!("{}@{}", p.node_id, p.epoch),
            None => "-".to_string(),
        };
        println!("{}", row(&rec, &node));
    }
    Ok(())
}

fn header() -> String {
    format!("{:<36}  {:<12}  {:>8}  {:<20}  {}", "SCOPE_ID", "STATE", "REVISION", "NODE", "PRIMARY_THREAD_ID")
}

fn row(rec: &ScopeRecord, node: &str) -> String {
    format!("{:<36}  {:<12}  {:>8}  {:<20}  {}", rec.scope_id, rec.state, rec.revision, node, rec.primary_thread_id)
}
