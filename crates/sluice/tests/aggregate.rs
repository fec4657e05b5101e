//! Multicall3 aggregation on real anvils: a Multicall3-compatible contract (compiled here from
//! `tests/contracts/Aggregator.sol` with solc-js) placed at the canonical address with
//! `anvil_setCode`, a corpus contract with answers and reverts of every kind, and a counting
//! relay between sluice and anvil (a fake only in that it counts).
//!
//! Every answer through aggregation is compared byte for byte with the same call sent to anvil
//! directly; calls an aggregate would change are never aggregated; a chain without the code
//! never aggregates.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use alloy_primitives::keccak256;
use common::DEV_ACCOUNT;
use serde_json::{json, value::RawValue, Value};
use sluice_testkit::{metric, rpc_result, Anvil, FakeUpstream, Fault, Sluice};

const MULTICALL3: &str = "0xca11bde05977b3631167028862be2a173976ca11";
const CORPUS: &str = "0x00000000000000000000000000000000c0ffee00";

/// Runtime bytecode of each test contract, compiled with the solc-js that install-tools puts
/// into `.tools/`.
fn compile() -> HashMap<String, String> {
    let root = sluice_testkit::workspace_root();
    let dir = root.join("crates/sluice/tests/contracts");
    let out = std::process::Command::new("node")
        .arg(dir.join("compile.js"))
        .arg(root.join(".tools/node_modules/solc"))
        .arg(dir.join("Aggregator.sol"))
        .arg(dir.join("Corpus.sol"))
        .output()
        .expect("node runs (scripts/install-tools.sh installs solc-js)");
    assert!(out.status.success(), "solc: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("compile.js prints JSON")
}

async fn place(client: &reqwest::Client, anvil: &Anvil, code: &HashMap<String, String>, multicall: bool) {
    let url = anvil.http_url();
    if multicall {
        rpc_result(client, &url, "anvil_setCode", json!([MULTICALL3, format!("0x{}", code["Aggregator"])])).await;
    }
    rpc_result(client, &url, "anvil_setCode", json!([CORPUS, format!("0x{}", code["Corpus"])])).await;
    rpc_result(client, &url, "anvil_mine", json!(["0x3"])).await;
}

fn selector(signature: &str) -> String {
    alloy_primitives::hex::encode(&keccak256(signature.as_bytes())[..4])
}

fn word(n: u64) -> String {
    format!("{n:064x}")
}

fn call_to(to: &str, data: String, block: Option<Value>) -> Value {
    let object = json!({ "to": to, "data": format!("0x{data}") });
    match block {
        Some(block) => json!([object, block]),
        None => json!([object]),
    }
}

/// The corpus: for each block, answers of every shape and reverts of every kind.
fn corpus(blocks: &[Value]) -> Vec<Value> {
    let mut calls = Vec::new();
    for block in blocks {
        let at = || Some(block.clone());
        for i in 0..5 {
            calls.push(call_to(CORPUS, format!("{}{}", selector("echo(uint256)"), word(i + 1)), at()));
        }
        for n in [1, 3] {
            calls.push(call_to(CORPUS, format!("{}{}", selector("text(uint256)"), word(n)), at()));
        }
        calls.push(call_to(CORPUS, selector("number()"), at()));
        let who = format!("{:0>64}", DEV_ACCOUNT.trim_start_matches("0x"));
        calls.push(call_to(CORPUS, format!("{}{who}", selector("balance(address)")), at()));
        calls.push(call_to(CORPUS, format!("{}{}", selector("failWithString(uint256)"), word(7)), at()));
        calls.push(call_to(CORPUS, format!("{}{}", selector("failWithCustom(uint256)"), word(9)), at()));
        calls.push(call_to(CORPUS, format!("{}{}", selector("failWithPanic(uint256)"), word(3)), at()));
        calls.push(call_to(CORPUS, selector("failBare()"), at()));
        // An account with no code, with and without call data; the corpus without data (it has
        // no fallback: an empty revert).
        calls.push(call_to("0x000000000000000000000000000000000000dead", "12345678".into(), at()));
        calls.push(call_to("0x000000000000000000000000000000000000beef", String::new(), at()));
        calls.push(call_to(CORPUS, String::new(), at()));
    }
    // Two heavy calls to the same block (about 16.5 M gas each): alone each fits the node's
    // 30 M gas cap; together, the second runs out of gas inside the aggregate and must be made
    // again directly.
    for rounds in [250_000, 250_001] {
        calls.push(call_to(CORPUS, format!("{}{}", selector("burn(uint256)"), word(rounds)), Some(json!("latest"))));
    }
    calls
}

#[derive(serde::Deserialize)]
struct Envelope {
    result: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

/// The `result` or `error` member's exact JSON text.
async fn answer_text(client: &reqwest::Client, url: &str, params: &Value) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "eth_call", "params": params}).to_string();
    let response = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
    let bytes = response.bytes().await.unwrap();
    let envelope: Envelope = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"));
    match (envelope.result, envelope.error) {
        (Some(r), None) => format!("result {}", r.get()),
        (None, Some(e)) => format!("error {}", e.get()),
        _ => panic!("neither result nor error: {bytes:?}"),
    }
}

async fn all_at_once(client: &reqwest::Client, url: &str, calls: &[Value]) -> Vec<String> {
    futures_util::future::join_all(calls.iter().map(|p| answer_text(client, url, p))).await
}

fn sluice_with(upstream: &str, ws: &str) -> common::Configured {
    let toml = format!(
        "[mempool]\nenabled = false\n[aggregate]\neth_call = true\nwindow = \"25ms\"\nmax_calls = 50\n\
         [[upstreams]]\nurl = \"{upstream}\"\nws_url = \"{ws}\"\n"
    );
    common::with_config(&toml)
}

async fn counter(client: &reqwest::Client, sluice: &Sluice, outcome: &str) -> f64 {
    metric(
        client,
        &sluice.http_url(),
        &format!("sluice_aggregate_calls_total{{network=\"default\",outcome=\"{outcome}\"}}"),
    )
    .await
    .unwrap_or(0.0)
}

/// Makes one eligible call (which starts the look-up of Multicall3's code) and waits until the
/// look-up has answered `present`.
async fn looked_up(client: &reqwest::Client, sluice: &Sluice, present: bool) {
    let probe = call_to(CORPUS, format!("{}{}", selector("echo(uint256)"), word(999)), Some(json!("latest")));
    answer_text(client, &sluice.http_url(), &probe).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let series = "sluice_aggregate_multicall_present{network=\"default\"}";
    while metric(client, &sluice.http_url(), series).await != Some(present as u8 as f64) {
        assert!(Instant::now() < deadline, "Multicall3 look-up did not say {present}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// anvil with the contracts (Multicall3's code only when `multicall`), a counting relay in
/// front of it, and sluice with aggregation on in front of the relay, its look-up done.
struct Devnet {
    anvil: Anvil,
    relay: FakeUpstream,
    net: common::Configured,
}

async fn devnet(client: &reqwest::Client, code: &HashMap<String, String>, multicall: bool) -> Devnet {
    let anvil = Anvil::spawn();
    place(client, &anvil, code, multicall).await;
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    let net = sluice_with(&relay.url, &anvil.ws_url());
    looked_up(client, &net.sluice, multicall).await;
    Devnet { anvil, relay, net }
}

/// The relay's `eth_call` requests (one per HTTP request, whatever it carries).
fn eth_calls(relay: &FakeUpstream) -> usize {
    relay.requests_for("eth_call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_answers_are_byte_identical_to_direct_ones() {
    let code = compile();
    let client = reqwest::Client::new();
    let Devnet { anvil, relay, net } = devnet(&client, &code, true).await;

    let head = rpc_result(&client, &anvil.http_url(), "eth_getBlockByNumber", json!(["latest", false])).await;
    let number = u64::from_str_radix(head["number"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let older =
        rpc_result(&client, &anvil.http_url(), "eth_getBlockByNumber", json!([format!("{:#x}", number - 2), false]))
            .await;
    let blocks = [
        json!("latest"),
        json!(format!("{:#x}", number)),
        json!(format!("{:#x}", number - 1)),
        json!({ "blockHash": older["hash"] }),
    ];
    let calls = corpus(&blocks);
    assert!(calls.len() >= 50, "a corpus of at least 50 calls: {}", calls.len());

    let before = eth_calls(&relay);
    let through = all_at_once(&client, &net.sluice.http_url(), &calls).await;
    let upstream_calls = eth_calls(&relay) - before;
    let direct = all_at_once(&client, &anvil.http_url(), &calls).await;
    for ((params, got), want) in calls.iter().zip(&through).zip(&direct) {
        assert_eq!(got, want, "through sluice vs anvil directly, for {params}");
    }
    let reverts = direct.iter().filter(|a| a.starts_with("error")).count();
    assert!(reverts >= 20, "the corpus has reverts of every kind: {reverts}");
    let aggregated = counter(&client, &net.sluice, "aggregated").await;
    let inside = counter(&client, &net.sluice, "failed_inside").await;
    println!(
        "{} calls ({reverts} reverting): {upstream_calls} eth_call requests reached the node; \
         {aggregated} answered from aggregates, {inside} made again directly",
        calls.len()
    );
    assert!(upstream_calls < calls.len(), "aggregation saves calls: {upstream_calls} of {}", calls.len());
    assert!(aggregated >= 30.0, "the successful calls came from aggregates: {aggregated}");
    // Identical calls (`latest` pinned to the head's number, and that number) were coalesced
    // above, so fewer reverts reached the aggregates than the corpus has.
    assert!(inside >= 12.0, "reverts inside aggregates were made again directly: {inside}");
    assert_eq!(counter(&client, &net.sluice, "fallback").await, 0.0, "every aggregate answered");

    // Served by aggregation, and cached like a direct answer.
    let fresh = call_to(CORPUS, format!("{}{}", selector("echo(uint256)"), word(4242)), Some(json!("latest")));
    let pair =
        [fresh.clone(), call_to(CORPUS, format!("{}{}", selector("echo(uint256)"), word(4243)), Some(json!("latest")))];
    let url = net.sluice.http_url();
    let sources = futures_util::future::join_all(pair.iter().map(|p| served_by(&client, &url, p))).await;
    assert_eq!(sources, ["aggregated", "aggregated"]);
    assert_eq!(served_by(&client, &net.sluice.http_url(), &fresh).await, "cache-memory");
}

async fn served_by(client: &reqwest::Client, url: &str, params: &Value) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": params}).to_string();
    let response = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
    let by = response.headers().get("x-sluice-served-by").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_an_aggregate_would_change_and_chains_without_multicall_go_direct() {
    let code = compile();
    let client = reqwest::Client::new();
    let Devnet { anvil, relay, net } = devnet(&client, &code, true).await;

    let echo = |i: u64| format!("0x{}{}", selector("echo(uint256)"), word(i));
    let changed = [
        json!([{ "to": CORPUS, "data": echo(1), "from": DEV_ACCOUNT }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(2), "value": "0x0" }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(3), "gas": "0x186a0" }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(4), "gasPrice": "0x0" }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(5) }, "latest", { DEV_ACCOUNT: { "balance": "0x1" } }]),
        json!([{ "to": CORPUS, "data": echo(6), "from": DEV_ACCOUNT, "value": "0x1" }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(7), "accessList": [] }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(8), "input": echo(9) }, "latest"]),
        json!([{ "to": CORPUS, "data": "0x123" }, "latest"]),
        json!([{ "to": CORPUS, "data": echo(10), "gas": "0x1" }, "latest"]),
    ];
    let before = (eth_calls(&relay), counter(&client, &net.sluice, "ineligible").await);
    let through = all_at_once(&client, &net.sluice.http_url(), &changed).await;
    let direct = all_at_once(&client, &anvil.http_url(), &changed).await;
    assert_eq!(through, direct);
    assert_eq!(eth_calls(&relay) - before.0, changed.len(), "one upstream call each");
    assert_eq!(counter(&client, &net.sluice, "ineligible").await - before.1, changed.len() as f64);
    assert_eq!(counter(&client, &net.sluice, "aggregated").await, 0.0);

    // A chain without Multicall3's code: never aggregated.
    let Devnet { anvil: bare, relay: bare_relay, net: plain } = devnet(&client, &code, false).await;
    let calls: Vec<Value> = (100..120).map(|i| call_to(CORPUS, echo(i).split_off(2), Some(json!("latest")))).collect();
    let before = eth_calls(&bare_relay);
    let through = all_at_once(&client, &plain.sluice.http_url(), &calls).await;
    assert_eq!(through, all_at_once(&client, &bare.http_url(), &calls).await);
    assert_eq!(eth_calls(&bare_relay) - before, calls.len(), "one upstream call each");
    assert_eq!(bare_relay.requests_for(MULTICALL3), 1, "only the look-up named Multicall3");
    assert_eq!(counter(&client, &plain.sluice, "no_multicall").await, 21.0);
}

/// The first calls after a start meet the look-up of Multicall3's code in flight: they wait
/// for it (one round trip) instead of all going direct. 60 concurrent eligible calls, the first
/// of sluice's life: fewer than 35 `eth_call` requests reach the node (before: every one of them,
/// 60), and every answer is the node's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_burst_after_start_waits_for_the_multicall_look_up() {
    let client = reqwest::Client::new();
    let code = compile();
    let anvil = Anvil::spawn();
    place(&client, &anvil, &code, true).await;
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    let net = sluice_with(&relay.url, &anvil.ws_url());
    let calls: Vec<Value> = (0..60)
        .map(|i| call_to(CORPUS, format!("{}{}", selector("echo(uint256)"), word(i + 1)), Some(json!("latest"))))
        .collect();
    let before = eth_calls(&relay);
    let through = all_at_once(&client, &net.sluice.http_url(), &calls).await;
    let reached = eth_calls(&relay) - before;
    let direct = all_at_once(&client, &anvil.http_url(), &calls).await;
    assert_eq!(through, direct, "answers through sluice are the node's own");
    eprintln!("{reached} of 60 first calls reached the node as eth_call requests");
    assert!(reached < 35, "{reached} of 60 first calls reached the node as eth_call requests");
}
