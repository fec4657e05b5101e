//! A batch is as its calls sent one by one: the same 100 mixed calls (every class of the method
//! table: chain and state reads, node information, sluice's own answers, submissions, a denied
//! method, an unknown one) give the same answers, and the node sees the same calls, whether
//! they come as one batch or singly. Each way runs on its own real anvil (one genesis, no
//! mining: the same state) behind a counting relay (a named fake) and its own fresh sluice.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use alloy_primitives::Address;
use common::{with_config, DEV_KEY};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{post, Anvil, FakeUpstream, Fault};

/// Methods sluice also calls on its own (following the head, probing ranges, reading the
/// senders' state for the mempool): their counts depend on timing, not on the client's calls.
const SLUICE_OWN: [&str; 5] =
    ["eth_blockNumber", "eth_getBlockByNumber", "eth_chainId", "eth_getBalance", "eth_getTransactionCount"];

fn address(i: usize) -> String {
    format!("0x{:040x}", 0x1000 + i)
}

/// 100 distinct calls, by class.
fn calls() -> Vec<Value> {
    let w = Wallet::from_hex(DEV_KEY, 31337).unwrap();
    let to: Address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap();
    let mut calls = Vec::new();
    let mut push = |method: &str, params: Value| calls.push((method.to_owned(), params));
    for i in 0..10 {
        // State reads.
        push("eth_getBalance", json!([address(i), "latest"]));
        push("eth_getTransactionCount", json!([address(i), "0x0"]));
        push("eth_getCode", json!([address(i), "latest"]));
        push("eth_getStorageAt", json!([address(i), "0x0", "latest"]));
        push("eth_call", json!([{"to": address(i), "data": "0x"}, "latest"]));
        push("eth_estimateGas", json!([{"from": address(i), "to": address(i + 1)}]));
        // Chain reads.
        push("eth_getLogs", json!([{"fromBlock": "0x0", "toBlock": "0x0", "address": address(i)}]));
        push("eth_getTransactionByHash", json!([format!("0x{:064x}", i + 1)]));
    }
    for (method, params) in [
        ("eth_getBlockTransactionCountByNumber", json!(["0x0"])),
        ("eth_feeHistory", json!(["0x1", "latest", []])),
        ("eth_gasPrice", json!([])),
        ("eth_maxPriorityFeePerGas", json!([])),
        ("eth_createAccessList", json!([{"to": address(1), "data": "0x"}, "latest"])),
        ("eth_getProof", json!([address(2), [], "latest"])),
        // The node.
        ("net_version", json!([])),
        ("web3_clientVersion", json!([])),
        ("eth_syncing", json!([])),
        // sluice's own answers.
        ("sluice_getTransactionStatus", json!([format!("0x{:064x}", 99)])),
        // Denied by the default policy, and unknown.
        ("eth_sign", json!([address(1), "0x00"])),
        ("eth_noSuchMethod", json!([])),
    ] {
        push(method, params);
    }
    // Submissions: three transfers of one sender.
    for nonce in 0..3 {
        push("eth_sendRawTransaction", json!([w.transfer(nonce, to, 1, Fees::default()).hex()]));
    }
    // 10 × 8 + 12 + 3 so far: code at genesis for the rest.
    for i in 0..100 - (10 * 8 + 12 + 3) {
        push("eth_getCode", json!([address(100 + i), "0x0"]));
    }
    assert_eq!(calls.len(), 100);
    calls
        .into_iter()
        .enumerate()
        .map(|(id, (method, params))| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .collect()
}

/// One way of sending them: the answers by id, and the client methods the node saw.
async fn run(batch: bool) -> (BTreeMap<u64, Value>, BTreeMap<String, usize>) {
    let anvil = Anvil::spawn_with(&["--no-mining", "--timestamp", "1700000000"]);
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    let sluice = with_config(&format!("[[upstreams]]\nurl = \"{}\"\n", relay.url));
    let (client, url) = (reqwest::Client::new(), sluice.sluice.http_url());
    let calls = calls();
    let mut answers = BTreeMap::new();
    if batch {
        let (status, body) = post(&client, &url, Value::Array(calls).to_string()).await;
        assert_eq!(status, 200, "{body}");
        for answer in body.as_array().expect("an array") {
            answers.insert(answer["id"].as_u64().expect("an id"), answer.clone());
        }
    } else {
        for call in calls {
            let (_, answer) = post(&client, &url, call.to_string()).await;
            answers.insert(answer["id"].as_u64().expect("an id"), answer);
        }
    }
    let mut seen = BTreeMap::new();
    for method in relay.methods().into_iter().filter(|m| !SLUICE_OWN.contains(&m.as_str())) {
        *seen.entry(method).or_insert(0) += 1;
    }
    // What the mempool relays goes out once per transaction, whichever way it came.
    seen.remove("eth_sendRawTransaction");
    (answers, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_100_mixed_calls_is_answered_and_sent_as_the_same_calls_one_by_one() {
    let (batch_answers, batch_calls) = run(true).await;
    let (single_answers, single_calls) = run(false).await;
    assert_eq!(batch_answers.len(), 100);
    for (id, answer) in &batch_answers {
        assert_eq!(Some(answer), single_answers.get(id), "call {id}");
    }
    eprintln!("batch_as_singles: the node saw {batch_calls:?}");
    assert_eq!(batch_calls, single_calls, "the calls the node saw");
    assert!(!batch_calls.contains_key("eth_sign"), "denied: never forwarded");
    assert_eq!(batch_calls.get("eth_noSuchMethod"), Some(&1), "unknown: forwarded once");
}
