//! The admin API: manage keys while sluice runs, on a listen address of its own, behind a
//! bearer token of its own. A thin HTTP shell over [`sluice_access::manage`].
//!
//! * `GET /keys`, `GET /keys/{id}`: keys (ids, tiers, scopes; never the keys themselves);
//! * `POST /keys` `{tier, networks?, methods?, contracts?, allow_ips?, deny_ips?, label?, key?}`:
//!   201 with the new key, shown once;
//! * `PATCH /keys/{id}`: changes only the fields given; `DELETE /keys/{id}`: revokes (204);
//! * `GET /keys/{id}/usage?days=N`, `GET /callers/{caller}/usage?days=N`: calls and compute
//!   units per UTC day and method.
//!
//! * `GET /` (a browser): the status page ([`crate::page`]); `GET /status`, `GET /status/live`
//!   and `GET /metrics` as on the main listener.
//!
//! Without the token: 401. A bad body: 400 naming the field. Errors are `{"error": "…"}`.
//! A browser cannot send a bearer token when it opens a page: `GET /?token=…` with the right
//! token answers with a cookie (HttpOnly, SameSite=Strict) that stands for it on this listener,
//! and sends the browser on to `/`, so the token leaves the address bar and history.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http::StatusCode;
use serde::Deserialize;
use sluice_access::manage::{KeyPatch, ManageError};
use sluice_access::{Access, KeySpec};
use tokio::net::TcpListener;

use crate::Gateway;

/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;

#[derive(Clone)]
struct Admin {
    gateway: Arc<Gateway>,
    token: Arc<str>,
}

/// A refusal: its status and message, sent as `{"error": message}`.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<ManageError> for Failure {
    fn from(e: ManageError) -> Self {
        let status = match e {
            ManageError::Invalid(_) => StatusCode::BAD_REQUEST,
            ManageError::NotFound(_) => StatusCode::NOT_FOUND,
            ManageError::ReadOnly(_) => StatusCode::CONFLICT,
            ManageError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Failure(status, e.to_string())
    }
}

fn bad(message: impl Into<String>) -> Failure {
    Failure(StatusCode::BAD_REQUEST, message.into())
}

type Answer = Result<Response, Failure>;

impl Admin {
    fn access(&self) -> Result<&Access, Failure> {
        let control = self.gateway.access();
        control.map(|c| &c.access).ok_or_else(|| Failure(StatusCode::NOT_FOUND, "access control is off".into()))
    }

    fn networks(&self) -> Vec<String> {
        self.gateway.networks().iter().map(|n| n.id.to_string()).collect()
    }
}

/// The admin routes for `gateway`, requiring `Authorization: Bearer {token}`.
pub fn router(gateway: Arc<Gateway>, token: &str) -> Router {
    let admin = Admin { gateway, token: Arc::from(token) };
    Router::new()
        .route("/", get(page))
        .route("/status", get(status))
        .route("/status/live", get(live))
        .route("/metrics", get(metrics))
        .route("/keys", get(list).post(create))
        .route("/keys/{id}", get(show).patch(update).delete(revoke))
        .route("/keys/{id}/usage", get(key_usage))
        .route("/callers/{caller}/usage", get(caller_usage))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .route_layer(middleware::from_fn_with_state(admin.clone(), authorize))
        .with_state(admin)
}

/// Serves the admin API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    token: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let app = router(gateway, &token);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        tracing::warn!(error = %e, "admin API stopped");
    }
}

/// Compares without stopping at the first difference (the token's length is not secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The cookie that stands for the token in a browser: a digest of it, so that the browser never
/// holds the token itself.
const COOKIE: &str = "sluice_admin";

fn cookie_value(token: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("sluice admin page\0{token}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn presented_cookie(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(name, value)| (name == COOKIE).then_some(value))
}

fn query_token(uri: &http::Uri) -> Option<&str> {
    uri.query()?.split('&').find_map(|pair| pair.strip_prefix("token="))
}

async fn authorize(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let cookie = presented_cookie(request.headers());
    if cookie.is_some_and(|c| same(c.as_bytes(), cookie_value(&admin.token).as_bytes())) {
        return next.run(request).await;
    }
    let browser = crate::page::wants_page(request.method(), request.headers());
    if let (true, Some(token)) = (browser && request.uri().path() == "/", query_token(request.uri())) {
        if same(token.as_bytes(), admin.token.as_bytes()) {
            let cookie = format!("{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/", cookie_value(&admin.token));
            return (StatusCode::SEE_OTHER, [(http::header::SET_COOKIE, cookie), (http::header::LOCATION, "/".into())])
                .into_response();
        }
    }
    let why = match presented {
        Some(token) if same(token.as_bytes(), admin.token.as_bytes()) => return next.run(request).await,
        Some(_) => "wrong admin token",
        None if browser => "the status page needs the admin token: open /?token=<admin token>",
        None => "the admin API needs Authorization: Bearer <admin token>",
    };
    Failure(StatusCode::UNAUTHORIZED, why.into()).into_response()
}

async fn page() -> Response {
    crate::page::page()
}

async fn status(State(admin): State<Admin>) -> Response {
    Json(admin.gateway.render_status()).into_response()
}

async fn live(State(admin): State<Admin>) -> Response {
    crate::page::live(admin.gateway.clone())
}

async fn metrics(State(admin): State<Admin>) -> Response {
    admin.gateway.metrics.run_upkeep();
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], admin.gateway.metrics.render()).into_response()
}

/// Parses a JSON value; the error names the field (`tier: invalid type: …`).
fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, Failure> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        bad(if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) })
    })
}

fn object(body: &Bytes) -> Result<serde_json::Map<String, serde_json::Value>, Failure> {
    match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("body: must be a JSON object")),
        Err(e) => Err(bad(format!("body: not JSON: {e}"))),
    }
}

async fn list(State(admin): State<Admin>) -> Answer {
    Ok(Json(serde_json::json!({ "keys": admin.access()?.list_keys() })).into_response())
}

async fn show(State(admin): State<Admin>, Path(id): Path<String>) -> Answer {
    Ok(Json(admin.access()?.key(&id)?).into_response())
}

async fn create(State(admin): State<Admin>, body: Bytes) -> Answer {
    let access = admin.access()?;
    let mut fields = object(&body)?;
    let key = match fields.remove("key") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(k)) => Some(k),
        Some(_) => return Err(bad("key: must be a string")),
    };
    let spec: KeySpec = parse(serde_json::Value::Object(fields))?;
    let view = access.create_key(spec, key, &admin.networks()).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn update(State(admin): State<Admin>, Path(id): Path<String>, body: Bytes) -> Answer {
    let patch: KeyPatch = parse(serde_json::Value::Object(object(&body)?))?;
    Ok(Json(admin.access()?.update_key(&id, patch, &admin.networks()).await?).into_response())
}

async fn revoke(State(admin): State<Admin>, Path(id): Path<String>) -> Answer {
    admin.access()?.revoke_key(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct Days {
    days: Option<u64>,
}

async fn key_usage(State(admin): State<Admin>, Path(id): Path<String>, Query(q): Query<Days>) -> Answer {
    let days = admin.access()?.key_usage(&id, q.days.unwrap_or(1)).await?;
    Ok(Json(serde_json::json!({ "id": id, "days": days })).into_response())
}

async fn caller_usage(State(admin): State<Admin>, Path(caller): Path<String>, Query(q): Query<Days>) -> Answer {
    let days = admin.access()?.caller_usage(&caller, q.days.unwrap_or(1)).await?;
    Ok(Json(serde_json::json!({ "caller": caller, "days": days })).into_response())
}
