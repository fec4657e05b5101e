//! What the node keeps about each peer: where it is reached (bounded), its connections, and
//! whether it is owed the pool.

use std::time::Instant;

use libp2p::Multiaddr;

/// Where a peer can be reached, from the static list or from identify.
#[derive(Debug, Clone, Default)]
pub(super) struct PeerInfo {
    pub(super) addrs: Vec<Multiaddr>,
    pub(super) rtt_ms: Option<f64>,
    pub(super) connections: Vec<libp2p::swarm::ConnectionId>,
    /// A message to it failed since it was last handed the pool: it is handed the pool again
    /// (the pool still holds what failed; the peer may not).
    pub(super) owed: bool,
    /// When it was last handed the pool.
    pub(super) synced_at: Option<Instant>,
}

/// Addresses remembered per peer; a new one pushes out the oldest learned.
pub(super) const MAX_ADDRS_PER_PEER: usize = 8;
/// Peers remembered at most; peers discovered beyond it are not (connected ones always are).
pub(super) const MAX_KNOWN_PEERS: usize = 1_024;

impl PeerInfo {
    /// Remembers an address (bounded); whether it was new.
    pub(super) fn learn(&mut self, addr: Multiaddr) -> bool {
        if self.addrs.contains(&addr) {
            return false;
        }
        if self.addrs.len() >= MAX_ADDRS_PER_PEER {
            self.addrs.remove(0);
        }
        self.addrs.push(addr);
        true
    }
}

/// A peer owed the pool (after failures) is handed it at most this often.
pub(super) const RESYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_keeps_its_latest_addresses_only() {
        let mut info = PeerInfo::default();
        let addr = |port: u16| -> Multiaddr { format!("/ip4/127.0.0.1/udp/{port}/quic-v1").parse().unwrap() };
        for port in 0..20 {
            assert!(info.learn(addr(port)));
        }
        assert!(!info.learn(addr(19)), "a known address is not learned twice");
        assert_eq!(info.addrs, (12..20).map(addr).collect::<Vec<_>>());
    }
}
