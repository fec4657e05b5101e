//! Discovery (Kademlia, when configured): peers found by lookups are remembered (bounded) and
//! dialed while fewer than `target_peers` are connected.

use libp2p::{kad, Multiaddr, PeerId};

use super::peers::MAX_KNOWN_PEERS;
use super::Node;

impl Node {
    /// Discovery: peers found by lookups are remembered and, while fewer than `target_peers` are
    /// connected, dialed; once connected they are peers like any other.
    pub(super) fn on_kad(&mut self, event: kad::Event) {
        let found: Vec<(PeerId, Vec<Multiaddr>)> = match event {
            kad::Event::RoutingUpdated { peer, addresses, .. } => vec![(peer, addresses.into_vec())],
            kad::Event::OutboundQueryProgressed { result: kad::QueryResult::GetClosestPeers(Ok(ok)), .. } => {
                ok.peers.into_iter().map(|p| (p.peer_id, p.addrs)).collect()
            }
            _ => return,
        };
        let me = *self.swarm.local_peer_id();
        for (peer, addrs) in found {
            if peer == me {
                continue;
            }
            if !self.peers.contains_key(&peer) && self.peers.len() >= MAX_KNOWN_PEERS {
                // Bounded: a lookup can name any number of peers.
                metrics::counter!("sluice_mesh_discovered_unkept_total").increment(1);
                continue;
            }
            let info = self.peers.entry(peer).or_default();
            for addr in addrs {
                info.learn(addr);
            }
            if self.swarm.connected_peers().count() < self.target_peers && !self.swarm.is_connected(&peer) {
                self.outbox.add_peer(peer);
                let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer).addresses(info.addrs.clone()).build();
                if let Err(e) = self.swarm.dial(opts) {
                    tracing::debug!(%peer, error = %e, "mesh discovery dial not started");
                }
            }
        }
    }

    /// With discovery and fewer than `target_peers` connected: look for more (a random key's
    /// closest peers).
    pub(super) fn discover(&mut self) {
        if self.swarm.connected_peers().count() >= self.target_peers {
            return;
        }
        if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
            kad.get_closest_peers(PeerId::random());
        }
    }
}
