//! The mempool's contents, as the mesh hands them to a peer that connects.

use alloy_primitives::{Bytes, B256};
use sluice_pool::{Mempool, PoolView};

use crate::PoolContents;

impl PoolContents for Mempool {
    /// Pending then queued, each sender's in nonce order, so the receiver's pool can take them
    /// as they come (a gapped one waits in its queue until the gap fills).
    fn transactions(&self) -> Vec<(B256, Bytes)> {
        let snapshot = self.snapshot();
        let mut txs = Vec::with_capacity(snapshot.by_hash.len());
        for view in snapshot.senders.values() {
            for pooled in view.pending.iter().chain(view.queued.iter()) {
                txs.push((pooled.tx.hash, pooled.raw.clone()));
            }
        }
        txs
    }
}
