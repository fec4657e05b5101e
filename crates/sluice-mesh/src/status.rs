//! What `/status` shows of the mesh.

use serde::Serialize;

use crate::outbox::PeerCounts;

/// Transactions received from peers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct InboundCounts {
    /// Transactions received.
    pub received: u64,
    /// Requests (streams) received.
    pub requests: u64,
    /// Inbound streams that failed (timeout, reset, closed before the answer).
    pub failed: u64,
    /// Transactions no honest node forwards (undecodable, bad signature, wrong chain), which
    /// count towards a ban.
    pub malformed: u64,
    /// Peers banned, since start.
    pub bans: u64,
    /// Transactions of chains this node does not serve, refused (not held against the sender).
    pub unserved_chain: u64,
}

/// One peer.
#[derive(Debug, Clone, Serialize)]
pub struct PeerStatus {
    /// Its peer id.
    pub peer: String,
    /// Connected now.
    pub connected: bool,
    /// Where it can be reached.
    pub addresses: Vec<String>,
    /// Smoothed time from send to acknowledgement, ms.
    pub rtt_ms: Option<f64>,
    /// Messages waiting for it.
    pub queued: usize,
    /// Messages in flight to it.
    pub in_flight: usize,
    /// Enqueued, sent, acked, failed, retried.
    pub counts: PeerCounts,
    /// Seconds left of its ban, if it is banned (its connections are refused meanwhile).
    pub banned_for_s: Option<f64>,
}

/// Send-to-verdict times, ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct AckTimes {
    /// Transactions acknowledged.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Longest.
    pub max: f64,
}

impl AckTimes {
    /// From a histogram of microseconds.
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1e3;
        AckTimes {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        }
    }
}

/// The whole mesh node.
#[derive(Debug, Clone, Serialize)]
pub struct MeshStatus {
    /// This node.
    pub peer_id: String,
    /// Where it listens.
    pub listen: Vec<String>,
    /// Its peers.
    pub peers: Vec<PeerStatus>,
    /// What peers sent it.
    pub inbound: InboundCounts,
    /// Send-to-verdict time of the transactions it sent, since start.
    pub ack_ms: AckTimes,
    /// Broadcasts refused because the node's queue was full.
    pub broadcasts_refused: u64,
}

impl MeshStatus {
    /// Messages that failed, over all peers.
    pub fn failed(&self) -> u64 {
        self.peers.iter().map(|p| p.counts.failed).sum()
    }

    /// Messages acknowledged, over all peers.
    pub fn acked(&self) -> u64 {
        self.peers.iter().map(|p| p.counts.acked).sum()
    }

    /// Messages not ended yet, over all peers.
    pub fn pending(&self) -> usize {
        self.peers.iter().map(|p| p.queued + p.in_flight).sum()
    }
}
