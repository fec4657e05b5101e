//! The QUIC ingress end to end: real anvil, the real sluice binary with its mempool, the crate's
//! client and the `sluice send` / `sluice keygen` commands.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use alloy_primitives::Address;
use common::{fund, fund_all, txpool_hashes, wait_receipt, BIN, DEV_KEY};
use serde_json::json;
use sluice_bench::txgen::{Fees, Wallet};
use sluice_ingress::{Client, ClientError, ClientOptions, Identity, KeyPair};
use sluice_testkit::{rpc_result, Anvil, Sluice};

const CHAIN: u64 = 31337;

fn to() -> Address {
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// sluice in front of `anvil` with the ingress on; answers it and the ingress address and
/// server identity it printed.
fn serve_with_ingress(
    anvil: &Anvil,
    dir: &std::path::Path,
    extra_env: &[(&str, &str)],
) -> (Sluice, SocketAddr, Identity) {
    let port = free_udp_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let key = dir.join("server.key");
    let mut env = vec![("SLUICE_INGRESS__LISTEN", listen.as_str()), ("SLUICE_INGRESS__KEY", key.to_str().unwrap())];
    env.extend_from_slice(extra_env);
    let sluice = Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env);
    let line = sluice
        .preamble
        .iter()
        .find(|l| l.starts_with("sluice ingress on quic://"))
        .unwrap_or_else(|| panic!("no ingress line in {:?}", sluice.preamble));
    let addr = line["sluice ingress on quic://".len()..].split_whitespace().next().unwrap().parse().unwrap();
    let identity = line.rsplit(' ').next().unwrap().trim_end_matches(')').parse().unwrap();
    (sluice, addr, identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_sent_over_quic_are_pooled_and_mined() {
    let dir = tempfile::tempdir().unwrap();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let (sluice, addr, server) = serve_with_ingress(&anvil, dir.path(), &[]);
    let http = reqwest::Client::new();
    let url = sluice.http_url();

    let wallet = Wallet::from_hex(DEV_KEY, CHAIN).unwrap();
    let txs: Vec<_> = (0..20).map(|n| wallet.transfer(n, to(), 1, Fees::default())).collect();
    let key = KeyPair::generate();
    let options = ClientOptions { server_identity: Some(server), socket: None };
    let client = Client::connect(addr, &key, options).await.expect("connect to the ingress");
    // Half fire-and-forget on unidirectional streams, half answered on bidirectional ones.
    for tx in &txs[..10] {
        client.send_acknowledged(&tx.raw).await.expect("delivered");
    }
    for tx in &txs[10..] {
        let hash = client.submit(&tx.raw).await.expect("accepted");
        assert_eq!(hash, format!("{:#x}", tx.hash));
    }
    // The pool's refusals come back on bidirectional streams, in its own words.
    match client.submit(&txs[0].raw[..20]).await {
        Err(ClientError::Rejected { code, message }) => assert_eq!(code, -32000, "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // Every one is in txpool_content, pending, under the sender.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let content = rpc_result(&http, &url, "txpool_content", json!([])).await;
        let sender = format!("{:#x}", wallet.address());
        let pending = content["pending"]
            .as_object()
            .and_then(|m| m.iter().find(|(k, _)| k.to_lowercase() == sender))
            .map(|(_, v)| v.as_object().map(|n| n.len()).unwrap_or(0))
            .unwrap_or(0);
        if pending == 20 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{pending} of 20 pending: {content}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // /status counts them under the unknown class (this client's key has no weight).
    let status: serde_json::Value = http.get(format!("{url}/status")).send().await.unwrap().json().await.unwrap();
    assert_eq!(status["ingress"]["classes"]["unknown"]["accepted"], 20, "{status}");
    assert_eq!(status["ingress"]["classes"]["unknown"]["rejected"], 1, "{status}");

    // anvil mines them once they are relayed.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    rpc_result(&http, &anvil.http_url(), "evm_mine", json!([])).await;
    for tx in [&txs[0], &txs[19]] {
        let receipt = wait_receipt(&http, &url, &format!("{:#x}", tx.hash)).await;
        assert_eq!(receipt["status"], "0x1");
    }
    client.close().await;
}

// Under load into the real mempool: 4 clients, 64 streams in flight each, 5,000 signed
// transfers from 250 senders. Every transaction answered with its hash is in txpool_content;
// any refusal names its reason (none is expected at this load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_transactions_over_quic_from_four_clients_all_reach_the_pool() {
    use futures_util::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let (sluice, addr, server) = serve_with_ingress(&anvil, dir.path(), &[]);
    let http = reqwest::Client::new();
    let wallets: Vec<Wallet> = (0..250).map(|i| Wallet::numbered(40_000 + i, CHAIN)).collect();
    fund_all(&http, &anvil, wallets.iter().map(|w| w.address())).await;
    let signed = tokio::task::spawn_blocking(move || {
        let mut lanes: Vec<Vec<_>> = (0..4).map(|_| Vec::new()).collect();
        for (i, w) in wallets.iter().enumerate() {
            lanes[i % 4].extend((0..20).map(|n| w.transfer(n, to(), 1, Fees::default())));
        }
        lanes
    })
    .await
    .unwrap();
    let mut clients = Vec::new();
    for lane in signed {
        let options = ClientOptions { server_identity: Some(server), socket: None };
        let client = Client::connect(addr, &KeyPair::generate(), options).await.expect("connect to the ingress");
        clients.push(tokio::spawn(async move {
            // Each sender's nonces in order: a sender's transactions stay on one stream at a time.
            let answers: Vec<_> = futures_util::stream::iter(lane.chunks(20).map(|c| c.to_vec()).collect::<Vec<_>>())
                .map(|txs| {
                    let client = &client;
                    async move {
                        let mut answers = Vec::new();
                        for tx in txs {
                            answers.push((format!("{:#x}", tx.hash), client.submit(&tx.raw).await));
                        }
                        answers
                    }
                })
                .buffer_unordered(64)
                .collect()
                .await;
            client.close().await;
            answers.into_iter().flatten().collect::<Vec<_>>()
        }));
    }
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for client in clients {
        for (hash, answer) in client.await.unwrap() {
            match answer {
                Ok(got) => {
                    assert_eq!(got, hash);
                    accepted.push(hash);
                }
                Err(e) => refused.push(format!("{hash}: {e}")),
            }
        }
    }
    assert!(refused.is_empty(), "{} refused, e.g. {:?}", refused.len(), refused.first());
    assert_eq!(accepted.len(), 5_000);
    let pooled = txpool_hashes(&http, &sluice.http_url(), &["pending"]).await;
    let missing = accepted.iter().filter(|h| !pooled.contains(*h)).count();
    assert_eq!(missing, 0, "{missing} of 5,000 answered with a hash are not pending in the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_keygen_and_sluice_send_work_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let anvil = Anvil::spawn();
    let (_sluice, addr, server) = serve_with_ingress(&anvil, dir.path(), &[]);

    let key = dir.path().join("client.key");
    let out = Command::new(BIN).args(["keygen", "--out", key.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let identity: Identity = String::from_utf8(out.stdout).unwrap().trim().parse().expect("keygen prints the identity");
    assert_eq!(KeyPair::load(&key).unwrap().identity(), identity);
    let shown = Command::new(BIN).args(["keygen", "--show", key.to_str().unwrap()]).output().unwrap();
    assert_eq!(String::from_utf8(shown.stdout).unwrap().trim(), identity.to_string());
    // Never overwrites a key.
    assert!(!Command::new(BIN).args(["keygen", "--out", key.to_str().unwrap()]).output().unwrap().status.success());

    let wallet = Wallet::numbered(7, CHAIN);
    let http = reqwest::Client::new();
    fund(&http, &anvil, wallet.address(), "0x56BC75E2D63100000").await;
    let txs: Vec<_> = (0..3).map(|n| wallet.transfer(n, to(), 1, Fees::default())).collect();
    let input: String = txs.iter().map(|t| t.hex() + "\n").collect();

    let mut child = Command::new(BIN)
        .args(["send", "--quic", &addr.to_string(), "--key", key.to_str().unwrap()])
        .args(["--server-identity", &server.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect();
    let want: Vec<String> = txs.iter().map(|t| format!("{:#x}", t.hash)).collect();
    assert_eq!(printed, want);
    for hash in &want {
        wait_receipt(&http, &anvil.http_url(), hash).await;
    }

    // A wrong server identity is refused at the handshake.
    let wrong = Command::new(BIN)
        .args(["send", "--quic", &addr.to_string(), "--server-identity", &identity.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    // A bad line is reported, and the command fails.
    let mut child = Command::new(BIN)
        .args(["send", "--quic", &addr.to_string(), "--no-wait", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"0xzz\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("not hex"));
}
