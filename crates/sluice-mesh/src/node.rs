//! The libp2p node: the async shell around [`Outbox`]. One swarm task owns the swarm and the
//! outbox; it takes broadcasts from a bounded channel, sends each of the outbox's sends on a
//! stream of its own (request-response), and feeds answers and failures back to the outbox.
//! Inbound transactions go through the pool's intake (the same validation as local ones) on
//! tasks of their own, and their verdicts are the acknowledgement. Which peers already have a
//! transaction (they sent it to us) is remembered in [`Known`], so it is not sent back to them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::{keccak256, Bytes, B256};
use futures_util::StreamExt;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport, ResponseChannel};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, identity, kad, Multiaddr, PeerId, StreamProtocol, Swarm};
use serde::{Deserialize, Serialize};
use sluice_pool::{Origin, SubmitError, TxIntake};
use tokio::sync::{mpsc, oneshot};

use crate::chains::{ChainPool, UNNAMED_CHAIN};
use crate::conduct::Conduct;
use crate::config::MeshConfig;
use crate::known::Known;
use crate::outbox::{Action, Done, Outbox, Outcome, Weight};
use crate::status::{AckTimes, InboundCounts, MeshStatus, PeerStatus};

/// The protocol: one stream per send, carrying one transaction or (under a backlog) several,
/// answered with one verdict each.
pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/sluice/txs/1");

/// The Kademlia protocol of sluice meshes (not the IPFS DHT's, so the two never mix).
pub const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/sluice/kad/1.0.0");

/// Transactions in one request a node takes; a longer request is refused whole.
pub const MAX_BATCH_IN: usize = 1_024;

/// Bytes in one request a node reads (libp2p's CBOR codec default).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Transactions a node remembers who sent to it (bounded; the oldest are forgotten first).
const KNOWN_HASHES: usize = 100_000;

/// One request: transactions, each as raw EIP-2718 bytes, each with its chain id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TxBatch {
    /// The transactions, in the order the sender pooled them.
    pub txs: Vec<serde_bytes::ByteBuf>,
    /// The chain of each transaction, in the same order. Absent (a sender that names none):
    /// each for the receiver's first pool.
    #[serde(default)]
    pub chains: Vec<u64>,
}

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

/// The receiver's verdict: the application-level acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Taken into its pool.
    Accepted,
    /// Refused by validation (not retried, and never forwarded by the receiver).
    Invalid(String),
    /// The receiver could not take it now (busy, state unavailable): the sender retries.
    Unavailable(String),
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
    tx: request_response::cbor::Behaviour<TxBatch, Vec<Verdict>>,
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

/// A handle on a running mesh node.
#[derive(Clone)]
pub struct Mesh {
    commands: mpsc::Sender<Command>,
    /// The chain [`Mesh::broadcast`] names: the first pool's.
    first_chain: u64,
    peer_id: PeerId,
    listen: Arc<Vec<Multiaddr>>,
    refused: Arc<std::sync::atomic::AtomicU64>,
    latest: Arc<std::sync::Mutex<Option<MeshStatus>>>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh").field("peer_id", &self.peer_id).field("listen", &self.listen).finish()
    }
}

/// Where a peer can be reached, from the static list or from identify.
#[derive(Debug, Clone, Default)]
struct PeerInfo {
    addrs: Vec<Multiaddr>,
    rtt_ms: Option<f64>,
    connections: Vec<libp2p::swarm::ConnectionId>,
    /// A message to it failed since it was last handed the pool: it is handed the pool again
    /// (the pool still holds what failed; the peer may not).
    owed: bool,
    /// When it was last handed the pool.
    synced_at: Option<Instant>,
}

/// Addresses remembered per peer; a new one pushes out the oldest learned.
const MAX_ADDRS_PER_PEER: usize = 8;
/// Peers remembered at most; peers discovered beyond it are not (connected ones always are).
const MAX_KNOWN_PEERS: usize = 1_024;

impl PeerInfo {
    /// Remembers an address (bounded); whether it was new.
    fn learn(&mut self, addr: Multiaddr) -> bool {
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
const RESYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

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

/// The peer id in a multiaddr's trailing `/p2p/…`.
pub fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        libp2p::multiaddr::Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

impl Mesh {
    /// Starts a node of one pool, naming no chain ([`UNNAMED_CHAIN`]): see [`Mesh::start_chains`].
    pub async fn start(
        config: MeshConfig,
        key: identity::Keypair,
        intake: Arc<dyn TxIntake>,
        contents: Option<Arc<dyn PoolContents>>,
    ) -> Result<Mesh, MeshError> {
        Self::start_chains(config, key, vec![ChainPool { chain_id: UNNAMED_CHAIN, intake, contents }]).await
    }

    /// Starts a node with `key`, listening on `config.listen`, dialing `config.peers`, taking
    /// received transactions into their chain's pool in `chains`, and handing what each pool
    /// holds to each peer that connects. Returns once it listens.
    ///
    /// # Errors
    /// Bad settings, no pool, or a listen address that cannot be bound.
    pub async fn start_chains(
        config: MeshConfig,
        key: identity::Keypair,
        chains: Vec<ChainPool>,
    ) -> Result<Mesh, MeshError> {
        let first_chain = chains.first().map(|c| c.chain_id).ok_or_else(|| MeshError::Config("no pool".into()))?;
        register_metrics();
        let outbox_config = config.outbox();
        // Our sends to a peer are capped below this, and so are a well-behaved peer's to us.
        let streams = outbox_config.max_in_flight * 2 + 32;
        let codec = request_response::cbor::codec::Codec::default()
            .set_request_size_maximum(MAX_REQUEST_BYTES as u64)
            .set_response_size_maximum(MAX_BATCH_IN as u64 * 1024);
        let request_timeout = config.request_timeout;
        let discovery = config.discovery;
        let limits = libp2p::connection_limits::ConnectionLimits::default()
            .with_max_established(Some(config.max_connections))
            .with_max_established_per_peer(Some(2))
            .with_max_pending_incoming(Some(config.max_connections.min(256)));
        let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
            .with_tokio()
            .with_tcp(
                libp2p::tcp::Config::default().nodelay(true),
                libp2p::noise::Config::new,
                libp2p::yamux::Config::default,
            )
            .map_err(|e| MeshError::Config(e.to_string()))?
            // QUIC's defaults (10 s idle timeout, 5 s keep-alive): a shorter idle timeout turns a
            // busy process's late keep-alives into closed connections. A peer that restarts is
            // handled by closing the stale connection once it has a newer one (see below).
            .with_quic()
            .with_behaviour(|key| Behaviour {
                tx: request_response::Behaviour::with_codec(
                    codec,
                    [(PROTOCOL, ProtocolSupport::Full)],
                    request_response::Config::default()
                        .with_request_timeout(request_timeout)
                        .with_max_concurrent_streams(streams),
                ),
                identify: identify::Behaviour::new(identify::Config::new("/sluice/1".into(), key.public())),
                limits: libp2p::connection_limits::Behaviour::new(limits),
                blocked: Default::default(),
                kad: discovery
                    .then(|| {
                        let id = key.public().to_peer_id();
                        let mut kad = kad::Behaviour::with_config(
                            id,
                            kad::store::MemoryStore::new(id),
                            kad::Config::new(KAD_PROTOCOL),
                        );
                        // Serve lookups even without a confirmed external address (a node on a
                        // private network or loopback has none, and would stay a client).
                        kad.set_mode(Some(kad::Mode::Server));
                        kad
                    })
                    .into(),
            })
            .map_err(|e| MeshError::Config(e.to_string()))?
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
            .build();
        for addr in &config.listen {
            swarm
                .listen_on(addr.clone())
                .map_err(|e| MeshError::Listen { addr: addr.to_string(), message: e.to_string() })?;
        }
        // Wait for the listeners to report their addresses (ports chosen by the OS).
        let mut listen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while listen.len() < config.listen.len() {
            match tokio::time::timeout_at(deadline, swarm.select_next_some()).await {
                Ok(SwarmEvent::NewListenAddr { address, .. }) => listen.push(address),
                Ok(SwarmEvent::ListenerError { error, .. }) => {
                    return Err(MeshError::Listen { addr: format!("{:?}", config.listen), message: error.to_string() })
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let peer_id = *swarm.local_peer_id();
        let mut outbox = Outbox::new(outbox_config);
        let mut peers = HashMap::new();
        for addr in &config.peers {
            let Some(peer) = peer_of(addr) else {
                return Err(MeshError::Config(format!("peer address {addr} does not end in /p2p/PEER_ID")));
            };
            if peer == peer_id {
                continue;
            }
            outbox.keep_peer(peer);
            peers.entry(peer).or_insert_with(PeerInfo::default).addrs.push(addr.clone());
            swarm.add_peer_address(peer, addr.clone());
            if let Some(kad) = swarm.behaviour_mut().kad.as_mut() {
                kad.add_address(&peer, addr.clone());
            }
        }
        let (commands, commands_rx) = mpsc::channel(config.broadcast_queue.max(1));
        let (answers_tx, answers_rx) = mpsc::channel(4_096);
        let latest = Arc::new(std::sync::Mutex::new(None));
        let node = Node {
            latest: latest.clone(),
            published: Instant::now(),
            swarm,
            outbox,
            peers,
            requests: HashMap::new(),
            known: Known::new(KNOWN_HASHES),
            ack_times: hdrhistogram::Histogram::new_with_bounds(1, 600_000_000, 2)
                .map_err(|e| MeshError::Config(e.to_string()))?,
            inbound: InboundCounts::default(),
            chains: Arc::new(chains),
            sync_limit: config.sync_limit,
            target_peers: config.target_peers,
            conduct: Conduct::new(config.conduct),
            answers_tx,
            origin: Instant::now(),
            failures_logged: 0,
        };
        tokio::spawn(node.run(commands_rx, answers_rx, listen.clone()));
        Ok(Mesh { commands, first_chain, peer_id, listen: Arc::new(listen), refused: Default::default(), latest })
    }

    /// This node's peer id.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// The addresses it listens on, each ending in `/p2p/PEER_ID` (give them to other nodes).
    pub fn addresses(&self) -> Vec<Multiaddr> {
        self.listen.iter().map(|a| a.clone().with(libp2p::multiaddr::Protocol::P2p(self.peer_id))).collect()
    }

    /// Sends a transaction of the first pool's chain to every peer (except the one it came
    /// from): see [`Mesh::broadcast_on`].
    pub fn broadcast(&self, raw: Vec<u8>) -> Result<(), BroadcastRefused> {
        self.broadcast_on(self.first_chain, raw)
    }

    /// Sends a transaction of chain `chain_id` to every peer (except the one it came from).
    /// Refused at once, and counted, when the node's command queue is full.
    pub fn broadcast_on(&self, chain_id: u64, raw: Vec<u8>) -> Result<(), BroadcastRefused> {
        let command = Command::Broadcast(Arc::new(Tx { hash: keccak256(&raw), raw: raw.into(), chain_id }));
        self.commands.try_send(command).map_err(|_| {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!("sluice_mesh_broadcasts_refused_total").increment(1);
            BroadcastRefused
        })
    }

    /// Hands the whole pool to every connected peer again: for when this node fell behind its
    /// pool's feed and cannot tell which transactions it missed. Peers answer what they already
    /// hold at once.
    pub async fn resync(&self) {
        let _ = self.commands.send(Command::Resync).await;
    }

    /// Peers, queues and counters.
    pub async fn status(&self) -> Option<MeshStatus> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Status(tx)).await.ok()?;
        let mut status = rx.await.ok()?;
        status.broadcasts_refused = self.refused.load(std::sync::atomic::Ordering::Relaxed);
        Some(status)
    }

    /// The send-to-verdict time of every transaction this node sent, in microseconds.
    pub async fn ack_times(&self) -> Option<hdrhistogram::Histogram<u64>> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::AckTimes(tx)).await.ok()?;
        rx.await.ok()
    }

    /// The status as of at most half a second ago (for synchronous readers such as `/status`).
    pub fn latest_status(&self) -> Option<MeshStatus> {
        let mut status = self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        status.broadcasts_refused = self.refused.load(std::sync::atomic::Ordering::Relaxed);
        Some(status)
    }

    /// Stops the node (its connections close).
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// The node's command queue was full: the broadcast was not taken (and was counted).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("mesh busy: broadcast queue full")]
pub struct BroadcastRefused;

/// Verdicts on a peer's request, and how many of its transactions were malformed.
struct Answer {
    peer: PeerId,
    channel: ResponseChannel<Vec<Verdict>>,
    verdicts: Vec<Verdict>,
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

    /// Discovery: peers found by lookups are remembered and, while fewer than `target_peers` are
    /// connected, dialed; once connected they are peers like any other.
    fn on_kad(&mut self, event: kad::Event) {
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
    fn discover(&mut self) {
        if self.swarm.connected_peers().count() >= self.target_peers {
            return;
        }
        if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
            kad.get_closest_peers(PeerId::random());
        }
    }

    fn on_tx(&mut self, event: request_response::Event<TxBatch, Vec<Verdict>>) {
        use request_response::{Event, Message};
        match event {
            Event::Message { peer, message: Message::Request { request, channel, .. }, .. } => {
                let (txs, named) = (request.txs, request.chains);
                self.inbound.received += txs.len() as u64;
                self.inbound.requests += 1;
                if txs.len() > MAX_BATCH_IN {
                    let why = format!("{} transactions in one request; at most {MAX_BATCH_IN}", txs.len());
                    let _ =
                        self.swarm.behaviour_mut().tx.send_response(channel, vec![Verdict::Invalid(why); txs.len()]);
                    self.judge(peer, txs.len() as u64);
                    return;
                }
                // Before the pool sees them: its pending feed may ask us to broadcast them at
                // once, and they must not go back to where they came from.
                for raw in &txs {
                    self.known.insert(keccak256(raw), peer);
                }
                let chains = self.chains.clone();
                let answers = self.answers_tx.clone();
                tokio::spawn(async move {
                    // All at once, in order: the pool takes a sender's nonces as they come.
                    let (mut malformed, mut unserved) = (0, 0);
                    let verdicts = futures_util::future::join_all(txs.into_iter().enumerate().map(|(i, raw)| {
                        let chain = (!named.is_empty()).then(|| named.get(i).copied().unwrap_or(u64::MAX));
                        let intake = crate::chains::pool_for(&chains, chain).map(|p| p.intake.clone());
                        async move {
                            match intake {
                                Some(intake) => Some(intake.submit(raw.into_vec().into(), Origin::Peer).await),
                                None => None,
                            }
                        }
                    }))
                    .await
                    .into_iter()
                    .enumerate()
                    .map(|(i, result)| match result {
                        None => {
                            // Not held against the sender: it does not know which chains we serve.
                            unserved += 1;
                            Verdict::Invalid(format!("chain {} is not served by this node", named[i]))
                        }
                        Some(Ok(_)) => Verdict::Accepted,
                        Some(Err(e @ (SubmitError::Busy | SubmitError::Unavailable(_)))) => {
                            Verdict::Unavailable(e.to_string())
                        }
                        Some(Err(e)) => {
                            // Failing the stateless rules: the sender did not check it.
                            malformed += matches!(e, SubmitError::Invalid(_)) as u64;
                            Verdict::Invalid(e.to_string())
                        }
                    })
                    .collect();
                    let _ = answers.send(Answer { peer, channel, verdicts, malformed, unserved }).await;
                });
            }
            Event::Message { peer, message: Message::Response { request_id, response }, .. } => {
                let Some((send, sent)) = self.requests.remove(&request_id) else { return };
                let elapsed = sent.elapsed();
                let rtt = elapsed.as_secs_f64() * 1e3;
                let info = self.peers.entry(peer).or_default();
                info.rtt_ms = Some(info.rtt_ms.map_or(rtt, |r| 0.8 * r + 0.2 * rtt));
                let verdicts: Vec<Result<(), String>> = response
                    .into_iter()
                    .map(|verdict| match verdict {
                        Verdict::Accepted => Ok(()),
                        Verdict::Unavailable(why) => Err(why),
                        Verdict::Invalid(why) => {
                            // Delivered and judged: acknowledged, not retried, counted.
                            metrics::counter!("sluice_mesh_peer_refused_total").increment(1);
                            tracing::debug!(%peer, %why, "peer refused a transaction");
                            Ok(())
                        }
                    })
                    .collect();
                let acked = verdicts.iter().filter(|v| v.is_ok()).count() as u64;
                let _ = self.ack_times.record_n((elapsed.as_micros() as u64).max(1), acked);
                for done in self.outbox.on_answer(self.now(), &peer, send, &verdicts) {
                    self.finished(done);
                }
                self.pump(&peer);
            }
            Event::OutboundFailure { peer, connection_id, request_id, error } => {
                let newer = self.peers.get(&peer).is_some_and(|p| p.connections.iter().any(|c| *c != connection_id));
                if matches!(error, request_response::OutboundFailure::Timeout) && newer {
                    // The peer has another connection (it restarted and dialed us anew while the
                    // old one lingers until QUIC's idle timeout): close the silent one, so
                    // retries use the live one. A peer's only connection is never closed for
                    // slowness, which under load would turn delay into a cascade of failures.
                    self.swarm.close_connection(connection_id);
                }
                let Some((send, _)) = self.requests.remove(&request_id) else { return };
                metrics::counter!("sluice_mesh_send_failures_total").increment(1);
                for done in self.outbox.on_failure(self.now(), &peer, send, &error.to_string()) {
                    self.finished(done);
                }
            }
            Event::InboundFailure { peer, error, .. } => {
                self.inbound.failed += 1;
                metrics::counter!("sluice_mesh_inbound_failures_total").increment(1);
                if self.inbound.failed <= 20 || self.inbound.failed.is_power_of_two() {
                    tracing::warn!(%peer, %error, failures = self.inbound.failed, "mesh inbound stream failed");
                }
            }
            Event::ResponseSent { .. } => {}
        }
    }

    /// Counts `malformed` transactions against `peer`, and bans it when that is too many.
    fn judge(&mut self, peer: PeerId, malformed: u64) {
        if malformed == 0 {
            return;
        }
        self.inbound.malformed += malformed;
        metrics::counter!("sluice_mesh_malformed_total").increment(malformed);
        if self.conduct.malformed(self.now(), &peer, malformed) {
            self.inbound.bans += 1;
            metrics::counter!("sluice_mesh_bans_total").increment(1);
            let ban_for = self.conduct.config().ban_for;
            tracing::warn!(%peer, ?ban_for, "mesh peer banned: it sent transactions no honest node forwards");
            // Closes its connections and refuses new ones, both ways. What we had queued for it
            // fails in the outbox as for any unreachable peer (counted).
            self.swarm.behaviour_mut().blocked.block_peer(peer);
        }
    }

    /// Lets back the peers whose ban is over.
    fn end_bans(&mut self) {
        for peer in self.conduct.expire(self.now()) {
            tracing::info!(%peer, "mesh peer ban over");
            self.swarm.behaviour_mut().blocked.unblock_peer(peer);
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
