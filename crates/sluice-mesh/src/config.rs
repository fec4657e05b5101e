//! `[mesh]`: the operator's settings, and the node's key file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use libp2p::{identity, Multiaddr};
use serde::{Deserialize, Serialize};

use crate::conduct::ConductConfig;
use crate::outbox::OutboxConfig;

/// The mesh settings as written in the configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshSettings {
    /// Addresses to listen on (QUIC first; TCP with noise and yamux as the fallback).
    pub listen: Vec<String>,
    /// The node's key file (made on first start).
    pub key: PathBuf,
    /// Peers to dial, each `…/p2p/PEER_ID`. Peers that dial in are served too.
    pub peers: Vec<String>,
    /// Connections at once.
    pub max_connections: u32,
    /// Streams in flight per peer (each carries one send).
    pub max_in_flight: usize,
    /// Transactions in one send when a backlog builds up (1: one transaction per stream always).
    pub max_batch: usize,
    /// Bytes in one send.
    pub max_batch_bytes: usize,
    /// Messages waiting per peer before broadcasts to it are refused (and counted).
    pub queue_per_peer: usize,
    /// A message not acknowledged within this of its first send has failed (counted and logged).
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// A message not sent within this of being queued has failed (a peer down for long).
    #[serde(with = "humantime_serde")]
    pub max_queue_wait: Duration,
    /// Attempts per message.
    pub max_attempts: u32,
    /// The first retry's wait (doubling, with jitter).
    #[serde(with = "humantime_serde")]
    pub base_backoff: Duration,
    /// The longest retry wait.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// One attempt's timeout.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Broadcasts waiting for the node's task.
    pub broadcast_queue: usize,
    /// Transactions of the pool handed to a peer when it connects (0: none; it then gets only
    /// what is broadcast from then on).
    pub sync_limit: usize,
    /// Find more peers through Kademlia (protocol `/sluice/kad/1.0.0`), starting from `peers`.
    pub discovery: bool,
    /// With discovery, peers found are dialed while fewer than this are connected.
    pub target_peers: usize,
    /// Malformed transactions from one peer (undecodable, bad signature, wrong chain: what no
    /// honest node forwards), decaying with `malformed_half_life`, past which it is banned
    /// (0: never).
    pub ban_after_malformed: u32,
    /// The malformed count halves every this long.
    #[serde(with = "humantime_serde")]
    pub malformed_half_life: Duration,
    /// How long a ban lasts: the peer's connections are closed and refused.
    #[serde(with = "humantime_serde")]
    pub ban_for: Duration,
}

impl Default for MeshSettings {
    fn default() -> Self {
        let o = OutboxConfig::default();
        let c = ConductConfig::default();
        MeshSettings {
            listen: vec!["/ip4/127.0.0.1/udp/0/quic-v1".into(), "/ip4/127.0.0.1/tcp/0".into()],
            key: PathBuf::from(".sluice/mesh.key"),
            peers: Vec::new(),
            max_connections: 512,
            max_in_flight: o.max_in_flight,
            max_batch: o.max_batch,
            max_batch_bytes: o.max_batch_bytes,
            queue_per_peer: o.queue_per_peer,
            deadline: o.deadline,
            max_queue_wait: o.max_queue_wait,
            max_attempts: o.max_attempts,
            base_backoff: o.base_backoff,
            max_backoff: o.max_backoff,
            request_timeout: Duration::from_secs(2),
            broadcast_queue: 100_000,
            sync_limit: 50_000,
            discovery: false,
            target_peers: 8,
            ban_after_malformed: c.limit,
            malformed_half_life: c.half_life,
            ban_for: c.ban_for,
        }
    }
}

/// The settings, checked and parsed.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// Listen addresses.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial.
    pub peers: Vec<Multiaddr>,
    /// Connections at once.
    pub max_connections: u32,
    /// One attempt's timeout.
    pub request_timeout: Duration,
    /// Broadcasts waiting for the node's task.
    pub broadcast_queue: usize,
    /// Pool transactions handed to a peer when it connects.
    pub sync_limit: usize,
    /// Kademlia discovery on.
    pub discovery: bool,
    /// With discovery, dial found peers while fewer than this are connected.
    pub target_peers: usize,
    /// Delivery rules.
    pub outbox: OutboxConfig,
    /// When a peer is banned.
    pub conduct: ConductConfig,
}

impl MeshConfig {
    /// The delivery rules.
    pub fn outbox(&self) -> OutboxConfig {
        self.outbox.clone()
    }
}

impl MeshSettings {
    /// Checks and parses the settings.
    pub fn parse(&self) -> Result<MeshConfig, String> {
        let addr = |what: &str, s: &String| s.parse::<Multiaddr>().map_err(|e| format!("mesh.{what}: {s:?}: {e}"));
        let listen = self.listen.iter().map(|s| addr("listen", s)).collect::<Result<Vec<_>, _>>()?;
        let peers = self.peers.iter().map(|s| addr("peers", s)).collect::<Result<Vec<_>, _>>()?;
        if listen.is_empty() {
            return Err("mesh.listen: give at least one address".into());
        }
        if let Some(p) = peers.iter().find(|p| crate::wire::peer_of(p).is_none()) {
            return Err(format!("mesh.peers: {p} does not end in /p2p/PEER_ID"));
        }
        let counts =
            [self.max_in_flight, self.max_batch, self.queue_per_peer, self.max_attempts as usize, self.broadcast_queue];
        if counts.contains(&0) {
            return Err(
                "mesh: max_in_flight, max_batch, queue_per_peer, max_attempts and broadcast_queue must be at least 1"
                    .into(),
            );
        }
        if self.max_batch > crate::wire::MAX_BATCH_IN || self.max_batch_bytes > crate::wire::MAX_REQUEST_BYTES / 2 {
            return Err(format!(
                "mesh: max_batch is at most {} and max_batch_bytes at most {} (what a peer takes)",
                crate::wire::MAX_BATCH_IN,
                crate::wire::MAX_REQUEST_BYTES / 2
            ));
        }
        if self.deadline.is_zero() || self.request_timeout.is_zero() || self.malformed_half_life.is_zero() {
            return Err("mesh: deadline, request_timeout and malformed_half_life must be more than zero".into());
        }
        Ok(MeshConfig {
            listen,
            peers,
            max_connections: self.max_connections.max(1),
            request_timeout: self.request_timeout,
            broadcast_queue: self.broadcast_queue,
            sync_limit: self.sync_limit,
            discovery: self.discovery,
            target_peers: self.target_peers,
            outbox: OutboxConfig {
                max_in_flight: self.max_in_flight,
                max_batch: self.max_batch,
                max_batch_bytes: self.max_batch_bytes,
                queue_per_peer: self.queue_per_peer,
                deadline: self.deadline,
                max_queue_wait: self.max_queue_wait,
                base_backoff: self.base_backoff,
                max_backoff: self.max_backoff,
                max_attempts: self.max_attempts,
            },
            conduct: ConductConfig {
                limit: self.ban_after_malformed,
                half_life: self.malformed_half_life,
                ban_for: self.ban_for,
            },
        })
    }
}

/// Reads the node's Ed25519 key (libp2p's protobuf encoding), or makes one and writes it there
/// (mode 0600) when the file does not exist. The peer id follows from it.
pub fn load_or_generate_key(path: &Path) -> Result<identity::Keypair, String> {
    let show = |e: &dyn std::fmt::Display| format!("mesh key {}: {e}", path.display());
    if path.exists() {
        let bytes = std::fs::read(path).map_err(|e| show(&e))?;
        return identity::Keypair::from_protobuf_encoding(&bytes).map_err(|e| show(&e));
    }
    let key = identity::Keypair::generate_ed25519();
    let bytes = key.to_protobuf_encoding().map_err(|e| show(&e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| show(&e))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| show(&e))?;
    std::io::Write::write_all(&mut file, &bytes).map_err(|e| show(&e))?;
    Ok(key)
}
