//! Prometheus metrics for the gateway.
//!
//! Metric names:
//! * `sluice_requests_total{network, method, outcome}`: calls by network, method and outcome (`ok`, `rpc_error`,
//!   `invalid`, `parse_error`, `denied` by the method policy, or an upstream failure kind such as `timeout`).
//! * `sluice_served_total{network, method, source}`: answered calls by what produced the answer
//!   (`upstream`, `local`, `cache-memory`, `cache-redis`, `coalesced`).
//! * `sluice_request_duration_seconds{transport}`: time to answer an HTTP body or WS message.
//! * `sluice_requests_in_flight{transport}`: bodies being answered now.
//! * `sluice_upstream_calls_total{network, upstream, outcome}` and `sluice_upstream_call_duration_seconds`
//!   come from `sluice-upstream`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = || {
                PrometheusBuilder::new()
                    .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                    .expect("buckets are not empty")
            };
            // Another recorder may already be installed (an embedding program): then keep an
            // uninstalled one so /metrics still answers, empty.
            let handle = builder().install_recorder().unwrap_or_else(|_| builder().build_recorder().handle());
            // Series a dashboard shows before their first event.
            metrics::gauge!("sluice_websocket_sessions").increment(0.0);
            handle
        })
        .clone()
}

/// Folds recorded histogram samples into their buckets every few seconds. Without it the
/// exporter keeps every sample until `/metrics` is scraped, so memory would grow with traffic.
pub fn spawn_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

/// The label for a method name.
pub fn method_label(method: &str) -> &'static str {
    if method.is_empty() {
        return "none";
    }
    // Methods reported under their own name are the method table's exact rows; anything else
    // is `other`, so hostile clients cannot grow the label set without bound.
    let row = sluice_chain::method_info(method);
    if row.exact {
        row.name
    } else {
        "other"
    }
}

/// Counter handles by (network, method label, third label): the network by its id's address
/// (one `Arc<str>` per network, kept for the process's life), the labels `&'static str`s keyed
/// by address. The registry is asked once per triple and thread, not once per call.
/// Keyed by addresses, so a fast non-cryptographic hash is enough (nothing a caller sends
/// reaches the key: unknown methods are `other`).
type Handles = std::cell::RefCell<rustc_hash::FxHashMap<(usize, usize, usize), metrics::Counter>>;

/// The pair a settled call adds to (`sluice_requests_total`, and `sluice_served_total` when it
/// has an answer), by (network, method label, outcome, source or 0): one lookup per call.
type SettledHandles = std::cell::RefCell<
    rustc_hash::FxHashMap<(usize, usize, usize, usize), (metrics::Counter, Option<metrics::Counter>)>,
>;

thread_local! {
    static CALLS: Handles = std::cell::RefCell::default();
    static SETTLED: SettledHandles = std::cell::RefCell::default();
}

/// The labels of a counter by network, method label and one more.
fn labels(network: &str, label: &str, kind: &'static str, value: &str) -> [(&'static str, String); 3] {
    [("network", network.to_owned()), ("method", label.to_owned()), (kind, value.to_owned())]
}

/// Counts one call on `network` (its id, as the network's pipeline holds it).
pub fn count_call(network: &std::sync::Arc<str>, method: &str, outcome: &'static str) {
    let label = method_label(method);
    let key = (network.as_ptr() as usize, label.as_ptr() as usize, outcome.as_ptr() as usize);
    CALLS.with(|handles| {
        handles
            .borrow_mut()
            .entry(key)
            .or_insert_with(|| metrics::counter!("sluice_requests_total", &labels(network, label, "outcome", outcome)))
            .increment(1);
    });
}

/// Counts one call that went down the layers: its outcome, and what produced its answer when
/// it has one (`upstream`, `local`, `cache-memory`, `cache-redis`, `coalesced`: the
/// dashboard's cache hit ratio by method), the method labelled once for both counters.
pub fn count_settled(network: &std::sync::Arc<str>, method: &str, outcome: &'static str, source: Option<&'static str>) {
    let label = method_label(method);
    let key = (
        network.as_ptr() as usize,
        label.as_ptr() as usize,
        outcome.as_ptr() as usize,
        source.map_or(0, |s| s.as_ptr() as usize),
    );
    SETTLED.with(|handles| {
        let mut handles = handles.borrow_mut();
        // The registry hands out the same counter for the same name and labels, so these
        // handles add to the very counters `count_call` adds to.
        let (calls, served) = handles.entry(key).or_insert_with(|| {
            let calls = metrics::counter!("sluice_requests_total", &labels(network, label, "outcome", outcome));
            let served = source.map(|s| metrics::counter!("sluice_served_total", &labels(network, label, "source", s)));
            (calls, served)
        });
        calls.increment(1);
        if let Some(served) = served {
            served.increment(1);
        }
    });
}

/// The transports bodies arrive on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// An HTTP POST.
    Http,
    /// A WebSocket message.
    Ws,
}

struct TransportHandles {
    in_flight: metrics::Gauge,
    duration: metrics::Histogram,
}

/// Handles registered once (after the recorder is installed: on first use).
fn transport_handles(transport: Transport) -> &'static TransportHandles {
    static HANDLES: OnceLock<[TransportHandles; 2]> = OnceLock::new();
    let handles = HANDLES.get_or_init(|| {
        ["http", "ws"].map(|t| TransportHandles {
            in_flight: metrics::gauge!("sluice_requests_in_flight", "transport" => t),
            duration: metrics::histogram!("sluice_request_duration_seconds", "transport" => t),
        })
    });
    &handles[transport as usize]
}

/// Tracks one body in flight: counts it on creation, records its duration when dropped.
pub struct InFlight {
    handles: &'static TransportHandles,
    started: std::time::Instant,
}

impl InFlight {
    /// Starts tracking a body that arrived on `transport`.
    pub fn start(transport: Transport) -> Self {
        let handles = transport_handles(transport);
        handles.in_flight.increment(1.0);
        Self { handles, started: std::time::Instant::now() }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.handles.in_flight.decrement(1.0);
        self.handles.duration.record(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_share_one_label() {
        assert_eq!(method_label("eth_call"), "eth_call");
        assert_eq!(method_label("attacker_0001"), "other");
        assert_eq!(method_label(""), "none");
        for method in sluice_chain::methods::known().map(|m| m.name) {
            assert_eq!(method_label(method), method, "every known method keeps its name");
        }
        assert_eq!(method_label("eth_call2"), "other");
    }
}
