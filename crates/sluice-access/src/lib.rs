//! Who may call sluice, and how much.
//!
//! * Callers present an API key (`Authorization: Bearer`, `x-api-key`, or the URL path `/KEY`);
//!   each key has a tier, and callers without one get the anonymous tier or are refused.
//! * Per tier: requests per second (GCRA, [`gcra`]) and per UTC day, with optional per-method
//!   weights ("compute units"), and method allow/deny lists.
//! * Quotas live in memory, or in Redis so that every replica shares them (one Lua script per
//!   request: GCRA and the daily count, atomically). Redis down: fail open or closed, counted
//!   and logged once.
//!
//! The decisions ([`gcra::check`], [`Tier::cost`], [`day_of`]) are pure.

pub mod gcra;
mod redis_limiter;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use redis_limiter::RedisLimiter;

/// One tier's limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tier {
    /// Compute units per second (a call costs 1 unless `costs` says otherwise); none: unlimited.
    pub per_second: Option<f64>,
    /// Units that may arrive at once (default: one second's worth).
    pub burst: Option<u32>,
    /// Compute units per UTC day; none: unlimited.
    pub per_day: Option<u64>,
    /// Cost of a method (`prefix*` patterns allowed), e.g. { "eth_getLogs" = 10 }.
    pub costs: HashMap<String, u32>,
    /// Methods this tier may not call (added to the global policy's deny list).
    pub deny: Vec<String>,
    /// Methods this tier may call even when denied (globally or here).
    pub allow: Vec<String>,
    /// Load-shedding priority, 0 (highest, the default) to 9: under overload, a tier of
    /// priority p is refused once the gateway holds (10 − p)/10 of its in-flight capacity.
    pub priority: u8,
    /// WebSocket connections one key may hold open at once (per replica); none: unlimited.
    pub max_connections: Option<u32>,
    /// Subscriptions one key may hold across its connections (per replica); none: unlimited.
    pub max_subscriptions: Option<u32>,
    /// Networks (by id) this tier may use; empty: every network.
    pub networks: Vec<String>,
}

impl Tier {
    /// True when this tier may use the network with this id.
    pub fn serves(&self, network: &str) -> bool {
        self.networks.is_empty() || self.networks.iter().any(|n| n == network)
    }

    /// What a request of these methods costs.
    pub fn cost<'a>(&self, methods: impl IntoIterator<Item = &'a str>) -> u32 {
        methods
            .into_iter()
            .map(|m| {
                let exact = self.costs.get(m).copied();
                let prefix = || {
                    self.costs
                        .iter()
                        .filter(|(p, _)| p.strip_suffix('*').is_some_and(|prefix| m.starts_with(prefix)))
                        .map(|(_, c)| *c)
                        .max()
                };
                exact.or_else(prefix).unwrap_or(1)
            })
            .fold(0u32, u32::saturating_add)
    }

    fn rate(&self) -> Option<gcra::Rate> {
        let per_second = self.per_second?;
        let burst = self.burst.unwrap_or_else(|| per_second.ceil().max(1.0) as u32);
        Some(gcra::Rate { per_second, burst })
    }
}

/// What the access section of the configuration holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// API key → tier name.
    pub keys: HashMap<String, String>,
    /// Tier name → limits.
    pub tiers: HashMap<String, Tier>,
    /// The tier of callers without a key; none: they are refused (401).
    pub anonymous: Option<String>,
    /// Share quotas through Redis (`redis://…`); none: in memory, per replica.
    pub redis_url: Option<String>,
    /// With Redis unreachable, let requests through (true) or refuse them (false).
    pub fail_open: bool,
}

impl AccessConfig {
    /// Every key and the anonymous tier name an existing tier.
    pub fn validate(&self) -> Result<(), String> {
        for (key, tier) in &self.keys {
            if !self.tiers.contains_key(tier) {
                return Err(format!("access.keys: key {}… names tier {tier:?}, which is not defined", prefix(key)));
            }
        }
        if let Some(tier) = &self.anonymous {
            if !self.tiers.contains_key(tier) {
                return Err(format!("access.anonymous: tier {tier:?} is not defined"));
            }
        }
        for (name, tier) in &self.tiers {
            if tier.per_second.is_some_and(|r| r <= 0.0 || !r.is_finite()) {
                return Err(format!("access.tiers.{name}.per_second: must be more than zero"));
            }
        }
        Ok(())
    }
}

fn prefix(key: &str) -> &str {
    key.get(..4).unwrap_or(key)
}

/// An identified caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The quota bucket: the key, or `anonymous`.
    pub id: String,
    /// Its tier's name.
    pub tier: String,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// No key, or an unknown key, and no anonymous tier: HTTP 401.
    Unauthorized(String),
    /// Over a quota: HTTP 429 with `Retry-After`, JSON-RPC -32005.
    OverQuota {
        /// Which quota.
        what: &'static str,
        /// When to come back.
        retry_after: Duration,
    },
    /// The shared quota store is unreachable and the configuration says fail closed: 503.
    Unavailable,
    /// The caller's tier may not use this network: HTTP 403.
    Forbidden(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unauthorized(why) => write!(f, "unauthorized: {why}"),
            Refusal::OverQuota { what, retry_after } => {
                write!(f, "rate limited: {what} quota exceeded; retry after {} s", retry_after.as_secs().max(1))
            }
            Refusal::Unavailable => write!(f, "quota store unavailable; try again later"),
            Refusal::Forbidden(why) => write!(f, "forbidden: {why}"),
        }
    }
}

/// The UTC day number of a Unix time, and the time left in that day.
pub fn day_of(now_ms: u64) -> (u64, Duration) {
    let day_ms = 86_400_000;
    (now_ms / day_ms, Duration::from_millis(day_ms - now_ms % day_ms))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Keys, tiers and the quota store.
pub struct Access {
    config: AccessConfig,
    store: Store,
}

enum Store {
    Memory(Mutex<HashMap<String, Bucket>>),
    Redis(RedisLimiter),
}

#[derive(Default)]
struct Bucket {
    tat_ms: f64,
    day: u64,
    used_today: u64,
}

impl Access {
    /// Builds the access control from its configuration.
    pub fn new(config: AccessConfig) -> Result<Self, String> {
        config.validate()?;
        let store = match &config.redis_url {
            Some(url) => Store::Redis(RedisLimiter::new(url, config.fail_open)?),
            None => Store::Memory(Mutex::new(HashMap::new())),
        };
        Ok(Self { config, store })
    }

    /// Who is calling, from the key presented (if any).
    pub fn identify(&self, key: Option<&str>) -> Result<Caller, Refusal> {
        match key {
            Some(key) => match self.config.keys.get(key) {
                Some(tier) => Ok(Caller { id: key.to_owned(), tier: tier.clone() }),
                None => Err(Refusal::Unauthorized("unknown API key".into())),
            },
            None => match &self.config.anonymous {
                Some(tier) => Ok(Caller { id: "anonymous".into(), tier: tier.clone() }),
                None => Err(Refusal::Unauthorized("an API key is required".into())),
            },
        }
    }

    /// The caller's tier.
    pub fn tier(&self, caller: &Caller) -> Option<&Tier> {
        self.config.tiers.get(&caller.tier)
    }

    /// Refuses `caller` on a network its tier does not list.
    pub fn admit_to(&self, caller: &Caller, network: &str) -> Result<(), Refusal> {
        match self.tier(caller) {
            Some(tier) if tier.serves(network) => Ok(()),
            Some(_) => Err(Refusal::Forbidden(format!("this key may not use the network {network}"))),
            None => Err(Refusal::Unauthorized("no such tier".into())),
        }
    }

    /// Charges `caller` for one request of these methods, or refuses it.
    pub async fn charge(&self, caller: &Caller, methods: &[&str]) -> Result<(), Refusal> {
        let Some(tier) = self.tier(caller) else { return Err(Refusal::Unauthorized("no such tier".into())) };
        let cost = tier.cost(methods.iter().copied());
        let (rate, per_day) = (tier.rate(), tier.per_day);
        if rate.is_none() && per_day.is_none() {
            return Ok(());
        }
        let result = match &self.store {
            Store::Memory(buckets) => charge_memory(buckets, &caller.id, rate, per_day, cost, now_ms()),
            Store::Redis(redis) => redis.charge(&caller.id, rate, per_day, cost, now_ms()).await,
        };
        if let Err(refusal) = &result {
            let what = match refusal {
                Refusal::OverQuota { what, .. } => *what,
                Refusal::Unavailable => "store_unavailable",
                Refusal::Unauthorized(_) => "unauthorized",
                Refusal::Forbidden(_) => "network",
            };
            metrics::counter!("sluice_access_refused_total", "tier" => caller.tier.clone(), "why" => what).increment(1);
        }
        result
    }
}

fn charge_memory(
    buckets: &Mutex<HashMap<String, Bucket>>,
    id: &str,
    rate: Option<gcra::Rate>,
    per_day: Option<u64>,
    cost: u32,
    now: u64,
) -> Result<(), Refusal> {
    // The lock covers arithmetic only: no I/O, no await.
    let mut buckets = buckets.lock().unwrap_or_else(|e| e.into_inner());
    let bucket = buckets.entry(id.to_owned()).or_default();
    let (day, rest_of_day) = day_of(now);
    if bucket.day != day {
        bucket.day = day;
        bucket.used_today = 0;
    }
    if per_day.is_some_and(|limit| bucket.used_today + u64::from(cost) > limit) {
        return Err(Refusal::OverQuota { what: "daily", retry_after: rest_of_day });
    }
    let mut tat = bucket.tat_ms;
    if let Some(rate) = rate {
        match gcra::check(rate, bucket.tat_ms, now as f64, cost) {
            gcra::Verdict::Allow { tat_ms } => tat = tat_ms,
            gcra::Verdict::Deny { retry_after_ms } => {
                return Err(Refusal::OverQuota {
                    what: "per-second",
                    retry_after: Duration::from_millis(retry_after_ms.ceil() as u64),
                })
            }
        }
    }
    bucket.tat_ms = tat;
    bucket.used_today += u64::from(cost);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AccessConfig {
        let mut tiers = HashMap::new();
        tiers.insert(
            "free".to_owned(),
            Tier {
                per_second: Some(2.0),
                per_day: Some(5),
                costs: [("eth_getLogs".to_owned(), 3)].into_iter().collect(),
                ..Tier::default()
            },
        );
        tiers.insert("pro".to_owned(), Tier::default());
        AccessConfig {
            keys: [("k-free".to_owned(), "free".to_owned()), ("k-pro".to_owned(), "pro".to_owned())]
                .into_iter()
                .collect(),
            tiers,
            ..AccessConfig::default()
        }
    }

    #[test]
    fn keys_name_tiers_and_anonymous_callers_follow_the_policy() {
        let access = Access::new(config()).unwrap();
        assert_eq!(access.identify(Some("k-pro")).unwrap().tier, "pro");
        assert!(matches!(access.identify(Some("nope")), Err(Refusal::Unauthorized(_))));
        assert!(matches!(access.identify(None), Err(Refusal::Unauthorized(_))));
        let open = Access::new(AccessConfig { anonymous: Some("free".into()), ..config() }).unwrap();
        assert_eq!(open.identify(None).unwrap().id, "anonymous");
        let bad = AccessConfig { anonymous: Some("gold".into()), ..config() };
        assert!(Access::new(bad).is_err());
    }

    #[test]
    fn costs_follow_method_weights() {
        let tier = &config().tiers["free"];
        assert_eq!(tier.cost(["eth_call", "eth_getLogs", "eth_chainId"]), 5);
    }

    #[test]
    fn per_second_and_daily_quotas_refuse_with_when_to_come_back() {
        let buckets = Mutex::new(HashMap::new());
        let rate = Some(gcra::Rate { per_second: 2.0, burst: 2 });
        let t0 = 1_000_000_000_000;
        assert!(charge_memory(&buckets, "a", rate, Some(5), 1, t0).is_ok());
        assert!(charge_memory(&buckets, "a", rate, Some(5), 1, t0).is_ok());
        let Err(Refusal::OverQuota { what, retry_after }) = charge_memory(&buckets, "a", rate, Some(5), 1, t0) else {
            panic!("over the burst")
        };
        assert_eq!((what, retry_after), ("per-second", Duration::from_millis(500)));
        assert!(charge_memory(&buckets, "b", rate, Some(5), 1, t0).is_ok(), "buckets are per caller");
        assert!(charge_memory(&buckets, "a", rate, Some(5), 3, t0 + 5_000).is_err(), "cost 3 over a burst of 2");
        assert!(charge_memory(&buckets, "a", rate, Some(5), 2, t0 + 5_000).is_ok());
        let Err(Refusal::OverQuota { what, .. }) = charge_memory(&buckets, "a", rate, Some(5), 2, t0 + 10_000) else {
            panic!("over the day")
        };
        assert_eq!(what, "daily");
        assert!(charge_memory(&buckets, "a", rate, Some(5), 1, t0 + 86_400_000).is_ok(), "a new day");
    }
}
