//! HTTP handlers: JSON-RPC over POST, WebSocket upgrade on GET, health, readiness and metrics.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{State, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};

pub use crate::answer::{REQUEST_ID, SERVED_BY};
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sluice_jsonrpc::{codes, ErrorObject};
use sluice_upstream::Call;
use tracing::Instrument;

use crate::answer::{request_id, respond, RpcResponse};
use crate::network::PathTarget;
use crate::pipeline::{Edge, Refused, Reply};
use crate::stop::Stopping;
use crate::telemetry::{InFlight, Transport};
use crate::{ws, Gateway};

#[derive(Clone)]
struct AppState {
    gateway: Arc<Gateway>,
    shutdown: Stopping,
}

/// The routes. `shutdown` tells WebSocket sessions to close when the server stops.
pub fn router(gateway: Arc<Gateway>, shutdown: Stopping) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/status/live", get(live))
        .fallback(entry)
        .with_state(AppState { gateway, shutdown })
}

/// The API key: the URL path `/KEY`, else `Authorization: Bearer KEY`, else `x-api-key`.
fn api_key(path: Option<String>, headers: &HeaderMap) -> Option<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty());
    path.or_else(|| header("authorization").and_then(|v| v.strip_prefix("Bearer ")).map(|k| k.trim().to_owned()))
        .or_else(|| header("x-api-key").map(str::to_owned))
}

/// The client's socket address, put in a request's extensions by the server for the router.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// The caller, or the refusal to send (401, or 403 for an address) when access control is on.
fn identify(
    gateway: &Gateway,
    key: Option<String>,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<Option<sluice_access::Caller>, Box<RpcResponse>> {
    let Some(control) = gateway.access() else { return Ok(None) };
    let key = api_key(key, headers);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let client_ip = peer.map(|p| control.access.client_ip(p, header("x-forwarded-for"), header("forwarded")));
    let credentials = sluice_access::Credentials { key: key.as_deref(), client_ip };
    control.access.identify(credentials).map(Some).map_err(|refusal| {
        let (status, why) = match refusal {
            sluice_access::Refusal::Forbidden(_) => (StatusCode::FORBIDDEN, "address"),
            _ => (StatusCode::UNAUTHORIZED, "unauthorized"),
        };
        metrics::counter!("sluice_access_refused_total", "tier" => "", "why" => why).increment(1);
        let reply = Reply::local_error(ErrorObject::new(codes::INVALID_REQUEST, refusal.to_string()));
        Box::new(respond(status, reply, request_id(headers)))
    })
}

/// Every path but the operator endpoints: JSON-RPC POSTs and WebSocket upgrades, on the
/// network the path names.
async fn entry(
    State(state): State<AppState>,
    method: http::Method,
    uri: http::Uri,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Response {
    let peer = request.extensions().get::<ClientAddr>().map(|a| a.0);
    if uri.path() == "/"
        && crate::page::wants_page(&method, &headers)
        && state.gateway.page.allows(peer.map(|p| p.ip()))
    {
        return crate::page::page();
    }
    let (network, key) = match state.gateway.resolve(uri.path()) {
        PathTarget::Rpc { network, key } => (network, key.map(str::to_owned)),
        PathTarget::Unknown(message) => return unknown_network(&message, &headers).map(Body::new),
        PathTarget::Operator => return (StatusCode::NOT_FOUND, "not found\n").into_response(),
    };
    if method == http::Method::POST {
        return serve_rpc(&state.gateway, network, key, &headers, peer, request.into_body()).await.map(Body::new);
    }
    let (mut parts, _) = request.into_parts();
    let ws = <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(&mut parts, &()).await;
    serve_upgrade(state, network, key, headers, peer, ws).await
}

/// HTTP 404 with a JSON-RPC error body for a path that names no network served here.
pub fn unknown_network(message: &str, headers: &HeaderMap) -> RpcResponse {
    let reply = Reply::local_error(ErrorObject::new(codes::INVALID_REQUEST, message.to_owned()));
    respond(StatusCode::NOT_FOUND, reply, request_id(headers))
}

/// A JSON-RPC POST to network `network` (an index into the gateway's networks) from `peer`,
/// answered without the router (the server calls it directly; the router's fallback does too).
pub async fn serve_rpc<B>(
    gateway: &Gateway,
    network: usize,
    key: Option<String>,
    headers: &HeaderMap,
    peer: Option<std::net::SocketAddr>,
    body: B,
) -> RpcResponse
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let Some(network) = gateway.network(network) else {
        return unknown_network("no such network", headers);
    };
    let caller = match identify(gateway, key, headers, peer.map(|p| p.ip())) {
        Ok(caller) => caller,
        Err(refusal) => return *refusal,
    };
    let _in_flight = InFlight::start(Transport::Http);
    let id = request_id(headers);
    let span = tracing::debug_span!("rpc", request_id = id.to_str().unwrap_or_default(), network = %network.id, transport = "http");
    sluice_telemetry::adopt_parent(&span, headers);
    let limits = &gateway.limits;
    let declared = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    // The body is read before admission: a slow sender holds no place among those answered.
    let bytes = if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        Err(too_large(limits.max_body_bytes))
    } else {
        read_body(body, limits.max_body_bytes, limits.client_timeout).await
    };
    let (status, reply) = match bytes {
        Ok(bytes) => {
            let edge = Edge { caller: caller.as_ref() };
            let reply = network.pipeline.handle(&bytes, edge).instrument(span).await;
            (refusal_status(&reply), reply)
        }
        Err(refusal) => refusal,
    };
    let retry_after = match &reply.refused {
        Some(Refused::Access(sluice_access::Refusal::OverQuota { retry_after, .. })) => {
            Some(retry_after.as_secs().max(1))
        }
        Some(Refused::Busy) => Some(1),
        _ => None,
    };
    let mut response = respond(status, reply, id);
    if let Some(seconds) = retry_after {
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(http::header::RETRY_AFTER, value);
        }
    }
    response
}

fn refusal_status(reply: &Reply) -> StatusCode {
    match &reply.refused {
        None => StatusCode::OK,
        Some(Refused::Busy) => StatusCode::TOO_MANY_REQUESTS,
        Some(Refused::Access(sluice_access::Refusal::OverQuota { .. })) => StatusCode::TOO_MANY_REQUESTS,
        Some(Refused::Access(sluice_access::Refusal::Unavailable)) => StatusCode::SERVICE_UNAVAILABLE,
        Some(Refused::Access(sluice_access::Refusal::Unauthorized(_))) => StatusCode::UNAUTHORIZED,
        Some(Refused::Access(sluice_access::Refusal::Forbidden(_))) => StatusCode::FORBIDDEN,
    }
}

async fn read_body<B>(body: B, limit: usize, deadline: Duration) -> Result<bytes::Bytes, (StatusCode, Reply)>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut read = std::pin::pin!(read_all(Limited::new(body, limit)));
    // A small body is usually in hyper's buffer already, with its head: read it without arming
    // a timer (one timer-wheel insert and removal less per request); a body still on its way
    // is read under the deadline.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await;
    let result = match first {
        std::task::Poll::Ready(result) => Ok(result),
        std::task::Poll::Pending => tokio::time::timeout(deadline, read).await,
    };
    match result {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large(limit)),
        Ok(Err(_)) => {
            Err((StatusCode::BAD_REQUEST, Reply::local_error(ErrorObject::invalid_request("request body was cut off"))))
        }
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            Reply::local_error(ErrorObject::invalid_request(format!("request body not received within {deadline:?}"))),
        )),
    }
}

/// A body's data in one piece. A body of one frame (the usual case) is that frame's bytes, not
/// a copy; trailers are dropped.
async fn read_all<B: http_body::Body<Data = bytes::Bytes> + Unpin>(mut body: B) -> Result<bytes::Bytes, B::Error> {
    let mut first: Option<bytes::Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        match (&mut joined, first.take()) {
            (Some(joined), _) => joined.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(before)) => {
                let mut both = bytes::BytesMut::with_capacity(before.len() + data.len());
                both.extend_from_slice(&before);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map(bytes::BytesMut::freeze).or(first).unwrap_or_default())
}

fn too_large(limit: usize) -> (StatusCode, Reply) {
    let e = ErrorObject::new(codes::LIMIT_EXCEEDED, format!("request body too large: limit {limit} bytes"));
    (StatusCode::PAYLOAD_TOO_LARGE, Reply::local_error(e))
}

async fn serve_upgrade(
    state: AppState,
    network: usize,
    key: Option<String>,
    headers: HeaderMap,
    peer: Option<std::net::SocketAddr>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let caller = match identify(&state.gateway, key, &headers, peer.map(|p| p.ip())) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.map(Body::new),
    };
    let Ok(ws) = ws else {
        return (StatusCode::METHOD_NOT_ALLOWED, "POST JSON-RPC here, or open a WebSocket\n").into_response();
    };
    if let (Some(control), Some(caller), Some(net)) = (state.gateway.access(), &caller, state.gateway.network(network))
    {
        if let Err(refusal) = control.access.admit_to(caller, &net.id) {
            return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
        }
    }
    let slot = match (state.gateway.access(), &caller) {
        (Some(control), Some(caller)) => match control.open_session(caller) {
            Ok(slot) => Some(slot),
            Err(why) => return (StatusCode::TOO_MANY_REQUESTS, format!("{why}\n")).into_response(),
        },
        _ => None,
    };
    let Ok(permit) = state.gateway.sessions.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many WebSocket sessions\n").into_response();
    };
    let limit = state.gateway.limits.max_body_bytes;
    // A 1 KiB read buffer (it grows for a larger message) and an 8 KiB write threshold (the
    // writer flushes once per wake-up anyway) instead of 128 KiB each: with thousands of idle
    // subscribers, per-client memory is mostly buffers.
    let ws = ws.read_buffer_size(1024).write_buffer_size(8 * 1024).max_message_size(limit).max_frame_size(limit);
    ws.on_upgrade(move |socket| async move {
        ws::session(socket, state.gateway, network, state.shutdown, caller).await;
        drop(slot);
        drop(permit);
    })
}

/// Ready when, on every network, an upstream showed it is up lately (an answer, a head it
/// announced) or answers `eth_chainId` within two seconds; the body names the networks that
/// are not. Not ready once shutdown has started. A readiness probe every few seconds costs a
/// metered provider nothing while the chain is followed.
async fn ready(State(state): State<AppState>) -> Response {
    if state.gateway.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining: shutting down\n").into_response();
    }
    let probes = state.gateway.networks().iter().map(|network| async move {
        if network.readiness.recently_alive() {
            return None;
        }
        let probe = Call::internal("eth_chainId", None);
        match tokio::time::timeout(Duration::from_secs(2), network.readiness.call(&probe)).await {
            Ok(Ok(answer)) if !answer.outcome.is_error() => None,
            _ => Some(network.id.to_string()),
        }
    });
    let down: Vec<String> = futures_util::future::join_all(probes).await.into_iter().flatten().collect();
    match (down.is_empty(), state.gateway.networks().len()) {
        (true, _) => (StatusCode::OK, "ready\n").into_response(),
        (false, 1) => (StatusCode::SERVICE_UNAVAILABLE, "no upstream answers\n").into_response(),
        (false, _) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("no upstream answers on: {}\n", down.join(", "))).into_response()
        }
    }
}

/// What components report (the pool's members, the mempool, ingress, mesh), for operators.
async fn status(State(state): State<AppState>) -> Response {
    ([(CONTENT_TYPE, "application/json")], state.gateway.render_status().to_string()).into_response()
}

/// The status page's live stream, for whoever may see the page.
async fn live(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    let peer = request.extensions().get::<ClientAddr>().map(|a| a.0.ip());
    if !state.gateway.page.allows(peer) {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    }
    crate::page::live(state.gateway.clone())
}

async fn metrics(State(state): State<AppState>) -> Response {
    state.gateway.metrics.run_upkeep();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], state.gateway.metrics.render()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body delivered in the frames given, with trailers at the end.
    fn framed(
        parts: &[&'static str],
    ) -> http_body_util::StreamBody<
        impl futures_util::Stream<Item = Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>> + Unpin,
    > {
        let mut frames: Vec<_> =
            parts.iter().map(|p| Ok(http_body::Frame::data(bytes::Bytes::from_static(p.as_bytes())))).collect();
        frames.push(Ok(http_body::Frame::trailers(HeaderMap::new())));
        http_body_util::StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_body_in_several_frames_is_read_whole() {
        for parts in [&[][..], &["{}"], &["{\"a\":", "1", "}"], &["", "x", ""]] {
            let read = read_body(framed(parts), 100, Duration::from_secs(1)).await.expect("read");
            assert_eq!(read, parts.concat(), "{parts:?}");
        }
        let refused = read_body(framed(&["0123456789", "0123456789"]), 15, Duration::from_secs(1)).await;
        assert_eq!(refused.expect_err("too large").0, StatusCode::PAYLOAD_TOO_LARGE);
    }
}
