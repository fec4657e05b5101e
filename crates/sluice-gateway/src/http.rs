//! HTTP handlers: JSON-RPC over POST, WebSocket upgrade on GET, health, readiness and metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{State, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sluice_jsonrpc::{codes, ErrorObject, Request};
use tokio::sync::watch;
use tracing::Instrument;

use crate::pipeline::Reply;
use crate::telemetry::InFlight;
use crate::{ws, Gateway};

/// Header naming what answered: `local`, `upstream` or `mixed`.
pub const SERVED_BY: &str = "x-sluice-served-by";
/// Header carrying the request id (the caller's, if it sent a short one, else sluice's).
pub const REQUEST_ID: &str = "x-request-id";

#[derive(Clone)]
struct AppState {
    gateway: Arc<Gateway>,
    shutdown: watch::Receiver<bool>,
}

/// The routes. `shutdown` tells WebSocket sessions to close when the server stops.
pub fn router(gateway: Arc<Gateway>, shutdown: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/", post(rpc).get(upgrade))
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(AppState { gateway, shutdown })
}

fn request_id(headers: &HeaderMap) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:x}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

async fn rpc(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let _in_flight = InFlight::start("http");
    let id = request_id(&headers);
    let span = tracing::debug_span!("rpc", request_id = %id);
    let limits = &state.gateway.limits;
    let declared = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let bytes = if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        Err(too_large(limits.max_body_bytes))
    } else {
        read_body(body, limits.max_body_bytes, limits.client_timeout).await
    };
    let (status, reply) = match bytes {
        Ok(bytes) => (StatusCode::OK, state.gateway.pipeline.handle(&bytes).instrument(span).await),
        Err(refusal) => refusal,
    };
    respond(status, reply, &id)
}

async fn read_body(body: Body, limit: usize, deadline: Duration) -> Result<bytes::Bytes, (StatusCode, Reply)> {
    match tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
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

fn too_large(limit: usize) -> (StatusCode, Reply) {
    let e = ErrorObject::new(codes::LIMIT_EXCEEDED, format!("request body too large: limit {limit} bytes"));
    (StatusCode::PAYLOAD_TOO_LARGE, Reply::local_error(e))
}

fn respond(status: StatusCode, reply: Reply, request_id: &str) -> Response {
    let mut response = match reply.body {
        Some(json) => (status, [(CONTENT_TYPE, "application/json")], json).into_response(),
        None => status.into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(SERVED_BY, HeaderValue::from_static(reply.served_by.as_str()));
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(REQUEST_ID, value);
    }
    response
}

async fn upgrade(State(state): State<AppState>, ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>) -> Response {
    let Ok(ws) = ws else {
        return (StatusCode::METHOD_NOT_ALLOWED, "POST JSON-RPC here, or open a WebSocket\n").into_response();
    };
    let Ok(permit) = state.gateway.sessions.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many WebSocket sessions\n").into_response();
    };
    let limit = state.gateway.limits.max_body_bytes;
    ws.max_message_size(limit).max_frame_size(limit).on_upgrade(move |socket| async move {
        ws::session(socket, state.gateway, state.shutdown).await;
        drop(permit);
    })
}

/// Ready when an upstream answers `eth_chainId` within two seconds.
async fn ready(State(state): State<AppState>) -> Response {
    let probe = Request::new(Some(sluice_jsonrpc::Id::number(1)), "eth_chainId", None);
    let upstreams = state.gateway.pipeline.upstreams();
    match tokio::time::timeout(Duration::from_secs(2), upstreams.call(&probe)).await {
        Ok(Ok(answer)) if !answer.outcome.is_error() => (StatusCode::OK, "ready\n").into_response(),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "no upstream answers\n").into_response(),
    }
}

/// Upstream health as JSON (the pool's members, the cache), for operators.
async fn status(State(state): State<AppState>) -> Response {
    let body = match state.gateway.pipeline.upstreams().status() {
        serde_json::Value::Null => serde_json::json!({ "upstreams": [] }),
        status => status,
    };
    ([(CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    state.gateway.metrics.run_upkeep();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], state.gateway.metrics.render()).into_response()
}
