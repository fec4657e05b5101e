//! The aggregation layer: gathers eligible `eth_call`s per block and sends each group as one
//! `aggregate3` call; answers callers from it, or from direct calls where it cannot be exact.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use alloy_primitives::hex;
use async_trait::async_trait;
use futures_util::future::join_all;
use serde_json::value::RawValue;
use sluice_chain::ChainEvent;
use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_upstream::{Answer, Call, Source, UpstreamError, Upstreams};
use tokio::sync::{broadcast, oneshot, watch};

use crate::abi::{self, Inner, Subcall, MULTICALL3};
use crate::{eligible, AggregateConfig};

/// Most call data in one aggregate: a group this large leaves at once.
const MAX_GROUP_BYTES: usize = 96 * 1024;
/// After a failed look-up of Multicall3's code, how long calls go direct before the next.
const RECHECK_AFTER: Duration = Duration::from_secs(5);
/// The longest an eligible call waits for a look-up in flight (one round trip, usually) before
/// it goes direct.
const LOOK_UP_WAIT: Duration = Duration::from_secs(2);

/// What is known of Multicall3's code on this network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// Not looked up yet (or a reorg made the answer stale); after a failed look-up, not
    /// before `retry_at`.
    Unknown { retry_at: Option<Instant> },
    /// A look-up is in flight.
    Checking,
    /// The code is there: eligible calls are aggregated.
    Present,
    /// No code: every call goes direct.
    Absent,
}

struct Waiting {
    target: Subcall,
    call: Call,
    answer: oneshot::Sender<Result<Answer, UpstreamError>>,
}

struct Group {
    id: u64,
    waiting: Vec<Waiting>,
    bytes: usize,
}

struct Shared {
    inner: Arc<dyn Upstreams>,
    config: AggregateConfig,
    network: String,
    /// Watched, so that the calls that meet a look-up in flight wait for its answer.
    presence: watch::Sender<Presence>,
    /// Groups filling up, by the block parameter's text.
    groups: Mutex<HashMap<Option<String>, Group>>,
    next_group: AtomicU64,
    /// `sluice_aggregate_calls_total` by outcome, in the order of [`OUTCOMES`].
    calls: [metrics::Counter; OUTCOMES.len()],
    batches: metrics::Counter,
    /// `sluice_aggregate_groups`: groups filling now (each lives one window at most).
    filling: metrics::Gauge,
}

/// Multicall3 aggregation of `eth_call`, as a layer of the request path (see the crate docs).
pub struct AggregateLayer {
    shared: Arc<Shared>,
}

impl AggregateLayer {
    /// Aggregates calls to `inner` on network `network` (for the metrics' labels).
    pub fn new(inner: Arc<dyn Upstreams>, config: AggregateConfig, network: &str) -> Self {
        // Registered once (and at zero, for dashboards): the request path only increments them.
        let calls = OUTCOMES.map(|outcome| {
            let counter =
                metrics::counter!("sluice_aggregate_calls_total", "network" => network.to_owned(), "outcome" => outcome);
            counter.increment(0);
            counter
        });
        let batches = metrics::counter!("sluice_aggregate_batches_total", "network" => network.to_owned());
        batches.increment(0);
        let shared = Arc::new(Shared {
            inner,
            config,
            network: network.to_owned(),
            presence: watch::Sender::new(Presence::Unknown { retry_at: None }),
            groups: Mutex::new(HashMap::new()),
            next_group: AtomicU64::new(0),
            calls,
            batches,
            filling: metrics::gauge!("sluice_aggregate_groups", "network" => network.to_owned()),
        });
        Self { shared }
    }

    /// Looks Multicall3's code up again after every reorg (a reorg can remove a deployment).
    pub fn watch_reorgs(&self, mut events: broadcast::Receiver<ChainEvent>) {
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let event = events.recv().await;
                let Some(shared) = shared.upgrade() else { return };
                match event {
                    Ok(ChainEvent::NewHead(_)) => {}
                    Ok(ChainEvent::Reorg { .. }) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        shared.presence.send_replace(Presence::Unknown { retry_at: None });
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }
}

/// The outcomes calls are counted by.
const OUTCOMES: [&str; 6] = [
    // answered from an aggregate
    "aggregated",
    // failed inside the aggregate (revert, out of gas): made again directly
    "failed_inside",
    // the aggregate gave no usable answer: made directly
    "fallback",
    // no other call to the same block within the window: made directly
    "alone",
    // not representable exactly (sender, value, gas, overrides, …)
    "ineligible",
    // Multicall3's code is not known to be on this network
    "no_multicall",
];

impl Shared {
    fn count(&self, outcome: &'static str, n: usize) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.calls[i].increment(n as u64);
        }
    }

    /// Whether Multicall3 is known to be here. Nobody knows: the call starts a look-up; one is
    /// in flight: the call waits for it (at most [`LOOK_UP_WAIT`]), so that the first burst of
    /// calls after a start or a reorg is aggregated too instead of all going direct.
    async fn multicall_present(self: &Arc<Self>) -> bool {
        // Known (every call once the look-up answered): a read, nothing else.
        match *self.presence.borrow() {
            Presence::Present => return true,
            Presence::Absent => return false,
            Presence::Unknown { retry_at: Some(at) } if Instant::now() < at => return false,
            Presence::Unknown { .. } | Presence::Checking => {}
        }
        let mut started = false;
        self.presence.send_if_modified(|presence| match *presence {
            Presence::Unknown { retry_at } if retry_at.is_none_or(|at| Instant::now() >= at) => {
                *presence = Presence::Checking;
                started = true;
                true
            }
            _ => false,
        });
        if started {
            tokio::spawn(self.clone().look_up());
        }
        let mut presence = self.presence.subscribe();
        let known = tokio::time::timeout(LOOK_UP_WAIT, presence.wait_for(|p| *p != Presence::Checking)).await;
        matches!(known, Ok(Ok(p)) if *p == Presence::Present)
    }

    async fn look_up(self: Arc<Self>) {
        let params = format!(r#"["{MULTICALL3:#x}","latest"]"#);
        let mut call = Call::internal("eth_getCode", Some(&params));
        call.ctx.network = Arc::from(self.network.as_str());
        let found = match self.inner.call(&call).await {
            Ok(Answer { outcome: Outcome::Result(code), .. }) => {
                let present = code.get().trim_matches('"').len() > 2;
                tracing::info!(network = %self.network, present, "Multicall3 code looked up");
                metrics::gauge!("sluice_aggregate_multicall_present", "network" => self.network.clone())
                    .set(present as u8 as f64);
                if present {
                    Presence::Present
                } else {
                    Presence::Absent
                }
            }
            _ => Presence::Unknown { retry_at: Some(Instant::now() + RECHECK_AFTER) },
        };
        // A reorg during the look-up asks for another.
        self.presence.send_if_modified(|presence| {
            let checking = *presence == Presence::Checking;
            if checking {
                *presence = found;
            }
            checking
        });
    }

    /// Puts a call into its block's group; the group leaves when its window ends or it is full.
    fn enqueue(
        self: &Arc<Self>,
        target: Subcall,
        block: Option<String>,
        call: Call,
    ) -> oneshot::Receiver<Result<Answer, UpstreamError>> {
        let (answer, receiver) = oneshot::channel();
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let group = groups.entry(block.clone()).or_insert_with(|| {
            let id = self.next_group.fetch_add(1, Ordering::Relaxed);
            let (shared, key, window) = (self.clone(), block.clone(), self.config.window);
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                let due = {
                    let mut groups = shared.groups.lock().unwrap_or_else(|e| e.into_inner());
                    let due = match groups.get(&key) {
                        Some(g) if g.id == id => groups.remove(&key),
                        _ => None, // it filled up and left already
                    };
                    shared.filling.set(groups.len() as f64);
                    due
                };
                if let Some(group) = due {
                    shared.send(group, key).await;
                }
            });
            Group { id, waiting: Vec::new(), bytes: 0 }
        });
        group.bytes += target.data.len() + 96;
        group.waiting.push(Waiting { target, call, answer });
        if group.waiting.len() >= self.config.max_calls || group.bytes >= MAX_GROUP_BYTES {
            if let Some(full) = groups.remove(&block) {
                tokio::spawn(self.clone().send(full, block));
            }
        }
        self.filling.set(groups.len() as f64);
        receiver
    }

    /// Sends one group: alone as a direct call, else as one aggregate.
    async fn send(self: Arc<Self>, group: Group, block: Option<String>) {
        let mut waiting = group.waiting;
        if waiting.len() == 1 {
            self.count("alone", 1);
            let one = waiting.remove(0);
            let answer = self.inner.call(&one.call).await;
            let _ = one.answer.send(answer);
            return;
        }
        self.batches.increment(1);
        let targets: Vec<Subcall> = waiting.iter().map(|w| w.target.clone()).collect();
        let aggregate = self.aggregate_call(&waiting, abi::encode(&targets), block.as_deref());
        let results = match self.inner.call(&aggregate).await {
            Ok(Answer { outcome: Outcome::Result(raw), .. }) => serde_json::from_str::<&str>(raw.get())
                .ok()
                .and_then(|text| hex::decode(text.strip_prefix("0x")?).ok())
                .and_then(|data| abi::decode(&data, waiting.len())),
            _ => None,
        };
        let Some(results) = results else {
            self.count("fallback", waiting.len());
            return self.direct(waiting).await;
        };
        let mut again = Vec::new();
        let mut answered = 0;
        for (w, result) in waiting.into_iter().zip(results) {
            match result {
                Inner::Returned(data) => match RawValue::from_string(format!("\"0x{}\"", hex::encode(&data))) {
                    Ok(raw) => {
                        answered += 1;
                        let _ = w.answer.send(Ok(Answer { outcome: Outcome::result(raw), source: Source::Aggregated }));
                    }
                    Err(_) => again.push(w),
                },
                Inner::Failed => again.push(w),
            }
        }
        self.count("aggregated", answered);
        self.count("failed_inside", again.len());
        self.direct(again).await;
    }

    /// The `eth_call` to Multicall3 for a group, in the context of its calls: the block need of
    /// the first (they share the block parameter), the earliest deadline.
    fn aggregate_call(&self, waiting: &[Waiting], data: Vec<u8>, block: Option<&str>) -> Call {
        let object = format!(r#"{{"to":"{MULTICALL3:#x}","data":"0x{}"}}"#, hex::encode(&data));
        let params = match block {
            Some(block) => format!("[{object},{block}]"),
            None => format!("[{object}]"),
        };
        let params = RawValue::from_string(params).ok();
        let first = &waiting[0].call;
        let mut call = Call::new(Request::new(Some(Id::number(1)), "eth_call", params));
        call.ctx = first.ctx.clone();
        call.ctx.deadline = waiting.iter().filter_map(|w| w.call.ctx.deadline).min();
        call
    }

    /// Makes each call directly, as sent, concurrently.
    async fn direct(&self, waiting: Vec<Waiting>) {
        let calls = waiting.into_iter().map(|w| async move {
            let answer = self.inner.call(&w.call).await;
            let _ = w.answer.send(answer);
        });
        join_all(calls).await;
    }
}

#[async_trait]
impl Upstreams for AggregateLayer {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let shared = &self.shared;
        if call.method() != "eth_call" || !shared.config.eth_call {
            return shared.inner.call(call).await;
        }
        let Some(e) = eligible(call.req.params_text()) else {
            shared.count("ineligible", 1);
            return shared.inner.call(call).await;
        };
        if !shared.multicall_present().await {
            shared.count("no_multicall", 1);
            return shared.inner.call(call).await;
        }
        match shared.enqueue(e.target, e.block, call.clone()).await {
            Ok(answer) => answer,
            // The group's task is gone (the runtime is stopping): make the call as sent.
            Err(_) => shared.inner.call(call).await,
        }
    }

    /// A batch: its eligible `eth_call`s join their blocks' groups, the rest go down together
    /// (as one batch, for the pool to group by member).
    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let shared = &self.shared;
        let joins = |c: &&Call| c.method() == "eth_call" && eligible(c.req.params_text()).is_some();
        if !shared.config.eth_call || !calls.iter().any(joins) || !shared.multicall_present().await {
            return shared.inner.call_batch(calls).await;
        }
        let (mine, rest): (Vec<usize>, Vec<usize>) = (0..calls.len()).partition(|&i| joins(&calls[i]));
        let rest_calls: Vec<&Call> = rest.iter().map(|&i| calls[i]).collect();
        let down = shared.inner.call_batch(&rest_calls);
        let own = join_all(mine.iter().map(|&i| self.call(calls[i])));
        let (down, own) = tokio::join!(down, own);
        let mut results: Vec<Option<Result<Answer, UpstreamError>>> = (0..calls.len()).map(|_| None).collect();
        for (i, r) in rest.into_iter().zip(down) {
            results[i] = Some(r);
        }
        for (i, r) in mine.into_iter().zip(own) {
            results[i] = Some(r);
        }
        results.into_iter().map(|r| r.unwrap_or(Err(UpstreamError::NoneAvailable))).collect()
    }
}
