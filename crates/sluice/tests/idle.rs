//! What an idle deployment costs a metered provider: the calls sluice makes by itself, with
//! no client at all, counted by a relay in front of the member (each call of a batch counts,
//! as a provider's meter counts them). Real anvils mine a block every 2 s.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::with_config;
use sluice_testkit::{metric, quantity, rpc_result, Anvil, FakeUpstream, Fault, WsRelay};

/// The idle minute measured, after start-up has settled.
const WINDOW: Duration = Duration::from_secs(60);

/// Start-up (the first head, the window's backfill, the member's range search) is over this
/// long after the first head; its calls are reported, not held to the per-block goal.
const SETTLE: Duration = Duration::from_secs(8);

fn relay_to(anvil: &Anvil) -> Fault {
    Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }
}

/// Calls by method, for the failure message.
fn by_method(methods: &[String]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for m in methods {
        *counts.entry(m.as_str()).or_insert(0) += 1;
    }
    counts
}

async fn head(client: &reqwest::Client, anvil: &Anvil) -> u64 {
    quantity(&rpc_result(client, &anvil.http_url(), "eth_blockNumber", serde_json::json!([])).await)
}

/// Waits until sluice follows the chain (read from its metrics, which cost no upstream call).
async fn following(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = client.get(format!("{base}/metrics")).send().await.expect("metrics").text().await.expect("text");
        let head = text.lines().find(|l| l.starts_with("sluice_chain_head"));
        if head.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).is_some_and(|h| h >= 1.0) {
            return;
        }
        assert!(Instant::now() < deadline, "sluice never followed the chain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Measures one idle minute; `calls` lists each counter's calls so far (one list per relay).
/// Returns (calls, blocks, calls by method, start-up calls).
async fn idle_minute(
    client: &reqwest::Client,
    anvil: &Anvil,
    base: &str,
    calls: impl Fn() -> Vec<Vec<String>>,
) -> (usize, u64, String, usize) {
    following(client, base).await;
    tokio::time::sleep(SETTLE).await;
    let before: Vec<usize> = calls().iter().map(Vec::len).collect();
    let first = head(client, anvil).await;
    tokio::time::sleep(WINDOW).await;
    let after = calls();
    let blocks = head(client, anvil).await - first;
    let window: Vec<String> = after.iter().zip(&before).flat_map(|(all, &n)| all[n..].iter().cloned()).collect();
    (window.len(), blocks, format!("{:?}", by_method(&window)), before.iter().sum())
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_with_a_websocket_member_costs_at_most_a_fifth_of_a_call_per_block() {
    let anvil = Anvil::spawn_with(&["--block-time", "2"]);
    let http = FakeUpstream::spawn(relay_to(&anvil)).await;
    let ws = WsRelay::start(&anvil.ws_url()).await;
    // A second member without a WebSocket: nothing announces its head, so the prober reads it,
    // about once a block and a half.
    let other = FakeUpstream::spawn(relay_to(&anvil)).await;
    let toml = format!(
        "[[upstreams]]\nurl = \"{}\"\nws_url = \"{}\"\n\n[[upstreams]]\nurl = \"{}\"\n",
        http.url, ws.url, other.url
    );
    let net = with_config(&toml);
    let client = reqwest::Client::new();
    let calls = || vec![http.methods(), ws.methods(), other.methods()];
    let before: Vec<usize> = {
        following(&client, &net.sluice.http_url()).await;
        calls().iter().map(Vec::len).collect()
    };
    let (count, blocks, methods, start_up) = idle_minute(&client, &anvil, &net.sluice.http_url(), || {
        let all = calls();
        vec![all[0].clone(), all[1].clone()]
    })
    .await;
    let per_block = count as f64 / blocks as f64;
    eprintln!(
        "websocket member: {count} calls in {blocks} blocks ({per_block:.2}/block) {methods}; start-up {start_up}"
    );
    let unannounced = other.methods().len() - before[2];
    eprintln!("the member without a websocket: {unannounced} calls since the first head");
    assert!(blocks >= 20, "anvil mined {blocks} blocks in a minute");
    assert!(per_block <= 0.2, "{count} calls in {blocks} blocks ({per_block:.2} per block): {methods}");
    // Its share over the settle time and the window (about 34 blocks in all): at most one a block.
    assert!(
        (unannounced as u64) <= blocks + SETTLE.as_secs() / 2,
        "{unannounced} calls to the member without a websocket in {blocks} blocks and the settle time"
    );

    // Readiness probes (a load balancer's, every few seconds) are answered from the heads the
    // member announces: they cost the provider nothing.
    let before: usize = calls().iter().map(Vec::len).sum();
    for _ in 0..20 {
        let ready = client.get(format!("{}/ready", net.sluice.http_url())).send().await.expect("ready");
        assert_eq!(ready.status(), 200);
    }
    let after = calls();
    let chain_ids = after.iter().flatten().filter(|m| *m == "eth_chainId").count();
    let added: usize = after.iter().map(Vec::len).sum::<usize>() - before;
    assert!(added <= 2, "20 readiness probes made {added} upstream calls ({chain_ids} eth_chainId in all)");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_with_an_http_only_member_costs_at_most_one_and_a_half_calls_per_block() {
    let anvil = Anvil::spawn_with(&["--block-time", "2"]);
    // The relay speaks HTTP only: the WebSocket sluice derives from its URL never connects.
    let http = FakeUpstream::spawn(relay_to(&anvil)).await;
    let net = with_config(&format!("[[upstreams]]\nurl = \"{}\"\n", http.url));
    let client = reqwest::Client::new();
    let (count, blocks, methods, start_up) =
        idle_minute(&client, &anvil, &net.sluice.http_url(), || vec![http.methods()]).await;
    let per_block = count as f64 / blocks as f64;
    eprintln!(
        "http-only member: {count} calls in {blocks} blocks ({per_block:.2}/block) {methods}; start-up {start_up}"
    );
    assert!(blocks >= 20, "anvil mined {blocks} blocks in a minute");
    assert!(per_block <= 1.5, "{count} calls in {blocks} blocks ({per_block:.2} per block): {methods}");

    // sluice counts its own calls as the provider's meter does, apart from its clients'.
    let base = net.sluice.http_url();
    let series = |origin: &str| {
        format!(r#"sluice_upstream_metered_calls_total{{network="default",upstream="upstream-0",origin="{origin}"}} "#)
    };
    let internal = series("internal");
    let mut agreed = None;
    for _ in 0..50 {
        let relayed = http.methods().len();
        let counted = metric(&client, &base, &internal).await;
        if counted == Some(relayed as f64) {
            agreed = counted;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(agreed.is_some(), "{internal} never matched the relay's count of {}", http.methods().len());
    let before = metric(&client, &base, &series("client")).await.unwrap_or(0.0);
    let params = serde_json::json!(["0x0000000000000000000000000000000000000001", "0x1"]);
    rpc_result(&client, &base, "eth_getBalance", params).await;
    assert_eq!(metric(&client, &base, &series("client")).await, Some(before + 1.0), "one client call, counted as such");
}
