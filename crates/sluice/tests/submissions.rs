//! The three ways of submitting a signed transaction are one class of the method table:
//! `eth_sendRawTransactionSync` (EIP-7966) is admitted by sluice's mempool (validated,
//! journaled, relayed) exactly as `eth_sendRawTransaction`, over HTTP and WebSocket, and then
//! answered with its receipt; without a mempool every submission is broadcast to every member.
//! Real anvil; counting relays (named fakes) only where calls per member are counted.

mod common;

use std::time::Duration;

use alloy_primitives::Address;
use common::ws::{connect, next_within, send};
use common::{eventually, BIN, DEV_KEY};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{rpc, rpc_result, Anvil, FakeUpstream, Fault, Sluice};

fn dev() -> Wallet {
    Wallet::from_hex(DEV_KEY, 31337).unwrap()
}

fn to() -> Address {
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_submission_is_pooled_like_any_and_answered_with_its_receipt() {
    // A chain that mines only when told: what sluice's pool holds is visible.
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &[]);
    let client = reqwest::Client::new();
    let (url, node) = (sluice.http_url(), anvil.http_url());
    let w = dev();
    let (t0, t1, t2) = (
        w.transfer(0, to(), 1, Fees::default()),
        w.transfer(1, to(), 1, Fees::default()),
        w.transfer(2, to(), 1, Fees::default()),
    );
    // Nothing mines it within its timeout: EIP-7966's error 4, naming the hash…
    let timed_out = rpc(&client, &url, "eth_sendRawTransactionSync", json!([t0.hex(), 300])).await;
    assert_eq!(timed_out["error"]["code"], 4, "{timed_out}");
    assert_eq!(timed_out["error"]["data"], json!(format!("{}", t0.hash)), "{timed_out}");
    // …and it is in sluice's pool (so in its journal), relayed to the node.
    let status = rpc_result(&client, &url, "txpool_status", json!([])).await;
    assert_eq!(status, json!({"pending": "0x1", "queued": "0x0"}), "the sync submission was pooled");
    eventually(Duration::from_secs(5), "the node holds nonce 0", || async {
        rpc_result(&client, &node, "txpool_status", json!([])).await["pending"] == "0x1"
    })
    .await;
    // The same sender's next transaction, sent the usual way, follows it: pending, not queued
    // behind a gap only sluice would see.
    let plain = rpc(&client, &url, "eth_sendRawTransaction", json!([t1.hex()])).await;
    assert_eq!(plain["result"], json!(format!("{}", t1.hash)), "{plain}");
    let status = rpc_result(&client, &url, "txpool_status", json!([])).await;
    assert_eq!(status, json!({"pending": "0x2", "queued": "0x0"}));

    // Over a WebSocket, with the hex timeout viem sends: the receipt once it is mined.
    let mut ws = connect(&sluice.ws_url()).await;
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 7, "method": "eth_sendRawTransactionSync", "params": [t2.hex(), "0x4e20"]}),
    )
    .await;
    eventually(Duration::from_secs(5), "the node holds nonces 0 to 2", || async {
        rpc_result(&client, &node, "txpool_status", json!([])).await["pending"] == "0x3"
    })
    .await;
    rpc_result(&client, &node, "evm_mine", json!([])).await;
    let answer = next_within(&mut ws, Duration::from_secs(15)).await;
    assert_eq!(answer["id"], 7, "{answer}");
    let receipt = &answer["result"];
    assert_eq!(receipt["transactionHash"], json!(format!("{}", t2.hash)), "{answer}");
    assert_eq!(receipt["status"], "0x1", "{answer}");
    let at_node = rpc_result(&client, &node, "eth_getTransactionReceipt", json!([format!("{}", t2.hash)])).await;
    assert_eq!(receipt, &at_node, "the node's own receipt");
    assert_eq!(rpc_result(&client, &url, "txpool_status", json!([])).await, json!({"pending": "0x0", "queued": "0x0"}));

    // A bad timeout is the caller's error, and nothing was submitted.
    let t3 = w.transfer(3, to(), 1, Fees::default());
    let bad = rpc(&client, &url, "eth_sendRawTransactionSync", json!([t3.hex(), "soon"])).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert_eq!(rpc_result(&client, &url, "txpool_status", json!([])).await["pending"], "0x0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_mempool_every_submission_reaches_every_member() {
    let anvil = Anvil::spawn();
    let relay = || Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None };
    let (a, b) = (FakeUpstream::spawn(relay()).await, FakeUpstream::spawn(relay()).await);
    let file = tempfile::NamedTempFile::new().unwrap();
    let toml =
        format!("[mempool]\nenabled = false\n[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n", a.url, b.url);
    std::fs::write(file.path(), toml).unwrap();
    let sluice = Sluice::spawn(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", file.path().to_str().unwrap()]);
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let w = dev();
    // Sync: each member gets it; the answer is a receipt (a member's "already known" is not).
    let t0 = w.transfer(0, to(), 1, Fees::default());
    // (anvil takes no timeout parameter.)
    let answer: Value = rpc(&client, &url, "eth_sendRawTransactionSync", json!([t0.hex()])).await;
    assert_eq!(answer["result"]["transactionHash"], json!(format!("{}", t0.hash)), "{answer}");
    assert_eq!((a.requests_for("eth_sendRawTransactionSync"), b.requests_for("eth_sendRawTransactionSync")), (1, 1));
    // Conditional: broadcast too, conditions untouched (anvil does not know the method; the
    // node's own answer comes back).
    let t1 = w.transfer(1, to(), 1, Fees::default());
    let method = "eth_sendRawTransactionConditional";
    let answer = rpc(&client, &url, method, json!([t1.hex(), {"blockNumberMax": "0xffff"}])).await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    assert_eq!((a.requests_for(method), b.requests_for(method)), (1, 1));
}
