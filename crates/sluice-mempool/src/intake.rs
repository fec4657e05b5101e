//! The intake stage: one task between the verifier threads and the single writer.
//!
//! A submitter hands its transaction to the verifiers with a [`Ticket`] and waits for one
//! answer. The verifiers send their results a turn at a time; this stage answers what needs no
//! writer (undecodable, or pooled already: the verifier looks each transaction up by the hash
//! decoding computes, before recovering its sender), attaches each sender's account state, and
//! hands the rest to the writer as one command. A transaction pooled while it was verified (a
//! peer sent it too) is found by the pool itself, which the submitter hears as pooled. Under load, a turn holds many
//! transactions: one wake-up of this task and one writer batch per turn, not two task wake-ups
//! and a writer wake-up per transaction, which cost about as much as the sender recovery they
//! surround.
//!
//! States already read at the current head are attached at once. The others are read in one
//! upstream batch by a task of their own (it ends within the state timeout), so a slow node
//! holds up only the transactions that wait for it; a sender's transactions in one turn all
//! take the same path, so their order is kept.

use std::sync::Arc;

use alloy_primitives::{Address, Bytes, B256, U256};
use tokio::sync::{mpsc, oneshot};

use crate::seams::SubmitError;
use crate::state::StateReader;
use crate::verify::{Group, Verified};
use crate::view::Pooled;
use crate::writer::{Command, Submission};
use crate::DecodeError;

/// What travels with a transaction through the verifiers: its bytes, whether to journal it,
/// and where its answer goes.
pub(crate) struct Ticket {
    pub raw: Bytes,
    /// False for records replayed from the journal (already in it).
    pub journal: bool,
    pub reply: oneshot::Sender<Result<B256, SubmitError>>,
}

/// What the stage reads and writes to.
pub(crate) struct Intake {
    pub state: StateReader,
    pub commands: std::sync::mpsc::Sender<Command>,
    /// The network's id, for the metrics' `network` label.
    pub network: String,
}

/// Verifier groups taken per pass at most.
const GROUPS: usize = 64;

/// Runs until the verifiers are gone (every group sender dropped) or the task is ended.
pub(crate) async fn run(intake: Intake, mut groups: mpsc::UnboundedReceiver<Group<Ticket>>) {
    let mut taken = Vec::with_capacity(GROUPS);
    while groups.recv_many(&mut taken, GROUPS).await > 0 {
        let count = taken.iter().map(Vec::len).sum();
        intake.take(taken.drain(..).flatten(), count);
    }
}

/// A verified transaction still waiting for its sender's account state.
type Unread = (Pooled, bool, oneshot::Sender<Result<B256, SubmitError>>);

impl Intake {
    /// Answers or forwards one pass of verified transactions, `count` of them.
    fn take(&self, results: impl Iterator<Item = (Result<Verified, DecodeError>, Ticket)>, count: usize) {
        // Sized up front: grown a push at a time, it was moved four times for a turn of 64.
        let mut ready = Vec::with_capacity(count);
        let mut unread: Vec<Unread> = Vec::new();
        // One lock for the turn's lookups; `get` (the reads of what is missing) waits for it.
        let mut states = self.state.cached_states();
        for (verified, ticket) in results {
            let tx = match verified {
                Ok(Verified::New(tx)) => tx,
                Ok(Verified::Known(hash)) => {
                    // Pooled already (found by the verifier): the submitter hears it is pooled.
                    metrics::counter!(
                        "sluice_mempool_refused_total", "network" => self.network.clone(), "reason" => "already_known"
                    )
                    .increment(1);
                    let _ = ticket.reply.send(Ok(hash));
                    continue;
                }
                Err(e) => {
                    metrics::counter!(
                        "sluice_mempool_refused_total", "network" => self.network.clone(), "reason" => e.label()
                    )
                    .increment(1);
                    let _ = ticket.reply.send(Err(e.into()));
                    continue;
                }
            };
            let pooled = Pooled { tx, raw: ticket.raw };
            match states.get(pooled.tx.sender) {
                Some((nonce, balance)) => ready.push(submission(pooled, nonce, balance, ticket.journal, ticket.reply)),
                None => unread.push((pooled, ticket.journal, ticket.reply)),
            }
        }
        drop(states);
        send(&self.commands, ready);
        if !unread.is_empty() {
            let (state, commands) = (self.state.clone(), self.commands.clone());
            tokio::spawn(async move { send(&commands, with_state(&state, unread).await) });
        }
    }
}

/// Reads the senders' states (one upstream batch for all of them); those that cannot be read
/// are answered as unavailable.
async fn with_state(state: &StateReader, unread: Vec<Unread>) -> Vec<Submission> {
    let mut senders: Vec<Address> = unread.iter().map(|(p, _, _)| p.tx.sender).collect();
    senders.sort_unstable();
    senders.dedup();
    // In the order of `senders`, which is sorted: found by binary search.
    let states: Vec<Result<(u64, U256), String>> = state.get_many(&senders).await;
    let mut ready = Vec::with_capacity(unread.len());
    for (pooled, journal, reply) in unread {
        match senders.binary_search(&pooled.tx.sender).ok().and_then(|i| states.get(i)) {
            Some(Ok((nonce, balance))) => ready.push(submission(pooled, *nonce, *balance, journal, reply)),
            Some(Err(e)) => {
                let _ = reply.send(Err(SubmitError::Unavailable(e.clone())));
            }
            None => {
                let _ = reply.send(Err(SubmitError::Unavailable("no account state read".into())));
            }
        }
    }
    ready
}

fn submission(
    pooled: Pooled,
    nonce: u64,
    balance: U256,
    journal: bool,
    reply: oneshot::Sender<Result<B256, SubmitError>>,
) -> Submission {
    Submission { pooled: Arc::new(pooled), nonce, balance, journal, reply: Some(reply) }
}

/// Hands the submissions to the writer as one command. A writer gone drops them, and their
/// submitters see the mempool stopping.
fn send(commands: &std::sync::mpsc::Sender<Command>, ready: Vec<Submission>) {
    if !ready.is_empty() {
        let _ = commands.send(Command::Inserts(ready));
    }
}
