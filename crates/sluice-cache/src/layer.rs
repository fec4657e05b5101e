//! The caching layer: an [`Upstreams`] that wraps another.
//!
//! Per call: plan → local answer, or memory → (coalesced: redis → upstream → store) → answer.
//! Calls that are not cacheable go straight to the inner upstreams, a batch's as one batch.
//! A miss goes down as the same [`Call`], its block pinned and its need narrowed to that
//! block, so that the pool routes it to a member that has the block.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_chain::{ChainEvent, ChainView};
use sluice_jsonrpc::{Outcome, RawValue, SharedRaw};
use sluice_upstream::{Answer, Call, CallFuture, HeadFeed, Source, UpstreamError, Upstreams};
use tokio::sync::watch;
use tracing::Instrument;

use crate::coalesce::Coalescer;
use crate::memory::{Entry, MemoryTier};
use crate::policy::{admit, plan_row, Cacheable, Plan};
use crate::redis_tier::RedisTier;

/// This layer's metric handles, labelled with its network, registered once when it is built.
struct Counters {
    memory_hits: metrics::Counter,
    redis_hits: metrics::Counter,
    misses: metrics::Counter,
    coalesced: metrics::Counter,
    saved: metrics::Counter,
    bytes: metrics::Gauge,
}

impl Counters {
    fn new(network: &str) -> Self {
        let n = network.to_owned();
        Self {
            memory_hits: metrics::counter!("sluice_cache_hits_total", "network" => n.clone(), "tier" => "memory"),
            redis_hits: metrics::counter!("sluice_cache_hits_total", "network" => n.clone(), "tier" => "redis"),
            misses: metrics::counter!("sluice_cache_misses_total", "network" => n.clone()),
            coalesced: metrics::counter!("sluice_cache_coalesced_total", "network" => n.clone()),
            saved: metrics::counter!("sluice_cache_upstream_calls_saved_total", "network" => n.clone()),
            bytes: metrics::gauge!("sluice_cache_bytes", "network" => n),
        }
    }

    /// A hit in the memory tier: counted, and the call it saved.
    fn memory_hit(&self) {
        self.memory_hits.increment(1);
        self.saved.increment(1);
    }
}

/// An answer fetched on a miss, shared with coalesced callers.
#[derive(Clone)]
struct Fetched {
    outcome: Outcome,
    source: Source,
}

struct Shared {
    counters: Counters,
    inner: Arc<dyn Upstreams>,
    view: watch::Receiver<Arc<ChainView>>,
    memory: MemoryTier,
    redis: Option<RedisTier>,
}

/// The cache in front of an [`Upstreams`].
pub struct CacheLayer {
    shared: Arc<Shared>,
    coalescer: Option<Coalescer<String, Result<Fetched, UpstreamError>>>,
}

impl CacheLayer {
    /// Wraps `inner` for the network `network` (its metrics label); follows `feed` to resolve
    /// blocks and to evict on reorgs. `coalesce: false` lets every miss go upstream (for
    /// comparison benchmarks).
    pub fn new(
        network: &str,
        inner: Arc<dyn Upstreams>,
        feed: &HeadFeed,
        memory_bytes: u64,
        redis: Option<RedisTier>,
        coalesce: bool,
    ) -> Self {
        let memory = MemoryTier::new(memory_bytes);
        let counters = Counters::new(network);
        let shared = Arc::new(Shared { counters, inner, view: feed.view.clone(), memory, redis });
        let weak = Arc::downgrade(&shared);
        let mut events = feed.events.subscribe();
        tokio::spawn(async move {
            let mut gauge = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                let event = tokio::select! {
                    event = events.recv() => event,
                    _ = gauge.tick() => {
                        let Some(shared) = weak.upgrade() else { return };
                        shared.counters.bytes.set(shared.memory.weighted_size() as f64);
                        continue;
                    }
                };
                let Some(shared) = weak.upgrade() else { return };
                match event {
                    Ok(ChainEvent::Reorg { fork_point }) => shared.memory.evict_from(fork_point),
                    Ok(ChainEvent::NewHead(_)) => {}
                    // Missed events: a reorg may be among them, and its depth is unknown.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => shared.memory.evict_from(0),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Self { shared, coalescer: coalesce.then(Coalescer::default) }
    }

    /// The plan for `call`, against the view it was admitted with ([`CallView`](sluice_upstream::CallView)): nothing is
    /// resolved for a call whose view is behind what its client may have been shown.
    fn plan(&self, call: &Call) -> Plan {
        match call.ctx.view.resolve(&self.shared.view) {
            Some(view) => plan_row(call.info, call.req.params_text(), &view),
            None => Plan::Pass,
        }
    }

    /// The answer in memory for `plan`, counted as a hit.
    fn memory_hit(&self, plan: &Cacheable) -> Option<Answer> {
        let entry = self.shared.memory.get(&plan.key)?;
        self.shared.counters.memory_hit();
        Some(Answer { outcome: Outcome::Result(entry.result.clone()), source: Source::Memory })
    }

    /// A call not in memory: Redis, else the inner layers (coalesced with the same call in
    /// flight), and stored when it may be.
    async fn cached(&self, call: &Call, plan: Cacheable) -> Result<Answer, UpstreamError> {
        let (shared, request, key) = (self.shared.clone(), call.clone(), plan.key.clone());
        let (fetched, leader) = match &self.coalescer {
            Some(coalescer) => coalescer.run(key, move || fetch(shared, request, plan)).await,
            None => (Some(fetch(shared, request, plan).await), true),
        };
        if !leader {
            self.shared.counters.coalesced.increment(1);
            self.shared.counters.saved.increment(1);
        }
        match fetched {
            Some(Ok(Fetched { outcome, source })) => {
                Ok(Answer { outcome, source: if leader { source } else { Source::Coalesced } })
            }
            Some(Err(e)) => Err(e),
            None => Err(UpstreamError::InvalidResponse("shared upstream call failed")),
        }
    }
}

/// A miss: Redis, then the upstream; stores what may be stored.
async fn fetch(shared: Arc<Shared>, call: Call, plan: Cacheable) -> Result<Fetched, UpstreamError> {
    if let Some(hit) = from_redis(&shared, &plan).await {
        return Ok(hit);
    }
    shared.counters.misses.increment(1);
    let answer = shared.inner.call(&forwarded(&call, &plan)?).await?;
    store(&shared, plan, &answer.outcome);
    // Upstream, or Aggregated when the layer below answered from a Multicall3 aggregate.
    Ok(Fetched { outcome: answer.outcome, source: answer.source })
}

/// The shared tier's answer, kept in memory too.
async fn from_redis(shared: &Shared, plan: &Cacheable) -> Option<Fetched> {
    let chain_id = shared.view.borrow().chain_id;
    let (Some(redis), Some(chain_id)) = (&shared.redis, chain_id) else { return None };
    let (result, max_block) = redis.get(chain_id, &plan.key).await?;
    let result: sluice_jsonrpc::SharedRaw = result.into();
    shared.counters.redis_hits.increment(1);
    shared.counters.saved.increment(1);
    shared.memory.insert(plan.key.clone(), Entry { result: result.clone(), max_block });
    Some(Fetched { outcome: Outcome::Result(result), source: Source::Redis })
}

/// The call as it goes upstream: its block pinned when the plan pinned one, and its need
/// narrowed to that block so the pool asks a member that has it.
fn forwarded(call: &Call, plan: &Cacheable) -> Result<Call, UpstreamError> {
    match &plan.forward {
        Some(params) => {
            let params = RawValue::from_string(params.clone()).map_err(|_| UpstreamError::InvalidResponse("params"))?;
            Ok(call.with_params(params, plan.needs.clone().unwrap_or_else(|| call.ctx.needs.clone())))
        }
        None => Ok(call.clone()),
    }
}

/// Stores an answer if the plan and the chain as it is now allow.
fn store(shared: &Shared, plan: Cacheable, outcome: &Outcome) {
    if let Outcome::Result(result) = outcome {
        let now = shared.view.borrow().clone();
        if let Some(max_block) = admit(&plan, result.get(), &now) {
            if let (Some(redis), Some(chain_id)) = (&shared.redis, now.chain_id) {
                redis.put(chain_id, &plan.key, result, max_block);
            }
            shared.memory.insert(plan.key, Entry { result: result.clone(), max_block });
        }
    }
}

/// A local answer: the quantity `n` as JSON (`"0x…"`).
///
/// The same few values are asked for over and over (the head's number until the next block,
/// the chain id), so each thread keeps the last ones it wrote and shares them: a hit costs a
/// reference count, not a formatting, a serialization and two allocations.
fn local(n: u64) -> Answer {
    /// Answers kept per thread: the head, the chain id, and the head just before.
    const KEPT: usize = 4;
    thread_local! {
        static RECENT: std::cell::RefCell<[(u64, Option<SharedRaw>); KEPT]> = Default::default();
    }
    let raw = RECENT.with(|recent| {
        let mut recent = recent.borrow_mut();
        if let Some((_, Some(raw))) = recent.iter().find(|(m, raw)| *m == n && raw.is_some()) {
            return raw.clone();
        }
        let raw: SharedRaw = quantity(n).into();
        // The oldest goes: entries move down one, the new one is first.
        recent.rotate_right(1);
        recent[0] = (n, Some(raw.clone()));
        raw
    });
    Answer { outcome: Outcome::Result(raw), source: Source::Local }
}

/// `n` as a JSON-RPC quantity (always valid JSON; the default, `null`, is never used).
fn quantity(n: u64) -> Box<RawValue> {
    RawValue::from_string(format!("\"0x{n:x}\"")).unwrap_or_default()
}

#[async_trait]
impl Upstreams for CacheLayer {
    /// Written by hand (not `async`) so that what is answered at once (a local answer, a memory
    /// hit) pays only a small ready future, and a call the cache does not touch goes down as
    /// the inner layer's own future when traces are off: the layer's own future, with the
    /// coalescing and Redis steps in it, is boxed only for a call that may need them.
    fn call<'a, 'b, 'f>(&'a self, call: &'b Call) -> CallFuture<'f>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        // A trace span (off: a disabled callsite); `result` says what the cache did.
        let span = tracing::debug_span!("cache", result = tracing::field::Empty);
        let at_once = |answer: Answer, result: &'static str| -> CallFuture<'f> {
            span.record("result", result);
            Box::pin(std::future::ready(Ok(answer)))
        };
        match self.plan(call) {
            Plan::Local(value) => at_once(local(value), "local"),
            Plan::Cache(plan) => match self.memory_hit(&plan) {
                Some(answer) => at_once(answer, "hit-memory"),
                None => Box::pin(async move {
                    let answer = self.cached(call, plan).instrument(span.clone()).await;
                    span.record("result", cache_result(&answer, true));
                    answer
                }),
            },
            Plan::Pass if span.is_disabled() => self.shared.inner.call(call),
            Plan::Pass => Box::pin(async move {
                let answer = self.shared.inner.call(call).instrument(span.clone()).await;
                span.record("result", cache_result(&answer, false));
                answer
            }),
        }
    }

    /// A batch: local answers and memory hits at once; the misses (after Redis) and the
    /// uncacheable calls go down together as one batch, so that the pool can send each member
    /// one JSON-RPC batch. Identical calls in flight elsewhere are joined below, by coalescing.
    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let span = tracing::debug_span!("cache", calls = calls.len(), down = tracing::field::Empty);
        self.batch(calls, &span).instrument(span.clone()).await
    }
}

/// What the cache did for one call, for its trace span.
fn cache_result(answer: &Result<Answer, UpstreamError>, cacheable: bool) -> &'static str {
    match (answer.as_ref().map(|a| a.source), cacheable) {
        (Ok(Source::Memory), _) => "hit-memory",
        (Ok(Source::Redis), _) => "hit-redis",
        (Ok(Source::Local), _) => "local",
        (Ok(Source::Coalesced), _) => "coalesced",
        (_, true) => "miss",
        (_, false) => "pass",
    }
}

impl CacheLayer {
    async fn batch(&self, calls: &[&Call], span: &tracing::Span) -> Vec<Result<Answer, UpstreamError>> {
        let mut results: Vec<Option<Result<Answer, UpstreamError>>> = (0..calls.len()).map(|_| None).collect();
        let mut misses: Vec<(usize, Cacheable)> = Vec::new();
        let mut down: Vec<(usize, Option<Cacheable>)> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            match self.plan(call) {
                Plan::Local(value) => results[i] = Some(Ok(local(value))),
                Plan::Cache(plan) => match self.shared.memory.get(&plan.key) {
                    Some(entry) => {
                        self.shared.counters.memory_hit();
                        results[i] =
                            Some(Ok(Answer { outcome: Outcome::Result(entry.result.clone()), source: Source::Memory }));
                    }
                    None => misses.push((i, plan)),
                },
                Plan::Pass => down.push((i, None)),
            }
        }
        let shared = &self.shared;
        let looked_up = futures_util::future::join_all(
            misses.into_iter().map(|(i, plan)| async move { (i, from_redis(shared, &plan).await, plan) }),
        )
        .await;
        for (i, hit, plan) in looked_up {
            match hit {
                Some(Fetched { outcome, source }) => results[i] = Some(Ok(Answer { outcome, source })),
                None => {
                    shared.counters.misses.increment(1);
                    down.push((i, Some(plan)));
                }
            }
        }
        let mut sent: Vec<(usize, Option<Cacheable>, Call)> = Vec::with_capacity(down.len());
        for (i, plan) in down {
            match plan.as_ref().map(|p| forwarded(calls[i], p)) {
                Some(Err(e)) => results[i] = Some(Err(e)),
                Some(Ok(call)) => sent.push((i, plan, call)),
                None => sent.push((i, None, calls[i].clone())),
            }
        }
        let refs: Vec<&Call> = sent.iter().map(|(_, _, c)| c).collect();
        span.record("down", refs.len());
        let answers = match refs.len() {
            0 => Vec::new(),
            1 => vec![self.shared.inner.call(refs[0]).await],
            _ => self.shared.inner.call_batch(&refs).await,
        };
        for ((i, plan, _), answer) in sent.into_iter().zip(answers) {
            if let (Some(plan), Ok(answer)) = (plan, &answer) {
                store(&self.shared, plan, &answer.outcome);
            }
            results[i] = Some(answer);
        }
        results.into_iter().map(|r| r.unwrap_or(Err(UpstreamError::InvalidResponse("no answer")))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(answer: &Answer) -> &str {
        match &answer.outcome {
            Outcome::Result(raw) => raw.get(),
            Outcome::Error(raw) => panic!("an error: {}", raw.get()),
        }
    }

    #[test]
    fn local_answers_are_quantities_shared_while_they_repeat() {
        let (a, b) = (local(0x64), local(0x64));
        assert_eq!(text(&a), "\"0x64\"");
        let (Outcome::Result(a), Outcome::Result(b)) = (&a.outcome, &b.outcome) else { unreachable!() };
        assert!(Arc::ptr_eq(a, b), "a repeated value is shared, not written again");
        // More distinct values than kept: each still answers its own number.
        for n in [0u64, 1, 0x7a69, 0x65, 0x66, 0x64, u64::MAX] {
            let answer = local(n);
            assert_eq!(text(&answer), format!("\"0x{n:x}\""));
            assert_eq!(answer.source, Source::Local);
        }
    }
}
