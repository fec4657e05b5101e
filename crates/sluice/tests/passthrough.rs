//! sluice in front of a real anvil answers exactly as anvil does, with the caller's ids.

mod common;

use common::{call, Net, BIN, DEV_ACCOUNT, DEV_KEY};
use serde_json::{json, Value};
use sluice_testkit::{foundry_tool, post, rpc_result};

#[tokio::test]
async fn every_corpus_call_matches_anvil() {
    let net = Net::start(&[]).await;
    let corpus = net.corpus();
    assert!(corpus.len() > 25);
    for (i, (method, params)) in corpus.iter().enumerate() {
        let body = call(json!(i), method, params).to_string();
        let (mut via, mut direct) = net.both(&body).await;
        // anvil builds its pending block with the current time: ask again if a second ticked.
        for _ in 0..3 {
            if via == direct || params[0] != "pending" {
                break;
            }
            (via, direct) = net.both(&body).await;
        }
        assert_eq!(via, direct, "{method} {params}");
    }
    // The corpus covers a returned value, a revert with data, and a null block.
    let (reverted, _) =
        net.both(&call(json!(1), "eth_call", &json!([{"to": net.contract}, "latest"])).to_string()).await;
    assert_eq!(reverted["error"]["code"], 3, "{reverted}");
    assert!(reverted["error"]["data"].as_str().unwrap().ends_with("2a"), "{reverted}");
    let (slot, _) =
        net.both(&call(json!(1), "eth_getStorageAt", &json!([net.contract, "0x0", "latest"])).to_string()).await;
    assert!(slot["result"].as_str().unwrap().ends_with("2a"), "{slot}");
}

#[tokio::test]
async fn a_batch_mixing_everything_matches_anvil_call_by_call() {
    let net = Net::start(&[]).await;
    let corpus = net.corpus();
    let mut batch: Vec<Value> = Vec::new();
    let mut expected: Vec<(Value, Value)> = Vec::new();
    for (i, (method, params)) in corpus.iter().enumerate() {
        // Alternate string and number ids so matching by id is exercised.
        let id = if i % 2 == 0 { json!(format!("call-{i}")) } else { json!(i * 1000) };
        let single = call(id.clone(), method, params);
        let direct = post(&net.client, &net.anvil.http_url(), single.to_string()).await.1;
        batch.push(single);
        expected.push((id, direct));
    }
    batch.insert(3, json!({"jsonrpc": "2.0", "method": "eth_blockNumber"}));
    batch.insert(7, json!({"jsonrpc": "2.0", "method": "eth_chainId", "params": []}));
    batch.push(json!({"jsonrpc": "2.0", "id": "bad", "method": 5}));
    let (status, answer) = post(&net.client, &net.sluice.http_url(), Value::Array(batch).to_string()).await;
    assert_eq!(status, 200);
    let answers = answer.as_array().expect("a batch answer");
    assert_eq!(answers.len(), expected.len() + 1, "notifications get no answer");
    for ((id, direct), (method, params)) in expected.iter().zip(&corpus) {
        let got = answers.iter().find(|a| &a["id"] == id).unwrap_or_else(|| panic!("no answer for {id}"));
        if got != direct && params[0] == "pending" {
            // anvil builds its pending block with the current time: a second may have ticked
            // since the direct call. Compare with a direct call made now.
            let again = post(&net.client, &net.anvil.http_url(), call(id.clone(), method, params).to_string()).await.1;
            assert_eq!(got, &again, "{method} {params}");
            continue;
        }
        assert_eq!(got, direct, "{method} {params}");
    }
    let bad = answers.iter().find(|a| a["id"] == "bad").expect("invalid element answered");
    assert_eq!(bad["error"]["code"], -32600);
}

#[tokio::test]
async fn ids_are_echoed_exactly() {
    let net = Net::start(&[]).await;
    for id in ["1.0", "-5", "\"x\"", "null", "123456789012345678901234567890", "1e3"] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"eth_chainId"}}"#);
        let raw = net.client.post(net.sluice.http_url()).body(body).send().await.unwrap().text().await.unwrap();
        assert_eq!(raw, format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"0x7a69"}}"#));
    }
}

#[tokio::test]
async fn notifications_get_no_answer_but_are_executed() {
    let net = Net::start(&[]).await;
    let before = rpc_result(&net.client, &net.anvil.http_url(), "eth_blockNumber", json!([])).await;
    let (status, body) = post(&net.client, &net.sluice.http_url(), r#"{"jsonrpc":"2.0","method":"evm_mine"}"#).await;
    assert_eq!((status, body), (200, Value::Null));
    let after = rpc_result(&net.client, &net.anvil.http_url(), "eth_blockNumber", json!([])).await;
    assert_ne!(before, after, "the notification reached anvil");
}

#[tokio::test]
async fn cast_works_through_sluice() {
    let net = Net::start(&[]).await;
    let cast = foundry_tool("cast");
    let url = net.sluice.http_url();
    let run = |args: Vec<String>| {
        let out = std::process::Command::new(&cast).args(&args).output().expect("cast runs");
        assert!(out.status.success(), "cast {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let head = rpc_result(&net.client, &net.anvil.http_url(), "eth_blockNumber", json!([])).await;
    let number = run(vec!["block-number".into(), "--rpc-url".into(), url.clone()]);
    assert_eq!(format!("0x{:x}", number.parse::<u64>().unwrap()), head.as_str().unwrap());

    let to = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";
    let before = rpc_result(&net.client, &net.anvil.http_url(), "eth_getBalance", json!([to, "latest"])).await;
    let receipt = run(vec![
        "send".into(),
        "--rpc-url".into(),
        url.clone(),
        "--private-key".into(),
        DEV_KEY.into(),
        to.into(),
        "--value".into(),
        "12345".into(),
        "--json".into(),
    ]);
    let receipt: Value = serde_json::from_str(&receipt).expect("cast prints a JSON receipt");
    assert_eq!(receipt["status"], "0x1");
    assert_eq!(receipt["from"].as_str().unwrap().to_lowercase(), DEV_ACCOUNT);
    let after = rpc_result(&net.client, &net.anvil.http_url(), "eth_getBalance", json!([to, "latest"])).await;
    let delta = u128::from_str_radix(&after.as_str().unwrap()[2..], 16).unwrap()
        - u128::from_str_radix(&before.as_str().unwrap()[2..], 16).unwrap();
    assert_eq!(delta, 12345);
    let _ = BIN;
}
