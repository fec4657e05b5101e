//! Read-your-writes across methods: a client never sees the chain go backwards.
//!
//! The head tracker hears of a new block from its `newHeads` subscription (or a poll), while a
//! client may learn of it sooner from an answer: a receipt from a member that already has the
//! block. A `latest` resolved from the tracker's older view would then end an `eth_getLogs`
//! range before the receipt's block, or answer `eth_blockNumber` below it. So:
//!
//! * **answers teach the head**: every answer that names a block above the served head
//!   ([`sluice_chain::named_block`]) records it in [`Seen`] and nudges the head watcher, which
//!   fetches that block (by hash: one call) and, once it links to the tracked chain, serves it;
//! * **one view per call**: the pipeline takes one [`ChainView`] for each call when it admits
//!   it ([`HeadView::admit`]); a call that resolves `latest` while a block it may have been
//!   shown is above that view waits (bounded by [`HeadConfig::catch_up`](crate::HeadConfig) and
//!   its own deadline) until the view has it. Past the bound the call resolves nothing itself
//!   ([`CallView::Behind`]) and goes as sent to the members at the best head.
//!
//! The decisions are small and pure (above the head or not, expired or not); the waiting is a
//! `watch` wait on the view.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_chain::{may_name_block, named_block, ChainView, NamedBlock};
use sluice_jsonrpc::Outcome;
use tokio::sync::watch;

use crate::{Answer, CallView, Source};

/// The newest block an answer showed a client above the head sluice served at the time, for
/// as long as calls should wait for the tracker to reach it.
pub struct Seen {
    /// The pending block's height, or 0: the fast check on every admitted call.
    above: AtomicU64,
    /// The pending block and until when calls wait for it (written only when an answer names
    /// a block above the head: rare, so a plain mutex).
    pending: Mutex<Option<(u64, Instant)>>,
    /// How long calls wait for the tracker to reach a block they may have been shown.
    hold: Duration,
    /// The newest block to fetch, for the head watcher.
    hint: watch::Sender<Option<NamedBlock>>,
}

impl Seen {
    /// Nothing seen yet; calls wait at most `hold` for a block they may have been shown.
    pub fn new(hold: Duration) -> Self {
        Self { above: AtomicU64::new(0), pending: Mutex::new(None), hold, hint: watch::channel(None).0 }
    }

    /// Records that an answer named `block`, while the served head was `latest`. A block at or
    /// below the head teaches nothing (the common case: one comparison).
    pub fn learn(&self, block: NamedBlock, latest: Option<u64>) {
        // Before the first head there is nothing to be behind of.
        let Some(latest) = latest else { return };
        if block.number <= latest {
            return;
        }
        let now = Instant::now();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.is_some_and(|(n, until)| n >= block.number && until > now) {
                return; // as high a block is being waited for already
            }
            *pending = Some((block.number, now + self.hold));
            self.above.store(block.number, Ordering::Release);
        }
        metrics::counter!("sluice_head_learned_from_answers_total").increment(1);
        self.hint.send_replace(Some(block));
    }

    /// The block a call resolving `latest` must wait for, with `latest` the head of the view it
    /// took, and until when: `None` when the view is not behind anything a client was shown.
    pub fn wait_for(&self, latest: Option<u64>) -> Option<(u64, Instant)> {
        let above = self.above.load(Ordering::Acquire);
        if above == 0 || latest.is_some_and(|latest| latest >= above) {
            return None;
        }
        let pending = *self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.filter(|(n, until)| latest.is_none_or(|latest| *n > latest) && *until > Instant::now())
    }

    /// The blocks the head watcher should fetch: the newest named above the head.
    pub fn hints(&self) -> watch::Receiver<Option<NamedBlock>> {
        self.hint.subscribe()
    }
}

/// A network's head as the pipeline sees it: the view to give each call, and what the
/// answers it relays teach.
#[derive(Clone)]
pub struct HeadView {
    view: watch::Receiver<Arc<ChainView>>,
    seen: Arc<Seen>,
    network: Arc<str>,
}

/// What [`HeadView::admit`] gives a call.
pub enum Admission {
    /// Its view, at once.
    Now(CallView),
    /// Wait (with [`HeadView::catch_up`]) until the view reaches this height, at most until
    /// this instant.
    Wait(u64, Instant),
}

impl HeadView {
    /// The view of a head feed (`view`, `seen`) for the network `network` (its metrics label).
    pub fn new(view: watch::Receiver<Arc<ChainView>>, seen: Arc<Seen>, network: &str) -> Self {
        Self { view, seen, network: Arc::from(network) }
    }

    /// The view for a call (or every call of a body) when it is admitted. `resolves_head`: the
    /// call resolves `latest` (or `pending`, `safe`): only such a call waits for a block a
    /// client may have been shown; every other one takes the view as it is.
    pub fn admit(&self, resolves_head: bool) -> Admission {
        let view = self.view.borrow().clone();
        if resolves_head {
            if let Some((number, until)) = self.seen.wait_for(view.latest().map(|(n, _)| n)) {
                return Admission::Wait(number, until);
            }
        }
        Admission::Now(CallView::Taken(view))
    }

    /// Waits until the view has block `number` (then that view), or until `until` (then
    /// [`CallView::Behind`]: the call resolves no tag itself).
    pub async fn catch_up(&self, number: u64, until: Instant) -> CallView {
        let mut view = self.view.clone();
        let reached = tokio::time::timeout_at(
            until.into(),
            view.wait_for(|v| v.latest().is_some_and(|(latest, _)| latest >= number)),
        )
        .await;
        let (view, outcome) = match reached {
            Ok(Ok(view)) => (CallView::Taken(view.clone()), "caught_up"),
            _ => (CallView::Behind, "timeout"),
        };
        metrics::counter!("sluice_head_catch_up_total", "network" => self.network.to_string(), "outcome" => outcome)
            .increment(1);
        view
    }

    /// Learns from an answer relayed to a client: a block it names above the served head.
    /// Answers from the memory tier, the head tracker or another caller's call taught already.
    pub fn learn(&self, method: &str, answer: &Answer) {
        if !may_name_block(method) || matches!(answer.source, Source::Memory | Source::Local | Source::Coalesced) {
            return;
        }
        let Outcome::Result(result) = &answer.outcome else { return };
        if let Some(block) = named_block(method, result.get()) {
            let latest = self.view.borrow().latest().map(|(n, _)| n);
            self.seen.learn(block, latest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_chain::{HeadTracker, Header};

    fn block(number: u64) -> NamedBlock {
        NamedBlock { number, hash: Some(format!("0x{number:064x}")) }
    }

    fn header(number: u64) -> Header {
        Header::new(number, format!("0x{number:064x}"), format!("0x{:064x}", number.wrapping_sub(1)))
    }

    #[test]
    fn only_a_block_above_the_head_is_waited_for_and_only_until_the_hold_ends() {
        let seen = Seen::new(Duration::from_millis(50));
        let mut hints = seen.hints();
        seen.learn(block(10), Some(10));
        assert_eq!(seen.wait_for(Some(10)), None, "at the head: nothing to wait for");
        assert!(!hints.has_changed().unwrap(), "and nothing to fetch");
        seen.learn(block(11), None);
        assert_eq!(seen.wait_for(Some(10)), None, "before the first head nothing is learned");
        seen.learn(block(12), Some(10));
        assert_eq!(seen.wait_for(Some(10)).map(|(n, _)| n), Some(12));
        assert_eq!(seen.wait_for(Some(12)), None, "a view that has it waits for nothing");
        assert_eq!(hints.borrow_and_update().as_ref().map(|b| b.number), Some(12));
        seen.learn(block(11), Some(10));
        assert_eq!(seen.wait_for(Some(10)).map(|(n, _)| n), Some(12), "a lower block does not lower the floor");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(seen.wait_for(Some(10)), None, "past the hold a call no longer waits");
        seen.learn(block(11), Some(10));
        assert_eq!(seen.wait_for(Some(10)).map(|(n, _)| n), Some(11), "after it, a new block is waited for");
    }

    #[tokio::test]
    async fn a_call_waits_for_the_view_to_reach_a_block_an_answer_named() {
        let mut tracker = HeadTracker::new(16);
        tracker.feed(header(10));
        let (tx, rx) = watch::channel(Arc::new(tracker.view()));
        let seen = Arc::new(Seen::new(Duration::from_secs(5)));
        let head = HeadView::new(rx, seen.clone(), "test");
        let receipt = format!(r#"{{"blockNumber":"0xb","blockHash":"0x{:064x}"}}"#, 11);
        let answer = Answer::upstream(Outcome::result(serde_json::value::RawValue::from_string(receipt).unwrap()));
        head.learn("eth_getTransactionReceipt", &answer);
        assert!(matches!(head.admit(false), Admission::Now(_)), "a call that resolves no tag never waits");
        let Admission::Wait(number, until) = head.admit(true) else { panic!("a head read waits for block 11") };
        assert_eq!(number, 11);
        let waiting = tokio::spawn({
            let head = head.clone();
            async move { head.catch_up(number, until).await }
        });
        tracker.feed(header(11));
        tx.send_replace(Arc::new(tracker.view()));
        match waiting.await.unwrap() {
            CallView::Taken(view) => assert_eq!(view.latest().map(|(n, _)| n), Some(11)),
            other => panic!("caught up, not {other:?}"),
        }
        assert!(matches!(head.admit(true), Admission::Now(_)), "the view has it now");
    }

    #[tokio::test]
    async fn a_view_that_never_catches_up_leaves_the_call_to_the_node() {
        let mut tracker = HeadTracker::new(16);
        tracker.feed(header(10));
        let (_tx, rx) = watch::channel(Arc::new(tracker.view()));
        let head = HeadView::new(rx, Arc::new(Seen::new(Duration::from_millis(30))), "test");
        let answer = Answer {
            outcome: Outcome::result(serde_json::value::RawValue::from_string(r#""0xc""#.into()).unwrap()),
            source: Source::Upstream,
        };
        head.learn("eth_blockNumber", &answer);
        let Admission::Wait(number, until) = head.admit(true) else { panic!("waits for block 12") };
        assert!(matches!(head.catch_up(number, until).await, CallView::Behind));
        // A cached answer teaches nothing: it was learned from when it was fetched.
        let cached = Answer { source: Source::Memory, ..answer };
        let head = HeadView::new(head.view.clone(), Arc::new(Seen::new(Duration::from_secs(5))), "test");
        head.learn("eth_blockNumber", &cached);
        assert!(matches!(head.admit(true), Admission::Now(_)));
    }
}
