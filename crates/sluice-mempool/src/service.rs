//! The running mempool, wired at start: the shared `Core` (the intake: verifiers, account
//! state, the single writer; the published [`Snapshot`]), and the tasks around it (relay, head
//! maintenance, background start and replay), which it owns and stops.

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Bytes, B256};
use arc_swap::{ArcSwap, ArcSwapOption};
use async_trait::async_trait;
use sluice_upstream::{HeadFeed, Upstreams};
use tokio::sync::{broadcast, oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::MempoolConfig;
use crate::core::Core;
use crate::intake::Intake;
use crate::journal::Journal;
use crate::seams::{PoolView, SubmitError, TxIntake, TxSource};
use crate::state::StateReader;
use crate::status::Statuses;
use crate::verify::Verifier;
use crate::view::{Pooled, Snapshot};
use crate::writer::{Command, Writer};
use crate::{Pool, Rules};

/// Transactions waiting for the relay at most; beyond, they go with the next rebroadcast.
const RELAY_QUEUE: usize = 65_536;

/// Replay passes before the records still unsettled (account state unreadable) are left in
/// the journal for the next start; the wait between passes grows to 10 s.
const REPLAY_PASSES: u64 = 60;

/// The mempool.
pub struct Mempool {
    pub(crate) core: Arc<Core>,
    pending_events: broadcast::Sender<Arc<Pooled>>,
    /// Ends the mempool's tasks ([`Mempool::shutdown`]).
    cancel: CancellationToken,
    /// Its tasks (relay and head maintenance hold the core; the background start and replay
    /// retries hold the mempool itself): owned here and ended by the token, never left running.
    tasks: std::sync::Mutex<JoinSet<()>>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The task sending the writer's answers: not ended by the token but by the writer (it
    /// ends once the writer is gone and every answer is sent), so no answer is dropped.
    answers: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
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
        let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot::with_capacity(config.pool.capacity())));
        let statuses = Statuses::new(config.status_capacity);
        let (relay_tx, relay_rx) = tokio::sync::mpsc::channel(RELAY_QUEUE);
        let (pending_events, _) = broadcast::channel(16_384);
        let pool = Pool::new(config.pool.clone());
        let (answers, answers_rx) = tokio::sync::mpsc::unbounded_channel();
        let writer = Writer {
            network: config.network.clone(),
            accepted: metrics::counter!("sluice_mempool_accepted_total", "network" => config.network.clone()),
            pool,
            journal,
            snapshot: snapshot.clone(),
            statuses: statuses.clone(),
            relay: relay_tx,
            pending_events: pending_events.clone(),
            answers: Some(answers),
            dirty: Default::default(),
            index: Vec::new(),
            retired: Default::default(),
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
        let (groups, verified) = tokio::sync::mpsc::unbounded_channel();
        let known: crate::verify::Known = {
            let snapshot = snapshot.clone();
            Arc::new(move |hash| snapshot.load().contains(hash))
        };
        let verifier = Verifier::start(config.verify_threads, config.verify_queue, config.verify_nice, groups, known)
            .map_err(|e| format!("cannot start the mempool verifiers: {e}"))?;
        let state = StateReader::new(upstream.clone(), feed.view.clone(), config.state_timeout);
        let intake = Intake { state: state.clone(), commands: commands.clone(), network: config.network.clone() };
        let core = Arc::new(Core {
            rules: ArcSwapOption::empty(),
            snapshot,
            statuses,
            commands,
            state,
            upstream,
            inflight: Semaphore::new(config.max_inflight),
            verifier,
            config,
        });
        let mempool = Arc::new(Mempool {
            core,
            pending_events,
            cancel: CancellationToken::new(),
            tasks: Default::default(),
            writer: std::sync::Mutex::new(Some(writer)),
            answers: std::sync::Mutex::new(Some(tokio::spawn(crate::writer::deliver(answers_rx)))),
        });
        mempool.spawn(crate::intake::run(intake, verified));
        if mempool.core.config.relay {
            mempool.spawn(crate::relay::run(mempool.core.clone(), relay_rx));
        }
        // Learn the chain, then follow it and replay the journal. Inline when the upstream
        // answers, so a restarted sluice serves its journaled transactions from the first
        // request; in the background (retrying) when it does not, so sluice still starts.
        let events = feed.events.subscribe();
        match tokio::time::timeout(Duration::from_secs(3), crate::maintain::fetch_chain(mempool.core.upstream.as_ref()))
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
                        match crate::maintain::fetch_chain(mempool.core.upstream.as_ref()).await {
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
        let max_size = self.core.config.max_tx_bytes;
        self.core.rules.store(Some(Arc::new(Rules {
            chain_id: chain.chain_id,
            max_size,
            block_gas_limit: chain.gas_limit,
            prague: chain.prague,
        })));
        let (reply, done) = oneshot::channel();
        let block =
            Command::Block { number: chain.number, advanced: Vec::new(), base_fee: Some(chain.next_base_fee), reply };
        let _ = self.core.commands.send(block);
        let _ = done.await;
        self.spawn(crate::maintain::run(self.core.clone(), events, chain.number));
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
        let results = self.core.submit_in_order(todo.clone(), TxSource::Journal, false).await;
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
        let _ = self.core.commands.send(Command::Replayed { unsettled, reply });
        let _ = done.await;
        tracing::info!(journaled = total, kept, "mempool journal replayed");
        metrics::counter!("sluice_mempool_replayed_total", "network" => self.core.config.network.clone())
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
        let _ = self.core.commands.send(Command::Stop);
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        // Joining threads blocks; the writer ends after its current batch, the verifiers after
        // their queue.
        let verifiers = self.core.verifier.stop();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(writer) = writer {
                let _ = writer.join();
            }
            verifiers();
        })
        .await;
        let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(answers) = answers {
            let _ = answers.await;
        }
        tracing::debug!("mempool stopped");
    }

    /// Subscribes to transactions as they become executable (`newPendingTransactions`).
    pub fn subscribe_pending(&self) -> broadcast::Receiver<Arc<Pooled>> {
        self.pending_events.subscribe()
    }

    /// Whether the pool saw `hash` mined (a receipt for it exists on the canonical chain, unless
    /// a reorg dropped it since).
    pub fn saw_mined(&self, hash: &B256) -> bool {
        matches!(self.core.statuses.get(hash), Some(crate::status::TxStatus::Mined { .. }))
    }

    /// Waits until `hash` leaves the pool (mined, replaced, evicted, expired, rejected) and
    /// says why, or `None` at `deadline`.
    pub async fn departure(&self, hash: &B256, deadline: tokio::time::Instant) -> Option<crate::status::TxStatus> {
        // Subscribed before looking, so that a departure between the look and the wait wakes it.
        let mut changes = self.core.statuses.changes();
        loop {
            if let Some(status) = self.core.statuses.get(hash) {
                return Some(status);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Where a transaction is: pooled (pending or queued), or why it left.
    pub fn status_of(&self, hash: &B256) -> serde_json::Value {
        let snapshot = self.snapshot();
        if let Some(p) = snapshot.get(hash) {
            let pending =
                snapshot.senders.get(&p.tx.sender).is_some_and(|v| v.pending.iter().any(|t| t.tx.hash == *hash));
            return serde_json::json!({ "hash": hash, "status": if pending { "pending" } else { "queued" } });
        }
        match self.core.statuses.get(hash) {
            Some(status) => status.to_json(hash),
            None => serde_json::json!({ "hash": hash, "status": "unknown" }),
        }
    }

    /// The validation rules in force, once the chain is known.
    pub fn rules(&self) -> Option<Arc<Rules>> {
        self.core.rules.load_full()
    }
}

#[async_trait]
impl TxIntake for Mempool {
    async fn submit(&self, raw: Bytes, origin: TxSource) -> Result<B256, SubmitError> {
        self.core.submit_with(raw, origin, true).await
    }
}

impl PoolView for Mempool {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.core.snapshot()
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
