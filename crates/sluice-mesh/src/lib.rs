//! sluice's peer mesh: sluice nodes share transactions over libp2p.
//!
//! Each send to a peer is a stream of its own (request-response) carrying one transaction, or,
//! when a backlog builds up, the transactions waiting for that peer; the peer's verdict on each,
//! after the same validation as a local submission, is its acknowledgement. Delivery
//! rules are the pure [`outbox`]: per-peer bounded queues, a cap on streams in flight below the
//! peer's stream limit, retries with exponential backoff and jitter, re-dials, and a deadline,
//! after which a message has failed, counted and logged. Nothing ends silently. A peer that
//! sends transactions no honest node would forward is banned for a while ([`conduct`]). Each
//! transaction names its chain; a node serving several chains takes it into that chain's pool
//! only ([`chains`]).
//!
//! [`node`] is the async shell (one swarm task); [`memory::MemoryPool`] is a stand-in pool for
//! tests and benchmarks of the mesh alone.

pub mod chains;
pub mod conduct;
pub mod config;
mod contents;
pub mod known;
#[cfg(any(test, feature = "stand-ins"))]
pub mod memory;
pub mod node;
pub mod outbox;
pub mod status;
mod wire;

pub use chains::{ChainPool, UNNAMED_CHAIN};
pub use config::{load_or_generate_key, MeshConfig, MeshSettings};
pub use libp2p::identity::Keypair;
pub use node::{BroadcastRefused, Mesh, MeshError, PoolContents};
pub use status::{AckTimes, MeshStatus, PeerStatus};
pub use wire::{peer_of, Ack, TxBatch, MAX_BATCH_IN, PROTOCOL};
