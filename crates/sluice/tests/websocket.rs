//! WebSocket: calls, and subscriptions relayed from anvil with per-client ids.

mod common;

use std::time::Duration;

use common::ws::{connect, next, send, subscribe};
use common::{Net, BIN, CONTRACT_INIT, DEV_ACCOUNT};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use sluice_testkit::{metric, rpc_result, Anvil, Sluice};
use tokio_tungstenite::tungstenite::Message;

async fn mine(net: &Net) {
    rpc_result(&net.client, &net.anvil.http_url(), "evm_mine", json!([])).await;
}

#[tokio::test]
async fn new_heads_arrive_through_sluice_with_the_clients_own_id() {
    let net = Net::start(&[]).await;
    let mut ws = connect(&net.sluice.ws_url()).await;
    let sub = subscribe(&mut ws, 1, json!(["newHeads"])).await;
    assert!(sub.starts_with("0x") && sub.len() == 34, "{sub}");
    for _ in 0..3 {
        mine(&net).await;
        let event = next(&mut ws).await;
        assert_eq!(event["method"], "eth_subscription");
        assert_eq!(event["params"]["subscription"], sub.as_str());
        let number = event["params"]["result"]["number"].clone();
        let block =
            rpc_result(&net.client, &net.anvil.http_url(), "eth_getBlockByNumber", json!([number, false])).await;
        assert_eq!(event["params"]["result"]["hash"], block["hash"]);
    }
}

#[tokio::test]
async fn logs_subscription_and_calls_share_one_socket() {
    let net = Net::start(&[]).await;
    let mut ws = connect(&net.sluice.ws_url()).await;
    let sub = subscribe(&mut ws, 7, json!(["logs", {}])).await;
    send(&mut ws, json!([{"jsonrpc": "2.0", "id": "a", "method": "eth_chainId"}, {"jsonrpc": "2.0", "id": "b", "method": "eth_blockNumber"}])).await;
    let batch = next(&mut ws).await;
    assert_eq!(batch[0]["result"], "0x7a69", "{batch}");
    assert_eq!(batch[1]["id"], "b");
    // Deploying the contract emits one log.
    let data = format!("0x{}", CONTRACT_INIT.replace(' ', ""));
    rpc_result(&net.client, &net.anvil.http_url(), "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "data": data}]))
        .await;
    let event = next(&mut ws).await;
    assert_eq!(event["params"]["subscription"], sub.as_str());
    assert_eq!(event["params"]["result"]["topics"][0], format!("0x{}", "aa".repeat(32)));
}

#[tokio::test]
async fn two_clients_get_their_own_ids_and_unsubscribe_stops_events() {
    let net = Net::start(&[]).await;
    let mut a = connect(&net.sluice.ws_url()).await;
    let mut b = connect(&net.sluice.ws_url()).await;
    let sub_a = subscribe(&mut a, 1, json!(["newHeads"])).await;
    let sub_b = subscribe(&mut b, 1, json!(["newHeads"])).await;
    assert_ne!(sub_a, sub_b);
    mine(&net).await;
    assert_eq!(next(&mut a).await["params"]["subscription"], sub_a.as_str());
    assert_eq!(next(&mut b).await["params"]["subscription"], sub_b.as_str());
    // A client cannot cancel another's subscription.
    send(&mut a, json!({"jsonrpc": "2.0", "id": 2, "method": "eth_unsubscribe", "params": [sub_b]})).await;
    assert_eq!(next(&mut a).await["result"], false);
    send(&mut a, json!({"jsonrpc": "2.0", "id": 3, "method": "eth_unsubscribe", "params": [sub_a]})).await;
    assert_eq!(next(&mut a).await["result"], true);
    mine(&net).await;
    assert_eq!(next(&mut b).await["params"]["subscription"], sub_b.as_str(), "b still subscribed");
    send(&mut a, json!({"jsonrpc": "2.0", "id": 4, "method": "eth_chainId"})).await;
    assert_eq!(next(&mut a).await["id"], 4, "no event reached a after it unsubscribed");
}

#[tokio::test]
async fn bad_messages_get_errors_and_the_socket_stays_open() {
    let net = Net::start(&[]).await;
    let mut ws = connect(&net.sluice.ws_url()).await;
    ws.send(Message::text("{nope")).await.unwrap();
    assert_eq!(next(&mut ws).await["error"]["code"], -32700);
    send(&mut ws, json!({"jsonrpc": "2.0", "id": 1, "method": "eth_unsubscribe", "params": "x"})).await;
    assert_eq!(next(&mut ws).await["error"]["code"], -32600);
    send(&mut ws, json!({"jsonrpc": "2.0", "id": 2, "method": "eth_unsubscribe", "params": [1]})).await;
    assert_eq!(next(&mut ws).await["error"]["code"], -32602);
    send(&mut ws, json!({"jsonrpc": "2.0", "id": 3, "method": "eth_chainId"})).await;
    assert_eq!(next(&mut ws).await["result"], "0x7a69");
}

/// A logs filter with a block range: sluice leaves those to the node (relayed).
fn relayed() -> serde_json::Value {
    json!(["logs", {"fromBlock": "latest"}])
}

#[tokio::test]
async fn relayed_subscriptions_share_one_upstream_socket_released_by_the_last_client() {
    let net = Net::start(&[]).await;
    let base = net.sluice.http_url();
    let gauge = "sluice_upstream_sockets ";
    // The head tracker holds a socket of its own once it has subscribed.
    let mut before = None;
    for _ in 0..100 {
        before = metric(&net.client, &base, gauge).await;
        if before == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = before.expect("gauge present");
    let mut a = connect(&net.sluice.ws_url()).await;
    let mut b = connect(&net.sluice.ws_url()).await;
    let sub_a = subscribe(&mut a, 1, relayed()).await;
    let sub_b = subscribe(&mut b, 1, relayed()).await;
    // newHeads is served by sluice itself: no upstream socket for it.
    subscribe(&mut b, 2, json!(["newHeads"])).await;
    assert_eq!(metric(&net.client, &base, gauge).await, Some(before + 1.0), "one shared socket");
    let data = format!("0x{}", CONTRACT_INIT.replace(' ', ""));
    rpc_result(&net.client, &net.anvil.http_url(), "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "data": data}]))
        .await;
    let mut got = (false, false);
    while !(got.0 && got.1) {
        let event = next(&mut a).await;
        got.0 |= event["params"]["subscription"] == sub_a.as_str() && event["params"]["result"]["topics"].is_array();
        if !got.1 {
            loop {
                let event = next(&mut b).await;
                if event["params"]["subscription"] == sub_b.as_str() {
                    got.1 = true;
                    break;
                }
            }
        }
    }
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(metric(&net.client, &base, gauge).await, Some(before + 1.0), "b still holds it");
    drop(b);
    let mut released = false;
    for _ in 0..100 {
        if metric(&net.client, &base, gauge).await == Some(before) {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "upstream socket closed after the last client left");
}

#[tokio::test]
async fn a_dying_upstream_closes_relayed_clients_with_1011_and_keeps_served_ones() {
    let anvil = Anvil::spawn();
    let sluice = Sluice::serve(BIN, &anvil.http_url(), &["--log", "error"]);
    let mut relayed_client = connect(&sluice.ws_url()).await;
    subscribe(&mut relayed_client, 1, relayed()).await;
    let mut served = connect(&sluice.ws_url()).await;
    subscribe(&mut served, 1, json!(["newHeads"])).await;
    drop(anvil);
    let close = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match relayed_client.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await
    .expect("closed within 5 s");
    assert_eq!(close, Some(1011));
    // The served subscription's socket is still open and answers.
    subscribe(&mut served, 2, json!(["newHeads"])).await;
}
