//! Nothing acknowledged is lost: the mempool's journal at realistic scale, through the real
//! binary, `kill -9` and a restart, in front of a real (non-mining) anvil.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy_primitives::Address;
use common::{fund_all, txpool_hashes, BIN};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, SignedTx, Wallet};
use sluice_testkit::{Anvil, Sluice};

const CHAIN: u64 = 31337;

fn to() -> Address {
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap()
}

/// Every hash in `txpool_content` (pending and queued).
async fn pooled_hashes(client: &reqwest::Client, url: &str) -> HashSet<String> {
    txpool_hashes(client, url, &["pending", "queued"]).await
}

/// Sends `txs` as batches of 20; records each hash the pool answered with.
async fn send_batches(client: reqwest::Client, url: String, txs: Vec<SignedTx>, acked: Arc<Mutex<Vec<String>>>) {
    for chunk in txs.chunks(20) {
        let batch: Vec<Value> = chunk
            .iter()
            .enumerate()
            .map(|(i, tx)| json!({"jsonrpc":"2.0","id":i,"method":"eth_sendRawTransaction","params":[tx.hex()]}))
            .collect();
        // The process is killed while this runs: a failed exchange ends the stream.
        let Ok(response) = client.post(&url).json(&batch).send().await else { return };
        let Ok(answers) = response.json::<Vec<Value>>().await else { return };
        let mut acked = acked.lock().unwrap();
        for answer in answers {
            let Some(i) = answer["id"].as_u64() else { continue };
            if answer["result"].is_string() {
                acked.push(format!("{}", chunk[i as usize].hash));
            }
        }
    }
}

/// `senders` × `nonces` transfers by 16 concurrent streams; `kill -9` once `kill_at` are
/// acknowledged, while the rest are still being sent; then a restart on the same journal.
/// Returns (acknowledged, acknowledged but not pooled after the restart).
async fn kill_during_ingest(senders: u64, nonces: u64, kill_at: usize, extra: &[(&str, &str)]) -> (usize, Vec<String>) {
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("mempool.journal");
    let mut env = vec![
        ("SLUICE_MEMPOOL__JOURNAL", journal.to_str().unwrap()),
        ("SLUICE_MEMPOOL__RELAY", "false"),
        ("SLUICE_MEMPOOL__GLOBAL_SLOTS", "25000"),
        ("SLUICE_MEMPOOL__ACCOUNT_SLOTS", "64"),
    ];
    env.extend_from_slice(extra);
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()];
    let mut sluice = Sluice::spawn_env(BIN, &args, &env);
    let client = reqwest::Client::new();
    let wallets: Vec<Wallet> = (0..senders).map(|i| Wallet::numbered(20_000 + i, CHAIN)).collect();
    fund_all(&client, &anvil, wallets.iter().map(|w| w.address())).await;
    let signed: Vec<Vec<SignedTx>> = tokio::task::spawn_blocking(move || {
        wallets.iter().map(|w| (0..nonces).map(|n| w.transfer(n, to(), 1, Fees::default())).collect()).collect()
    })
    .await
    .unwrap();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut streams = Vec::new();
    let mut lanes: Vec<Vec<SignedTx>> = (0..16).map(|_| Vec::new()).collect();
    for (i, txs) in signed.into_iter().enumerate() {
        lanes[i % 16].extend(txs);
    }
    for lane in lanes {
        streams.push(tokio::spawn(send_batches(client.clone(), sluice.http_url(), lane, acked.clone())));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while acked.lock().unwrap().len() < kill_at {
        assert!(Instant::now() < deadline, "ingest too slow: {} acknowledged", acked.lock().unwrap().len());
        assert!(!streams.iter().all(|s| s.is_finished()), "every stream ended before the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sluice.kill();
    for s in streams {
        let _ = s.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() < (senders * nonces) as usize,
        "killed while submissions continued: {} acknowledged",
        acked.len()
    );
    let sluice = Sluice::spawn_env(BIN, &args, &env);
    let pooled = pooled_hashes(&client, &sluice.http_url()).await;
    let lost = acked.iter().filter(|h| !pooled.contains(*h)).cloned().collect();
    (acked.len(), lost)
}

// 500 senders × 40 nonces = 20,000 transfers; killed at 19,000 acknowledged. The restart
// replays 19,000+ records, more than the verifier queue holds at once: none may be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_20000_are_submitted_loses_no_acknowledged_transaction() {
    let (acked, lost) = kill_during_ingest(500, 40, 19_000, &[]).await;
    assert!(lost.is_empty(), "{} of {acked} acknowledged are lost after kill -9, e.g. {:?}", lost.len(), lost.first());
}

// With `fsync = "always"` (every writer batch synced before it is answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_fsync_always_loses_no_acknowledged_transaction() {
    let (acked, lost) = kill_during_ingest(100, 40, 3_000, &[("SLUICE_MEMPOOL__FSYNC", "always")]).await;
    assert!(lost.is_empty(), "{} of {acked} acknowledged are lost after kill -9, e.g. {:?}", lost.len(), lost.first());
}

// The upstream is down when sluice restarts: it still starts, the pool answers -32002 until
// the chain can be read, then the journal is replayed and every transaction is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_is_replayed_once_the_upstream_is_back() {
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let port = anvil.port;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("mempool.journal");
    let env = [("SLUICE_MEMPOOL__JOURNAL", journal.to_str().unwrap()), ("SLUICE_MEMPOOL__RELAY", "false")];
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()];
    let mut sluice = Sluice::spawn_env(BIN, &args, &env);
    let client = reqwest::Client::new();
    // anvil's first dev account, funded in every fresh anvil: the new node has the same state.
    let wallet = Wallet::from_hex(common::DEV_KEY, CHAIN).unwrap();
    let txs: Vec<SignedTx> = (0..40).map(|n| wallet.transfer(n, to(), 1, Fees::default())).collect();
    let acked = Arc::new(Mutex::new(Vec::new()));
    send_batches(client.clone(), sluice.http_url(), txs.clone(), acked.clone()).await;
    assert_eq!(acked.lock().unwrap().len(), 40);
    sluice.kill();
    drop(anvil);
    let sluice = Sluice::spawn_env(BIN, &args, &env);
    let closed = sluice_testkit::rpc(&client, &sluice.http_url(), "txpool_status", json!([])).await;
    let refused =
        sluice_testkit::rpc(&client, &sluice.http_url(), "eth_sendRawTransaction", json!([txs[0].hex()])).await;
    assert_eq!(refused["error"]["code"], -32002, "the pool is closed while the chain is unknown: {refused} {closed}");
    let _anvil = Anvil::spawn_on(port, &["--no-mining"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pooled = pooled_hashes(&client, &sluice.http_url()).await;
        if acked.lock().unwrap().iter().all(|h| pooled.contains(h)) {
            break;
        }
        assert!(Instant::now() < deadline, "{} of 40 back after the upstream returned", pooled.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
