//! The running mempool: the intake (decode and recover in the caller's task, account state
//! from the upstreams, then the single writer), the read side (a published [`Snapshot`]), and
//! the tasks around them (relay, head maintenance), wired at start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, Bytes, B256};
use arc_swap::{ArcSwap, ArcSwapOption};
use async_trait::async_trait;
use futures_util::StreamExt;
use sluice_upstream::{HeadFeed, Upstreams};
use tokio::sync::{broadcast, oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::journal::{Journal, Sync};
use crate::state::StateReader;
use crate::status::{Statuses, TxStatus};
use crate::verify::{Admission, Verified, Verifier, VerifyError};
use crate::view::{Pooled, Snapshot};
use crate::writer::{Command, Submission, Writer};
use crate::{Config, DecodeError, InsertError, Pool, Rules};

/// Mempool settings.
#[derive(Debug, Clone)]
pub struct MempoolConfig {
    /// Pool rules (limits, price bump, minimum tip, priority senders).
    pub pool: Config,
    /// Largest raw transaction accepted, in bytes.
    pub max_tx_bytes: usize,
    /// Journal file; `None` keeps the pool in memory only (lost on a crash).
    pub journal: Option<PathBuf>,
    /// When journal writes reach the disk.
    pub sync: Sync,
    /// Forward accepted transactions to the upstreams.
    pub relay: bool,
    /// Send still-pending transactions again after this long.
    pub rebroadcast_interval: Duration,
    /// How often queued transactions are checked against their lifetime.
    pub expire_interval: Duration,
    /// Deadline for reading account state from the upstreams.
    pub state_timeout: Duration,
    /// Most submissions in flight at once; more are refused as busy.
    pub max_inflight: usize,
    /// Threads decoding and recovering senders (at a lower CPU priority than the readers).
    pub verify_threads: usize,
    /// Transactions waiting for a verifier at most; more are refused as busy.
    pub verify_queue: usize,
    /// Niceness of the verifier threads: above 0 the kernel serves the readers first when the
    /// CPU is short (reads stay fast under overload; ingest peaks lower).
    pub verify_nice: i32,
    /// How many departed transactions' statuses are remembered.
    pub status_capacity: u64,
    /// The id of the network this pool is for: the `network` label of its metrics.
    pub network: String,
}

impl Default for MempoolConfig {
    fn default() -> Self {
        Self {
            pool: Config::default(),
            max_tx_bytes: 128 * 1024,
            journal: None,
            sync: Sync::Os,
            relay: true,
            rebroadcast_interval: Duration::from_secs(12),
            expire_interval: Duration::from_secs(60),
            state_timeout: Duration::from_secs(5),
            max_inflight: 100_000,
            verify_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            verify_queue: 8_192,
            verify_nice: 10,
            status_capacity: 1 << 20,
            network: sluice_upstream::DEFAULT_NETWORK.into(),
        }
    }
}

/// Where a transaction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
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

impl Origin {
    /// When the intake is full: outside callers (who can retry) are refused as busy; the
    /// pool's own work (replay, re-injection) and its peers' wait for room, so nothing
    /// acknowledged is dropped for being busy.
    pub fn admission(self) -> Admission {
        match self {
            Origin::Rpc | Origin::Quic => Admission::Refuse,
            Origin::Peer | Origin::Reorg | Origin::Journal => Admission::Wait,
        }
    }
}

/// Transactions waiting for the relay at most; beyond, they go with the next rebroadcast.
const RELAY_QUEUE: usize = 65_536;

/// Internal submissions are inserted in chunks of this many: one state read per distinct
/// sender and one journal write per chunk.
const IN_ORDER_CHUNK: usize = 1024;

/// Replay passes before the records still unsettled (account state unreadable) are left in
/// the journal for the next start; the wait between passes grows to 10 s.
const REPLAY_PASSES: u64 = 60;

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
    async fn submit(&self, raw: Bytes, origin: Origin) -> Result<B256, SubmitError>;
}

/// Reads the pool without waiting for writers.
pub trait PoolView: Send + std::marker::Sync + 'static {
    /// The latest published snapshot.
    fn snapshot(&self) -> Arc<Snapshot>;

    /// A pooled transaction by hash.
    fn get(&self, hash: &B256) -> Option<Arc<Pooled>> {
        self.snapshot().by_hash.get(hash).cloned()
    }

    /// `eth_getTransactionCount(sender, "pending")` when the pool holds the sender's transactions.
    fn pending_nonce(&self, sender: &Address) -> Option<u64> {
        self.snapshot().senders.get(sender).map(|v| v.pending_nonce)
    }
}

/// The mempool.
pub struct Mempool {
    /// `None` until the chain id is known (the upstream may be down at start).
    pub(crate) rules: ArcSwapOption<Rules>,
    pub(crate) snapshot: Arc<ArcSwap<Snapshot>>,
    pub(crate) statuses: Statuses,
    pub(crate) commands: std::sync::mpsc::Sender<Command>,
    pub(crate) state: StateReader,
    pub(crate) upstream: Arc<dyn Upstreams>,
    pub(crate) config: MempoolConfig,
    pending_events: broadcast::Sender<Arc<Pooled>>,
    inflight: Semaphore,
    verifier: Verifier,
    /// Ends the mempool's tasks ([`Mempool::shutdown`]).
    cancel: CancellationToken,
    /// Its tasks (relay, head maintenance, background start and replay): they hold the
    /// mempool, so they are owned here and ended by the token, never left running.
    tasks: std::sync::Mutex<JoinSet<()>>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Mempool {
    /// Starts the mempool in front of `upstream` (used for account state, relay and blocks),
    /// following `feed`; replays the journal before returning.
    pub async fn start(
        config: MempoolConfig,
        upstream: Arc<dyn Upstreams>,
        feed: &HeadFeed,
    ) -> Result<Arc<Mempool>, String> {
        let (journal, replay) = match &config.journal {
            Some(path) => {
                let (journal, raws) = Journal::open(path, config.sync)
                    .map_err(|e| format!("cannot open the mempool journal {}: {e}", path.display()))?;
                (Some(journal), raws)
            }
            None => (None, Vec::new()),
        };
        // Registered at zero, so that dashboards and alerts see them before the first event.
        for name in ["sluice_mempool_accepted_total", "sluice_mempool_journal_errors_total"] {
            metrics::counter!(name, "network" => config.network.clone()).increment(0);
        }
        let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot::default()));
        let statuses = Statuses::new(config.status_capacity);
        let (relay_tx, relay_rx) = tokio::sync::mpsc::channel(RELAY_QUEUE);
        let (pending_events, _) = broadcast::channel(16_384);
        let pool = Pool::new(config.pool.clone());
        let writer = Writer {
            network: config.network.clone(),
            pool,
            journal,
            snapshot: snapshot.clone(),
            statuses: statuses.clone(),
            relay: relay_tx,
            pending_events: pending_events.clone(),
            txs: Default::default(),
            dirty: Default::default(),
            index: Vec::new(),
            replaying: !replay.is_empty(),
            unsettled: Vec::new(),
            // Counted, so that compaction after replay follows the file's true size.
            journal_records: replay.len(),
        };
        let (commands, rx) = std::sync::mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("mempool-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| format!("cannot start the mempool writer: {e}"))?;
        let verifier = Verifier::start(config.verify_threads, config.verify_queue, config.verify_nice)
            .map_err(|e| format!("cannot start the mempool verifiers: {e}"))?;
        let state = StateReader::spawn(upstream.clone(), feed.view.clone(), config.state_timeout);
        let mempool = Arc::new(Mempool {
            rules: ArcSwapOption::empty(),
            snapshot,
            statuses,
            commands,
            state,
            upstream,
            inflight: Semaphore::new(config.max_inflight),
            pending_events,
            verifier,
            config,
            cancel: CancellationToken::new(),
            tasks: Default::default(),
            writer: std::sync::Mutex::new(Some(writer)),
        });
        if mempool.config.relay {
            mempool.spawn(crate::relay::run(mempool.clone(), relay_rx));
        }
        // Learn the chain, then follow it and replay the journal. Inline when the upstream
        // answers, so a restarted sluice serves its journaled transactions from the first
        // request; in the background (retrying) when it does not, so sluice still starts.
        let events = feed.events.subscribe();
        match tokio::time::timeout(Duration::from_secs(3), crate::maintain::fetch_chain(mempool.upstream.as_ref()))
            .await
        {
            Ok(Ok(chain)) => mempool.begin(chain, events, replay).await,
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e,
                    _ => "timed out".to_owned(),
                };
                tracing::warn!(error = %why, "mempool: cannot read the chain yet; retrying in the background");
                let task = mempool.clone();
                mempool.spawn(async move {
                    let mempool = task;
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        match crate::maintain::fetch_chain(mempool.upstream.as_ref()).await {
                            Ok(chain) => {
                                tracing::info!(
                                    chain_id = chain.chain_id,
                                    "mempool: chain known; accepting transactions"
                                );
                                mempool.begin(chain, events, replay).await;
                                return;
                            }
                            Err(e) => tracing::debug!(error = %e, "mempool: still cannot read the chain"),
                        }
                    }
                });
            }
        }
        Ok(mempool)
    }

    /// Sets the rules for this chain, starts head maintenance and replays the journal.
    async fn begin(
        self: &Arc<Self>,
        chain: crate::maintain::ChainInfo,
        events: broadcast::Receiver<sluice_chain::ChainEvent>,
        replay: Vec<Vec<u8>>,
    ) {
        let max_size = self.config.max_tx_bytes;
        self.rules.store(Some(Arc::new(Rules {
            chain_id: chain.chain_id,
            max_size,
            block_gas_limit: chain.gas_limit,
            prague: chain.prague,
        })));
        let (reply, done) = oneshot::channel();
        let block =
            Command::Block { number: chain.number, advanced: Vec::new(), base_fee: Some(chain.next_base_fee), reply };
        let _ = self.commands.send(block);
        let _ = done.await;
        self.spawn(crate::maintain::run(self.clone(), events, chain.number));
        self.replay(replay).await;
    }

    /// Re-validates the journal's transactions into the pool, in journal order, then compacts
    /// the journal. Records whose account state cannot be read are tried again (in the
    /// background after the first pass, so sluice starts) and are never compacted away.
    async fn replay(self: &Arc<Self>, raws: Vec<Vec<u8>>) {
        if raws.is_empty() {
            return;
        }
        let total = raws.len();
        let todo: Vec<Bytes> = raws.into_iter().map(Bytes::from).collect();
        let (kept, todo) = self.replay_pass(todo).await;
        if todo.is_empty() {
            self.replayed(total, kept, Vec::new()).await;
            return;
        }
        let mempool = self.clone();
        self.spawn(async move {
            let (mut kept, mut todo) = (kept, todo);
            for pass in 1..REPLAY_PASSES {
                tracing::warn!(
                    unsettled = todo.len(),
                    "mempool journal replay: account state unreadable; trying again"
                );
                tokio::time::sleep(Duration::from_secs(pass.min(10))).await;
                let (more, left) = mempool.replay_pass(todo).await;
                (kept, todo) = (kept + more, left);
                if todo.is_empty() {
                    break;
                }
            }
            if !todo.is_empty() {
                tracing::error!(
                    unsettled = todo.len(),
                    "mempool journal replay gave up; they stay in the journal for the next start"
                );
            }
            mempool.replayed(total, kept, todo).await;
        });
    }

    /// One pass: how many were pooled, and the records to try again.
    async fn replay_pass(&self, todo: Vec<Bytes>) -> (usize, Vec<Bytes>) {
        let results = self.submit_in_order(todo.clone(), Origin::Journal, false).await;
        let kept = results.iter().filter(|r| r.is_ok()).count();
        let again = todo
            .into_iter()
            .zip(results)
            .filter(|(_, r)| matches!(r, Err(SubmitError::Unavailable(_))))
            .map(|(raw, _)| raw)
            .collect();
        (kept, again)
    }

    async fn replayed(&self, total: usize, kept: usize, unsettled: Vec<Bytes>) {
        let (reply, done) = oneshot::channel();
        let _ = self.commands.send(Command::Replayed { unsettled, reply });
        let _ = done.await;
        tracing::info!(journaled = total, kept, "mempool journal replayed");
        metrics::counter!("sluice_mempool_replayed_total", "network" => self.config.network.clone())
            .increment(kept as u64);
    }

    /// Runs one of the mempool's tasks until it ends or the mempool shuts down.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        if self.cancel.is_cancelled() {
            return;
        }
        let cancel = self.cancel.clone();
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        // Reap the ones that ended, so the set holds only live tasks.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = task => {}
            }
        });
    }

    /// Stops the mempool: its tasks end, the writer applies what it was given and stops (the
    /// journal is closed and unlocked), and the verifier threads finish and exit. Submissions
    /// after this are refused as unavailable; reads keep the last snapshot.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        while tasks.join_next().await.is_some() {}
        let _ = self.commands.send(Command::Stop);
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        // Joining threads blocks; the writer ends after its current batch, the verifiers after
        // their queue.
        let verifiers = self.verifier.stop();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(writer) = writer {
                let _ = writer.join();
            }
            verifiers();
        })
        .await;
        tracing::debug!("mempool stopped");
    }

    /// Subscribes to transactions as they become executable (`newPendingTransactions`).
    pub fn subscribe_pending(&self) -> broadcast::Receiver<Arc<Pooled>> {
        self.pending_events.subscribe()
    }

    /// Where a transaction is: pooled (pending or queued), or why it left.
    pub fn status_of(&self, hash: &B256) -> serde_json::Value {
        let snapshot = self.snapshot();
        if let Some(p) = snapshot.by_hash.get(hash) {
            let pending =
                snapshot.senders.get(&p.tx.sender).is_some_and(|v| v.pending.iter().any(|t| t.tx.hash == *hash));
            return serde_json::json!({ "hash": hash, "status": if pending { "pending" } else { "queued" } });
        }
        match self.statuses.get(hash) {
            Some(status) => status.to_json(hash),
            None => serde_json::json!({ "hash": hash, "status": "unknown" }),
        }
    }

    /// The validation rules in force, once the chain is known.
    pub fn rules(&self) -> Option<Arc<Rules>> {
        self.rules.load_full()
    }

    pub(crate) async fn submit_with(&self, raw: Bytes, origin: Origin, journal: bool) -> Result<B256, SubmitError> {
        // A transaction already pooled (peers forward each transaction several times) is
        // answered from the snapshot, before any decoding or sender recovery: its hash is the
        // keccak of these very bytes, since decoding refuses any other encoding.
        let hash = alloy_primitives::keccak256(&raw);
        if self.snapshot.load().by_hash.contains_key(&hash) {
            return Ok(hash);
        }
        let _permit = match origin.admission() {
            Admission::Refuse => self.inflight.try_acquire().map_err(|_| SubmitError::Busy)?,
            Admission::Wait => self.inflight.acquire().await.map_err(|_| stopping())?,
        };
        let rules = self.rules.load_full().ok_or_else(unknown_chain)?;
        // Decoding and sender recovery run on the verifier threads, in parallel, before
        // anything is locked, and beside (not in front of) the readers.
        let verified = self.verifier.verify(raw.clone(), rules, origin.admission()).await;
        let (tx, envelope) = verified.map_err(|e| self.refused(e))?;
        let hash = tx.hash;
        if self.snapshot.load().by_hash.contains_key(&hash) {
            return Ok(hash);
        }
        let (nonce, balance) = self.state.get(tx.sender).await.map_err(SubmitError::Unavailable)?;
        let answer = self.insert(Pooled { tx, raw, envelope }, nonce, balance, journal)?;
        let result = answer.await.map_err(|_| stopping())?;
        self.settle(hash, origin, result)
    }

    /// Hands one verified transaction to the writer; its answer comes on the receiver.
    fn insert(
        &self,
        pooled: Pooled,
        nonce: u64,
        balance: alloy_primitives::U256,
        journal: bool,
    ) -> Result<oneshot::Receiver<Result<B256, InsertError>>, SubmitError> {
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

    /// The writer's answer as the submitter sees it.
    fn settle(&self, hash: B256, origin: Origin, result: Result<B256, InsertError>) -> Result<B256, SubmitError> {
        match result {
            Ok(_) | Err(InsertError::AlreadyKnown) => {
                tracing::debug!(%hash, ?origin, "transaction pooled");
                Ok(hash)
            }
            Err(e @ InsertError::NonceTooLow { .. }) if origin == Origin::Reorg => {
                // Included again by the new chain.
                self.statuses.record(hash, TxStatus::Mined { block: None });
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Internal submissions in bulk (journal replay, reorg re-injection): verified in
    /// parallel, waiting for room rather than refused as busy, then inserted in the order
    /// given, so a sender's nonces arrive in order and none is refused as a gap over
    /// `account_queue`. One answer per transaction, in order.
    pub(crate) async fn submit_in_order(
        &self,
        raws: Vec<Bytes>,
        origin: Origin,
        journal: bool,
    ) -> Vec<Result<B256, SubmitError>> {
        let Some(rules) = self.rules.load_full() else {
            return raws.iter().map(|_| Err(unknown_chain())).collect();
        };
        // Half the queue at most, so outside callers still find room meanwhile.
        let window = (self.config.verify_queue / 2).max(1);
        let mut verified = futures_util::stream::iter(raws)
            .map(|raw| {
                let rules = rules.clone();
                async move {
                    let verified = self.verifier.verify(raw.clone(), rules, Admission::Wait).await;
                    (raw, verified)
                }
            })
            .buffered(window);
        let mut results = Vec::new();
        let mut chunk = Vec::with_capacity(IN_ORDER_CHUNK);
        loop {
            let next = verified.next().await;
            let end = next.is_none();
            chunk.extend(next);
            if chunk.len() >= IN_ORDER_CHUNK || (end && !chunk.is_empty()) {
                results.extend(self.insert_in_order(std::mem::take(&mut chunk), origin, journal).await);
            }
            if end {
                return results;
            }
        }
    }

    /// Inserts a chunk of verified transactions in order: one state read per distinct sender,
    /// then every insert queued to the writer before any answer is awaited (one batch there).
    async fn insert_in_order(
        &self,
        chunk: Vec<(Bytes, Result<Verified, VerifyError>)>,
        origin: Origin,
        journal: bool,
    ) -> Vec<Result<B256, SubmitError>> {
        let mut senders: Vec<Address> =
            chunk.iter().filter_map(|(_, v)| v.as_ref().ok().map(|(tx, _)| tx.sender)).collect();
        senders.sort_unstable();
        senders.dedup();
        let states: std::collections::HashMap<Address, _> =
            senders.iter().copied().zip(self.state.get_many(&senders).await).collect();
        let queued: Vec<_> = chunk
            .into_iter()
            .map(|(raw, verified)| {
                let (tx, envelope) = verified.map_err(|e| self.refused(e))?;
                let hash = tx.hash;
                let state = states.get(&tx.sender).cloned().unwrap_or_else(|| Err("no state read".into()));
                let (nonce, balance) = state.map_err(SubmitError::Unavailable)?;
                Ok((hash, self.insert(Pooled { tx, raw, envelope }, nonce, balance, journal)?))
            })
            .collect();
        let mut results = Vec::with_capacity(queued.len());
        for item in queued {
            results.push(match item {
                Ok((hash, answer)) => match answer.await {
                    Ok(result) => self.settle(hash, origin, result),
                    Err(_) => Err(stopping()),
                },
                Err(e) => Err(e),
            });
        }
        results
    }
}

fn stopping() -> SubmitError {
    SubmitError::Unavailable("the mempool is stopping".into())
}

fn unknown_chain() -> SubmitError {
    SubmitError::Unavailable("the chain id is not known yet (the upstream has not answered)".into())
}

#[async_trait]
impl TxIntake for Mempool {
    async fn submit(&self, raw: Bytes, origin: Origin) -> Result<B256, SubmitError> {
        self.submit_with(raw, origin, true).await
    }
}

impl PoolView for Mempool {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
