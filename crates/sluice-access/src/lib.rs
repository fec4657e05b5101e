//! Who may call sluice, and how much.
//!
//! * Callers present an API key (`Authorization: Bearer`, `x-api-key`, or the URL path `/KEY`)
//!   or a JSON Web Token ([`jwt`]); each key or token has a tier, and callers without one get
//!   the anonymous tier or are refused. Keys come from the configuration file and from the
//!   admin API ([`manage`]), kept in Redis or a file ([`store`]) and looked up in a book that
//!   readers never wait for ([`keys`]).
//! * Client addresses are checked against CIDR rules globally, per tier and per key ([`ip`]);
//!   a key or token may be limited to networks, methods and contracts ([`scope`]).
//! * Per tier: requests per second (GCRA, [`gcra`]) and per UTC day, with optional per-method
//!   weights ("compute units"), and method allow/deny lists.
//! * Quotas live in memory, or in Redis so that every replica shares them (one Lua script per
//!   request: GCRA and the daily count, atomically). Redis down: fail open or closed, counted
//!   and logged once. Usage is tallied per caller, day and method ([`usage`]).
//!
//! The decisions ([`gcra::check`], [`Tier::cost`], [`day_of`], [`ip::client_ip`],
//! [`scope::Scope::admit_call`]) are pure.

mod buckets;
mod config;
pub mod gcra;
pub mod ip;
pub mod jwt;
pub mod keys;
pub mod manage;
mod redis_limiter;
pub mod scope;
pub mod store;
pub mod usage;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

pub use config::{AccessConfig, AdminConfig, KeyEntry, KeySpec, Tier};
pub use redis_limiter::RedisLimiter;

use ip::IpRules;
use keys::KeyBook;
use scope::Scope;
use store::KeyStore;
use usage::Usage;

/// An identified caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The quota and usage bucket: the key's id, `jwt:<subject>`, or `anonymous`.
    pub id: String,
    /// Its tier's name.
    pub tier: String,
    /// What its key or token limits it to.
    pub scope: Arc<Scope>,
    /// The key's id, for keys (checked again when keys change).
    pub key_id: Option<String>,
    /// When its token runs out, Unix milliseconds (tokens only).
    pub expires_ms: Option<u64>,
    /// Where it called from.
    pub client_ip: Option<IpAddr>,
}

/// What a request presents.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The API key or bearer token, if any.
    pub key: Option<&'a str>,
    /// The client's address (see [`Access::client_ip`]); none for in-process callers.
    pub client_ip: Option<IpAddr>,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// No key, an unknown or revoked key, or a bad token, and no anonymous tier: HTTP 401.
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
    /// The caller may not use this network, or not from this address: HTTP 403.
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

/// Now, Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Keys, tokens, tiers, address rules, the quota store and usage.
pub struct Access {
    /// What a reload replaces: tiers, rules, tokens. Readers never wait for a reload.
    rules: ArcSwap<Rules>,
    store: Store,
    book: Arc<KeyBook>,
    keys: Arc<KeyStore>,
    usage: Arc<Usage>,
    /// Serialises key changes made through this process (the file store writes whole).
    writes: tokio::sync::Mutex<()>,
}

/// The parts of the configuration a reload may change, ready to use.
struct Rules {
    config: AccessConfig,
    tiers: HashMap<String, Arc<Tier>>,
    jwt: Option<jwt::Jwt>,
    ips: IpRules,
    tier_ips: HashMap<String, IpRules>,
}

impl Rules {
    fn new(config: AccessConfig) -> Result<Self, String> {
        let jwt = config.jwt.as_ref().map(jwt::Jwt::new).transpose()?;
        let ips = IpRules::new(&config.allow_ips, &config.deny_ips);
        let tier_ips = config.tiers.iter().map(|(n, t)| (n.clone(), IpRules::new(&t.allow_ips, &t.deny_ips))).collect();
        let tiers = config.tiers.iter().map(|(n, t)| (n.clone(), Arc::new(t.clone()))).collect();
        Ok(Self { config, tiers, jwt, ips, tier_ips })
    }
}

enum Store {
    Memory(Mutex<buckets::Buckets>),
    Redis(RedisLimiter),
}

impl Access {
    /// Builds the access control from its configuration. Managed keys are read by
    /// [`Access::start`].
    pub fn new(config: AccessConfig) -> Result<Self, String> {
        config.validate()?;
        let store = match &config.redis_url {
            Some(url) => Store::Redis(RedisLimiter::new(url, config.fail_open)?),
            None => Store::Memory(Mutex::new(buckets::Buckets::default())),
        };
        let book = Arc::new(KeyBook::new(config.keys.iter().map(|(k, e)| (k.clone(), e.spec())))?);
        let keys = match (&config.redis_url, &config.admin) {
            (Some(url), _) => KeyStore::Redis(store::RedisKeys::new(url)?),
            (None, Some(admin)) => KeyStore::File(admin.keys_file.clone().unwrap_or_else(|| "sluice-keys.json".into())),
            (None, None) => KeyStore::Memory,
        };
        let usage = Arc::new(Usage::new(config.redis_url.as_deref(), config.tiers.keys().map(String::as_str))?);
        Ok(Self {
            rules: ArcSwap::from_pointee(Rules::new(config)?),
            store,
            book,
            keys: Arc::new(keys),
            usage,
            writes: tokio::sync::Mutex::new(()),
        })
    }

    /// Takes a new configuration while serving (SIGHUP): tiers, the configured keys, address
    /// rules, tokens and the anonymous tier change at once; quotas already spent, managed
    /// keys and usage stay. Where quotas and keys are stored (`redis_url`, `fail_open`,
    /// `admin`) needs a restart: such a change is refused and nothing changes.
    pub fn reload(&self, config: AccessConfig) -> Result<(), String> {
        config.validate()?;
        let old = self.rules.load();
        let stores = |c: &AccessConfig| serde_json::json!({ "redis_url": c.redis_url, "fail_open": c.fail_open, "admin": c.admin });
        if stores(&old.config) != stores(&config) {
            return Err("access.redis_url, access.fail_open and access.admin need a restart to change".into());
        }
        let configured = keys::configured(config.keys.iter().map(|(k, e)| (k.clone(), e.spec())))?;
        let rules = Rules::new(config)?;
        self.rules.store(Arc::new(rules));
        self.book.replace_configured(configured);
        Ok(())
    }

    /// Reads the managed keys, then keeps them in step with the store (Redis) and flushes
    /// usage to it. A keys file that cannot be read is an error; Redis not answering yet is
    /// not (the keys arrive when it does).
    pub async fn start(&self) -> Result<(), String> {
        match self.keys.load().await {
            Ok(records) => {
                self.book.replace_managed(records);
            }
            Err(e) if matches!(*self.keys, KeyStore::Redis(_)) => {
                tracing::warn!(error = %e, "managed keys not read from Redis yet; retrying");
            }
            Err(e) => return Err(format!("access.admin.keys_file: {e}")),
        }
        self.keys.clone().spawn_sync(Arc::downgrade(&self.book));
        self.usage.spawn_flush();
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> AccessConfig {
        self.rules.load().config.clone()
    }

    /// The client's address: the socket's peer, or what a trusted proxy forwarded.
    pub fn client_ip(&self, peer: IpAddr, x_forwarded_for: Option<&str>, forwarded: Option<&str>) -> IpAddr {
        ip::client_ip(peer, x_forwarded_for, forwarded, &self.rules.load().config.trusted_proxies)
    }

    /// Who is calling, from what it presents; refused (401, or 403 for addresses) otherwise.
    pub fn identify(&self, credentials: Credentials<'_>) -> Result<Caller, Refusal> {
        let ip = credentials.client_ip;
        let rules = self.rules.load();
        if !rules.ips.permits(ip) {
            return Err(Refusal::Forbidden(format!("calls from {} are not accepted here", shown(ip))));
        }
        let caller = match credentials.key {
            Some(token) if rules.jwt.is_some() && jwt::looks_like_jwt(token) => {
                let grant = rules.jwt.as_ref().map_or(Err(jwt::TokenError::Malformed), |j| j.check(token, now_ms()));
                let grant = grant.map_err(|e| Refusal::Unauthorized(e.to_string()))?;
                if !rules.tiers.contains_key(&grant.tier) {
                    return Err(Refusal::Unauthorized(format!("token claim tier {:?} is not a tier here", grant.tier)));
                }
                Caller {
                    id: grant.subject.clone(),
                    tier: grant.tier.clone(),
                    scope: grant.scope.clone(),
                    key_id: None,
                    expires_ms: Some(grant.expires_ms),
                    client_ip: ip,
                }
            }
            Some(key) => {
                let entry = self.book.lookup(key).ok_or_else(|| Refusal::Unauthorized("unknown API key".into()))?;
                self.caller_of(&entry, ip)?
            }
            None => match &rules.config.anonymous {
                Some(tier) => Caller {
                    id: "anonymous".into(),
                    tier: tier.clone(),
                    scope: Arc::default(),
                    key_id: None,
                    expires_ms: None,
                    client_ip: ip,
                },
                None => return Err(Refusal::Unauthorized("an API key is required".into())),
            },
        };
        if rules.tier_ips.get(&caller.tier).is_some_and(|rules| !rules.permits(ip)) {
            return Err(Refusal::Forbidden(format!("this tier may not be used from {}", shown(ip))));
        }
        Ok(caller)
    }

    fn caller_of(&self, entry: &keys::Entry, ip: Option<IpAddr>) -> Result<Caller, Refusal> {
        if !entry.ips.permits(ip) {
            return Err(Refusal::Forbidden(format!("this key may not be used from {}", shown(ip))));
        }
        Ok(Caller {
            id: entry.id.clone(),
            tier: entry.spec.tier.clone(),
            scope: entry.scope.clone(),
            key_id: Some(entry.id.clone()),
            expires_ms: None,
            client_ip: ip,
        })
    }

    /// `caller` as the keys are now (a long-lived session checks again when they change):
    /// refused once its key is revoked or its token has run out.
    pub fn refresh(&self, caller: &Caller) -> Result<Caller, Refusal> {
        if caller.expires_ms.is_some_and(|exp| exp <= now_ms()) {
            return Err(Refusal::Unauthorized("token expired".into()));
        }
        let Some(id) = &caller.key_id else { return Ok(caller.clone()) };
        let entry = self.book.by_id(id).ok_or_else(|| Refusal::Unauthorized("API key revoked".into()))?;
        let refreshed = self.caller_of(&entry, caller.client_ip)?;
        if self.tier(&refreshed).is_none() {
            return Err(Refusal::Unauthorized("no such tier".into()));
        }
        Ok(refreshed)
    }

    /// Ticks whenever keys are created, changed or revoked.
    pub fn key_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.book.changes()
    }

    /// The caller's tier, as configured now.
    pub fn tier(&self, caller: &Caller) -> Option<Arc<Tier>> {
        self.rules.load().tiers.get(&caller.tier).cloned()
    }

    /// True when `name` is a tier now.
    pub fn has_tier(&self, name: &str) -> bool {
        self.rules.load().tiers.contains_key(name)
    }

    /// The tiers' names now, sorted.
    pub fn tier_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.rules.load().tiers.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Refuses `caller` on a network its tier or its key's scope does not list.
    pub fn admit_to(&self, caller: &Caller, network: &str) -> Result<(), Refusal> {
        match self.tier(caller) {
            Some(tier) if !tier.serves(network) => {
                Err(Refusal::Forbidden(format!("this key may not use the network {network}")))
            }
            Some(_) => caller.scope.admit_network(network).map_err(Refusal::Forbidden),
            None => Err(Refusal::Unauthorized("no such tier".into())),
        }
    }

    /// Charges `caller` for one request of these methods, or refuses it; counts its usage.
    pub async fn charge(&self, caller: &Caller, methods: &[&str]) -> Result<(), Refusal> {
        let Some(tier) = self.tier(caller) else { return Err(Refusal::Unauthorized("no such tier".into())) };
        let calls: Vec<(&str, u32)> = methods.iter().map(|m| (*m, tier.cost_of(m))).collect();
        let cost = calls.iter().fold(0u32, |sum, (_, c)| sum.saturating_add(*c));
        let (rate, per_day) = (tier.rate(), tier.per_day);
        let now = now_ms();
        let result = match (&self.store, rate.is_none() && per_day.is_none()) {
            (_, true) => Ok(()),
            (Store::Memory(buckets), _) => buckets::charge_memory(buckets, &caller.id, rate, per_day, cost, now),
            (Store::Redis(redis), _) => redis.charge(&caller.id, rate, per_day, cost, now).await,
        };
        match &result {
            Ok(()) => self.usage.record(&caller.id, &caller.tier, day_of(now).0, &calls),
            Err(refusal) => {
                let what = match refusal {
                    Refusal::OverQuota { what, .. } => *what,
                    Refusal::Unavailable => "store_unavailable",
                    Refusal::Unauthorized(_) => "unauthorized",
                    Refusal::Forbidden(_) => "network",
                };
                metrics::counter!("sluice_access_refused_total", "tier" => caller.tier.clone(), "why" => what)
                    .increment(1);
            }
        }
        result
    }
}

/// An address for a message.
fn shown(ip: Option<IpAddr>) -> String {
    ip.map_or_else(|| "an unknown address".into(), |ip| ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(key: Option<&str>) -> Credentials<'_> {
        Credentials { key, client_ip: None }
    }

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
            keys: [
                ("k-free".to_owned(), KeyEntry::Tier("free".into())),
                ("k-pro".to_owned(), KeyEntry::Tier("pro".into())),
            ]
            .into_iter()
            .collect(),
            tiers,
            ..AccessConfig::default()
        }
    }

    #[test]
    fn keys_name_tiers_and_anonymous_callers_follow_the_policy() {
        let access = Access::new(config()).unwrap();
        assert_eq!(access.identify(key(Some("k-pro"))).unwrap().tier, "pro");
        assert!(matches!(access.identify(key(Some("nope"))), Err(Refusal::Unauthorized(_))));
        assert!(matches!(access.identify(key(None)), Err(Refusal::Unauthorized(_))));
        let open = Access::new(AccessConfig { anonymous: Some("free".into()), ..config() }).unwrap();
        assert_eq!(open.identify(key(None)).unwrap().id, "anonymous");
        let bad = AccessConfig { anonymous: Some("gold".into()), ..config() };
        assert!(Access::new(bad).is_err());
    }

    #[test]
    fn costs_follow_method_weights() {
        let tier = &config().tiers["free"];
        assert_eq!(tier.cost(["eth_call", "eth_getLogs", "eth_chainId"]), 5);
    }
}
