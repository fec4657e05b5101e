//! Filters live on the node that created them (`eth_newFilter`, `eth_newBlockFilter`,
//! `eth_newPendingTransactionFilter`): with several members, every later call on a filter
//! (`eth_getFilterChanges`, `eth_getFilterLogs`, `eth_uninstallFilter`) must reach that node,
//! whichever member the pool prefers at the time. Two real anvils of one chain (same genesis,
//! blocks mined on both with the same timestamps).

mod common;

use std::time::Duration;

use common::with_config;
use serde_json::{json, Value};
use sluice_testkit::{rpc, rpc_result, Anvil, FakeUpstream, Fault};

const GENESIS: &str = "1700000000";

/// Mines one identical (empty) block on every node.
async fn mine_everywhere(client: &reqwest::Client, nodes: &[&Anvil], timestamp: u64) {
    for node in nodes {
        rpc_result(client, &node.http_url(), "evm_mine", json!([timestamp])).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_on_a_filter_reaches_the_node_that_holds_it() {
    let args = ["--no-mining", "--timestamp", GENESIS];
    let (a, b) = (Anvil::spawn_with(&args), Anvil::spawn_with(&args));
    let client = reqwest::Client::new();
    let genesis = |n: &Anvil| {
        let url = n.http_url();
        let client = client.clone();
        async move { rpc_result(&client, &url, "eth_getBlockByNumber", json!(["0x0", false])).await["hash"].clone() }
    };
    assert_eq!(genesis(&a).await, genesis(&b).await, "one chain");
    // A relay in front of each (named fakes): the pool's preference moves with their delay.
    let relay = |n: &Anvil, ms| Fault::Relay { to: n.http_url(), delay: Duration::from_millis(ms), fail_method: None };
    let (ra, rb) = (FakeUpstream::spawn(relay(&a, 0)).await, FakeUpstream::spawn(relay(&b, 0)).await);
    let toml = format!("[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n", ra.url, rb.url);
    let sluice = with_config(&toml);
    let url = sluice.sluice.http_url();
    // Sixteen clients at once, each polling its own filter, as dapps watching events do: the
    // pool spreads their calls over both members.
    let mut timestamp: u64 = GENESIS.parse().unwrap();
    let mut failures = Vec::new();
    for round in 0..5 {
        let ids: Vec<Value> = futures_util::future::join_all((0..16).map(|i| {
            let (client, url) = (client.clone(), url.clone());
            let method = ["eth_newBlockFilter", "eth_newFilter"][i % 2];
            let params = if i % 2 == 0 { json!([]) } else { json!([{}]) };
            async move { rpc(&client, &url, method, params).await }
        }))
        .await;
        timestamp += 1;
        mine_everywhere(&client, &[&a, &b], timestamp).await;
        let polls = futures_util::future::join_all(ids.iter().map(|created| {
            let (client, url, id) = (client.clone(), url.clone(), created["result"].clone());
            async move {
                let mut answers = Vec::new();
                for method in ["eth_getFilterChanges", "eth_getFilterChanges", "eth_uninstallFilter"] {
                    answers.push((method, rpc(&client, &url, method, json!([id])).await));
                }
                answers
            }
        }))
        .await;
        for (created, answers) in ids.iter().zip(polls) {
            if created.get("error").is_some() {
                failures.push(format!("round {round}: created {created}"));
            }
            for (method, answer) in answers {
                let ok = match method {
                    "eth_uninstallFilter" => answer["result"] == true,
                    _ => answer["result"].is_array(),
                };
                if !ok {
                    failures.push(format!("round {round}: {method} {answer}"));
                }
            }
        }
    }
    eprintln!("filters: {} failures; calls A {}, B {}", failures.len(), ra.requests(), rb.requests());
    assert!(failures.is_empty(), "{} failures: {:#?}", failures.len(), &failures[..failures.len().min(5)]);
}
