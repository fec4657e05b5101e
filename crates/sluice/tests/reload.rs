//! Reload on SIGHUP, end to end: sluice in front of one anvil, then its file rewritten (a new
//! key, a revoked one, a tier's method list, a second upstream) and SIGHUP sent. The new file
//! is in force while an open WebSocket keeps answering and the first node can go away; a bad
//! file is then refused and the one in force stays.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::ws::{connect, next, send};
use common::{eventually, BIN};
use serde_json::{json, Value};
use sluice_testkit::{metric, Anvil, Sluice};

const OLD_KEY: &str = "reload-test-old-key-0001";
const NEW_KEY: &str = "reload-test-new-key-0002";

fn write_config(path: &Path, upstreams: &[(&str, &str)], key: &str, free_deny: &str) {
    let mut text = String::new();
    for (name, url) in upstreams {
        text += &format!("[[upstreams]]\nurl = \"{url}\"\nname = \"{name}\"\n\n");
    }
    text += &format!(
        "[access]\nanonymous = \"free\"\n\n[access.keys]\n\"{key}\" = \"pro\"\n\n\
         [access.tiers.free]\ndeny = [{free_deny}]\n\n[access.tiers.pro]\n"
    );
    std::fs::write(path, text).unwrap();
}

fn hangup(sluice: &Sluice) {
    let status = Command::new("kill").args(["-HUP", &sluice.pid().to_string()]).status().unwrap();
    assert!(status.success());
}

/// HTTP status and body of `eth_chainId` with `key` (none: anonymous).
async fn chain_id(http: &reqwest::Client, url: &str, key: Option<&str>) -> (u16, Value) {
    let mut request = http.post(url).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let answer = request.body(r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#).send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn balance(http: &reqwest::Client, url: &str) -> Value {
    sluice_testkit::rpc(http, url, "eth_getBalance", json!(["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", "latest"]))
        .await
}

async fn upstream_names(http: &reqwest::Client, url: &str) -> Vec<String> {
    let status: Value = http.get(format!("{url}/status")).send().await.unwrap().json().await.unwrap();
    status["upstreams"].as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap().to_owned()).collect()
}

async fn ws_chain_id(ws: &mut common::ws::Socket, id: u64) -> Value {
    send(ws, json!({"jsonrpc": "2.0", "id": id, "method": "eth_chainId"})).await;
    next(ws).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_keys_tiers_policy_and_upstreams_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    let first = Anvil::spawn();
    let second = Anvil::spawn();
    write_config(&file, &[("first", &first.http_url())], OLD_KEY, "");
    let sluice = Sluice::spawn(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", file.to_str().unwrap()]);
    let http = reqwest::Client::new();
    let url = sluice.http_url();
    let reloads = |outcome: &str| format!("sluice_config_reloads_total{{outcome=\"{outcome}\"}} ");

    assert_eq!(chain_id(&http, &url, Some(OLD_KEY)).await.0, 200);
    assert_eq!(chain_id(&http, &url, Some(NEW_KEY)).await.0, 401);
    assert!(balance(&http, &url).await["result"].is_string());
    assert_eq!(upstream_names(&http, &url).await, ["first"]);
    let mut ws = connect(&sluice.ws_url()).await;
    assert_eq!(ws_chain_id(&mut ws, 1).await["result"], "0x7a69");

    // The new file: the old key revoked, a new one, eth_getBalance denied to the free tier,
    // and a second node.
    write_config(&file, &[("first", &first.http_url()), ("second", &second.http_url())], NEW_KEY, "\"eth_getBalance\"");
    hangup(&sluice);
    eventually(Duration::from_secs(10), "the reload is applied", || async {
        metric(&http, &url, &reloads("applied")).await == Some(1.0)
    })
    .await;
    assert_eq!(chain_id(&http, &url, Some(NEW_KEY)).await.0, 200, "the new key is accepted");
    assert_eq!(chain_id(&http, &url, Some(OLD_KEY)).await.0, 401, "the old key is revoked");
    let denied = balance(&http, &url).await;
    assert_eq!(denied["error"]["code"], -32601, "the free tier's new deny list: {denied}");
    assert_eq!(upstream_names(&http, &url).await, ["first", "second"]);
    assert_eq!(ws_chain_id(&mut ws, 2).await["result"], "0x7a69", "the open WebSocket still answers");

    // The first node goes away: the reloaded pool fails over to the second.
    let first_url = first.http_url();
    drop(first); // kills it
    for i in 0..5 {
        let (status, body) = chain_id(&http, &url, Some(NEW_KEY)).await;
        assert_eq!((status, &body["result"]), (200, &json!("0x7a69")), "call {i} after the first node died: {body}");
        let block = sluice_testkit::rpc(&http, &url, "eth_getBlockByNumber", json!(["latest", false])).await;
        assert!(block["result"]["hash"].is_string(), "served by the second node: {block}");
    }

    // A bad file is refused; what is in force stays.
    std::fs::write(&file, "[[upstreams]\nurl = ").unwrap();
    hangup(&sluice);
    eventually(Duration::from_secs(10), "the bad file is refused", || async {
        metric(&http, &url, &reloads("refused")).await == Some(1.0)
    })
    .await;
    assert_eq!(chain_id(&http, &url, Some(NEW_KEY)).await.0, 200, "the configuration in force stays");
    assert_eq!(upstream_names(&http, &url).await, ["first", "second"]);
    assert_eq!(ws_chain_id(&mut ws, 3).await["result"], "0x7a69");

    // So is a file that names a tier that does not exist.
    write_config(&file, &[("first", &first_url), ("second", &second.http_url())], NEW_KEY, "");
    let text = std::fs::read_to_string(&file).unwrap().replace("= \"pro\"", "= \"gold\"");
    std::fs::write(&file, text).unwrap();
    hangup(&sluice);
    eventually(Duration::from_secs(10), "the file with an unknown tier is refused", || async {
        metric(&http, &url, &reloads("refused")).await == Some(2.0)
    })
    .await;
    assert_eq!(upstream_names(&http, &url).await, ["first", "second"], "nothing of it applied");
}
