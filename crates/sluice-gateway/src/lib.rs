//! The sluice gateway: the HTTP + WebSocket server and the JSON-RPC request pipeline.
//!
//! Read the request path top to bottom:
//! 1. [`server`] accepts connections (bounded), applies client timeouts and drains on shutdown;
//! 2. [`http`] reads a bounded body, or upgrades to a WebSocket session in [`ws`];
//! 3. [`pipeline`] parses the body, asks [`route`] what to do with each call, makes the upstream
//!    calls (a batch's pass-through calls as one upstream batch) and assembles the answer.
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

pub use pipeline::{Pipeline, Reply, ServedBy, Who};
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

/// Everything a request handler needs, shared by all connections.
pub struct Gateway {
    /// The request pipeline.
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
    /// API keys, tiers and quotas; `None`: everyone may call, without limits.
    pub access: Option<AccessControl>,
    /// HTTP requests being answered now (load shedding).
    pub in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

/// One admitted request; leaving releases its place.
pub struct Admitted(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// How many requests a caller of `priority` may find in flight and still be admitted. Pure.
pub fn admission_limit(max_in_flight: usize, priority: u8) -> usize {
    max_in_flight * (10 - usize::from(priority.min(9))) / 10
}

impl Gateway {
    /// Admits one request of `priority` (0 highest), or `None` when the gateway is too busy for it.
    pub fn admit(&self, priority: u8) -> Option<Admitted> {
        let limit = admission_limit(self.limits.max_in_flight, priority);
        let counter = &self.in_flight;
        counter
            .fetch_update(std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Admitted(counter.clone()))
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

impl Gateway {
    /// Builds the shared state from its parts.
    pub fn new(
        upstreams: Arc<dyn Upstreams>,
        subscription_url: Option<String>,
        upstream_timeout: Duration,
        limits: Limits,
    ) -> Arc<Self> {
        Arc::new(Self {
            pipeline: Pipeline::new(upstreams, limits.max_batch_len),
            sessions: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
            subscription_url,
            upstream_timeout,
            limits,
            metrics: telemetry::prometheus(),
            local_feeds: None,
            access: None,
            in_flight: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        })
    }

    /// The same gateway, with API keys, tiers and quotas; `tiers` gives each tier's own
    /// method lists (deny, allow), added to the gateway's policy.
    pub fn with_access(
        self: Arc<Self>,
        access: sluice_access::Access,
        tiers: &[(String, Vec<String>, Vec<String>)],
    ) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut gateway) => {
                let global = gateway.pipeline.policy().clone();
                let policies =
                    tiers.iter().map(|(name, deny, allow)| (name.clone(), global.with(deny, allow))).collect();
                gateway.access = Some(AccessControl { access, policies, usage: Default::default() });
                Arc::new(gateway)
            }
            Err(shared) => shared,
        }
    }

    /// The same gateway, with another method policy.
    pub fn with_method_policy(self: Arc<Self>, policy: policy::MethodPolicy) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut gateway) => {
                let limits = gateway.limits.max_batch_len;
                let upstreams = gateway.pipeline.upstreams().clone();
                gateway.pipeline = Pipeline::new(upstreams, limits).with_policy(policy);
                Arc::new(gateway)
            }
            Err(shared) => shared,
        }
    }

    /// The same gateway, with locally served subscriptions.
    pub fn with_local_feeds(self: Arc<Self>, feeds: Arc<dyn LocalFeeds>) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut gateway) => {
                gateway.local_feeds = Some(feeds);
                Arc::new(gateway)
            }
            Err(shared) => shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_priorities_get_a_smaller_share_of_the_capacity() {
        assert_eq!(admission_limit(100, 0), 100);
        assert_eq!(admission_limit(100, 1), 90);
        assert_eq!(admission_limit(100, 5), 50);
        assert_eq!(admission_limit(100, 9), 10);
        assert_eq!(admission_limit(100, 200), 10, "clamped at 9");
        assert_eq!(admission_limit(4, 0), 4);
    }
}
