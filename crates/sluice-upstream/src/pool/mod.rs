//! The upstream pool: every call reaches the nodes through it, also with one member.
//!
//! Per call: [`order`] the members (pure: coverage of the block the call needs, tier, score,
//! circuits, lag, budgets) → try them in turn, up to `max_attempts` within the deadline, the
//! first attempt hedged to the next member when it is slow. Answers that are the request's own
//! fault (reverts, invalid params) come back at once; node trouble (transport, timeout, 429/5xx,
//! garbage, overload) moves on, to the same member again when it is the only one; "unknown
//! block" from a member moves on to another that may have the block, and is counted.
//! A batch is grouped by chosen member and each group sent as one JSON-RPC batch (at most
//! `max_batch` calls, split when a node refuses the size), with failover per element.
//! `eth_sendRawTransaction` goes to every available member at once.
//! A prober task reads each member's head every `probe_interval`; it is also the half-open probe
//! that lets a recovered member back in without client traffic. Another learns each member's
//! lowest blocks ([`range`]); calls go only to members that have the block they need.
//! Answers pass the [`integrity`] checks; methods under a [`ConsensusRule`] are put to a vote.

mod adaptive;
mod attempt;
mod attest;
mod batch;
mod breaker;
mod budget;
mod classify;
mod config;
mod consensus;
mod exchange;
mod filters;
mod health;
mod hedge;
mod integrity;
mod live;
mod order;
mod probe;
pub mod range;
mod range_probe;
mod state;
mod status;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use sluice_chain::methods::FilterRole;
use sluice_chain::BlockNeed;
use sluice_jsonrpc::Outcome;
use tokio::sync::Semaphore;
use tracing::Instrument;

pub use adaptive::AdaptiveRate;
pub use breaker::{Breaker, Circuit};
pub use budget::{DailyQuota, MethodFilter, RateLimit};
pub(crate) use classify::TOO_LARGE;
pub use classify::{is_already_known, is_missing_block, is_rate_limited, judge_error, AfterAnswer};
pub use config::{MemberConfig, PoolConfig, SharedBudget};
pub use consensus::ConsensusRule;
pub use health::Health;
pub use hedge::{HedgeAfter, HedgeBudget, Recent};
pub use integrity::IntegrityConfig;
pub use live::LivePool;
pub use order::{order, MemberView, Order, Rules};
pub use range::{Data, History};

use crate::{Answer, Call, HttpUpstream, Node, Origin, UpstreamError, Upstreams};
use state::State;

/// How recent a member's sign of life must be, at least, for the pool to count as up.
const ALIVE_FOR: Duration = Duration::from_secs(10);

/// The longest a head-bound call waits for the first round of head probes after a start.
const FIRST_HEADS_WAIT: Duration = Duration::from_secs(2);

struct Member<N> {
    node: N,
    tier: u8,
    weight: u32,
    filter: MethodFilter,
    slots: Option<Arc<Semaphore>>,
    max_batch: usize,
    /// Its configured rate and daily quota (for the shared budgets).
    limits: (Option<f64>, Option<u64>),
    /// `network:name`, its budgets' key in the shared store.
    budget_key: String,
    /// Calls sent to it, by [`Origin`] (`sluice_upstream_metered_calls_total`), registered once.
    calls: [metrics::Counter; 2],
    state: Mutex<State>,
}

/// Keeps `in_flight` right when a call is cancelled (the losing half of a hedge).
struct InFlight<'a, N>(&'a Member<N>);

impl<N> Drop for InFlight<'_, N> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.health.in_flight = state.health.in_flight.saturating_sub(1);
    }
}

impl<N> Member<N> {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pool of members behind one [`Upstreams`].
pub struct UpstreamPool<N: Node = HttpUpstream> {
    members: Vec<Member<N>>,
    config: PoolConfig,
    hedges: Mutex<HedgeBudget>,
    /// When heads were last read on demand (a call beyond every known head).
    refreshed: tokio::sync::Mutex<Option<Instant>>,
    /// The highest `eth_blockNumber` a client was given: never less after.
    served_number: AtomicU64,
    /// True once the prober has read every member's head once (at once without a prober).
    heads_read: tokio::sync::watch::Sender<bool>,
    /// The chain's pace in milliseconds, as the head feed learned it (0: not known yet).
    pace_ms: AtomicU64,
}

impl<N: Node> UpstreamPool<N> {
    /// Builds the pool and starts its prober.
    pub fn new(members: Vec<MemberConfig<N>>, config: PoolConfig) -> Arc<Self> {
        let pool = Arc::new(Self::without_prober(members, config));
        pool.heads_read.send_replace(false);
        // Registered at zero, so that dashboards and alerts see the series before the first event.
        for name in [
            "sluice_pool_retries_total",
            "sluice_pool_hedges_total",
            "sluice_pool_hedge_wins_total",
            "sluice_pool_batch_splits_total",
            "sluice_pool_missing_block_retries_total",
        ] {
            metrics::counter!(name).increment(0);
        }
        for m in &pool.members {
            metrics::counter!("sluice_upstream_rate_limited_total", "network" => pool.config.network.clone(),
                "upstream" => m.node.name().to_owned())
            .increment(0);
        }
        // A node closing its connections (a node that dies closes them all) wakes the prober.
        let closed = Arc::new(tokio::sync::Notify::new());
        for m in &pool.members {
            m.node.wake_on_close(closed.clone());
        }
        tokio::spawn(probe::run(Arc::downgrade(&pool), closed));
        tokio::spawn(range_probe::run(Arc::downgrade(&pool)));
        pool
    }

    /// Builds the pool without its prober (heads then come from [`UpstreamPool::set_head`]):
    /// what [`UpstreamPool::new`] starts the prober on, and what the unit tests use.
    fn without_prober(members: Vec<MemberConfig<N>>, config: PoolConfig) -> Self {
        let members = members
            .into_iter()
            .map(|m| Member {
                budget_key: format!("{}:{}", config.network, m.client.name()),
                calls: [Origin::Client, Origin::Internal].map(|origin| {
                    metrics::counter!("sluice_upstream_metered_calls_total", "network" => config.network.clone(),
                        "upstream" => m.client.name().to_owned(), "origin" => origin.as_str())
                }),
                node: m.client,
                tier: m.tier,
                weight: m.weight,
                filter: m.filter,
                slots: m.max_concurrency.map(|n| Arc::new(Semaphore::new(n.max(1)))),
                max_batch: m.max_batch.unwrap_or(config.max_batch).max(1),
                limits: (m.rate, m.daily_quota),
                state: Mutex::new(State::new(
                    Breaker::new(config.breaker_threshold, config.breaker_cooldown),
                    m.rate,
                    m.daily_quota,
                    m.history,
                    Instant::now(),
                    SystemTime::now(),
                )),
            })
            .collect();
        let hedges = Mutex::new(HedgeBudget::new(config.hedge_max_extra, 10.0));
        Self {
            members,
            config,
            hedges,
            refreshed: tokio::sync::Mutex::new(None),
            served_number: AtomicU64::new(0),
            heads_read: tokio::sync::watch::Sender::new(true),
            pace_ms: AtomicU64::new(0),
        }
    }

    /// Member `member` refused a connection: nothing listens there, so its circuit opens now.
    pub(crate) fn member_down(&self, member: usize) {
        let mut state = self.members[member].state();
        state.breaker.on_down(Instant::now());
        state.last_error = Some(UpstreamError::Refused);
        drop(state);
        tracing::warn!(network = %self.config.network, upstream = %self.members[member].node.name(),
            "upstream closed its connections and refuses new ones: out until it answers again");
    }

    /// Records a member's head (and its hash, which it then is known to have).
    pub fn set_head(&self, member: usize, number: u64, hash: Option<&str>) {
        if let Some(m) = self.members.get(member) {
            let mut state = m.state();
            state.health.head = Some(number);
            state.heard = Some(Instant::now());
            if let Some(hash) = hash {
                state.learn(hash);
            }
        }
    }

    /// Records the head member `name` announced on its own (a `newHeads` notification).
    pub fn member_head(&self, name: &str, number: u64, hash: &str) {
        if let Some(i) = self.members.iter().position(|m| m.node.name() == name) {
            self.set_head(i, number, Some(hash));
            self.members[i].state().alive = Some(Instant::now());
        }
    }

    /// True when a member whose circuit is closed, and whose last exchange did not fail, showed
    /// it is up within the last two blocks (at least [`ALIVE_FOR`]): a readiness check needs no
    /// call of its own then.
    pub fn recently_alive(&self) -> bool {
        let now = Instant::now();
        let within = self.block_interval().map_or(ALIVE_FOR, |pace| ALIVE_FOR.max(pace * 2));
        self.members.iter().any(|m| {
            let state = m.state();
            state.breaker.state(now) == Circuit::Closed
                && state.last_error.is_none()
                && state.alive.is_some_and(|at| now.saturating_duration_since(at) < within)
        })
    }

    /// The members' names, in order.
    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.node.name().to_owned()).collect()
    }

    /// Sets the chain's pace (see [`Upstreams::block_interval`]).
    pub fn set_block_interval(&self, interval: Duration) {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX).max(1);
        self.pace_ms.store(ms, Ordering::Relaxed);
    }

    /// The chain's pace, once the head feed has learned it.
    pub fn block_interval(&self) -> Option<Duration> {
        match self.pace_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// How many members the pool has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the pool has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn best_head(&self) -> Option<u64> {
        self.members.iter().filter_map(|m| m.state().health.head).max()
    }

    /// The members to try for `call`, best first (see [`order`]).
    fn order_for(&self, call: &Call) -> Order {
        let now = Instant::now();
        let hash = match &call.ctx.needs {
            BlockNeed::Hash { hash, .. } => Some(hash.as_str()),
            _ => None,
        };
        let data = Data::of(call.method());
        let integrity = &self.config.integrity;
        let rules = Rules {
            max_lag: self.config.max_lag,
            highest_first: integrity.highest_head,
            within_heads: integrity.logs_need_head && call.method() == "eth_getLogs",
        };
        let views: Vec<MemberView> = self
            .members
            .iter()
            .map(|m| {
                let mut state = m.state();
                let budget = state.budget(now, SystemTime::now, self.config.budget_wait);
                MemberView {
                    tier: m.tier,
                    serves: m.filter.allows(call.method()),
                    circuit_allows: state.breaker.would_allow(now) && !state.cordoned(now),
                    within_budget: budget.within,
                    // At its concurrency limit, or behind its rate's queue: others first.
                    busy: budget.waits || m.slots.as_ref().is_some_and(|s| s.available_permits() == 0),
                    score: state.score(m.weight),
                    head: state.health.head,
                    has_hash: hash.is_some_and(|h| state.knows(h)),
                    lowest: state.availability.lowest(data, state.health.head),
                }
            })
            .collect();
        order(&call.ctx.needs, &views, rules)
    }

    /// The order for `call`, or why no member can be asked: every one has pruned the block it
    /// needs, or it is beyond every head even after the heads are read again.
    async fn resolve_order(&self, call: &Call) -> Result<Order, UpstreamError> {
        if self.config.integrity.highest_head && call.ctx.needs == BlockNeed::Head && !*self.heads_read.borrow() {
            // Just started: which member is behind is not known yet. Wait (briefly) for the
            // first probe round rather than let a laggard answer `latest` first.
            let mut read = self.heads_read.subscribe();
            let _ = tokio::time::timeout(FIRST_HEADS_WAIT, read.wait_for(|read| *read)).await;
        }
        let order = match self.order_for(call) {
            Order::BeyondHead { .. } => {
                self.refresh_heads().await;
                self.order_for(call)
            }
            order => order,
        };
        match order {
            Order::NotCovered { lowest } => {
                Err(UpstreamError::NotCovered { block: call.ctx.needs.lowest().unwrap_or(0), lowest })
            }
            Order::BeyondHead { head } => {
                Err(UpstreamError::BeyondHead { block: call.ctx.needs.highest().unwrap_or(0), head })
            }
            order => Ok(order),
        }
    }

    /// The failover state of `call`.
    async fn attempts_for(&self, call: &Call) -> attempt::Attempts {
        match self.resolve_order(call).await {
            Ok(order) => attempt::Attempts::new(order, self.members.len(), self.config.max_attempts),
            Err(why) => attempt::Attempts::refused(why, self.members.len()),
        }
    }

    /// Reads every member's head now (a call needs a block beyond every known head: probes lag
    /// behind a block just mined). Calls that meet here share one round.
    async fn refresh_heads(&self) {
        const FRESH: Duration = Duration::from_millis(50);
        let mut last = self.refreshed.lock().await;
        if last.is_some_and(|at| at.elapsed() < FRESH) {
            return;
        }
        let probes = (0..self.members.len()).map(|i| probe::probe_one(self, i));
        futures_util::future::join_all(probes).await;
        *last = Some(Instant::now());
    }

    /// What the integrity checks make of `outcome` for `call`.
    fn suspect(&self, call: &Call, outcome: &Result<Outcome, UpstreamError>) -> Option<integrity::Suspect> {
        let facts = || integrity::Facts {
            best_head: self.best_head(),
            hash_known: match &call.ctx.needs {
                BlockNeed::Hash { hash, .. } => self.members.iter().any(|m| m.state().knows(hash)),
                _ => false,
            },
        };
        integrity::suspect(&self.config.integrity, call, outcome, facts)
    }

    /// `eth_blockNumber` never below what a client was given before, nor below a member's head.
    fn never_backwards(&self, answer: Answer) -> Answer {
        let Outcome::Result(raw) = &answer.outcome else { return answer };
        let Some(given) = sluice_chain::parse_quantity(raw.get().trim_matches('"')) else { return answer };
        let floor = self.best_head().unwrap_or(0).max(self.served_number.load(Ordering::Relaxed));
        if given >= floor {
            self.served_number.fetch_max(given, Ordering::Relaxed);
            return answer;
        }
        metrics::counter!("sluice_pool_integrity_retries_total", "reason" => "block_number").increment(1);
        self.served_number.fetch_max(floor, Ordering::Relaxed);
        match sluice_jsonrpc::RawValue::from_string(format!("\"{floor:#x}\"")) {
            Ok(raw) => Answer { outcome: Outcome::result(raw), source: answer.source },
            Err(_) => answer,
        }
    }

    /// The deadline for one exchange carrying `method`.
    fn timeout_for(&self, method: &str, member: &Member<N>) -> Duration {
        let by_method = self.config.method_timeouts.iter().find(|(pattern, _)| match pattern.strip_suffix('*') {
            Some(prefix) => method.starts_with(prefix),
            None => pattern == method,
        });
        by_method.map_or_else(|| member.node.timeout(), |(_, t)| *t)
    }

    /// What to tell a caller no member could take: the most telling recent failure of a member
    /// whose circuit is open (`unreachable`, `timeout`, …), else `NoneAvailable`.
    fn unavailable(&self, error: UpstreamError) -> UpstreamError {
        if error != UpstreamError::NoneAvailable {
            return error;
        }
        self.members.iter().find_map(|m| m.state().last_error.clone()).unwrap_or(error)
    }

    /// Notes what an answer taught about member `i`.
    fn learn_from(&self, i: usize, call: &Call, outcome: &Result<Outcome, UpstreamError>) {
        // A block it named (its `eth_blockNumber`, a receipt's block, a block, logs): it has that
        // block, so its head is at least there, whatever the prober last saw. Read before the
        // member's lock is taken: an answer can be long.
        let named = match (outcome, &call.ctx.needs) {
            (Ok(Outcome::Result(raw)), needs) if !matches!(needs, BlockNeed::Hash { .. }) => {
                sluice_chain::named_block(call.method(), raw.get())
            }
            _ => None,
        };
        let mut state = self.members[i].state();
        match (outcome, &call.ctx.needs) {
            (Ok(Outcome::Result(_)), BlockNeed::Hash { hash, .. }) => state.learn(hash),
            (Ok(Outcome::Result(_)), _) if named.is_some() => {
                if let Some(block) = named {
                    if state.health.head.is_none_or(|h| block.number >= h) {
                        // Its head, or past it: as good as a probe of its head.
                        state.heard = Some(Instant::now());
                    }
                    state.health.head = Some(state.health.head.map_or(block.number, |h| h.max(block.number)));
                    if let Some(hash) = &block.hash {
                        state.learn(hash);
                    }
                }
            }
            (Ok(Outcome::Error(e)), needs) if needs.is_specific() && is_missing_block(e) => {
                state.missing_blocks += 1;
                let name = self.members[i].node.name().to_owned();
                metrics::counter!("sluice_pool_missing_block_total", "upstream" => name.clone()).increment(1);
                let data = Data::of(call.method());
                let head = state.health.head;
                if let Some(n) = needs.lowest() {
                    if state.availability.lacks(data, n, head) {
                        tracing::info!(upstream = %name, block = n, data = data.as_str(),
                            "upstream lacks an old block: its lower bound is raised");
                        metrics::counter!("sluice_pool_range_raised_total", "network" => self.config.network.clone(),
                            "upstream" => name, "data" => data.as_str())
                        .increment(1);
                    }
                }
            }
            _ => {}
        }
    }
}

impl<N: Node> UpstreamPool<N> {
    /// [`Upstreams::call`] as an inherent method, for [`LivePool`] to await without a
    /// second boxed future.
    pub async fn answer(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let span = tracing::debug_span!("pool", method = call.method(), network = %self.config.network);
        if call.info.is_submission() {
            return self.broadcast(&[call]).instrument(span).await.remove(0);
        }
        match call.info.filter {
            Some(FilterRole::Creates) => return self.create_filter(call).instrument(span).await,
            Some(FilterRole::Uses) => return self.use_filter(call).instrument(span).await,
            None => {}
        }
        if call.ctx.attest > 1 && call.ctx.check.is_some() {
            return self.call_attested(call, usize::from(call.ctx.attest)).instrument(span).await;
        }
        // A call that carries its own check (a proof against a trusted header) is put to no
        // vote: each member's answer holds or fails on its own, and a colluding majority's
        // would fail.
        let answer = match self.consensus_rule(call.method()).filter(|_| call.ctx.check.is_none()) {
            Some(rule) => self.call_consensus(call, rule).instrument(span).await,
            None => self.call_one(call).instrument(span).await,
        };
        match answer {
            Ok(answer) if self.config.integrity.highest_head && call.method() == "eth_blockNumber" => {
                Ok(self.never_backwards(answer))
            }
            other => other,
        }
    }

    /// [`Upstreams::call_batch`] as an inherent method (see [`UpstreamPool::answer`]).
    pub async fn answer_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        match calls.len() {
            0 => Vec::new(),
            1 => vec![self.answer(calls[0]).await],
            _ => {
                let span = tracing::debug_span!("pool", calls = calls.len(), network = %self.config.network);
                self.call_many(calls).instrument(span).await
            }
        }
    }
}

#[async_trait]
impl<N: Node> Upstreams for UpstreamPool<N> {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        self.answer(call).await
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        self.answer_batch(calls).await
    }

    fn member_head(&self, member: &str, number: u64, hash: &str) {
        UpstreamPool::member_head(self, member, number, hash);
    }

    fn block_interval(&self, interval: Duration) {
        self.set_block_interval(interval);
    }

    fn recently_alive(&self) -> bool {
        UpstreamPool::recently_alive(self)
    }
}

#[cfg(test)]
mod tests;
