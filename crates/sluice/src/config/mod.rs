//! Configuration: defaults, then a TOML file, then `SLUICE_*` environment variables, then flags.
//!
//! Environment variables name keys with `__` between levels (`SLUICE_LISTEN`,
//! `SLUICE_LIMITS__MAX_BODY_BYTES=1048576`); `SLUICE_UPSTREAM` takes comma-separated URLs.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use crate::networks::{NetworkConfig, NetworkSection};
pub use crate::upstream_config::{PoolSection, UpstreamConfig};
pub use mempool::MempoolSection;

mod mempool;

/// The whole configuration of `sluice serve`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address for HTTP and WebSocket clients.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The nodes behind sluice; the spine uses the first (the upstream pool uses them all).
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
    /// Client limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// The response cache.
    #[serde(default)]
    pub cache: CacheConfig,
    /// How several upstreams share the load (used when more than one is configured).
    #[serde(default)]
    pub pool: PoolSection,
    /// The transaction pool behind `eth_sendRawTransaction` (see docs/mempool.md).
    #[serde(default)]
    pub mempool: MempoolSection,
    /// `eth_getLogs` range splitting (see docs/upstreams.md).
    #[serde(default)]
    pub logs: LogsSection,
    /// Which methods may reach the nodes.
    #[serde(default)]
    pub methods: MethodsSection,
    /// Multicall3 aggregation of `eth_call` (see docs/upstreams.md); off by default.
    #[serde(default)]
    pub aggregate: sluice_multicall::AggregateConfig,
    /// Subscriptions sluice serves itself (see docs/subscriptions.md).
    #[serde(default)]
    pub subscriptions: sluice_subscriptions::SubscriptionsConfig,
    /// Verified reads: state reads answered from proofs checked against trusted headers (see
    /// docs/verify.md); off by default.
    #[serde(default)]
    pub verify: sluice_verify::VerifyConfig,
    /// API keys, tiers and quotas (see docs/access.md); absent: anyone may call, unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<sluice_access::AccessConfig>,
    /// The QUIC transaction ingress (see docs/ingress.md); absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<sluice_ingress::IngressConfig>,
    /// The peer mesh with other sluice nodes (see docs/mesh.md); absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<sluice_mesh::MeshSettings>,
    /// Several networks, each at its own path (see docs/networks.md); absent: one implicit
    /// network of the top-level upstreams and sections.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<NetworkSection>,
    /// OpenTelemetry traces (see docs/operations.md); without `otlp_endpoint`: off.
    #[serde(default)]
    pub telemetry: sluice_telemetry::TelemetryConfig,
    /// The status page on the main listener (`[status] page = "loopback" | "any" | "off"`).
    #[serde(default)]
    pub status: sluice_gateway::page::StatusConfig,
    /// What replicas share beyond the cache and quotas: one head follower per network.
    #[serde(default)]
    pub cluster: sluice_cluster::ClusterConfig,
}

/// The method policy: denied methods are answered -32601 at once, never forwarded.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MethodsSection {
    /// Method names or `prefix*` patterns never forwarded (default: node keys and administration).
    pub deny: Vec<String>,
    /// Patterns forwarded even when `deny` matches them.
    pub allow: Vec<String>,
}

impl Default for MethodsSection {
    fn default() -> Self {
        let deny = sluice_gateway::policy::DEFAULT_DENY.iter().map(|s| (*s).to_owned()).collect();
        Self { deny, allow: Vec::new() }
    }
}

/// `eth_getLogs` over long ranges: split into chunks nodes accept.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogsSection {
    /// Split long ranges (needs the head tracker: on when the cache or the mempool is).
    pub enabled: bool,
    /// Most blocks per upstream call (hosted providers commonly allow 2,000 to 10,000).
    pub max_block_range: u64,
    /// Chunks fetched at once for one call.
    pub concurrency: usize,
    /// Most chunks one call may become; longer ranges are refused with -32005.
    pub max_chunks: usize,
}

impl Default for LogsSection {
    fn default() -> Self {
        let d = sluice_upstream::logs::LogsConfig::default();
        Self { enabled: true, max_block_range: d.max_block_range, concurrency: d.concurrency, max_chunks: d.max_chunks }
    }
}

/// The response cache (see docs/cache.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Cache answers and follow the chain head; off: every call goes upstream.
    pub enabled: bool,
    /// Bytes the memory tier may hold (keys and results).
    pub memory_bytes: u64,
    /// Recent blocks the head tracker remembers.
    pub window: usize,
    /// Concurrent identical misses share one upstream call.
    pub coalesce: bool,
    /// Without a newHeads subscription the head is polled when the next block is due (the
    /// chain's pace, learned), then this often (or every quarter block, when shorter) until
    /// it shows.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Optional shared tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSection>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            memory_bytes: 256 * 1024 * 1024,
            window: 512,
            coalesce: true,
            poll_interval: Duration::from_secs(1),
            redis: None,
        }
    }
}

/// The shared Redis tier.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// `redis://host:port/db`.
    pub url: String,
    /// Deadline per Redis operation; slower counts as a failure (and the call goes on without).
    #[serde(default = "default_redis_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Time to live for answers that never change.
    #[serde(default = "default_ttl_immutable", with = "humantime_serde")]
    pub ttl_immutable: Duration,
    /// Time to live for answers tied to a block that is not final yet.
    #[serde(default = "default_ttl_head", with = "humantime_serde")]
    pub ttl_head: Duration,
}

fn default_redis_timeout() -> Duration {
    Duration::from_millis(100)
}

fn default_ttl_immutable() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_ttl_head() -> Duration {
    Duration::from_secs(600)
}

/// Client limits (see `sluice_gateway::Limits`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request body or WebSocket message, in bytes.
    pub max_body_bytes: usize,
    /// Most calls in one batch.
    pub max_batch_len: usize,
    /// Time a client has to send headers and body; idle connections close after it.
    #[serde(with = "humantime_serde")]
    pub client_timeout: Duration,
    /// Most client connections at once.
    pub max_connections: usize,
    /// Requests being answered at once at most; beyond it HTTP 429 + `Retry-After` (lower
    /// priority tiers are shed first).
    pub max_in_flight: usize,
    /// Most subscriptions per WebSocket client.
    pub max_subscriptions_per_socket: usize,
    /// Time given to in-flight requests on shutdown.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// On shutdown (SIGTERM), how long to go on serving with `/ready` at 503 before the
    /// listener closes (Kubernetes: a few seconds, so endpoints are updated first).
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// Threads that serve client connections, each its own connections and its own keep-alive
    /// connections to the nodes (default: one per CPU core); 0 serves them on the shared
    /// work-stealing runtime.
    pub lanes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = sluice_gateway::Limits::default();
        Self {
            max_body_bytes: d.max_body_bytes,
            max_batch_len: d.max_batch_len,
            client_timeout: d.client_timeout,
            max_connections: d.max_connections,
            max_in_flight: d.max_in_flight,
            max_subscriptions_per_socket: d.max_subscriptions_per_socket,
            shutdown_grace: d.shutdown_grace,
            drain_delay: d.drain_delay,
            lanes: d.lanes,
        }
    }
}

impl From<&LimitsConfig> for sluice_gateway::Limits {
    fn from(c: &LimitsConfig) -> Self {
        Self {
            max_body_bytes: c.max_body_bytes,
            max_batch_len: c.max_batch_len,
            client_timeout: c.client_timeout,
            max_connections: c.max_connections,
            max_in_flight: c.max_in_flight,
            max_subscriptions_per_socket: c.max_subscriptions_per_socket,
            shutdown_grace: c.shutdown_grace,
            drain_delay: c.drain_delay,
            lanes: c.lanes,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8545))
}

/// Settings given on the command line, which win over everything else.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--upstream`, repeatable.
    pub upstreams: Vec<String>,
}

/// Loads the configuration from its layers and validates it.
pub fn load(file: Option<&Path>, overrides: &Overrides) -> anyhow::Result<Config> {
    let config = load_layers(file, overrides)?;
    config.validate()?;
    Ok(config)
}

/// Loads the configuration from its layers without the final validation, for callers that
/// fill in parts themselves (`sluice dev` supplies the upstream).
pub fn load_layers(file: Option<&Path>, overrides: &Overrides) -> anyhow::Result<Config> {
    let mut figment = Figment::new();
    if let Some(file) = file {
        anyhow::ensure!(file.is_file(), "config file {} not found", file.display());
        figment = figment.merge(Toml::file(file));
    }
    let ignored = ignored_env();
    if !ignored.is_empty() {
        // Printed, not logged: the logger is set up from the configuration being read.
        eprintln!("sluice: ignoring environment variables that name no configuration key: {}", ignored.join(", "));
    }
    let env = Env::prefixed("SLUICE_").filter(|key| names_a_key(key.as_str())).split("__");
    figment = figment.merge(env.ignore(OTHER_VARIABLES));
    let mut config: Config = figment.extract().map_err(describe)?;
    if let Ok(list) = std::env::var("SLUICE_UPSTREAM") {
        config.upstreams =
            list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(UpstreamConfig::from_url).collect();
    }
    if let Some(listen) = overrides.listen {
        config.listen = listen;
    }
    if !overrides.upstreams.is_empty() {
        config.upstreams = overrides.upstreams.iter().map(UpstreamConfig::from_url).collect();
    }
    Ok(config)
}

/// The configuration's top-level keys, as `SLUICE_<KEY>` or `SLUICE_<KEY>__<FIELD>…` name them.
pub const KEYS: &[&str] = &[
    "listen",
    "upstreams",
    "limits",
    "cache",
    "pool",
    "mempool",
    "logs",
    "methods",
    "aggregate",
    "subscriptions",
    "verify",
    "access",
    "ingress",
    "mesh",
    "networks",
    "telemetry",
    "status",
    "cluster",
];
/// `SLUICE_` variables read elsewhere: `SLUICE_UPSTREAM`, `SLUICE_CONFIG`, `SLUICE_LOG`,
/// `SLUICE_LOG_FORMAT`, `SLUICE_ANVIL` (`sluice dev`).
const OTHER_VARIABLES: &[&str] = &["upstream", "config", "log", "log_format", "anvil"];

/// True when an environment key (after `SLUICE_`, any case) names a configuration key: its
/// first `__` segment is a top-level key. A wrong field under a real key (`SLUICE_LIMITS__NOPE`)
/// still names the configuration and is refused with the key named. Pure.
pub fn names_a_key(key: &str) -> bool {
    let first = key.split("__").next().unwrap_or_default().to_ascii_lowercase();
    KEYS.contains(&first.as_str())
}

/// `SLUICE_*` variables in this process's environment that name neither a configuration key
/// nor one of sluice's own variables: Kubernetes' service links (`SLUICE_PORT`,
/// `SLUICE_SERVICE_HOST`, … for a Service called `sluice`) and anything unrelated.
pub fn ignored_env() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.strip_prefix("SLUICE_").is_some_and(|rest| {
                !names_a_key(rest) && !OTHER_VARIABLES.contains(&rest.to_ascii_lowercase().as_str())
            })
        })
        .collect();
    names.sort();
    names
}

/// Reads one file alone (no environment, no flags) and validates it: `sluice config validate`.
pub fn validate_file(file: &Path) -> anyhow::Result<Config> {
    anyhow::ensure!(file.is_file(), "config file {} not found", file.display());
    let config: Config = Figment::from(Toml::file(file)).extract().map_err(describe)?;
    config.validate()?;
    Ok(config)
}

/// Parses and validates configuration text alone (no file, environment or flags).
pub fn parse_toml(text: &str) -> anyhow::Result<Config> {
    let config: Config = Figment::from(Toml::string(text)).extract().map_err(describe)?;
    config.validate()?;
    Ok(config)
}

/// Figment's errors name the key; this joins all of them into one message.
fn describe(e: figment::Error) -> anyhow::Error {
    let lines: Vec<String> = e.into_iter().map(|e| e.to_string()).collect();
    anyhow::anyhow!("invalid configuration: {}", lines.join("; "))
}

impl Config {
    /// Checks what serde cannot: each network's sections (see [`NetworkConfig::validate`]),
    /// non-zero limits, the access and method lists.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.telemetry.validate().map_err(anyhow::Error::msg)?;
        let networks = self.networks()?;
        for network in &networks {
            network.validate()?;
        }
        let l = &self.limits;
        for (key, value) in [
            ("limits.max_body_bytes", l.max_body_bytes),
            ("limits.max_batch_len", l.max_batch_len),
            ("limits.max_connections", l.max_connections),
            ("limits.max_in_flight", l.max_in_flight),
            ("limits.max_subscriptions_per_socket", l.max_subscriptions_per_socket),
        ] {
            anyhow::ensure!(value > 0, "{key}: must be more than zero");
        }
        anyhow::ensure!(!l.client_timeout.is_zero(), "limits.client_timeout: must be more than zero");
        if let Some(mesh) = &self.mesh {
            mesh.parse().map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                networks.iter().any(|n| n.mempool.enabled),
                "mesh: needs the mempool ([mempool] enabled = true)"
            );
        }
        if let Some(access) = &self.access {
            access.validate().map_err(anyhow::Error::msg)?;
            for (name, tier) in &access.tiers {
                sluice_gateway::policy::MethodPolicy::validate(&tier.deny)
                    .and_then(|_| sluice_gateway::policy::MethodPolicy::validate(&tier.allow))
                    .map_err(|e| anyhow::anyhow!("access.tiers.{name}: {e}"))?;
                for id in &tier.networks {
                    anyhow::ensure!(
                        networks.iter().any(|n| &n.id == id),
                        "access.tiers.{name}.networks: no network has the id {id:?}"
                    );
                }
            }
            for (key, entry) in &access.keys {
                for id in &entry.spec().networks {
                    anyhow::ensure!(
                        networks.iter().any(|n| &n.id == id),
                        "access.keys: key {}…: networks: no network has the id {id:?}",
                        key.get(..4).unwrap_or(key)
                    );
                }
            }
            if let Some(admin) = &access.admin {
                anyhow::ensure!(
                    admin.listen.port() == 0 || admin.listen != self.listen,
                    "access.admin.listen: must differ from listen"
                );
            }
        }
        sluice_gateway::policy::MethodPolicy::validate(&self.methods.deny)
            .map_err(|e| anyhow::anyhow!("methods.deny: {e}"))?;
        sluice_gateway::policy::MethodPolicy::validate(&self.methods.allow)
            .map_err(|e| anyhow::anyhow!("methods.allow: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties;
