//! Subscriptions sluice serves itself, on real anvils: `newHeads` and `logs` shared by many
//! clients (one upstream subscription per node, counted at a WebSocket relay), surviving the
//! death of the upstream that announced heads, `removed` logs on a reorg, and log filters
//! matched exactly as anvil's own subscriptions match them.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::ws::{connect, subscribe, Socket};
use common::{BIN, DEV_ACCOUNT};
use futures_util::StreamExt;
use serde_json::{json, Value};
use sluice_testkit::{quantity, rpc_result, workspace_root, Anvil, Sluice, WsRelay};
use tokio_tungstenite::tungstenite::Message;

/// The Emitter contract's runtime code (compiled with the solc-js install-tools puts in place).
fn emitter_code() -> String {
    let dir = workspace_root().join("crates/sluice/tests/contracts");
    let out = std::process::Command::new("node")
        .arg(dir.join("compile.js"))
        .arg(workspace_root().join(".tools/node_modules/solc"))
        .arg(dir.join("Emitter.sol"))
        .output()
        .expect("node runs compile.js");
    assert!(out.status.success(), "compile.js: {}", String::from_utf8_lossy(&out.stderr));
    let code: Value = serde_json::from_slice(&out.stdout).expect("compile.js prints JSON");
    format!("0x{}", code["Emitter"].as_str().expect("Emitter compiled"))
}

fn emitter(i: u8) -> String {
    format!("0x{}{:02x}", "00".repeat(19), 0xe0 + i)
}

fn topic(byte: &str) -> String {
    format!("0x{}", byte.repeat(32))
}

/// Calldata of `fire(count, salt, [aa.., bb.., cc.., dd..])`.
fn fire(count: u64, salt: u64) -> String {
    let mut data = format!("0xc917cd75{count:064x}{salt:064x}");
    for b in ["aa", "bb", "cc", "dd"] {
        data.push_str(&b.repeat(32));
    }
    data
}

async fn place_emitters(client: &reqwest::Client, anvil: &Anvil, n: u8) {
    let code = emitter_code();
    for i in 1..=n {
        rpc_result(client, &anvil.http_url(), "anvil_setCode", json!([emitter(i), code])).await;
    }
}

async fn send_fire(client: &reqwest::Client, url: &str, to: &str, count: u64, salt: u64) {
    rpc_result(client, url, "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "to": to, "data": fire(count, salt)}]))
        .await;
}

fn with_config_log_warn(toml: &str) -> common::Configured {
    common::with_config_args(toml, &["--log", "warn"])
}

/// What one socket received after its subscriptions were made: notifications by subscription
/// id, in arrival order, and the close code if the server closed it.
#[derive(Clone, Default)]
struct Collected {
    events: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    closed: Arc<Mutex<Option<u16>>>,
}

impl Collected {
    fn start(mut ws: Socket) -> Collected {
        let collected = Collected::default();
        let out = collected.clone();
        tokio::spawn(async move {
            while let Some(message) = ws.next().await {
                match message {
                    Ok(Message::Text(text)) => {
                        let Ok(v) = serde_json::from_str::<Value>(&text) else { continue };
                        let Some(sub) = v["params"]["subscription"].as_str() else { continue };
                        let mut events = out.events.lock().unwrap();
                        events.entry(sub.to_owned()).or_default().push(v["params"]["result"].clone());
                    }
                    Ok(Message::Close(frame)) => {
                        *out.closed.lock().unwrap() = Some(frame.map_or(0, |f| u16::from(f.code)));
                        return;
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        collected
    }

    fn of(&self, sub: &str) -> Vec<Value> {
        self.events.lock().unwrap().get(sub).cloned().unwrap_or_default()
    }

    fn count(&self, sub: &str) -> usize {
        self.events.lock().unwrap().get(sub).map_or(0, Vec::len)
    }

    fn closed(&self) -> Option<u16> {
        *self.closed.lock().unwrap()
    }
}

async fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until `count()` has not changed for `quiet` (for a node's own reference stream, whose
/// length is not known in advance), at most `within`.
async fn settled(within: Duration, quiet: Duration, count: impl Fn() -> usize) -> usize {
    let deadline = Instant::now() + within;
    let (mut last, mut since) = (count(), Instant::now());
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet {
            break;
        }
    }
    last
}

fn numbers(heads: &[Value]) -> Vec<u64> {
    heads
        .iter()
        .map(|h| u64::from_str_radix(h["number"].as_str().unwrap_or("0x0").trim_start_matches("0x"), 16).unwrap_or(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_share_one_upstream_subscription() {
    let anvil = Anvil::spawn();
    let client = reqwest::Client::new();
    place_emitters(&client, &anvil, 1).await;
    let relay = WsRelay::start(&anvil.ws_url()).await;
    let net = with_config_log_warn(&format!(
        "[limits]\nmax_connections = 5000\n[[upstreams]]\nurl = \"{}\"\nws_url = \"{}\"\n",
        anvil.http_url(),
        relay.url
    ));
    // The head tracker's own subscription: the one the node should ever see.
    wait_until("head tracker subscribed", Duration::from_secs(20), || relay.subscribes() >= 1).await;
    let filter = json!(["logs", {"address": emitter(1), "topics": [topic("aa")]}]);
    let mut reference = connect(&anvil.ws_url()).await;
    let reference_sub = subscribe(&mut reference, 1, filter.clone()).await;
    let reference = Collected::start(reference);
    let mut clients = Vec::new();
    for chunk in 0..10 {
        let joined = futures_util::future::join_all((0..100).map(|_| {
            let (url, filter) = (net.sluice.ws_url(), filter.clone());
            async move {
                let mut ws = connect(&url).await;
                let heads = subscribe(&mut ws, 1, json!(["newHeads"])).await;
                let logs = subscribe(&mut ws, 2, filter).await;
                (heads, logs, Collected::start(ws))
            }
        }))
        .await;
        clients.extend(joined);
        assert_eq!(clients.len(), (chunk + 1) * 100);
    }
    let first = quantity(&rpc_result(&client, &anvil.http_url(), "eth_blockNumber", json!([])).await);
    for salt in 0..5 {
        send_fire(&client, &anvil.http_url(), &emitter(1), 10, salt).await;
    }
    let expected_logs =
        settled(Duration::from_secs(20), Duration::from_secs(1), || reference.count(&reference_sub)).await;
    assert!(expected_logs >= 5, "the reference subscription saw {expected_logs} logs");
    let mined: Vec<u64> = (first + 1..=first + 5).collect();
    let short = || {
        let heads = clients.iter().filter(|(h, _, c)| c.count(h) < 5).count();
        let logs = clients.iter().filter(|(_, l, c)| c.count(l) < expected_logs).count();
        let closed = clients.iter().filter(|(_, _, c)| c.closed().is_some()).count();
        (heads, logs, closed)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while short() != (0, 0, 0) {
        let (heads, logs, closed) = short();
        let sample = clients.iter().find(|(h, l, c)| c.count(h) < 5 || c.count(l) < expected_logs);
        assert!(
            Instant::now() < deadline,
            "within 60 s: {heads} clients short of 5 heads, {logs} short of {expected_logs} logs, {closed} closed; \
             one of them has heads {:?} and {} logs",
            sample.map(|(h, _, c)| numbers(&c.of(h))),
            sample.map_or(0, |(_, l, c)| c.count(l)),
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let want = reference.of(&reference_sub);
    for (i, (heads, logs, c)) in clients.iter().enumerate() {
        assert_eq!(numbers(&c.of(heads)), mined, "client {i}: heads");
        assert_eq!(c.of(logs), want, "client {i}: logs as anvil sends them");
        assert_eq!(c.closed(), None, "client {i} closed");
    }
    assert_eq!(relay.subscribes(), 1, "one upstream subscription for 1,000 clients");
}

/// Two anvils on one chain: same genesis, and blocks mined on both with the same timestamps.
fn twins() -> (Anvil, Anvil) {
    let args = ["--timestamp", "1700000000"];
    (Anvil::spawn_with(&args), Anvil::spawn_with(&args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_upstream_that_announced_heads_loses_no_block() {
    let (a, b) = twins();
    let client = reqwest::Client::new();
    let net = with_config_log_warn(&format!(
        "[pool]\nprobe_interval = \"200ms\"\n[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n",
        a.http_url(),
        b.http_url()
    ));
    let mut clients = Vec::new();
    for _ in 0..200 {
        let mut ws = connect(&net.sluice.ws_url()).await;
        let heads = subscribe(&mut ws, 1, json!(["newHeads"])).await;
        clients.push((heads, Collected::start(ws)));
    }
    let mine = |url: String, k: u64| {
        let client = client.clone();
        async move { rpc_result(&client, &url, "evm_mine", json!([1_700_000_000 + 12 * k])).await }
    };
    for k in 1..=10 {
        mine(a.http_url(), k).await;
        mine(b.http_url(), k).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until("10 heads everywhere", Duration::from_secs(30), || clients.iter().all(|(h, c)| c.count(h) >= 10)).await;
    // A announced the heads (the first upstream's socket is followed first). It dies.
    drop(a);
    for k in 11..=60 {
        mine(b.http_url(), k).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    wait_until("60 heads everywhere", Duration::from_secs(60), || clients.iter().all(|(h, c)| c.count(h) >= 60)).await;
    let mut hashes = Vec::new();
    for n in 1..=60u64 {
        let block = rpc_result(&client, &b.http_url(), "eth_getBlockByNumber", json!([format!("{n:#x}"), false])).await;
        hashes.push(block["hash"].clone());
    }
    for (i, (heads, c)) in clients.iter().enumerate() {
        let got = c.of(heads);
        assert_eq!(numbers(&got), (1..=60).collect::<Vec<_>>(), "client {i}: every number once, in order");
        assert_eq!(got.iter().map(|h| h["hash"].clone()).collect::<Vec<_>>(), hashes, "client {i}: B's blocks");
        assert_eq!(c.closed(), None, "client {i} was closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reorg_sends_the_dropped_logs_as_removed_then_the_new_branch() {
    let anvil = Anvil::spawn();
    let client = reqwest::Client::new();
    place_emitters(&client, &anvil, 1).await;
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &["--log", "warn"]);
    let mut direct = connect(&anvil.ws_url()).await;
    let direct_sub = subscribe(&mut direct, 1, json!(["logs", {}])).await;
    let direct = Collected::start(direct);
    let mut via = connect(&sluice.ws_url()).await;
    let via_sub = subscribe(&mut via, 1, json!(["logs", {}])).await;
    let via = Collected::start(via);
    for salt in 0..5 {
        send_fire(&client, &anvil.http_url(), &emitter(1), 3, salt).await;
    }
    wait_until("15 logs through sluice", Duration::from_secs(20), || via.count(&via_sub) >= 15).await;
    let before = via.of(&via_sub);
    let head = quantity(&rpc_result(&client, &anvil.http_url(), "eth_blockNumber", json!([])).await);
    let tx = |count: u64, salt: u64| json!({"from": DEV_ACCOUNT, "to": emitter(1), "data": fire(count, salt)});
    rpc_result(&client, &anvil.http_url(), "anvil_reorg", json!([3, [[tx(2, 9), 0], [tx(2, 10), 2]]])).await;
    let reference = settled(Duration::from_secs(20), Duration::from_secs(1), || direct.count(&direct_sub)).await;
    assert_eq!(reference, 19, "anvil: 15 logs, then the new branch's 4");
    // The logs of the three blocks the reorg dropped, again, removed, oldest first, in log order. Which
    // logs those are depends on how anvil packed the five transactions into blocks (two sent close
    // together can share one), so they are picked by block number.
    let removed: Vec<Value> = before
        .iter()
        .filter(|log| quantity(&log["blockNumber"]) + 3 > head)
        .map(|log| {
            let mut log = log.clone();
            log["removed"] = json!(true);
            log
        })
        .collect();
    assert!(removed.len() >= 9, "three blocks of at least one transaction (3 logs) each: {removed:?}");
    let settled_count = 15 + removed.len() + 4;
    wait_until("the reorg through sluice", Duration::from_secs(20), || via.count(&via_sub) >= settled_count).await;
    let got = via.of(&via_sub);
    let want = direct.of(&direct_sub);
    assert_eq!(&got[..15], &before[..], "what came before stays");
    assert_eq!(&got[..15], &want[..15], "the same logs as anvil's own subscription");
    assert_eq!(&got[15..15 + removed.len()], &removed[..], "dropped logs sent again with removed: true");
    assert_eq!(&got[15 + removed.len()..], &want[15..], "then the new branch, as anvil sends it");
    assert_eq!(via.closed(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_match_exactly_what_anvils_own_subscriptions_deliver() {
    let anvil = Anvil::spawn();
    let client = reqwest::Client::new();
    place_emitters(&client, &anvil, 3).await;
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &["--log", "warn"]);
    let (a, b, c, d, x) = (topic("aa"), topic("bb"), topic("cc"), topic("dd"), topic("ee"));
    let (e1, e2, e3) = (emitter(1), emitter(2), emitter(3));
    let filters = vec![
        json!({}),
        json!({"address": e1}),
        json!({"address": [e1, e3]}),
        json!({"address": [format!("0x{}", "77".repeat(20))]}),
        json!({"address": e2.to_uppercase().replace("0X", "0x")}),
        json!({"topics": [a]}),
        json!({"topics": [[a, b]]}),
        json!({"topics": [null, b]}),
        json!({"topics": [null, null, c]}),
        json!({"topics": [null, null, null, d]}),
        json!({"topics": [null, null, null, null]}),
        json!({"topics": [null]}),
        json!({"topics": [[a, null]]}),
        json!({"topics": [[], c]}),
        json!({"topics": []}),
        json!({"topics": [x]}),
        json!({"topics": [a, b, c, d]}),
        json!({"topics": [[a, b, c, d], [a, b, c, d], [a, b, c, d], [a, b, c, d]]}),
        json!({"topics": [d, a]}),
        json!({"address": e2, "topics": [b]}),
        json!({"address": [e1, e2], "topics": [[c, d], null, [a]]}),
        json!({"address": e3, "topics": [null, [a, d]]}),
        json!({"address": [e1, e2, e3], "topics": [null, null, [b, c]]}),
        json!({"address": [], "topics": [c]}),
        // Not served by sluice (a block range): relayed, so it must match too.
        json!({"fromBlock": "latest", "topics": [b]}),
    ];
    let mut direct = connect(&anvil.ws_url()).await;
    let mut via = connect(&sluice.ws_url()).await;
    let mut subs = Vec::new();
    for (i, filter) in filters.iter().enumerate() {
        let direct_sub = subscribe(&mut direct, i as u64, json!(["logs", filter])).await;
        let via_sub = subscribe(&mut via, i as u64, json!(["logs", filter])).await;
        subs.push((direct_sub, via_sub));
    }
    let (direct, via) = (Collected::start(direct), Collected::start(via));
    // Nine blocks of twelve logs each, from three contracts, topics rotating through a..d.
    for i in 0..9u64 {
        send_fire(&client, &anvil.http_url(), &emitter(1 + (i % 3) as u8), 12, i).await;
    }
    let total =
        settled(Duration::from_secs(20), Duration::from_secs(1), || subs.iter().map(|(d, _)| direct.count(d)).sum())
            .await;
    assert!(total > 300, "the corpus delivered {total} logs directly");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && !subs.iter().all(|(d, v)| via.count(v) >= direct.count(d)) {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut empty = 0;
    for (i, (d, v)) in subs.iter().enumerate() {
        let (want, got) = (direct.of(d), via.of(v));
        empty += usize::from(want.is_empty());
        assert_eq!(got.len(), want.len(), "filter {i} {}: how many logs", filters[i]);
        assert_eq!(got, want, "filter {i} {}", filters[i]);
    }
    assert!(empty <= 3, "{empty} filters matched nothing: the corpus does not exercise them");
}
