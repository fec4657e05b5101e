//! `sluice serve`: wires the configured upstream into the gateway and serves until a signal.

use std::future::Future;
use std::sync::Arc;

use sluice_cache::{CacheLayer, RedisConfig, RedisTier};
use sluice_gateway::{Gateway, Limits};
use sluice_upstream::{spawn_head_watcher, HeadConfig, HttpUpstream, HttpUpstreamConfig, Upstreams};
use tokio::net::TcpListener;

use crate::config::Config;

/// Binds the listener, prints where sluice listens, and serves until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    // Install the metrics recorder before anything records (the head watcher starts first).
    sluice_gateway::telemetry::prometheus();
    let upstream = config.upstreams.first().ok_or_else(|| anyhow::anyhow!("no upstream configured"))?;
    if config.upstreams.len() > 1 {
        tracing::warn!(
            count = config.upstreams.len(),
            "several upstreams configured; this version sends everything to the first one"
        );
    }
    let (http_url, ws_url) = upstream.endpoints().map_err(anyhow::Error::msg)?;
    let client = HttpUpstream::new(HttpUpstreamConfig {
        name: upstream.name.clone().unwrap_or_else(|| "upstream-0".into()),
        url: http_url.clone(),
        timeout: upstream.timeout,
        max_response_bytes: upstream.max_response_bytes,
    })
    .map_err(anyhow::Error::msg)?;
    let client: Arc<dyn Upstreams> = Arc::new(client);
    let upstreams = if config.cache.enabled { with_cache(&config, client, &ws_url)? } else { client };
    let gateway = Gateway::new(upstreams, Some(ws_url), upstream.timeout, Limits::from(&config.limits));
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    // Printed on stdout, one line, for people and for scripts waiting on it.
    println!("sluice listening on http://{addr} and ws://{addr} (upstream {http_url})");
    tracing::info!(%addr, upstream = %http_url, "serving");
    sluice_gateway::serve(listener, gateway, shutdown).await;
    tracing::info!("stopped");
    Ok(())
}

/// Wraps the upstream in the cache, fed by a head watcher on the same node.
fn with_cache(config: &Config, upstream: Arc<dyn Upstreams>, ws_url: &str) -> anyhow::Result<Arc<dyn Upstreams>> {
    let cache = &config.cache;
    let heads = HeadConfig { window: cache.window, poll_interval: cache.poll_interval, ..HeadConfig::default() };
    let feed = spawn_head_watcher(upstream.clone(), Some(ws_url.to_owned()), heads);
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
    Ok(Arc::new(CacheLayer::new(upstream, &feed, cache.memory_bytes, redis, cache.coalesce)))
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
