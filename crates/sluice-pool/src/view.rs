//! What readers see: an immutable snapshot of the pool, published by the writer after every
//! batch and read without locks, plus the JSON renderings of geth's `txpool_*` formats.
//!
//! The maps are persistent (`imbl`): publishing a batch copies only the paths it changed, so a
//! snapshot costs O(changes), not O(pool), and a reader holding an old one never blocks the
//! writer or sees a half-applied batch.

use std::sync::Arc;

use alloy_consensus::transaction::Recovered;
use alloy_consensus::{Transaction, TxEnvelope};
use alloy_primitives::{Address, Bytes, B256};
use serde_json::{json, Map, Value};

use crate::{PoolTx, Status};

/// A pooled transaction with everything readers need.
#[derive(Debug)]
pub struct Pooled {
    /// The pool's view of it (hash, sender, nonce, fees).
    pub tx: PoolTx,
    /// The raw EIP-2718 bytes, as received (what is journaled and relayed).
    pub raw: Bytes,
    /// The decoded envelope (for the RPC renderings).
    pub envelope: TxEnvelope,
}

impl crate::AsPoolTx for Pooled {
    fn pool_tx(&self) -> &PoolTx {
        &self.tx
    }
}

impl Pooled {
    /// The transaction as `eth_getTransactionByHash` shows a pending one: block fields null.
    pub fn to_rpc(&self) -> Value {
        serde_json::to_value(self.rpc_form()).unwrap_or(Value::Null)
    }

    /// The same, serialized straight to JSON text (the `eth_getTransactionByHash` answer).
    pub fn to_rpc_raw(&self) -> Option<Box<serde_json::value::RawValue>> {
        serde_json::value::to_raw_value(&self.rpc_form()).ok()
    }

    fn rpc_form(&self) -> alloy_rpc_types_eth::Transaction {
        alloy_rpc_types_eth::Transaction {
            inner: Recovered::new_unchecked(self.envelope.clone(), self.tx.sender),
            block_hash: None,
            block_number: None,
            transaction_index: None,
            effective_gas_price: None,
        }
    }

    /// geth's `txpool_inspect` line: `to: value wei + gas gas × price wei`.
    pub fn summary(&self) -> String {
        let to = match self.envelope.to() {
            Some(to) => format!("{to}"),
            None => "contract creation".to_owned(),
        };
        format!("{to}: {} wei + {} gas × {} wei", self.tx.value, self.tx.gas_limit, self.tx.max_fee)
    }
}

/// One sender's pooled transactions, by nonce.
#[derive(Debug, Default)]
pub struct SenderView {
    /// The next nonce counting the executable transactions (`eth_getTransactionCount(pending)`).
    pub pending_nonce: u64,
    /// Executable now, consecutive from the account nonce.
    pub pending: Vec<Arc<Pooled>>,
    /// Waiting for a nonce gap to fill or for the base fee to fall.
    pub queued: Vec<Arc<Pooled>>,
}

/// A persistent (copy-on-write) map keyed by `N` bytes: hashes and addresses are already
/// uniform, so they are hashed with alloy's fixed-bytes hasher rather than SipHash.
pub type PersistentMap<K, V, const N: usize> =
    imbl::GenericHashMap<K, V, alloy_primitives::map::FbBuildHasher<N>, imbl::shared_ptr::DefaultSharedPtr>;

/// The pool as of one published batch.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Every pooled transaction by hash.
    pub by_hash: PersistentMap<B256, Arc<Pooled>, 32>,
    /// Every sender with pooled transactions.
    pub senders: PersistentMap<Address, Arc<SenderView>, 20>,
    /// Pending and queued counts.
    pub status: Status,
    /// The base fee executability was judged by.
    pub base_fee: u128,
}

impl Snapshot {
    /// `txpool_status`.
    pub fn status_json(&self) -> Value {
        json!({ "pending": quantity(self.status.pending as u64), "queued": quantity(self.status.queued as u64) })
    }

    /// `txpool_content` (full transactions) or `txpool_inspect` (one-line summaries).
    pub fn content_json(&self, summaries: bool) -> Value {
        let mut pending = Map::new();
        let mut queued = Map::new();
        for (sender, view) in &self.senders {
            let key = format!("{sender}");
            if !view.pending.is_empty() {
                pending.insert(key.clone(), by_nonce(&view.pending, summaries));
            }
            if !view.queued.is_empty() {
                queued.insert(key, by_nonce(&view.queued, summaries));
            }
        }
        json!({ "pending": pending, "queued": queued })
    }

    /// `txpool_contentFrom`: one sender's transactions.
    pub fn content_from_json(&self, sender: &Address) -> Value {
        let empty = SenderView::default();
        let view = self.senders.get(sender).map_or(&empty, |v| v.as_ref());
        json!({ "pending": by_nonce(&view.pending, false), "queued": by_nonce(&view.queued, false) })
    }
}

fn by_nonce(txs: &[Arc<Pooled>], summaries: bool) -> Value {
    let map: Map<String, Value> = txs
        .iter()
        .map(|t| {
            let value = if summaries { Value::String(t.summary()) } else { t.to_rpc() };
            (t.tx.nonce.to_string(), value)
        })
        .collect();
    Value::Object(map)
}

/// A JSON-RPC quantity.
pub fn quantity(n: u64) -> String {
    format!("{n:#x}")
}
