//! One network's stack, bottom up: its nodes (each checked for the network's chain id) in a
//! pool, the head watcher, coalescing, the cache, `eth_getLogs` splitting, the mempool with
//! its journal, and its QUIC ingress. Nothing is shared with another network's stack.

use std::sync::Arc;
use std::time::Duration;

use sluice_cache::{CacheLayer, CoalesceLayer, RedisConfig, RedisTier};
use sluice_cluster::RedisHeads;
use sluice_gateway::{FeedItem, FeedSet, FeedStream, Layer, LocalFeeds, NetworkSpec, SharedRelay, StatusBoard, Steps};
use sluice_ingress::{Ingress, IngressConfig, KeyPair};
use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_mempool::{Mempool, MempoolConfig, MempoolLayer, PoolView};
use sluice_multicall::AggregateLayer;
use sluice_subscriptions::Hub;
use sluice_upstream::logs::{LogsConfig, LogsLayer};
use sluice_upstream::pool::{LivePool, MemberConfig, MethodFilter, PoolConfig, UpstreamPool};
use sluice_upstream::{
    spawn_shared_head_watcher, Answer, HeadConfig, HeadFeed, HttpUpstream, HttpUpstreamConfig, Node, SharedHeads,
    Upstreams,
};
use sluice_verify::VerifyLayer;

use crate::networks::NetworkConfig;

/// A network's running parts: what the gateway serves, and what `serve` stops at the end.
pub struct Stack {
    /// The network as the gateway takes it.
    pub spec: NetworkSpec,
    /// Its mempool, when on.
    pub mempool: Option<Arc<Mempool>>,
    /// Its QUIC ingress, when on.
    pub ingress: Option<Ingress>,
    /// Its first upstream's HTTP URL (for the start-up line).
    pub first_url: String,
    /// Upstreams serving it.
    pub upstreams: usize,
    /// Its pool of nodes, replaceable on reload.
    pub pool: Arc<LivePool<HttpUpstream>>,
    /// Its head feed, when one was started with the stack (to step down at shutdown).
    pub head: Option<HeadFeed>,
}

/// Builds network `net`'s pool from its upstream list, each node checked for the network's
/// chain id (at start and on reload). Every call reaches the nodes through the pool, also with
/// one member: its budgets, method filters, timeouts and retries always apply.
pub async fn build_pool(
    net: &NetworkConfig,
) -> anyhow::Result<(Arc<UpstreamPool<HttpUpstream>>, Vec<crate::config::UpstreamConfig>)> {
    let at = &net.prefix;
    let (clients, configs) = clients(net)?;
    let (clients, configs) = check_chain_ids(net, clients, configs).await?;
    anyhow::ensure!(!configs.is_empty(), "{at}upstreams: none configured");
    let members = clients
        .into_iter()
        .zip(&configs)
        .map(|(client, c)| MemberConfig {
            client,
            tier: c.tier,
            weight: c.weight,
            filter: MethodFilter { include: c.methods.clone(), exclude: c.exclude_methods.clone() },
            max_concurrency: c.max_concurrency,
            max_batch: c.max_batch,
            rate: c.rate,
            daily_quota: c.daily_quota,
            history: c.history(),
        })
        .collect();
    let mut pool_config = PoolConfig::try_from(&net.pool).map_err(|e| anyhow::anyhow!("{at}{e}"))?;
    pool_config.network = net.id.clone();
    if let Some(url) = &net.pool.budget_store {
        let store = crate::budgets::RedisBudgets::new(url, net.pool.budget_store_fail_open)
            .map_err(|e| anyhow::anyhow!("{at}{e}"))?;
        pool_config.shared_budget = Some(Arc::new(store));
    }
    Ok((UpstreamPool::new(members, pool_config), configs))
}

impl Stack {
    /// Starts network `net`'s stack.
    pub async fn start(net: &NetworkConfig) -> anyhow::Result<Stack> {
        let (pool, configs) = build_pool(net).await?;
        let primary = configs.first().ok_or_else(|| anyhow::anyhow!("{}upstreams: none configured", net.prefix))?;
        let (first_url, ws_url) = primary.endpoints().map_err(anyhow::Error::msg)?;
        // Every upstream's WebSocket, in order: the head feed moves to the next when one dies.
        // Named as the pool names them: a notification is that member's head, not probed again.
        let ws_urls = pool
            .member_names()
            .into_iter()
            .zip(&configs)
            .filter_map(|(name, c)| c.endpoints().ok().map(|(_, ws)| (name, ws)))
            .collect::<Vec<(String, String)>>();
        let upstreams = configs.len();
        // The pool in force, replaced whole by a reload; every layer above keeps its place.
        let live = Arc::new(LivePool::new(pool));
        let mut status = StatusBoard::default();
        let pool_status = live.clone();
        status.add("", Arc::new(move || pool_status.current().status()));
        let upstream: Arc<dyn Upstreams> = live.clone();
        // One head feed for the cache and the mempool, when either is on; otherwise the
        // subscription hub starts one on its first subscriber (a head feed makes calls).
        let heads = HeadConfig {
            window: net.cache.window,
            poll_interval: net.cache.poll_interval,
            network: net.id.clone(),
            ..HeadConfig::default()
        };
        // Replicas sharing a Redis follow the chain as one: one of them holds the lease.
        let shared: Option<Arc<dyn SharedHeads>> = match &net.shared_heads {
            Some(url) => Some(Arc::new(RedisHeads::new(url, &net.id).map_err(anyhow::Error::msg)?)),
            None => None,
        };
        let start_feed = {
            let upstream = upstream.clone();
            move || spawn_shared_head_watcher(upstream, ws_urls, heads, shared)
        };
        let (feed, start_feed) = if net.cache.enabled || net.mempool.enabled || net.verify.enabled {
            (Some(start_feed()), None)
        } else {
            (None, Some(start_feed))
        };
        // The steps this network was configured with; the gateway decides their order.
        let mut steps = Steps::default();
        if let (true, Some(feed)) = (net.verify.enabled, &feed) {
            let (config, id, view) = (net.verify.clone(), net.id.clone(), feed.view.clone());
            let trust = sluice_verify::trust::shared_trust();
            let (shown, shown_config) = (trust.clone(), config.clone());
            status.add("verify", Arc::new(move || shown_config.status(&shown)));
            steps.verify =
                Some(Box::new(move |below| Arc::new(VerifyLayer::new(&id, below, view, &config, trust.clone()))));
        }
        if net.aggregate.eth_call {
            let (config, id, reorgs) =
                (net.aggregate.clone(), net.id.clone(), feed.as_ref().map(|f| f.events.subscribe()));
            steps.aggregate = Some(Box::new(move |below| {
                let aggregate = AggregateLayer::new(below, config, &id);
                if let Some(reorgs) = reorgs {
                    aggregate.watch_reorgs(reorgs);
                }
                Arc::new(aggregate)
            }));
        }
        if net.cache.coalesce {
            steps.coalesce = Some(Box::new(|below| Arc::new(CoalesceLayer::new(below))));
        }
        if let (true, Some(feed)) = (net.cache.enabled, &feed) {
            steps.cache = Some(cache_step(net, feed)?);
        }
        if let (true, Some(feed)) = (net.logs.enabled, &feed) {
            let l = &net.logs;
            let settings =
                LogsConfig { max_block_range: l.max_block_range, concurrency: l.concurrency, max_chunks: l.max_chunks };
            let view = feed.view.clone();
            steps.logs = Some(Box::new(move |below| Arc::new(LogsLayer::new(below, view, settings))));
        }
        let mut mempool = None;
        if let (true, Some(feed)) = (net.mempool.enabled, &feed) {
            let pool = start_mempool(net, upstream.clone(), feed).await?;
            let counts = pool.clone();
            status.add(
                "mempool",
                Arc::new(move || {
                    let (pending, queued) = counts.counts();
                    serde_json::json!({ "pending": pending, "queued": queued })
                }),
            );
            let layer = pool.clone();
            steps.mempool = Some(Box::new(move |below| Arc::new(MempoolLayer::new(below, layer))));
            mempool = Some(pool);
        }
        let stacked = steps.stack(upstream.clone());
        let layers = stacked.calls;
        // The hub fetches blocks and logs through the steps below the mempool (cached, coalesced).
        let mut feeds = FeedSet::default();
        if net.subscriptions.local {
            if let Some(feed) = &feed {
                let view = feed.view.clone();
                feeds.0.push(Hub::new(stacked.reads, move || view, &net.subscriptions, &net.id));
            } else if let Some(start) = start_feed {
                feeds.0.push(Hub::new(stacked.reads, move || start().view, &net.subscriptions, &net.id));
            }
        }
        let ingress = match (&net.ingress, &mempool) {
            (Some(settings), Some(pool)) => Some(start_ingress(net, settings, pool.clone())?),
            _ => None,
        };
        if let Some(ingress) = &ingress {
            let stats = ingress.stats();
            status.add("ingress", Arc::new(move || serde_json::to_value(stats.snapshot()).unwrap_or_default()));
        }
        if let Some(feed) = &feed {
            // The head sluice serves and the finality it knows, as the tracker has them.
            let (view, role) = (feed.view.clone(), feed.role.clone());
            status.add(
                "chain",
                Arc::new(move || {
                    let view = view.borrow().clone();
                    let (head, hash) = view.latest().map(|(n, h)| (Some(n), Some(h.to_owned()))).unwrap_or_default();
                    // With replicas sharing the following: whether this one follows, reads or is alone.
                    let role = role.as_ref().map(|r| r.borrow().as_str());
                    serde_json::json!({ "head": head, "hash": hash, "safe": view.safe, "finalized": view.finalized,
                        "following": role })
                }),
            );
        }
        let mut spec = NetworkSpec::new(net.id.clone(), layers);
        // Configured networks are also at /evm/{chainId}; the implicit one keeps its old paths.
        spec.chain_id = net.chain_id;
        spec.default = net.default;
        spec.relay = Some(SharedRelay::new(ws_url, primary.timeout, net.subscriptions.client_buffer));
        spec.readiness = Some(upstream);
        spec.status = status;
        spec.head = feed.as_ref().map(|feed| feed.head_view(&net.id));
        if let Some(mempool) = &mempool {
            feeds.0.push(Arc::new(PendingTransactions(mempool.clone())));
        }
        spec.local_feeds = (!feeds.0.is_empty()).then(|| Arc::new(feeds) as Arc<dyn LocalFeeds>);
        Ok(Stack { spec, mempool, ingress, first_url, upstreams, pool: live, head: feed })
    }
}

/// One HTTP client per configured upstream, with its name.
fn clients(config: &NetworkConfig) -> anyhow::Result<(Vec<HttpUpstream>, Vec<crate::config::UpstreamConfig>)> {
    // Trust anchors first: the TLS configuration is built once, by the first client.
    for ca in config.upstreams.iter().filter_map(|u| u.ca_file.as_deref()) {
        let n = sluice_upstream::tls::trust_ca_file(ca).map_err(anyhow::Error::msg)?;
        tracing::info!(file = %ca.display(), certificates = n, "trusting extra CA certificates");
    }
    let mut clients = Vec::new();
    let mut configs = Vec::new();
    for (i, upstream) in config.upstreams.iter().enumerate() {
        let (http_url, _) = upstream.endpoints().map_err(anyhow::Error::msg)?;
        // Names label metrics: unique across networks too.
        let name = upstream.name.clone().unwrap_or_else(|| match config.prefix.is_empty() {
            true => format!("upstream-{i}"),
            false => format!("{}-{i}", config.id),
        });
        let mut client = HttpUpstream::new(HttpUpstreamConfig {
            name: name.clone(),
            network: config.id.clone(),
            url: http_url,
            timeout: upstream.timeout,
            max_response_bytes: upstream.max_response_bytes,
        })
        .map_err(anyhow::Error::msg)?;
        if let Some(window) = upstream.batch_window {
            client = client.with_batching(window, upstream.max_batch.unwrap_or(config.pool.max_batch));
        }
        clients.push(client);
        configs.push(upstream.clone());
    }
    Ok((clients, configs))
}

/// Each upstream's chain id, read at start. With a configured chain id, an upstream on another
/// chain is refused (loudly) and the others serve; without one (the implicit network), two
/// upstreams on different chains refuse the start. An unreachable upstream is only warned
/// about: the pool's circuit keeps it out until it answers. A lone upstream of the implicit
/// network has nothing to agree with and is not asked. Returns the upstreams kept.
async fn check_chain_ids(
    net: &NetworkConfig,
    clients: Vec<HttpUpstream>,
    configs: Vec<crate::config::UpstreamConfig>,
) -> anyhow::Result<(Vec<HttpUpstream>, Vec<crate::config::UpstreamConfig>)> {
    if net.chain_id.is_none() && clients.len() < 2 {
        return Ok((clients, configs));
    }
    let probe = Request::new(Some(Id::number(1)), "eth_chainId", None);
    let answers = futures_util::future::join_all(clients.iter().map(|c| {
        let probe = probe.clone();
        async move { tokio::time::timeout(Duration::from_secs(5), c.call(&probe)).await }
    }))
    .await;
    let mut chain = net.chain_id;
    let mut first: Option<String> = None;
    let (mut kept, mut kept_configs) = (Vec::new(), Vec::new());
    for ((client, config), answer) in clients.into_iter().zip(configs).zip(answers) {
        let name = client.name().to_owned();
        let reported = match answer {
            Ok(Ok(Answer { outcome: Outcome::Result(raw), .. })) => serde_json::from_str::<String>(raw.get())
                .ok()
                .and_then(|hex| u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok()),
            _ => None,
        };
        match (reported, chain) {
            (None, _) => tracing::warn!(network = %net.id, upstream = %name, "could not read its chain id at start"),
            (Some(id), Some(expected)) if id != expected => {
                if net.chain_id.is_some() {
                    tracing::error!(
                        network = %net.id, upstream = %name, chain_id = id, expected,
                        "upstream is on another chain: refused; the network's other upstreams serve"
                    );
                    eprintln!("sluice: {}upstreams: {name} is on chain {id}, not {expected}: refused", net.prefix);
                    continue;
                }
                anyhow::bail!(
                    "upstream {name} is on chain {id}, but {} is on chain {expected}: refusing to mix chains",
                    first.as_deref().unwrap_or("another")
                );
            }
            (Some(id), _) => {
                chain = Some(id);
                first.get_or_insert(name);
            }
        }
        kept.push(client);
        kept_configs.push(config);
    }
    anyhow::ensure!(
        !kept.is_empty(),
        "{}upstreams: every upstream is on another chain than {}",
        net.prefix,
        net.chain_id.unwrap_or_default()
    );
    Ok((kept, kept_configs))
}

/// Starts the mempool (replaying its journal); its methods become the pipeline's mempool step.
/// The mempool itself reads state and relays through `upstream` directly, not through the cache.
async fn start_mempool(
    net: &NetworkConfig,
    upstream: Arc<dyn Upstreams>,
    feed: &HeadFeed,
) -> anyhow::Result<Arc<Mempool>> {
    let mut settings = MempoolConfig::try_from(&net.mempool).map_err(anyhow::Error::msg)?;
    settings.network = net.id.clone();
    if let Some(dir) = settings.journal.as_deref().and_then(|p| p.parent()).filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    Mempool::start(settings, upstream, feed).await.map_err(anyhow::Error::msg)
}

/// Starts the QUIC ingress in front of the mempool, with its key (made on first start).
fn start_ingress(net: &NetworkConfig, settings: &IngressConfig, mempool: Arc<Mempool>) -> anyhow::Result<Ingress> {
    let key = KeyPair::load_or_generate(&settings.key)?;
    let ingress = Ingress::start(settings.clone(), &key, mempool)?;
    let addr = ingress.local_addr();
    // One line on stdout, like the HTTP listener's, for people and scripts.
    let network = if net.prefix.is_empty() { String::new() } else { format!(" for network {}", net.id) };
    println!("sluice ingress on quic://{addr}{network} (ALPN sluice-tx/1, server identity {})", ingress.identity());
    tracing::info!(%addr, identity = %ingress.identity(), weights = settings.weights.len(), "QUIC ingress on");
    Ok(ingress)
}

/// `eth_subscribe("newPendingTransactions"[, true])` from the mempool: hashes, or full
/// transactions when asked, as they become executable.
struct PendingTransactions(Arc<Mempool>);

#[async_trait::async_trait]
impl LocalFeeds for PendingTransactions {
    async fn subscribe(&self, params: &[serde_json::Value]) -> Option<FeedStream> {
        if params.first()?.as_str()? != "newPendingTransactions" {
            return None;
        }
        let full = params.get(1).and_then(serde_json::Value::as_bool).unwrap_or(false);
        let events = self.0.subscribe_pending();
        let stream = futures_util::stream::unfold(events, move |mut events| async move {
            loop {
                match events.recv().await {
                    Ok(tx) => {
                        let value = if full { tx.to_rpc() } else { serde_json::json!(tx.tx.hash) };
                        let raw = serde_json::value::to_raw_value(&value).ok()?;
                        return Some((FeedItem::Event(Arc::from(raw)), events));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        // Counted, not silent: this subscriber fell behind the pool's event feed.
                        metrics::counter!("sluice_pending_subscription_missed_total").increment(missed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Some(Box::pin(stream))
    }
}

/// The cache step, fed by the head watcher (its Redis tier made now: a bad URL fails the start).
fn cache_step(net: &NetworkConfig, feed: &HeadFeed) -> anyhow::Result<Layer> {
    let cache = &net.cache;
    let redis = match &cache.redis {
        Some(r) => Some(
            RedisTier::new(RedisConfig {
                url: r.url.clone(),
                timeout: r.timeout,
                ttl_immutable: r.ttl_immutable,
                ttl_head: r.ttl_head,
            })
            .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    let (id, feed, memory_bytes, coalesce) = (net.id.clone(), feed.clone(), cache.memory_bytes, cache.coalesce);
    Ok(Box::new(move |below| Arc::new(CacheLayer::new(&id, below, &feed, memory_bytes, redis, coalesce))))
}
