//! OpenTelemetry traces end to end: sluice with `[telemetry] otlp_endpoint` pointing at an
//! OTLP/HTTP receiver in this test (it decodes the protobuf the real exporter sends), in front
//! of a real anvil reached through a relay named as such, which records each request's
//! `traceparent` header and forwards it unchanged.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use common::{eventually, BIN};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};
use sluice_testkit::{Anvil, Sluice};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Spans the receiver decoded, by arrival.
type Received = Arc<Mutex<Vec<Span>>>;

async fn otlp_receiver() -> (String, Received) {
    let received = Received::default();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(|State(store): State<Received>, body: Bytes| async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut store = store.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        store.extend(scope.spans);
                    }
                }
                ""
            }),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

/// The `traceparent` headers the relay saw.
type Seen = Arc<Mutex<Vec<String>>>;
/// The relay's state: what it saw, its client, anvil's URL.
type Relay = (Seen, reqwest::Client, String);

/// A relay in front of anvil (named as such: it only records): each request's `traceparent`.
async fn recording_relay(anvil: String) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let client = reqwest::Client::new();
    let state = (seen.clone(), client, anvil);
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::post(
                |State((seen, client, anvil)): State<Relay>, headers: HeaderMap, body: Bytes| async move {
                    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
                        seen.lock().unwrap().push(tp.to_owned());
                    }
                    let answer = client
                        .post(anvil)
                        .header("content-type", "application/json")
                        .body(body.to_vec())
                        .send()
                        .await
                        .unwrap();
                    answer.bytes().await.unwrap().to_vec()
                },
            ),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    })
}

async fn call_with_traceparent(http: &reqwest::Client, url: &str, body: Value) -> Value {
    http.post(url)
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_with_a_span_per_layer_and_per_upstream_exchange() {
    let anvil = Anvil::spawn();
    let (collector, spans) = otlp_receiver().await;
    let (relay, traceparents) = recording_relay(anvil.http_url()).await;
    // Calls go through the relay; the head subscription straight to anvil's WebSocket.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    let config = format!("[[upstreams]]\nurl = \"{relay}\"\nws_url = \"{}\"\n", anvil.ws_url());
    std::fs::write(&file, config).unwrap();
    let sluice = Sluice::spawn_env(
        BIN,
        &["serve", "--listen", "127.0.0.1:0", "--config", file.to_str().unwrap()],
        &[("SLUICE_TELEMETRY__OTLP_ENDPOINT", collector.as_str()), ("SLUICE_TELEMETRY__EXPORT_INTERVAL", "100ms")],
    );
    let http = reqwest::Client::new();
    let url = sluice.http_url();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": ["0x0", false]});
    // Until the cache's view of the chain holds a head, a block by number cannot be judged
    // and passes uncached: wait for it, so the first call is a miss and the second a hit.
    // Not the status's `best_head`: that comes from the pool's own polls and, on a busy
    // machine, can be known before the view is. The view has a head once `eth_blockNumber`
    // is answered from it (served "local").
    let block_number = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []});
    eventually(Duration::from_secs(10), "the cache's view has a head", || async {
        let _ = http.post(&url).json(&block_number).send().await;
        let Ok(metrics) = http.get(format!("{url}/metrics")).send().await else { return false };
        let text = metrics.text().await.unwrap_or_default();
        text.lines().any(|line| {
            line.starts_with("sluice_served_total")
                && line.contains(r#"method="eth_blockNumber""#)
                && line.contains(r#"source="local""#)
        })
    })
    .await;
    // Block 0 twice: a miss that reaches the node, then a hit answered from memory.
    for _ in 0..2 {
        let answer = call_with_traceparent(&http, &url, call.clone()).await;
        assert!(answer["result"]["hash"].is_string(), "{answer}");
    }

    let in_trace =
        || -> Vec<Span> { spans.lock().unwrap().iter().filter(|s| hex(&s.trace_id) == TRACE_ID).cloned().collect() };
    eventually(Duration::from_secs(10), "both requests' spans are exported", || async {
        let spans = in_trace();
        spans.iter().filter(|s| s.name == "rpc").count() == 2 && spans.iter().any(|s| s.name == "upstream")
    })
    .await;
    let spans = in_trace();
    let by_id = |id: &[u8]| spans.iter().find(|s| s.span_id == id);
    let roots: Vec<&Span> = spans.iter().filter(|s| s.name == "rpc").collect();
    for root in &roots {
        assert_eq!(hex(&root.parent_span_id), CALLER_SPAN, "the caller's traceparent is the parent");
        assert_eq!(attribute(root, "network").as_deref(), Some("default"));
    }
    // The cache spans: one miss, one memory hit, each under its request's rpc span.
    let cache: Vec<&Span> = spans.iter().filter(|s| s.name == "cache").collect();
    let mut results: Vec<String> = cache.iter().filter_map(|s| attribute(s, "result")).collect();
    results.sort();
    assert_eq!(results, ["hit-memory", "miss"], "{cache:#?}");
    for span in &cache {
        assert_eq!(by_id(&span.parent_span_id).map(|p| p.name.as_str()), Some("rpc"));
    }
    // The miss went down: cache → coalesce (lead) → pool → upstream (member, outcome).
    let upstream: Vec<&Span> = spans.iter().filter(|s| s.name == "upstream").collect();
    assert_eq!(upstream.len(), 1, "one exchange with the node: {upstream:#?}");
    let exchange = upstream[0];
    assert_eq!(attribute(exchange, "member").as_deref(), Some("upstream-0"));
    assert_eq!(attribute(exchange, "outcome").as_deref(), Some("ok"));
    let mut chain = vec![exchange.name.clone()];
    let mut at = exchange;
    while let Some(parent) = by_id(&at.parent_span_id) {
        chain.push(parent.name.clone());
        at = parent;
    }
    assert_eq!(chain, ["upstream", "pool", "coalesce", "cache", "rpc"]);

    // The node got the trace context of that exchange.
    let expected = format!("00-{TRACE_ID}-{}-01", hex(&exchange.span_id));
    let seen = traceparents.lock().unwrap().clone();
    assert!(seen.contains(&expected), "the upstream request carried {expected}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported_and_no_traceparent_is_sent() {
    let anvil = Anvil::spawn();
    let (relay, traceparents) = recording_relay(anvil.http_url()).await;
    let sluice = Sluice::serve(BIN, &relay, &[]);
    let http = reqwest::Client::new();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": ["0x0", false]});
    let answer = call_with_traceparent(&http, &sluice.http_url(), call).await;
    assert!(answer["result"]["hash"].is_string(), "{answer}");
    assert!(traceparents.lock().unwrap().is_empty(), "traces off: the caller's traceparent is not forwarded");
}
