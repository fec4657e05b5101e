//! The mempool's stateless rules against the node's own: transactions built to sit exactly on
//! either side of each limit (intrinsic gas of calldata, access lists and creation, the EIP-7623
//! calldata floor, the EIP-3860 initcode size, the block gas limit) are sent to a real anvil
//! directly and to sluice in front of another; both must accept and refuse the same ones.

mod common;

use alloy_consensus::TxEip1559;
use alloy_eips::eip2930::{AccessList, AccessListItem};
use alloy_primitives::{Address, Bytes, TxKind, B256, U256};
use common::{fund, BIN};
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{rpc, rpc_result, Anvil, Sluice};

const CHAIN: u64 = 31337;

/// One case: what the transaction carries, and the gas its limit sits at.
struct Case {
    name: String,
    to: Option<Address>,
    input: Vec<u8>,
    access: AccessList,
    gas: u64,
}

fn case(name: &str, to: Option<Address>, input: Vec<u8>, access: AccessList, limit: u64) -> [Case; 2] {
    let at = |gas: u64, side: &str| Case {
        name: format!("{name} at {side} ({gas})"),
        to,
        input: input.clone(),
        access: access.clone(),
        gas,
    };
    [at(limit, "the limit"), at(limit - 1, "the limit - 1")]
}

fn cases(block_gas_limit: u64) -> Vec<Case> {
    let to = Some(Address::repeat_byte(0x42));
    let none = AccessList::default();
    let keys = AccessList(vec![AccessListItem {
        address: Address::repeat_byte(0x43),
        storage_keys: vec![B256::repeat_byte(1), B256::repeat_byte(2)],
    }]);
    let mut all = Vec::new();
    all.extend(case("a plain transfer", to, Vec::new(), none.clone(), 21_000));
    // 100 non-zero bytes: 22,600 by the standard cost, 25,000 by the floor.
    all.extend(case("non-zero calldata (the floor binds)", to, vec![0xab; 100], none.clone(), 25_000));
    // 100 zero bytes: 21,400 by the standard cost, 22,000 by the floor.
    all.extend(case("zero calldata (the floor binds)", to, vec![0; 100], none.clone(), 22_000));
    // 2 non-zero bytes: 21,032 by the standard cost, 21,080 by the floor.
    all.extend(case("a short call (the floor binds)", to, vec![1, 2], none.clone(), 21_080));
    // An access list outweighs the floor: 21,000 + 2,400 + 2 × 1,900 + 16 × 4.
    all.extend(case("an access list", to, vec![7; 4], keys, 27_264));
    // A creation: 53,000 + 4 per zero byte + 2 per initcode word.
    all.extend(case("a creation", None, vec![0; 64], none.clone(), 53_000 + 256 + 4));
    // The initcode size limit (EIP-3860), with the gas to cover it (and the floor's).
    let big = 49_152;
    let gas = |n: u64| (53_000 + 4 * n + 2 * n.div_ceil(32)).max(21_000 + 10 * n);
    all.push(Case {
        name: "initcode at the size limit".into(),
        to: None,
        input: vec![0; big],
        access: none.clone(),
        gas: gas(49_152),
    });
    all.push(Case {
        name: "initcode one byte over".into(),
        to: None,
        input: vec![0; big + 1],
        access: none.clone(),
        gas: gas(49_153),
    });
    // The block gas limit.
    all.push(Case {
        name: "gas at the block limit".into(),
        to,
        input: Vec::new(),
        access: none.clone(),
        gas: block_gas_limit,
    });
    all.push(Case {
        name: "gas over the block limit".into(),
        to,
        input: Vec::new(),
        access: none,
        gas: block_gas_limit + 1,
    });
    all
}

fn signed(wallet: &Wallet, case: &Case) -> String {
    let fees = Fees::default();
    let tx = wallet.sign(TxEip1559 {
        chain_id: CHAIN,
        nonce: 0,
        gas_limit: case.gas,
        max_fee_per_gas: fees.max_fee,
        max_priority_fee_per_gas: fees.tip,
        to: case.to.map_or(TxKind::Create, TxKind::Call),
        value: U256::ZERO,
        access_list: case.access.clone(),
        input: Bytes::from(case.input.clone()),
    });
    tx.hex()
}

/// Each case from a fresh sender (nonce 0) to both; (case, anvil's answer, sluice's answer).
async fn compare(hardfork: &str) -> Vec<(String, Value, Value)> {
    let direct = Anvil::spawn_with(&["--no-mining", "--hardfork", hardfork]);
    let behind = Anvil::spawn_with(&["--no-mining", "--hardfork", hardfork]);
    let sluice = Sluice::serve(BIN, &behind.http_url(), &[]);
    let http = reqwest::Client::new();
    let block = rpc_result(&http, &direct.http_url(), "eth_getBlockByNumber", json!(["latest", false])).await;
    let limit = u64::from_str_radix(block["gasLimit"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let mut answers = Vec::new();
    for (i, case) in cases(limit).into_iter().enumerate() {
        let wallet = Wallet::numbered(7_000 + i as u64, CHAIN);
        for node in [&direct, &behind] {
            fund(&http, node, wallet.address(), "0x3635c9adc5dea00000").await;
        }
        let raw = signed(&wallet, &case);
        let mut by_anvil = rpc(&http, &direct.http_url(), "eth_sendRawTransaction", json!([raw])).await;
        if let Some(hash) = by_anvil["result"].as_str().map(str::to_owned) {
            // anvil's pool takes some transactions its EVM then refuses to include (it checks
            // only the base 21,000 on intake): included in a block is the verdict that counts.
            rpc_result(&http, &direct.http_url(), "evm_mine", json!([])).await;
            let receipt = rpc_result(&http, &direct.http_url(), "eth_getTransactionReceipt", json!([hash])).await;
            if receipt.is_null() {
                by_anvil = json!({"error": {"message": "not included by anvil's EVM"}});
            }
        }
        let by_sluice = rpc(&http, &sluice.http_url(), "eth_sendRawTransaction", json!([raw])).await;
        answers.push((case.name, by_anvil, by_sluice));
    }
    answers
}

fn disagreements(answers: &[(String, Value, Value)]) -> Vec<String> {
    answers
        .iter()
        .filter(|(_, a, s)| a["result"].is_string() != s["result"].is_string())
        .map(|(name, a, s)| format!("{name}: anvil {a}, sluice {s}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_prague_sluice_accepts_and_refuses_what_anvil_does() {
    let answers = compare("prague").await;
    assert!(disagreements(&answers).is_empty(), "{:#?}", disagreements(&answers));
    // Each limit was tested from both sides: one accepted, one refused, per pair.
    let refused: Vec<&String> = answers.iter().filter(|(_, a, _)| a["error"].is_object()).map(|(n, _, _)| n).collect();
    assert_eq!(refused.len(), answers.len() / 2, "refused: {refused:?}");
    let floor = answers.iter().find(|(n, _, _)| n.starts_with("non-zero calldata") && n.contains("- 1")).unwrap();
    assert!(floor.2["error"]["message"].as_str().unwrap().contains("floor data gas"), "{}", floor.2);
}

// Before Prague there is no floor: a transaction below it but above the standard cost is
// accepted by both (sluice reads the fork from the chain's headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_prague_the_calldata_floor_does_not_apply() {
    let answers = compare("cancun").await;
    assert!(disagreements(&answers).is_empty(), "{:#?}", disagreements(&answers));
    let below_floor = answers.iter().find(|(n, _, _)| n.starts_with("non-zero calldata") && n.contains("- 1")).unwrap();
    assert!(below_floor.2["result"].is_string(), "{}", below_floor.2);
}
