//! The sluice gateway: the HTTP + WebSocket server and the JSON-RPC request pipeline.
//!
//! Read the request path top to bottom:
//! 1. [`server`] accepts connections (bounded), hands each to a [`lanes`] thread, applies
//!    client timeouts and drains on shutdown;
//! 2. [`http`] reads a bounded body, or upgrades to a WebSocket session in [`ws`];
//! 3. [`pipeline`] is the one path for HTTP bodies and WebSocket messages: admission, access and
//!    quotas, method policy, then calls with their context down the layers, a batch's calls
//!    together.
//!
//! The [`Gateway`] is assembled once by [`GatewayBuilder`]; `/status` reads a [`StatusBoard`]
//! that components report to, not the call path.
//!
//! Decisions live in pure code ([`route`], `sluice-jsonrpc`); sockets live here at the edge.

pub mod admin;
pub mod answer;
pub mod header_timer;
pub mod http;
pub mod lanes;
pub mod network;
pub mod page;
pub mod pipeline;
pub mod policy;
pub mod route;
pub mod scope;
pub mod server;
pub mod stop;
pub mod telemetry;
pub mod ws;

use std::sync::Arc;
use std::time::Duration;

use sluice_upstream::Upstreams;

pub use network::Network;
pub use pipeline::{
    admission_limit, Admitted, BodyKind, Edge, Layer, Pipeline, Refused, Reply, ServedBy, Shared, Stacked, Steps,
};
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
    /// priority p may use only (10 − p)/10 of it, so lower tiers are shed first; a body of
    /// transaction submissions only half of its tier's share, so submissions never crowd out reads.
    pub max_in_flight: usize,
    /// Most subscriptions one WebSocket client may hold.
    pub max_subscriptions_per_socket: usize,
    /// Time given to in-flight requests on shutdown.
    pub shutdown_grace: Duration,
    /// On shutdown, how long to keep serving with `/ready` answering 503 before the listener
    /// closes, so that load balancers (Kubernetes endpoints) stop sending first.
    pub drain_delay: Duration,
    /// Threads that serve client connections, each its own connections start to end
    /// ([`lanes`]); 0 serves them on the shared runtime instead.
    pub lanes: usize,
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
            drain_delay: Duration::ZERO,
            lanes: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

pub use sluice_subscriptions::{FeedItem, FeedSet, FeedStream, LocalFeeds, SharedRelay};

/// Everything a request handler needs, shared by all connections. Built by [`GatewayBuilder`].
pub struct Gateway {
    networks: Vec<Network>,
    directory: network::Directory,
    shared: Arc<pipeline::Shared>,
    /// Client limits.
    pub limits: Limits,
    /// Renders `/metrics`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Open WebSocket sessions, bounded by `limits.max_connections` (an upgraded connection
    /// leaves the HTTP connection count, so it is counted here instead).
    pub sessions: Arc<tokio::sync::Semaphore>,
    /// What `/status` shows besides the networks (process-wide parts: the mesh).
    status: StatusBoard,
    /// Set when shutdown starts: `/ready` answers 503 from then on.
    draining: std::sync::atomic::AtomicBool,
    /// Who may see the status page on the main listener.
    pub page: page::PageAccess,
}

impl Gateway {
    /// Puts new method policies in force on every network (a reload); open connections stay.
    pub fn set_policies(&self, policies: policy::Policies) {
        self.shared.set_policies(policies);
    }

    /// Marks the gateway as shutting down: `/ready` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::Release);
    }

    /// True once shutdown has started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Access control, when on.
    pub fn access(&self) -> Option<&AccessControl> {
        self.shared.access()
    }

    /// The networks served, in configuration order.
    pub fn networks(&self) -> &[Network] {
        &self.networks
    }

    /// The network at `index` (as [`network::resolve`] found it).
    pub fn network(&self, index: usize) -> Option<&Network> {
        self.networks.get(index)
    }

    /// Where a request path goes.
    pub fn resolve<'a>(&self, path: &'a str) -> network::PathTarget<'a> {
        network::resolve(path, &self.directory)
    }

    /// The first network's pipeline (the only one of a single-network gateway).
    pub fn pipeline(&self) -> &Pipeline {
        &self.networks[0].pipeline
    }

    /// What `/status` shows: a single implicit network's parts at the top level, as always;
    /// named networks each under `networks.{id}`; process-wide parts under their names.
    pub fn render_status(&self) -> serde_json::Value {
        let mut map = match (&self.networks[..], self.directory.named) {
            ([only], false) => match only.status.render() {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            },
            (networks, _) => {
                let each = networks
                    .iter()
                    .map(|n| {
                        let mut part = n.status.render();
                        if let serde_json::Value::Object(fields) = &mut part {
                            fields.insert("chain_id".into(), serde_json::json!(n.chain_id));
                        }
                        (n.id.to_string(), part)
                    })
                    .collect();
                let mut map = serde_json::Map::new();
                map.insert("networks".into(), serde_json::Value::Object(each));
                map
            }
        };
        if let serde_json::Value::Object(process) = self.status.render() {
            map.extend(process.into_iter().filter(|(k, v)| !(k == "upstreams" && v == &serde_json::json!([]))));
        }
        serde_json::Value::Object(map)
    }
}

/// A tier's own method lists: its name, denied patterns, allowed patterns.
pub type TierLists = (String, Vec<String>, Vec<String>);

/// One network to serve, as [`GatewayBuilder::network`] takes it.
pub struct NetworkSpec {
    /// Its id (`eth`; [`sluice_upstream::DEFAULT_NETWORK`] for an implicit single network).
    pub id: String,
    /// Its chain id, when known.
    pub chain_id: Option<u64>,
    /// The layers its calls go down.
    pub upstreams: Arc<dyn Upstreams>,
    /// Where subscriptions not served locally go (one shared upstream socket).
    pub relay: Option<Arc<SharedRelay>>,
    /// Subscriptions served locally (heads and logs from the hub, pending transactions).
    pub local_feeds: Option<Arc<dyn LocalFeeds>>,
    /// What `/ready` asks (default: `upstreams`).
    pub readiness: Option<Arc<dyn Upstreams>>,
    /// Its part of `/status`.
    pub status: StatusBoard,
    /// Served at `/` too.
    pub default: bool,
    /// Its head, when it follows one: each call's view of the chain is taken from it when the
    /// call is admitted, and the answers relayed teach it (read-your-writes across methods).
    pub head: Option<sluice_upstream::HeadView>,
}

impl NetworkSpec {
    /// A network `id` answered through `upstreams`, nothing else set.
    pub fn new(id: impl Into<String>, upstreams: Arc<dyn Upstreams>) -> Self {
        Self {
            id: id.into(),
            chain_id: None,
            upstreams,
            relay: None,
            local_feeds: None,
            readiness: None,
            status: StatusBoard::default(),
            default: false,
            head: None,
        }
    }
}

/// Assembles a [`Gateway`] once; nothing can be added after it is shared.
pub struct GatewayBuilder {
    limits: Limits,
    policy: policy::MethodPolicy,
    access: Option<(sluice_access::Access, Vec<TierLists>)>,
    networks: Vec<NetworkSpec>,
    named: bool,
    status: StatusBoard,
    page: page::PageAccess,
}

impl GatewayBuilder {
    /// A gateway within `limits`; node-key and admin methods are denied (see
    /// [`policy::MethodPolicy::default`]). Add its networks with [`GatewayBuilder::network`].
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            policy: policy::MethodPolicy::default(),
            access: None,
            networks: Vec::new(),
            named: false,
            status: StatusBoard::default(),
            page: page::PageAccess::default(),
        }
    }

    /// A gateway of one implicit network answering through `upstreams`.
    pub fn single(upstreams: Arc<dyn Upstreams>, limits: Limits) -> Self {
        let mut network = NetworkSpec::new(sluice_upstream::DEFAULT_NETWORK, upstreams);
        network.default = true;
        Self::new(limits).network(network)
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

    /// A network to serve. With [`GatewayBuilder::named`], each at `/{id}` and `/evm/{chainId}`.
    pub fn network(mut self, network: NetworkSpec) -> Self {
        self.networks.push(network);
        self
    }

    /// The networks were configured by name (`[[networks]]`): paths name them, and `/{key}`
    /// is no longer a key path.
    pub fn named(mut self, named: bool) -> Self {
        self.named = named;
        self
    }

    /// Process-wide parts of `/status` (the networks report their own).
    pub fn status(mut self, status: StatusBoard) -> Self {
        self.status = status;
        self
    }

    /// Who may see the status page on the main listener (default: loopback clients).
    pub fn status_page(mut self, access: page::PageAccess) -> Self {
        self.page = access;
        self
    }

    /// The gateway.
    ///
    /// # Panics
    /// With no network: a gateway serves at least one.
    pub fn build(self) -> Arc<Gateway> {
        assert!(!self.networks.is_empty(), "a gateway serves at least one network");
        let (access, tiers) = match self.access {
            Some((access, tiers)) => (Some(AccessControl { access, usage: Default::default() }), tiers),
            None => (None, Vec::new()),
        };
        let policies = policy::Policies::new(self.policy, &tiers);
        let shared = pipeline::Shared::new(self.limits.max_batch_len, self.limits.max_in_flight, policies, access);
        let only = self.networks.len() == 1;
        let mut directory = network::Directory { named: self.named, ..Default::default() };
        let networks = self
            .networks
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                if spec.default || only {
                    directory.default.get_or_insert(i);
                }
                directory.entries.push(network::Entry { id: spec.id.clone(), chain_id: spec.chain_id });
                let id: Arc<str> = Arc::from(spec.id.as_str());
                let readiness = spec.readiness.unwrap_or_else(|| spec.upstreams.clone());
                Network {
                    pipeline: Pipeline::for_network(id.clone(), spec.upstreams, shared.clone()).with_head(spec.head),
                    id,
                    chain_id: spec.chain_id,
                    relay: spec.relay,
                    local_feeds: spec.local_feeds,
                    readiness,
                    status: spec.status,
                }
            })
            .collect();
        Arc::new(Gateway {
            networks,
            directory,
            shared,
            sessions: Arc::new(tokio::sync::Semaphore::new(self.limits.max_connections)),
            limits: self.limits,
            metrics: telemetry::prometheus(),
            status: self.status,
            draining: std::sync::atomic::AtomicBool::new(false),
            page: self.page,
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
