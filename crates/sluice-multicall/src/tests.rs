//! The layer against an in-memory node that runs `aggregate3` itself: grouping by block,
//! windows, full groups, failures made again directly, unusable aggregates, chains without the
//! code. No sockets; the answers' exactness against a real node is tested on anvil
//! (crates/sluice/tests/aggregate.rs).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alloy_primitives::{hex, Bytes};
use alloy_sol_types::{SolCall, SolValue};
use async_trait::async_trait;
use serde_json::value::RawValue;
use sluice_jsonrpc::Outcome;
use sluice_upstream::{Answer, Call, Source, UpstreamError, Upstreams};

use crate::abi::{aggregate3Call, Result3, MULTICALL3};
use crate::{AggregateConfig, AggregateLayer};

/// A node whose contracts return their call data reversed, and revert when it starts with 0xff.
#[derive(Default)]
struct Node {
    has_multicall: AtomicBool,
    /// Every `eth_call` it was sent: (to, block parameter).
    calls: Mutex<Vec<(String, String)>>,
    broken_aggregates: AtomicBool,
    lookups: AtomicUsize,
}

fn run(data: &[u8]) -> Result<Vec<u8>, ()> {
    if data.first() == Some(&0xff) {
        Err(())
    } else {
        Ok(data.iter().rev().copied().collect())
    }
}

fn raw(text: String) -> Arc<RawValue> {
    RawValue::from_string(text).unwrap().into()
}

#[async_trait]
impl Upstreams for Node {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let params: serde_json::Value = serde_json::from_str(call.req.params_text()).unwrap();
        if call.method() == "eth_getCode" {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            let code = if self.has_multicall.load(Ordering::SeqCst) { "0x6080" } else { "0x" };
            return Ok(Answer::upstream(Outcome::Result(raw(format!("\"{code}\"")))));
        }
        let to = params[0]["to"].as_str().unwrap().to_owned();
        let block = params.get(1).map_or("none".to_owned(), |b| b.to_string());
        self.calls.lock().unwrap().push((to.clone(), block));
        let data = hex::decode(params[0]["data"].as_str().unwrap_or("0x").trim_start_matches("0x")).unwrap();
        let returned = if to == format!("{MULTICALL3:#x}") {
            if self.broken_aggregates.load(Ordering::SeqCst) {
                return Err(UpstreamError::Timeout(Duration::from_secs(1)));
            }
            let calls = aggregate3Call::abi_decode(&data).unwrap().calls;
            let results: Vec<Result3> = calls
                .iter()
                .map(|c| match run(&c.callData) {
                    Ok(out) => Result3 { success: true, returnData: Bytes::from(out) },
                    Err(()) => Result3 { success: false, returnData: Bytes::new() },
                })
                .collect();
            results.abi_encode()
        } else {
            match run(&data) {
                Ok(out) => out,
                Err(()) => {
                    let error = r#"{"code":3,"message":"execution reverted","data":"0x"}"#.to_owned();
                    return Ok(Answer::upstream(Outcome::Error(raw(error))));
                }
            }
        };
        Ok(Answer::upstream(Outcome::Result(raw(format!("\"0x{}\"", hex::encode(returned))))))
    }
}

fn eth_call(data: &str, block: &str) -> Call {
    let params = format!(r#"[{{"to":"0x00000000000000000000000000000000c0ffee00","data":"{data}"}},{block}]"#);
    Call::internal("eth_call", Some(&params))
}

fn layer_over(node: Arc<Node>, max_calls: usize) -> AggregateLayer {
    let config = AggregateConfig { eth_call: true, window: Duration::from_millis(20), max_calls };
    AggregateLayer::new(node, config, "test")
}

async fn ready(layer: &AggregateLayer, node: &Node) {
    // The first eligible call starts the look-up and goes direct.
    let before = node.lookups.load(Ordering::SeqCst);
    layer.call(&eth_call("0x01", r#""latest""#)).await.unwrap();
    while node.lookups.load(Ordering::SeqCst) == before {
        tokio::task::yield_now().await;
    }
    // The in-memory node answers at once; the answer is recorded just after.
    tokio::time::sleep(Duration::from_millis(5)).await;
    node.calls.lock().unwrap().clear();
}

fn text(answer: &Result<Answer, UpstreamError>) -> (String, Option<Source>) {
    match answer {
        Ok(Answer { outcome: Outcome::Result(r), source }) => (r.get().to_owned(), Some(*source)),
        Ok(Answer { outcome: Outcome::Error(e), source }) => (format!("error {}", e.get()), Some(*source)),
        Err(e) => (format!("err {}", e.kind()), None),
    }
}

#[tokio::test]
async fn calls_to_one_block_share_an_aggregate_and_failures_are_made_again_directly() {
    let node = Arc::new(Node::default());
    node.has_multicall.store(true, Ordering::SeqCst);
    let layer = layer_over(node.clone(), 50);
    ready(&layer, &node).await;
    let calls = [
        eth_call("0x0102", r#""0x10""#),
        eth_call("0xff01", r#""0x10""#), // reverts
        eth_call("0x0a0b0c", r#""0x10""#),
        eth_call("0x0d", r#""0x11""#), // another block: another group (alone)
    ];
    let answers = futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
    let texts: Vec<_> = answers.iter().map(text).collect();
    assert_eq!(texts[0], ("\"0x0201\"".into(), Some(Source::Aggregated)));
    assert_eq!(texts[1].0, r#"error {"code":3,"message":"execution reverted","data":"0x"}"#);
    assert_eq!(texts[1].1, Some(Source::Upstream), "the node's own answer to the call alone");
    assert_eq!(texts[2], ("\"0x0c0b0a\"".into(), Some(Source::Aggregated)));
    assert_eq!(texts[3], ("\"0x0d\"".into(), Some(Source::Upstream)));
    let sent = node.calls.lock().unwrap().clone();
    let multicall = format!("{MULTICALL3:#x}");
    assert_eq!(sent.iter().filter(|(to, _)| *to == multicall).count(), 1, "{sent:?}");
    assert!(sent.iter().any(|(to, block)| *to == multicall && block == "\"0x10\""), "the group's own block");
    assert_eq!(sent.len(), 3, "one aggregate, the revert again, the lone call: {sent:?}");
}

#[tokio::test]
async fn a_full_group_leaves_at_once_and_an_unusable_aggregate_falls_back() {
    let node = Arc::new(Node::default());
    node.has_multicall.store(true, Ordering::SeqCst);
    // A long window: only full groups can leave before it ends.
    let config = AggregateConfig { eth_call: true, window: Duration::from_secs(5), max_calls: 3 };
    let layer = AggregateLayer::new(node.clone(), config, "test");
    ready(&layer, &node).await;
    let calls: Vec<Call> = (1..=6).map(|i| eth_call(&format!("0x0{i}"), r#""latest""#)).collect();
    let started = tokio::time::Instant::now();
    let answers = futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
    assert!(started.elapsed() < Duration::from_secs(4), "full groups did not wait for the window");
    assert!(answers.iter().all(|a| text(a).1 == Some(Source::Aggregated)));
    assert_eq!(node.calls.lock().unwrap().len(), 2, "two full groups of three");

    node.broken_aggregates.store(true, Ordering::SeqCst);
    node.calls.lock().unwrap().clear();
    let answers = futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
    let texts: Vec<String> = answers.iter().map(|a| text(a).0).collect();
    assert_eq!(texts, ["\"0x01\"", "\"0x02\"", "\"0x03\"", "\"0x04\"", "\"0x05\"", "\"0x06\""]);
    assert_eq!(node.calls.lock().unwrap().len(), 8, "two failed aggregates, then six direct calls");
}

#[tokio::test]
async fn without_multicall_code_and_for_calls_it_would_change_everything_goes_direct() {
    let node = Arc::new(Node::default());
    let layer = layer_over(node.clone(), 50);
    ready(&layer, &node).await;
    let calls: Vec<Call> = (1..=4).map(|i| eth_call(&format!("0x0{i}"), r#""latest""#)).collect();
    futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
    assert_eq!(node.calls.lock().unwrap().len(), 4);
    assert_eq!(node.lookups.load(Ordering::SeqCst), 1, "looked up once");

    let node = Arc::new(Node::default());
    node.has_multicall.store(true, Ordering::SeqCst);
    let layer = layer_over(node.clone(), 50);
    ready(&layer, &node).await;
    let from = r#"[{"to":"0x00000000000000000000000000000000c0ffee00","from":"0x00000000000000000000000000000000c0ffee00","data":"0x01"},"latest"]"#;
    let calls: Vec<Call> = (0..4).map(|_| Call::internal("eth_call", Some(from))).collect();
    futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
    let sent = node.calls.lock().unwrap().clone();
    assert!(sent.iter().all(|(to, _)| *to != format!("{MULTICALL3:#x}")), "{sent:?}");
    assert_eq!(sent.len(), 4);
}

#[tokio::test]
async fn the_code_is_looked_up_again_after_a_reorg() {
    let node = Arc::new(Node::default());
    node.has_multicall.store(true, Ordering::SeqCst);
    let layer = layer_over(node.clone(), 50);
    let (events, receiver) = tokio::sync::broadcast::channel(4);
    layer.watch_reorgs(receiver);
    ready(&layer, &node).await;
    events.send(sluice_chain::ChainEvent::NewHead(5)).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    layer.call(&eth_call("0x01", r#""latest""#)).await.unwrap();
    assert_eq!(node.lookups.load(Ordering::SeqCst), 1, "a new head changes nothing");
    // The deployment is gone after the reorg: the next call looks again and goes direct.
    node.has_multicall.store(false, Ordering::SeqCst);
    events.send(sluice_chain::ChainEvent::Reorg { fork_point: 3 }).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    ready(&layer, &node).await;
    assert_eq!(node.lookups.load(Ordering::SeqCst), 2);
    let calls: Vec<Call> = (1..=3).map(|i| eth_call(&format!("0x0{i}"), r#""latest""#)).collect();
    futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
    let sent = node.calls.lock().unwrap().clone();
    assert!(sent.iter().all(|(to, _)| *to != format!("{MULTICALL3:#x}")), "{sent:?}");
}
