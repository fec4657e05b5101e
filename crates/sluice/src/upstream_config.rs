//! The `[[upstreams]]` entries and the `[pool]` section: the nodes behind a network and how
//! their pool routes, fails over, checks and votes (see docs/upstreams.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The upstream pool (see docs/upstreams.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSection {
    /// Upstreams tried for one call at most.
    pub max_attempts: usize,
    /// Total time for one call across all attempts.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// An upstream further behind the best head is not used for head-bound reads.
    pub max_lag: u64,
    /// Consecutive failures that open an upstream's circuit.
    pub breaker_threshold: u32,
    /// How long an open circuit waits before a probe.
    #[serde(with = "humantime_serde")]
    pub breaker_cooldown: Duration,
    /// How often the prober looks at the upstreams: it reads the head of those it has not
    /// heard from otherwise (their `newHeads`, the head feed's poll, an answer) within about a
    /// block and a half, and of those whose circuit is open.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    /// When to send a slow call to a second upstream too: "p95" (its recent p95, at least
    /// 20 ms), a fixed delay such as "50ms", or "off".
    pub hedge: String,
    /// Hedges may add at most this fraction of extra calls.
    pub hedge_max_extra: f64,
    /// Deadlines by method, e.g. { "eth_getLogs" = "60s", "debug_*" = "120s" }.
    pub method_timeouts: std::collections::BTreeMap<String, String>,
    /// Most calls in one JSON-RPC batch to an upstream (an upstream's own `max_batch` wins).
    pub max_batch: usize,
    /// How long a call may wait for an upstream's `rate` (or a provider's Retry-After): the
    /// queue. Beyond it the call is refused with -32005.
    #[serde(with = "humantime_serde")]
    pub budget_wait: Duration,
    /// Keep upstreams' `rate` and `daily_quota` in this Redis too (`redis://…`), shared by
    /// every replica; absent: each process counts alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_store: Option<String>,
    /// When the budget store fails: let calls through (true, the default; the local budgets
    /// still hold) or refuse them with -32005 (false).
    pub budget_store_fail_open: bool,
    /// How often each upstream's lowest blocks (state, chain data) are searched for again
    /// (a few dozen calls; in between the bounds move up with the head and "missing block"
    /// answers raise them).
    #[serde(with = "humantime_serde")]
    pub range_probe_interval: Duration,
    /// Integrity checks on answers, each on by default (see docs/upstreams.md).
    pub integrity: sluice_upstream::pool::IntegrityConfig,
    /// Methods put to a vote of several upstreams: `[[pool.consensus]] methods = ["eth_call"]
    /// ask = 3 agree = 2`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub consensus: Vec<sluice_upstream::pool::ConsensusRule>,
}

impl PoolSection {
    pub(crate) fn hedge_after(&self) -> Result<sluice_upstream::pool::HedgeAfter, String> {
        use sluice_upstream::pool::HedgeAfter;
        match self.hedge.as_str() {
            "off" => Ok(HedgeAfter::Off),
            "p95" => Ok(HedgeAfter::P95 { floor: Duration::from_millis(20) }),
            fixed => humantime::parse_duration(fixed)
                .map(HedgeAfter::Fixed)
                .map_err(|e| format!("pool.hedge: {fixed:?} is not \"p95\", \"off\" or a duration: {e}")),
        }
    }

    pub(crate) fn method_timeouts(&self) -> Result<Vec<(String, Duration)>, String> {
        self.method_timeouts
            .iter()
            .map(|(method, t)| {
                humantime::parse_duration(t)
                    .map(|d| (method.clone(), d))
                    .map_err(|e| format!("pool.method_timeouts.{method}: {e}"))
            })
            .collect()
    }
}

impl Default for PoolSection {
    fn default() -> Self {
        let d = sluice_upstream::pool::PoolConfig::default();
        Self {
            max_attempts: d.max_attempts,
            deadline: d.deadline,
            max_lag: d.max_lag,
            breaker_threshold: d.breaker_threshold,
            breaker_cooldown: d.breaker_cooldown,
            probe_interval: d.probe_interval,
            hedge: "p95".into(),
            hedge_max_extra: d.hedge_max_extra,
            method_timeouts: Default::default(),
            max_batch: d.max_batch,
            budget_wait: d.budget_wait,
            budget_store: None,
            budget_store_fail_open: true,
            range_probe_interval: d.range_probe_interval,
            integrity: d.integrity,
            consensus: Vec::new(),
        }
    }
}

impl TryFrom<&PoolSection> for sluice_upstream::pool::PoolConfig {
    type Error = String;

    fn try_from(p: &PoolSection) -> Result<Self, String> {
        for rule in &p.consensus {
            rule.validate().map_err(|e| format!("pool.{e}"))?;
        }
        Ok(Self {
            max_attempts: p.max_attempts,
            deadline: p.deadline,
            max_lag: p.max_lag,
            breaker_threshold: p.breaker_threshold,
            breaker_cooldown: p.breaker_cooldown,
            probe_interval: p.probe_interval,
            budget_wait: p.budget_wait,
            shared_budget: None,
            hedge: p.hedge_after()?,
            hedge_max_extra: p.hedge_max_extra,
            method_timeouts: p.method_timeouts()?,
            max_batch: p.max_batch,
            network: "default".to_owned(),
            integrity: p.integrity,
            consensus: p.consensus.clone(),
            range_probe_interval: p.range_probe_interval,
        })
    }
}

/// One upstream node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// `http://` or `ws://` URL. The other one is derived by swapping the scheme (nodes such as
    /// anvil and reth serve both on one port) unless given below.
    pub url: String,
    /// WebSocket URL for subscriptions, when it differs from `url` (geth serves it on 8546).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ws_url: Option<String>,
    /// Name for logs and metrics; defaults to `upstream-N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Deadline for one call.
    #[serde(default = "default_upstream_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Largest answer accepted from this node.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// 0 = primary; higher tiers serve only when lower ones cannot (fallback providers).
    #[serde(default)]
    pub tier: u8,
    /// Relative share among upstreams of one tier.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Extra CA certificates (PEM) to trust for this upstream's TLS, e.g. a private CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Calls in flight to this upstream at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
    /// Most calls in one JSON-RPC batch to this upstream (default `pool.max_batch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<usize>,
    /// Send single calls to this upstream that meet within this window as one JSON-RPC batch
    /// (of at most `max_batch`), e.g. "1ms"; absent: each call its own request.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub batch_window: Option<Duration>,
    /// Requests per second at most (a provider's rate limit), enforced by sluice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Requests per UTC day at most (a provider's quota), enforced by sluice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_quota: Option<u64>,
    /// Only these methods go here (`prefix_*` wildcards); empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// These methods never go here (`prefix_*` wildcards).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_methods: Vec<String>,
    /// It keeps every block and every state: never probed for its range.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub archive: bool,
    /// It keeps the state of this many recent blocks (a pruned node); absent: learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<u64>,
}

fn default_weight() -> u32 {
    1
}

fn default_upstream_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_response_bytes() -> usize {
    256 * 1024 * 1024
}

impl UpstreamConfig {
    /// An upstream with default settings.
    pub fn from_url(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ws_url: None,
            name: None,
            timeout: default_upstream_timeout(),
            max_response_bytes: default_max_response_bytes(),
            tier: 0,
            weight: 1,
            ca_file: None,
            max_concurrency: None,
            max_batch: None,
            batch_window: None,
            rate: None,
            daily_quota: None,
            methods: Vec::new(),
            exclude_methods: Vec::new(),
            archive: false,
            history: None,
        }
    }

    /// What it keeps, as declared.
    pub fn history(&self) -> sluice_upstream::pool::History {
        use sluice_upstream::pool::History;
        match (self.archive, self.history) {
            (true, _) => History::Archive,
            (false, Some(n)) => History::Recent(n),
            (false, None) => History::Unknown,
        }
    }

    /// The URL for calls (`http`) and the one for subscriptions (`ws`).
    pub fn endpoints(&self) -> Result<(String, String), String> {
        let url = url::Url::parse(&self.url).map_err(|e| format!("{:?}: {e}", self.url))?;
        let swap = |to: &str| {
            let mut other = url.clone();
            other
                .set_scheme(to)
                .map(|_| other.to_string())
                .map_err(|_| format!("{:?}: cannot derive a {to} URL", self.url))
        };
        let (http, ws) = match url.scheme() {
            "http" => (self.url.clone(), swap("ws")?),
            "https" => (self.url.clone(), swap("wss")?),
            "ws" => (swap("http")?, self.url.clone()),
            "wss" => (swap("https")?, self.url.clone()),
            other => return Err(format!("{:?}: unsupported scheme {other:?}; use http(s):// or ws(s)://", self.url)),
        };
        let ws = match &self.ws_url {
            Some(ws_url) => {
                let parsed = url::Url::parse(ws_url).map_err(|e| format!("ws_url {ws_url:?}: {e}"))?;
                if !matches!(parsed.scheme(), "ws" | "wss") {
                    return Err(format!("ws_url {ws_url:?}: must be a ws:// or wss:// URL"));
                }
                ws_url.clone()
            }
            None => ws,
        };
        Ok((http, ws))
    }
}
