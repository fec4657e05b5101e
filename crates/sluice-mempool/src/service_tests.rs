//! Readers never wait for the writer (seed 001's lesson): with the writer held inside a batch,
//! pool reads through the JSON-RPC layer keep answering from the published snapshot.

#[path = "../tests/support/fixed_chain.rs"]
mod fixed_chain;

use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, Bytes};
use fixed_chain::FixedChain;
use serde_json::value::RawValue;
use sluice_bench::txgen::{Fees, Wallet};
use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_upstream::{Answer, Call, HeadFeed, Upstreams};

use super::*;
use crate::MempoolLayer;

fn call(method: &str, params: String) -> Call {
    let params = RawValue::from_string(params).ok();
    Call::internal_request(Request::new(Some(Id::number(1)), method, params))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_while_the_writer_is_held_inside_a_batch() {
    let (feed, _keep) = HeadFeed::fixed(Default::default());
    let config = MempoolConfig { relay: false, ..MempoolConfig::default() };
    let mempool = Mempool::start(config, Arc::new(FixedChain::default()), &feed).await.unwrap();
    let wallets: Vec<Wallet> = (0..20).map(|i| Wallet::numbered(500 + i, 31337)).collect();
    let mut pooled = Vec::new();
    for w in &wallets {
        for nonce in 0..10 {
            let tx = w.transfer(nonce, Address::ZERO, 1, Fees::default());
            mempool.submit(Bytes::from(tx.raw.clone()), TxSource::Rpc).await.unwrap();
            pooled.push((w.address(), tx.hash));
        }
    }
    let layer = MempoolLayer::new(Arc::new(FixedChain::default()), mempool.clone());
    // Hold the writer inside a batch; a submission now waits behind it.
    let (release, held) = std::sync::mpsc::channel();
    let (entered, inside) = oneshot::channel();
    mempool.core.commands.send(Command::Hold { entered, release: held }).unwrap();
    inside.await.unwrap();
    let late = wallets[0].transfer(10, Address::ZERO, 1, Fees::default());
    let waiting = {
        let mempool = mempool.clone();
        tokio::spawn(async move { mempool.submit(Bytes::from(late.raw.clone()), TxSource::Rpc).await })
    };
    let mut times = Vec::new();
    for (i, (sender, hash)) in pooled.iter().cycle().take(300).enumerate() {
        let calls = [
            call("eth_getTransactionByHash", format!(r#"["{hash}"]"#)),
            call("eth_getTransactionCount", format!(r#"["{sender}","pending"]"#)),
            call("txpool_status", "[]".into()),
        ];
        for c in &calls {
            let started = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(5), layer.call(c)).await.expect("a read never waits");
            times.push(started.elapsed());
            let Ok(Answer { outcome: Outcome::Result(raw), .. }) = answer else { panic!("{i}: {answer:?}") };
            match c.method() {
                "eth_getTransactionByHash" => assert!(raw.get().contains(&format!("{hash}")), "{}", raw.get()),
                "eth_getTransactionCount" => assert_eq!(raw.get(), r#""0xa""#),
                _ => assert!(raw.get().contains(r#""pending":"0xc8""#), "{}", raw.get()),
            }
        }
    }
    assert!(!waiting.is_finished(), "the writer was held while every read answered");
    times.sort();
    let p99 = times[times.len() * 99 / 100];
    assert!(p99 < Duration::from_millis(5), "p99 of {} reads with the writer held: {p99:?}", times.len());
    release.send(()).unwrap();
    assert!(waiting.await.unwrap().is_ok(), "the held submission goes through once the writer is released");
}

// A transaction sent again (peers forward each one several times, clients retry) hears its
// hash: found by the verifier from the hash decoding computes, before any recovery; and when the
// intake is full, looked up before the caller would hear busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_transaction_sent_again_hears_its_hash_also_when_the_intake_is_full() {
    let (feed, _keep) = HeadFeed::fixed(Default::default());
    let config = MempoolConfig { relay: false, max_inflight: 1, ..MempoolConfig::default() };
    let mempool = Mempool::start(config, Arc::new(FixedChain::default()), &feed).await.unwrap();
    let wallet = Wallet::numbered(900, 31337);
    let tx = wallet.transfer(0, Address::ZERO, 1, Fees::default());
    let raw = Bytes::from(tx.raw.clone());
    assert_eq!(mempool.submit(raw.clone(), TxSource::Rpc).await, Ok(tx.hash));
    assert_eq!(mempool.submit(raw.clone(), TxSource::Peer).await, Ok(tx.hash), "again, from a peer");
    assert_eq!(mempool.snapshot().len(), 1);
    // The intake full: its one place held by a submission waiting behind the held writer.
    let (release, held) = std::sync::mpsc::channel();
    let (entered, inside) = oneshot::channel();
    mempool.core.commands.send(Command::Hold { entered, release: held }).unwrap();
    inside.await.unwrap();
    let next = wallet.transfer(1, Address::ZERO, 1, Fees::default());
    let waiting = {
        let mempool = mempool.clone();
        tokio::spawn(async move { mempool.submit(Bytes::from(next.raw.clone()), TxSource::Rpc).await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while mempool.core.inflight.available_permits() > 0 {
        assert!(Instant::now() < deadline, "the waiting submission takes the intake's one place");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let other = wallet.transfer(2, Address::ZERO, 1, Fees::default());
    assert_eq!(mempool.submit(Bytes::from(other.raw.clone()), TxSource::Rpc).await, Err(SubmitError::Busy));
    assert_eq!(mempool.submit(raw, TxSource::Rpc).await, Ok(tx.hash), "the pooled one: its hash, not busy");
    release.send(()).unwrap();
    assert!(waiting.await.unwrap().is_ok());
}
