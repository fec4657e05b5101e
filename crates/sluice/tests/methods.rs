//! The method policy: node-key and admin methods never reach the node (counted at a relay in
//! front of real anvil), alone or in a batch; `allow` opens them again.

mod common;

use std::time::Duration;

use common::BIN;
use serde_json::{json, Value};
use sluice_testkit::{post, Anvil, FakeUpstream, Fault, Sluice};

const DENIED: [&str; 6] =
    ["debug_traceTransaction", "personal_sign", "eth_sign", "eth_sendTransaction", "admin_nodeInfo", "miner_start"];

fn serve(relay: &FakeUpstream, toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{toml}\n[[upstreams]]\nurl = \"{}\"\n", relay.url)).unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", file.path().to_str().unwrap()];
    (Sluice::spawn(BIN, &args), file)
}

fn relay_to(anvil: &Anvil) -> Fault {
    Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_methods_are_answered_at_once_and_never_forwarded() {
    let anvil = Anvil::spawn();
    let relay = FakeUpstream::spawn(relay_to(&anvil)).await;
    let (sluice, _config) = serve(&relay, "");
    let client = reqwest::Client::new();
    let mut batch: Vec<Value> =
        DENIED.iter().enumerate().map(|(i, m)| json!({"jsonrpc": "2.0", "id": i, "method": m, "params": []})).collect();
    batch.push(json!({"jsonrpc": "2.0", "id": 99, "method": "eth_chainId"}));
    let (status, answers) = post(&client, &sluice.http_url(), Value::Array(batch).to_string()).await;
    assert_eq!(status, 200);
    let answers = answers.as_array().unwrap();
    for (i, method) in DENIED.iter().enumerate() {
        assert_eq!(answers[i]["error"]["code"], -32601, "{method}: {}", answers[i]);
        assert_eq!(answers[i]["error"]["message"], format!("the method {method} is not allowed here"));
        let (_, single) =
            post(&client, &sluice.http_url(), json!({"jsonrpc": "2.0", "id": 1, "method": method}).to_string()).await;
        assert_eq!(single["error"]["code"], -32601, "{method} alone");
        assert_eq!(relay.requests_for(method), 0, "{method} reached the node");
    }
    assert_eq!(answers[DENIED.len()]["result"], "0x7a69", "the allowed call in the same batch is answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_opens_a_denied_method_and_deny_is_configurable() {
    let anvil = Anvil::spawn();
    let relay = FakeUpstream::spawn(relay_to(&anvil)).await;
    let (sluice, _config) =
        serve(&relay, "[methods]\ndeny = [\"debug_*\", \"net_*\"]\nallow = [\"debug_getRawHeader\"]");
    let client = reqwest::Client::new();
    let call = |method: &str| json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": ["latest"]}).to_string();
    let (_, opened) = post(&client, &sluice.http_url(), call("debug_getRawHeader")).await;
    assert_eq!(relay.requests_for("debug_getRawHeader"), 1, "forwarded: {opened}");
    let (_, denied) = post(&client, &sluice.http_url(), call("net_version")).await;
    assert_eq!(denied["error"]["code"], -32601);
    assert_eq!(relay.requests_for("net_version"), 0);
    // The configured list replaces the default one: eth_sendTransaction is not in it.
    let (_, sent) = post(&client, &sluice.http_url(), call("eth_sendTransaction")).await;
    assert_ne!(sent["error"]["message"], "the method eth_sendTransaction is not allowed here", "{sent}");
}
