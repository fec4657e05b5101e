//! Upstream nodes for sluice.
//!
//! * [`Call`] is a call with its context ([`CallCtx`]: network, tier, deadline, priority, the
//!   block it needs), built once at the edge.
//! * [`Upstreams`] is the seam the request path calls through: layers (mempool, logs, cache,
//!   coalescing) wrap the [`pool::UpstreamPool`], which every call reaches, also with one member.
//! * [`Node`] is one upstream as the pool sees it; [`HttpUpstream`] is one node reached over
//!   HTTP/1.1 with keep-alive.
//! * [`UpstreamSocket`] is one WebSocket connection to a node, used for `eth_subscribe`.
//!
//! Errors are classified ([`UpstreamError`]) so callers can tell an unreachable node from a slow
//! one or a broken answer, and turned into JSON-RPC errors that never leak upstream internals.

mod batcher;
mod call;
pub mod consistency;
mod error;
mod heads;
mod http;
mod keepalive;
pub mod lane;
pub mod logs;
pub mod pool;
mod socket;
pub mod tls;

use std::time::Duration;

use async_trait::async_trait;
use sluice_jsonrpc::{Outcome, Request};

pub use call::{AnswerCheck, Call, CallCtx, CallView, Origin, DEFAULT_NETWORK};
pub use consistency::{Admission, HeadView, Seen};
pub use error::UpstreamError;
pub use heads::{
    spawn_head_watcher, spawn_shared_head_watcher, HeadConfig, HeadFeed, HeadNews, Role, SharedHeads, StoreError,
};
pub use http::{HttpUpstream, HttpUpstreamConfig};
pub use keepalive::{Connections, Lease};
pub use socket::{Notification, UpstreamSocket};

/// The future of [`Upstreams::call`], spelled out for layers that implement `call` by hand so
/// as to hand down the inner layer's own future for calls they do not touch (no box and no
/// poll of their own on the path).
pub type CallFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Answer, UpstreamError>> + Send + 'a>>;

/// Something that answers calls: the upstream pool, or a layer (mempool, logs, cache,
/// coalescing) wrapping another. The seam of the request path below the gateway.
#[async_trait]
pub trait Upstreams: Send + Sync + 'static {
    /// Answers one call. A JSON-RPC error from the node is an `Ok` answer holding
    /// `Outcome::Error`: it is the node's answer. `Err` means no usable answer was had.
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError>;

    /// Answers several calls, in order. The default makes the calls concurrently; the pool
    /// sends them to each member as one JSON-RPC batch.
    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        futures_util::future::join_all(calls.iter().map(|c| self.call(c))).await
    }

    /// Member `member` (by name) announced head `number` (`hash`) on its own, e.g. in a
    /// `newHeads` notification: the pool need not read that member's head itself. Layers
    /// ignore it; the pool records it.
    fn member_head(&self, _member: &str, _number: u64, _hash: &str) {}

    /// The chain's pace as the head feed learned it: the pool reads the heads of members it
    /// hears nothing from about once a block, not more often.
    fn block_interval(&self, _interval: Duration) {}

    /// True when a member showed it is up lately (a healthy answer, a `newHeads`
    /// notification): what a readiness check can answer without a call. Layers say no.
    fn recently_alive(&self) -> bool {
        false
    }
}

/// One upstream node as the pool sees it: a name, a deadline, and a way to send calls.
/// HTTP today ([`HttpUpstream`]); the pool's ordering, failover, hedging, breaker and budgets
/// are tested with in-memory nodes.
#[async_trait]
pub trait Node: Send + Sync + 'static {
    /// For logs, metrics and `/status`.
    fn name(&self) -> &str;
    /// Its default deadline for one exchange.
    fn timeout(&self) -> Duration;
    /// Sends calls in one exchange (one JSON-RPC batch); one outcome per call, in order.
    /// `Err` when the exchange as a whole failed.
    async fn send(
        &self,
        reqs: &[&Request],
        timeout: Duration,
    ) -> Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError>;
    /// How many connections the node has closed itself so far (0 for a node without any).
    fn closed_by_node(&self) -> u64 {
        0
    }
    /// Wakes `wake` whenever the node closes a connection (a node that dies closes them all).
    fn wake_on_close(&self, _wake: std::sync::Arc<tokio::sync::Notify>) {}
    /// Whether anything listens at the node's address (a connection made and dropped, no
    /// request): `Some(false)` when the connection is refused, `None` when it cannot tell.
    async fn listening(&self) -> Option<bool> {
        None
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
    /// A node, just now, as one call of a Multicall3 aggregate.
    Aggregated,
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
            Source::Aggregated => "aggregated",
        }
    }
}
