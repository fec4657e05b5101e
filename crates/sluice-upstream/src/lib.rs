//! Upstream nodes for sluice.
//!
//! * [`Upstreams`] is the seam every other component calls through: the gateway for
//!   pass-through calls, and later the cache (on a miss) and the mempool (state, relay).
//! * [`HttpUpstream`] is one node reached over HTTP/1.1 with keep-alive.
//! * [`UpstreamSocket`] is one WebSocket connection to a node, used for `eth_subscribe`.
//!
//! Errors are classified ([`UpstreamError`]) so callers can tell an unreachable node from a slow
//! one or a broken answer, and turned into JSON-RPC errors that never leak upstream internals.

mod error;
mod heads;
mod http;
pub mod logs;
pub mod pool;
mod socket;
pub mod tls;

use async_trait::async_trait;
use sluice_jsonrpc::{Outcome, Request};

pub use error::UpstreamError;
pub use heads::{spawn_head_watcher, HeadConfig, HeadFeed};
pub use http::{HttpUpstream, HttpUpstreamConfig};
pub use socket::{Notification, UpstreamSocket};

/// Something that answers JSON-RPC calls: one node, a pool of nodes, or a layer (cache,
/// coalescing) wrapping another `Upstreams`.
#[async_trait]
pub trait Upstreams: Send + Sync + 'static {
    /// Answers one call. A JSON-RPC error from the node is an `Ok` answer holding
    /// `Outcome::Error`: it is the node's answer. `Err` means no usable answer was had.
    async fn call(&self, req: &Request) -> Result<Answer, UpstreamError>;

    /// Answers several calls, in order. The default makes the calls concurrently; a node client
    /// sends them as one JSON-RPC batch.
    async fn call_batch(&self, reqs: &[&Request]) -> Vec<Result<Answer, UpstreamError>> {
        futures_util::future::join_all(reqs.iter().map(|r| self.call(r))).await
    }

    /// A JSON snapshot of health for `/status` (`null` when there is nothing to report).
    fn status(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

/// An answer and where it came from.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The result or error.
    pub outcome: Outcome,
    /// What produced it.
    pub source: Source,
}

impl Answer {
    /// An answer fetched from a node just now.
    pub fn upstream(outcome: Outcome) -> Self {
        Self { outcome, source: Source::Upstream }
    }
}

/// Where an answer came from (reported to callers in the `x-sluice-served-by` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A node, just now.
    Upstream,
    /// sluice itself (e.g. `eth_blockNumber` from the head tracker).
    Local,
    /// The in-process cache.
    Memory,
    /// The shared Redis cache.
    Redis,
    /// Another caller's identical request, in flight at the same time.
    Coalesced,
}

impl Source {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Upstream => "upstream",
            Source::Local => "local",
            Source::Memory => "cache-memory",
            Source::Redis => "cache-redis",
            Source::Coalesced => "coalesced",
        }
    }
}
