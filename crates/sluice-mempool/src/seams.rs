//! The seams the rest of sluice uses the mempool through: [`TxIntake`] (submissions, with their
//! [`TxSource`] and [`SubmitError`]) and [`PoolView`] (lock-free reads of the published snapshot).

use std::sync::Arc;

use alloy_primitives::{Address, Bytes, B256};
use async_trait::async_trait;

use crate::verify::Admission;
use crate::view::{Pooled, Snapshot};
use crate::{DecodeError, InsertError};

/// Where a transaction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxSource {
    /// `eth_sendRawTransaction`.
    Rpc,
    /// The QUIC ingress.
    Quic,
    /// A peer sluice node.
    Peer,
    /// Re-injected after a reorg dropped its block.
    Reorg,
    /// Replayed from the journal at start.
    Journal,
}

impl TxSource {
    /// When the intake is full: outside callers (who can retry) are refused as busy; the
    /// pool's own work (replay, re-injection) and its peers' wait for room, so nothing
    /// acknowledged is dropped for being busy.
    pub fn admission(self) -> Admission {
        match self {
            TxSource::Rpc | TxSource::Quic => Admission::Refuse,
            TxSource::Peer | TxSource::Reorg | TxSource::Journal => Admission::Wait,
        }
    }
}

/// Why a submission was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Undecodable or failing a stateless rule.
    #[error(transparent)]
    Invalid(#[from] DecodeError),
    /// Refused by the pool's rules.
    #[error(transparent)]
    Refused(#[from] InsertError),
    /// The account state could not be read, or the mempool is stopping.
    #[error("transaction not accepted: {0}")]
    Unavailable(String),
    /// Too many submissions in flight.
    #[error("mempool busy: too many transactions in flight")]
    Busy,
}

/// Takes transactions in (the seam the gateway, the QUIC ingress and the peer mesh use).
#[async_trait]
pub trait TxIntake: Send + std::marker::Sync + 'static {
    /// Validates, pools and journals one raw transaction; answers with its hash once it is
    /// durable and visible to readers. A transaction already pooled answers with its hash.
    async fn submit(&self, raw: Bytes, origin: TxSource) -> Result<B256, SubmitError>;
}

/// Reads the pool without waiting for writers.
pub trait PoolView: Send + std::marker::Sync + 'static {
    /// The latest published snapshot.
    fn snapshot(&self) -> Arc<Snapshot>;

    /// A pooled transaction by hash.
    fn get(&self, hash: &B256) -> Option<Arc<Pooled>> {
        self.snapshot().get(hash).cloned()
    }

    /// `eth_getTransactionCount(sender, "pending")` when the pool holds the sender's transactions.
    fn pending_nonce(&self, sender: &Address) -> Option<u64> {
        self.snapshot().senders.get(sender).map(|v| v.pending_nonce)
    }

    /// How many transactions are pending (executable) and queued (gapped).
    fn counts(&self) -> (usize, usize) {
        let status = self.snapshot().status;
        (status.pending, status.queued)
    }

    /// `txpool_status`, `txpool_content` / `txpool_inspect` (`summaries`) and
    /// `txpool_contentFrom`, in geth's formats.
    fn txpool(&self, method: TxpoolMethod<'_>) -> serde_json::Value {
        let snapshot = self.snapshot();
        match method {
            TxpoolMethod::Status => snapshot.status_json(),
            TxpoolMethod::Content { summaries } => snapshot.content_json(summaries),
            TxpoolMethod::ContentFrom(sender) => snapshot.content_from_json(sender),
        }
    }

    /// Every pooled transaction's hash and raw bytes: pending then queued, each sender's in
    /// nonce order, so that another pool can take them as they come.
    fn raw_transactions(&self) -> Vec<(B256, Bytes)> {
        let snapshot = self.snapshot();
        let mut txs = Vec::with_capacity(snapshot.len());
        for view in snapshot.senders.values() {
            for pooled in view.pending.iter().chain(view.queued.iter()) {
                txs.push((pooled.tx.hash, pooled.raw.clone()));
            }
        }
        txs
    }
}

/// A `txpool_*` read (see [`PoolView::txpool`]).
#[derive(Debug, Clone, Copy)]
pub enum TxpoolMethod<'a> {
    /// `txpool_status`.
    Status,
    /// `txpool_content`, or `txpool_inspect` with `summaries`.
    Content {
        /// One-line summaries instead of full transactions.
        summaries: bool,
    },
    /// `txpool_contentFrom(sender)`.
    ContentFrom(&'a Address),
}
