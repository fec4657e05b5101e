//! Right answers from imperfect nodes: block availability (a pruned node next to an archive),
//! a node 20 blocks behind, a node that answers `null` for blocks it has, and consensus
//! against nodes that lie. Real anvils on one chain (same genesis, blocks mined with the same
//! timestamps, so the same hashes); fault-injecting relays (named as such) only count calls or
//! alter answers.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{call, status, wait_status, BIN, DEV_ACCOUNT};
use serde_json::{json, Value};
use sluice_testkit::{post, rpc, rpc_result, Anvil, FakeUpstream, Fault, Sluice};

/// Genesis time of every twin: one chain on every node.
const GENESIS: u64 = 1_700_000_000;

/// An anvil of the test chain with `blocks` blocks.
async fn twin(client: &reqwest::Client, blocks: u64, extra: &[&str]) -> Anvil {
    let genesis = GENESIS.to_string();
    let mut args = vec!["--timestamp", genesis.as_str()];
    args.extend_from_slice(extra);
    let anvil = Anvil::spawn_with(&args);
    mine(client, &anvil, 0, blocks).await;
    anvil
}

/// Mines blocks `from + 1 ..= to` with their fixed timestamps.
async fn mine(client: &reqwest::Client, anvil: &Anvil, from: u64, to: u64) {
    for n in from + 1..=to {
        rpc_result(client, &anvil.http_url(), "evm_mine", json!([GENESIS + n * 12])).await;
    }
}

fn counting(to: &Anvil) -> Fault {
    Fault::Relay { to: to.http_url(), delay: Duration::ZERO, fail_method: None }
}

/// sluice in front of `upstreams` with `toml` added to its configuration, cache and mempool off
/// (every call reaches the pool).
fn serve(upstreams: &[&str], toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    serve_with(upstreams, "[mempool]\nenabled = false", toml)
}

/// `upstreams`: each a URL, optionally followed by lines of its own settings.
fn serve_with(upstreams: &[&str], mempool: &str, toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let list: Vec<String> = upstreams
        .iter()
        .map(|u| {
            let (url, own) = u.split_once('\n').unwrap_or((u, ""));
            format!("[[upstreams]]\nurl = \"{url}\"\n{own}\n")
        })
        .collect();
    writeln!(
        file,
        "listen = \"127.0.0.1:0\"\n[cache]\nenabled = false\n{mempool}\n[pool]\nprobe_interval = \"100ms\"\nhedge = \"off\"\n{toml}\n{}",
        list.join("\n")
    )
    .unwrap();
    let sluice = Sluice::spawn(BIN, &["serve", "--config", file.path().to_str().unwrap()]);
    (sluice, file)
}

fn balance_at(block: u64) -> String {
    call(json!(1), "eth_getBalance", &json!([DEV_ACCOUNT, format!("{block:#x}")])).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_state_reads_never_reach_the_pruned_node_once_its_range_is_learned() {
    let client = reqwest::Client::new();
    let archive = twin(&client, 40, &[]).await;
    let pruned = twin(&client, 40, &["--prune-history", "10"]).await;
    let (to_archive, to_pruned) =
        (FakeUpstream::spawn(counting(&archive)).await, FakeUpstream::spawn(counting(&pruned)).await);
    let (sluice, _config) = serve(&[&to_archive.url, &to_pruned.url], "");
    let s = wait_status(&client, &sluice, "the pruned node's range learned", |s| {
        s["upstreams"][1]["lowest_state"].as_u64().is_some_and(|l| l > 20)
    })
    .await;
    assert_eq!(s["upstreams"][0]["lowest_state"], 0, "the archive: {s}");
    assert_eq!(s["upstreams"][1]["lowest_block"], 0, "the pruned node keeps its blocks: {s}");
    let expected = post(&client, &archive.http_url(), balance_at(1)).await.1["result"].clone();
    let before = to_pruned.requests_for("eth_getBalance");
    // 200 reads at old blocks (1..=25, in an order that is not sequential), 20 at a time.
    let url = sluice.http_url();
    let blocks: Vec<u64> = (0..200u64).map(|i| 1 + (i * 7919) % 25).collect();
    for round in blocks.chunks(20) {
        let answers = futures_util::future::join_all(round.iter().map(|&b| post(&client, &url, balance_at(b)))).await;
        for (b, (status, answer)) in round.iter().zip(answers) {
            assert_eq!((status, &answer["result"]), (200, &expected), "block {b}: {answer}");
        }
    }
    assert_eq!(to_pruned.requests_for("eth_getBalance"), before, "an old read reached the pruned node");
    // Recent blocks: both serve.
    let (archive_before, pruned_before) =
        (to_archive.requests_for("eth_getBalance"), to_pruned.requests_for("eth_getBalance"));
    for round in 0..10 {
        let reads = (0..10u64).map(|i| post(&client, &url, balance_at(35 + (i + round) % 6)));
        for (status, answer) in futures_util::future::join_all(reads).await {
            assert_eq!((status, &answer["result"]), (200, &expected), "{answer}");
        }
    }
    assert!(to_pruned.requests_for("eth_getBalance") > pruned_before, "recent reads use the pruned node too");
    assert!(to_archive.requests_for("eth_getBalance") > archive_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_no_member_keeps_is_refused_at_once_with_the_reason() {
    let client = reqwest::Client::new();
    let pruned = twin(&client, 40, &["--prune-history", "10"]).await;
    let (sluice, _config) = serve(&[&pruned.http_url()], "");
    wait_status(&client, &sluice, "range learned", |s| {
        s["upstreams"][0]["lowest_state"].as_u64().is_some_and(|l| l > 20)
    })
    .await;
    let started = Instant::now();
    let (status, answer) = post(&client, &sluice.http_url(), balance_at(3)).await;
    assert_eq!(status, 200);
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "pruned", "{answer}");
    assert_eq!(answer["error"]["data"]["block"], "0x3", "{answer}");
    assert!(started.elapsed() < Duration::from_millis(500), "refused at once, took {:?}", started.elapsed());
    // Chain data is still there, and a recent state read is served.
    let block = rpc_result(&client, &sluice.http_url(), "eth_getBlockByNumber", json!(["0x3", false])).await;
    assert_eq!(block["number"], "0x3");
    assert!(rpc_result(&client, &sluice.http_url(), "eth_getBalance", json!([DEV_ACCOUNT, "0x26"])).await.is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_never_goes_backwards_and_latest_never_comes_from_a_member_behind() {
    let client = reqwest::Client::new();
    let ahead = twin(&client, 60, &[]).await;
    let far_behind = twin(&client, 40, &[]).await;
    // Within the pool's max_lag (5): without the integrity check, a fine member for `latest`.
    let just_behind = twin(&client, 57, &[]).await;
    // The laggards first in the list, and the calls start as soon as sluice listens.
    let (sluice, _config) = serve(&[&far_behind.http_url(), &just_behind.http_url(), &ahead.http_url()], "");
    let url = sluice.http_url();
    let mut highest = 0;
    for i in 0..1_000 {
        let number = rpc_result(&client, &url, "eth_blockNumber", json!([])).await;
        let n = u64::from_str_radix(number.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        assert!(n >= highest, "call {i}: eth_blockNumber went from {highest} to {n}");
        highest = n;
        if i % 10 == 0 {
            let block = rpc_result(&client, &url, "eth_getBlockByNumber", json!(["latest", false])).await;
            assert_eq!(block["number"], "0x3c", "call {i}: latest came from the laggard");
        }
    }
    assert_eq!(highest, 60);
}

/// Answers of the lying relay that nulled a block.
static NULLED: AtomicUsize = AtomicUsize::new(0);

/// A node that answers `null` for every block asked by number or hash (not `latest`).
fn null_blocks(req: &Value, answer: &mut Value) {
    let by_number = req["method"] == "eth_getBlockByNumber" && req["params"][0] != "latest";
    if (by_number || req["method"] == "eth_getBlockByHash") && answer["result"].is_object() {
        answer["result"] = Value::Null;
        NULLED.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_never_see_the_nulls_of_a_member_that_lacks_blocks_it_should_have() {
    let client = reqwest::Client::new();
    let honest = twin(&client, 20, &[]).await;
    let nulls = twin(&client, 20, &[]).await;
    let liar = FakeUpstream::spawn(Fault::Alter { to: nulls.http_url(), alter: null_blocks }).await;
    let (sluice, _config) = serve(&[&liar.url, &honest.http_url()], "");
    wait_status(&client, &sluice, "heads", |s| s["upstreams"][1]["head"] == 20 && s["upstreams"][0]["head"] == 20)
        .await;
    let url = sluice.http_url();
    let (client_ref, url_ref) = (&client, &url);
    for round in 0..5 {
        let calls = (1..=20u64).map(|n| async move {
            let (client, url) = (client_ref, url_ref);
            let by_number = json!([format!("{n:#x}"), false]);
            let block = rpc(client, url, "eth_getBlockByNumber", by_number).await;
            let hash = block["result"]["hash"].clone();
            let by_hash = rpc(client, url, "eth_getBlockByHash", json!([hash, false])).await;
            (n, block, by_hash)
        });
        for (n, block, by_hash) in futures_util::future::join_all(calls).await {
            assert!(block["result"].is_object(), "round {round}, block {n} by number: {block}");
            assert!(by_hash["result"].is_object(), "round {round}, block {n} by hash: {by_hash}");
        }
    }
    assert!(NULLED.load(Ordering::SeqCst) >= 10, "the liar was asked: {}", NULLED.load(Ordering::SeqCst));
    // A block beyond every head is still null (it does not exist yet), and said so at once.
    let future = rpc(&client, &url, "eth_getBlockByNumber", json!(["0x64", false])).await;
    assert_eq!(future["result"], Value::Null, "{future}");
}

/// Receipts the lying relay nulled.
static NULLED_RECEIPTS: AtomicUsize = AtomicUsize::new(0);

/// A node that answers `null` for every receipt.
fn null_receipts(req: &Value, answer: &mut Value) {
    if req["method"] == "eth_getTransactionReceipt" && answer["result"].is_object() {
        answer["result"] = Value::Null;
        NULLED_RECEIPTS.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_of_a_transaction_the_mempool_saw_mined_is_never_null() {
    use sluice_bench::txgen::{Fees, Wallet};
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    // One node reached twice: directly, and through a relay that hides every receipt.
    let liar = FakeUpstream::spawn(Fault::Alter { to: anvil.http_url(), alter: null_receipts }).await;
    let journal = tempfile::tempdir().unwrap();
    let mempool = format!("[mempool]\njournal = \"{}\"", journal.path().join("j").display());
    // The liar weighs most: it is asked first, the honest node after its null.
    let liar_entry = format!("{}\nweight = 1000", liar.url);
    let (sluice, _config) = serve_with(&[&liar_entry, &anvil.http_url()], &mempool, "");
    let url = sluice.http_url();
    let wallet = Wallet::from_hex(common::DEV_KEY, 31337).unwrap();
    let to: alloy_primitives::Address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap();
    let mut hashes = Vec::new();
    for nonce in 0..20 {
        let tx = wallet.transfer(nonce, to, 1, Fees::default());
        rpc_result(&client, &url, "eth_sendRawTransaction", json!([tx.hex()])).await;
        hashes.push(format!("{}", tx.hash));
    }
    for hash in &hashes {
        common::eventually(Duration::from_secs(20), "the mempool sees it mined", || async {
            let status = rpc_result(&client, &url, "sluice_getTransactionStatus", json!([hash])).await;
            status["status"] == "mined"
        })
        .await;
        for _ in 0..3 {
            let receipt = rpc(&client, &url, "eth_getTransactionReceipt", json!([hash])).await;
            assert!(receipt["result"].is_object(), "{hash}: {receipt}");
        }
    }
    assert!(NULLED_RECEIPTS.load(Ordering::SeqCst) > 0, "the liar was asked");
    // A hash nobody has seen: null, as the nodes say, without a retry storm.
    let unknown = rpc(&client, &url, "eth_getTransactionReceipt", json!([format!("0x{}", "12".repeat(32))])).await;
    assert_eq!(unknown["result"], Value::Null, "{unknown}");
}

/// `eth_getBalance` answers 1 wei more, `eth_call` answers `0x01`.
fn lie_one(req: &Value, answer: &mut Value) {
    match req["method"].as_str() {
        Some("eth_getBalance") => answer["result"] = json!("0x1"),
        Some("eth_call") => answer["result"] = json!("0x01"),
        _ => {}
    }
}

/// Another lie, different from the first.
fn lie_two(req: &Value, answer: &mut Value) {
    match req["method"].as_str() {
        Some("eth_getBalance") => answer["result"] = json!("0x2"),
        Some("eth_call") => answer["result"] = json!("0x02"),
        _ => {}
    }
}

const CONSENSUS: &str = "[[pool.consensus]]\nmethods = [\"eth_getBalance\", \"eth_call\"]\nask = 3\nagree = 2\ncordon_after = 3\ncordon_for = \"60s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_consensus_a_liar_is_outvoted_counted_and_cordoned() {
    let client = reqwest::Client::new();
    let (a, b, c) = (twin(&client, 10, &[]).await, twin(&client, 10, &[]).await, twin(&client, 10, &[]).await);
    let liar = FakeUpstream::spawn(Fault::Alter { to: c.http_url(), alter: lie_one }).await;
    let (sluice, _config) = serve(&[&liar.url, &a.http_url(), &b.http_url()], CONSENSUS);
    wait_status(&client, &sluice, "heads", |s| s["upstreams"][0]["head"] == 10).await;
    let url = sluice.http_url();
    let honest = post(&client, &a.http_url(), balance_at(5)).await.1["result"].clone();
    let call_body = call(json!(1), "eth_call", &json!([{"to": DEV_ACCOUNT, "data": "0x"}, "0x5"])).to_string();
    let honest_call = post(&client, &a.http_url(), call_body.clone()).await.1["result"].clone();
    for i in 0..20 {
        let (_, answer) = post(&client, &url, balance_at(5)).await;
        assert_eq!(answer["result"], honest, "call {i}: {answer}");
        let (_, answer) = post(&client, &url, call_body.clone()).await;
        assert_eq!(answer["result"], honest_call, "eth_call {i}: {answer}");
    }
    let s = status(&client, &sluice).await;
    let member = &s["upstreams"][0];
    assert!(member["dissents"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(member["cordoned"], true, "{s}");
    assert_eq!(s["upstreams"][1]["dissents"], 0, "{s}");
    // (The range prober reads the zero address's balance: only the clients' reads count.)
    let before = liar.requests_with(DEV_ACCOUNT);
    for _ in 0..5 {
        assert_eq!(post(&client, &url, balance_at(5)).await.1["result"], honest);
    }
    assert_eq!(liar.requests_with(DEV_ACCOUNT), before, "a cordoned member is not asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_liars_that_disagree_the_caller_gets_the_disagreement_never_a_wrong_value() {
    let client = reqwest::Client::new();
    let (a, b, c) = (twin(&client, 10, &[]).await, twin(&client, 10, &[]).await, twin(&client, 10, &[]).await);
    let one = FakeUpstream::spawn(Fault::Alter { to: b.http_url(), alter: lie_one }).await;
    let two = FakeUpstream::spawn(Fault::Alter { to: c.http_url(), alter: lie_two }).await;
    let (sluice, _config) = serve(&[&a.http_url(), &one.url, &two.url], CONSENSUS);
    wait_status(&client, &sluice, "heads", |s| s["upstreams"][2]["head"] == 10).await;
    for i in 0..10 {
        let (status, answer) = post(&client, &sluice.http_url(), balance_at(5)).await;
        assert_eq!(status, 200);
        assert!(answer.get("result").is_none(), "call {i} got a value no majority gave: {answer}");
        assert_eq!(answer["error"]["data"]["reason"], "consensus_dispute", "{answer}");
        assert_eq!(answer["error"]["data"]["answers"], json!([1, 1, 1]), "{answer}");
    }
    // Methods not under consensus are served as usual.
    assert_eq!(rpc_result(&client, &sluice.http_url(), "eth_chainId", json!([])).await, "0x7a69");
    let s = status(&client, &sluice).await;
    assert!(s["upstreams"].as_array().unwrap().iter().all(|m| m["cordoned"] == false), "nobody to blame: {s}");
}
