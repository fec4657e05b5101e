//! The mempool end to end: real anvil, transactions signed with alloy's local signer, the real
//! sluice binary.

mod common;

use std::time::{Duration, Instant};

use alloy_primitives::Address;
use common::ws::{next, subscribe};
use common::{eventually, fund, fund_all, wait_receipt, BIN, DEV_KEY};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, SignedTx, Wallet};
use sluice_testkit::{foundry_tool, rpc, rpc_result, Anvil, Sluice};

const CHAIN: u64 = 31337;

fn dev() -> Wallet {
    Wallet::from_hex(DEV_KEY, CHAIN).unwrap()
}

fn to() -> Address {
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap()
}

/// anvil that mines only when told (`evm_mine`), and sluice in front of it.
fn manual_chain() -> (Anvil, Sluice) {
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &[]);
    (anvil, sluice)
}

async fn send(client: &reqwest::Client, url: &str, tx: &SignedTx) -> Value {
    rpc(client, url, "eth_sendRawTransaction", json!([tx.hex()])).await
}

async fn pool_status(client: &reqwest::Client, url: &str, hash: &str) -> String {
    let status = rpc_result(client, url, "sluice_getTransactionStatus", json!([hash])).await;
    status["status"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_is_pooled_relayed_mined_and_leaves_and_the_gap_fill_promotes() {
    let (anvil, sluice) = manual_chain();
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let w = dev();
    let (t0, t1, t2) = (
        w.transfer(0, to(), 1, Fees::default()),
        w.transfer(1, to(), 1, Fees::default()),
        w.transfer(2, to(), 1, Fees::default()),
    );
    assert_eq!(send(&client, &url, &t0).await["result"], json!(format!("{}", t0.hash)));
    assert_eq!(send(&client, &url, &t2).await["result"], json!(format!("{}", t2.hash)));
    // Read-your-write: visible at once, from the pool, in geth's formats.
    let content = rpc_result(&client, &url, "txpool_content", json!([])).await;
    let sender = format!("{}", w.address());
    assert_eq!(content["pending"][&sender]["0"]["hash"], json!(format!("{}", t0.hash)));
    assert_eq!(content["queued"][&sender]["2"]["hash"], json!(format!("{}", t2.hash)));
    let status = rpc_result(&client, &url, "txpool_status", json!([])).await;
    assert_eq!(status, json!({"pending": "0x1", "queued": "0x1"}));
    let inspect = rpc_result(&client, &url, "txpool_inspect", json!([])).await;
    let line = inspect["pending"][&sender]["0"].as_str().unwrap();
    assert_eq!(line, format!("{}: 1 wei + 21000 gas × 20000000000 wei", to()));
    // Rendered from the pooled bytes, as the node renders the same transaction.
    let by_hash = rpc_result(&client, &url, "eth_getTransactionByHash", json!([format!("{}", t0.hash)])).await;
    assert_eq!((by_hash["blockHash"].clone(), by_hash["from"].clone()), (Value::Null, json!(sender.to_lowercase())));
    let count = rpc_result(&client, &url, "eth_getTransactionCount", json!([sender, "pending"])).await;
    assert_eq!(count, "0x1", "pending nonce counts the executable run only");
    // Relayed: anvil's own pool gets the executable one (not the gapped one).
    let anvil_url = anvil.http_url();
    eventually(Duration::from_secs(5), "anvil holds nonce 0", || async {
        let anvil_pool = rpc_result(&client, &anvil_url, "txpool_status", json!([])).await;
        anvil_pool["pending"] == "0x1"
    })
    .await;
    let at_node = rpc_result(&client, &anvil_url, "eth_getTransactionByHash", json!([format!("{}", t0.hash)])).await;
    for field in ["hash", "nonce", "to", "value", "gas", "input", "r", "s", "v", "type", "chainId", "maxFeePerGas"] {
        assert_eq!(by_hash[field], at_node[field], "{field}: {by_hash} against the node's {at_node}");
    }
    // Mined: it leaves the pool within a head.
    rpc_result(&client, &anvil_url, "evm_mine", json!([])).await;
    let h0 = format!("{}", t0.hash);
    eventually(Duration::from_secs(3), "nonce 0 mined", || async { pool_status(&client, &url, &h0).await == "mined" })
        .await;
    assert_eq!(rpc_result(&client, &url, "txpool_status", json!([])).await, json!({"pending": "0x0", "queued": "0x1"}));
    // Filling the gap promotes nonce 2; both are relayed and mined.
    send(&client, &url, &t1).await;
    assert_eq!(rpc_result(&client, &url, "txpool_status", json!([])).await, json!({"pending": "0x2", "queued": "0x0"}));
    let count = rpc_result(&client, &url, "eth_getTransactionCount", json!([sender, "pending"])).await;
    assert_eq!(count, "0x3");
    eventually(Duration::from_secs(5), "anvil holds nonces 1 and 2", || async {
        rpc_result(&client, &anvil_url, "txpool_status", json!([])).await["pending"] == "0x2"
    })
    .await;
    rpc_result(&client, &anvil_url, "evm_mine", json!([])).await;
    let h2 = format!("{}", t2.hash);
    eventually(Duration::from_secs(3), "nonce 2 mined", || async { pool_status(&client, &url, &h2).await == "mined" })
        .await;
    assert_eq!(rpc_result(&client, &url, "txpool_status", json!([])).await, json!({"pending": "0x0", "queued": "0x0"}));
    let receipt = wait_receipt(&client, &url, &h2).await;
    assert_eq!(receipt["status"], "0x1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_has_geths_wording_and_duplicates_are_idempotent() {
    let (anvil, sluice) = manual_chain();
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let w = dev();
    let error =
        |v: Value| (v["error"]["code"].as_i64().unwrap_or(0), v["error"]["message"].as_str().unwrap_or("").to_owned());

    let tx = w.transfer(0, to(), 1, Fees::default());
    let first = send(&client, &url, &tx).await;
    assert_eq!(send(&client, &url, &tx).await, first, "a duplicate answers with the same hash");

    let cheap = w.transfer(0, to(), 2, Fees { max_fee: 21_000_000_000, tip: 1_000_000_000 });
    assert_eq!(error(send(&client, &url, &cheap).await), (-32000, "replacement transaction underpriced".into()));
    let bumped = w.transfer(0, to(), 2, Fees { max_fee: 22_000_000_000, tip: 1_100_000_000 });
    assert!(send(&client, &url, &bumped).await["result"].is_string(), "a 10 % bump on both fees replaces");
    assert_eq!(pool_status(&client, &url, &format!("{}", tx.hash)).await, "replaced");

    let other_chain = Wallet::from_hex(DEV_KEY, 1).unwrap().transfer(1, to(), 1, Fees::default());
    assert_eq!(error(send(&client, &url, &other_chain).await), (-32000, "invalid chain id: 1, expected 31337".into()));

    let poor = Wallet::numbered(7, CHAIN).transfer(0, to(), 1, Fees::default());
    let (code, message) = error(send(&client, &url, &poor).await);
    assert_eq!(code, -32000);
    assert!(message.starts_with("insufficient funds for gas * price + value"), "{message}");

    let tip_above_cap = w.transfer(1, to(), 1, Fees { max_fee: 1_000_000_000, tip: 2_000_000_000 });
    let (_, message) = error(send(&client, &url, &tip_above_cap).await);
    assert_eq!(message, "max priority fee per gas higher than max fee per gas");

    assert_eq!(error(send_hex(&client, &url, "0x02c0").await).0, -32000, "undecodable");
    assert_eq!(error(send_hex(&client, &url, "zz").await).0, -32602, "not hex");

    // Mined elsewhere (straight to anvil): the next submission of that nonce is too low.
    let direct = w.transfer(1, to(), 1, Fees::default());
    rpc_result(&client, &anvil.http_url(), "eth_sendRawTransaction", json!([direct.hex()])).await;
    rpc_result(&client, &anvil.http_url(), "evm_mine", json!([])).await;
    let late = w.transfer(1, to(), 5, Fees::default());
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (_, message) = error(send(&client, &url, &late).await);
        if message.starts_with("nonce too low") {
            break;
        }
        assert!(Instant::now() < deadline, "expected nonce too low, got {message:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn send_hex(client: &reqwest::Client, url: &str, hex: &str) -> Value {
    rpc(client, url, "eth_sendRawTransaction", json!([hex])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cast_send_through_sluice_is_mined_and_leaves_the_pool() {
    let anvil = Anvil::spawn();
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &[]);
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let out = std::process::Command::new(foundry_tool("cast"))
        .args(["send", "--rpc-url", &url, "--private-key", DEV_KEY, &format!("{}", to()), "--value", "7", "--json"])
        .output()
        .expect("cast runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hash = receipt["transactionHash"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(3), "mined and out of the pool", || async {
        pool_status(&client, &url, &hash).await == "mined"
    })
    .await;
    assert_eq!(rpc_result(&client, &url, "txpool_status", json!([])).await, json!({"pending": "0x0", "queued": "0x0"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reorg_that_drops_a_block_brings_its_transactions_back_to_pending() {
    let (anvil, sluice) = manual_chain();
    let client = reqwest::Client::new();
    let (url, anvil_url) = (sluice.http_url(), anvil.http_url());
    let tx = dev().transfer(0, to(), 1, Fees::default());
    let hash = format!("{}", tx.hash);
    send(&client, &url, &tx).await;
    eventually(Duration::from_secs(5), "relayed", || async {
        rpc_result(&client, &anvil_url, "txpool_status", json!([])).await["pending"] == "0x1"
    })
    .await;
    rpc_result(&client, &anvil_url, "evm_mine", json!([])).await;
    eventually(Duration::from_secs(3), "mined", || async { pool_status(&client, &url, &hash).await == "mined" }).await;
    // Replace the block holding it with an empty one.
    rpc_result(&client, &anvil_url, "anvil_reorg", json!([1, []])).await;
    let receipt = rpc(&client, &anvil_url, "eth_getTransactionReceipt", json!([hash])).await;
    assert_eq!(receipt["result"], Value::Null, "anvil dropped it: {receipt}");
    eventually(Duration::from_secs(5), "back to pending in sluice", || async {
        pool_status(&client, &url, &hash).await == "pending"
    })
    .await;
    // Relayed again and mined again.
    eventually(Duration::from_secs(15), "re-relayed to anvil", || async {
        rpc_result(&client, &anvil_url, "txpool_status", json!([])).await["pending"] == "0x1"
    })
    .await;
    rpc_result(&client, &anvil_url, "evm_mine", json!([])).await;
    let receipt = wait_receipt(&client, &url, &hash).await;
    assert_eq!(receipt["status"], "0x1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_ingest_loses_no_acknowledged_transaction() {
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("mempool.journal");
    let journal = journal.to_str().unwrap();
    let env = [("SLUICE_MEMPOOL__JOURNAL", journal)];
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()];
    let mut sluice = Sluice::spawn_env(BIN, &args, &env);
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    // 8 senders × 40 nonces, sent by 8 concurrent streams; killed while they run.
    let wallets: Vec<Wallet> = (0..8).map(|i| Wallet::numbered(1000 + i, CHAIN)).collect();
    for w in &wallets {
        fund(&client, &anvil, w.address(), "0xffffffffffffffffffff").await;
    }
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut streams = Vec::new();
    for w in wallets.clone() {
        let (client, url, acked) = (client.clone(), url.clone(), acked.clone());
        streams.push(tokio::spawn(async move {
            for nonce in 0..40 {
                let tx = w.transfer(nonce, to(), 1, Fees::default());
                let Ok(response) = client
                    .post(&url)
                    .json(&json!({"jsonrpc":"2.0","id":1,"method":"eth_sendRawTransaction","params":[tx.hex()]}))
                    .send()
                    .await
                else {
                    return;
                };
                let Ok(body) = response.json::<Value>().await else { return };
                if body["result"].is_string() {
                    acked.lock().unwrap().push(format!("{}", tx.hash));
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().len() < 100 {
        assert!(Instant::now() < deadline, "ingest too slow");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sluice.kill();
    for s in streams {
        let _ = s.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 100 && acked.len() < 320, "killed mid-stream: {} acknowledged", acked.len());
    let sluice = Sluice::spawn_env(BIN, &args, &env);
    let url = sluice.http_url();
    for hash in &acked {
        let status = pool_status(&client, &url, hash).await;
        assert!(status == "pending" || status == "queued", "{hash} is {status} after the restart");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_write_holds_for_1000_concurrent_senders() {
    let (anvil, sluice) = manual_chain();
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let wallets: Vec<Wallet> = (0..1000).map(|i| Wallet::numbered(i, CHAIN)).collect();
    // Fund them in one batch straight at anvil.
    fund_all(&client, &anvil, wallets.iter().map(|w| w.address())).await;
    let checks = wallets.into_iter().map(|w| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let tx = w.transfer(0, to(), 1, Fees::default());
            let hash = format!("{}", tx.hash);
            let sent = send(&client, &url, &tx).await;
            assert_eq!(sent["result"], json!(hash), "{sent}");
            let sender = format!("{}", w.address());
            let got = rpc_result(&client, &url, "eth_getTransactionByHash", json!([hash])).await;
            assert_eq!(got["hash"], json!(hash), "visible by hash at once");
            let count = rpc_result(&client, &url, "eth_getTransactionCount", json!([sender, "pending"])).await;
            assert_eq!(count, "0x1", "pending nonce counts it at once");
            let from = rpc_result(&client, &url, "txpool_contentFrom", json!([sender])).await;
            assert_eq!(from["pending"]["0"]["hash"], json!(hash), "in txpool_contentFrom at once");
        }
    });
    futures_util::future::join_all(checks).await;
    let status = rpc_result(&client, &url, "txpool_status", json!([])).await;
    assert_eq!(status["pending"], "0x3e8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_pending_transactions_are_announced_from_the_pool_as_hashes_or_full() {
    let (_anvil, sluice) = manual_chain();
    let client = reqwest::Client::new();
    let (mut hashes, _) = tokio_tungstenite::connect_async(sluice.ws_url()).await.unwrap();
    let (mut full, _) = tokio_tungstenite::connect_async(sluice.ws_url()).await.unwrap();
    let hashes_id = subscribe(&mut hashes, 1, json!(["newPendingTransactions"])).await;
    let full_id = subscribe(&mut full, 1, json!(["newPendingTransactions", true])).await;
    let w = dev();
    // Nonce 1 first: queued, so not announced until nonce 0 fills the gap.
    let (t0, t1) = (w.transfer(0, to(), 1, Fees::default()), w.transfer(1, to(), 1, Fees::default()));
    send(&client, &sluice.http_url(), &t1).await;
    send(&client, &sluice.http_url(), &t0).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = next(&mut hashes).await;
        assert_eq!(event["params"]["subscription"], json!(hashes_id));
        seen.push(event["params"]["result"].as_str().unwrap().to_owned());
    }
    seen.sort();
    let mut want = vec![format!("{}", t0.hash), format!("{}", t1.hash)];
    want.sort();
    assert_eq!(seen, want);
    let event = next(&mut full).await;
    assert_eq!(event["params"]["subscription"], json!(full_id));
    let tx = &event["params"]["result"];
    assert_eq!(
        (tx["blockHash"].clone(), tx["from"].clone()),
        (Value::Null, json!(format!("{}", w.address()).to_lowercase()))
    );
}
