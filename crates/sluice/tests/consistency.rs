//! Read-your-writes across methods: once a client has read a receipt for block N through
//! sluice, `latest` is at least N for every call that follows — `eth_blockNumber`,
//! `eth_getLogs` up to `latest`, the pending nonce. The dapp flow (send, wait for the receipt,
//! read what changed) against real anvils, on an idle machine and beside busy processes, with
//! one member and with two where one is a moment behind.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use alloy_primitives::{Bytes, TxKind, U256};
use common::{BIN, CONTRACT_INIT, DEV_KEY};
use serde_json::json;
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{quantity, rpc, rpc_result, workspace_root, Anvil, Sluice};

/// The one log the test contract's constructor emits has this topic.
const TOPIC: &str = "0xaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Processes that keep the machine's cores busy while they live (the "busy machine" of the
/// scenario): each a shell spinning in a loop, killed on drop.
struct BusyLoops(Vec<Child>);

impl BusyLoops {
    fn start(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("a busy loop starts")
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The test contract's creation, signed with anvil's first key.
fn deploy_tx(wallet: &Wallet, nonce: u64) -> String {
    let init: Bytes = alloy_primitives::hex::decode(CONTRACT_INIT.replace(' ', "")).expect("hex").into();
    wallet
        .sign(alloy_consensus::TxEip1559 {
            chain_id: wallet.chain_id,
            nonce,
            gas_limit: 200_000,
            max_fee_per_gas: 20_000_000_000,
            max_priority_fee_per_gas: 1_000_000_000,
            to: TxKind::Create,
            value: U256::ZERO,
            input: init,
            ..Default::default()
        })
        .hex()
}

/// What one deploy saw right after its receipt.
#[derive(Debug, Default)]
struct Seen {
    /// `eth_blockNumber` answered below the receipt's block.
    number_behind: usize,
    /// `eth_getLogs(fromBlock: receipt's block, toBlock: "latest")` did not hold the log.
    log_missed: usize,
}

/// Sends the deploy through sluice, polls its receipt through sluice until it answers, then
/// at once asks sluice for the head and the logs from the receipt's block to `latest`.
/// `mine` runs after the send (a test that mines by hand mines there).
async fn deploy_and_read<F, Fut>(client: &reqwest::Client, url: &str, raw: &str, mine: F) -> Seen
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let sent = rpc(client, url, "eth_sendRawTransaction", json!([raw])).await;
    let hash = sent["result"].as_str().unwrap_or_else(|| panic!("sent: {sent}")).to_owned();
    mine().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let receipt = loop {
        let receipt = rpc_result(client, url, "eth_getTransactionReceipt", json!([hash])).await;
        if !receipt.is_null() {
            break receipt;
        }
        assert!(Instant::now() < deadline, "no receipt for {hash} within 20 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    assert_eq!(receipt["status"], "0x1", "deployed: {receipt}");
    let block = quantity(&receipt["blockNumber"]);
    let contract = receipt["contractAddress"].as_str().expect("a contract address").to_owned();
    // Both at once, as a dapp's next reads are.
    let (number, logs) = tokio::join!(
        rpc_result(client, url, "eth_blockNumber", json!([])),
        rpc(client, url, "eth_getLogs", json!([{"fromBlock": format!("{block:#x}"), "toBlock": "latest"}])),
    );
    // An error (a range "beyond the head") misses the log as surely as an empty list.
    let found = logs["result"].as_array().is_some_and(|logs| {
        logs.iter().any(|log| log["address"].as_str() == Some(contract.as_str()) && log["topics"][0] == TOPIC)
    });
    Seen { number_behind: usize::from(quantity(&number) < block), log_missed: usize::from(!found) }
}

/// 60 deploys through sluice in front of one anvil that mines each transaction at once.
async fn sixty_deploys_one_member() -> Seen {
    let anvil = Anvil::spawn();
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &[]);
    let client = reqwest::Client::new();
    let wallet = Wallet::from_hex(DEV_KEY, 31337).unwrap();
    let mut seen = Seen::default();
    for nonce in 0..60 {
        let one = deploy_and_read(&client, &sluice.http_url(), &deploy_tx(&wallet, nonce), || async {}).await;
        seen.number_behind += one.number_behind;
        seen.log_missed += one.log_missed;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_receipt_latest_holds_its_block_on_an_idle_machine() {
    let seen = sixty_deploys_one_member().await;
    assert_eq!((seen.number_behind, seen.log_missed), (0, 0), "of 60 deploys: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_receipt_latest_holds_its_block_on_a_busy_machine() {
    let _busy = BusyLoops::start(2);
    let seen = sixty_deploys_one_member().await;
    assert_eq!((seen.number_behind, seen.log_missed), (0, 0), "of 60 deploys: {seen:?}");
}

/// Genesis time of both twins: the same chain on both (same genesis, same transactions, blocks
/// mined with the same timestamps give the same hashes).
const GENESIS: u64 = 1_700_000_000;

/// Two members of one chain, neither mining by itself; the one sluice follows first (its
/// WebSocket announces the heads) is mined a moment after the other. The receipt comes from the
/// one ahead; `latest` must not then come from the view of the one behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_receipt_from_the_member_ahead_latest_is_not_the_laggards() {
    let client = reqwest::Client::new();
    let genesis = GENESIS.to_string();
    let args = ["--timestamp", genesis.as_str(), "--no-mining"];
    let (behind, ahead) = (Anvil::spawn_with(&args), Anvil::spawn_with(&args));
    let mut config = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        config,
        "listen = \"127.0.0.1:0\"\n[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"",
        behind.http_url(),
        ahead.http_url()
    )
    .unwrap();
    let sluice = Sluice::spawn(BIN, &["serve", "--config", config.path().to_str().unwrap()]);
    let url = sluice.http_url();
    let wallet = Wallet::from_hex(DEV_KEY, 31337).unwrap();
    let mut seen = Seen::default();
    for nonce in 0..60u64 {
        let raw = deploy_tx(&wallet, nonce);
        let timestamp = GENESIS + (nonce + 1) * 12;
        let mine = || async {
            // Both members hold the transaction (sluice sends it to every member), then the
            // one ahead mines it; the one behind mines the same block 300 ms later.
            for node in [&ahead, &behind] {
                let deadline = Instant::now() + Duration::from_secs(10);
                while rpc_result(&client, &node.http_url(), "txpool_status", json!([]))
                    .await
                    .get("pending")
                    .map(quantity)
                    != Some(1)
                {
                    assert!(Instant::now() < deadline, "the transaction did not reach every member");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            rpc_result(&client, &ahead.http_url(), "evm_mine", json!([timestamp])).await;
        };
        let lagging = {
            let (client, url) = (client.clone(), behind.http_url());
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                rpc_result(&client, &url, "evm_mine", json!([timestamp])).await;
            }
        };
        let (one, ()) = tokio::join!(deploy_and_read(&client, &url, &raw, mine), async {
            // Mined on the laggard once the other has it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while quantity(&rpc_result(&client, &ahead.http_url(), "eth_blockNumber", json!([])).await) <= nonce {
                assert!(Instant::now() < deadline, "the member ahead did not mine");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            lagging.await;
        });
        seen.number_behind += one.number_behind;
        seen.log_missed += one.log_missed;
        let (a, b) = (
            rpc_result(&client, &ahead.http_url(), "eth_getBlockByNumber", json!(["latest", false])).await,
            rpc_result(&client, &behind.http_url(), "eth_getBlockByNumber", json!(["latest", false])).await,
        );
        assert_eq!(a["hash"], b["hash"], "the twins stay one chain");
    }
    assert_eq!((seen.number_behind, seen.log_missed), (0, 0), "of 60 deploys: {seen:?}");
}

/// 200 sends in a row, each with the nonce sluice's `eth_getTransactionCount(…, "pending")`
/// gives, anvil mining each at once, beside busy processes: every send is accepted and the
/// count never falls below a nonce already sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_nonce_never_falls_below_one_already_sent() {
    let _busy = BusyLoops::start(2);
    let anvil = Anvil::spawn();
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &[]);
    let (client, url) = (reqwest::Client::new(), sluice.http_url());
    let wallet = Wallet::from_hex(DEV_KEY, 31337).unwrap();
    let to = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap();
    let mut next_at_least = 0u64;
    for i in 0..200 {
        let count =
            quantity(&rpc_result(&client, &url, "eth_getTransactionCount", json!([wallet.address(), "pending"])).await);
        assert!(count >= next_at_least, "send {i}: the pending count went from at least {next_at_least} to {count}");
        let tx = wallet.transfer(count, to, 1, Fees::default());
        let sent = rpc(&client, &url, "eth_sendRawTransaction", json!([tx.hex()])).await;
        assert!(sent.get("error").is_none(), "send {i} with nonce {count}: {sent}");
        next_at_least = count + 1;
    }
    // Every one of them was mined.
    let deadline = Instant::now() + Duration::from_secs(20);
    while quantity(
        &rpc_result(&client, &anvil.http_url(), "eth_getTransactionCount", json!([wallet.address(), "latest"])).await,
    ) < 200
    {
        assert!(Instant::now() < deadline, "not every transaction was mined");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// viem's own flow, as a user writes it (three `sendTransaction`s in a row,
/// `waitForTransactionReceipt`, `getLogs` to `latest`), 20 times, beside busy processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viems_send_wait_and_read_flow_finds_every_log() {
    let _busy = BusyLoops::start(2);
    let anvil = Anvil::spawn();
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &[]);
    let root = workspace_root();
    let script = root.join("crates/sluice/tests/js/viem_flow.cjs");
    let out = Command::new("node")
        .arg(&script)
        .args([sluice.http_url().as_str(), DEV_KEY, &format!("0x{}", CONTRACT_INIT.replace(' ', "")), "20"])
        .env("NODE_PATH", root.join(".tools/node_modules"))
        .output()
        .expect("node runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "viem's flow failed:\n{stdout}\n{stderr}");
    // The script prints one line per round with the logs it found of the three it sent.
    let rounds: Vec<&str> = stdout.lines().filter(|l| l.starts_with("round ")).collect();
    assert_eq!(rounds.len(), 20, "{stdout}");
    assert!(rounds.iter().all(|l| l.ends_with("found 3 of 3")), "{stdout}");
}

/// `eth_fillTransaction` (viem fills every transaction with it) picks the pending nonce: the
/// node's does not count what sluice's mempool accepted and has not relayed yet, so without
/// the pool's nonce a dapp's next transaction reuses a nonce. Relay off here, so that the
/// node never hears of the pooled one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eth_fill_transaction_counts_what_the_mempool_holds() {
    let anvil = Anvil::spawn();
    let sluice = Sluice::spawn_env(
        BIN,
        &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()],
        &[("SLUICE_MEMPOOL__RELAY", "false")],
    );
    let (client, url) = (reqwest::Client::new(), sluice.http_url());
    let wallet = Wallet::from_hex(DEV_KEY, 31337).unwrap();
    let to = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";
    let sent = rpc(
        &client,
        &url,
        "eth_sendRawTransaction",
        json!([wallet.transfer(0, to.parse().unwrap(), 1, Fees::default()).hex()]),
    )
    .await;
    assert!(sent.get("error").is_none(), "{sent}");
    let request = json!([{"from": wallet.address(), "to": to, "value": "0x1"}]);
    let filled = rpc_result(&client, &url, "eth_fillTransaction", request.clone()).await;
    assert_eq!(filled["tx"]["nonce"], "0x1", "through sluice: the pool's pending nonce: {filled}");
    let direct = rpc_result(&client, &anvil.http_url(), "eth_fillTransaction", request).await;
    assert_eq!(direct["tx"]["nonce"], "0x0", "the node alone does not know the pooled one: {direct}");
    // A nonce the caller set is the caller's.
    let own = json!([{"from": wallet.address(), "to": to, "value": "0x1", "nonce": "0x7"}]);
    assert_eq!(rpc_result(&client, &url, "eth_fillTransaction", own).await["tx"]["nonce"], "0x7");
}
