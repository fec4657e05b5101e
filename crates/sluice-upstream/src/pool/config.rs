//! What a pool is built from: its settings, its members' settings, and the budgets it may
//! share with other replicas.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{ConsensusRule, HedgeAfter, History, IntegrityConfig, MethodFilter};
use crate::{HttpUpstream, Node};

/// Budgets kept outside this process (in Redis), so that replicas together stay under a
/// provider's limits.
#[async_trait]
pub trait SharedBudget: Send + Sync + std::fmt::Debug + 'static {
    /// Takes up to `n` calls of the budgets of member `key` (`rate` per second, `daily` per
    /// UTC day), shared by every replica; gives how many may be sent.
    async fn take(&self, key: &str, rate: Option<f64>, daily: Option<u64>, n: usize) -> usize;
}

/// Settings of the whole upstream pool.
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
    /// How often the prober looks at the members: it reads the head of those whose head it
    /// has not learned otherwise within about a block and a half, and of those whose circuit
    /// is open.
    pub probe_interval: Duration,
    /// When to send a slow call to a second member as well.
    pub hedge: HedgeAfter,
    /// Hedges may add at most this fraction of extra calls (0.1 = 10 %).
    pub hedge_max_extra: f64,
    /// Deadlines by method (`prefix_*` wildcards), instead of the member's own timeout.
    pub method_timeouts: Vec<(String, Duration)>,
    /// Most calls in one JSON-RPC batch to a member; longer groups are split.
    pub max_batch: usize,
    /// The network the pool serves: the `network` label of the members' gauges.
    pub network: String,
    /// How long a call may wait for a member's rate (its queue) before it is refused with
    /// -32005.
    pub budget_wait: Duration,
    /// Members' `rate` and `daily_quota` kept across replicas too (Redis); `None`: per process.
    pub shared_budget: Option<Arc<dyn SharedBudget>>,
    /// Which integrity checks are on.
    pub integrity: IntegrityConfig,
    /// Methods put to a vote of several members.
    pub consensus: Vec<ConsensusRule>,
    /// How often each member's lowest blocks are searched for again (a few dozen calls each).
    /// Between searches the bounds move up with the head, and answers of "missing block"
    /// raise them.
    pub range_probe_interval: Duration,
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
            max_batch: 100,
            network: "default".to_owned(),
            budget_wait: Duration::from_secs(1),
            shared_budget: None,
            integrity: IntegrityConfig::default(),
            consensus: Vec::new(),
            range_probe_interval: Duration::from_secs(6 * 3600),
        }
    }
}

/// One member as configured.
pub struct MemberConfig<N: Node = HttpUpstream> {
    /// Its client.
    pub client: N,
    /// 0 = primary; higher tiers are used only when lower ones cannot serve.
    pub tier: u8,
    /// Relative share among members of one tier.
    pub weight: u32,
    /// Which methods it serves.
    pub filter: MethodFilter,
    /// Calls in flight at most.
    pub max_concurrency: Option<usize>,
    /// Most calls in one batch to it (default: the pool's `max_batch`).
    pub max_batch: Option<usize>,
    /// Requests per second at most (the provider's rate limit).
    pub rate: Option<f64>,
    /// Requests per UTC day at most (the provider's quota).
    pub daily_quota: Option<u64>,
    /// What it keeps of the chain's history, when declared; otherwise learned.
    pub history: History,
}

impl<N: Node> MemberConfig<N> {
    /// A member with no limits.
    pub fn new(client: N) -> Self {
        Self {
            client,
            tier: 0,
            weight: 1,
            filter: MethodFilter::default(),
            max_concurrency: None,
            max_batch: None,
            rate: None,
            daily_quota: None,
            history: History::Unknown,
        }
    }
}
