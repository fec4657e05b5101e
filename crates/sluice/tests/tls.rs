//! Upstreams over TLS: `https://` calls and `wss://` subscriptions to a real anvil behind a
//! TLS relay, trusted through `ca_file`; an untrusted certificate is a clear error.

mod common;

use std::time::Duration;

use common::{call, BIN, DEV_ACCOUNT};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use sluice_testkit::{post, rpc_result, Anvil, Sluice, TlsRelay};
use tokio_tungstenite::tungstenite::Message;

fn serve_tls(relay: &TlsRelay, trust: bool) -> (Sluice, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().unwrap();
    let ca = if trust { format!("ca_file = {:?}\n", relay.ca_file()) } else { String::new() };
    std::fs::write(file.path(), format!("[[upstreams]]\nurl = \"https://127.0.0.1:{}\"\n{ca}", relay.port)).unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", file.path().to_str().unwrap()];
    (Sluice::spawn(BIN, &args), file)
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next(ws: &mut Socket) -> serde_json::Value {
    let message = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.expect("a message").unwrap().unwrap();
    serde_json::from_str(message.to_text().unwrap()).unwrap()
}

// The relay runs on this runtime while sluice starts: give it threads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_calls_and_wss_subscriptions_reach_the_node() {
    let anvil = Anvil::spawn();
    let relay = TlsRelay::spawn(anvil.port).await;
    let (sluice, _config) = serve_tls(&relay, true);
    let client = reqwest::Client::new();
    for (method, params) in [("eth_chainId", json!([])), ("eth_getBalance", json!([DEV_ACCOUNT, "0x0"]))] {
        let body = call(json!(7), method, &params).to_string();
        let (_, via) = post(&client, &sluice.http_url(), body.clone()).await;
        let (_, direct) = post(&client, &anvil.http_url(), body).await;
        assert_eq!(via, direct, "{method}");
    }
    // A subscription through sluice rides the upstream's wss:// socket.
    let (mut ws, _) = tokio_tungstenite::connect_async(sluice.ws_url()).await.unwrap();
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]}).to_string(),
    ))
    .await
    .unwrap();
    let subscribed = next(&mut ws).await;
    assert!(subscribed["result"].is_string(), "{subscribed}");
    rpc_result(&client, &anvil.http_url(), "evm_mine", json!([])).await;
    let event = next(&mut ws).await;
    assert_eq!(event["params"]["subscription"], subscribed["result"]);
    assert_eq!(event["params"]["result"]["number"], "0x1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_a_clear_error() {
    let anvil = Anvil::spawn();
    let relay = TlsRelay::spawn(anvil.port).await;
    let (sluice, _config) = serve_tls(&relay, false);
    let client = reqwest::Client::new();
    let (_, answer) = post(&client, &sluice.http_url(), call(json!(1), "eth_chainId", &json!([])).to_string()).await;
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "unreachable");
}
