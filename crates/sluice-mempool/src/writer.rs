//! The single writer: one OS thread owns the [`Pool`] and the journal.
//!
//! It takes commands in batches (whatever is queued, up to [`MAX_BATCH`]); within a batch,
//! head updates go first, so ingest never starves them. For the inserts of a batch it journals
//! the accepted transactions with one write (and one fsync when configured), publishes a new
//! [`Snapshot`], and only then answers the submitters: once `eth_sendRawTransaction` answers,
//! the transaction is in the journal (in the OS page cache with `fsync = "os"`, which survives a
//! crash of sluice; on disk with `fsync = "always"`, which survives a power loss) and visible to
//! every reader. Events (relay, subscriptions) go
//! out after publishing. The thread never waits on the network: account state is fetched
//! before a submission reaches it, and relaying happens elsewhere.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use alloy_primitives::map::AddressSet;
use alloy_primitives::{Address, Bytes, B256, U256};
use arc_swap::ArcSwap;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::journal::Journal;
use crate::seams::SubmitError;
use crate::status::{Statuses, TxStatus};
use crate::view::{Place, Pooled, Retired, Snapshot};
use crate::{InsertError, Pool};

/// Most commands applied per batch.
pub const MAX_BATCH: usize = 1024;

/// An answer to a submitter, sent once the snapshot is published.
type Reply = (oneshot::Sender<Result<B256, SubmitError>>, Result<B256, InsertError>);

/// A batch's answers, as its submitters get them.
pub(crate) type Answers = Vec<(oneshot::Sender<Result<B256, SubmitError>>, Result<B256, SubmitError>)>;

/// One validated transaction with its sender's account state at the head.
pub(crate) struct Submission {
    pub pooled: Arc<Pooled>,
    pub nonce: u64,
    pub balance: U256,
    /// False for transactions replayed from the journal (already in it).
    pub journal: bool,
    pub reply: Option<oneshot::Sender<Result<B256, SubmitError>>>,
}

/// What the writer is asked to do.
pub(crate) enum Command {
    Insert(Submission),
    /// Several at once (a group from the intake stage).
    Inserts(Vec<Submission>),
    /// A new block: senders' nonces moved, and the base fee for the next block.
    Block {
        number: u64,
        advanced: Vec<(Address, u64)>,
        base_fee: Option<u128>,
        reply: oneshot::Sender<Vec<Arc<Pooled>>>,
    },
    /// After a reorg: account nonces as the new chain has them (may be lower).
    Resync(Vec<(Address, u64)>),
    /// The upstreams refused it on relay.
    Reject {
        hash: B256,
        reason: String,
    },
    /// Drop queued transactions past their lifetime.
    Expire,
    /// The journal's replay is over: rewrite the journal with the live transactions and
    /// `unsettled` (records replay could not settle, kept for the next start).
    Replayed {
        unsettled: Vec<Bytes>,
        reply: oneshot::Sender<()>,
    },
    /// Apply what is queued before it, then end the thread.
    Stop,
    /// Test hook: the writer says it is inside a batch, then waits there for the release.
    #[cfg(test)]
    Hold {
        entered: oneshot::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    },
}

/// Everything the writer thread owns or publishes to.
pub(crate) struct Writer {
    /// The network's id, for the metrics' `network` label.
    pub network: String,
    /// `sluice_mempool_accepted_total` for this network, registered once (one per insert).
    pub accepted: metrics::Counter,
    /// The pool, of the transactions with their raw bytes.
    pub pool: Pool<Pooled>,
    pub journal: Option<Journal>,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub statuses: Statuses,
    /// Bounded: when full, the transaction waits for the relay's rebroadcast timer instead
    /// (which sends every pending transaction not sent yet), so the writer never blocks on it.
    pub relay: mpsc::Sender<Arc<Pooled>>,
    pub pending_events: broadcast::Sender<Arc<Pooled>>,
    /// Where a batch's answers go as one message, to be sent by a task on the runtime (see
    /// [`deliver`]); when it is gone, the writer sends them itself.
    pub answers: Option<mpsc::UnboundedSender<Answers>>,
    /// Records in the journal since it was last compacted.
    pub journal_records: usize,
    /// Senders whose transactions left since the last publish.
    pub dirty: AddressSet,
    /// Hash index changes since the last publish, in order.
    pub index: Vec<IndexChange>,
    /// Hashes that left, waiting for the snapshots that still list them to go.
    pub retired: Retired,
    /// The journal is being replayed: no compaction until it is over, since a compaction keeps
    /// only what is pooled and records not yet replayed would be lost.
    pub replaying: bool,
    /// Journal records that replay could not settle (account state unreadable): every
    /// compaction keeps them.
    pub unsettled: Vec<Bytes>,
}

/// Sends the writer's answers, a batch at a time, from a task on the runtime.
///
/// Each answer wakes its submitter's task. Woken from the writer's thread, each of those is a
/// wake-up from outside the runtime: a push onto its shared queue under a lock, and often a
/// worker unparked with a system call. Woken from a task, they go on that worker's own queue:
/// the writer then wakes the runtime once per batch, not once per transaction. The channel is
/// unbounded but holds no more answers than submissions wait for them. It ends when the writer
/// is gone, after the last answer.
pub(crate) async fn deliver(mut batches: mpsc::UnboundedReceiver<Answers>) {
    while let Some(answers) = batches.recv().await {
        for (reply, result) in answers {
            let _ = reply.send(result);
        }
    }
}

/// One change to the published hash index.
pub(crate) enum IndexChange {
    Add(B256, Place),
    Remove(B256),
}

/// What one batch changed, to publish.
#[derive(Default)]
struct Changes {
    touched: AddressSet,
    all: bool,
}

impl Writer {
    /// Runs until told to stop, or until every sender of commands is gone.
    pub fn run(mut self, commands: Receiver<Command>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut stop = false;
        while let Ok(first) = commands.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match commands.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            if let Some(at) = batch.iter().position(|c| matches!(c, Command::Stop)) {
                // What came after the stop is not applied: its senders see the writer gone.
                batch.truncate(at);
                stop = true;
            }
            self.apply(&mut batch);
            if stop {
                break;
            }
        }
        tracing::debug!("mempool writer stopped");
    }

    fn apply(&mut self, batch: &mut Vec<Command>) {
        let mut changes = Changes::default();
        let mut inserts = Vec::new();
        let mut block_replies = Vec::new();
        let mut compact = Vec::new();
        // Head updates first: a burst of submissions must not delay them.
        for command in batch.drain(..) {
            match command {
                Command::Insert(s) => inserts.push(s),
                Command::Inserts(many) => inserts.extend(many),
                Command::Block { number, advanced, base_fee, reply } => {
                    let mined = self.apply_block(number, &advanced, base_fee, &mut changes);
                    block_replies.push((reply, mined));
                }
                Command::Resync(nonces) => {
                    self.pool.forget_departed();
                    for (sender, nonce) in nonces {
                        let gone = self.pool.reset_nonce(&sender, nonce);
                        self.forget(&gone, TxStatus::Mined { block: None });
                        changes.touched.insert(sender);
                    }
                    let evicted = self.pool.trim();
                    self.forget(&evicted, TxStatus::Evicted);
                }
                Command::Reject { hash, reason } => {
                    if let Some(tx) = self.pool.remove(&hash) {
                        changes.touched.insert(tx.tx.sender);
                        self.forget(&[hash], TxStatus::Rejected { reason });
                        let evicted = self.pool.trim();
                        self.forget(&evicted, TxStatus::Evicted);
                    }
                }
                Command::Replayed { unsettled, reply } => {
                    self.replaying = false;
                    self.unsettled = unsettled;
                    compact.push(reply);
                }
                Command::Stop => {}
                #[cfg(test)]
                Command::Hold { entered, release } => {
                    let _ = entered.send(());
                    let _ = release.recv();
                }
                Command::Expire => {
                    let gone = self.pool.expire(Instant::now());
                    self.forget(&gone, TxStatus::Expired);
                }
            }
        }
        let replies = self.insert_all(inserts, &mut changes);
        self.publish(changes);
        self.answer(replies.into_iter().map(|(reply, result)| (reply, result.map_err(SubmitError::Refused))).collect());
        for (reply, mined) in block_replies {
            let _ = reply.send(mined);
        }
        if compact.is_empty() {
            self.maybe_compact();
        } else {
            self.compact();
            for reply in compact {
                let _ = reply.send(());
            }
        }
    }

    fn apply_block(
        &mut self,
        number: u64,
        advanced: &[(Address, u64)],
        base_fee: Option<u128>,
        changes: &mut Changes,
    ) -> Vec<Arc<Pooled>> {
        let mut mined = Vec::new();
        // Published before this batch, as everything pooled is when a block comes.
        let published = self.snapshot.load_full();
        for (sender, nonce) in advanced {
            let gone = self.pool.advance(sender, *nonce);
            mined.extend(gone.iter().filter_map(|h| published.get(h).cloned()));
            self.forget(&gone, TxStatus::Mined { block: Some(number) });
            changes.touched.insert(*sender);
        }
        if let Some(fee) = base_fee {
            if fee != self.pool.base_fee() {
                let evicted = self.pool.set_base_fee(fee);
                self.forget(&evicted, TxStatus::Evicted);
                changes.all = true;
            }
        }
        mined
    }

    /// Inserts a batch; journals the accepted ones with one write. Returns the answers to send
    /// once the snapshot is published.
    ///
    /// A transaction is accepted only once the journal holds it. The journaled inserts run
    /// under a pool checkpoint and change nothing else until the write succeeded: when it
    /// fails, the pool is rolled back, so what they replaced or evicted (already acknowledged)
    /// stays pooled, and they are refused.
    fn insert_all(&mut self, inserts: Vec<Submission>, changes: &mut Changes) -> Vec<Reply> {
        let mut replies = Vec::with_capacity(inserts.len());
        let (journaled, replayed): (Vec<_>, Vec<_>) = inserts.into_iter().partition(|s| s.journal);
        // Replayed from the journal: already in it.
        for s in replayed {
            let result = self.pool.insert(s.pooled.clone(), s.nonce, s.balance);
            let result = result.map(|done| self.accept(&s.pooled, done, changes)).map_err(|e| self.refuse(e));
            if let Some(reply) = s.reply {
                replies.push((reply, result));
            }
        }
        if journaled.is_empty() {
            return replies;
        }
        // The undo log costs a copy of each sender touched: only when a journal write can fail.
        if self.journal.is_some() {
            self.pool.checkpoint();
        }
        let mut accepted = Vec::with_capacity(journaled.len());
        for s in journaled {
            match self.pool.insert(s.pooled.clone(), s.nonce, s.balance) {
                Ok(done) => accepted.push((s, done)),
                Err(e) => {
                    let e = self.refuse(e);
                    if let Some(reply) = s.reply {
                        replies.push((reply, Err(e)));
                    }
                }
            }
        }
        let written = match &mut self.journal {
            Some(journal) if !accepted.is_empty() => {
                journal.append_many(accepted.iter().map(|(s, _)| s.pooled.raw.as_ref()))
            }
            _ => Ok(()),
        };
        match written {
            Ok(()) => {
                self.pool.commit();
                self.journal_records += accepted.len();
                for (s, done) in accepted {
                    let hash = self.accept(&s.pooled, done, changes);
                    if let Some(reply) = s.reply {
                        replies.push((reply, Ok(hash)));
                    }
                }
            }
            Err(e) => {
                // Not durable, so not accepted; the pool is as it was before the batch.
                self.pool.rollback();
                tracing::error!(error = %e, "mempool journal write failed; refusing the batch");
                metrics::counter!("sluice_mempool_journal_errors_total", "network" => self.network.clone())
                    .increment(1);
                let why = InsertError::Journal(e.to_string());
                replies.extend(accepted.into_iter().filter_map(|(s, _)| s.reply.map(|r| (r, Err(why.clone())))));
            }
        }
        replies
    }

    /// Takes an inserted transaction into what is published next: the index, its sender's
    /// view, and the statuses of what it displaced.
    fn accept(&mut self, pooled: &Arc<Pooled>, done: crate::Inserted, changes: &mut Changes) -> B256 {
        let hash = pooled.tx.hash;
        changes.touched.insert(pooled.tx.sender);
        self.index.push(IndexChange::Add(hash, Place { sender: pooled.tx.sender, nonce: pooled.tx.nonce }));
        if let Some(old) = done.replaced {
            self.forget(&[old], TxStatus::Replaced { by: hash });
        }
        self.forget(&done.evicted, TxStatus::Evicted);
        self.forget(&done.mined, TxStatus::Mined { block: None });
        self.accepted.increment(1);
        hash
    }

    /// Sends a batch's answers: through [`deliver`] when it runs, else from here.
    fn answer(&self, answers: Answers) {
        if answers.is_empty() {
            return;
        }
        let answers = match &self.answers {
            Some(deliver) => match deliver.send(answers) {
                Ok(()) => return,
                Err(unsent) => unsent.0,
            },
            None => answers,
        };
        for (reply, result) in answers {
            let _ = reply.send(result);
        }
    }

    /// A refusal by the pool's rules, counted.
    fn refuse(&self, e: InsertError) -> InsertError {
        let network = self.network.clone();
        metrics::counter!("sluice_mempool_refused_total", "network" => network, "reason" => e.label()).increment(1);
        e
    }

    /// Forgets transactions that left the pool (each hash once, as the pool gives them),
    /// recording why.
    fn forget(&mut self, hashes: &[B256], status: TxStatus) {
        if hashes.is_empty() {
            return;
        }
        // A transaction that leaves was either published (its sender's view must change) or
        // accepted in this batch, whose sender is among the touched already.
        let published = self.snapshot.load();
        for hash in hashes {
            if let Some(p) = published.get(hash) {
                self.dirty.insert(p.tx.sender);
            }
            self.index.push(IndexChange::Remove(*hash));
            let network = self.network.clone();
            metrics::counter!("sluice_mempool_removed_total", "network" => network, "why" => status.label())
                .increment(1);
            self.statuses.record(*hash, status.clone());
        }
    }

    /// Rewrites the journal with the live transactions once it is mostly dead records.
    fn maybe_compact(&mut self) {
        let live = self.pool.len();
        if !self.replaying && self.journal_records > 2 * live + 4096 {
            self.compact();
        }
    }

    fn compact(&mut self) {
        let live = self.pool.len() + self.unsettled.len();
        if let Some(journal) = &mut self.journal {
            let kept = self.pool.iter().map(|p| p.raw.as_ref()).chain(self.unsettled.iter().map(|r| r.as_ref()));
            match journal.compact(kept) {
                Ok(()) => self.journal_records = live,
                Err(e) => tracing::error!(error = %e, "mempool journal compaction failed"),
            }
        }
    }
}

#[path = "writer_publish.rs"]
mod publish;

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
