//! The message service's delivery rules, as a pure state machine: per-peer bounded queues, a cap
//! on messages in flight per peer, retries with exponential backoff and jitter, re-dials, and a
//! deadline. Every message given to [`Outbox::enqueue`] ends exactly once, as [`Outcome::Acked`]
//! or [`Outcome::Failed`] with a reason: nothing is dropped silently, including when a queue is
//! full (refused at once, with a reason) or a peer goes away.
//!
//! Time is passed in as nanoseconds from any fixed origin; the node feeds it events from libp2p.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

/// Delivery settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Messages in flight to one peer at once (kept under the peer's stream limit, so that no
    /// inbound stream is ever dropped for being over it).
    pub max_in_flight: usize,
    /// Messages waiting for one peer; beyond this `enqueue` refuses (backpressure).
    pub queue_per_peer: usize,
    /// A message not acknowledged within this of its first send fails.
    pub deadline: Duration,
    /// A message not sent within this of being queued fails (a peer down for long, or a
    /// backlog that does not drain): the queue is bounded in time as well as in length.
    pub max_queue_wait: Duration,
    /// The first retry waits about this long; each next one twice as long.
    pub base_backoff: Duration,
    /// Retries never wait longer than this.
    pub max_backoff: Duration,
    /// Attempts per message, the first included.
    pub max_attempts: u32,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            max_in_flight: 256,
            queue_per_peer: 100_000,
            deadline: Duration::from_secs(5),
            max_queue_wait: Duration::from_secs(30),
            base_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            max_attempts: 20,
        }
    }
}

/// How a message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The peer acknowledged it.
    Acked,
    /// It was not delivered: why.
    Failed(String),
}

/// What the node must do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<P, M> {
    /// Send `message` (one stream) to `peer`; report back with `id`.
    Send {
        /// To whom.
        peer: P,
        /// Report `on_ack` / `on_failure` with this.
        id: u64,
        /// The payload.
        message: M,
    },
    /// Dial `peer`: it has messages waiting and is not connected.
    Dial(P),
}

/// A message that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done<P> {
    /// Its peer.
    pub peer: P,
    /// Its id.
    pub id: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Attempts made.
    pub attempts: u32,
}

/// Counters of one peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PeerCounts {
    /// Messages enqueued (including those refused).
    pub enqueued: u64,
    /// Sends (attempts).
    pub sent: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Messages that failed.
    pub failed: u64,
    /// Retries scheduled.
    pub retried: u64,
}

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
    in_flight: HashMap<u64, Entry<M>>,
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

impl<P: Clone + Eq + Hash, M: Clone> Outbox<P, M> {
    /// No peers yet.
    pub fn new(config: OutboxConfig) -> Self {
        Outbox { config, peers: HashMap::new(), next_id: 1 }
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

    /// Marks `peer` connected or not. Messages in flight on a lost connection are failed by the
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
        if q.waiting() + q.in_flight.len() >= self.config.queue_per_peer {
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

    /// What to do now, and the messages that ended (deadlines passed).
    pub fn poll(&mut self, now: u64) -> (Vec<Action<P, M>>, Vec<Done<P>>) {
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
            let mut fail = |e: Entry<M>, counts: &mut PeerCounts| {
                counts.failed += 1;
                let why = match (&e.last_error, e.first_sent) {
                    (_, None) => "never sent: waited too long in the queue".to_string(),
                    (Some(last), _) => format!("deadline passed after {} attempt(s); last error: {last}", e.attempts),
                    (None, _) => format!("deadline passed after {} attempt(s)", e.attempts),
                };
                done.push(Done { peer: peer.clone(), id: e.id, outcome: Outcome::Failed(why), attempts: e.attempts });
            };
            let mut keep = VecDeque::with_capacity(q.ready.len());
            for e in q.ready.drain(..) {
                if expired(&e) {
                    fail(e, &mut q.counts);
                } else {
                    keep.push_back(e);
                }
            }
            q.ready = keep;
            let late: Vec<u64> = q.in_flight.values().filter(|e| expired(e)).map(|e| e.id).collect();
            for id in late {
                if let Some(e) = q.in_flight.remove(&id) {
                    fail(e, &mut q.counts);
                }
            }
            let backoff = std::mem::take(&mut q.backoff);
            for e in backoff {
                if expired(&e) {
                    fail(e, &mut q.counts);
                } else {
                    q.backoff.push(e);
                }
            }

            if !q.connected {
                if (q.keep || !q.ready.is_empty()) && now >= q.next_dial {
                    q.dials += 1;
                    let wait = backoff_for(&self.config, q.dials, 0);
                    q.next_dial = now + wait;
                    actions.push(Action::Dial(peer.clone()));
                }
                continue;
            }
            while q.in_flight.len() < self.config.max_in_flight {
                let Some(mut e) = q.ready.pop_front() else { break };
                e.attempts += 1;
                e.first_sent.get_or_insert(now);
                q.counts.sent += 1;
                actions.push(Action::Send { peer: peer.clone(), id: e.id, message: e.message.clone() });
                q.in_flight.insert(e.id, e);
            }
        }
        (actions, done)
    }

    /// Sends what is ready for `peer`, up to the in-flight cap (cheap: no deadline scan). Called
    /// after an enqueue or an answer so messages do not wait for the next `poll`.
    pub fn pump(&mut self, now: u64, peer: &P) -> Vec<Action<P, M>> {
        let mut actions = Vec::new();
        let Some(q) = self.peers.get_mut(peer) else { return actions };
        if !q.connected {
            return actions;
        }
        while q.in_flight.len() < self.config.max_in_flight {
            let Some(mut e) = q.ready.pop_front() else { break };
            e.attempts += 1;
            e.first_sent.get_or_insert(now);
            q.counts.sent += 1;
            actions.push(Action::Send { peer: peer.clone(), id: e.id, message: e.message.clone() });
            q.in_flight.insert(e.id, e);
        }
        actions
    }

    /// `peer` acknowledged message `id`. `None` when it had already ended (a late answer).
    pub fn on_ack(&mut self, peer: &P, id: u64) -> Option<Done<P>> {
        let q = self.peers.get_mut(peer)?;
        let e = q.in_flight.remove(&id)?;
        q.counts.acked += 1;
        Some(Done { peer: peer.clone(), id, outcome: Outcome::Acked, attempts: e.attempts })
    }

    /// Sending message `id` to `peer` failed: it is retried after a backoff, or ends when its
    /// attempts are used up. `None` when it had already ended.
    pub fn on_failure(&mut self, now: u64, peer: &P, id: u64, reason: &str) -> Option<Done<P>> {
        let q = self.peers.get_mut(peer)?;
        let mut e = q.in_flight.remove(&id)?;
        e.last_error = Some(reason.to_string());
        if e.attempts >= self.config.max_attempts {
            q.counts.failed += 1;
            let why = format!("gave up after {} attempts; last error: {reason}", e.attempts);
            return Some(Done { peer: peer.clone(), id, outcome: Outcome::Failed(why), attempts: e.attempts });
        }
        q.counts.retried += 1;
        e.due = now + backoff_for(&self.config, e.attempts, e.id);
        q.backoff.push(e);
        None
    }

    /// Messages waiting for `peer` (queued or backing off) and in flight.
    pub fn depth(&self, peer: &P) -> (usize, usize) {
        self.peers.get(peer).map_or((0, 0), |q| (q.waiting(), q.in_flight.len()))
    }

    /// The counters of `peer`.
    pub fn counts(&self, peer: &P) -> PeerCounts {
        self.peers.get(peer).map(|q| q.counts).unwrap_or_default()
    }

    /// Messages not yet ended, for every peer.
    pub fn pending(&self) -> usize {
        self.peers.values().map(|q| q.waiting() + q.in_flight.len()).sum()
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
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn outbox() -> Outbox<&'static str, u32> {
        let mut o = Outbox::new(OutboxConfig { max_in_flight: 2, queue_per_peer: 4, ..OutboxConfig::default() });
        o.add_peer("a");
        o
    }

    fn sends(actions: &[Action<&'static str, u32>]) -> Vec<u64> {
        actions.iter().filter_map(|a| if let Action::Send { id, .. } = a { Some(*id) } else { None }).collect()
    }

    #[test]
    fn a_disconnected_peer_is_dialed_with_backoff_and_then_served_in_order() {
        let mut o = outbox();
        let ids: Vec<u64> = (0..3).map(|m| o.enqueue(0, &"a", m).unwrap()).collect();
        let (actions, _) = o.poll(0);
        assert_eq!(actions, vec![Action::Dial("a")]);
        assert!(o.poll(MS).0.is_empty(), "no second dial before the backoff");
        o.set_connected(&"a", true);
        let (actions, _) = o.poll(2 * MS);
        assert_eq!(sends(&actions), ids[..2], "in order, at most max_in_flight");
        assert!(o.on_ack(&"a", ids[0]).is_some());
        assert_eq!(sends(&o.poll(3 * MS).0), vec![ids[2]]);
    }

    #[test]
    fn a_full_queue_refuses_with_a_reason() {
        let mut o = outbox();
        for m in 0..4 {
            o.enqueue(0, &"a", m).unwrap();
        }
        let refused = o.enqueue(0, &"a", 9).unwrap_err();
        assert_eq!(refused.outcome, Outcome::Failed("queue full".into()));
        assert_eq!(o.counts(&"a").failed, 1);
    }

    #[test]
    fn failures_are_retried_with_growing_backoff_until_acked() {
        let mut o = outbox();
        o.set_connected(&"a", true);
        let id = o.enqueue(0, &"a", 1).unwrap();
        o.poll(0);
        assert!(o.on_failure(0, &"a", id, "stream reset").is_none(), "retried, not ended");
        assert!(sends(&o.poll(10 * MS).0).is_empty(), "waits at least half the base backoff");
        let (actions, _) = o.poll(60 * MS);
        assert_eq!(sends(&actions), vec![id]);
        let done = o.on_ack(&"a", id).unwrap();
        assert_eq!((done.outcome, done.attempts), (Outcome::Acked, 2));
        assert_eq!(o.counts(&"a").retried, 1);
    }

    #[test]
    fn a_message_ends_at_its_deadline_with_the_last_error() {
        let mut o = outbox();
        o.set_connected(&"a", true);
        let id = o.enqueue(0, &"a", 1).unwrap();
        o.poll(0);
        o.on_failure(MS, &"a", id, "connection closed");
        let (_, done) = o.poll(5_001 * MS);
        assert_eq!(done.len(), 1);
        match &done[0].outcome {
            Outcome::Failed(why) => assert!(why.contains("deadline") && why.contains("connection closed"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(o.pending(), 0);
        assert!(o.on_ack(&"a", id).is_none(), "a late ack does not end it twice");
    }

    #[test]
    fn a_message_that_never_leaves_the_queue_ends_after_the_queue_wait() {
        let mut o = outbox();
        o.enqueue(0, &"a", 1).unwrap();
        assert!(o.poll(29_000 * MS).1.is_empty(), "a peer down for a while keeps its messages");
        let (_, done) = o.poll(30_000 * MS);
        assert_eq!(done[0].outcome, Outcome::Failed("never sent: waited too long in the queue".into()));
    }

    #[test]
    fn in_flight_messages_without_an_answer_end_at_the_deadline() {
        let mut o = outbox();
        o.set_connected(&"a", true);
        o.enqueue(0, &"a", 1).unwrap();
        o.poll(0);
        let (_, done) = o.poll(5_001 * MS);
        assert_eq!(done.len(), 1);
        assert_eq!(o.counts(&"a").failed, 1);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Step {
            Enqueue,
            Connect(bool),
            Ack(usize),
            Fail(usize),
            Advance(u64),
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                4 => Just(Step::Enqueue),
                1 => any::<bool>().prop_map(Step::Connect),
                3 => any::<usize>().prop_map(Step::Ack),
                2 => any::<usize>().prop_map(Step::Fail),
                2 => (0u64..2_000).prop_map(|ms| Step::Advance(ms * MS)),
            ]
        }

        proptest! {
            /// Every message enqueued ends exactly once (acked or failed with a reason), the cap
            /// on messages in flight holds, and after the deadline nothing is left.
            #[test]
            fn every_message_ends_exactly_once(steps in proptest::collection::vec(step(), 1..200)) {
                let mut o: Outbox<u8, u32> = Outbox::new(OutboxConfig {
                    max_in_flight: 3, queue_per_peer: 8, ..OutboxConfig::default()
                });
                o.add_peer(1);
                let mut now = 0u64;
                let mut open: Vec<u64> = Vec::new();
                let mut in_flight: Vec<u64> = Vec::new();
                let mut ended: std::collections::HashSet<u64> = Default::default();
                let end = |d: Done<u8>, ended: &mut std::collections::HashSet<u64>| {
                    assert!(ended.insert(d.id), "message {} ended twice", d.id);
                };
                for s in steps {
                    match s {
                        Step::Enqueue => match o.enqueue(now, &1, 0) {
                            Ok(id) => open.push(id),
                            Err(d) => end(d, &mut ended),
                        },
                        Step::Connect(c) => o.set_connected(&1, c),
                        Step::Ack(i) if !in_flight.is_empty() => {
                            let id = in_flight.remove(i % in_flight.len());
                            if let Some(d) = o.on_ack(&1, id) { end(d, &mut ended) }
                        }
                        Step::Fail(i) if !in_flight.is_empty() => {
                            let id = in_flight.remove(i % in_flight.len());
                            if let Some(d) = o.on_failure(now, &1, id, "reset") { end(d, &mut ended) }
                        }
                        Step::Advance(d) => now += d,
                        _ => {}
                    }
                    let (actions, done) = o.poll(now);
                    for d in done { in_flight.retain(|i| *i != d.id); end(d, &mut ended); }
                    for a in actions {
                        if let Action::Send { id, .. } = a { in_flight.push(id); }
                    }
                    prop_assert!(o.depth(&1).1 <= 3);
                }
                // Past every deadline, everything has ended.
                let (_, done) = o.poll(now + 31_000 * MS);
                for d in done { end(d, &mut ended); }
                prop_assert_eq!(o.pending(), 0);
                for id in open { prop_assert!(ended.contains(&id), "message {} never ended", id); }
                let c = o.counts(&1);
                prop_assert_eq!(c.acked + c.failed, c.enqueued);
            }
        }
    }
}
