//! The mesh's wire format and its limits: what a request carries and what a receiver answers,
//! shared by the node and its configuration's checks.

use libp2p::{Multiaddr, PeerId, StreamProtocol};
use serde::{Deserialize, Serialize};

/// The protocol: one stream per send, carrying one transaction or (under a backlog) several,
/// answered with one verdict each.
pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/sluice/txs/1");

/// The Kademlia protocol of sluice meshes (not the IPFS DHT's, so the two never mix).
pub const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/sluice/kad/1.0.0");

/// Transactions in one request a node takes; a longer request is refused whole.
pub const MAX_BATCH_IN: usize = 1_024;

/// Bytes in one request a node reads (libp2p's CBOR codec default).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

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

/// The receiver's verdict: the application-level acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ack {
    /// Taken into its pool.
    Accepted,
    /// Refused by validation (not retried, and never forwarded by the receiver).
    Invalid(String),
    /// The receiver could not take it now (busy, state unavailable): the sender retries.
    Unavailable(String),
}

/// The peer id in a multiaddr's trailing `/p2p/…`.
pub fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        libp2p::multiaddr::Protocol::P2p(id) => Some(id),
        _ => None,
    })
}
