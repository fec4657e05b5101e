//! `[subscriptions]`: what sluice serves itself.

use serde::{Deserialize, Serialize};

/// Settings of the subscription hub (per network).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubscriptionsConfig {
    /// Serve `newHeads` and `logs` from sluice's head tracker (across all upstreams) instead
    /// of relaying them from one upstream socket.
    pub local: bool,
    /// Events a subscriber may fall behind before it is closed (1008).
    pub client_buffer: usize,
    /// Recent blocks whose logs are kept, to send them again as removed on a reorg.
    pub reorg_window: usize,
}

impl Default for SubscriptionsConfig {
    fn default() -> Self {
        Self { local: true, client_buffer: 4096, reorg_window: 128 }
    }
}

impl SubscriptionsConfig {
    /// Checks the settings; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(16..=1 << 20).contains(&self.client_buffer) {
            return Err("subscriptions.client_buffer: must be between 16 and 1048576".into());
        }
        if !(1..=4096).contains(&self.reorg_window) {
            return Err("subscriptions.reorg_window: must be between 1 and 4096".into());
        }
        Ok(())
    }
}
