//! Relay: executable transactions are forwarded to the upstreams in batches, and sent again
//! while they stay pending. A node's refusal removes the transaction from the pool with its
//! reason recorded, counted and logged; nothing is dropped silently.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use alloy_primitives::B256;
use serde_json::value::RawValue;
use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_upstream::pool::is_already_known;
use sluice_upstream::Call;
use tokio::sync::mpsc;

use crate::core::Core;
use crate::view::Pooled;
use crate::writer::Command;

/// Most transactions per upstream batch.
const MAX_BATCH: usize = 256;

/// What a node's answer to `eth_sendRawTransaction` means for the pool.
#[derive(Debug, PartialEq, Eq)]
pub enum RelayDecision {
    /// Accepted, or already known to the node (including already mined): keep it until mined.
    Keep,
    /// Refused for good: remove it, with this reason.
    Reject(String),
}

/// Reads a node's error answer. Duplicates (in every node's wording, as the upstream pool
/// reads them) and "nonce too low" (mined meanwhile) are not refusals; anything else is.
pub fn verdict(error: &RawValue) -> RelayDecision {
    let message = error_message(error);
    if is_already_known(error) || message.to_ascii_lowercase().contains("nonce too low") {
        RelayDecision::Keep
    } else {
        RelayDecision::Reject(message)
    }
}

pub(crate) async fn run(core: Arc<Core>, mut rx: mpsc::Receiver<Arc<Pooled>>) {
    let mut last_sent: HashMap<B256, Instant> = HashMap::new();
    let interval = core.config.rebroadcast_interval;
    let mut rebroadcast = tokio::time::interval(interval);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, MAX_BATCH) => {
                if n == 0 {
                    return;
                }
                let txs = std::mem::take(&mut batch);
                send(&core, txs, &mut last_sent, "relay").await;
            }
            _ = rebroadcast.tick() => {
                let snapshot = core.snapshot();
                last_sent.retain(|hash, _| snapshot.contains(hash));
                let now = Instant::now();
                let due: Vec<Arc<Pooled>> = snapshot
                    .senders
                    .values()
                    .flat_map(|v| v.pending.iter())
                    .filter(|p| last_sent.get(&p.tx.hash).is_none_or(|t| now.duration_since(*t) >= interval))
                    .cloned()
                    .collect();
                for chunk in due.chunks(MAX_BATCH) {
                    send(&core, chunk.to_vec(), &mut last_sent, "rebroadcast").await;
                }
            }
        }
    }
}

async fn send(core: &Core, txs: Vec<Arc<Pooled>>, last_sent: &mut HashMap<B256, Instant>, kind: &'static str) {
    let snapshot = core.snapshot();
    // Skip what left the pool while queued here (mined, replaced).
    let txs: Vec<Arc<Pooled>> = txs.into_iter().filter(|p| snapshot.contains(&p.tx.hash)).collect();
    if txs.is_empty() {
        return;
    }
    let requests: Vec<Call> = txs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let params = RawValue::from_string(format!("[\"{}\"]", p.raw)).ok();
            Call::internal_request(Request::new(Some(Id::number(i as u64)), "eth_sendRawTransaction", params))
        })
        .collect();
    let refs: Vec<&Call> = requests.iter().collect();
    let answers = core.upstream.call_batch(&refs).await;
    let now = Instant::now();
    for (p, answer) in txs.iter().zip(answers) {
        let hash = p.tx.hash;
        match answer {
            Ok(a) => {
                last_sent.insert(hash, now);
                let verdict = match &a.outcome {
                    Outcome::Result(_) => RelayDecision::Keep,
                    Outcome::Error(raw) => verdict(raw),
                };
                match verdict {
                    RelayDecision::Keep => {
                        let network = core.config.network.clone();
                        metrics::counter!("sluice_mempool_relayed_total", "network" => network, "kind" => kind)
                            .increment(1)
                    }
                    RelayDecision::Reject(reason) => {
                        metrics::counter!("sluice_mempool_relay_rejected_total", "network" => core.config.network.clone())
                            .increment(1);
                        tracing::warn!(%hash, %reason, "the upstream refused a pooled transaction; removed");
                        let _ = core.commands.send(Command::Reject { hash, reason });
                    }
                }
            }
            Err(e) => {
                // Kept: the rebroadcast timer tries again.
                let network = core.config.network.clone();
                metrics::counter!("sluice_mempool_relay_failures_total", "network" => network, "reason" => e.kind())
                    .increment(1);
                tracing::debug!(%hash, error = %e, "relay failed; will retry");
            }
        }
    }
}

fn error_message(raw: &RawValue) -> String {
    serde_json::from_str::<serde_json::Value>(raw.get())
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| raw.get().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_and_mined_are_kept_other_refusals_reject() {
        let error = |message: &str| {
            RawValue::from_string(serde_json::json!({"code": -32000, "message": message}).to_string()).unwrap()
        };
        assert_eq!(verdict(&error("already known")), RelayDecision::Keep);
        assert_eq!(verdict(&error("transaction already imported")), RelayDecision::Keep);
        assert_eq!(verdict(&error("nonce too low: next nonce 5, tx nonce 4")), RelayDecision::Keep);
        let poor = "insufficient funds for gas * price + value";
        assert_eq!(verdict(&error(poor)), RelayDecision::Reject(poor.into()));
    }
}
