//! `[registry]` and `[node]` of the configuration: where the registry lives, and this daemon as
//! one node of several (issue 23).

use serde::{Deserialize, Serialize};

use super::ConfigError;

fn invalid(key: &'static str, reason: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid { key, reason: reason.into() })
}

/// `[node]`: several daemons serving one deployment (issue 23). With `id` set, this daemon
/// registers as a node in the shared PostgreSQL registry, serves the scopes placed on it, forwards
/// requests for other scopes to their node, and takes over the scopes of a node whose lease ran out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's id, unique in the deployment (1-64 of [A-Za-z0-9_.:-]); none: one daemon alone.
    pub id: Option<String>,
    /// The base URL the other nodes reach this node's HTTP API at (`http://10.0.0.2:7070`).
    pub api_address: Option<String>,
    /// How long a heartbeat keeps this node's lease; past it, other nodes take its scopes over.
    pub lease_ms: u64,
    /// How often the node renews its lease, looks for scopes to take over and hands scopes away
    /// while draining.
    pub heartbeat_ms: u64,
    /// Most scopes placed on this node (placement skips a full node).
    pub max_scopes: u64,
    /// Scopes restored and mounted at once in a takeover.
    pub takeover_parallelism: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            id: None,
            api_address: None,
            lease_ms: 10_000,
            heartbeat_ms: 2_000,
            max_scopes: 10_000,
            takeover_parallelism: 8,
        }
    }
}

/// `[registry]`: the embedded SQLite registry (`<data_dir>/control/registry.sqlite3`, the default;
/// one host only) or a PostgreSQL database every node of a deployment shares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// `postgres://user:password@host:port/database`; none: the embedded SQLite registry.
    pub url: Option<String>,
    /// The schema of that database the registry's tables live in (created when missing); none: `public`.
    pub schema: Option<String>,
    /// Connections the daemon keeps to PostgreSQL (1-64).
    pub pool_size: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig { url: None, schema: None, pool_size: 8 }
    }
}

impl RegistryConfig {
    /// Refuses values the registry cannot be opened with, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=64).contains(&self.pool_size) {
            return invalid("self.pool_size", "must be between 1 and 64");
        }
        if let Some(url) = &self.url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return invalid("self.url", "must be a postgres:// or postgresql:// URL");
            }
        }
        if let Some(schema) = &self.schema {
            let ok = (1..=63).contains(&schema.len())
                && schema.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && !schema.as_bytes()[0].is_ascii_digit();
            if !ok {
                return invalid("self.schema", "must be 1-63 of [a-z0-9_], not starting with a digit");
            }
        }
        Ok(())
    }
}

impl NodeConfig {
    /// Refuses values a node cannot run with (given where the registry lives), naming the key.
    pub fn validate(&self, registry: &RegistryConfig) -> Result<(), ConfigError> {
        if let Some(id) = &self.id {
            if !crate::ids::is_token(id) || id.len() > 64 {
                return invalid("node.id", "must be 1-64 characters of [A-Za-z0-9_.:-]");
            }
            if registry.url.is_none() {
                return invalid("node.id", "several nodes share a PostgreSQL registry: set registry.url");
            }
            match &self.api_address {
                Some(a) if (a.starts_with("http://") || a.starts_with("https://")) && a.len() <= 256 => {}
                _ => {
                    return invalid(
                        "node.api_address",
                        "must be set to the http(s):// URL other nodes reach this node at",
                    )
                }
            }
        }
        if !(1_000..=600_000).contains(&self.lease_ms) {
            return invalid("node.lease_ms", "must be between 1000 and 600000");
        }
        if self.heartbeat_ms < 100 || self.heartbeat_ms * 3 > self.lease_ms {
            return invalid("node.heartbeat_ms", "must be at least 100 and at most a third of node.lease_ms");
        }
        if !(1..=64).contains(&self.takeover_parallelism) {
            return invalid("node.takeover_parallelism", "must be between 1 and 64");
        }
        Ok(())
    }
}
