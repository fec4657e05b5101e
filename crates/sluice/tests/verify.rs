//! Verified reads end to end: real anvil, sluice with `[verify] enabled = true`, and a relay
//! that lies about proofs (a named fault injector in front of the same anvil).

mod common;

use alloy_primitives::{Bytes, TxKind, U256};
use common::verify::{craft, synced, verifying, ABSENT, ACCOUNT, EMPTY_SLOT, SLOT};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{rpc, rpc_result, Anvil, FakeUpstream, Fault};

/// Every verified state read answers exactly what the node answers: present and absent
/// accounts, set and empty slots, at `latest`, by height and by EIP-1898 hash; each one
/// answered from a checked proof (counted), none passed through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_reads_answer_exactly_what_the_node_answers() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    craft(&client, &anvil.http_url()).await;
    let node = anvil.http_url();
    let served = verifying(&node, "[cache]\nenabled = false");
    let url = served.sluice.http_url();
    synced(&client, &url, &node).await;
    let head = rpc_result(&client, &node, "eth_getBlockByNumber", json!(["latest", false])).await;
    let (number, hash) = (head["number"].clone(), head["hash"].clone());
    let older = format!("{:#x}", sluice_testkit::quantity(&number) - 2);
    let mut asked = 0;
    for block in [json!("latest"), number.clone(), json!(older), json!({ "blockHash": hash })] {
        for account in [ACCOUNT, ABSENT] {
            let reads = [
                ("eth_getBalance", json!([account, block])),
                ("eth_getTransactionCount", json!([account, block])),
                ("eth_getCode", json!([account, block])),
                ("eth_getStorageAt", json!([account, SLOT, block])),
                ("eth_getStorageAt", json!([account, "0x8", block])),
                ("eth_getProof", json!([account, [SLOT, EMPTY_SLOT], block])),
            ];
            for (method, params) in reads {
                let ours = rpc(&client, &url, method, params.clone()).await;
                let theirs = rpc(&client, &node, method, params.clone()).await;
                assert_eq!(ours["result"], theirs["result"], "{method} {params}: {ours}");
                assert!(ours["result"].is_string() || ours["result"].is_object(), "{method} {params}: {ours}");
                asked += 1;
            }
        }
    }
    let text = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    let verified: f64 = text
        .lines()
        .filter(|l| l.starts_with("sluice_verified_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(verified, asked as f64, "every read answered from a checked proof");
    // In a batch beside calls that are not verified: each answer in its place.
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [ACCOUNT, "latest"]},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId", "params": []},
        {"jsonrpc": "2.0", "id": 3, "method": "eth_getStorageAt", "params": [ACCOUNT, SLOT, "latest"]},
        {"jsonrpc": "2.0", "id": 4, "method": "eth_getBlockByNumber", "params": ["0x1", false]},
    ]);
    let (ours, theirs) = (
        sluice_testkit::post(&client, &url, batch.to_string()).await.1,
        sluice_testkit::post(&client, &node, batch.to_string()).await.1,
    );
    assert_eq!(ours, theirs, "a batch answers as the node does");
    // A read sluice cannot prove is refused, not passed through: the pending state has no
    // commitment.
    let pending = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, "pending"])).await;
    assert_eq!(pending["error"]["code"], -32002, "{pending}");
    assert_eq!(pending["error"]["data"]["reason"], "unverified", "{pending}");
    // Bad params get the standard error.
    let bad = rpc(&client, &url, "eth_getBalance", json!(["0x12", "latest"])).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

/// A provider that inflates every balance its proofs claim (and answers `eth_getBalance`
/// honestly, which verified reads never ask).
fn richer_proofs(req: &Value, answer: &mut Value) {
    if req["method"] == "eth_getProof" && answer["result"].is_object() {
        answer["result"]["balance"] = json!("0xde0b6b3a7640000000");
    }
}

/// With every member lying about proofs, a verified read is refused with `-32002`
/// (`data.reason = "unverified"`) after two tries, counted by reason; never the lie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_provider_is_refused_never_believed() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    craft(&client, &anvil.http_url()).await;
    let liar = FakeUpstream::spawn(Fault::Alter { to: anvil.http_url(), alter: richer_proofs }).await;
    let served = verifying(&liar.url, "[cache]\nenabled = false");
    let url = served.sluice.http_url();
    synced(&client, &url, &anvil.http_url()).await;
    let answer = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "unverified", "{answer}");
    assert_eq!(answer["error"]["data"]["why"], "proof", "{answer}");
    assert_eq!(liar.requests_for("eth_getProof"), 2, "asked twice, refused");
    let text = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("sluice_verify_refused_total{network=\"default\",reason=\"proof\"} 1"), "{text}");
    let failures = text.lines().find(|l| l.starts_with("sluice_verify_failures_total{")).unwrap_or_default();
    assert!(failures.ends_with(" 2"), "both proofs counted against the member: {failures}");
    // The code and slots the liar left alone still verify.
    let code = rpc(&client, &url, "eth_getCode", json!([ACCOUNT, "latest"])).await;
    assert!(code["error"]["code"] == -32002, "its proof lies about the balance too: {code}");
    // Without verification, the lie would have gone through: the same relay, unverified.
    let plain = common::with_config(&format!("[mempool]\nenabled = false\n[[upstreams]]\nurl = \"{}\"\n", liar.url));
    let proof = rpc(&client, &plain.sluice.http_url(), "eth_getProof", json!([ACCOUNT, [], "latest"])).await;
    assert_eq!(proof["result"]["balance"], "0xde0b6b3a7640000000", "an unverified proof is the liar's");
}

/// What verification costs the provider: one `eth_getProof` per read, and one header per
/// block for a burst of reads at it (counted by a relay in front of anvil).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reads_at_one_block_checks_its_header_once() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    craft(&client, &anvil.http_url()).await;
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: std::time::Duration::ZERO, fail_method: None })
            .await;
    let served = verifying(&relay.url, "[cache]\nenabled = false");
    let url = served.sluice.http_url();
    synced(&client, &url, &anvil.http_url()).await;
    let number = rpc_result(&client, &anvil.http_url(), "eth_blockNumber", json!([])).await;
    let reads = (1..=20u64).map(|i| {
        let (client, url, number) = (&client, &url, number.clone());
        async move { rpc(client, url, "eth_getBalance", json!([format!("0x{i:040x}"), number])).await }
    });
    let answers = futures_util::future::join_all(reads).await;
    assert!(answers.iter().all(|a| a["result"] == "0x0"), "{:?}", answers.first());
    assert_eq!(relay.requests_for("eth_getProof"), 20, "one proof per read");
    assert_eq!(relay.requests_for("eth_getBalance"), 0, "no balance asked of the node");
    let headers = relay.requests_for("eth_getBlockByHash");
    assert_eq!(headers, 1, "the block's header checked once, the other reads waiting for that check");
}

/// An honest member beside a liar that is asked first: each read is answered from the honest
/// member's proof, the liar's failed proofs are counted against it, and after three in a row
/// it is cordoned (asked no more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_an_honest_member_a_liar_is_passed_over_then_cordoned() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    craft(&client, &anvil.http_url()).await;
    let liar = FakeUpstream::spawn(Fault::Alter { to: anvil.http_url(), alter: richer_proofs }).await;
    let served = common::with_config(&format!(
        "[mempool]\nenabled = false\n[cache]\nenabled = false\n[verify]\nenabled = true\n\
         [[upstreams]]\nurl = \"{}\"\nweight = 1000\n[[upstreams]]\nurl = \"{}\"\n",
        liar.url,
        anvil.http_url()
    ));
    let url = served.sluice.http_url();
    synced(&client, &url, &anvil.http_url()).await;
    let truth = rpc_result(&client, &anvil.http_url(), "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    for i in 0..6 {
        let answer = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
        assert_eq!(answer["result"], truth, "read {i}: {answer}");
    }
    assert_eq!(liar.requests_for("eth_getProof"), 3, "the liar was asked until it was cordoned");
    let status: Value = client.get(format!("{url}/status")).send().await.unwrap().json().await.unwrap();
    let cordoned: Vec<&Value> = status["upstreams"].as_array().unwrap().iter().map(|u| &u["cordoned"]).collect();
    assert_eq!(cordoned, [&json!(true), &json!(false)], "{status}");
}

/// A block of three transactions (two transfers and a contract creation that logs), mined
/// together on a non-mining anvil; returns the transaction hashes.
async fn busy_block(client: &reqwest::Client, anvil: &str) -> Vec<String> {
    let wallet = Wallet::from_hex(common::DEV_KEY, 31337).unwrap();
    let to = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap();
    let init: Bytes = alloy_primitives::hex::decode(common::CONTRACT_INIT.replace(' ', "")).unwrap().into();
    let deploy = wallet.sign(alloy_consensus::TxEip1559 {
        chain_id: 31337,
        nonce: 2,
        gas_limit: 200_000,
        max_fee_per_gas: 20_000_000_000,
        max_priority_fee_per_gas: 1_000_000_000,
        to: TxKind::Create,
        value: U256::ZERO,
        input: init,
        ..Default::default()
    });
    let raws = [
        wallet.transfer(0, to, 1, Fees::default()).hex(),
        wallet.transfer(1, to, 2, Fees::default()).hex(),
        deploy.hex(),
    ];
    let mut hashes = Vec::new();
    for raw in raws {
        let hash = rpc_result(client, anvil, "eth_sendRawTransaction", json!([raw])).await;
        hashes.push(hash.as_str().unwrap().to_owned());
    }
    rpc_result(client, anvil, "evm_mine", json!([])).await;
    hashes
}

/// Blocks (full and by hashes, by number and by hash), a block's receipts and each receipt
/// answer exactly what the node answers, from a block checked against its header's roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_blocks_and_receipts_answer_exactly_what_the_node_answers() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let node = anvil.http_url();
    let hashes = busy_block(&client, &node).await;
    let served = verifying(&node, "[cache]\nenabled = false");
    let url = served.sluice.http_url();
    synced(&client, &url, &node).await;
    let block = rpc_result(&client, &node, "eth_getBlockByNumber", json!(["latest", true])).await;
    assert_eq!(block["transactions"].as_array().map(Vec::len), Some(3), "one block of three");
    let hash = block["hash"].clone();
    // One more, sent but not mined: pending, with no block to commit to it.
    let wallet = Wallet::from_hex(common::DEV_KEY, 31337).unwrap();
    let to = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap();
    let raw = wallet.transfer(3, to, 3, Fees::default()).hex();
    let pending = rpc_result(&client, &node, "eth_sendRawTransaction", json!([raw])).await;
    let receipt = rpc_result(&client, &node, "eth_getTransactionReceipt", json!([hashes[2]])).await;
    let (contract, topic) = (receipt["contractAddress"].clone(), receipt["logs"][0]["topics"][0].clone());
    let reads = [
        ("eth_getLogs", json!([{ "fromBlock": "0x0", "toBlock": "latest" }])),
        ("eth_getLogs", json!([{ "fromBlock": "0x1", "toBlock": "0x1", "address": contract }])),
        ("eth_getLogs", json!([{ "blockHash": hash, "topics": [topic] }])),
        ("eth_getLogs", json!([{ "fromBlock": "0x0", "address": ACCOUNT }])),
        ("eth_getLogs", json!([{ "fromBlock": "0x0", "topics": [null, topic] }])),
        ("eth_getTransactionByHash", json!([hashes[0]])),
        ("eth_getTransactionByHash", json!([hashes[2]])),
        ("eth_getTransactionByHash", json!([pending])),
        ("eth_getTransactionByHash", json!([format!("0x{}", "66".repeat(32))])),
        ("eth_getBlockByNumber", json!(["latest", true])),
        ("eth_getBlockByNumber", json!(["0x1", false])),
        ("eth_getBlockByHash", json!([hash, true])),
        ("eth_getBlockByHash", json!([hash, false])),
        ("eth_getBlockReceipts", json!(["0x1"])),
        ("eth_getBlockReceipts", json!([hash])),
        ("eth_getTransactionReceipt", json!([hashes[0]])),
        ("eth_getTransactionReceipt", json!([hashes[2]])),
        ("eth_getBlockByNumber", json!(["0x99", false])),
        ("eth_getTransactionReceipt", json!([format!("0x{}", "77".repeat(32))])),
    ];
    for (method, params) in reads {
        let ours = rpc(&client, &url, method, params.clone()).await;
        let theirs = rpc(&client, &node, method, params.clone()).await;
        assert_eq!(ours["result"], theirs["result"], "{method} {params}: {ours}");
    }
    let all = rpc_result(&client, &url, "eth_getLogs", json!([{ "fromBlock": "0x0" }])).await;
    assert_eq!(all.as_array().map(Vec::len), Some(1), "the creation's one log: {all}");
    let receipt = rpc_result(&client, &url, "eth_getTransactionReceipt", json!([hashes[2]])).await;
    assert!(receipt["contractAddress"].is_string() && !receipt["logs"].as_array().unwrap().is_empty(), "{receipt}");
    let text = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    let verified: f64 = text
        .lines()
        .filter(|l| l.starts_with("sluice_verified_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(verified, 21.0, "every read answered from a checked block or transaction, or a null: {text}");
}

/// A provider that changes what a receipt says (its gas used) or a transaction's value.
fn rewritten_history(req: &Value, answer: &mut Value) {
    match req["method"].as_str() {
        Some("eth_getBlockReceipts") => {
            if let Some(first) = answer["result"].get_mut(0) {
                first["gasUsed"] = json!("0x1");
            }
        }
        Some("eth_getBlockByHash") if req["params"][1] == true => {
            if let Some(first) = answer["result"]["transactions"].get_mut(0) {
                first["value"] = json!("0xde0b6b3a7640000");
            }
        }
        _ => {}
    }
}

/// A provider that rewrites history is refused (as the only member) and passed over (beside
/// an honest one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_blocks_and_receipts_are_refused_or_passed_over() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let node = anvil.http_url();
    let hashes = busy_block(&client, &node).await;
    let liar = FakeUpstream::spawn(Fault::Alter { to: node.clone(), alter: rewritten_history }).await;
    let alone = verifying(&liar.url, "[cache]\nenabled = false");
    synced(&client, &alone.sluice.http_url(), &node).await;
    for (method, params) in [
        ("eth_getBlockByNumber", json!(["0x1", true])),
        ("eth_getBlockReceipts", json!(["0x1"])),
        ("eth_getLogs", json!([{ "fromBlock": "0x0", "toBlock": "0x1" }])),
        ("eth_getTransactionReceipt", json!([hashes[1]])),
    ] {
        let answer = rpc(&client, &alone.sluice.http_url(), method, params.clone()).await;
        assert_eq!(answer["error"]["code"], -32002, "{method} {params}: {answer}");
    }
    let both = common::with_config(&format!(
        "[mempool]\nenabled = false\n[cache]\nenabled = false\n[verify]\nenabled = true\n\
         [[upstreams]]\nurl = \"{}\"\nweight = 1000\n[[upstreams]]\nurl = \"{node}\"\n",
        liar.url
    ));
    let url = both.sluice.http_url();
    synced(&client, &url, &node).await;
    let truth = rpc_result(&client, &node, "eth_getTransactionReceipt", json!([hashes[1]])).await;
    let answer = rpc(&client, &url, "eth_getTransactionReceipt", json!([hashes[1]])).await;
    assert_eq!(answer["result"], truth, "{answer}");
}

/// Gives the block's first transaction another hash in full blocks, its fields untouched.
fn forged_hash(req: &Value, answer: &mut Value) {
    if req["method"] == "eth_getBlockByHash" && req["params"][1] == true {
        if let Some(first) = answer["result"]["transactions"].get_mut(0) {
            first["hash"] = json!(format!("0x{}", "ab".repeat(32)));
        }
    }
}

/// A transaction's hash is recomputed from its signed fields, not taken from the node: a
/// block whose transaction names another hash is refused (the transactions root, made from
/// the fields, still holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_named_by_a_forged_hash_is_refused() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let node = anvil.http_url();
    let hashes = busy_block(&client, &node).await;
    let liar = FakeUpstream::spawn(Fault::Alter { to: node.clone(), alter: forged_hash }).await;
    let alone = verifying(&liar.url, "[cache]\nenabled = false");
    let url = alone.sluice.http_url();
    synced(&client, &url, &node).await;
    let answer = rpc(&client, &url, "eth_getBlockByNumber", json!(["0x1", false])).await;
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert_eq!(answer["error"]["data"]["why"], "proof", "{answer}");
    // By now the member is cordoned for its failed proofs: refused all the same.
    let answer = rpc(&client, &url, "eth_getBlockByNumber", json!(["0x1", true])).await;
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    let answer = rpc(&client, &url, "eth_getTransactionByHash", json!([hashes[0]])).await;
    assert_eq!(answer["error"]["code"], -32002, "its block names it by another hash: {answer}");
}

/// A log query over blocks whose headers' blooms rule the filter out costs their headers
/// alone: no receipts fetched, and the node never asked for logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_query_over_blocks_the_bloom_rules_out_fetches_no_receipts() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    let node = anvil.http_url();
    rpc_result(&client, &node, "anvil_mine", json!(["0x28"])).await;
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: node.clone(), delay: std::time::Duration::ZERO, fail_method: None })
            .await;
    let served = verifying(&relay.url, "[cache]\nenabled = false");
    let url = served.sluice.http_url();
    synced(&client, &url, &node).await;
    // An address no block's bloom holds; then no filter at all, over blocks without a log.
    for filter in
        [json!({ "fromBlock": "0x1", "toBlock": "latest", "address": ACCOUNT }), json!({ "fromBlock": "0x1" })]
    {
        let answer = rpc(&client, &url, "eth_getLogs", json!([filter])).await;
        assert_eq!(answer["result"], rpc_result(&client, &node, "eth_getLogs", json!([filter])).await, "{answer}");
    }
    assert_eq!(relay.requests_for("eth_getBlockReceipts"), 0, "no block's bloom holds the address, or any log");
    assert_eq!(relay.requests_for("eth_getLogs"), 0, "the node was never asked for logs");
}
