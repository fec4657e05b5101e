//! The outbox's public types: its settings, what it asks the node to do, and how messages end.

use std::sync::Arc;
use std::time::Duration;

/// A message's size on the wire, for the byte cap on a send.
pub trait Weight {
    /// Bytes.
    fn weight(&self) -> usize;
}

impl<T: Weight + ?Sized> Weight for Arc<T> {
    fn weight(&self) -> usize {
        (**self).weight()
    }
}

/// Delivery settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Sends (streams) in flight to one peer at once, kept under the peer's stream limit so that
    /// no inbound stream is ever dropped for being over it.
    pub max_in_flight: usize,
    /// Messages in one send (1: strictly one message per stream).
    pub max_batch: usize,
    /// Bytes in one send (a single larger message still goes, alone).
    pub max_batch_bytes: usize,
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
            max_in_flight: 2,
            max_batch: 512,
            max_batch_bytes: 256 * 1024,
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
    /// Not sent: the peer already had it (it sent it to us).
    Skipped,
    /// It was not delivered: why.
    Failed(String),
}

/// What the node must do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<P, M> {
    /// Send `messages` (one stream) to `peer`; report back with `send`.
    Send {
        /// To whom.
        peer: P,
        /// Report `on_answer` / `on_failure` with this.
        send: u64,
        /// The messages' ids, in order.
        ids: Vec<u64>,
        /// The payloads, in order; the answer has one verdict for each.
        messages: Vec<M>,
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
    /// Messages sent (attempts).
    pub sent: u64,
    /// Sends, that is streams opened.
    pub streams: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Messages not sent because the peer already had them.
    pub skipped: u64,
    /// Messages that failed.
    pub failed: u64,
    /// Retries scheduled.
    pub retried: u64,
}
