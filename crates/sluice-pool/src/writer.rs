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

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use alloy_primitives::{Address, B256, U256};
use arc_swap::ArcSwap;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::journal::Journal;
use crate::status::{Statuses, TxStatus};
use crate::view::{Pooled, SenderView, Snapshot};
use crate::{InsertError, Pool};

/// Most commands applied per batch.
pub const MAX_BATCH: usize = 1024;

/// One validated transaction with its sender's account state at the head.
pub(crate) struct Submission {
    pub pooled: Arc<Pooled>,
    pub nonce: u64,
    pub balance: U256,
    /// False for transactions replayed from the journal (already in it).
    pub journal: bool,
    pub reply: Option<oneshot::Sender<Result<B256, InsertError>>>,
}

/// What the writer is asked to do.
pub(crate) enum Command {
    Insert(Submission),
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
    /// Rewrite the journal with just the live transactions now.
    Compact(oneshot::Sender<()>),
}

/// Everything the writer thread owns or publishes to.
pub(crate) struct Writer {
    /// The network's id, for the metrics' `network` label.
    pub network: String,
    pub pool: Pool,
    pub journal: Option<Journal>,
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub statuses: Statuses,
    pub relay: mpsc::UnboundedSender<Arc<Pooled>>,
    pub pending_events: broadcast::Sender<Arc<Pooled>>,
    /// The pooled transactions with their bytes and envelopes.
    pub txs: HashMap<B256, Arc<Pooled>>,
    /// Records in the journal since it was last compacted.
    pub journal_records: usize,
    /// Senders whose transactions left since the last publish.
    pub dirty: HashSet<Address>,
    /// Hash index changes since the last publish, in order: the snapshot's index is updated
    /// by exactly these (persistent maps copy a path per write, so no write is wasted).
    pub index: Vec<IndexChange>,
}

/// One change to the published hash index.
pub(crate) enum IndexChange {
    Add(Arc<Pooled>),
    Remove(B256),
}

/// What one batch changed, to publish.
#[derive(Default)]
struct Changes {
    touched: HashSet<Address>,
    all: bool,
}

impl Writer {
    /// Runs until every sender of commands is gone.
    pub fn run(mut self, commands: Receiver<Command>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = commands.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match commands.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            self.apply(&mut batch);
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
                Command::Block { number, advanced, base_fee, reply } => {
                    let mined = self.apply_block(number, &advanced, base_fee, &mut changes);
                    block_replies.push((reply, mined));
                }
                Command::Resync(nonces) => {
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
                        changes.touched.insert(tx.sender);
                        self.forget(&[hash], TxStatus::Rejected { reason });
                        let evicted = self.pool.trim();
                        self.forget(&evicted, TxStatus::Evicted);
                    }
                }
                Command::Compact(reply) => compact.push(reply),
                Command::Expire => {
                    let gone = self.pool.expire(Instant::now());
                    self.forget(&gone, TxStatus::Expired);
                }
            }
        }
        let replies = self.insert_all(inserts, &mut changes);
        self.publish(changes);
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
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
        for (sender, nonce) in advanced {
            let gone = self.pool.advance(sender, *nonce);
            mined.extend(gone.iter().filter_map(|h| self.txs.get(h).cloned()));
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
    #[allow(clippy::type_complexity)]
    fn insert_all(
        &mut self,
        inserts: Vec<Submission>,
        changes: &mut Changes,
    ) -> Vec<(oneshot::Sender<Result<B256, InsertError>>, Result<B256, InsertError>)> {
        let mut replies = Vec::with_capacity(inserts.len());
        let mut to_journal: Vec<Arc<Pooled>> = Vec::new();
        let mut accepted_replies = Vec::new();
        for s in inserts {
            let hash = s.pooled.tx.hash;
            let result = self.pool.insert(s.pooled.tx.clone(), s.nonce, s.balance);
            let result = match result {
                Ok(done) => {
                    changes.touched.insert(s.pooled.tx.sender);
                    self.txs.insert(hash, s.pooled.clone());
                    self.index.push(IndexChange::Add(s.pooled.clone()));
                    if let Some(old) = done.replaced {
                        self.forget(&[old], TxStatus::Replaced { by: hash });
                    }
                    self.forget(&done.evicted, TxStatus::Evicted);
                    self.forget(&done.mined, TxStatus::Mined { block: None });
                    metrics::counter!("sluice_mempool_accepted_total", "network" => self.network.clone()).increment(1);
                    if s.journal {
                        to_journal.push(s.pooled.clone());
                        if let Some(reply) = s.reply {
                            accepted_replies.push((reply, hash));
                        }
                        continue;
                    }
                    Ok(hash)
                }
                Err(e) => {
                    let network = self.network.clone();
                    metrics::counter!("sluice_mempool_refused_total", "network" => network, "reason" => e.label())
                        .increment(1);
                    Err(e)
                }
            };
            if let Some(reply) = s.reply {
                replies.push((reply, result));
            }
        }
        if to_journal.is_empty() {
            return replies;
        }
        let written = match &mut self.journal {
            Some(journal) => journal.append_many(to_journal.iter().map(|p| p.raw.as_ref())),
            None => Ok(()),
        };
        match written {
            Ok(()) => {
                self.journal_records += to_journal.len();
                replies.extend(accepted_replies.into_iter().map(|(reply, hash)| (reply, Ok(hash))));
            }
            Err(e) => {
                // Not durable, so not accepted: take them out again and say why.
                tracing::error!(error = %e, "mempool journal write failed; refusing the batch");
                metrics::counter!("sluice_mempool_journal_errors_total", "network" => self.network.clone())
                    .increment(1);
                for p in &to_journal {
                    self.pool.remove(&p.tx.hash);
                    self.txs.remove(&p.tx.hash);
                    self.index.push(IndexChange::Remove(p.tx.hash));
                }
                let why = InsertError::Journal(e.to_string());
                replies.extend(accepted_replies.into_iter().map(|(reply, _)| (reply, Err(why.clone()))));
            }
        }
        replies
    }

    /// Forgets transactions that left the pool, recording why.
    fn forget(&mut self, hashes: &[B256], status: TxStatus) {
        for hash in hashes {
            if let Some(p) = self.txs.remove(hash) {
                self.dirty.insert(p.tx.sender);
                self.index.push(IndexChange::Remove(*hash));
                let network = self.network.clone();
                metrics::counter!("sluice_mempool_removed_total", "network" => network, "why" => status.label())
                    .increment(1);
                self.statuses.record(*hash, status.clone());
            }
        }
    }

    /// Publishes the new snapshot (copying only the changed senders), then announces the
    /// transactions that became executable.
    fn publish(&mut self, mut changes: Changes) {
        changes.touched.extend(self.dirty.drain());
        let old = self.snapshot.load_full();
        let mut next = Snapshot::clone(&old);
        // Every sender whose view may differ: those touched, and on a base fee move all of
        // them, including those that just left (their entries must go too).
        let mut senders = changes.touched;
        if changes.all {
            senders.extend(self.pool.senders().copied());
            senders.extend(old.senders.keys().copied());
        }
        for change in self.index.drain(..) {
            match change {
                IndexChange::Add(p) => {
                    next.by_hash.insert(p.tx.hash, p);
                }
                IndexChange::Remove(hash) => {
                    next.by_hash.remove(&hash);
                }
            }
        }
        let mut newly_pending = Vec::new();
        for sender in senders {
            let before = old.senders.get(&sender);
            let Some(pending_nonce) = self.pool.pending_nonce(&sender) else {
                next.senders.remove(&sender);
                continue;
            };
            let (pending, queued) = self.pool.content_of(&sender);
            let lookup = |list: Vec<Arc<crate::PoolTx>>| -> Vec<Arc<Pooled>> {
                list.iter().filter_map(|t| self.txs.get(&t.hash).cloned()).collect()
            };
            let view = SenderView { pending_nonce, pending: lookup(pending), queued: lookup(queued) };
            let was_pending: HashSet<B256> =
                before.map(|v| v.pending.iter().map(|p| p.tx.hash).collect()).unwrap_or_default();
            newly_pending.extend(view.pending.iter().filter(|p| !was_pending.contains(&p.tx.hash)).cloned());
            next.senders.insert(sender, Arc::new(view));
        }
        next.status = self.pool.status();
        next.base_fee = self.pool.base_fee();
        metrics::gauge!("sluice_mempool_pending", "network" => self.network.clone()).set(next.status.pending as f64);
        metrics::gauge!("sluice_mempool_queued", "network" => self.network.clone()).set(next.status.queued as f64);
        self.snapshot.store(Arc::new(next));
        for p in newly_pending {
            let _ = self.relay.send(p.clone());
            let _ = self.pending_events.send(p);
        }
    }

    /// Rewrites the journal with the live transactions once it is mostly dead records.
    fn maybe_compact(&mut self) {
        let live = self.txs.len();
        if self.journal_records > 2 * live + 4096 {
            self.compact();
        }
    }

    fn compact(&mut self) {
        let live = self.txs.len();
        if let Some(journal) = &mut self.journal {
            match journal.compact(self.txs.values().map(|p| p.raw.as_ref())) {
                Ok(()) => self.journal_records = live,
                Err(e) => tracing::error!(error = %e, "mempool journal compaction failed"),
            }
        }
    }
}
