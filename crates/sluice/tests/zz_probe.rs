mod common;
use common::ws::{connect, send};
use common::DEV_ACCOUNT;
use futures_util::StreamExt;
use serde_json::json;
use sluice_testkit::{rpc_result, Anvil};
use std::time::Duration;

fn fire(count: u64, salt: u64) -> String {
    let sel = "c917cd75";
    let w = |n: u64| format!("{:064x}", n);
    let mut d = format!("0x{sel}{}{}", w(count), w(salt));
    for b in ["aa", "bb", "cc", "dd"] { d.push_str(&b.repeat(32)); }
    d
}

#[tokio::test]
async fn probe() {
    let code: serde_json::Value = serde_json::from_slice(&std::process::Command::new("node").arg(sluice_testkit::workspace_root().join("crates/sluice/tests/contracts/compile.js")).arg(sluice_testkit::workspace_root().join(".tools/node_modules/solc")).arg(sluice_testkit::workspace_root().join("crates/sluice/tests/contracts/Emitter.sol")).output().unwrap().stdout).unwrap();
    let anvil = Anvil::spawn();
    let c = reqwest::Client::new();
    let url = anvil.http_url();
    let addr = "0x00000000000000000000000000000000000000e1";
    rpc_result(&c, &url, "anvil_setCode", json!([addr, format!("0x{}", code["Emitter"].as_str().unwrap())])).await;
    let mut ws = connect(&anvil.ws_url()).await;
    send(&mut ws, json!({"jsonrpc":"2.0","id":1,"method":"eth_subscribe","params":["newHeads"]})).await;
    send(&mut ws, json!({"jsonrpc":"2.0","id":2,"method":"eth_subscribe","params":["logs", {}]})).await;
    send(&mut ws, json!({"jsonrpc":"2.0","id":3,"method":"eth_subscribe","params":["syncing"]})).await;
    send(&mut ws, json!({"jsonrpc":"2.0","id":4,"method":"eth_subscribe","params":["logs", {"fromBlock":"0x1"}]})).await;
    send(&mut ws, json!({"jsonrpc":"2.0","id":5,"method":"eth_subscribe","params":["logs", {"topics":[null,null,null,null,null]}]})).await;
    send(&mut ws, json!({"jsonrpc":"2.0","id":6,"method":"eth_subscribe","params":["logs", {"address":"0xzz"}]})).await;
    for i in 0..3 {
        rpc_result(&c, &url, "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "to": addr, "data": fire(2, i)}])).await;
    }
    let r = c.post(&url).json(&json!({"jsonrpc":"2.0","id":1,"method":"anvil_reorg","params":[2, [[{"from": DEV_ACCOUNT, "to": addr, "data": fire(1, 7)}, 0]]]})).send().await.unwrap().text().await.unwrap();
    println!("REORG {r}");
    let b = rpc_result(&c, &url, "eth_getBlockByNumber", json!(["latest", false])).await;
    println!("BLOCK {b}");
    loop {
        match tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
            Ok(Some(Ok(m))) => println!("MSG {m}"),
            _ => break,
        }
    }
}
