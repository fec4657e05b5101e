//! `[aggregate]`: Multicall3 aggregation, off unless asked for.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of the aggregation layer (per network).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregateConfig {
    /// Aggregate eligible `eth_call` misses into Multicall3 `aggregate3` calls.
    pub eth_call: bool,
    /// How long the first call of a group waits for others to the same block.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Most calls in one aggregate; a full group leaves at once.
    pub max_calls: usize,
}

impl Default for AggregateConfig {
    fn default() -> Self {
        Self { eth_call: false, window: Duration::from_millis(2), max_calls: 50 }
    }
}

impl AggregateConfig {
    /// Checks the settings; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=1000).contains(&self.max_calls) {
            return Err("aggregate.max_calls: must be between 2 and 1000".into());
        }
        if self.window > Duration::from_secs(1) {
            return Err("aggregate.window: at most 1s (every aggregated call waits for it)".into());
        }
        Ok(())
    }
}
