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
mod classify;
mod health;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sluice_jsonrpc::{Id, Outcome, RawValue, Request};

pub use breaker::{Breaker, Circuit};
pub use classify::{is_already_known, judge_error, Verdict};
pub use health::Health;

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
}

struct Member {
    client: HttpUpstream,
    tier: u8,
    weight: u32,
    state: Mutex<State>,
}

struct State {
    health: Health,
    breaker: Breaker,
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
                state: Mutex::new(State {
                    health: Health::default(),
                    breaker: Breaker::new(config.breaker_threshold, config.breaker_cooldown),
                }),
            })
            .collect();
        let pool = Arc::new(Self { members, config });
        tokio::spawn(probe(Arc::downgrade(&pool)));
        pool
    }

    fn best_head(&self) -> Option<u64> {
        self.members.iter().filter_map(|m| m.state().health.head).max()
    }

    /// Members to try, best first.
    fn order(&self, head_bound: bool) -> Vec<usize> {
        let now = Instant::now();
        let best = self.best_head();
        let mut candidates: Vec<(u8, f64, usize)> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let state = m.state();
                if !state.breaker.would_allow(now) {
                    return None;
                }
                if head_bound && state.health.lag(best).is_some_and(|lag| lag > self.config.max_lag) {
                    return None;
                }
                Some((m.tier, state.health.score(m.weight), i))
            })
            .collect();
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        candidates.into_iter().map(|(_, _, i)| i).collect()
    }

    /// Calls one member, updating its health and circuit.
    async fn call_member(&self, i: usize, req: &Request) -> Result<Answer, UpstreamError> {
        let member = &self.members[i];
        member.state().health.in_flight += 1;
        let started = Instant::now();
        let result = member.client.call(req).await;
        let healthy = match &result {
            Ok(Answer { outcome: Outcome::Error(e), .. }) => judge_error(e) != Verdict::RetryElsewhere,
            Ok(_) => true,
            Err(_) => false,
        };
        let mut state = member.state();
        state.health.in_flight -= 1;
        state.health.record(started.elapsed(), healthy);
        if healthy {
            state.breaker.on_success();
        } else {
            state.breaker.on_failure(Instant::now());
        }
        result
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
                let s = m.state();
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
                })
            })
            .collect();
        serde_json::json!({ "best_head": best, "upstreams": members })
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
        let deadline = tokio::time::Instant::now() + self.config.deadline;
        let mut last: Option<Result<Answer, UpstreamError>> = None;
        let mut attempts = 0;
        for i in self.order(head_bound(req)) {
            if attempts >= self.config.max_attempts {
                break;
            }
            if !self.members[i].state().breaker.allow(Instant::now()) {
                continue;
            }
            attempts += 1;
            match tokio::time::timeout_at(deadline, self.call_member(i, req)).await {
                Err(_) => {
                    last = Some(Err(UpstreamError::Timeout(self.config.deadline)));
                    break;
                }
                Ok(Ok(answer)) => match &answer.outcome {
                    Outcome::Result(_) => return Ok(answer),
                    Outcome::Error(e) if judge_error(e) == Verdict::Final => return Ok(answer),
                    Outcome::Error(_) => last = Some(Ok(answer)),
                },
                Ok(Err(e)) => {
                    metrics::counter!("sluice_pool_retries_total").increment(1);
                    last = Some(Err(e));
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
