//! `[[networks]]`: several chains served by one sluice, each at its own path.
//!
//! Each network has an id (its path, `/eth`), a chain id (`/evm/1`), its upstreams, and its own
//! `cache`, `mempool`, `logs`, `pool`, `aggregate`, `subscriptions` and `verify` sections: the top-level sections are the defaults, and
//! a network's own table changes only the keys it names. Without `[[networks]]` the top-level
//! upstreams and sections are one implicit network, served at `/` as always.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{CacheConfig, Config, LogsSection, MempoolSection, PoolSection, UpstreamConfig};

/// The id of the implicit network (no `[[networks]]`).
pub const IMPLICIT: &str = sluice_upstream::DEFAULT_NETWORK;

/// One `[[networks]]` entry as written: its sections are partial tables over the top level's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// The path alias: `/eth`. Letters, digits, `-` and `_`.
    pub id: String,
    /// The chain id its upstreams must report: `/evm/{chain_id}`.
    pub chain_id: u64,
    /// Served at `/` too (at most one network; the only one is the default anyway).
    #[serde(default)]
    pub default: bool,
    /// Its nodes.
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
    /// Keys of `[cache]` this network sets differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Value>,
    /// Keys of `[mempool]` this network sets differently (its journal is its own file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mempool: Option<Value>,
    /// Keys of `[logs]` this network sets differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<Value>,
    /// Keys of `[pool]` this network sets differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Value>,
    /// Keys of `[aggregate]` this network sets differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<Value>,
    /// Keys of `[subscriptions]` this network sets differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriptions: Option<Value>,
    /// Keys of `[verify]` this network sets differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Value>,
    /// Its own QUIC transaction ingress; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<sluice_ingress::IngressConfig>,
}

/// One network with its sections resolved: what `sluice serve` builds a stack from.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Its id (`default` for the implicit network).
    pub id: String,
    /// The chain id it must be on; `None` for the implicit network (whatever its nodes say,
    /// as long as they agree).
    pub chain_id: Option<u64>,
    /// Served at `/`.
    pub default: bool,
    /// Where its keys are in the configuration: `networks[eth].`, or nothing.
    pub prefix: String,
    /// Its nodes.
    pub upstreams: Vec<UpstreamConfig>,
    /// Its cache.
    pub cache: CacheConfig,
    /// Its mempool.
    pub mempool: MempoolSection,
    /// Its `eth_getLogs` splitting.
    pub logs: LogsSection,
    /// Its upstream pool.
    pub pool: PoolSection,
    /// Its Multicall3 aggregation.
    pub aggregate: sluice_multicall::AggregateConfig,
    /// Its subscription hub.
    pub subscriptions: sluice_subscriptions::SubscriptionsConfig,
    /// Its verified reads.
    pub verify: sluice_verify::VerifyConfig,
    /// Its QUIC ingress.
    pub ingress: Option<sluice_ingress::IngressConfig>,
    /// The Redis its replicas follow its chain through (one follower per deployment); `None`:
    /// this replica follows by itself.
    pub shared_heads: Option<String>,
}

/// The Redis through which replicas share head following: `[cluster] redis_url`, else the
/// network's `[cache.redis] url`; none when `[cluster] share_heads = false`.
fn shared_heads(cluster: &sluice_cluster::ClusterConfig, cache: &CacheConfig) -> Option<String> {
    if !cluster.share_heads {
        return None;
    }
    cluster.redis_url.clone().or_else(|| cache.redis.as_ref().map(|r| r.url.clone()))
}

impl Config {
    /// The networks to serve, each with its sections resolved, or what is wrong with them.
    pub fn networks(&self) -> anyhow::Result<Vec<NetworkConfig>> {
        if self.networks.is_empty() {
            return Ok(vec![NetworkConfig {
                id: IMPLICIT.into(),
                chain_id: None,
                default: true,
                prefix: String::new(),
                upstreams: self.upstreams.clone(),
                cache: self.cache.clone(),
                mempool: self.mempool.clone(),
                logs: self.logs.clone(),
                pool: self.pool.clone(),
                aggregate: self.aggregate.clone(),
                subscriptions: self.subscriptions.clone(),
                verify: self.verify.clone(),
                ingress: self.ingress.clone(),
                shared_heads: shared_heads(&self.cluster, &self.cache),
            }]);
        }
        anyhow::ensure!(
            self.upstreams.is_empty(),
            "upstreams: with [[networks]], each network lists its own ([[networks.upstreams]]); \
             --upstream and SLUICE_UPSTREAM are for a single network"
        );
        anyhow::ensure!(
            self.ingress.is_none(),
            "ingress: with [[networks]], give each network its own [networks.ingress]"
        );
        let mut resolved: Vec<NetworkConfig> = Vec::with_capacity(self.networks.len());
        for (i, n) in self.networks.iter().enumerate() {
            let at = format!("networks[{}].", if n.id.is_empty() { i.to_string() } else { n.id.clone() });
            check_id(&n.id).map_err(|e| anyhow::anyhow!("{at}id: {e}"))?;
            if let Some(other) = resolved.iter().find(|o| o.id == n.id) {
                anyhow::bail!("{at}id: {:?} is used twice ({}id)", n.id, other.prefix);
            }
            if let Some(other) = resolved.iter().find(|o| o.chain_id == Some(n.chain_id)) {
                anyhow::bail!("{at}chain_id: {} is also {}chain_id", n.chain_id, other.prefix);
            }
            let mut mempool: MempoolSection = inherit(&self.mempool, n.mempool.as_ref(), &at, "mempool")?;
            let own_journal = n.mempool.as_ref().and_then(|m| m.get("journal")).is_some();
            if !own_journal {
                mempool.journal = journal_of(&self.mempool.journal, &n.id);
            }
            let cache: CacheConfig = inherit(&self.cache, n.cache.as_ref(), &at, "cache")?;
            resolved.push(NetworkConfig {
                id: n.id.clone(),
                chain_id: Some(n.chain_id),
                default: n.default,
                upstreams: n.upstreams.clone(),
                shared_heads: shared_heads(&self.cluster, &cache),
                cache,
                mempool,
                logs: inherit(&self.logs, n.logs.as_ref(), &at, "logs")?,
                pool: inherit(&self.pool, n.pool.as_ref(), &at, "pool")?,
                aggregate: inherit(&self.aggregate, n.aggregate.as_ref(), &at, "aggregate")?,
                subscriptions: inherit(&self.subscriptions, n.subscriptions.as_ref(), &at, "subscriptions")?,
                verify: inherit(&self.verify, n.verify.as_ref(), &at, "verify")?,
                ingress: n.ingress.clone(),
                prefix: at,
            });
        }
        let defaults: Vec<&str> = resolved.iter().filter(|n| n.default).map(|n| n.id.as_str()).collect();
        anyhow::ensure!(defaults.len() <= 1, "networks: only one may be the default, not {}", defaults.join(" and "));
        let with_mempool = || resolved.iter().filter(|n| n.mempool.enabled);
        for n in with_mempool() {
            if let Some(other) = with_mempool().find(|o| o.id != n.id && o.mempool.journal == n.mempool.journal) {
                anyhow::bail!(
                    "{}mempool.journal: {} is also {}mempool.journal",
                    n.prefix,
                    n.mempool.journal.display(),
                    other.prefix
                );
            }
        }
        let ingresses = || resolved.iter().filter_map(|n| n.ingress.as_ref().map(|i| (n, i.listen)));
        for (n, listen) in ingresses() {
            if let Some((other, _)) = ingresses().find(|(o, l)| o.id != n.id && *l == listen) {
                anyhow::bail!("{}ingress.listen: {listen} is also {}ingress.listen", n.prefix, other.prefix);
            }
        }
        Ok(resolved)
    }
}

impl NetworkConfig {
    /// Checks one network's upstreams and sections; every error names the network's key
    /// (`networks[eth].pool.max_batch`, or `pool.max_batch` for the implicit network).
    pub fn validate(&self) -> anyhow::Result<()> {
        let at = &self.prefix;
        if self.upstreams.is_empty() {
            match at.is_empty() {
                true => anyhow::bail!("no upstream: give --upstream URL, SLUICE_UPSTREAM or [[upstreams]] in the file"),
                false => anyhow::bail!("{at}upstreams: none: give the network [[networks.upstreams]]"),
            }
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            upstream.endpoints().map_err(|e| anyhow::anyhow!("{at}upstreams[{i}].url: {e}"))?;
            anyhow::ensure!(!upstream.timeout.is_zero(), "{at}upstreams[{i}].timeout: must be more than zero");
            anyhow::ensure!(upstream.weight > 0, "{at}upstreams[{i}].weight: must be more than zero");
            anyhow::ensure!(upstream.rate.is_none_or(|r| r > 0.0), "{at}upstreams[{i}].rate: must be more than zero");
            anyhow::ensure!(upstream.max_batch != Some(0), "{at}upstreams[{i}].max_batch: must be more than zero");
            anyhow::ensure!(
                upstream.max_concurrency != Some(0),
                "{at}upstreams[{i}].max_concurrency: must be more than zero"
            );
            if let Some(ca) = &upstream.ca_file {
                anyhow::ensure!(ca.is_file(), "{at}upstreams[{i}].ca_file: {} not found", ca.display());
            }
        }
        if let Some(ingress) = &self.ingress {
            ingress.validate().map_err(|e| anyhow::anyhow!("{at}{e}"))?;
            anyhow::ensure!(self.mempool.enabled, "{at}ingress: needs the mempool ([mempool] enabled = true)");
        }
        let p = &self.pool;
        anyhow::ensure!(p.max_attempts > 0, "{at}pool.max_attempts: must be more than zero");
        anyhow::ensure!(p.max_batch > 0, "{at}pool.max_batch: must be more than zero");
        anyhow::ensure!(!p.deadline.is_zero(), "{at}pool.deadline: must be more than zero");
        anyhow::ensure!(!p.probe_interval.is_zero(), "{at}pool.probe_interval: must be more than zero");
        anyhow::ensure!(p.budget_wait <= p.deadline, "{at}pool.budget_wait: at most pool.deadline");
        if let Some(url) = &p.budget_store {
            sluice_access::RedisLimiter::for_upstream_budgets(url, true).map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        }
        p.hedge_after().map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        p.method_timeouts().map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        anyhow::ensure!((0.0..=1.0).contains(&p.hedge_max_extra), "{at}pool.hedge_max_extra: must be between 0 and 1");
        sluice_mempool::MempoolConfig::try_from(&self.mempool).map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        self.aggregate.validate().map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        self.subscriptions.validate().map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        self.verify.validate(self.upstreams.len()).map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        let l = &self.logs;
        anyhow::ensure!(l.max_block_range > 0, "{at}logs.max_block_range: must be more than zero");
        anyhow::ensure!(l.concurrency > 0, "{at}logs.concurrency: must be more than zero");
        anyhow::ensure!(l.max_chunks > 0, "{at}logs.max_chunks: must be more than zero");
        let m = &self.mempool;
        anyhow::ensure!(m.max_tx_bytes > 0, "{at}mempool.max_tx_bytes: must be more than zero");
        anyhow::ensure!(!m.rebroadcast_interval.is_zero(), "{at}mempool.rebroadcast_interval: must be more than zero");
        let c = &self.cache;
        anyhow::ensure!(c.memory_bytes > 0, "{at}cache.memory_bytes: must be more than zero");
        anyhow::ensure!(c.window >= 2, "{at}cache.window: must be at least 2");
        anyhow::ensure!(!c.poll_interval.is_zero(), "{at}cache.poll_interval: must be more than zero");
        if let Some(redis) = &c.redis {
            sluice_redis::Redis::open(&redis.url).map_err(|e| anyhow::anyhow!("{at}cache.redis.url: {e}"))?;
            anyhow::ensure!(!redis.timeout.is_zero(), "{at}cache.redis.timeout: must be more than zero");
        }
        Ok(())
    }
}

/// A path alias: letters, digits, `-`, `_`; not a path sluice answers itself.
fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("{id:?}: only letters, digits, '-' and '_'"));
    }
    if sluice_gateway::network::RESERVED_IDS.contains(&id) {
        return Err(format!("{id:?} is a path sluice answers itself"));
    }
    Ok(())
}

/// The top-level section with a network's own keys over it.
fn inherit<T: Serialize + DeserializeOwned>(base: &T, own: Option<&Value>, at: &str, key: &str) -> anyhow::Result<T> {
    let mut value = serde_json::to_value(base).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
    if let Some(own) = own {
        anyhow::ensure!(own.is_object(), "{at}{key}: must be a table");
        merge(&mut value, own);
    }
    serde_json::from_value(value).map_err(|e| anyhow::anyhow!("{at}{key}: {e}"))
}

fn merge(base: &mut Value, own: &Value) {
    match (base, own) {
        (Value::Object(base), Value::Object(own)) => {
            for (k, v) in own {
                merge(base.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (base, own) => *base = own.clone(),
    }
}

/// A network's journal beside the top-level one: `.sluice/mempool.journal` → `.sluice/mempool-eth.journal`.
fn journal_of(top: &std::path::Path, id: &str) -> std::path::PathBuf {
    let stem = top.file_stem().map_or("mempool".into(), |s| s.to_string_lossy().into_owned());
    let name = match top.extension() {
        Some(ext) => format!("{stem}-{id}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{id}"),
    };
    top.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use crate::config::parse_toml;

    const TWO: &str = r#"
        [cache]
        window = 128
        [mempool]
        journal = "/tmp/x/pool.journal"
        [[networks]]
        id = "eth"
        chain_id = 31337
        default = true
        [[networks.upstreams]]
        url = "http://127.0.0.1:1"
        [[networks]]
        id = "base"
        chain_id = 31338
        [[networks.upstreams]]
        url = "http://127.0.0.1:2"
        [networks.cache]
        window = 32
        [networks.pool]
        max_batch = 7
    "#;

    #[test]
    fn networks_inherit_the_top_level_and_change_only_their_keys() {
        let config = parse_toml(TWO).unwrap();
        let networks = config.networks().unwrap();
        let (eth, base) = (&networks[0], &networks[1]);
        assert_eq!((eth.id.as_str(), eth.chain_id, eth.default), ("eth", Some(31337), true));
        assert_eq!((eth.cache.window, base.cache.window), (128, 32));
        assert_eq!(base.cache.memory_bytes, config.cache.memory_bytes, "not named: inherited");
        assert_eq!((eth.pool.max_batch, base.pool.max_batch), (config.pool.max_batch, 7));
        assert_eq!(eth.mempool.journal.to_str(), Some("/tmp/x/pool-eth.journal"));
        assert_eq!(base.mempool.journal.to_str(), Some("/tmp/x/pool-base.journal"));
    }

    #[test]
    fn a_file_without_networks_is_one_implicit_network() {
        let config = parse_toml("[[upstreams]]\nurl = \"http://127.0.0.1:1\"\n").unwrap();
        let networks = config.networks().unwrap();
        assert_eq!(networks.len(), 1);
        assert_eq!((networks[0].id.as_str(), networks[0].chain_id, networks[0].prefix.as_str()), ("default", None, ""));
        assert_eq!(networks[0].mempool.journal, config.mempool.journal);
    }

    #[test]
    fn errors_name_the_network_and_the_key() {
        for (change, says) in [
            (("window = 32", "window = 1"), "networks[base].cache.window: must be at least 2"),
            (("max_batch = 7", "max_batch = 0"), "networks[base].pool.max_batch"),
            (("max_batch = 7", "nonsense = 1"), "networks[base].pool: unknown field `nonsense`"),
            (("id = \"base\"", "id = \"eth\""), "networks[eth].id: \"eth\" is used twice"),
            (("chain_id = 31338", "chain_id = 31337"), "networks[base].chain_id: 31337 is also networks[eth].chain_id"),
            (("id = \"base\"", "id = \"status\""), "networks[status].id"),
            (("id = \"base\"", "id = \"a/b\""), "only letters"),
            (("url = \"http://127.0.0.1:2\"", "url = \"ftp://x\""), "networks[base].upstreams[0].url"),
            (("window = 32", "window = 32\n[networks.mempool]\njournal = \"/tmp/x/pool-eth.journal\""), "journal"),
        ] {
            let text = TWO.replacen(change.0, change.1, 1);
            let e = parse_toml(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{change:?}: {e}");
        }
        let two_defaults = TWO.replace("chain_id = 31338", "chain_id = 31338\ndefault = true");
        assert!(parse_toml(&two_defaults).unwrap_err().to_string().contains("only one may be the default"));
        let mixed = format!("[[upstreams]]\nurl = \"http://127.0.0.1:3\"\n{TWO}");
        assert!(parse_toml(&mixed).unwrap_err().to_string().contains("each network lists its own"));
    }

    #[test]
    fn tiers_may_name_only_configured_networks() {
        let ok = format!("{TWO}\n[access]\nanonymous = \"t\"\n[access.tiers.t]\nnetworks = [\"base\"]\n");
        parse_toml(&ok).unwrap();
        let bad = ok.replace("[\"base\"]", "[\"op\"]");
        assert!(parse_toml(&bad).unwrap_err().to_string().contains("access.tiers.t.networks"));
    }
}
