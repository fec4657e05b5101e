//! The peer mesh end to end: three sluice processes in front of one anvil, each with its own
//! mempool; transactions sent to one over HTTP reach the others' pools over libp2p.

mod common;

use std::time::{Duration, Instant};

use alloy_primitives::Address;
use common::{fund, fund_all, BIN};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{rpc, rpc_result, Anvil, Sluice};

const CHAIN: u64 = 31337;

fn to() -> Address {
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Node {
    sluice: Sluice,
    /// Its mesh address, `/ip4/…/quic-v1/p2p/PEER`.
    address: String,
}

/// Starts sluice with the mesh on `port`, its key in `dir`, dialing `peers`.
fn node(anvil: &Anvil, dir: &std::path::Path, name: &str, port: u16, peers: &[&str]) -> Node {
    let listen = format!("[\"/ip4/127.0.0.1/udp/{port}/quic-v1\"]");
    let peers = format!("[{}]", peers.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(","));
    let key = dir.join(format!("{name}.key"));
    let journal = dir.join(format!("{name}.journal"));
    let env = [
        ("SLUICE_MESH__LISTEN", listen.as_str()),
        ("SLUICE_MESH__PEERS", peers.as_str()),
        ("SLUICE_MESH__KEY", key.to_str().unwrap()),
        ("SLUICE_MEMPOOL__JOURNAL", journal.to_str().unwrap()),
    ];
    let sluice = Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env);
    let line = sluice
        .preamble
        .iter()
        .find(|l| l.starts_with("sluice mesh peer "))
        .unwrap_or_else(|| panic!("no mesh line in {:?}", sluice.preamble));
    let address = line.split(" on ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    Node { sluice, address }
}

async fn pooled(http: &reqwest::Client, node: &Node, hash: &str) -> bool {
    let tx = rpc_result(http, &node.sluice.http_url(), "eth_getTransactionByHash", json!([hash])).await;
    !tx.is_null()
}

async fn wait_pooled(http: &reqwest::Client, node: &Node, hash: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !pooled(http, node, hash).await {
        assert!(Instant::now() < deadline, "{hash} did not reach {} within {within:?}", node.address);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn mesh_status(http: &reqwest::Client, node: &Node) -> Value {
    let status: Value =
        http.get(format!("{}/status", node.sluice.http_url())).send().await.unwrap().json().await.unwrap();
    status["mesh"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_sent_to_one_node_reaches_every_pool_and_a_restarted_node_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let (pa, pb, pc) = (free_udp_port(), free_udp_port(), free_udp_port());
    let a = node(&anvil, dir.path(), "a", pa, &[]);
    let b = node(&anvil, dir.path(), "b", pb, &[&a.address]);
    let mut c = node(&anvil, dir.path(), "c", pc, &[&a.address, &b.address]);
    let http = reqwest::Client::new();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let wallet = Wallet::numbered(11, CHAIN);
    fund(&http, &anvil, wallet.address(), "0x56BC75E2D63100000").await;
    let first = wallet.transfer(0, to(), 1, Fees::default());
    let hash = format!("{:#x}", first.hash);
    let sent = rpc(&http, &a.sluice.http_url(), "eth_sendRawTransaction", json!([first.hex()])).await;
    assert_eq!(sent["result"], hash, "{sent}");
    wait_pooled(&http, &b, &hash, Duration::from_secs(10)).await;
    wait_pooled(&http, &c, &hash, Duration::from_secs(10)).await;
    // The pending nonce agrees everywhere.
    for n in [&a, &b, &c] {
        let nonce = rpc_result(
            &http,
            &n.sluice.http_url(),
            "eth_getTransactionCount",
            json!([format!("{:#x}", wallet.address()), "pending"]),
        )
        .await;
        assert_eq!(nonce, "0x1");
    }

    // An invalid transaction (nonce reused with a different payload) is refused by A and goes
    // nowhere: B and C receive nothing more.
    // /status's mesh part is at most 500 ms old: let the forwarding settle and show first.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let received_before = mesh_status(&http, &b).await["inbound"]["received"].as_u64().unwrap();
    let invalid = wallet.transfer(0, to(), 2, Fees::default());
    let refused = rpc(&http, &a.sluice.http_url(), "eth_sendRawTransaction", json!([invalid.hex()])).await;
    assert!(refused.get("error").is_some(), "{refused}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(mesh_status(&http, &b).await["inbound"]["received"].as_u64().unwrap(), received_before);

    // C dies; A takes two more; C comes back with its key and address and gets them (A
    // re-dials it within the 5 s deadline).
    c.sluice.kill();
    let more: Vec<_> = (1..3).map(|n| wallet.transfer(n, to(), 1, Fees::default())).collect();
    for tx in &more {
        rpc(&http, &a.sluice.http_url(), "eth_sendRawTransaction", json!([tx.hex()])).await;
    }
    c = node(&anvil, dir.path(), "c", pc, &[&a.address, &b.address]);
    for tx in &more {
        wait_pooled(&http, &c, &format!("{:#x}", tx.hash), Duration::from_secs(15)).await;
    }
    let status = mesh_status(&http, &a).await;
    let failed: u64 = status["peers"].as_array().unwrap().iter().map(|p| p["counts"]["failed"].as_u64().unwrap()).sum();
    assert_eq!(failed, 0, "A's mesh status: {status}");
}

async fn pool_count(http: &reqwest::Client, node: &Node) -> u64 {
    let status = rpc_result(http, &node.sluice.http_url(), "txpool_status", json!([])).await;
    let count =
        |v: &Value| v.as_str().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()).unwrap_or(0);
    count(&status["pending"]) + count(&status["queued"])
}

async fn wait_count(http: &reqwest::Client, node: &Node, name: &str, want: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let have = pool_count(http, node).await;
        if have == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} holds {have} of {want} after {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// A line A–B–C (C's only peer is B). C is killed; what A takes meanwhile (the next nonces of
// every sender) must reach C once it is back with its key and journal, in two rounds: a
// missing nonce would leave the sender's later transactions queued in C forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_at_the_end_of_a_line_gets_everything_it_missed() {
    const SENDERS: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let (pa, pb, pc) = (free_udp_port(), free_udp_port(), free_udp_port());
    let a = node(&anvil, dir.path(), "a", pa, &[]);
    let b = node(&anvil, dir.path(), "b", pb, &[&a.address]);
    let mut c = node(&anvil, dir.path(), "c", pc, &[&b.address]);
    let http = reqwest::Client::new();
    let wallets: Vec<Wallet> = (0..SENDERS).map(|i| Wallet::numbered(300 + i, CHAIN)).collect();
    fund_all(&http, &anvil, wallets.iter().map(|w| w.address())).await;
    let send = |from: u64, to_nonce: u64| {
        let (http, url, wallets) = (http.clone(), a.sluice.http_url(), wallets.clone());
        async move {
            for nonce in from..to_nonce {
                for w in &wallets {
                    let tx = w.transfer(nonce, to(), 1, Fees::default());
                    let sent = rpc(&http, &url, "eth_sendRawTransaction", json!([tx.hex()])).await;
                    assert!(sent["result"].is_string(), "{sent}");
                }
            }
        }
    };
    send(0, 15).await;
    for (name, n) in [("A", &a), ("B", &b), ("C", &c)] {
        wait_count(&http, n, name, 15 * SENDERS, Duration::from_secs(30)).await;
    }
    for round in 0..2u64 {
        c.sluice.kill();
        let (from, to_nonce) = (15 + 5 * round, 20 + 5 * round);
        send(from, to_nonce).await;
        wait_count(&http, &b, "B", to_nonce * SENDERS, Duration::from_secs(30)).await;
        c = node(&anvil, dir.path(), "c", pc, &[&b.address]);
        wait_count(&http, &c, "C after its restart", to_nonce * SENDERS, Duration::from_secs(30)).await;
        let pending = rpc_result(&http, &c.sluice.http_url(), "txpool_status", json!([])).await;
        assert_eq!(pending["queued"], "0x0", "round {round}: nothing stuck behind a gap in C: {pending}");
    }
}
