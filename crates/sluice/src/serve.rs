//! `sluice serve`: wires the configured upstream into the gateway and serves until a signal.

use std::future::Future;
use std::sync::Arc;

use sluice_cache::{CacheLayer, CoalesceLayer, RedisConfig, RedisTier};
use sluice_gateway::policy::MethodPolicy;
use sluice_gateway::{FeedStream, GatewayBuilder, Limits, LocalFeeds, StatusBoard};
use sluice_ingress::{Ingress, IngressConfig, KeyPair};
use std::time::Duration;

use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_pool::{Mempool, MempoolConfig, MempoolLayer, PoolView};
use sluice_upstream::logs::{LogsConfig, LogsLayer};
use sluice_upstream::pool::{MemberConfig, MethodFilter, Pool, PoolConfig};
use sluice_upstream::{spawn_head_watcher, Answer, HeadConfig, HeadFeed, HttpUpstream, HttpUpstreamConfig, Upstreams};
use tokio::net::TcpListener;

use crate::config::Config;

/// Binds the listener, prints where sluice listens, and serves until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    // Install the metrics recorder before anything records (the head watcher starts first).
    sluice_gateway::telemetry::prometheus();
    let (clients, names) = clients(&config)?;
    check_chain_ids(&clients, &names).await?;
    let primary = config.upstreams.first().ok_or_else(|| anyhow::anyhow!("no upstream configured"))?;
    let (http_url, ws_url) = primary.endpoints().map_err(anyhow::Error::msg)?;
    // Every call reaches the nodes through the pool, also with one member: its budgets,
    // method filters, timeouts and retries always apply.
    let members = clients
        .into_iter()
        .zip(&config.upstreams)
        .map(|(client, c)| MemberConfig {
            client,
            tier: c.tier,
            weight: c.weight,
            filter: MethodFilter { include: c.methods.clone(), exclude: c.exclude_methods.clone() },
            max_concurrency: c.max_concurrency,
            max_batch: c.max_batch,
            rate: c.rate,
            daily_quota: c.daily_quota,
        })
        .collect();
    let pool = Pool::new(members, PoolConfig::try_from(&config.pool).map_err(anyhow::Error::msg)?);
    let mut status = StatusBoard::default();
    let pool_status = pool.clone();
    status.add("", Arc::new(move || pool_status.status()));
    let upstream: Arc<dyn Upstreams> = pool;
    // One head feed for the cache and the mempool, when either is on.
    let feed = (config.cache.enabled || config.mempool.enabled).then(|| {
        let cache = &config.cache;
        let heads = HeadConfig { window: cache.window, poll_interval: cache.poll_interval, ..HeadConfig::default() };
        spawn_head_watcher(upstream.clone(), Some(ws_url.clone()), heads)
    });
    // The layers, bottom up: pool ← coalescing ← cache ← eth_getLogs splitting ← mempool.
    let mut upstreams = upstream.clone();
    if config.cache.coalesce {
        upstreams = Arc::new(CoalesceLayer::new(upstreams));
    }
    if let (true, Some(feed)) = (config.cache.enabled, &feed) {
        upstreams = with_cache(&config, upstreams, feed)?;
    }
    if let (true, Some(feed)) = (config.logs.enabled, &feed) {
        // Above the cache, so that finalized chunks are cached one by one.
        let l = &config.logs;
        let settings =
            LogsConfig { max_block_range: l.max_block_range, concurrency: l.concurrency, max_chunks: l.max_chunks };
        upstreams = Arc::new(LogsLayer::new(upstreams, feed.view.clone(), settings));
    }
    let mut mempool = None;
    if let (true, Some(feed)) = (config.mempool.enabled, &feed) {
        let (layer, pool) = with_mempool(&config, upstream.clone(), upstreams, feed).await?;
        upstreams = layer;
        let counts = pool.clone();
        status.add(
            "mempool",
            Arc::new(move || {
                let snapshot = counts.snapshot();
                serde_json::json!({ "pending": snapshot.status.pending, "queued": snapshot.status.queued })
            }),
        );
        mempool = Some(pool);
    }
    let ingress = match (&config.ingress, &mempool) {
        (Some(settings), Some(pool)) => Some(start_ingress(settings, pool.clone())?),
        _ => None,
    };
    if let Some(ingress) = &ingress {
        let stats = ingress.stats();
        status.add("ingress", Arc::new(move || serde_json::to_value(stats.snapshot()).unwrap_or_default()));
    }
    let mesh = match (&config.mesh, &mempool) {
        (Some(settings), Some(pool)) => Some(start_mesh(settings, pool.clone()).await?),
        _ => None,
    };
    if let Some(mesh) = &mesh {
        let mesh = mesh.clone();
        status.add("mesh", Arc::new(move || serde_json::to_value(mesh.latest_status()).unwrap_or_default()));
    }
    let policy = MethodPolicy::new(config.methods.deny.clone(), config.methods.allow.clone());
    let mut gateway = GatewayBuilder::new(upstreams, Limits::from(&config.limits))
        .method_policy(policy)
        .subscriptions(Some(ws_url), primary.timeout)
        .status(status)
        .readiness(upstream);
    if let Some(mempool) = mempool {
        gateway = gateway.local_feeds(Arc::new(PendingTransactions(mempool)));
    }
    if let Some(access) = &config.access {
        let tiers: Vec<(String, Vec<String>, Vec<String>)> =
            access.tiers.iter().map(|(name, t)| (name.clone(), t.deny.clone(), t.allow.clone())).collect();
        let control = sluice_access::Access::new(access.clone()).map_err(anyhow::Error::msg)?;
        gateway = gateway.access(control, tiers);
        tracing::info!(
            keys = access.keys.len(),
            tiers = access.tiers.len(),
            shared = access.redis_url.is_some(),
            "access control on"
        );
    }
    let gateway = gateway.build();
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    // Printed on stdout, one line, for people and for scripts waiting on it.
    println!("sluice listening on http://{addr} and ws://{addr} (upstream {http_url}, {} in all)", names.len());
    tracing::info!(%addr, upstream = %http_url, upstreams = names.len(), "serving");
    sluice_gateway::serve(listener, gateway, shutdown).await;
    if let Some(ingress) = ingress {
        ingress.shutdown().await;
    }
    if let Some(mesh) = mesh {
        mesh.shutdown().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// One HTTP client per configured upstream, with its name.
fn clients(config: &Config) -> anyhow::Result<(Vec<HttpUpstream>, Vec<String>)> {
    // Trust anchors first: the TLS configuration is built once, by the first client.
    for ca in config.upstreams.iter().filter_map(|u| u.ca_file.as_deref()) {
        let n = sluice_upstream::tls::trust_ca_file(ca).map_err(anyhow::Error::msg)?;
        tracing::info!(file = %ca.display(), certificates = n, "trusting extra CA certificates");
    }
    let mut clients = Vec::new();
    let mut names = Vec::new();
    for (i, upstream) in config.upstreams.iter().enumerate() {
        let (http_url, _) = upstream.endpoints().map_err(anyhow::Error::msg)?;
        let name = upstream.name.clone().unwrap_or_else(|| format!("upstream-{i}"));
        clients.push(
            HttpUpstream::new(HttpUpstreamConfig {
                name: name.clone(),
                url: http_url,
                timeout: upstream.timeout,
                max_response_bytes: upstream.max_response_bytes,
            })
            .map_err(anyhow::Error::msg)?,
        );
        names.push(name);
    }
    Ok((clients, names))
}

/// Refuses to start when two reachable upstreams report different chain ids; an unreachable
/// one is only warned about (the pool's circuit keeps it out until it answers).
async fn check_chain_ids(clients: &[HttpUpstream], names: &[String]) -> anyhow::Result<()> {
    if clients.len() < 2 {
        return Ok(());
    }
    let probe = Request::new(Some(Id::number(1)), "eth_chainId", None);
    let answers = futures_util::future::join_all(clients.iter().map(|c| {
        let probe = probe.clone();
        async move { tokio::time::timeout(Duration::from_secs(5), c.call(&probe)).await }
    }))
    .await;
    let mut first: Option<(&str, String)> = None;
    for (name, answer) in names.iter().zip(answers) {
        let chain = match answer {
            Ok(Ok(Answer { outcome: Outcome::Result(raw), .. })) => raw.get().to_owned(),
            _ => {
                tracing::warn!(upstream = %name, "could not read its chain id at start");
                continue;
            }
        };
        match &first {
            None => first = Some((name, chain)),
            Some((first_name, first_chain)) if *first_chain != chain => anyhow::bail!(
                "upstream {name} is on chain {chain}, but {first_name} is on chain {first_chain}: refusing to mix chains"
            ),
            Some(_) => {}
        }
    }
    Ok(())
}

/// Starts the mempool (replaying its journal) and puts its methods in front of `inner`. The
/// mempool itself reads state and relays through `upstream` directly, not through the cache.
async fn with_mempool(
    config: &Config,
    upstream: Arc<dyn Upstreams>,
    inner: Arc<dyn Upstreams>,
    feed: &HeadFeed,
) -> anyhow::Result<(Arc<dyn Upstreams>, Arc<Mempool>)> {
    let settings = MempoolConfig::try_from(&config.mempool).map_err(anyhow::Error::msg)?;
    if let Some(dir) = settings.journal.as_deref().and_then(|p| p.parent()).filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let mempool = Mempool::start(settings, upstream, feed).await.map_err(anyhow::Error::msg)?;
    Ok((Arc::new(MempoolLayer::new(inner, mempool.clone())), mempool))
}

/// Starts the QUIC ingress in front of the mempool, with its key (made on first start).
fn start_ingress(settings: &IngressConfig, mempool: Arc<Mempool>) -> anyhow::Result<Ingress> {
    let key = KeyPair::load_or_generate(&settings.key)?;
    let ingress = Ingress::start(settings.clone(), &key, mempool)?;
    let addr = ingress.local_addr();
    // One line on stdout, like the HTTP listener's, for people and scripts.
    println!("sluice ingress on quic://{addr} (ALPN sluice-tx/1, server identity {})", ingress.identity());
    tracing::info!(%addr, identity = %ingress.identity(), weights = settings.weights.len(), "QUIC ingress on");
    Ok(ingress)
}

/// Starts the peer mesh and feeds it the mempool's newly executable transactions.
async fn start_mesh(settings: &sluice_mesh::MeshSettings, mempool: Arc<Mempool>) -> anyhow::Result<sluice_mesh::Mesh> {
    let key = sluice_mesh::load_or_generate_key(&settings.key).map_err(anyhow::Error::msg)?;
    let config = settings.parse().map_err(anyhow::Error::msg)?;
    let contents: Arc<dyn sluice_mesh::PoolContents> = mempool.clone();
    let mesh = sluice_mesh::Mesh::start(config, key, mempool.clone(), Some(contents)).await?;
    let addresses: Vec<String> = mesh.addresses().iter().map(|a| a.to_string()).collect();
    // One line on stdout, for people and scripts (other nodes list these addresses as peers).
    println!("sluice mesh peer {} on {}", mesh.peer_id(), addresses.join(" "));
    tracing::info!(peer = %mesh.peer_id(), peers = settings.peers.len(), "peer mesh on");
    let mut pending = mempool.subscribe_pending();
    let forward = mesh.clone();
    tokio::spawn(async move {
        loop {
            match pending.recv().await {
                // A refusal (the mesh's queue is full) is counted by the mesh itself.
                Ok(tx) => {
                    let _ = forward.broadcast(tx.raw.to_vec());
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    // Which ones is unknown: hand the whole pool to every peer again (they
                    // answer what they hold at once), so nothing stays unshared.
                    metrics::counter!("sluice_mesh_pending_missed_total").increment(missed);
                    tracing::warn!(missed, "the mesh fell behind the mempool's feed; handing peers the whole pool");
                    forward.resync().await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Ok(mesh)
}

/// `eth_subscribe("newPendingTransactions"[, true])` from the mempool: hashes, or full
/// transactions when asked, as they become executable.
struct PendingTransactions(Arc<Mempool>);

impl LocalFeeds for PendingTransactions {
    fn subscribe(&self, params: &[serde_json::Value]) -> Option<FeedStream> {
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
                        return Some((raw, events));
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

/// Wraps the upstream in the cache, fed by the head watcher.
fn with_cache(config: &Config, upstream: Arc<dyn Upstreams>, feed: &HeadFeed) -> anyhow::Result<Arc<dyn Upstreams>> {
    let cache = &config.cache;
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
    Ok(Arc::new(CacheLayer::new(upstream, feed, cache.memory_bytes, redis, cache.coalesce)))
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("shutdown signal received; draining");
}
