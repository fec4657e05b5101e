//! Account state (nonce and balance) at the head, fetched from the upstreams in batches and
//! cached per head.
//!
//! Submitters ask for their sender's state; concurrent misses are gathered by one task into a
//! single JSON-RPC batch (`eth_getTransactionCount` + `eth_getBalance` per address), so a
//! burst of new senders costs one round trip, not one per transaction. The cache holds the
//! states read at one head: a new head (or a reorg) empties it at once.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use alloy_primitives::map::AddressMap;
use alloy_primitives::{Address, U256};
use sluice_jsonrpc::Outcome;
use sluice_upstream::{Answer, Call, Upstreams};
use tokio::sync::{mpsc, oneshot, watch};

/// An account's nonce and balance at the head.
pub type AccountState = (u64, U256);

type Waiter = oneshot::Sender<Result<AccountState, String>>;

/// Most addresses per upstream batch.
const MAX_ADDRESSES: usize = 256;

/// Most states cached at one head; a full cache is emptied and fills again.
const MAX_CACHED: usize = 1 << 20;

/// The states read at one head, identified by its height and the chain view's epoch (which a
/// reorg moves).
///
/// A map behind a lock held only for one lookup or insert, where a general cache (moka) was:
/// its bookkeeping (the access order and its queues) took about a sixth of the async workers'
/// CPU samples under load (`perf record` during `cargo bench -p sluice-pool --bench mempool`),
/// and with every entry dead at the next head, nothing needs an eviction order.
#[derive(Default)]
struct HeadStates {
    head: (u64, u64),
    states: AddressMap<AccountState>,
}

impl HeadStates {
    /// The states of `head`: emptied when it is another head than the one cached.
    fn at(&mut self, head: (u64, u64)) -> &mut AddressMap<AccountState> {
        if self.head != head {
            self.head = head;
            self.states.clear();
        }
        &mut self.states
    }
}

/// The fetcher's handle.
#[derive(Clone)]
pub struct StateReader {
    requests: mpsc::Sender<(Address, Waiter)>,
    cache: Arc<Mutex<HeadStates>>,
    head: watch::Receiver<Arc<sluice_chain::ChainView>>,
}

impl StateReader {
    /// Starts the fetching task on `upstream`; `head` tells which head the cache is for.
    pub fn spawn(
        upstream: Arc<dyn Upstreams>,
        head: watch::Receiver<Arc<sluice_chain::ChainView>>,
        timeout: Duration,
    ) -> Self {
        let (requests, rx) = mpsc::channel(65_536);
        let cache = Arc::default();
        tokio::spawn(fetch_loop(upstream, rx, timeout));
        Self { requests, cache, head }
    }

    /// The current head's key: height and reorg epoch (a reorg back to the same height is
    /// another head).
    fn head(&self) -> (u64, u64) {
        let view = self.head.borrow();
        (view.latest().map_or(0, |(n, _)| n), view.epoch)
    }

    /// The sender's state at the current head when it was read already (no waiting).
    pub fn cached(&self, address: Address) -> Option<AccountState> {
        self.cached_states().get(address)
    }

    /// The states read already at the current head, for several lookups under one lock (the
    /// intake looks up a verifier turn's senders at once).
    pub fn cached_states(&self) -> CachedStates<'_> {
        let head = self.head();
        CachedStates { states: self.cache.lock().unwrap_or_else(PoisonError::into_inner), head }
    }

    /// The sender's state at the current head.
    pub async fn get(&self, address: Address) -> Result<AccountState, String> {
        let head = self.head();
        if let Some(state) = self.cached(address) {
            return Ok(state);
        }
        let (tx, rx) = oneshot::channel();
        self.requests.send((address, tx)).await.map_err(|_| "account state reader stopped".to_owned())?;
        let state = rx.await.map_err(|_| "account state reader stopped".to_owned())??;
        // Kept only while its head is still the head: a state read for an older head is dead.
        if self.head() == head {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            let states = cache.at(head);
            if states.len() >= MAX_CACHED {
                states.clear();
            }
            states.insert(address, state);
        }
        Ok(state)
    }

    /// Several senders' states at once (one upstream batch for all the misses).
    pub async fn get_many(&self, addresses: &[Address]) -> Vec<Result<AccountState, String>> {
        futures_util::future::join_all(addresses.iter().map(|a| self.get(*a))).await
    }
}

/// The states cached at one head, locked (see [`StateReader::cached_states`]).
pub struct CachedStates<'a> {
    states: MutexGuard<'a, HeadStates>,
    head: (u64, u64),
}

impl CachedStates<'_> {
    /// The sender's state, if it was read at this head.
    pub fn get(&mut self, address: Address) -> Option<AccountState> {
        self.states.at(self.head).get(&address).copied()
    }
}

async fn fetch_loop(upstream: Arc<dyn Upstreams>, mut rx: mpsc::Receiver<(Address, Waiter)>, timeout: Duration) {
    let mut batch = Vec::with_capacity(MAX_ADDRESSES);
    while rx.recv_many(&mut batch, MAX_ADDRESSES).await > 0 {
        let waiters = std::mem::take(&mut batch);
        let upstream = upstream.clone();
        // Each batch in its own task: a slow node must not hold up the next batch.
        tokio::spawn(async move {
            let addresses: Vec<Address> = waiters.iter().map(|(a, _)| *a).collect();
            let answers = tokio::time::timeout(timeout, fetch(upstream.as_ref(), &addresses)).await;
            let answers = match answers {
                Ok(answers) => answers,
                Err(_) => vec![Err("timed out reading account state from the upstream".to_owned()); addresses.len()],
            };
            for ((_, waiter), answer) in waiters.into_iter().zip(answers) {
                let _ = waiter.send(answer);
            }
        });
    }
}

/// One JSON-RPC batch: nonce and balance of each address at `latest`.
async fn fetch(upstream: &dyn Upstreams, addresses: &[Address]) -> Vec<Result<AccountState, String>> {
    let mut requests = Vec::with_capacity(addresses.len() * 2);
    for address in addresses {
        let params = format!(r#"["{address}","latest"]"#);
        requests.push(Call::internal("eth_getTransactionCount", Some(&params)));
        requests.push(Call::internal("eth_getBalance", Some(&params)));
    }
    let refs: Vec<&Call> = requests.iter().collect();
    let answers = upstream.call_batch(&refs).await;
    let mut out = Vec::with_capacity(addresses.len());
    let mut answers = answers.into_iter();
    while let (Some(nonce), Some(balance)) = (answers.next(), answers.next()) {
        out.push(match (quantity(nonce), quantity(balance)) {
            (Ok(n), Ok(b)) => u64::try_from(n).map(|n| (n, b)).map_err(|_| "nonce out of range".to_owned()),
            (Err(e), _) | (_, Err(e)) => Err(e),
        });
    }
    out.resize(addresses.len(), Err("the upstream answered too few calls".to_owned()));
    out
}

fn quantity(answer: Result<Answer, sluice_upstream::UpstreamError>) -> Result<U256, String> {
    match answer {
        Ok(Answer { outcome: Outcome::Result(raw), .. }) => {
            let text: String = serde_json::from_str(raw.get()).map_err(|_| "not a quantity".to_owned())?;
            let digits = text.strip_prefix("0x").ok_or("not a quantity")?;
            U256::from_str_radix(digits, 16).map_err(|_| "not a quantity".to_owned())
        }
        Ok(Answer { outcome: Outcome::Error(raw), .. }) => Err(format!("upstream error: {}", raw.get())),
        Err(e) => Err(e.to_string()),
    }
}
