//! API keys, tiers and quotas, end to end: real anvil behind sluice, real redis-server for the
//! shared quotas, two sluice replicas sharing it.

mod common;

use common::BIN;
use serde_json::{json, Value};
use sluice_testkit::{Anvil, RedisServer, Sluice};

const TIERS: &str = r#"
[access.keys]
k-free = "free"
k-pro = "pro"
k-tiny = "tiny"

[access.tiers.free]
per_second = 5
burst = 5
deny = ["eth_getLogs"]

[access.tiers.pro]

[access.tiers.tiny]
per_day = 4
costs = { "eth_getBalance" = 2 }
"#;

fn serve(anvil: &Anvil, toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{toml}\n[[upstreams]]\nurl = \"{}\"\n", anvil.http_url())).unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", file.path().to_str().unwrap()];
    (Sluice::spawn(BIN, &args), file)
}

/// Posts one call with optional headers; returns (status, Retry-After, body).
async fn call(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    method: &str,
    params: Value,
) -> (u16, Option<u64>, Value) {
    let mut request = client.post(url).json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    (status, retry, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_tiers_and_quotas_hold_in_memory() {
    let anvil = Anvil::spawn();
    let (sluice, _config) = serve(&anvil, TIERS);
    let client = reqwest::Client::new();
    let url = sluice.http_url();

    // No key and an unknown key: 401, nothing forwarded.
    let (status, _, body) = call(&client, &url, &[], "eth_chainId", json!([])).await;
    assert_eq!((status, body["error"]["message"].as_str()), (401, Some("unauthorized: an API key is required")));
    let (status, _, _) = call(&client, &format!("{url}/nope"), &[], "eth_chainId", json!([])).await;
    assert_eq!(status, 401);

    // The three ways to present a key.
    for (path, headers) in [
        (format!("{url}/k-pro"), vec![]),
        (url.clone(), vec![("authorization", "Bearer k-pro")]),
        (url.clone(), vec![("x-api-key", "k-pro")]),
    ] {
        let (status, _, body) = call(&client, &path, &headers, "eth_chainId", json!([])).await;
        assert_eq!((status, body["result"].as_str()), (200, Some("0x7a69")), "{path} {headers:?}");
    }

    // free: a burst of 5, then 429 with Retry-After and -32005.
    let free = [("x-api-key", "k-free")];
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(call(&client, &url, &free, "eth_blockNumber", json!([])).await);
    }
    let allowed = statuses.iter().filter(|(s, _, _)| *s == 200).count();
    assert!((5..=6).contains(&allowed), "burst of 5 (and at most one more earned meanwhile): {allowed}");
    let (status, retry, body) = statuses.last().unwrap();
    assert_eq!((*status, body["error"]["code"].as_i64()), (429, Some(-32005)), "{body}");
    assert_eq!(*retry, Some(1));
    // free may not call eth_getLogs; pro may.
    let (_, _, denied) = call(&client, &format!("{url}/k-pro"), &[], "eth_getLogs", json!([{}])).await;
    assert!(denied["result"].is_array(), "{denied}");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let (_, _, denied) = call(&client, &url, &free, "eth_getLogs", json!([{}])).await;
    assert_eq!(denied["error"]["code"], -32601, "{denied}");

    // tiny: 4 units a day; eth_getBalance costs 2.
    let tiny = [("x-api-key", "k-tiny")];
    let balance = json!(["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", "latest"]);
    assert_eq!(call(&client, &url, &tiny, "eth_getBalance", balance.clone()).await.0, 200);
    assert_eq!(call(&client, &url, &tiny, "eth_chainId", json!([])).await.0, 200);
    let (status, retry, body) = call(&client, &url, &tiny, "eth_getBalance", balance).await;
    assert_eq!(status, 429, "3 + 2 > 4: {body}");
    assert!(retry.is_some_and(|s| s > 0 && s <= 86_400), "until the next UTC day: {retry:?}");
    assert!(body["error"]["message"].as_str().unwrap().contains("daily quota"), "{body}");
    assert_eq!(call(&client, &url, &tiny, "eth_chainId", json!([])).await.0, 200, "one unit left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_daily_quota_through_redis_and_follow_the_fail_mode() {
    let anvil = Anvil::spawn();
    let mut redis = RedisServer::spawn();
    let shared = |fail_open: bool| {
        format!(
            "[access]\nredis_url = \"{}\"\nfail_open = {fail_open}\n[access.keys]\nk = \"day\"\n[access.tiers.day]\nper_day = 30\n",
            redis.url()
        )
    };
    let (a, _ca) = serve(&anvil, &shared(false));
    let (b, _cb) = serve(&anvil, &shared(true));
    let client = reqwest::Client::new();
    let key = [("x-api-key", "k")];
    let mut allowed = 0;
    for i in 0..50 {
        let url = if i % 2 == 0 { a.http_url() } else { b.http_url() };
        if call(&client, &url, &key, "eth_chainId", json!([])).await.0 == 200 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 30, "the key's 30 a day hold across both replicas");
    // Redis gone: replica a fails closed (503, -32002), replica b fails open.
    redis.kill();
    let (status, _, body) = call(&client, &a.http_url(), &key, "eth_chainId", json!([])).await;
    assert_eq!((status, body["error"]["code"].as_i64()), (503, Some(-32002)), "{body}");
    let (status, _, body) = call(&client, &b.http_url(), &key, "eth_chainId", json!([])).await;
    assert_eq!((status, body["result"].as_str()), (200, Some("0x7a69")), "{body}");
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_call(ws: &mut Socket, id: u64, method: &str, params: Value) -> Value {
    use futures_util::{SinkExt, StreamExt};
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(tokio_tungstenite::tungstenite::Message::text(body.to_string())).await.unwrap();
    loop {
        let message =
            tokio::time::timeout(std::time::Duration::from_secs(3), ws.next()).await.unwrap().unwrap().unwrap();
        if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).unwrap();
            if value["id"] == json!(id) {
                return value;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_connections_and_subscriptions_are_capped_per_key() {
    let anvil = Anvil::spawn();
    let toml = "[access.keys]\nk = \"ws\"\n[access.tiers.ws]\nmax_connections = 2\nmax_subscriptions = 3\n";
    let (sluice, _config) = serve(&anvil, toml);
    let url = format!("{}/k", sluice.ws_url());
    let (mut a, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (mut b, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let third = tokio_tungstenite::connect_async(&url).await;
    assert!(third.is_err(), "a third connection for the key is refused");
    let mut ids = Vec::new();
    for i in 0..3 {
        let answer = ws_call(&mut a, i, "eth_subscribe", json!(["newHeads"])).await;
        ids.push(answer["result"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned());
    }
    let over = ws_call(&mut a, 10, "eth_subscribe", json!(["newHeads"])).await;
    assert_eq!(over["error"]["code"], -32005, "{over}");
    let other = ws_call(&mut b, 11, "eth_subscribe", json!(["newPendingTransactions"])).await;
    assert_eq!(other["error"]["code"], -32005, "the limit is per key, across its connections: {other}");
    let done = ws_call(&mut a, 12, "eth_unsubscribe", json!([ids[0]])).await;
    assert_eq!(done["result"], true);
    let again = ws_call(&mut b, 13, "eth_subscribe", json!(["newPendingTransactions"])).await;
    assert!(again["result"].is_string(), "a place came free: {again}");
    // Closing a connection gives its places back.
    drop(a);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (mut c, _) = tokio_tungstenite::connect_async(&url).await.expect("a place came free");
    for i in 0..2 {
        let answer = ws_call(&mut c, 20 + i, "eth_subscribe", json!(["newHeads"])).await;
        assert!(answer["result"].is_string(), "{answer}");
    }
}
