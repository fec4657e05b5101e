//! The writer and its published snapshots, driven in process (over the fake fixed chain):
//! whatever mix of gaps, replacements and refusals goes in, every snapshot is consistent.

#[path = "support/fixed_chain.rs"]
mod fixed_chain;

use std::sync::Arc;

use alloy_primitives::{Address, Bytes};
use fixed_chain::FixedChain;
use sluice_bench::txgen::{Fees, Wallet};
use sluice_mempool::{Mempool, MempoolConfig, PoolView, Snapshot, TxIntake, TxSource};
use sluice_upstream::HeadFeed;

fn check(snapshot: &Snapshot) {
    let mut listed = 0;
    for (sender, view) in snapshot.senders.iter() {
        let nonces: Vec<u64> = view.pending.iter().chain(&view.queued).map(|p| p.tx.nonce).collect();
        assert!(nonces.windows(2).all(|w| w[0] < w[1]), "{sender}: nonces ordered");
        for p in view.pending.iter().chain(&view.queued) {
            assert_eq!(&p.tx.sender, sender);
            assert!(snapshot.get(&p.tx.hash).is_some_and(|q| Arc::ptr_eq(p, q)), "listed but not indexed");
            listed += 1;
        }
        if let Some(first) = view.pending.first() {
            assert_eq!(view.pending_nonce, first.tx.nonce + view.pending.len() as u64, "{sender}: pending nonce");
        }
    }
    assert_eq!(listed, snapshot.len(), "counted but not listed");
    let pending: usize = snapshot.senders.values().map(|v| v.pending.len()).sum();
    assert_eq!(snapshot.status.pending, pending);
    assert_eq!(snapshot.status.queued, listed - pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snapshot_is_consistent_through_gaps_replacements_and_refusals() {
    let (feed, _keep) = HeadFeed::fixed(Default::default());
    let config = MempoolConfig { relay: false, ..MempoolConfig::default() };
    let mempool = Mempool::start(config, Arc::new(FixedChain::default()), &feed).await.unwrap();
    let wallets: Vec<Wallet> = (0..20).map(|i| Wallet::numbered(i, 31337)).collect();
    // Phase 1: nonces 0..6, with a gap at 3 for odd senders. Phase 2: replacements of
    // nonce 1 (bumped enough) and nonce 2 (not). Each phase is submitted concurrently.
    let mut originals = Vec::new();
    let mut replacements = Vec::new();
    for (i, w) in wallets.iter().enumerate() {
        for nonce in 0..6u64 {
            if i % 2 == 1 && nonce == 3 {
                continue;
            }
            originals.push(w.transfer(nonce, Address::ZERO, 1, Fees::default()));
        }
        replacements.push(w.transfer(1, Address::ZERO, 2, Fees { max_fee: 30_000_000_000, tip: 2_000_000_000 }));
        replacements.push(w.transfer(2, Address::ZERO, 3, Fees { max_fee: 20_000_000_001, tip: 1_000_000_000 }));
    }
    let readers = {
        let mempool = mempool.clone();
        tokio::spawn(async move {
            for _ in 0..2000 {
                check(&mempool.snapshot());
                tokio::task::yield_now().await;
            }
        })
    };
    let submit_all = |txs: Vec<sluice_bench::txgen::SignedTx>| {
        let mempool = mempool.clone();
        async move {
            let submits = txs.iter().map(|t| mempool.submit(Bytes::from(t.raw.clone()), TxSource::Rpc));
            futures_util::future::join_all(submits).await
        }
    };
    let first = submit_all(originals).await;
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let results = submit_all(replacements).await;
    readers.await.unwrap();
    let refused: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(|e| e.to_string())).collect();
    assert!(refused.iter().all(|e| e == "replacement transaction underpriced"), "{refused:?}");
    assert_eq!(refused.len(), 20, "each sender's underpriced replacement of nonce 2");
    let snapshot = mempool.snapshot();
    check(&snapshot);
    assert_eq!(snapshot.status.pending, 10 * 6 + 10 * 3);
    assert_eq!(snapshot.status.queued, 10 * 2);
    for w in &wallets {
        let view = snapshot.senders.get(&w.address()).expect("the sender is pooled");
        assert_eq!(view.pending[1].tx.max_fee, 30_000_000_000, "nonce 1 replaced");
    }
}
