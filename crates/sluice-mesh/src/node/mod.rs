//! The libp2p node: the async shell around [`Outbox`]. One swarm task owns the swarm and the
//! outbox; it takes broadcasts from a bounded channel, sends each of the outbox's sends on a
//! stream of its own (request-response), and feeds answers and failures back to the outbox.
//! Inbound transactions go through the pool's intake (the same validation as local ones) on
//! tasks of their own, and their verdicts are the acknowledgement. Which peers already have a
//! transaction (they sent it to us) is remembered in [`Known`], so it is not sent back to them.
//!
//! Split by concern: the handle and start (`handle`), what is kept per peer (`peers`),
//! inbound requests and conduct (`inbound`), discovery (`discovery`); the wire format is
//! `crate::wire`. This file holds the swarm task's loop and the outbound side.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::{keccak256, Bytes, B256};
use futures_util::StreamExt;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport, ResponseChannel};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, identity, kad, Multiaddr, PeerId, Swarm};
use sluice_mempool::TxIntake;
use tokio::sync::{mpsc, oneshot};

use crate::chains::{ChainPool, UNNAMED_CHAIN};
use crate::conduct::Conduct;
use crate::config::MeshConfig;
use crate::known::Known;
use crate::outbox::{Action, Done, Outbox, Outcome, Weight};
use crate::wire::{peer_of, Ack, TxBatch, KAD_PROTOCOL, MAX_BATCH_IN, MAX_REQUEST_BYTES, PROTOCOL};

mod discovery;
mod handle;
mod inbound;
mod peers;

pub use handle::{BroadcastRefused, Mesh};

use crate::status::{AckTimes, InboundCounts, MeshStatus, PeerStatus};
use peers::{PeerInfo, RESYNC_EVERY};

/// Transactions a node remembers who sent to it (bounded; the oldest are forgotten first).
const KNOWN_HASHES: usize = 100_000;

/// What a node's pool holds, handed to each peer when it connects (and to every peer when
/// the node fell behind its pool's feed), so that a node that joins, or was away longer than
/// the outbox keeps messages, catches up on the whole pool and not only on what comes next.
pub trait PoolContents: Send + Sync + 'static {
    /// Every transaction held, as (hash, raw bytes), each sender's in nonce order.
    fn transactions(&self) -> Vec<(B256, Bytes)>;
}

/// One transaction waiting for a peer.
#[derive(Debug)]
struct Tx {
    hash: B256,
    raw: Bytes,
    chain_id: u64,
}

impl Weight for Tx {
    fn weight(&self) -> usize {
        self.raw.len() + 8
    }
}

/// The behaviours, in the order the swarm asks them about a new connection. The ones that may
/// deny it (the block list, the limits) come first: a behaviour asked before a later one denies
/// the connection has already recorded it, and request-response would then keep a phantom
/// connection (its sends go nowhere, and a debug build panics when the peer's last real
/// connection closes; rust-libp2p PR #6601).
#[derive(NetworkBehaviour)]
struct Behaviour {
    /// Banned peers: their connections are closed and refused.
    blocked: libp2p::allow_block_list::Behaviour<libp2p::allow_block_list::BlockedPeers>,
    limits: libp2p::connection_limits::Behaviour,
    tx: request_response::cbor::Behaviour<TxBatch, Vec<Ack>>,
    identify: identify::Behaviour,
    /// Discovery, when configured.
    kad: libp2p::swarm::behaviour::toggle::Toggle<kad::Behaviour<kad::store::MemoryStore>>,
}

enum Command {
    Broadcast(Arc<Tx>),
    Resync,
    Status(oneshot::Sender<MeshStatus>),
    AckTimes(oneshot::Sender<hdrhistogram::Histogram<u64>>),
    Shutdown(oneshot::Sender<()>),
}

/// Why the mesh could not start.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// Bad settings or key.
    #[error("mesh: {0}")]
    Config(String),
    /// A listen address could not be bound.
    #[error("mesh cannot listen on {addr}: {message}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        message: String,
    },
}

struct Node {
    swarm: Swarm<Behaviour>,
    outbox: Outbox<PeerId, Arc<Tx>>,
    peers: HashMap<PeerId, PeerInfo>,
    /// Outbound request → (outbox send, sent at).
    requests: HashMap<OutboundRequestId, (u64, Instant)>,
    /// Which peers sent us which transaction recently: it is not sent back to them.
    known: Known<B256, PeerId>,
    /// Send-to-verdict time of each transaction, microseconds.
    ack_times: hdrhistogram::Histogram<u64>,
    inbound: InboundCounts,
    /// The pools of the chains this node serves.
    chains: Arc<Vec<ChainPool>>,
    sync_limit: usize,
    /// With discovery: peers found are dialed while fewer than this are connected.
    target_peers: usize,
    /// Who sent what no honest node forwards; who is banned.
    conduct: Conduct<PeerId>,
    answers_tx: mpsc::Sender<Answer>,
    origin: Instant,
    failures_logged: u64,
    latest: Arc<std::sync::Mutex<Option<MeshStatus>>>,
    published: Instant,
}

/// Verdicts on a peer's request, and how many of its transactions were malformed.
struct Answer {
    peer: PeerId,
    channel: ResponseChannel<Vec<Ack>>,
    verdicts: Vec<Ack>,
    malformed: u64,
    /// Transactions of chains this node does not serve.
    unserved: u64,
}

impl Node {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut answers: mpsc::Receiver<Answer>,
        listen: Vec<Multiaddr>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut ticks = 0u64;
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm(event),
                command = commands.recv() => match command {
                    Some(Command::Broadcast(tx)) => self.broadcast(tx),
                    Some(Command::Resync) => {
                        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                        for peer in peers {
                            self.sync(peer);
                        }
                    }
                    Some(Command::Status(reply)) => { let _ = reply.send(self.status(&listen)); }
                    Some(Command::AckTimes(reply)) => { let _ = reply.send(self.ack_times.clone()); }
                    Some(Command::Shutdown(done)) => { let _ = done.send(()); return; }
                    None => return,
                },
                Some(answer) = answers.recv() => {
                    // A failure to answer (the peer went away) surfaces on its side as a
                    // failed request, which it retries.
                    let _ = self.swarm.behaviour_mut().tx.send_response(answer.channel, answer.verdicts);
                    if answer.unserved > 0 {
                        self.inbound.unserved_chain += answer.unserved;
                        metrics::counter!("sluice_mesh_unserved_chain_total").increment(answer.unserved);
                    }
                    self.judge(answer.peer, answer.malformed);
                }
                _ = tick.tick() => {
                    self.poll();
                    ticks += 1;
                    if ticks % 40 == 1 {
                        // Every 2 s.
                        self.discover();
                        self.end_bans();
                        self.settle_debts();
                    }
                    if self.published.elapsed() >= Duration::from_millis(500) {
                        self.published = Instant::now();
                        let status = self.status(&listen);
                        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
                    }
                }
            }
        }
    }

    fn broadcast(&mut self, tx: Arc<Tx>) {
        let now = self.now();
        let peers: Vec<PeerId> = self.outbox.peers().copied().filter(|p| !self.known.has(&tx.hash, p)).collect();
        for peer in peers {
            match self.outbox.enqueue(now, &peer, tx.clone()) {
                Ok(_) => self.pump(&peer),
                Err(done) => self.finished(done),
            }
        }
    }

    /// Queues what the pool holds for `peer` (up to `sync_limit`, and what its queue has room
    /// for), skipping what it is known to have.
    fn sync(&mut self, peer: PeerId) {
        if self.sync_limit == 0 {
            return;
        }
        let info = self.peers.entry(peer).or_default();
        info.owed = false;
        info.synced_at = Some(Instant::now());
        let room = self.outbox.config().queue_per_peer.saturating_sub(self.outbox.depth(&peer).0 + 1);
        let chains = self.chains.clone();
        let txs = chains
            .iter()
            .filter_map(|c| Some((c.chain_id, c.contents.as_ref()?.transactions())))
            .flat_map(|(chain_id, txs)| txs.into_iter().map(move |(hash, raw)| Tx { hash, raw, chain_id }));
        let now = self.now();
        let mut queued = 0;
        for tx in txs.take(self.sync_limit.min(room)) {
            if self.known.has(&tx.hash, &peer) {
                continue;
            }
            match self.outbox.enqueue(now, &peer, Arc::new(tx)) {
                Ok(_) => queued += 1,
                Err(done) => self.finished(done),
            }
        }
        if queued > 0 {
            tracing::debug!(%peer, queued, "pool handed to a peer");
            metrics::counter!("sluice_mesh_synced_total").increment(queued);
        }
        self.pump(&peer);
    }

    /// Hands the pool again to each connected peer that messages failed to since it was last
    /// handed it (at most every [`RESYNC_EVERY`]): a message that failed (its stream died with
    /// the peer's old process, a deadline under load) is still in our pool and maybe not in
    /// theirs, and nothing else would send it again.
    fn settle_debts(&mut self) {
        let owed: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(peer, info)| {
                info.owed
                    && self.outbox.is_connected(peer)
                    && info.synced_at.is_none_or(|at| at.elapsed() >= RESYNC_EVERY)
            })
            .map(|(peer, _)| *peer)
            .collect();
        for peer in owed {
            metrics::counter!("sluice_mesh_resyncs_total").increment(1);
            self.sync(peer);
        }
    }

    /// Sends what is ready for `peer`, skipping what it already has.
    fn pump(&mut self, peer: &PeerId) {
        let known = &self.known;
        let (actions, done) = self.outbox.pump(self.now(), peer, &mut |p, tx| known.has(&tx.hash, p));
        for d in done {
            self.finished(d);
        }
        self.act(actions);
    }

    fn poll(&mut self) {
        let known = &self.known;
        let (actions, done) = self.outbox.poll(self.now(), &mut |p, tx| known.has(&tx.hash, p));
        for d in done {
            self.finished(d);
        }
        self.act(actions);
    }

    fn act(&mut self, actions: Vec<Action<PeerId, Arc<Tx>>>) {
        for action in actions {
            match action {
                Action::Send { peer, send, messages, .. } => {
                    let batch = TxBatch {
                        txs: messages.iter().map(|m| serde_bytes::ByteBuf::from(m.raw.to_vec())).collect(),
                        chains: messages.iter().map(|m| m.chain_id).collect(),
                    };
                    let request = self.swarm.behaviour_mut().tx.send_request(&peer, batch);
                    self.requests.insert(request, (send, Instant::now()));
                    metrics::counter!("sluice_mesh_sends_total").increment(1);
                }
                Action::Dial(peer) => {
                    let addrs = self.peers.get(&peer).map(|p| p.addrs.clone()).unwrap_or_default();
                    let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer).addresses(addrs).build();
                    if let Err(e) = self.swarm.dial(opts) {
                        tracing::debug!(%peer, error = %e, "mesh dial not started");
                    }
                }
            }
        }
    }

    fn finished(&mut self, done: Done<PeerId>) {
        match &done.outcome {
            Outcome::Acked => metrics::counter!("sluice_mesh_messages_total", "outcome" => "acked").increment(1),
            Outcome::Skipped => metrics::counter!("sluice_mesh_messages_total", "outcome" => "skipped").increment(1),
            Outcome::Failed(why) => {
                metrics::counter!("sluice_mesh_messages_total", "outcome" => "failed").increment(1);
                if let Some(info) = self.peers.get_mut(&done.peer) {
                    info.owed = true;
                }
                // Every failure is counted; the log is rate-limited so a dead peer cannot flood it.
                self.failures_logged += 1;
                if self.failures_logged <= 20 || self.failures_logged.is_power_of_two() {
                    tracing::warn!(peer = %done.peer, attempts = done.attempts, reason = %why, failures = self.failures_logged, "mesh message not delivered");
                }
            }
        }
    }

    fn on_swarm(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::ConnectionEstablished { peer_id, endpoint, connection_id, .. } => {
                self.outbox.add_peer(peer_id);
                self.outbox.set_connected(&peer_id, true);
                self.peers.entry(peer_id).or_default().connections.push(connection_id);
                if endpoint.is_dialer() {
                    let info = self.peers.entry(peer_id).or_default();
                    info.learn(endpoint.get_remote_address().clone());
                }
                metrics::gauge!("sluice_mesh_peers_connected").set(self.swarm.connected_peers().count() as f64);
                // A peer new to us, or back after being away, gets the whole pool. So does one
                // that opens another connection: a peer that restarted dials anew while its old
                // connection lingers here until QUIC's idle timeout, and what was in flight on
                // that one is lost with the process (the sync skips what it is known to have,
                // and its pool answers duplicates at once).
                self.sync(peer_id);
            }
            SwarmEvent::ConnectionClosed { peer_id, num_established, connection_id, .. } => {
                if let Some(info) = self.peers.get_mut(&peer_id) {
                    info.connections.retain(|c| *c != connection_id);
                }
                if num_established == 0 {
                    self.outbox.set_connected(&peer_id, false);
                }
                metrics::gauge!("sluice_mesh_peers_connected").set(self.swarm.connected_peers().count() as f64);
            }
            SwarmEvent::OutgoingConnectionError { peer_id: Some(peer), error, .. } => {
                tracing::debug!(%peer, %error, "mesh dial failed");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. })) => {
                // Their own listen addresses: what to re-dial after they restart, and, with
                // discovery, what to tell others who look for them.
                let serves_kad = info.protocols.contains(&KAD_PROTOCOL);
                let entry = self.peers.entry(peer_id).or_default();
                for addr in info.listen_addrs {
                    if serves_kad {
                        if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
                            kad.add_address(&peer_id, addr.clone());
                        }
                    }
                    if entry.learn(addr.clone()) {
                        self.swarm.add_peer_address(peer_id, addr);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Tx(event)) => self.on_tx(event),
            SwarmEvent::Behaviour(BehaviourEvent::Kad(event)) => self.on_kad(event),
            _ => {}
        }
    }

    fn status(&self, listen: &[Multiaddr]) -> MeshStatus {
        let mut peers: Vec<PeerStatus> = self
            .outbox
            .peers()
            .map(|peer| {
                let (queued, in_flight) = self.outbox.depth(peer);
                let info = self.peers.get(peer);
                PeerStatus {
                    peer: peer.to_string(),
                    connected: self.swarm.is_connected(peer),
                    addresses: info.map(|i| i.addrs.iter().map(|a| a.to_string()).collect()).unwrap_or_default(),
                    rtt_ms: info.and_then(|i| i.rtt_ms),
                    queued,
                    in_flight,
                    counts: self.outbox.counts(peer),
                    banned_for_s: self
                        .conduct
                        .banned_until(peer)
                        .map(|until| until.saturating_sub(self.now()) as f64 / 1e9),
                }
            })
            .collect();
        peers.sort_by(|a, b| a.peer.cmp(&b.peer));
        MeshStatus {
            peer_id: self.swarm.local_peer_id().to_string(),
            listen: listen.iter().map(|a| a.to_string()).collect(),
            peers,
            inbound: self.inbound,
            ack_ms: AckTimes::of(&self.ack_times),
            broadcasts_refused: 0,
        }
    }
}

/// Registers the mesh's counters at zero, so that dashboards and alerts see them before the
/// first send, failure or ban.
fn register_metrics() {
    for name in [
        "sluice_mesh_sends_total",
        "sluice_mesh_send_failures_total",
        "sluice_mesh_inbound_failures_total",
        "sluice_mesh_malformed_total",
        "sluice_mesh_bans_total",
        "sluice_mesh_peer_refused_total",
        "sluice_mesh_broadcasts_refused_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for outcome in ["acked", "skipped", "failed"] {
        metrics::counter!("sluice_mesh_messages_total", "outcome" => outcome).increment(0);
    }
    metrics::gauge!("sluice_mesh_peers_connected").set(0.0);
}
