//! The status page: one self-contained HTML page served by sluice itself (as HAProxy's stats
//! page or Traefik's dashboard are), for whoever runs or debugs a live sluice.
//!
//! * `GET /` with `Accept: text/html` (a browser) answers the page: its style and script are
//!   inline and allowed by hash in a strict Content-Security-Policy, so it needs nothing from
//!   any other origin and works offline.
//! * `GET /status/live` is a Server-Sent Events stream the page reads (one request, however
//!   long the page stays open): once a second, and within a quarter second of a change in
//!   `/status`, what `/status` shows and the `/metrics` families the page draws (rates and
//!   latency percentiles are computed in the page from counter deltas, by the time each
//!   snapshot carries). No second source of truth; nothing runs while nobody looks (the
//!   stream's timer lives with the connection).
//!
//! On the main listener the page is for loopback clients by default ([`PageAccess`]); on the
//! admin listener it sits behind the admin token like the rest of the admin API.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method};
use serde::{Deserialize, Serialize};

use crate::Gateway;

const TEMPLATE: &str = include_str!("status.html");
const STYLE: &str = include_str!("status.css");
const SCRIPT: &str = include_str!("status.js");

/// How often the live stream sends a snapshot when nothing changed.
const EVERY: Duration = Duration::from_secs(1);
/// How often it looks at `/status` for a change.
const LOOK: Duration = Duration::from_millis(250);

/// The metric families the page reads; the rest of `/metrics` is not sent to it.
const FAMILIES: &[&str] = &[
    "sluice_requests_total",
    "sluice_served_total",
    "sluice_request_duration_seconds_bucket",
    "sluice_upstream_calls_total",
    "sluice_cache_bytes",
    "sluice_chain_head",
    "sluice_mempool_accepted_total",
    "sluice_websocket_sessions",
    "sluice_subscription_log_filters",
    "sluice_upstream_sockets",
    "sluice_mesh_peers_connected",
    "sluice_mesh_send_failures_total",
    "sluice_mesh_inbound_failures_total",
    "sluice_ingress_connections",
];

/// The `[status]` section: the status page on the main listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Who may see the page at `/` (a browser's `GET`) and its stream at `/status/live`.
    pub page: PageAccess,
}

/// Who may see the page (and its live stream) on the main listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PageAccess {
    /// Not served: `/` is JSON-RPC only.
    Off,
    /// Served to clients on a loopback address only (an operator on the host, or through an
    /// SSH tunnel). Behind a reverse proxy on the same host every client looks local: turn the
    /// page off there, or use the admin listener.
    #[default]
    Loopback,
    /// Served to anyone who reaches the listener (it shows what `/status` already shows).
    Any,
}

impl PageAccess {
    /// Whether a client at `peer` may see the page.
    pub fn allows(self, peer: Option<IpAddr>) -> bool {
        match self {
            PageAccess::Off => false,
            PageAccess::Any => true,
            PageAccess::Loopback => peer.is_some_and(|ip| ip.to_canonical().is_loopback()),
        }
    }
}

/// Whether a request is a browser asking for a page: a `GET` accepting HTML, not a WebSocket
/// upgrade (a WebSocket client's `GET /` stays a WebSocket).
pub fn wants_page(method: &Method, headers: &HeaderMap) -> bool {
    let accepts_html =
        headers.get_all(http::header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).any(|v| v.contains("text/html"));
    method == Method::GET && accepts_html && !headers.contains_key(http::header::UPGRADE)
}

/// The page and its Content-Security-Policy, assembled once.
struct Page {
    html: String,
    policy: HeaderValue,
}

static PAGE: LazyLock<Page> = LazyLock::new(|| {
    let html = TEMPLATE.replacen("/*STYLE*/", STYLE, 1).replacen("/*SCRIPT*/", SCRIPT, 1);
    // Only this page's own style and script run; it may connect to its own origin only (the
    // live stream) and load nothing else.
    let policy = format!(
        "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        sha256_source(SCRIPT),
        sha256_source(STYLE),
    );
    let policy = HeaderValue::from_str(&policy).unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"));
    Page { html, policy }
});

/// A CSP hash source (`sha256-…`) for an inline element's text.
fn sha256_source(text: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    format!("sha256-{}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(text.as_bytes())))
}

/// The page.
pub fn page() -> Response {
    let page = &*PAGE;
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
        (http::header::CONTENT_SECURITY_POLICY, page.policy.clone()),
        (http::header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (http::header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    (headers, page.html.clone()).into_response()
}

/// The live stream: a snapshot at once, then one a second, and sooner when `/status` changes
/// (looked at four times a second), so that a member going down shows within moments.
pub fn live(gateway: Arc<Gateway>) -> Response {
    let start = Live { gateway, tick: None, sent: None };
    let stream = futures_util::stream::unfold(start, |mut live| async move {
        let tick = live.tick.get_or_insert_with(|| {
            let mut tick = tokio::time::interval(LOOK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        loop {
            tick.tick().await;
            let status = live.gateway.render_status();
            let due = match &live.sent {
                None => true,
                Some((at, last)) => at.elapsed() >= EVERY || *last != status,
            };
            if due {
                let event = snapshot(&live.gateway, &status);
                live.sent = Some((tokio::time::Instant::now(), status));
                return Some((Ok::<Event, Infallible>(event), live));
            }
        }
    });
    sse(stream)
}

/// The live stream's state: its timer and what it sent last, when.
struct Live {
    gateway: Arc<Gateway>,
    tick: Option<tokio::time::Interval>,
    sent: Option<(tokio::time::Instant, serde_json::Value)>,
}

fn sse(stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    let mut response = Sse::new(stream).into_response();
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// One snapshot: `/status` as is, the page's metric families, and the time it was taken.
fn snapshot(gateway: &Gateway, status: &serde_json::Value) -> Event {
    gateway.metrics.run_upkeep();
    let metrics = select(&gateway.metrics.render());
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    let data = serde_json::json!({ "at": at, "status": status, "metrics": metrics });
    Event::default().event("status").data(data.to_string())
}

/// The sample lines of the families the page reads.
fn select(exposition: &str) -> String {
    let mut kept = String::with_capacity(exposition.len() / 4);
    for line in exposition.lines() {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if !line.starts_with('#') && FAMILIES.contains(&name) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_pages_are_for_loopback_clients_only() {
        let local: IpAddr = "127.0.0.1".parse().expect("ip");
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        let remote: IpAddr = "192.0.2.7".parse().expect("ip");
        assert!(PageAccess::Loopback.allows(Some(local)) && PageAccess::Loopback.allows(Some(mapped)));
        assert!(!PageAccess::Loopback.allows(Some(remote)) && !PageAccess::Loopback.allows(None));
        assert!(PageAccess::Any.allows(Some(remote)) && !PageAccess::Off.allows(Some(local)));
    }

    #[test]
    fn a_browser_get_wants_the_page_and_a_websocket_does_not() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::ACCEPT, HeaderValue::from_static("text/html,application/xhtml+xml,*/*;q=0.8"));
        assert!(wants_page(&Method::GET, &headers));
        assert!(!wants_page(&Method::POST, &headers));
        headers.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!wants_page(&Method::GET, &headers));
        assert!(!wants_page(&Method::GET, &HeaderMap::new()));
    }

    #[test]
    fn the_page_is_whole_and_its_policy_names_its_own_script_and_style() {
        let html = &PAGE.html;
        assert!(html.contains(SCRIPT) && html.contains(STYLE) && !html.contains("/*SCRIPT*/"));
        let policy = PAGE.policy.to_str().expect("ascii");
        assert!(policy.contains(&sha256_source(SCRIPT)) && policy.contains("default-src 'none'"), "{policy}");
        // Nothing loaded from anywhere: no external script, style sheet, font or image.
        for loads in ["<script src", "stylesheet", "@import", "url(", "<img", "fetch(\"http"] {
            assert!(!html.contains(loads), "{loads}");
        }
    }

    #[test]
    fn only_the_pages_families_are_sent() {
        let text = "# HELP sluice_requests_total x\nsluice_requests_total{network=\"a\"} 3\n\
                    sluice_requests_totally 1\nsluice_cache_bytes{network=\"a\"} 10\nother 1\n";
        assert_eq!(select(text), "sluice_requests_total{network=\"a\"} 3\nsluice_cache_bytes{network=\"a\"} 10\n");
    }
}
