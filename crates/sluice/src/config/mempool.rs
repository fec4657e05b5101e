//! The `[mempool]` section and how it becomes the mempool's own configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The mempool (see docs/mempool.md); pool limits default to geth's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MempoolSection {
    /// Keep a local pool; when off, `eth_sendRawTransaction` and `txpool_*` pass through.
    pub enabled: bool,
    /// The journal file (created with its folder); every accepted transaction is written to it
    /// before the answer and replayed at start.
    pub journal: std::path::PathBuf,
    /// When journal writes reach the disk: "os" (survives a process crash) or "always"
    /// (fsync per batch: survives a power loss).
    pub fsync: String,
    /// Forward accepted transactions to the upstreams.
    pub relay: bool,
    /// Send still-pending transactions again after this long.
    #[serde(with = "humantime_serde")]
    pub rebroadcast_interval: Duration,
    /// Largest raw transaction, in bytes.
    pub max_tx_bytes: usize,
    /// Executable transactions guaranteed per sender.
    pub account_slots: usize,
    /// Gapped transactions allowed per sender.
    pub account_queue: usize,
    /// Executable transactions in all.
    pub global_slots: usize,
    /// Gapped transactions in all.
    pub global_queue: usize,
    /// How long a gapped transaction may wait for its gap to fill.
    #[serde(with = "humantime_serde")]
    pub lifetime: Duration,
    /// Fee increase a replacement needs on both fee fields, in percent.
    pub price_bump_percent: u128,
    /// Smallest tip accepted, in wei.
    pub min_tip: u128,
    /// Senders whose transactions are never evicted.
    pub priority_senders: Vec<String>,
    /// Niceness of the threads that decode and recover senders (0–19): above 0, reads are
    /// served first when the CPU is short.
    pub verify_nice: i32,
}

impl Default for MempoolSection {
    fn default() -> Self {
        let pool = sluice_mempool::Config::default();
        let d = sluice_mempool::MempoolConfig::default();
        Self {
            enabled: true,
            journal: ".sluice/mempool.journal".into(),
            fsync: "os".into(),
            relay: d.relay,
            rebroadcast_interval: d.rebroadcast_interval,
            max_tx_bytes: d.max_tx_bytes,
            account_slots: pool.account_slots,
            account_queue: pool.account_queue,
            global_slots: pool.global_slots,
            global_queue: pool.global_queue,
            lifetime: pool.lifetime,
            price_bump_percent: pool.price_bump_percent,
            min_tip: pool.min_tip,
            priority_senders: Vec::new(),
            verify_nice: d.verify_nice,
        }
    }
}

impl TryFrom<&MempoolSection> for sluice_mempool::MempoolConfig {
    type Error = String;

    fn try_from(m: &MempoolSection) -> Result<Self, String> {
        if !(0..=19).contains(&m.verify_nice) {
            return Err(format!("mempool.verify_nice: must be 0 to 19, got {}", m.verify_nice));
        }
        let sync = match m.fsync.as_str() {
            "os" => sluice_mempool::journal::Sync::Os,
            "always" => sluice_mempool::journal::Sync::Always,
            other => return Err(format!("mempool.fsync: expected \"os\" or \"always\", got {other:?}")),
        };
        let priority_senders = m
            .priority_senders
            .iter()
            .map(|a| a.parse().map_err(|_| format!("mempool.priority_senders: {a:?} is not an address")))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            pool: sluice_mempool::Config {
                account_slots: m.account_slots,
                account_queue: m.account_queue,
                global_slots: m.global_slots,
                global_queue: m.global_queue,
                lifetime: m.lifetime,
                price_bump_percent: m.price_bump_percent,
                min_tip: m.min_tip,
                priority_senders,
            },
            max_tx_bytes: m.max_tx_bytes,
            journal: Some(m.journal.clone()),
            sync,
            relay: m.relay,
            rebroadcast_interval: m.rebroadcast_interval,
            verify_nice: m.verify_nice,
            ..Self::default()
        })
    }
}
