//! Address rules and scoped keys end to end: clients on different loopback addresses (IPv4
//! 127.0.0.x and IPv6 ::1) against real sluice processes, `X-Forwarded-For` from trusted and
//! untrusted peers, and a key limited to one contract, checked with real calls (reqwest and
//! `cast`) and real signed transactions in front of a real anvil.

mod common;

use std::net::IpAddr;

use common::{Net, BIN, DEV_KEY};
use serde_json::{json, Value};
use sluice_testkit::{foundry_tool, rpc_result, Anvil, Sluice};

fn serve(anvil: &Anvil, listen: &str, toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{toml}\n[[upstreams]]\nurl = \"{}\"\n", anvil.http_url())).unwrap();
    let args = ["serve", "--listen", listen, "--config", file.path().to_str().unwrap()];
    (Sluice::spawn(BIN, &args), file)
}

/// A client whose connections come from `from`.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder().local_address(from.parse::<IpAddr>().unwrap()).build().unwrap()
}

/// `eth_chainId` with extra headers: (status, error message or result).
async fn chain_id(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut request = client.post(url).json(&json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let text = body["result"].as_str().or(body["error"]["message"].as_str()).unwrap_or_default().to_owned();
    (status, text)
}

const RULES: &str = r#"
[access]
anonymous = "open"
allow_ips = ["127.0.0.0/8", "::1"]
deny_ips = ["127.0.0.66", "192.0.2.0/24"]
trusted_proxies = ["127.0.0.2"]

[access.keys]
k-office = { tier = "open", allow_ips = ["127.0.0.3"] }
k-lab = "lab"

[access.tiers.open]
[access.tiers.lab]
deny_ips = ["127.0.0.4"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_rules_hold_globally_per_tier_and_per_key() {
    let anvil = Anvil::spawn();
    let (sluice, _config) = serve(&anvil, "127.0.0.1:0", RULES);
    let url = sluice.http_url();
    let from = |ip: &str| client_from(ip);

    assert_eq!(chain_id(&from("127.0.0.1"), &url, &[]).await, (200, "0x7a69".into()));
    // Globally denied, though inside the allowed block.
    let (status, message) = chain_id(&from("127.0.0.66"), &url, &[]).await;
    assert_eq!((status, message.as_str()), (403, "forbidden: calls from 127.0.0.66 are not accepted here"));

    // A key usable from one address only.
    let office = [("x-api-key", "k-office")];
    assert_eq!(chain_id(&from("127.0.0.3"), &url, &office).await.0, 200);
    let (status, message) = chain_id(&from("127.0.0.1"), &url, &office).await;
    assert_eq!((status, message.as_str()), (403, "forbidden: this key may not be used from 127.0.0.1"));

    // A tier refused from one address.
    let lab = [("x-api-key", "k-lab")];
    assert_eq!(chain_id(&from("127.0.0.5"), &url, &lab).await.0, 200);
    let (status, message) = chain_id(&from("127.0.0.4"), &url, &lab).await;
    assert_eq!((status, message.as_str()), (403, "forbidden: this tier may not be used from 127.0.0.4"));

    // X-Forwarded-For counts only from the trusted proxy (127.0.0.2).
    let forged = [("x-forwarded-for", "192.0.2.7")];
    assert_eq!(chain_id(&from("127.0.0.1"), &url, &forged).await.0, 200, "an untrusted peer's header is ignored");
    let (status, message) = chain_id(&from("127.0.0.2"), &url, &forged).await;
    assert_eq!((status, message.as_str()), (403, "forbidden: calls from 192.0.2.7 are not accepted here"));
    // The proxy forwards a client that prepended its own entry: the proxy's entry counts.
    let chained = [("x-forwarded-for", "192.0.2.7, 127.0.0.3"), ("x-api-key", "k-office")];
    assert_eq!(chain_id(&from("127.0.0.2"), &url, &chained).await.0, 200);
    let rfc7239 = [("forwarded", "for=\"192.0.2.8:1234\";proto=http")];
    assert_eq!(chain_id(&from("127.0.0.2"), &url, &rfc7239).await.0, 403);
    assert_eq!(chain_id(&from("127.0.0.2"), &url, &[]).await.0, 200);

    // WebSocket upgrades meet the same rules.
    let upgrade = from("127.0.0.66")
        .get(&url)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(upgrade.status().as_u16(), 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_loopback_follows_the_same_rules() {
    let anvil = Anvil::spawn();
    let toml = r#"
[access]
anonymous = "open"
allow_ips = ["::1/128"]
[access.keys]
k-v4 = { tier = "open", allow_ips = ["127.0.0.0/8"] }
[access.tiers.open]
"#;
    let (sluice, _config) = serve(&anvil, "[::1]:0", toml);
    let url = sluice.http_url();
    assert!(url.starts_with("http://[::1]:"), "{url}");
    let client = client_from("::1");
    assert_eq!(chain_id(&client, &url, &[]).await, (200, "0x7a69".into()));
    let (status, message) = chain_id(&client, &url, &[("x-api-key", "k-v4")]).await;
    assert_eq!((status, message.as_str()), (403, "forbidden: this key may not be used from ::1"));

    let deny = "[access]\nanonymous = \"open\"\ndeny_ips = [\"::1\"]\n[access.tiers.open]\n";
    let (denied, _config) = serve(&anvil, "[::1]:0", deny);
    let (status, message) = chain_id(&client, &denied.http_url(), &[]).await;
    assert_eq!((status, message.as_str()), (403, "forbidden: calls from ::1 are not accepted here"));
}

/// The contract the first deployment from anvil's first account creates.
const CONTRACT: &str = "0x5fbdb2315678afecb367f032d93f642f64180aa3";
const OTHER: &str = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";

/// A transaction signed by `cast` for the chain at `rpc`, to `to`.
fn signed(rpc: &str, to: &str, nonce: u64) -> String {
    let out = std::process::Command::new(foundry_tool("cast"))
        .args(["mktx", "--rpc-url", rpc, "--private-key", DEV_KEY, "--nonce", &nonce.to_string()])
        .args(["--gas-limit", "100000", to, "0x01"])
        .output()
        .expect("cast runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limited_to_one_contract_cannot_reach_another() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let toml = format!(
        r#"
[access.keys]
k-dapp = {{ tier = "free", methods = ["eth_call", "eth_estimateGas", "eth_sendRawTransaction", "eth_chainId", "eth_get*"], contracts = ["{}"] }}
k-all = "free"
[access.tiers.free]
"#,
        CONTRACT.to_uppercase().replace("0X", "0x")
    );
    std::fs::write(file.path(), toml).unwrap();
    let net = Net::start(&["--config", file.path().to_str().unwrap()]).await;
    assert_eq!(net.contract, CONTRACT);
    let (dapp, all) = (format!("{}/k-dapp", net.sluice.http_url()), format!("{}/k-all", net.sluice.http_url()));
    let client = &net.client;
    let post = |url: String, body: Value| async move {
        client.post(url).json(&body).send().await.unwrap().json::<Value>().await.unwrap()
    };
    let call =
        |id: u64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});

    // eth_call: its own contract answers; another is refused, naming the scope.
    let own = post(dapp.clone(), call(1, "eth_call", json!([{"to": CONTRACT, "data": "0x01"}, "latest"]))).await;
    assert_eq!(own["result"], format!("0x{:064x}", 42), "{own}");
    let other = post(dapp.clone(), call(2, "eth_call", json!([{"to": OTHER, "data": "0x01"}, "latest"]))).await;
    assert_eq!(other["error"]["code"], -32600);
    assert_eq!(
        other["error"]["message"],
        format!("forbidden: contract {OTHER} is outside this key's scope (contracts: {CONTRACT})")
    );
    // A method outside the list, inside a batch: refused alone, the rest answered.
    let batch = post(
        dapp.clone(),
        json!([
            call(1, "eth_blockNumber", json!([])),
            call(2, "eth_estimateGas", json!([{"to": CONTRACT, "data": "0x01"}]))
        ]),
    )
    .await;
    assert!(batch[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("eth_blockNumber is outside this key's scope (methods: eth_call"));
    assert!(batch[1]["result"].as_str().is_some(), "{batch}");

    // A real client sees the same.
    let cast = |url: &str, to: &str| {
        std::process::Command::new(foundry_tool("cast")).args(["call", "--rpc-url", url, to, "0x01"]).output().unwrap()
    };
    let ok = cast(&dapp, CONTRACT);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let refused = cast(&dapp, OTHER);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("outside this key's scope"), "{refused:?}");

    // Raw transactions: the decoded `to` is checked; the refused one never reaches the node.
    let anvil = net.anvil.http_url();
    let nonce = rpc_result(client, &anvil, "eth_getTransactionCount", json!([common::DEV_ACCOUNT, "latest"])).await;
    let nonce = u64::from_str_radix(nonce.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let to_other = signed(&anvil, OTHER, nonce);
    let answer = post(dapp.clone(), call(3, "eth_sendRawTransaction", json!([to_other]))).await;
    assert!(answer["error"]["message"].as_str().unwrap().contains(&format!("contract {OTHER} is outside")), "{answer}");
    let after = rpc_result(client, &anvil, "eth_getTransactionCount", json!([common::DEV_ACCOUNT, "pending"])).await;
    assert_eq!(after.as_str().map(|n| u64::from_str_radix(n.trim_start_matches("0x"), 16).unwrap()), Some(nonce));
    let to_own = signed(&anvil, CONTRACT, nonce);
    let answer = post(dapp.clone(), call(4, "eth_sendRawTransaction", json!([to_own]))).await;
    assert!(answer["result"].as_str().is_some_and(|h| h.len() == 66), "{answer}");
    let garbage = post(dapp.clone(), call(5, "eth_sendRawTransaction", json!(["0xdeadbeef"]))).await;
    assert!(garbage["error"]["message"].as_str().unwrap().contains("outside this key's scope"), "{garbage}");

    // The unscoped key reaches anything.
    let free = post(all, call(6, "eth_call", json!([{"to": OTHER, "data": "0x01"}, "latest"]))).await;
    assert!(free.get("error").is_none(), "{free}");
}
