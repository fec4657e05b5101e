//! Nothing acknowledged is lost: the mempool's journal at realistic scale, through the real
//! binary, `kill -9` and a restart, in front of a real (non-mining) anvil.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy_primitives::Address;
use common::BIN;
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, SignedTx, Wallet};
use sluice_testkit::{rpc_result, Anvil, Sluice};

const CHAIN: u64 = 31337;

fn to() -> Address {
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap()
}

/// Funds every wallet in one batch, straight at anvil.
async fn fund_all(client: &reqwest::Client, anvil: &Anvil, wallets: &[Wallet]) {
    let batch: Vec<Value> = wallets
        .iter()
        .enumerate()
        .map(|(i, w)| json!({"jsonrpc":"2.0","id":i,"method":"anvil_setBalance","params":[format!("{}", w.address()), "0xffffffffffffffffffff"]}))
        .collect();
    let funded: Value = client.post(anvil.http_url()).json(&batch).send().await.unwrap().json().await.unwrap();
    assert!(funded.as_array().unwrap().iter().all(|r| r.get("error").is_none()), "funded");
}

/// Every hash in `txpool_content` (pending and queued).
async fn pooled_hashes(client: &reqwest::Client, url: &str) -> HashSet<String> {
    let content = rpc_result(client, url, "txpool_content", json!([])).await;
    let mut hashes = HashSet::new();
    for part in ["pending", "queued"] {
        for txs in content[part].as_object().into_iter().flat_map(|m| m.values()) {
            for tx in txs.as_object().into_iter().flat_map(|m| m.values()) {
                hashes.insert(tx["hash"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    hashes
}

/// Sends `txs` as batches of `per_batch`; records each hash the pool answered with.
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

// 500 senders × 40 nonces = 20,000 transfers by 16 concurrent streams; `kill -9` once 19,000
// are acknowledged, while the rest are still being sent. The restart replays the journal
// (20,000 records, more than the verifier queue holds at once): every acknowledged hash is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_20000_are_submitted_loses_no_acknowledged_transaction() {
    const SENDERS: u64 = 500;
    const NONCES: u64 = 40;
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("mempool.journal");
    let env = [
        ("SLUICE_MEMPOOL__JOURNAL", journal.to_str().unwrap()),
        ("SLUICE_MEMPOOL__RELAY", "false"),
        ("SLUICE_MEMPOOL__GLOBAL_SLOTS", "25000"),
        ("SLUICE_MEMPOOL__ACCOUNT_SLOTS", "64"),
    ];
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()];
    let mut sluice = Sluice::spawn_env(BIN, &args, &env);
    let client = reqwest::Client::new();
    let wallets: Vec<Wallet> = (0..SENDERS).map(|i| Wallet::numbered(20_000 + i, CHAIN)).collect();
    fund_all(&client, &anvil, &wallets).await;
    let signed: Vec<Vec<SignedTx>> = tokio::task::spawn_blocking(move || {
        wallets.iter().map(|w| (0..NONCES).map(|n| w.transfer(n, to(), 1, Fees::default())).collect()).collect()
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
    while acked.lock().unwrap().len() < 19_000 {
        assert!(Instant::now() < deadline, "ingest too slow: {} acknowledged", acked.lock().unwrap().len());
        assert!(!streams.iter().all(|s| s.is_finished()), "every stream ended before the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sluice.kill();
    for s in streams {
        let _ = s.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() < 20_000, "killed while submissions continued: {} acknowledged", acked.len());
    let sluice = Sluice::spawn_env(BIN, &args, &env);
    let pooled = pooled_hashes(&client, &sluice.http_url()).await;
    let lost: Vec<&String> = acked.iter().filter(|h| !pooled.contains(*h)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged are lost after kill -9, e.g. {:?}",
        lost.len(),
        acked.len(),
        lost.first()
    );
}
