//! Account state (nonce and balance) at the head, read from the upstreams in batches and
//! cached per head.
//!
//! The intake asks for a whole verifier turn's senders at once ([`StateReader::get_many`]):
//! those not read yet at this head go to the upstream as one JSON-RPC batch
//! (`eth_getTransactionCount` + `eth_getBalance` per address), so a burst of new senders costs
//! one round trip, not one per transaction. The cache holds the states read at one head: a new
//! head (or a reorg) empties it at once.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use alloy_primitives::map::AddressMap;
use alloy_primitives::{Address, U256};
use serde_json::value::RawValue;
use sluice_chain::BlockNeed;
use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_upstream::{Answer, Call, Upstreams};
use tokio::sync::watch;

/// An account's nonce and balance at the head.
pub type AccountState = (u64, U256);

/// Most addresses per upstream batch.
const MAX_ADDRESSES: usize = 256;

/// Most states cached at one head; a full cache is emptied and fills again.
const MAX_CACHED: usize = 1 << 20;

/// The states read at one head, identified by its height and the chain view's epoch (which a
/// reorg moves).
///
/// A map behind a lock held only for one lookup or insert, where a general cache (moka) was:
/// its bookkeeping (the access order and its queues) took about a sixth of the async workers'
/// CPU samples under load (`perf record` during `cargo bench -p sluice-mempool --bench mempool`),
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

/// Reads account state through the upstreams, cached for the current head.
#[derive(Clone)]
pub struct StateReader {
    upstream: Arc<dyn Upstreams>,
    cache: Arc<Mutex<HeadStates>>,
    head: watch::Receiver<Arc<sluice_chain::ChainView>>,
    timeout: Duration,
}

impl StateReader {
    /// A reader through `upstream`; `head` tells which head the cache is for, and a batch not
    /// answered within `timeout` is answered as unavailable.
    pub fn new(
        upstream: Arc<dyn Upstreams>,
        head: watch::Receiver<Arc<sluice_chain::ChainView>>,
        timeout: Duration,
    ) -> Self {
        Self { upstream, cache: Arc::default(), head, timeout }
    }

    /// The newest header the head feed has (what a block that mined no pooled transaction
    /// needs to be applied from, without fetching it).
    pub(crate) fn tip(&self) -> Option<Arc<sluice_chain::Header>> {
        self.head.borrow().tip.clone()
    }

    /// The current head's key: height and reorg epoch (a reorg back to the same height is
    /// another head).
    fn head(&self) -> (u64, u64) {
        let view = self.head.borrow();
        (view.latest().map_or(0, |(n, _)| n), view.epoch)
    }

    /// The states read already at the current head, for several lookups under one lock (the
    /// intake looks up a verifier turn's senders at once).
    pub fn cached_states(&self) -> CachedStates<'_> {
        let head = self.head();
        CachedStates { states: self.cache.lock().unwrap_or_else(PoisonError::into_inner), head }
    }

    /// Several senders' states at the current head, in the order given: those read already
    /// from the cache, the others in upstream batches of at most [`MAX_ADDRESSES`], sent
    /// together.
    ///
    /// The intake's turns already gather their senders, so the misses go straight to the
    /// upstream from here: a task that gathered every address into batches (one channel
    /// message and one answer channel per address) took more of the async workers' CPU than
    /// the batch it sent, with 20,000 senders of one transaction each (docs/mempool.md).
    pub async fn get_many(&self, addresses: &[Address]) -> Vec<Result<AccountState, String>> {
        let head = self.head();
        let mut out: Vec<Option<Result<AccountState, String>>> = {
            let mut states = self.cached_states();
            addresses.iter().map(|a| states.get(*a).map(Ok)).collect()
        };
        let mut missing: Vec<Address> =
            addresses.iter().zip(&out).filter(|(_, state)| state.is_none()).map(|(a, _)| *a).collect();
        if missing.is_empty() {
            return out.into_iter().flatten().collect();
        }
        missing.sort_unstable();
        missing.dedup();
        let batches = missing.chunks(MAX_ADDRESSES).map(|chunk| async move {
            match tokio::time::timeout(self.timeout, fetch(self.upstream.as_ref(), chunk)).await {
                Ok(answers) => answers,
                Err(_) => vec![Err("timed out reading account state from the upstream".to_owned()); chunk.len()],
            }
        });
        let read: Vec<Result<AccountState, String>> =
            futures_util::future::join_all(batches).await.into_iter().flatten().collect();
        // Kept only while their head is still the head: a state read for an older head is dead.
        if self.head() == head {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            let states = cache.at(head);
            if states.len() + missing.len() > MAX_CACHED {
                states.clear();
            }
            for (address, state) in missing.iter().zip(&read) {
                if let Ok(state) = state {
                    states.insert(*address, *state);
                }
            }
        }
        for (address, state) in addresses.iter().zip(out.iter_mut()) {
            if state.is_none() {
                *state = missing.binary_search(address).ok().and_then(|i| read.get(i).cloned());
            }
        }
        out.into_iter().map(|s| s.unwrap_or_else(|| Err("no account state read".to_owned()))).collect()
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

/// One JSON-RPC batch: nonce and balance of each address at `latest`.
async fn fetch(upstream: &dyn Upstreams, addresses: &[Address]) -> Vec<Result<AccountState, String>> {
    let mut requests = Vec::with_capacity(addresses.len() * 2);
    for address in addresses {
        // Both calls share the params, whose need (the head) is known.
        let params = params(address);
        let call = |method: &'static str, params| {
            Call::internal_needing(Request::new(Some(Id::number(1)), method, Some(params)), BlockNeed::Head)
        };
        requests.push(call("eth_getTransactionCount", params.clone()));
        requests.push(call("eth_getBalance", params));
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

/// `["0x<address>","latest"]`, in lower-case hex (the checksummed form, `{address}`, hashes
/// each address with keccak) and built at its exact size (formatted, the text was reallocated
/// to fit when boxed).
fn params(address: &Address) -> Box<RawValue> {
    let mut text = *br#"["0x0000000000000000000000000000000000000000","latest"]"#;
    alloy_primitives::hex::encode_to_slice(address, &mut text[4..44]).expect("20 bytes fill 40 digits");
    let text = std::str::from_utf8(&text).expect("hex digits are ASCII");
    RawValue::from_string(text.to_owned()).expect("an address in hex is JSON")
}

/// A quantity answered by the upstream: a JSON string `"0x…"` of hex digits. Read from the
/// answer's text as it is, since a quantity has nothing to unescape (an escaped one is refused).
fn quantity(answer: Result<Answer, sluice_upstream::UpstreamError>) -> Result<U256, String> {
    match answer {
        Ok(Answer { outcome: Outcome::Result(raw), .. }) => {
            let digits = raw.get().strip_prefix("\"0x").and_then(|t| t.strip_suffix('"')).ok_or("not a quantity")?;
            U256::from_str_radix(digits, 16).map_err(|_| "not a quantity".to_owned())
        }
        Ok(Answer { outcome: Outcome::Error(raw), .. }) => Err(format!("upstream error: {}", raw.get())),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use sluice_upstream::{HeadFeed, UpstreamError};

    use super::*;

    /// A FAKE upstream, named as such: answers each address's nonce as its first byte and
    /// counts the batches and calls it is sent; refuses addresses not in lower-case hex.
    #[derive(Default)]
    struct CountingChain {
        batches: AtomicUsize,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Upstreams for CountingChain {
        async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let params: (String, String) =
                serde_json::from_str(call.req.params.as_ref().map_or("null", |p| p.get())).expect("two params");
            assert_eq!(params.0, params.0.to_lowercase(), "addresses go in lower case (no checksum to compute)");
            let address: Address = params.0.parse().expect("an address");
            let result = match call.req.method.as_str() {
                "eth_getTransactionCount" => format!(r#""{:#x}""#, address[19]),
                _ => r#""0x64""#.to_owned(),
            };
            Ok(Answer::upstream(Outcome::result(RawValue::from_string(result).expect("JSON"))))
        }

        async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
            self.batches.fetch_add(1, Ordering::Relaxed);
            futures_util::future::join_all(calls.iter().map(|c| self.call(c))).await
        }
    }

    // The params built at their exact size are what formatting gives; a quantity is read from
    // the answer's text, and what is not a quoted hex quantity is refused.
    #[test]
    fn params_and_quantities_are_read_as_json_has_them() {
        let address = Address::repeat_byte(0xab);
        assert_eq!(params(&address).get(), format!(r#"["{address:#x}","latest"]"#));
        let answer =
            |text: &str| Ok(Answer::upstream(Outcome::result(RawValue::from_string(text.into()).expect("JSON"))));
        assert_eq!(quantity(answer(r#""0x1bc16d674ec80000""#)), Ok(U256::from(2_000_000_000_000_000_000_u128)));
        for refused in ["27", r#""27""#, r#""0xzz""#, "null", r#"{"0x1":1}"#] {
            assert!(quantity(answer(refused)).is_err(), "{refused}");
        }
    }

    // A turn's senders, repeated and in any order, each get their own state; what is missing
    // goes in batches of at most MAX_ADDRESSES addresses, each address once; what was read is
    // not read again at the same head, and is read again at the next one.
    #[tokio::test]
    async fn states_come_in_order_from_batches_then_from_the_cache() {
        let chain = Arc::new(CountingChain::default());
        let (feed, head) = HeadFeed::fixed(Default::default());
        let reader = StateReader::new(chain.clone(), feed.view.clone(), Duration::from_secs(5));
        let distinct: Vec<Address> = (0..600u32).map(|i| Address::left_padding_from(&i.to_be_bytes())).rev().collect();
        let mut asked = distinct.clone();
        asked.extend(distinct.iter().step_by(7).copied());
        let states = reader.get_many(&asked).await;
        assert_eq!(states.len(), asked.len());
        for (address, state) in asked.iter().zip(&states) {
            assert_eq!(state.as_ref().ok(), Some(&(u64::from(address[19]), U256::from(100))), "{address}");
        }
        assert_eq!(chain.batches.load(Ordering::Relaxed), 600_usize.div_ceil(MAX_ADDRESSES));
        assert_eq!(chain.calls.load(Ordering::Relaxed), 2 * 600, "each address read once");

        let again = reader.get_many(&asked[..10]).await;
        assert!(again.iter().all(Result::is_ok));
        assert_eq!(chain.calls.load(Ordering::Relaxed), 2 * 600, "read already at this head");

        let mut view = sluice_chain::ChainView::default();
        view.epoch += 1;
        head.send(Arc::new(view)).expect("the reader follows the head");
        reader.get_many(&asked[..10]).await;
        assert_eq!(chain.calls.load(Ordering::Relaxed), 2 * 610, "a new head reads again");
    }
}
