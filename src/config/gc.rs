//! `[gc]` of the configuration: the daemon's online garbage collection of unreferenced blocks
//! (issue 24 item 7; the rules that make it safe are `engine/gc.rs`'s).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[gc]`: every `interval_secs` the daemon collects the blocks no file has referenced for
/// `grace_secs` in each mounted scope, one scope at a time, at most `blocks_per_pass` per scope and
/// pass, each page under one of the scope's upload shares and one of the daemon's upload slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcConfig {
    /// Seconds between passes; 0 turns online gc off (`scopefs gc` then reclaims, offline).
    pub interval_secs: u64,
    /// A block goes only once nothing has referenced it for this long. Keep it above the longest a
    /// read or an upload may take (`store_timeout_ms` times `store_attempts`).
    pub grace_secs: u64,
    /// Most blocks one pass deletes in one scope (the rest wait for the next pass).
    pub blocks_per_pass: u64,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig { interval_secs: 3600, grace_secs: 3600, blocks_per_pass: 100_000 }
    }
}

impl GcConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.blocks_per_pass == 0 {
            return Err(ConfigError::Invalid { key: "gc.blocks_per_pass", reason: "must be at least 1".into() });
        }
        Ok(())
    }

    /// The interval between passes, `None` when online gc is off.
    pub fn interval(&self) -> Option<Duration> {
        (self.interval_secs > 0).then(|| Duration::from_secs(self.interval_secs))
    }

    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.grace_secs)
    }
}
