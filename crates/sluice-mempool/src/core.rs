//! The mempool's shared core: what the intake, the relay and head maintenance all use (the
//! rules, the published snapshot, the writer's command queue, account state, the upstream, the
//! verifiers), held behind one `Arc`. The tasks hold the core, not the [`Mempool`] that owns
//! them, so `service`, `relay` and `maintain` import `core` and not each other.
//!
//! [`Mempool`]: crate::Mempool

use std::sync::Arc;

use alloy_primitives::{Address, Bytes, B256};
use arc_swap::{ArcSwap, ArcSwapOption};
use futures_util::StreamExt;
use sluice_upstream::Upstreams;
use tokio::sync::{oneshot, Semaphore};

use crate::config::MempoolConfig;
use crate::intake::Ticket;
use crate::seams::{SubmitError, TxSource};
use crate::state::StateReader;
use crate::status::{Statuses, TxStatus};
use crate::verify::{Admission, Verified, Verifier, VerifyError};
use crate::view::{Pooled, Snapshot};
use crate::writer::{Command, Submission};
use crate::{InsertError, Rules};

/// Internal submissions are inserted in chunks of this many: one state read per distinct
/// sender and one journal write per chunk.
const IN_ORDER_CHUNK: usize = 1024;

/// What the mempool's parts share.
pub(crate) struct Core {
    /// `None` until the chain id is known (the upstream may be down at start).
    pub rules: ArcSwapOption<Rules>,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub statuses: Statuses,
    pub commands: std::sync::mpsc::Sender<Command>,
    pub state: StateReader,
    pub upstream: Arc<dyn Upstreams>,
    pub config: MempoolConfig,
    pub inflight: Semaphore,
    pub verifier: Verifier<Ticket>,
}

impl Core {
    /// The latest published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// One submission: verified, its sender's state read, inserted by the writer and (with
    /// `journal`; false for records replayed from it) journaled before the answer. When the
    /// intake is full, refuses or waits as `origin`'s admission says.
    pub async fn submit_with(&self, raw: Bytes, origin: TxSource, journal: bool) -> Result<B256, SubmitError> {
        // A transaction already pooled (peers forward each transaction several times, clients
        // retry) is answered by the verifier from the hash that decoding computes, before the
        // checks and the sender recovery: hashing it here first too was a seventh of the async
        // workers' CPU under load. An outside caller who finds the intake full looks it up here,
        // so that a retry of a pooled transaction hears its hash, not busy.
        let _permit = match origin.admission() {
            Admission::Refuse => match self.inflight.try_acquire() {
                Ok(permit) => permit,
                Err(_) => return self.pooled(&raw).ok_or(SubmitError::Busy),
            },
            Admission::Wait => self.inflight.acquire().await.map_err(|_| stopping())?,
        };
        let rules = self.rules.load_full().ok_or_else(unknown_chain)?;
        // Decoding and sender recovery run on the verifier threads, in parallel, before
        // anything is locked, and beside (not in front of) the readers; the intake stage then
        // attaches the sender's state and hands it to the writer. One answer comes back.
        let (reply, answer) = oneshot::channel();
        let ticket = Ticket { raw: raw.clone(), journal, reply };
        match self.verifier.verify_then(raw.clone(), rules, origin.admission(), ticket).await {
            Ok(()) => {}
            // Counted as refused only when it is not pooled already.
            Err(VerifyError::Busy) => return self.pooled(&raw).ok_or_else(|| self.refused(VerifyError::Busy)),
            Err(e) => return Err(self.refused(e)),
        }
        let result = answer.await.map_err(|_| stopping())?;
        self.settle(|| alloy_primitives::keccak256(&raw), origin, result)
    }

    /// The hash of `raw` when the pool holds it already. The hash is keccak of these very
    /// bytes, since decoding refuses any other encoding.
    fn pooled(&self, raw: &[u8]) -> Option<B256> {
        let hash = alloy_primitives::keccak256(raw);
        self.snapshot.load().contains(&hash).then_some(hash)
    }

    /// Hands one verified transaction to the writer; its answer comes on the receiver.
    fn insert(
        &self,
        pooled: Pooled,
        nonce: u64,
        balance: alloy_primitives::U256,
        journal: bool,
    ) -> Result<oneshot::Receiver<Result<B256, SubmitError>>, SubmitError> {
        let (reply, answer) = oneshot::channel();
        let submission = Submission { pooled: Arc::new(pooled), nonce, balance, journal, reply: Some(reply) };
        self.commands.send(Command::Insert(submission)).map_err(|_| stopping())?;
        Ok(answer)
    }

    /// A verifier's refusal, counted.
    fn refused(&self, e: VerifyError) -> SubmitError {
        let reason = match &e {
            VerifyError::Invalid(e) => e.label(),
            VerifyError::Busy => "busy",
            VerifyError::Stopped => return stopping(),
        };
        metrics::counter!("sluice_mempool_refused_total", "network" => self.config.network.clone(), "reason" => reason)
            .increment(1);
        match e {
            VerifyError::Invalid(e) => e.into(),
            _ => SubmitError::Busy,
        }
    }

    /// The answer as the submitter sees it; `hash` gives the transaction's hash where the
    /// writer's answer does not carry it.
    fn settle(
        &self,
        hash: impl FnOnce() -> B256,
        origin: TxSource,
        result: Result<B256, SubmitError>,
    ) -> Result<B256, SubmitError> {
        match result {
            Ok(hash) => {
                tracing::debug!(%hash, ?origin, "transaction pooled");
                Ok(hash)
            }
            Err(SubmitError::Refused(InsertError::AlreadyKnown)) => {
                let hash = hash();
                tracing::debug!(%hash, ?origin, "transaction pooled already");
                Ok(hash)
            }
            Err(e @ SubmitError::Refused(InsertError::NonceTooLow { .. })) if origin == TxSource::Reorg => {
                // Included again by the new chain.
                self.statuses.record(hash(), TxStatus::Mined { block: None });
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Internal submissions in bulk (journal replay, reorg re-injection): verified in
    /// parallel, waiting for room rather than refused as busy, then inserted in the order
    /// given, so a sender's nonces arrive in order and none is refused as a gap over
    /// `account_queue`. One answer per transaction, in order.
    pub async fn submit_in_order(
        &self,
        raws: Vec<Bytes>,
        origin: TxSource,
        journal: bool,
    ) -> Vec<Result<B256, SubmitError>> {
        let Some(rules) = self.rules.load_full() else {
            return raws.iter().map(|_| Err(unknown_chain())).collect();
        };
        // Half the queue at most, so outside callers still find room meanwhile.
        let window = (self.config.verify_queue / 2).max(1);
        let mut chunks = futures_util::stream::iter(raws)
            .map(|raw| {
                let rules = rules.clone();
                async move {
                    let verified = self.verifier.verify(raw.clone(), rules, Admission::Wait).await;
                    (raw, verified)
                }
            })
            .buffered(window)
            .chunks(IN_ORDER_CHUNK);
        let mut results = Vec::new();
        while let Some(chunk) = chunks.next().await {
            results.extend(self.insert_in_order(chunk, origin, journal).await);
        }
        results
    }

    /// Inserts a chunk of verified transactions in order: one state read per distinct sender,
    /// then every insert queued to the writer before any answer is awaited (one batch there).
    async fn insert_in_order(
        &self,
        chunk: Vec<(Bytes, Result<Verified, VerifyError>)>,
        origin: TxSource,
        journal: bool,
    ) -> Vec<Result<B256, SubmitError>> {
        let mut senders: Vec<Address> = chunk
            .iter()
            .filter_map(|(_, v)| match v {
                Ok(Verified::New(tx)) => Some(tx.sender),
                _ => None,
            })
            .collect();
        senders.sort_unstable();
        senders.dedup();
        let states: std::collections::HashMap<Address, _> =
            senders.iter().copied().zip(self.state.get_many(&senders).await).collect();
        let queued: Vec<_> = chunk
            .into_iter()
            .map(|(raw, verified)| {
                let tx = match verified.map_err(|e| self.refused(e))? {
                    Verified::New(tx) => tx,
                    Verified::Known(hash) => {
                        let (reply, answer) = oneshot::channel();
                        let _ = reply.send(Ok(hash));
                        return Ok((hash, answer));
                    }
                };
                let hash = tx.hash;
                let state = states.get(&tx.sender).cloned().unwrap_or_else(|| Err("no state read".into()));
                let (nonce, balance) = state.map_err(SubmitError::Unavailable)?;
                Ok((hash, self.insert(Pooled { tx, raw }, nonce, balance, journal)?))
            })
            .collect();
        let mut results = Vec::with_capacity(queued.len());
        for item in queued {
            results.push(match item {
                Ok((hash, answer)) => match answer.await {
                    Ok(result) => self.settle(|| hash, origin, result),
                    Err(_) => Err(stopping()),
                },
                Err(e) => Err(e),
            });
        }
        results
    }
}

pub(crate) fn stopping() -> SubmitError {
    SubmitError::Unavailable("the mempool is stopping".into())
}

pub(crate) fn unknown_chain() -> SubmitError {
    SubmitError::Unavailable("the chain id is not known yet (the upstream has not answered)".into())
}
