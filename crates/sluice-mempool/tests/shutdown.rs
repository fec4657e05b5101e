//! The mempool owns its tasks and threads and stops them: after `shutdown` nothing holds it,
//! the journal is closed (another start on it succeeds and replays what was acknowledged), and
//! submissions are refused as unavailable. Over the fake fixed chain (no node needed).

#[path = "support/fixed_chain.rs"]
mod fixed_chain;

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, Bytes};
use fixed_chain::FixedChain;
use sluice_bench::txgen::{Fees, Wallet};
use sluice_mempool::{Mempool, MempoolConfig, PoolView, SubmitError, TxIntake, TxSource};
use sluice_upstream::HeadFeed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_task_and_thread_and_releases_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("pool.journal");
    let (feed, _keep) = HeadFeed::fixed(Default::default());
    let config = MempoolConfig { journal: Some(journal.clone()), relay: true, ..MempoolConfig::default() };
    let chain = Arc::new(FixedChain::default());
    let mempool = Mempool::start(config.clone(), chain.clone(), &feed).await.unwrap();
    let wallet = Wallet::numbered(1, 31337);
    let txs: Vec<_> = (0..100).map(|n| wallet.transfer(n, Address::ZERO, 1, Fees::default())).collect();
    for tx in &txs {
        mempool.submit(Bytes::from(tx.raw.clone()), TxSource::Rpc).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(10), mempool.shutdown()).await.expect("shutdown ends");
    assert_eq!(Arc::strong_count(&mempool), 1, "no task of the mempool still holds it");
    let late = wallet.transfer(100, Address::ZERO, 1, Fees::default());
    let refused = mempool.submit(Bytes::from(late.raw.clone()), TxSource::Rpc).await;
    assert!(matches!(refused, Err(SubmitError::Unavailable(_))), "{refused:?}");
    assert_eq!(mempool.snapshot().len(), 100, "reads keep the last snapshot");
    // The journal is closed and unlocked: a new mempool opens it and gets all 100 back.
    let again = Mempool::start(config, chain, &feed).await.expect("the journal is free again");
    assert_eq!(again.snapshot().len(), 100);
    again.shutdown().await;
}
