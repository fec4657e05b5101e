//! One WebSocket connection to an upstream node, for subscriptions.
//!
//! A background task owns the socket: calls are sent with fresh ids and answered through a
//! oneshot; `eth_subscription` notifications go to a bounded channel. When the socket closes,
//! pending calls fail and the notification channel ends, so the owner learns at once.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use sluice_jsonrpc::{Outcome, RawValue, Request, ResponseEnvelope};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use crate::UpstreamError;

/// A subscription event from the node.
#[derive(Debug)]
pub struct Notification {
    /// The node's subscription id.
    pub subscription: String,
    /// The event, as raw JSON.
    pub result: Box<RawValue>,
}

type Pending = oneshot::Sender<Result<Outcome, UpstreamError>>;

struct Command {
    request: Request,
    reply: Pending,
}

/// A handle to an upstream WebSocket. Dropping it closes the connection, which also ends every
/// subscription made on it.
pub struct UpstreamSocket {
    commands: mpsc::Sender<Command>,
    timeout: Duration,
}

/// How many notifications may wait for the consumer before the socket stops reading.
const NOTIFICATION_BUFFER: usize = 1024;

impl UpstreamSocket {
    /// Connects to a `ws://` or `wss://` URL. Returns the handle and the stream of notifications.
    pub async fn connect(url: &str, timeout: Duration) -> Result<(Self, mpsc::Receiver<Notification>), UpstreamError> {
        let connector = tokio_tungstenite::Connector::Rustls(crate::tls::client_config());
        let connect = tokio_tungstenite::connect_async_tls_with_config(url, None, true, Some(connector));
        let (socket, _) = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| UpstreamError::Timeout(timeout))?
            .map_err(|e| {
                // Callers say what failed to connect and why it matters (the head feed once per
                // outage, the relay per subscription); the handshake's own error is detail.
                tracing::debug!(error = %e, %url, "upstream websocket connect failed");
                UpstreamError::Unreachable
            })?;
        let (commands, command_rx) = mpsc::channel(64);
        let (notify_tx, notifications) = mpsc::channel(NOTIFICATION_BUFFER);
        tokio::spawn(run(socket, command_rx, notify_tx));
        Ok((Self { commands, timeout }, notifications))
    }

    /// Makes a call on this connection (used for `eth_subscribe` and `eth_unsubscribe`).
    pub async fn call(&self, request: Request) -> Result<Outcome, UpstreamError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command { request, reply }).await.map_err(|_| UpstreamError::Unreachable)?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(UpstreamError::Unreachable),
            Err(_) => Err(UpstreamError::Timeout(self.timeout)),
        }
    }
}

/// What the node sends: an answer (has `id`) or a notification (has `method` and `params`).
#[derive(Deserialize)]
struct Incoming {
    method: Option<String>,
    params: Option<NotificationParams>,
}

#[derive(Deserialize)]
struct NotificationParams {
    subscription: String,
    result: Box<RawValue>,
}

async fn run<S>(
    socket: tokio_tungstenite::WebSocketStream<S>,
    mut commands: mpsc::Receiver<Command>,
    notify: mpsc::Sender<Notification>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // Open upstream sockets, so operators (and tests) can see subscriptions being released.
    metrics::gauge!("sluice_upstream_sockets").increment(1.0);
    let (mut sink, mut stream) = socket.split();
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut next_id = 1u64;
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(Command { request, reply }) = command else { break };
                let id = next_id;
                next_id += 1;
                let mut body = Vec::new();
                request.write_with_id(&id.to_string(), &mut body);
                let text = String::from_utf8(body).unwrap_or_default();
                if sink.send(Message::text(text)).await.is_err() {
                    let _ = reply.send(Err(UpstreamError::Unreachable));
                    break;
                }
                pending.insert(id, reply);
            }
            message = stream.next() => {
                let text = match message {
                    Some(Ok(Message::Text(text))) => text.to_string(),
                    Some(Ok(Message::Binary(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                if let Ok(Incoming { method: Some(method), params: Some(params) }) = serde_json::from_str(&text) {
                    if method == "eth_subscription" {
                        let event = Notification { subscription: params.subscription, result: params.result };
                        if notify.send(event).await.is_err() {
                            break;
                        }
                    }
                    continue;
                }
                match serde_json::from_str::<ResponseEnvelope>(&text) {
                    Ok(env) => {
                        let Some(reply) = env.numeric_id().and_then(|id| pending.remove(&id)) else { continue };
                        let answer = env.into_outcome().ok_or(UpstreamError::InvalidResponse("answer has no result or error"));
                        let _ = reply.send(answer);
                    }
                    Err(_) => tracing::warn!("upstream websocket sent a message that is not JSON-RPC"),
                }
            }
        }
    }
    for (_, reply) in pending.drain() {
        let _ = reply.send(Err(UpstreamError::Unreachable));
    }
    let _ = sink.close().await;
    metrics::gauge!("sluice_upstream_sockets").decrement(1.0);
}
