//! HTTP handlers: JSON-RPC over POST, WebSocket upgrade on GET, health, readiness and metrics.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{State, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sluice_jsonrpc::{codes, ErrorObject};
use sluice_upstream::Call;
use tracing::Instrument;

use crate::network::Target;
use crate::pipeline::{Edge, Payload, Refused, Reply};
use crate::stop::Stopping;
use crate::telemetry::{InFlight, Transport};
use crate::{ws, Gateway};

/// Header naming what answered: `local`, `upstream` or `mixed`.
pub const SERVED_BY: &str = "x-sluice-served-by";
/// Header carrying the request id (the caller's, if it sent a short one, else sluice's).
pub const REQUEST_ID: &str = "x-request-id";

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
        .fallback(entry)
        .with_state(AppState { gateway, shutdown })
}

/// The header names as values built once (a name given as `&str` is parsed on every insert).
const SERVED_BY_NAME: HeaderName = HeaderName::from_static(SERVED_BY);
const REQUEST_ID_NAME: HeaderName = HeaderName::from_static(REQUEST_ID);

/// The caller's request id if it sent a short printable one, else the next of sluice's own (hex).
fn request_id(headers: &HeaderMap) -> HeaderValue {
    let given = headers.get(&REQUEST_ID_NAME).filter(|v| !v.is_empty() && v.len() <= 64 && v.to_str().is_ok());
    match given {
        // A header value clones by reference count.
        Some(value) => value.clone(),
        None => {
            let mut digits = [0u8; 16];
            let hex = hex_digits(next_request_id(), &mut digits);
            HeaderValue::from_bytes(hex).unwrap_or_else(|_| HeaderValue::from_static("0"))
        }
    }
}

/// Ids handed to a thread at a time: each thread counts through its own block, so that
/// threads serving requests side by side do not share one counter's cache line per request.
const ID_BLOCK: u64 = 1 << 16;

/// A request id not given out before in this process (ids are not in order across threads).
fn next_request_id() -> u64 {
    static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        /// The next id this thread gives out, and the end of its block.
        static NEXT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    NEXT.with(|cell| {
        let (mut next, mut end) = cell.get();
        if next == end {
            next = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed) * ID_BLOCK;
            end = next + ID_BLOCK;
            // 0 is never given out.
            next = next.max(1);
        }
        cell.set((next + 1, end));
        next
    })
}

/// `n` in lower-case hex without leading zeros, written into `out`.
fn hex_digits(n: u64, out: &mut [u8; 16]) -> &[u8] {
    let len = (16 - n.leading_zeros() as usize / 4).max(1);
    for (i, digit) in out[..len].iter_mut().rev().enumerate() {
        *digit = b"0123456789abcdef"[(n >> (4 * i)) as usize & 0xf];
    }
    &out[..len]
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
    let (network, key) = match state.gateway.resolve(uri.path()) {
        Target::Rpc { network, key } => (network, key.map(str::to_owned)),
        Target::Unknown(message) => return unknown_network(&message, &headers).map(Body::new),
        Target::Operator => return (StatusCode::NOT_FOUND, "not found\n").into_response(),
    };
    let peer = request.extensions().get::<ClientAddr>().map(|a| a.0);
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

/// The HTTP answer. The request id is moved in, not cloned: a cloned header value made from
/// bytes costs an allocation.
fn respond(status: StatusCode, reply: Reply, request_id: HeaderValue) -> RpcResponse {
    let has_body = reply.body.is_some();
    let chunks = reply.body.map(Payload::into_chunks).unwrap_or_default();
    let mut response = RpcResponse::new(ChunkBody::new(chunks));
    *response.status_mut() = status;
    *response.headers_mut() = answer_headers(has_body, reply.served_by.as_str(), request_id);
    response
}

/// The headers of a JSON-RPC answer: `content-type` (when there is a body), what served it and
/// the request id. Copied from a map made once per thread, and the two values set by
/// position: inserting by name hashes each name and probes the table on every answer.
fn answer_headers(has_body: bool, served_by: &'static str, request_id: HeaderValue) -> HeaderMap {
    thread_local! {
        static TEMPLATES: [HeaderMap; 2] = [false, true].map(|has_body| {
            let mut headers = HeaderMap::with_capacity(3);
            if has_body {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            headers.insert(SERVED_BY_NAME, HeaderValue::from_static("local"));
            headers.insert(REQUEST_ID_NAME, HeaderValue::from_static("0"));
            headers
        });
    }
    let mut headers = TEMPLATES.with(|t| t[usize::from(has_body)].clone());
    let mut request_id = Some(request_id);
    for (name, value) in headers.iter_mut() {
        if name == SERVED_BY_NAME {
            *value = HeaderValue::from_static(served_by);
        } else if name == REQUEST_ID_NAME {
            if let Some(id) = request_id.take() {
                *value = id;
            }
        }
    }
    headers
}

/// A JSON-RPC answer over HTTP: its body type is concrete, so that the server hands it to
/// hyper without boxing it (the router's own answers are boxed `axum` bodies).
pub type RpcResponse = http::Response<ChunkBody>;

/// A response body of chunks written together (hyper writes them with one vectored write).
pub struct ChunkBody {
    chunks: sluice_jsonrpc::Chunks,
    /// The next chunk to hand out.
    next: usize,
    remaining: u64,
}

impl ChunkBody {
    fn new(chunks: sluice_jsonrpc::Chunks) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        let mut chunks = chunks;
        chunks.retain(|c| !c.is_empty());
        Self { chunks, next: 0, remaining }
    }
}

impl http_body::Body for ChunkBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = &mut *self;
        // Taken out, leaving an empty `Bytes` (no allocation) behind.
        let next = this.chunks.get_mut(this.next).map(std::mem::take);
        if let Some(chunk) = &next {
            this.next += 1;
            this.remaining -= chunk.len() as u64;
        }
        std::task::Poll::Ready(next.map(|c| Ok(http_body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.chunks.len()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
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

/// Ready when, on every network, an upstream answers `eth_chainId` within two seconds; the
/// body names the networks that are not. Not ready once shutdown has started.
async fn ready(State(state): State<AppState>) -> Response {
    if state.gateway.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining: shutting down\n").into_response();
    }
    let probes = state.gateway.networks().iter().map(|network| async move {
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

    #[test]
    fn answer_headers_carry_their_values_and_a_content_type_only_with_a_body() {
        for has_body in [true, false] {
            for (served_by, id) in [("cache-memory", "ab12"), ("upstream", "trace-42")] {
                let headers = answer_headers(has_body, served_by, HeaderValue::from_static(id));
                assert_eq!(headers.len(), 2 + usize::from(has_body));
                assert_eq!(headers[SERVED_BY], served_by);
                assert_eq!(headers[REQUEST_ID], id);
                assert_eq!(headers.get(CONTENT_TYPE).is_some(), has_body);
            }
        }
    }

    #[test]
    fn hex_digits_have_no_leading_zeros() {
        let mut out = [0u8; 16];
        for (n, hex) in [(0, "0"), (1, "1"), (0xabc, "abc"), (0x10, "10"), (u64::MAX, "ffffffffffffffff")] {
            assert_eq!(hex_digits(n, &mut out), hex.as_bytes(), "{n:#x}");
        }
    }

    #[test]
    fn request_ids_are_unique_across_threads() {
        // More ids per thread than one block holds, so threads go through several blocks.
        let per_thread = (ID_BLOCK * 2 + 5) as usize;
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || (0..per_thread).map(|_| next_request_id()).collect::<Vec<u64>>()))
            .collect();
        let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().expect("thread ends")).collect();
        let given = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), given, "an id was given out twice");
        assert!(all[0] > 0, "0 is never an id");
    }

    #[test]
    fn a_short_printable_request_id_is_kept_and_others_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID_NAME, HeaderValue::from_static("trace-42"));
        assert_eq!(request_id(&headers), "trace-42");
        headers.insert(REQUEST_ID_NAME, HeaderValue::from_bytes(&[b'a'; 65]).expect("valid"));
        let own = request_id(&headers);
        assert!(own.len() <= 16 && own.to_str().expect("ascii").bytes().all(|b| b.is_ascii_hexdigit()), "{own:?}");
    }
}
