//! Subscriptions sluice does not serve itself, relayed from one node over one shared socket.
//!
//! All clients asking for the same params (`["syncing"]`, a logs filter with a block range,
//! `newPendingTransactions` without a mempool) share one upstream subscription, reference
//! counted: the first client subscribes upstream, the last one to leave unsubscribes, and the
//! socket closes once nothing is subscribed. A node's error to `eth_subscribe` goes to the
//! client as the node sent it. When the socket is lost, every relayed client is closed with
//! 1011 so it reconnects and subscribes again, rather than wait on a subscription that died.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::value::RawValue;
use sluice_jsonrpc::{codes, ErrorObject, Id, Outcome, Request};
use sluice_upstream::{Notification, UpstreamSocket};
use tokio::sync::{broadcast, mpsc, Mutex};

use crate::{broadcast_stream, FeedStream};

/// Why a relayed client is closed when the upstream socket is gone.
pub const UPSTREAM_LOST: &str = "upstream subscription connection lost";

/// One node's socket, shared by every relayed subscription of a network.
pub struct SharedRelay {
    url: String,
    timeout: Duration,
    buffer: usize,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    socket: Option<UpstreamSocket>,
    /// Bumped on every connect, so that a late clean-up of an old socket touches nothing.
    generation: u64,
    by_params: HashMap<String, Shared>,
    by_upstream: HashMap<String, String>,
}

struct Shared {
    upstream_id: String,
    tx: broadcast::Sender<Arc<RawValue>>,
    clients: usize,
}

impl SharedRelay {
    /// A relay to `url` (`ws://` or `wss://`); connects on the first subscription.
    pub fn new(url: String, timeout: Duration, buffer: usize) -> Arc<Self> {
        Arc::new(Self { url, timeout, buffer, state: Arc::default() })
    }

    /// Subscribes with `params` as the client sent them; the node's answer when it refuses.
    pub async fn subscribe(&self, params: &RawValue) -> Result<FeedStream, Outcome> {
        let key = params.get().to_owned();
        let mut state = self.state.lock().await;
        let generation = state.generation;
        if let Some(shared) = state.by_params.get_mut(&key) {
            shared.clients += 1;
            let guard = Leave { state: Arc::downgrade(&self.state), key, generation };
            return Ok(broadcast_stream(shared.tx.subscribe(), Some((1011, UPSTREAM_LOST)), guard));
        }
        if state.socket.is_none() {
            let (socket, events) = UpstreamSocket::connect(&self.url, self.timeout).await.map_err(|e| {
                tracing::warn!(error = %e, url = %self.url, "cannot relay a subscription: the upstream WebSocket is unavailable");
                Outcome::from(e.to_error_object())
            })?;
            state.generation += 1;
            state.socket = Some(socket);
            tokio::spawn(dispatch(Arc::downgrade(&self.state), events, state.generation));
        }
        let generation = state.generation;
        let request = Request::new(Some(Id::number(1)), "eth_subscribe", Some(params.to_owned()));
        let Some(socket) = &state.socket else { unreachable!("connected above") };
        let answer = socket.call(request).await;
        let refused = |state: &mut State, outcome: Outcome| {
            if state.by_params.is_empty() {
                state.socket = None;
            }
            Err(outcome)
        };
        match answer {
            Ok(Outcome::Result(raw)) => match serde_json::from_str::<String>(raw.get()) {
                Ok(upstream_id) => {
                    let tx = broadcast::channel(self.buffer).0;
                    let rx = tx.subscribe();
                    state.by_upstream.insert(upstream_id.clone(), key.clone());
                    state.by_params.insert(key.clone(), Shared { upstream_id, tx, clients: 1 });
                    let guard = Leave { state: Arc::downgrade(&self.state), key, generation };
                    Ok(broadcast_stream(rx, Some((1011, UPSTREAM_LOST)), guard))
                }
                Err(_) => {
                    let e = ErrorObject::new(codes::INTERNAL_ERROR, "upstream returned a malformed subscription id");
                    refused(&mut state, e.into())
                }
            },
            Ok(error) => refused(&mut state, error),
            Err(e) => refused(&mut state, e.to_error_object().into()),
        }
    }

    /// Upstream subscriptions held (one per distinct params), for tests and `/status`.
    pub async fn upstream_subscriptions(&self) -> usize {
        self.state.lock().await.by_params.len()
    }
}

/// Passes the socket's notifications to their subscribers; when the socket ends, drops them
/// all (their streams end with 1011).
async fn dispatch(state: Weak<Mutex<State>>, mut events: mpsc::Receiver<Notification>, generation: u64) {
    while let Some(event) = events.recv().await {
        let Some(state) = state.upgrade() else { return };
        let state = state.lock().await;
        if state.generation != generation {
            return;
        }
        let shared = state.by_upstream.get(&event.subscription).and_then(|key| state.by_params.get(key));
        if let Some(shared) = shared {
            let _ = shared.tx.send(Arc::from(event.result));
        }
    }
    let Some(state) = state.upgrade() else { return };
    let mut state = state.lock().await;
    if state.generation == generation {
        state.socket = None;
        state.by_params.clear();
        state.by_upstream.clear();
    }
}

/// Held by each relayed client's stream: dropping it (unsubscribe, client gone) releases the
/// client's share, and the last share unsubscribes upstream.
struct Leave {
    state: Weak<Mutex<State>>,
    key: String,
    generation: u64,
}

impl Drop for Leave {
    fn drop(&mut self) {
        let (Some(state), Ok(runtime)) = (self.state.upgrade(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let (key, generation) = (std::mem::take(&mut self.key), self.generation);
        runtime.spawn(async move {
            let mut state = state.lock().await;
            if state.generation != generation {
                return;
            }
            let Some(shared) = state.by_params.get_mut(&key) else { return };
            shared.clients = shared.clients.saturating_sub(1);
            if shared.clients > 0 {
                return;
            }
            let Some(shared) = state.by_params.remove(&key) else { return };
            state.by_upstream.remove(&shared.upstream_id);
            if let Some(socket) = &state.socket {
                let params = serde_json::value::to_raw_value(&[&shared.upstream_id]).ok();
                let _ = socket.call(Request::new(Some(Id::number(0)), "eth_unsubscribe", params)).await;
            }
            if state.by_params.is_empty() {
                state.socket = None; // closes the connection
            }
        });
    }
}
