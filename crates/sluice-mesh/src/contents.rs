//! The mempool's contents, as the mesh hands them to a peer that connects.

use alloy_primitives::{Bytes, B256};
use sluice_mempool::{Mempool, PoolView};

use crate::PoolContents;

impl PoolContents for Mempool {
    /// Pending then queued, each sender's in nonce order, so the receiver's pool can take them
    /// as they come (a gapped one waits in its queue until the gap fills).
    fn transactions(&self) -> Vec<(B256, Bytes)> {
        self.raw_transactions()
    }
}
