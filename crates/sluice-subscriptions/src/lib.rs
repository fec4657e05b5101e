//! Subscriptions for sluice's WebSocket clients.
//!
//! * [`Hub`] serves `newHeads` and `logs` itself, from the head tracker's canonical chain: one
//!   block fetch (and one `eth_getLogs` by block hash, while anyone wants logs) per block,
//!   whichever upstream answers it, shared by every client. It survives the loss of the
//!   upstream that announced heads, fills any heights it missed, and on a reorg sends the logs
//!   of dropped blocks again with `removed: true` before the new branch (geth's semantics).
//! * [`SharedRelay`] carries every other subscription kind to a node: one upstream socket, one
//!   upstream subscription per distinct params, shared by all clients that ask for them.
//! * [`LocalFeeds`] is the seam the WebSocket session subscribes through; the mempool's
//!   `newPendingTransactions` is another implementation, and [`FeedSet`] asks each in turn.
//!
//! Decisions are pure and tested alone: [`filter`] (geth's log matching) and [`emitted`]
//! (what to remove and add when the chain moves).

pub mod config;
pub mod emitted;
pub mod filter;
mod hub;
mod relay;

use std::sync::Arc;

pub use config::SubscriptionsConfig;
pub use hub::Hub;
pub use relay::SharedRelay;
use serde_json::value::RawValue;

/// One item of a subscription's stream.
#[derive(Debug, Clone)]
pub enum FeedItem {
    /// A notification: the `result` of one `eth_subscription` message.
    Event(Arc<RawValue>),
    /// The subscription cannot go on; the client's socket is closed with this code and reason
    /// (1008 for a client that fell behind, 1011 when a relayed upstream socket was lost).
    Closed(u16, &'static str),
}

/// A subscription's notifications (`Sync` too, so that a session can hold them in place).
pub type FeedStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = FeedItem> + Send + Sync + 'static>>;

/// Subscriptions served without a per-client upstream socket.
#[async_trait::async_trait]
pub trait LocalFeeds: Send + Sync + 'static {
    /// The notifications for these `eth_subscribe` params, or `None` when this feed does not
    /// serve them. Async so that a feed can settle where its stream starts before the client
    /// is told its subscription id (every event after that answer is the client's).
    async fn subscribe(&self, params: &[serde_json::Value]) -> Option<FeedStream>;
}

/// Several feeds: the first that serves the params wins.
#[derive(Default, Clone)]
pub struct FeedSet(pub Vec<Arc<dyn LocalFeeds>>);

#[async_trait::async_trait]
impl LocalFeeds for FeedSet {
    async fn subscribe(&self, params: &[serde_json::Value]) -> Option<FeedStream> {
        for feed in &self.0 {
            if let Some(stream) = feed.subscribe(params).await {
                return Some(stream);
            }
        }
        None
    }
}

/// Why a client is closed when its subscription buffer overflowed.
pub const TOO_SLOW: &str = "client too slow to take its subscription events";

/// A stream over a broadcast receiver: a receiver that lagged closes its client (1008) instead
/// of silently skipping events; the sender going away ends the stream with `on_end`.
pub fn broadcast_stream(
    rx: tokio::sync::broadcast::Receiver<Arc<RawValue>>,
    on_end: Option<(u16, &'static str)>,
    guard: impl Send + Sync + 'static,
) -> FeedStream {
    use tokio::sync::broadcast::error::RecvError;
    let state = Some((rx, guard));
    Box::pin(futures_util::stream::unfold(state, move |state| async move {
        let (mut rx, guard) = state?;
        match rx.recv().await {
            Ok(event) => Some((FeedItem::Event(event), Some((rx, guard)))),
            Err(RecvError::Lagged(_)) => {
                metrics::counter!("sluice_subscription_lagged_total").increment(1);
                Some((FeedItem::Closed(1008, TOO_SLOW), None))
            }
            Err(RecvError::Closed) => on_end.map(|(code, why)| (FeedItem::Closed(code, why), None)),
        }
    }))
}
