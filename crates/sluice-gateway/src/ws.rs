//! A client's WebSocket session: JSON-RPC calls through the pipeline, and subscriptions.
//!
//! Every subscription is a stream under a fresh client id: served by the network's local feeds
//! (`newHeads` and `logs` from the subscription hub, pending transactions from the mempool) or,
//! for anything else, by the network's shared relay (one upstream socket and one upstream
//! subscription per distinct params, for all clients). Calls run concurrently (bounded per
//! socket) so a slow call does not hold up notifications. The outbox is bounded: a client too
//! slow to take its notifications is closed (1008) rather than buffered without limit. A
//! subscription that cannot go on closes the client with its code (1011 when a relayed
//! upstream socket was lost, so the client reconnects instead of waiting on a dead one).

use std::hash::BuildHasher;
use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use sluice_chain::method_info;
use sluice_chain::methods::Class;
use sluice_jsonrpc::{
    codes, parse_body, write_responses, ErrorObject, Incoming, Invalid, Outcome, RawValue, Request, Response,
};
use sluice_subscriptions::{FeedItem, FeedStream, TOO_SLOW};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::StreamMap;

use crate::pipeline::{Edge, Reply};
use crate::stop::Stopping;
use crate::telemetry::{self, InFlight, Transport};
use crate::Gateway;
use tracing::Instrument;

/// Messages waiting to be written to one client.
const OUTBOX: usize = 1024;
/// Calls one client may have running at once; further messages wait to be read.
const CALLS_PER_SOCKET: usize = 64;

/// Runs one client session until either side closes or the server stops.
pub async fn session(
    socket: WebSocket,
    gateway: Arc<Gateway>,
    network: usize,
    shutdown: Stopping,
    caller: Option<sluice_access::Caller>,
) {
    metrics::gauge!("sluice_websocket_sessions").increment(1.0);
    let (mut sink, mut stream) = socket.split();
    let (outbox, mut outbox_rx) = mpsc::channel::<Message>(OUTBOX);
    let writer = tokio::spawn(async move {
        // Whatever is queued leaves in one write (a head and its logs, say): one flush per
        // wake-up rather than per message, which is what a fan-out to many sockets costs.
        'writing: while let Some(message) = outbox_rx.recv().await {
            let mut next = Some(message);
            while let Some(message) = next.take() {
                let closing = matches!(message, Message::Close(_));
                if sink.feed(message).await.is_err() || closing {
                    let _ = sink.flush().await;
                    break 'writing;
                }
                next = outbox_rx.try_recv().ok();
            }
            if sink.flush().await.is_err() {
                break;
            }
        }
    });
    let mut session = Session {
        gateway,
        network,
        outbox,
        calls: Arc::new(Semaphore::new(CALLS_PER_SOCKET)),
        local: StreamMap::new(),
        caller,
    };
    // Access can be withdrawn while the socket is open: a key revoked or changed (checked
    // again whenever the keys change), or a token running out.
    let mut key_changes = session.gateway.access().map(|c| c.access.key_changes());
    let expires = session.caller.as_ref().and_then(|c| c.expires_ms).map(|ms| {
        let left = ms.saturating_sub(sluice_access::now_ms());
        tokio::time::Instant::now() + std::time::Duration::from_millis(left)
    });
    // One wait for the whole session (a new wait per message would register each time); a
    // session opened after shutdown began closes at once.
    let mut shutdown = std::pin::pin!(shutdown.stopped());
    let close: Option<(u16, String)> = loop {
        tokio::select! {
            Some(Ok(())) = async { match &mut key_changes { Some(rx) => Some(rx.changed().await), None => None } },
                if session.caller.is_some() => {
                let refreshed = match (session.gateway.access(), &session.caller) {
                    (Some(control), Some(caller)) => control.access.refresh(caller),
                    _ => continue,
                };
                match refreshed {
                    Ok(caller) => session.caller = Some(caller),
                    Err(refusal) => break Some((1008, refusal.to_string())),
                }
            }
            _ = async { if let Some(at) = expires { tokio::time::sleep_until(at).await } }, if expires.is_some() => {
                break Some((1008, "unauthorized: token expired".to_owned()));
            }
            message = stream.next() => {
                let body = match message {
                    Some(Ok(Message::Text(text))) => bytes::Bytes::from(text),
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
                    Some(Ok(_)) => continue,
                };
                // Boxed: the call path's state is allocated only while a message is handled,
                // not carried in every idle session's future.
                Box::pin(session.on_message(&body)).await;
            }
            Some((client_id, item)) = session.local.next(), if !session.local.is_empty() => {
                match item {
                    FeedItem::Event(result) => if !session.notify(&client_id, &result) {
                        break Some((1008, TOO_SLOW.to_owned()));
                    },
                    FeedItem::Closed(code, why) => break Some((code, why.to_owned())),
                }
            }
            _ = &mut shutdown => break Some((1001, "server shutting down".to_owned())),
        }
    };
    session.release_subscriptions(session.held());
    // Dropping the streams releases their shares of relayed upstream subscriptions.
    session.local.clear();
    if let Some((code, reason)) = close {
        let _ = session.outbox.send(Message::Close(Some(CloseFrame { code, reason: reason.into() }))).await;
    }
    drop(session);
    let _ = writer.await;
    metrics::gauge!("sluice_websocket_sessions").decrement(1.0);
}

struct Session {
    gateway: Arc<Gateway>,
    /// The network the socket was opened on (its index in the gateway).
    network: usize,
    outbox: mpsc::Sender<Message>,
    calls: Arc<Semaphore>,
    /// Subscriptions by client id, polled by the session loop itself (no task per
    /// subscription: thousands of idle subscribers should cost little).
    local: StreamMap<String, FeedStream>,
    /// Who opened the socket, when access control is on: every message is charged to it.
    caller: Option<sluice_access::Caller>,
}

impl Session {
    /// One message: the same pipeline as an HTTP body (admission, quotas, policy, calls);
    /// subscriptions are this session's own and are answered here, in order.
    async fn on_message(&mut self, body: &[u8]) {
        let (items, batch) = match parse_body(body, self.gateway.limits.max_batch_len) {
            Err(e) => return self.send(Reply::local_error(e)).await,
            Ok(Incoming::Single(item)) => (vec![item], false),
            Ok(Incoming::Batch(items)) => (items, true),
        };
        let edge = Edge { caller: self.caller.as_ref() };
        let admitted = match self.network().pipeline.admit_and_charge(&items, edge).await {
            Ok(admitted) => admitted,
            Err(refusal) => return self.send(refusal).await,
        };
        let has_subscription =
            items.iter().any(|i| i.as_ref().is_ok_and(|r| method_info(&r.method).class == Class::Subscription));
        if has_subscription {
            let mut responses = Vec::with_capacity(items.len());
            for item in items {
                responses.extend(self.answer_one(item).await);
            }
            drop(admitted);
            if !responses.is_empty() {
                let _ = self.outbox.send(text(write_responses(batch, &responses))).await;
            }
            return;
        }
        let Ok(permit) = self.calls.clone().acquire_owned().await else {
            return;
        };
        let (gateway, network) = (self.gateway.clone(), self.network);
        let outbox = self.outbox.clone();
        let caller = self.caller.clone();
        tokio::spawn(async move {
            let _in_flight = InFlight::start(Transport::Ws);
            let edge = Edge { caller: caller.as_ref() };
            let Some(network) = gateway.network(network) else { return };
            // A trace per message, as per HTTP body (off: a disabled callsite).
            let span = tracing::debug_span!("rpc", network = %network.id, transport = "ws");
            let (responses, _) = network.pipeline.respond(items, edge).instrument(span).await;
            drop(admitted);
            if !responses.is_empty() {
                let _ = outbox.send(text(write_responses(batch, &responses))).await;
            }
            drop(permit);
        });
    }

    /// The network this socket serves.
    fn network(&self) -> &crate::Network {
        // The index came from this gateway's own directory; networks are never removed.
        &self.gateway.networks()[self.network]
    }

    /// Subscriptions this connection holds.
    fn held(&self) -> u32 {
        self.local.len() as u32
    }

    /// Takes a subscription place for this connection's key (always true without access control).
    fn take_subscription(&self) -> bool {
        match (self.gateway.access(), &self.caller) {
            (Some(control), Some(caller)) => control.take_subscription(caller),
            _ => true,
        }
    }

    fn release_subscriptions(&self, n: u32) {
        if let (Some(control), Some(caller)) = (self.gateway.access(), &self.caller) {
            control.release_subscriptions(caller, n);
        }
    }

    async fn answer_one(&mut self, item: Result<Request, Invalid>) -> Vec<Response> {
        let req = match item {
            Ok(req) if method_info(&req.method).class == Class::Subscription => req,
            other => {
                let edge = Edge { caller: self.caller.as_ref() };
                return self.network().pipeline.respond(vec![other], edge).await.0;
            }
        };
        // Places against the key's subscription limit follow what this connection holds.
        let before = self.held();
        let outcome = if req.method == "eth_subscribe" {
            if !self.take_subscription() {
                return req.id.map(|id| Response { id, outcome: too_many_for_key() }).into_iter().collect();
            }
            let outcome = self.subscribe(&req).await;
            if self.held() == before {
                self.release_subscriptions(1);
            }
            outcome
        } else {
            let outcome = self.unsubscribe(&req).await;
            self.release_subscriptions(before.saturating_sub(self.held()));
            outcome
        };
        telemetry::count_call(&self.network().id, &req.method, if outcome.is_error() { "rpc_error" } else { "ok" });
        req.id.map(|id| Response { id, outcome }).into_iter().collect()
    }

    async fn subscribe(&mut self, req: &Request) -> Outcome {
        let limit = self.gateway.limits.max_subscriptions_per_socket;
        if self.local.len() >= limit {
            return ErrorObject::new(
                codes::LIMIT_EXCEEDED,
                format!("too many subscriptions on this connection (limit {limit})"),
            )
            .into();
        }
        let Some(params) = req.params.as_deref() else {
            return ErrorObject::new(codes::INVALID_PARAMS, "expected [subscription kind, ...]").into();
        };
        let network = self.network();
        let local = match (serde_json::from_str::<Vec<serde_json::Value>>(params.get()), &network.local_feeds) {
            (Ok(p), Some(feeds)) => feeds.subscribe(&p).await,
            _ => None,
        };
        let stream = match (local, network.relay.clone()) {
            (Some(stream), _) => stream,
            (None, Some(relay)) => match relay.subscribe(params).await {
                Ok(stream) => stream,
                Err(refused) => return refused,
            },
            (None, None) => {
                return ErrorObject::new(
                    codes::METHOD_NOT_FOUND,
                    "subscriptions are not available: no upstream WebSocket",
                )
                .into()
            }
        };
        Outcome::result(json_string(&self.start_stream(stream)))
    }

    async fn unsubscribe(&mut self, req: &Request) -> Outcome {
        let Ok((client_id,)) = serde_json::from_str::<(String,)>(req.params_text()) else {
            return ErrorObject::new(codes::INVALID_PARAMS, "expected [subscription id]").into();
        };
        // An id this connection does not hold is answered `false`, never forwarded: ids are
        // per connection, and another client's subscription must stay out of reach.
        match self.local.remove(&client_id) {
            Some(_stream) => Outcome::result(raw("true")),
            None => Outcome::result(raw("false")),
        }
    }

    /// Takes a subscription's stream into this session under a fresh client id.
    fn start_stream(&mut self, stream: FeedStream) -> String {
        let client_id = new_subscription_id();
        self.local.insert(client_id.clone(), stream);
        client_id
    }

    /// Queues one `eth_subscription` message; false when the client cannot keep up.
    fn notify(&self, client_id: &str, result: &RawValue) -> bool {
        let mut body = Vec::with_capacity(96 + result.get().len());
        body.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"eth_subscription\",\"params\":{\"subscription\":");
        body.extend_from_slice(json_string(client_id).get().as_bytes());
        body.extend_from_slice(b",\"result\":");
        body.extend_from_slice(result.get().as_bytes());
        body.extend_from_slice(b"}}");
        self.outbox.try_send(text(body)).is_ok()
    }

    async fn send(&self, reply: Reply) {
        if let Some(body) = reply.body.map(|b| b.to_vec()) {
            let _ = self.outbox.send(text(body)).await;
        }
    }
}

fn too_many_for_key() -> Outcome {
    ErrorObject::new(codes::LIMIT_EXCEEDED, "too many subscriptions for this key").into()
}

fn text(body: Vec<u8>) -> Message {
    match String::from_utf8(body) {
        Ok(s) => Message::Text(s.into()),
        Err(e) => Message::Binary(e.into_bytes().into()),
    }
}

fn raw(json: &'static str) -> Box<RawValue> {
    RawValue::from_string(json.to_owned()).expect("a JSON literal")
}

fn json_string(s: &str) -> Box<RawValue> {
    serde_json::value::to_raw_value(s).unwrap_or_default()
}

/// A fresh 128-bit subscription id in the `0x…` form clients expect.
fn new_subscription_id() -> String {
    let state = std::collections::hash_map::RandomState::new();
    format!("0x{:016x}{:016x}", state.hash_one(1u8), state.hash_one(2u8))
}
