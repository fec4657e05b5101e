//! A client's WebSocket session: JSON-RPC calls through the pipeline, and subscriptions relayed
//! from one upstream WebSocket per client with ids mapped both ways.
//!
//! Calls run concurrently (bounded per socket) so a slow call does not hold up notifications.
//! The outbox is bounded: a client too slow to take its notifications is disconnected rather
//! than buffered without limit. When the client leaves, its subscriptions are cancelled upstream
//! and the upstream socket is closed. When the upstream socket dies, the client is closed with
//! 1011 so it reconnects and subscribes again, instead of waiting on a dead subscription.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use sluice_jsonrpc::{
    codes, parse_body, write_responses, ErrorObject, Incoming, Invalid, Outcome, RawValue, Request, Response,
};
use sluice_upstream::{Notification, UpstreamSocket};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::pipeline::{Edge, Reply};
use crate::route::is_subscription_method;
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
    mut shutdown: watch::Receiver<bool>,
    caller: Option<sluice_access::Caller>,
) {
    metrics::gauge!("sluice_websocket_sessions").increment(1.0);
    let (mut sink, mut stream) = socket.split();
    let (outbox, mut outbox_rx) = mpsc::channel::<Message>(OUTBOX);
    let writer = tokio::spawn(async move {
        while let Some(message) = outbox_rx.recv().await {
            let closing = matches!(message, Message::Close(_));
            if sink.send(message).await.is_err() || closing {
                break;
            }
        }
    });
    let (local_tx, mut local_rx) = mpsc::channel(OUTBOX);
    let mut session = Session {
        gateway,
        network,
        outbox,
        subscriptions: Subscriptions::default(),
        calls: Arc::new(Semaphore::new(CALLS_PER_SOCKET)),
        local: HashMap::new(),
        local_tx,
        caller,
    };
    // Access can be withdrawn while the socket is open: a key revoked or changed (checked
    // again whenever the keys change), or a token running out.
    let mut key_changes = session.gateway.access().map(|c| c.access.key_changes());
    let expires = session.caller.as_ref().and_then(|c| c.expires_ms).map(|ms| {
        let left = ms.saturating_sub(sluice_access::now_ms());
        tokio::time::Instant::now() + std::time::Duration::from_millis(left)
    });
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
                session.on_message(&body).await;
            }
            Some((client_id, result)) = local_rx.recv() => {
                if session.local.contains_key(&client_id) && !session.notify(&client_id, &result) {
                    break Some((1008, "client too slow to take its subscription events".to_owned()));
                }
            }
            event = session.subscriptions.next_notification() => match event {
                Some(event) => {
                    if !session.forward(event) {
                        break Some((1008, "client too slow to take its subscription events".to_owned()));
                    }
                }
                None => break Some((1011, "upstream subscription connection lost".to_owned())),
            },
            _ = shutdown.changed() => break Some((1001, "server shutting down".to_owned())),
        }
    };
    session.release_subscriptions(session.held());
    for (_, task) in session.local.drain() {
        task.abort();
    }
    session.subscriptions.close().await;
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
    subscriptions: Subscriptions,
    calls: Arc<Semaphore>,
    /// Locally served subscriptions by client id, each pumped by a task into `local_tx`.
    local: HashMap<String, tokio::task::AbortHandle>,
    local_tx: mpsc::Sender<(String, Box<RawValue>)>,
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
        let has_subscription = items.iter().any(|i| i.as_ref().is_ok_and(|r| is_subscription_method(&r.method)));
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
        (self.local.len() + self.subscriptions.by_client.len()) as u32
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
            Ok(req) if is_subscription_method(&req.method) => req,
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
        if self.subscriptions.by_client.len() + self.local.len() >= limit {
            return ErrorObject::new(
                codes::LIMIT_EXCEEDED,
                format!("too many subscriptions on this connection (limit {limit})"),
            )
            .into();
        }
        if let Some(outcome) = self.subscribe_locally(req) {
            return outcome;
        }
        let network = self.network();
        let (url, timeout) = (network.subscription_url.clone(), network.upstream_timeout);
        let Some(url) = url.as_deref() else {
            return ErrorObject::new(codes::METHOD_NOT_FOUND, "subscriptions are not available: no upstream WebSocket")
                .into();
        };
        if self.subscriptions.upstream.is_none() {
            match UpstreamSocket::connect(url, timeout).await {
                Ok((socket, events)) => {
                    self.subscriptions.upstream = Some(socket);
                    self.subscriptions.events = Some(events);
                }
                Err(e) => return e.to_error_object().into(),
            }
        }
        let Some(upstream) = &self.subscriptions.upstream else { unreachable!("connected above") };
        match upstream.call(req.clone()).await {
            Ok(Outcome::Result(raw)) => match serde_json::from_str::<String>(raw.get()) {
                Ok(upstream_id) => {
                    let client_id = new_subscription_id();
                    self.subscriptions.by_upstream.insert(upstream_id.clone(), client_id.clone());
                    self.subscriptions.by_client.insert(client_id.clone(), upstream_id);
                    Outcome::result(json_string(&client_id))
                }
                Err(_) => {
                    ErrorObject::new(codes::INTERNAL_ERROR, "upstream returned a malformed subscription id").into()
                }
            },
            Ok(error) => error,
            Err(e) => e.to_error_object().into(),
        }
    }

    async fn unsubscribe(&mut self, req: &Request) -> Outcome {
        let Ok((client_id,)) = serde_json::from_str::<(String,)>(req.params_text()) else {
            return ErrorObject::new(codes::INVALID_PARAMS, "expected [subscription id]").into();
        };
        if let Some(task) = self.local.remove(&client_id) {
            task.abort();
            return Outcome::result(raw("true"));
        }
        // An id this connection does not hold is answered `false`, never forwarded: ids are
        // per connection, and another client's subscription must stay out of reach.
        let Some(upstream_id) = self.subscriptions.by_client.remove(&client_id) else {
            return Outcome::result(raw("false"));
        };
        self.subscriptions.by_upstream.remove(&upstream_id);
        let Some(upstream) = &self.subscriptions.upstream else {
            return Outcome::result(raw("true"));
        };
        let params = serde_json::value::to_raw_value(&[&upstream_id]).ok();
        match upstream.call(Request::new(req.id.clone(), "eth_unsubscribe", params)).await {
            Ok(outcome) => outcome,
            Err(e) => e.to_error_object().into(),
        }
    }

    /// Serves the subscription locally when a local feed takes these params.
    fn subscribe_locally(&mut self, req: &Request) -> Option<Outcome> {
        let feeds = self.network().local_feeds.as_ref()?;
        let params: Vec<serde_json::Value> = serde_json::from_str(req.params_text()).ok()?;
        let mut stream = feeds.subscribe(&params)?;
        let client_id = new_subscription_id();
        let (id, tx) = (client_id.clone(), self.local_tx.clone());
        let task = tokio::spawn(async move {
            while let Some(result) = stream.next().await {
                if tx.send((id.clone(), result)).await.is_err() {
                    return;
                }
            }
        });
        self.local.insert(client_id.clone(), task.abort_handle());
        Some(Outcome::result(json_string(&client_id)))
    }

    /// Relays an upstream event under the client's id; false when the client cannot keep up.
    fn forward(&self, event: Notification) -> bool {
        let Some(client_id) = self.subscriptions.by_upstream.get(&event.subscription) else {
            return true; // an event racing its unsubscribe
        };
        self.notify(client_id, &event.result)
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

/// This client's subscriptions and the upstream socket that carries them.
#[derive(Default)]
struct Subscriptions {
    upstream: Option<UpstreamSocket>,
    events: Option<mpsc::Receiver<Notification>>,
    by_client: HashMap<String, String>,
    by_upstream: HashMap<String, String>,
}

impl Subscriptions {
    /// The next event; never resolves while there is no upstream socket.
    async fn next_notification(&mut self) -> Option<Notification> {
        match &mut self.events {
            Some(events) => events.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Cancels every subscription upstream, then closes the socket. Bounded: a stuck upstream
    /// gets two seconds, after which closing the socket ends the subscriptions anyway.
    async fn close(&mut self) {
        if let Some(upstream) = self.upstream.take() {
            let cancel_all = async {
                for upstream_id in self.by_client.values() {
                    let params = serde_json::value::to_raw_value(&[upstream_id]).ok();
                    let req = Request::new(Some(sluice_jsonrpc::Id::number(0)), "eth_unsubscribe", params);
                    let _ = upstream.call(req).await;
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), cancel_all).await;
        }
        self.by_client.clear();
        self.by_upstream.clear();
        self.events = None;
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
