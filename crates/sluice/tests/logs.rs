//! `eth_getLogs` over long ranges: split into chunks, merged in order, bisected when the node
//! refuses a chunk as too large. Real anvil; the refusing provider is a fault-injecting relay.

mod common;

use std::time::Duration;

use common::{wait_receipt, BIN, CONTRACT_INIT, DEV_ACCOUNT};
use serde_json::{json, Value};
use sluice_testkit::{metric, rpc_result, Anvil, FakeUpstream, Fault, Sluice};

/// anvil with 24 log-emitting deployments spread over 180 blocks.
async fn chain_with_logs(client: &reqwest::Client) -> Anvil {
    let anvil = Anvil::spawn();
    let url = anvil.http_url();
    let data = format!("0x{}", CONTRACT_INIT.replace(' ', ""));
    for i in 0..24 {
        let tx = rpc_result(client, &url, "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "data": data}])).await;
        wait_receipt(client, &url, tx.as_str().unwrap()).await;
        rpc_result(client, &url, "anvil_mine", json!([format!("{:#x}", 1 + i % 12)])).await;
    }
    anvil
}

async fn logs(client: &reqwest::Client, url: &str, filter: Value) -> Value {
    rpc_result(client, url, "eth_getLogs", json!([filter])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_ten_times_the_limit_returns_exactly_what_the_node_returns() {
    let client = reqwest::Client::new();
    let anvil = chain_with_logs(&client).await;
    let env = [("SLUICE_LOGS__MAX_BLOCK_RANGE", "16")];
    let sluice = Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env);
    let head = rpc_result(&client, &anvil.http_url(), "eth_blockNumber", json!([])).await;
    let head = u64::from_str_radix(head.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    assert!(head >= 160, "at least ten chunks: head {head}");
    // Wait for sluice's head tracker to know the head (tags resolve against it).
    tokio::time::sleep(Duration::from_millis(500)).await;
    for filter in [
        json!({"fromBlock": "0x0", "toBlock": "latest"}),
        json!({"fromBlock": "0x3", "toBlock": format!("{:#x}", head - 5)}),
        json!({"fromBlock": "earliest", "toBlock": "latest", "topics": [format!("0x{}", "aa".repeat(32))]}),
    ] {
        let direct = logs(&client, &anvil.http_url(), filter.clone()).await;
        let via = logs(&client, &sluice.http_url(), filter.clone()).await;
        let found = direct.as_array().unwrap().len();
        assert!(found > 10 && found <= 24, "{filter}: {found} logs");
        assert_eq!(via, direct, "{filter}");
    }
    let split = metric(&client, &sluice.http_url(), "sluice_logs_split_total").await;
    assert_eq!(split, Some(3.0), "each of the three calls was split into chunks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_the_provider_refuses_as_too_large_is_bisected() {
    let client = reqwest::Client::new();
    let anvil = chain_with_logs(&client).await;
    // The "provider" answers at most 5 blocks per call; sluice's limit is 40.
    let provider = FakeUpstream::spawn(Fault::LogsLimit { to: anvil.http_url(), max_range: 5 }).await;
    let env = [("SLUICE_LOGS__MAX_BLOCK_RANGE", "40"), ("SLUICE_CACHE__ENABLED", "false")];
    let sluice = Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &provider.url], &env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let filter = json!({"fromBlock": "0x0", "toBlock": "0x9f"});
    let direct = logs(&client, &anvil.http_url(), filter.clone()).await;
    let before = provider.requests_for("eth_getLogs");
    let via = logs(&client, &sluice.http_url(), filter).await;
    assert_eq!(via, direct);
    let calls = provider.requests_for("eth_getLogs") - before;
    // 4 chunks of 40 → halves of 20 → 10 → 5: 4 × (1 + 2 + 4 + 8) calls.
    assert_eq!(calls, 60, "each refused chunk was bisected down to what the provider answers");
}
