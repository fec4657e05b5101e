//! The message service's delivery rules, as a pure state machine: per-peer bounded queues, a cap
//! on streams in flight per peer, retries with exponential backoff and jitter, re-dials, and a
//! deadline. Every message given to [`Outbox::enqueue`] ends exactly once, as [`Outcome::Acked`],
//! [`Outcome::Skipped`] (the peer already had it) or [`Outcome::Failed`] with a reason: nothing
//! is dropped silently, including when a queue is full (refused at once, with a reason) or a
//! peer goes away.
//!
//! A *message* is one transaction for one peer; a *send* is one stream. A send carries the
//! messages waiting for its peer, up to `max_batch` of them and `max_batch_bytes`: when the
//! peer keeps up, each message leaves alone the moment it is queued; under a backlog (every
//! stream slot busy) the next send takes what piled up, so the per-stream cost is shared and
//! the backlog drains instead of growing. Each message in a send gets its own verdict.
//!
//! Time is passed in as nanoseconds from any fixed origin; the node feeds it events from libp2p.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

mod types;
pub use types::{Action, Done, OutboxConfig, Outcome, PeerCounts, Weight};

#[derive(Debug, Clone)]
struct Entry<M> {
    id: u64,
    message: M,
    enqueued: u64,
    /// When it was first sent (the deadline runs from here).
    first_sent: Option<u64>,
    attempts: u32,
    due: u64,
    last_error: Option<String>,
}

#[derive(Debug)]
struct PeerQueue<M> {
    ready: VecDeque<Entry<M>>,
    backoff: Vec<Entry<M>>,
    /// Sends in flight; a slot is `None` once its message ended (its deadline passed).
    in_flight: HashMap<u64, Vec<Option<Entry<M>>>>,
    in_flight_messages: usize,
    connected: bool,
    /// A configured peer: dialed whenever it is not connected, with or without messages.
    keep: bool,
    next_dial: u64,
    dials: u32,
    counts: PeerCounts,
}

impl<M> PeerQueue<M> {
    fn new() -> Self {
        PeerQueue {
            ready: VecDeque::new(),
            backoff: Vec::new(),
            in_flight: HashMap::new(),
            in_flight_messages: 0,
            connected: false,
            keep: false,
            next_dial: 0,
            dials: 0,
            counts: PeerCounts::default(),
        }
    }

    fn waiting(&self) -> usize {
        self.ready.len() + self.backoff.len()
    }
}

/// Pending messages for every peer.
#[derive(Debug)]
pub struct Outbox<P, M> {
    config: OutboxConfig,
    peers: HashMap<P, PeerQueue<M>>,
    next_id: u64,
    next_send: u64,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// A deterministic jitter in [0.5, 1.0) from the message and attempt (pure code, no RNG).
fn jitter(id: u64, attempt: u32) -> f64 {
    let mut x = id ^ ((attempt as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    0.5 + (x >> 11) as f64 / (1u64 << 53) as f64 / 2.0
}

fn expired_failure<P: Clone, M>(peer: &P, e: Entry<M>, counts: &mut PeerCounts) -> Done<P> {
    counts.failed += 1;
    let why = match (&e.last_error, e.first_sent) {
        (_, None) => "never sent: waited too long in the queue".to_string(),
        (Some(last), _) => format!("deadline passed after {} attempt(s); last error: {last}", e.attempts),
        (None, _) => format!("deadline passed after {} attempt(s)", e.attempts),
    };
    Done { peer: peer.clone(), id: e.id, outcome: Outcome::Failed(why), attempts: e.attempts }
}

impl<P: Clone + Eq + Hash, M: Clone + Weight> Outbox<P, M> {
    /// No peers yet.
    pub fn new(config: OutboxConfig) -> Self {
        Outbox { config, peers: HashMap::new(), next_id: 1, next_send: 1 }
    }

    /// The settings.
    pub fn config(&self) -> &OutboxConfig {
        &self.config
    }

    /// Starts tracking `peer` (idempotent).
    pub fn add_peer(&mut self, peer: P) {
        self.peers.entry(peer).or_insert_with(PeerQueue::new);
    }

    /// Tracks `peer` and keeps it connected: it is dialed (with backoff) whenever it is not.
    pub fn keep_peer(&mut self, peer: P) {
        self.peers.entry(peer).or_insert_with(PeerQueue::new).keep = true;
    }

    /// The peers tracked.
    pub fn peers(&self) -> impl Iterator<Item = &P> {
        self.peers.keys()
    }

    /// Marks `peer` connected or not. Sends in flight on a lost connection are failed by the
    /// transport (and retried); the outbox only stops sending until it is back.
    pub fn set_connected(&mut self, peer: &P, connected: bool) {
        if let Some(q) = self.peers.get_mut(peer) {
            q.connected = connected;
            if connected {
                q.dials = 0;
            }
        }
    }

    /// Whether `peer` is connected, as last reported.
    pub fn is_connected(&self, peer: &P) -> bool {
        self.peers.get(peer).is_some_and(|q| q.connected)
    }

    /// Queues `message` for `peer`. Refused (and counted as failed) when the peer's queue is full
    /// or the peer is unknown; the caller surfaces the reason.
    pub fn enqueue(&mut self, now: u64, peer: &P, message: M) -> Result<u64, Done<P>> {
        let id = self.next_id;
        self.next_id += 1;
        let Some(q) = self.peers.get_mut(peer) else {
            return Err(Done { peer: peer.clone(), id, outcome: Outcome::Failed("unknown peer".into()), attempts: 0 });
        };
        q.counts.enqueued += 1;
        if q.waiting() + q.in_flight_messages >= self.config.queue_per_peer {
            q.counts.failed += 1;
            return Err(Done { peer: peer.clone(), id, outcome: Outcome::Failed("queue full".into()), attempts: 0 });
        }
        q.ready.push_back(Entry {
            id,
            message,
            enqueued: now,
            first_sent: None,
            attempts: 0,
            due: now,
            last_error: None,
        });
        Ok(id)
    }

    /// What to do now, and the messages that ended (deadlines passed, or skipped because
    /// `has(peer, message)` says the peer already has them).
    pub fn poll(&mut self, now: u64, has: &mut dyn FnMut(&P, &M) -> bool) -> (Vec<Action<P, M>>, Vec<Done<P>>) {
        let deadline = nanos(self.config.deadline);
        let queue_wait = nanos(self.config.max_queue_wait);
        let mut actions = Vec::new();
        let mut done = Vec::new();
        for (peer, q) in self.peers.iter_mut() {
            // Retries whose wait is over go back in line, in front (they are the oldest).
            let (due, later): (Vec<_>, Vec<_>) = q.backoff.drain(..).partition(|e| e.due <= now);
            q.backoff = later;
            for e in due.into_iter().rev() {
                q.ready.push_front(e);
            }
            // Deadlines: waiting messages, and in-flight ones whose answer never came.
            let expired = |e: &Entry<M>| match e.first_sent {
                Some(sent) => sent + deadline <= now,
                None => e.enqueued + queue_wait <= now,
            };
            let mut keep = VecDeque::with_capacity(q.ready.len());
            for e in q.ready.drain(..) {
                if expired(&e) {
                    done.push(expired_failure(peer, e, &mut q.counts));
                } else {
                    keep.push_back(e);
                }
            }
            q.ready = keep;
            for slots in q.in_flight.values_mut() {
                for slot in slots.iter_mut() {
                    if let Some(e) = slot.take_if(|e| expired(e)) {
                        q.in_flight_messages -= 1;
                        done.push(expired_failure(peer, e, &mut q.counts));
                    }
                }
            }
            // A send whose messages all ended frees its slot; a late answer to it is ignored.
            q.in_flight.retain(|_, slots| slots.iter().any(Option::is_some));
            for e in std::mem::take(&mut q.backoff) {
                if expired(&e) {
                    done.push(expired_failure(peer, e, &mut q.counts));
                } else {
                    q.backoff.push(e);
                }
            }

            if !q.connected {
                if (q.keep || !q.ready.is_empty()) && now >= q.next_dial {
                    q.dials += 1;
                    q.next_dial = now + backoff_for(&self.config, q.dials, 0);
                    actions.push(Action::Dial(peer.clone()));
                }
                continue;
            }
            take_sends(&self.config, &mut self.next_send, now, peer, q, has, &mut actions, &mut done);
        }
        (actions, done)
    }

    /// Sends what is ready for `peer`, up to the cap on sends in flight (cheap: no deadline
    /// scan). Called after an enqueue or an answer so messages do not wait for the next `poll`.
    pub fn pump(
        &mut self,
        now: u64,
        peer: &P,
        has: &mut dyn FnMut(&P, &M) -> bool,
    ) -> (Vec<Action<P, M>>, Vec<Done<P>>) {
        let mut actions = Vec::new();
        let mut done = Vec::new();
        if let Some(q) = self.peers.get_mut(peer).filter(|q| q.connected) {
            take_sends(&self.config, &mut self.next_send, now, peer, q, has, &mut actions, &mut done);
        }
        (actions, done)
    }

    /// `peer` answered send `send` with one verdict per message, in order: `Ok` is an
    /// acknowledgement, `Err(why)` a refusal to take it now (retried after a backoff, or ended
    /// when its attempts are used up). An answer with the wrong number of verdicts fails the
    /// whole send. Returns the messages that ended; none for a late answer.
    pub fn on_answer(&mut self, now: u64, peer: &P, send: u64, verdicts: &[Result<(), String>]) -> Vec<Done<P>> {
        let Some(q) = self.peers.get_mut(peer) else { return Vec::new() };
        let Some(slots) = q.in_flight.remove(&send) else { return Vec::new() };
        let mismatch = (verdicts.len() != slots.len())
            .then(|| format!("the answer had {} verdicts for {} messages", verdicts.len(), slots.len()));
        let mut done = Vec::new();
        for (i, slot) in slots.into_iter().enumerate() {
            let Some(mut e) = slot else { continue };
            q.in_flight_messages -= 1;
            let verdict = match &mismatch {
                Some(why) => Err(why.as_str()),
                None => verdicts[i].as_ref().map(|_| ()).map_err(String::as_str),
            };
            match verdict {
                Ok(()) => {
                    q.counts.acked += 1;
                    done.push(Done { peer: peer.clone(), id: e.id, outcome: Outcome::Acked, attempts: e.attempts });
                }
                Err(reason) => {
                    e.last_error = Some(reason.to_string());
                    if e.attempts >= self.config.max_attempts {
                        q.counts.failed += 1;
                        let why = format!("gave up after {} attempts; last error: {reason}", e.attempts);
                        done.push(Done {
                            peer: peer.clone(),
                            id: e.id,
                            outcome: Outcome::Failed(why),
                            attempts: e.attempts,
                        });
                    } else {
                        q.counts.retried += 1;
                        e.due = now + backoff_for(&self.config, e.attempts, e.id);
                        q.backoff.push(e);
                    }
                }
            }
        }
        done
    }

    /// Send `send` to `peer` failed as a whole (stream reset, timeout, connection lost): each of
    /// its messages is retried after a backoff, or ends when its attempts are used up.
    pub fn on_failure(&mut self, now: u64, peer: &P, send: u64, reason: &str) -> Vec<Done<P>> {
        let n = self.peers.get(peer).and_then(|q| q.in_flight.get(&send)).map_or(0, Vec::len);
        let verdicts = vec![Err(reason.to_string()); n];
        self.on_answer(now, peer, send, &verdicts)
    }

    /// Messages waiting for `peer` (queued or backing off) and in flight.
    pub fn depth(&self, peer: &P) -> (usize, usize) {
        self.peers.get(peer).map_or((0, 0), |q| (q.waiting(), q.in_flight_messages))
    }

    /// Sends (streams) in flight to `peer`.
    pub fn streams(&self, peer: &P) -> usize {
        self.peers.get(peer).map_or(0, |q| q.in_flight.len())
    }

    /// The counters of `peer`.
    pub fn counts(&self, peer: &P) -> PeerCounts {
        self.peers.get(peer).map(|q| q.counts).unwrap_or_default()
    }

    /// Messages not yet ended, for every peer.
    pub fn pending(&self) -> usize {
        self.peers.values().map(|q| q.waiting() + q.in_flight_messages).sum()
    }
}

/// Forms sends for a connected peer while stream slots are free: each takes the messages at the
/// front of the line up to the batch caps; messages the peer already has end as skipped.
#[allow(clippy::too_many_arguments)]
fn take_sends<P: Clone, M: Clone + Weight>(
    config: &OutboxConfig,
    next_send: &mut u64,
    now: u64,
    peer: &P,
    q: &mut PeerQueue<M>,
    has: &mut dyn FnMut(&P, &M) -> bool,
    actions: &mut Vec<Action<P, M>>,
    done: &mut Vec<Done<P>>,
) {
    while q.in_flight.len() < config.max_in_flight && !q.ready.is_empty() {
        let (mut slots, mut ids, mut messages, mut bytes) = (Vec::new(), Vec::new(), Vec::new(), 0usize);
        while let Some(e) = q.ready.front() {
            if has(peer, &e.message) {
                if let Some(e) = q.ready.pop_front() {
                    q.counts.skipped += 1;
                    done.push(Done { peer: peer.clone(), id: e.id, outcome: Outcome::Skipped, attempts: e.attempts });
                }
                continue;
            }
            let weight = e.message.weight();
            if !slots.is_empty() && (slots.len() >= config.max_batch || bytes + weight > config.max_batch_bytes) {
                break;
            }
            let Some(mut e) = q.ready.pop_front() else { break };
            bytes += weight;
            e.attempts += 1;
            e.first_sent.get_or_insert(now);
            q.counts.sent += 1;
            ids.push(e.id);
            messages.push(e.message.clone());
            slots.push(Some(e));
        }
        if slots.is_empty() {
            break;
        }
        let send = *next_send;
        *next_send += 1;
        q.counts.streams += 1;
        q.in_flight_messages += slots.len();
        q.in_flight.insert(send, slots);
        actions.push(Action::Send { peer: peer.clone(), send, ids, messages });
    }
}

/// The wait before attempt `attempt + 1`: base × 2^(attempt − 1), capped, times a jitter in
/// [0.5, 1).
fn backoff_for(config: &OutboxConfig, attempt: u32, id: u64) -> u64 {
    let base = nanos(config.base_backoff) as f64;
    let exp = base * 2f64.powi(attempt.saturating_sub(1).min(30) as i32);
    let capped = exp.min(nanos(config.max_backoff) as f64);
    (capped * jitter(id, attempt)) as u64
}

#[cfg(test)]
mod tests;
