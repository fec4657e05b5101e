//! The upstream pool: many nodes behind one [`Upstreams`].
//!
//! Per call: order the members (tier, then score; skipping open circuits and, for head-bound
//! reads, members more than `max_lag` blocks behind) → try them in turn, up to `max_attempts`
//! within `deadline`. Answers that are the request's own fault (reverts, invalid params) come
//! back at once; upstream trouble (transport, timeout, 429/5xx, garbage, overload) moves on to
//! the next member. `eth_sendRawTransaction` goes to every available member at once.
//! A prober task reads each member's head every `probe_interval`; it is also the half-open probe
//! that lets a recovered member back in without client traffic.

mod breaker;
mod budget;
mod classify;
mod health;
mod hedge;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use sluice_jsonrpc::{Id, Outcome, RawValue, Request};

pub use breaker::{Breaker, Circuit};
pub use budget::{DailyQuota, MethodFilter, RateLimit};
pub use classify::{is_already_known, judge_error, Verdict};
use futures_util::future::Either;
pub use health::Health;
pub use hedge::{HedgeAfter, HedgeBudget, Recent};
use tokio::sync::Semaphore;

use crate::{Answer, HttpUpstream, UpstreamError, Upstreams};

/// Pool-wide settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Members tried for one call at most.
    pub max_attempts: usize,
    /// Total time for one call across all attempts.
    pub deadline: Duration,
    /// A member further behind the best head is not used for head-bound reads.
    pub max_lag: u64,
    /// Consecutive failures that open a member's circuit.
    pub breaker_threshold: u32,
    /// How long an open circuit stays open before a probe.
    pub breaker_cooldown: Duration,
    /// How often each member's head is read.
    pub probe_interval: Duration,
    /// When to send a slow call to a second member as well.
    pub hedge: HedgeAfter,
    /// Hedges may add at most this fraction of extra calls (0.1 = 10 %).
    pub hedge_max_extra: f64,
    /// Deadlines by method (`prefix_*` wildcards), instead of the member's own timeout.
    pub method_timeouts: Vec<(String, Duration)>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            deadline: Duration::from_secs(30),
            max_lag: 5,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(5),
            probe_interval: Duration::from_secs(1),
            hedge: HedgeAfter::P95 { floor: Duration::from_millis(20) },
            hedge_max_extra: 0.1,
            method_timeouts: Vec::new(),
        }
    }
}

/// One member as configured.
pub struct MemberConfig {
    /// Its client.
    pub client: HttpUpstream,
    /// 0 = primary; higher tiers are used only when lower ones cannot serve.
    pub tier: u8,
    /// Relative share among members of one tier.
    pub weight: u32,
    /// Which methods it serves.
    pub filter: MethodFilter,
    /// Calls in flight at most.
    pub max_concurrency: Option<usize>,
    /// Requests per second at most (the provider's rate limit).
    pub rate: Option<f64>,
    /// Requests per UTC day at most (the provider's quota).
    pub daily_quota: Option<u64>,
}

impl MemberConfig {
    /// A member with no limits.
    pub fn new(client: HttpUpstream) -> Self {
        Self {
            client,
            tier: 0,
            weight: 1,
            filter: MethodFilter::default(),
            max_concurrency: None,
            rate: None,
            daily_quota: None,
        }
    }
}

struct Member {
    client: HttpUpstream,
    tier: u8,
    weight: u32,
    filter: MethodFilter,
    slots: Option<Arc<Semaphore>>,
    state: Mutex<State>,
}

struct State {
    health: Health,
    breaker: Breaker,
    recent: Recent,
    rate: Option<RateLimit>,
    quota: Option<DailyQuota>,
}

impl State {
    /// Whether the member's budgets allow a call now.
    fn within_budget(&mut self, now: Instant, wall: SystemTime) -> bool {
        self.rate.as_mut().is_none_or(|r| r.available(now)) && self.quota.as_mut().is_none_or(|q| q.left(wall) > 0)
    }

    /// Spends one call of the budgets; false if either is spent.
    fn spend(&mut self, now: Instant, wall: SystemTime) -> bool {
        if !self.within_budget(now, wall) {
            return false;
        }
        self.rate.as_mut().is_none_or(|r| r.take(now)) && self.quota.as_mut().is_none_or(|q| q.take(wall))
    }
}

/// Keeps `in_flight` right when a call is cancelled (the losing half of a hedge).
struct InFlight<'a>(&'a Member);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.health.in_flight = state.health.in_flight.saturating_sub(1);
    }
}

impl Member {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pool.
pub struct Pool {
    members: Vec<Member>,
    config: PoolConfig,
    hedges: Mutex<HedgeBudget>,
}

/// The members to try for one call, or why there are none.
enum Order {
    Try(Vec<usize>),
    OverBudget,
}

impl Pool {
    /// Builds the pool and starts its prober.
    pub fn new(members: Vec<MemberConfig>, config: PoolConfig) -> Arc<Self> {
        let members = members
            .into_iter()
            .map(|m| Member {
                client: m.client,
                tier: m.tier,
                weight: m.weight,
                filter: m.filter,
                slots: m.max_concurrency.map(|n| Arc::new(Semaphore::new(n.max(1)))),
                state: Mutex::new(State {
                    health: Health::default(),
                    breaker: Breaker::new(config.breaker_threshold, config.breaker_cooldown),
                    recent: Recent::default(),
                    rate: m.rate.map(|r| RateLimit::new(r, Instant::now())),
                    quota: m.daily_quota.map(|q| DailyQuota::new(q, SystemTime::now())),
                }),
            })
            .collect();
        let hedges = Mutex::new(HedgeBudget::new(config.hedge_max_extra, 10.0));
        let pool = Arc::new(Self { members, config, hedges });
        tokio::spawn(probe(Arc::downgrade(&pool)));
        pool
    }

    fn best_head(&self) -> Option<u64> {
        self.members.iter().filter_map(|m| m.state().health.head).max()
    }

    /// Members to try for `method`, best first: tier, then score (busy members last). Left out:
    /// members that do not serve the method, open circuits, members over budget, and for
    /// head-bound reads members lagging more than `max_lag`.
    fn order(&self, method: &str, head_bound: bool) -> Order {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let best = self.best_head();
        let mut over_budget = false;
        let mut candidates: Vec<(u8, bool, f64, usize)> = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if !m.filter.allows(method) {
                continue;
            }
            let mut state = m.state();
            if !state.breaker.would_allow(now) {
                continue;
            }
            if head_bound && state.health.lag(best).is_some_and(|lag| lag > self.config.max_lag) {
                continue;
            }
            if !state.within_budget(now, wall) {
                over_budget = true;
                continue;
            }
            let busy = m.slots.as_ref().is_some_and(|s| s.available_permits() == 0);
            candidates.push((m.tier, busy, state.health.score(m.weight), i));
        }
        if candidates.is_empty() && over_budget {
            return Order::OverBudget;
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.total_cmp(&b.2)));
        Order::Try(candidates.into_iter().map(|(_, _, _, i)| i).collect())
    }

    /// The deadline for one call of `method`.
    fn timeout_for(&self, method: &str, member: &Member) -> Duration {
        let by_method = self.config.method_timeouts.iter().find(|(pattern, _)| match pattern.strip_suffix('*') {
            Some(prefix) => method.starts_with(prefix),
            None => pattern == method,
        });
        by_method.map_or_else(|| member.client.timeout(), |(_, t)| *t)
    }

    /// Calls one member within its concurrency limit and budgets, updating its health,
    /// latency window and circuit.
    async fn call_member(&self, i: usize, req: &Request) -> Result<Answer, UpstreamError> {
        let member = &self.members[i];
        let _slot = match &member.slots {
            Some(slots) => Some(slots.clone().acquire_owned().await.map_err(|_| UpstreamError::NoneAvailable)?),
            None => None,
        };
        if !member.state().spend(Instant::now(), SystemTime::now()) {
            return Err(UpstreamError::BudgetExhausted);
        }
        member.state().health.in_flight += 1;
        let in_flight = InFlight(member);
        let started = Instant::now();
        let result = member.client.call_within(req, self.timeout_for(&req.method, member)).await;
        let healthy = match &result {
            Ok(Answer { outcome: Outcome::Error(e), .. }) => judge_error(e) != Verdict::RetryElsewhere,
            Ok(_) => true,
            Err(_) => false,
        };
        drop(in_flight);
        let mut state = member.state();
        state.health.record(started.elapsed(), healthy);
        if healthy {
            state.recent.push(started.elapsed());
            state.breaker.on_success();
        } else {
            state.breaker.on_failure(Instant::now());
        }
        result
    }

    /// The first attempt: `first`, hedged to `second` if it is slower than the hedge delay and
    /// the hedge budget allows. The first good answer wins; the other call is cancelled.
    /// Also says whether `second` was called.
    async fn hedged(
        &self,
        first: usize,
        second: Option<usize>,
        req: &Request,
    ) -> (Result<Answer, UpstreamError>, bool) {
        self.hedges.lock().unwrap_or_else(|e| e.into_inner()).on_call();
        let delay = self.config.hedge.delay(&self.members[first].state().recent);
        let (Some(delay), Some(second)) = (delay, second) else { return (self.call_member(first, req).await, false) };
        let primary = self.call_member(first, req);
        tokio::pin!(primary);
        tokio::select! {
            result = &mut primary => return (result, false),
            _ = tokio::time::sleep(delay) => {}
        }
        let allowed = self.hedges.lock().unwrap_or_else(|e| e.into_inner()).try_hedge()
            && self.members[second].state().breaker.allow(Instant::now());
        if !allowed {
            return (primary.await, false);
        }
        metrics::counter!("sluice_pool_hedges_total").increment(1);
        let backup = self.call_member(second, req);
        tokio::pin!(backup);
        let result = tokio::select! {
            result = &mut primary => if good(&result) { result } else { backup.await },
            result = &mut backup => {
                if good(&result) {
                    metrics::counter!("sluice_pool_hedge_wins_total").increment(1);
                    result
                } else {
                    primary.await
                }
            }
        };
        (result, true)
    }

    /// Sends a transaction to every available member; any acceptance (or "already known")
    /// is success.
    async fn broadcast(&self, req: &Request) -> Result<Answer, UpstreamError> {
        let now = Instant::now();
        let targets: Vec<usize> =
            (0..self.members.len()).filter(|&i| self.members[i].state().breaker.would_allow(now)).collect();
        let targets = if targets.is_empty() { (0..self.members.len()).collect() } else { targets };
        let results = futures_util::future::join_all(targets.iter().map(|&i| self.call_member(i, req))).await;
        let mut fallback: Option<Result<Answer, UpstreamError>> = None;
        for result in results {
            match result {
                Ok(answer @ Answer { outcome: Outcome::Result(_), .. }) => return Ok(answer),
                Ok(Answer { outcome: Outcome::Error(e), .. }) if is_already_known(&e) => {
                    if let Some(hash) = tx_hash(req) {
                        return Ok(Answer::upstream(Outcome::Result(hash)));
                    }
                    fallback = Some(Ok(Answer::upstream(Outcome::Error(e))));
                }
                Ok(answer) => {
                    if !matches!(fallback, Some(Ok(_))) {
                        fallback = Some(Ok(answer));
                    }
                }
                Err(e) => {
                    fallback.get_or_insert(Err(e));
                }
            }
        }
        fallback.unwrap_or(Err(UpstreamError::NoneAvailable))
    }

    /// A JSON snapshot for `/status`.
    pub fn status(&self) -> serde_json::Value {
        let now = Instant::now();
        let best = self.best_head();
        let members: Vec<serde_json::Value> = self
            .members
            .iter()
            .map(|m| {
                let mut s = m.state();
                serde_json::json!({
                    "name": m.client.name(),
                    "tier": m.tier,
                    "weight": m.weight,
                    "circuit": s.breaker.state(now).as_str(),
                    "latency_ms": (s.health.latency_us / 1000.0 * 100.0).round() / 100.0,
                    "error_rate": (s.health.error_rate * 1000.0).round() / 1000.0,
                    "in_flight": s.health.in_flight,
                    "head": s.health.head,
                    "lag": s.health.lag(best),
                    "score": s.health.score(m.weight).round(),
                    "rate_left": s.rate.as_mut().map(|r| r.left(now)),
                    "daily_quota_left": s.quota.as_mut().map(|q| q.left(SystemTime::now())),
                })
            })
            .collect();
        serde_json::json!({ "best_head": best, "upstreams": members })
    }
}

/// A result, or an error that is the request's own fault: an answer to return.
fn good(result: &Result<Answer, UpstreamError>) -> bool {
    match result {
        Ok(Answer { outcome: Outcome::Result(_), .. }) => true,
        Ok(Answer { outcome: Outcome::Error(e), .. }) => judge_error(e) == Verdict::Final,
        Err(_) => false,
    }
}

/// Methods whose answer depends on the head when no block is named.
fn head_bound(req: &Request) -> bool {
    let params = req.params_text();
    if params.contains("\"latest\"")
        || params.contains("\"pending\"")
        || params.contains("\"safe\"")
        || params.contains("\"finalized\"")
    {
        return true;
    }
    let count = serde_json::from_str::<Vec<&RawValue>>(params).map_or(0, |p| p.len());
    match req.method.as_str() {
        "eth_blockNumber"
        | "eth_gasPrice"
        | "eth_maxPriorityFeePerGas"
        | "eth_blobBaseFee"
        | "eth_syncing"
        | "eth_estimateGas"
        | "eth_getLogs" => true,
        // The block parameter is optional and defaults to `latest`.
        "eth_call" | "eth_getBalance" | "eth_getCode" | "eth_getTransactionCount" => count < 2,
        "eth_getStorageAt" => count < 3,
        _ => false,
    }
}

/// keccak256 of the raw transaction bytes: its hash, for "already known" answers.
fn tx_hash(req: &Request) -> Option<Box<RawValue>> {
    use tiny_keccak::{Hasher, Keccak};
    let (hex,): (String,) = serde_json::from_str(req.params_text()).ok()?;
    let hex = hex.strip_prefix("0x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Vec<u8> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16)).collect::<Result<_, _>>().ok()?;
    let mut keccak = Keccak::v256();
    keccak.update(&bytes);
    let mut hash = [0u8; 32];
    keccak.finalize(&mut hash);
    let text: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    RawValue::from_string(format!("\"0x{text}\"")).ok()
}

#[async_trait]
impl Upstreams for Pool {
    async fn call(&self, req: &Request) -> Result<Answer, UpstreamError> {
        if req.method == "eth_sendRawTransaction" {
            return self.broadcast(req).await;
        }
        let order = match self.order(&req.method, head_bound(req)) {
            Order::Try(order) => order,
            Order::OverBudget => return Err(UpstreamError::BudgetExhausted),
        };
        let deadline = tokio::time::Instant::now() + self.config.deadline;
        let mut last: Option<Result<Answer, UpstreamError>> = None;
        let mut tried = vec![false; self.members.len()];
        let mut attempts = 0;
        for (position, &i) in order.iter().enumerate() {
            if attempts >= self.config.max_attempts {
                break;
            }
            if tried[i] || !self.members[i].state().breaker.allow(Instant::now()) {
                continue;
            }
            attempts += 1;
            tried[i] = true;
            let attempt = if attempts == 1 {
                let second = order.get(position + 1).copied();
                Either::Left(async move {
                    let (result, used_second) = self.hedged(i, second, req).await;
                    (result, used_second.then_some(second).flatten())
                })
            } else {
                Either::Right(async move { (self.call_member(i, req).await, None) })
            };
            match tokio::time::timeout_at(deadline, attempt).await {
                Err(_) => {
                    last = Some(Err(UpstreamError::Timeout(self.config.deadline)));
                    break;
                }
                Ok((result, hedged_to)) => {
                    if let Some(j) = hedged_to {
                        tried[j] = true; // already asked this call
                    }
                    if good(&result) {
                        return result;
                    }
                    if result.is_err() {
                        metrics::counter!("sluice_pool_retries_total").increment(1);
                    }
                    last = Some(result);
                }
            }
        }
        last.unwrap_or(Err(UpstreamError::NoneAvailable))
    }

    fn status(&self) -> serde_json::Value {
        Pool::status(self)
    }
}

/// Reads every member's head each interval; doubles as the half-open probe.
async fn probe(pool: Weak<Pool>) {
    let interval = match pool.upgrade() {
        Some(p) => p.config.probe_interval,
        None => return,
    };
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let request = Request::new(Some(Id::number(1)), "eth_blockNumber", None);
        let probes = (0..pool.members.len()).map(|i| {
            let pool = pool.clone();
            let request = request.clone();
            async move {
                let member = &pool.members[i];
                // A member with a daily quota is probed only to close its circuit: probes
                // would otherwise spend the provider's quota.
                let quota = member.state().quota.is_some();
                if quota && member.state().breaker.state(Instant::now()) == Circuit::Closed {
                    return;
                }
                let allowed = member.state().breaker.allow(Instant::now());
                if !allowed {
                    return;
                }
                let head = match pool.call_member(i, &request).await {
                    Ok(Answer { outcome: Outcome::Result(raw), .. }) => serde_json::from_str::<String>(raw.get())
                        .ok()
                        .and_then(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).ok()),
                    _ => None,
                };
                if head.is_some() {
                    member.state().health.head = head;
                }
                let name = member.client.name().to_owned();
                let circuit = member.state().breaker.state(Instant::now());
                metrics::gauge!("sluice_upstream_circuit_open", "upstream" => name.clone())
                    .set((circuit != Circuit::Closed) as u8 as f64);
                if let Some(head) = head {
                    metrics::gauge!("sluice_upstream_head", "upstream" => name).set(head as f64);
                }
            }
        });
        futures_util::future::join_all(probes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, params: &str) -> Request {
        Request::new(Some(Id::number(1)), method, RawValue::from_string(params.into()).ok())
    }

    #[test]
    fn head_bound_reads_are_recognised() {
        assert!(head_bound(&req("eth_getBalance", r#"["0x1","latest"]"#)));
        assert!(head_bound(&req("eth_getBalance", r#"["0x1"]"#)));
        assert!(head_bound(&req("eth_blockNumber", "[]")));
        assert!(!head_bound(&req("eth_getBalance", r#"["0x1","0x10"]"#)));
        assert!(!head_bound(&req("eth_getBlockByHash", r#"["0xab",false]"#)));
    }

    #[test]
    fn transaction_hash_is_keccak_of_the_raw_bytes() {
        // keccak256 of the empty input.
        let hash = tx_hash(&req("eth_sendRawTransaction", r#"["0x"]"#)).unwrap();
        assert_eq!(hash.get(), "\"0xc5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470\"");
        assert!(tx_hash(&req("eth_sendRawTransaction", r#"["0xabc"]"#)).is_none());
    }
}
