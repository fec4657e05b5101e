//! Per-transaction status: where a transaction is, or why it left. Nothing leaves the pool
//! without a recorded reason, which `sluice_getTransactionStatus` reports.

use alloy_primitives::B256;
use serde_json::{json, Value};

/// Why a transaction is no longer pooled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxStatus {
    /// Included in a block (its number when known).
    Mined {
        /// The block.
        block: Option<u64>,
    },
    /// Replaced by another transaction of the same sender and nonce.
    Replaced {
        /// The replacement.
        by: B256,
    },
    /// Evicted to make room for better-paying transactions.
    Evicted,
    /// Queued for longer than the lifetime.
    Expired,
    /// The upstream nodes refused it when it was relayed.
    Rejected {
        /// The node's error message.
        reason: String,
    },
}

impl TxStatus {
    /// A short label for metrics and the status call.
    pub fn label(&self) -> &'static str {
        match self {
            TxStatus::Mined { .. } => "mined",
            TxStatus::Replaced { .. } => "replaced",
            TxStatus::Evicted => "evicted",
            TxStatus::Expired => "expired",
            TxStatus::Rejected { .. } => "rejected",
        }
    }

    /// The JSON the status call answers with.
    pub fn to_json(&self, hash: &B256) -> Value {
        let mut v = json!({ "hash": hash, "status": self.label() });
        match self {
            TxStatus::Mined { block: Some(n) } => v["blockNumber"] = json!(format!("{n:#x}")),
            TxStatus::Replaced { by } => v["replacedBy"] = json!(by),
            TxStatus::Rejected { reason } => v["reason"] = json!(reason),
            _ => {}
        }
        v
    }
}

/// The recent departures, bounded (oldest forgotten first).
#[derive(Clone)]
pub struct Statuses {
    departed: moka::sync::Cache<B256, TxStatus>,
    /// Counts records, so that a caller waiting on one transaction (`eth_sendRawTransactionSync`)
    /// wakes when something left, without a timer.
    changes: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl Statuses {
    /// Remembers up to `capacity` departures.
    pub fn new(capacity: u64) -> Self {
        Self {
            departed: moka::sync::Cache::new(capacity),
            changes: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Records why `hash` left.
    pub fn record(&self, hash: B256, status: TxStatus) {
        self.departed.insert(hash, status);
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Why `hash` left, if it did recently.
    pub fn get(&self, hash: &B256) -> Option<TxStatus> {
        self.departed.get(hash)
    }

    /// Wakes on every record after this call.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}
