//! The handle on a running node ([`Mesh`]): starting one (the swarm, its transports and
//! behaviours, the static peers), and the commands the rest of sluice sends it.

use super::*;

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
            .with_swarm_config(|c| {
                c.with_idle_connection_timeout(Duration::from_secs(3600))
                    // Every outbound stream offers one protocol its peer serves (a transaction
                    // batch, identify, Kademlia to peers that announced it), so the protocol
                    // is sent with the first data instead of waiting a round trip for the
                    // peer's confirmation: one flight fewer per message.
                    .with_substream_upgrade_protocol_override(libp2p::core::upgrade::Version::V1Lazy)
            })
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
