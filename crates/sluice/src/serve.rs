//! `sluice serve`: starts each configured network's stack (see [`crate::stack`]), puts them
//! behind one gateway, and serves until a signal.

use std::future::Future;
use std::sync::Arc;

use sluice_gateway::policy::MethodPolicy;
use sluice_gateway::{GatewayBuilder, Limits, StatusBoard};
use sluice_mempool::Mempool;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::reload::{LoadConfig, Reloader};
use crate::stack::Stack;

/// Binds the listener, prints where sluice listens, and serves until `shutdown` resolves.
/// With `reload`, SIGHUP reads the configuration again from it and applies what can change
/// while serving ([`crate::reload`]).
pub async fn run(config: Config, shutdown: impl Future<Output = ()>, reload: Option<LoadConfig>) -> anyhow::Result<()> {
    // Install the metrics recorder before anything records (the head watchers start first).
    sluice_gateway::telemetry::prometheus();
    let named = !config.networks.is_empty();
    let mut stacks = Vec::new();
    for network in config.networks()? {
        stacks.push(Stack::start(&network).await?);
    }
    let mut status = StatusBoard::default();
    let mempools: Vec<Arc<Mempool>> = stacks.iter().filter_map(|s| s.mempool.clone()).collect();
    let heads: Vec<sluice_upstream::HeadFeed> = stacks.iter().filter_map(|s| s.head.clone()).collect();
    // One mesh for every network with a mempool; each transaction names its chain (the
    // implicit network names none, as before there were several).
    let pools: Vec<(u64, Arc<Mempool>)> = stacks
        .iter()
        .filter_map(|s| Some((s.spec.chain_id.unwrap_or(sluice_mesh::UNNAMED_CHAIN), s.mempool.clone()?)))
        .collect();
    let mesh = match (&config.mesh, pools.is_empty()) {
        (Some(settings), false) => Some(start_mesh(settings, pools).await?),
        _ => None,
    };
    if let Some(mesh) = &mesh {
        let mesh = mesh.clone();
        status.add("mesh", Arc::new(move || serde_json::to_value(mesh.latest_status()).unwrap_or_default()));
    }
    let policy = MethodPolicy::new(config.methods.deny.clone(), config.methods.allow.clone());
    let mut gateway = GatewayBuilder::new(Limits::from(&config.limits))
        .method_policy(policy)
        .named(named)
        .status(status)
        .status_page(config.status.page);
    let mut lines = Vec::new();
    let mut ingresses = Vec::new();
    let pools: Vec<_> = stacks.iter().map(|s| (s.spec.id.clone(), s.pool.clone())).collect();
    for stack in stacks {
        lines.push((stack.spec.id.clone(), stack.spec.chain_id, stack.first_url.clone(), stack.upstreams));
        ingresses.extend(stack.ingress);
        gateway = gateway.network(stack.spec);
    }
    if let Some(access) = &config.access {
        let tiers: Vec<(String, Vec<String>, Vec<String>)> =
            access.tiers.iter().map(|(name, t)| (name.clone(), t.deny.clone(), t.allow.clone())).collect();
        let control = sluice_access::Access::new(access.clone()).map_err(anyhow::Error::msg)?;
        control.start().await.map_err(anyhow::Error::msg)?;
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
    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin = match config.access.as_ref().and_then(|a| a.admin.as_ref()) {
        Some(admin) => {
            let admin_listener = TcpListener::bind(admin.listen)
                .await
                .map_err(|e| anyhow::anyhow!("access.admin.listen: cannot listen on {}: {e}", admin.listen))?;
            let admin_addr = admin_listener.local_addr()?;
            println!("sluice admin on http://{admin_addr}");
            let stopped = async move {
                let _ = admin_stopped.await;
            };
            Some(tokio::spawn(sluice_gateway::admin::serve(
                admin_listener,
                gateway.clone(),
                admin.token.clone(),
                stopped,
            )))
        }
        None => None,
    };
    // Printed on stdout, one line each, for people and for scripts waiting on them.
    match (named, &lines[..]) {
        (false, [(_, _, url, upstreams)]) => {
            println!("sluice listening on http://{addr} and ws://{addr} (upstream {url}, {upstreams} in all)");
        }
        _ => {
            for (id, chain, url, upstreams) in &lines {
                let chain = chain.map_or(String::new(), |c| format!(" and /evm/{c}"));
                println!("sluice network {id} on http://{addr}/{id}{chain} (upstream {url}, {upstreams} in all)");
            }
            println!("sluice listening on http://{addr} and ws://{addr} ({} networks)", lines.len());
        }
    }
    tracing::info!(%addr, networks = lines.len(), "serving");
    let reloader = Reloader::new(
        reload.unwrap_or_else(|| {
            Box::new(|| anyhow::bail!("reload needs `sluice serve` (sluice dev builds its configuration)"))
        }),
        config.clone(),
        gateway.clone(),
        pools,
    );
    let hangups = tokio::spawn(reload_on_hangup(reloader));
    sluice_gateway::serve(listener, gateway, shutdown).await;
    hangups.abort();
    let _ = admin_stop.send(());
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    // A follower hands the following over now, not when its lease lapses.
    futures_util::future::join_all(heads.iter().map(|h| h.step_down())).await;
    for ingress in ingresses {
        ingress.shutdown().await;
    }
    if let Some(mesh) = mesh {
        mesh.shutdown().await;
    }
    // Last, once nothing submits any more: the writer applies what it was given, the journal
    // is closed.
    for mempool in mempools {
        mempool.shutdown().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Starts the peer mesh and feeds it each network's newly executable transactions, named by
/// chain.
async fn start_mesh(
    settings: &sluice_mesh::MeshSettings,
    pools: Vec<(u64, Arc<Mempool>)>,
) -> anyhow::Result<sluice_mesh::Mesh> {
    let key = sluice_mesh::load_or_generate_key(&settings.key).map_err(anyhow::Error::msg)?;
    let config = settings.parse().map_err(anyhow::Error::msg)?;
    let chains = pools
        .iter()
        .map(|(chain_id, pool)| sluice_mesh::ChainPool {
            chain_id: *chain_id,
            intake: pool.clone(),
            contents: Some(pool.clone() as Arc<dyn sluice_mesh::PoolContents>),
        })
        .collect();
    let mesh = sluice_mesh::Mesh::start_chains(config, key, chains).await?;
    let addresses: Vec<String> = mesh.addresses().iter().map(|a| a.to_string()).collect();
    // One line on stdout, for people and scripts (other nodes list these addresses as peers).
    println!("sluice mesh peer {} on {}", mesh.peer_id(), addresses.join(" "));
    tracing::info!(peer = %mesh.peer_id(), peers = settings.peers.len(), chains = pools.len(), "peer mesh on");
    for (chain_id, mempool) in pools {
        let mut pending = mempool.subscribe_pending();
        let forward = mesh.clone();
        tokio::spawn(async move {
            loop {
                match pending.recv().await {
                    // A refusal (the mesh's queue is full) is counted by the mesh itself.
                    Ok(tx) => {
                        let _ = forward.broadcast_on(chain_id, tx.raw.to_vec());
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
    }
    Ok(mesh)
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
/// Reloads on each SIGHUP (instead of its default, which would end the process).
async fn reload_on_hangup(mut reloader: Reloader) {
    let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; reload is off");
        return;
    };
    while hangup.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the configuration");
        let _ = reloader.reload().await;
    }
}

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
