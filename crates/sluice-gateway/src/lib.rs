//! The sluice gateway: the HTTP + WebSocket server and the JSON-RPC request pipeline.
//!
//! Read the request path top to bottom:
//! 1. [`server`] accepts connections (bounded), applies client timeouts and drains on shutdown;
//! 2. [`http`] reads a bounded body, or upgrades to a WebSocket session in [`ws`];
//! 3. [`pipeline`] is the one path for HTTP bodies and WebSocket messages: admission, access and
//!    quotas, method policy, then calls with their context down the layers, a batch's calls
//!    together.
//!
//! The [`Gateway`] is assembled once by [`GatewayBuilder`]; `/status` reads a [`StatusBoard`]
//! that components report to, not the call path.
//!
//! Decisions live in pure code ([`route`], `sluice-jsonrpc`); sockets live here at the edge.

pub mod http;
pub mod pipeline;
pub mod policy;
pub mod route;
pub mod server;
pub mod telemetry;
pub mod ws;

use std::sync::Arc;
use std::time::Duration;

use sluice_upstream::Upstreams;

pub use pipeline::{admission_limit, Admitted, Edge, Pipeline, Refused, Reply, ServedBy};
pub use server::serve;

/// Limits that keep memory and time bounded whatever clients send.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body (HTTP) or message (WebSocket), in bytes.
    pub max_body_bytes: usize,
    /// Most calls in one batch.
    pub max_batch_len: usize,
    /// Time a client has to send its request headers and body; idle keep-alive connections are
    /// closed after it too.
    pub client_timeout: Duration,
    /// Most client connections open at once; further clients wait in the accept queue.
    pub max_connections: usize,
    /// Most HTTP requests being answered at once; beyond it, HTTP 429 at once. A tier of
    /// priority p may use only (10 − p)/10 of it, so lower tiers are shed first.
    pub max_in_flight: usize,
    /// Most subscriptions one WebSocket client may hold.
    pub max_subscriptions_per_socket: usize,
    /// Time given to in-flight requests on shutdown.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 5 * 1024 * 1024,
            max_batch_len: 1000,
            client_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            max_in_flight: 8_192,
            max_subscriptions_per_socket: 256,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// A subscription's notifications (each one the `result` of an `eth_subscription` message).
pub type FeedStream = futures_util::stream::BoxStream<'static, Box<serde_json::value::RawValue>>;

/// Subscriptions sluice serves itself instead of relaying them from an upstream socket (the
/// mempool's `newPendingTransactions`).
pub trait LocalFeeds: Send + Sync + 'static {
    /// The notifications for these `eth_subscribe` params, or `None` when they are not
    /// served locally (they then go upstream).
    fn subscribe(&self, params: &[serde_json::Value]) -> Option<FeedStream>;
}

/// Everything a request handler needs, shared by all connections. Built by [`GatewayBuilder`].
pub struct Gateway {
    /// The request pipeline (HTTP and WebSocket alike).
    pub pipeline: Pipeline,
    /// Where `eth_subscribe` goes: the upstream's `ws://` URL, if it has one.
    pub subscription_url: Option<String>,
    /// Deadline for upstream WebSocket connects and calls.
    pub upstream_timeout: Duration,
    /// Client limits.
    pub limits: Limits,
    /// Renders `/metrics`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Open WebSocket sessions, bounded by `limits.max_connections` (an upgraded connection
    /// leaves the HTTP connection count, so it is counted here instead).
    pub sessions: Arc<tokio::sync::Semaphore>,
    /// Subscriptions answered locally, checked before going upstream.
    pub local_feeds: Option<Arc<dyn LocalFeeds>>,
    /// What `/status` shows.
    pub status: StatusBoard,
    /// What `/ready` asks (the upstream pool, below every cache).
    pub readiness: Arc<dyn Upstreams>,
}

impl Gateway {
    /// Access control, when on.
    pub fn access(&self) -> Option<&AccessControl> {
        self.pipeline.access()
    }
}

/// A tier's own method lists: its name, denied patterns, allowed patterns.
pub type TierLists = (String, Vec<String>, Vec<String>);

/// Assembles a [`Gateway`] once; nothing can be added after it is shared.
pub struct GatewayBuilder {
    upstreams: Arc<dyn Upstreams>,
    limits: Limits,
    policy: policy::MethodPolicy,
    access: Option<(sluice_access::Access, Vec<TierLists>)>,
    local_feeds: Option<Arc<dyn LocalFeeds>>,
    subscription_url: Option<String>,
    upstream_timeout: Duration,
    status: StatusBoard,
    readiness: Option<Arc<dyn Upstreams>>,
}

impl GatewayBuilder {
    /// A gateway answering through `upstreams` within `limits`; node-key and admin methods are
    /// denied (see [`policy::MethodPolicy::default`]).
    pub fn new(upstreams: Arc<dyn Upstreams>, limits: Limits) -> Self {
        Self {
            upstreams,
            limits,
            policy: policy::MethodPolicy::default(),
            access: None,
            local_feeds: None,
            subscription_url: None,
            upstream_timeout: Duration::from_secs(30),
            status: StatusBoard::default(),
            readiness: None,
        }
    }

    /// The method policy for everyone.
    pub fn method_policy(mut self, policy: policy::MethodPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// API keys, tiers and quotas; `tiers` gives each tier's own method lists (deny, allow),
    /// added to the global policy.
    pub fn access(mut self, access: sluice_access::Access, tiers: Vec<TierLists>) -> Self {
        self.access = Some((access, tiers));
        self
    }

    /// Subscriptions sluice serves itself.
    pub fn local_feeds(mut self, feeds: Arc<dyn LocalFeeds>) -> Self {
        self.local_feeds = Some(feeds);
        self
    }

    /// Where relayed subscriptions go, and the deadline for that socket.
    pub fn subscriptions(mut self, url: Option<String>, timeout: Duration) -> Self {
        self.subscription_url = url;
        self.upstream_timeout = timeout;
        self
    }

    /// What `/status` shows.
    pub fn status(mut self, status: StatusBoard) -> Self {
        self.status = status;
        self
    }

    /// What `/ready` asks for the chain id (default: the upstreams the pipeline calls).
    pub fn readiness(mut self, upstreams: Arc<dyn Upstreams>) -> Self {
        self.readiness = Some(upstreams);
        self
    }

    /// The gateway.
    pub fn build(self) -> Arc<Gateway> {
        let access = self.access.map(|(access, tiers)| {
            let policies =
                tiers.iter().map(|(name, deny, allow)| (name.clone(), self.policy.with(deny, allow))).collect();
            AccessControl { access, policies, usage: Default::default() }
        });
        let readiness = self.readiness.unwrap_or_else(|| self.upstreams.clone());
        let pipeline =
            Pipeline::new(self.upstreams, self.limits.max_batch_len, self.limits.max_in_flight, self.policy, access);
        Arc::new(Gateway {
            pipeline,
            sessions: Arc::new(tokio::sync::Semaphore::new(self.limits.max_connections)),
            subscription_url: self.subscription_url,
            upstream_timeout: self.upstream_timeout,
            limits: self.limits,
            metrics: telemetry::prometheus(),
            local_feeds: self.local_feeds,
            status: self.status,
            readiness,
        })
    }
}

/// A component's part of `/status`.
pub type StatusSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// What `/status` shows: each component reports under its own name; a source named `""` has
/// its fields at the top level (the upstream pool's `best_head` and `upstreams`).
#[derive(Clone, Default)]
pub struct StatusBoard {
    sources: Vec<(String, StatusSource)>,
}

impl StatusBoard {
    /// Adds a component's report under `name`.
    pub fn add(&mut self, name: &str, source: StatusSource) {
        self.sources.push((name.to_owned(), source));
    }

    /// The whole report.
    pub fn render(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert("upstreams".into(), serde_json::Value::Array(Vec::new()));
        for (name, source) in &self.sources {
            match (name.as_str(), source()) {
                ("", serde_json::Value::Object(fields)) => map.extend(fields),
                ("", _) => {}
                (name, value) => {
                    map.insert(name.to_owned(), value);
                }
            }
        }
        serde_json::Value::Object(map)
    }
}

/// Access control as the gateway applies it.
pub struct AccessControl {
    /// Keys, tiers and the quota store.
    pub access: sluice_access::Access,
    /// Each tier's method policy: the global one with the tier's lists added.
    pub policies: std::collections::HashMap<String, policy::MethodPolicy>,
    /// WebSocket connections and subscriptions held per key.
    pub usage: Arc<std::sync::Mutex<std::collections::HashMap<String, KeyUsage>>>,
}

/// What one key holds open.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyUsage {
    /// WebSocket connections.
    pub connections: u32,
    /// Subscriptions across them.
    pub subscriptions: u32,
}

/// A WebSocket connection counted against its key; closing it releases the place.
pub struct SessionSlot {
    usage: Arc<std::sync::Mutex<std::collections::HashMap<String, KeyUsage>>>,
    key: String,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = usage.get_mut(&self.key) {
            u.connections = u.connections.saturating_sub(1);
            if u.connections == 0 && u.subscriptions == 0 {
                usage.remove(&self.key);
            }
        }
    }
}

impl AccessControl {
    /// Counts a new WebSocket connection for `caller`, or says why it may not open one.
    pub fn open_session(&self, caller: &sluice_access::Caller) -> Result<SessionSlot, String> {
        let limit = self.access.tier(caller).and_then(|t| t.max_connections);
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let u = usage.entry(caller.id.clone()).or_default();
        if limit.is_some_and(|l| u.connections >= l) {
            return Err(format!("too many WebSocket connections for this key (limit {})", limit.unwrap_or(0)));
        }
        u.connections += 1;
        Ok(SessionSlot { usage: self.usage.clone(), key: caller.id.clone() })
    }

    /// Takes one subscription place for `caller`; false when its tier's limit is reached.
    pub fn take_subscription(&self, caller: &sluice_access::Caller) -> bool {
        let limit = self.access.tier(caller).and_then(|t| t.max_subscriptions);
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let u = usage.entry(caller.id.clone()).or_default();
        if limit.is_some_and(|l| u.subscriptions >= l) {
            return false;
        }
        u.subscriptions += 1;
        true
    }

    /// Gives back `n` subscription places.
    pub fn release_subscriptions(&self, caller: &sluice_access::Caller, n: u32) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = usage.get_mut(&caller.id) {
            u.subscriptions = u.subscriptions.saturating_sub(n);
        }
    }

    /// The policy for a caller's tier.
    pub fn policy_of(&self, caller: &sluice_access::Caller) -> Option<&policy::MethodPolicy> {
        self.policies.get(&caller.tier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_sources_report_under_their_names() {
        let mut board = StatusBoard::default();
        assert_eq!(board.render(), serde_json::json!({ "upstreams": [] }));
        board.add("", Arc::new(|| serde_json::json!({ "best_head": 5, "upstreams": [1] })));
        board.add("mempool", Arc::new(|| serde_json::json!({ "pending": 0 })));
        assert_eq!(
            board.render(),
            serde_json::json!({ "best_head": 5, "upstreams": [1], "mempool": { "pending": 0 } })
        );
    }
}
