//! `sluice bench mesh`: N mesh nodes in this process on loopback (QUIC), each behind the
//! *memory pool*, a named stand-in pool that takes each transaction once and forwards it as the
//! mempool's pending feed does. Transactions are injected at random nodes at a constant rate;
//! the run reports what reached every node, what was lost, redundant deliveries, propagation
//! latency ("time to first relay", "time to everyone"), and CPU and memory per node.
#![cfg_attr(not(feature = "stand-ins"), allow(dead_code, unused_imports))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use sluice_mempool::{TxIntake, TxSource};
#[cfg(feature = "stand-ins")]
use sluice_mesh::memory::MemoryPool;
use sluice_mesh::{Mesh, MeshSettings};

use crate::txgen::{Fees, SignedTx, Wallet};

/// `sluice bench mesh`.
#[derive(Debug, Args)]
pub struct MeshArgs {
    /// Nodes.
    #[arg(long, default_value_t = 50)]
    pub nodes: usize,
    /// Peers each node dials (among the nodes started before it; at least its predecessor).
    #[arg(long, default_value_t = 3)]
    pub degree: usize,
    /// Transactions to inject.
    #[arg(long, default_value_t = 1_000)]
    pub txs: u64,
    /// Injection rate, transactions per second.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Streams in flight per peer (the node's `max_in_flight`).
    #[arg(long, default_value_t = sluice_mesh::MeshSettings::default().max_in_flight)]
    pub max_in_flight: usize,
    /// Transactions per stream under a backlog (the node's `max_batch`; 1 = one per stream).
    #[arg(long, default_value_t = sluice_mesh::MeshSettings::default().max_batch)]
    pub max_batch: usize,
    /// How long to wait for everything to arrive everywhere after the last injection.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the table's header first (the row is printed either way).
    #[arg(long)]
    pub header: bool,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct MeshSummary {
    /// Nodes.
    pub nodes: usize,
    /// Links dialed.
    pub links: usize,
    /// Transactions injected.
    pub injected: u64,
    /// (node, transaction) pairs delivered.
    pub delivered: u64,
    /// (node, transaction) pairs missing at the end.
    pub lost: u64,
    /// Deliveries of a transaction a node already had (judged and dropped by its pool).
    pub redundant: u64,
    /// Messages that ended in a surfaced failure (all nodes).
    pub failed: u64,
    /// Messages sent (one transaction to one peer, retries included).
    pub sent: u64,
    /// Streams opened for them (fewer than `sent` when backlogs were batched).
    pub streams: u64,
    /// Copies not sent because the peer had sent the transaction to us.
    pub skipped: u64,
    /// Time to first relay, p50 / p99, ms.
    pub first_relay_ms: (f64, f64),
    /// Time to everyone, p50 / p99, ms.
    pub everyone_ms: (f64, f64),
    /// Send-to-verdict time of every message, p50 / p99, ms.
    pub ack_ms: (f64, f64),
    /// Process CPU seconds per node per second of run.
    pub cpu_per_node: f64,
    /// Resident memory per node, MiB: how much the process's RSS grew from before the nodes
    /// started to the end, divided by the nodes (so earlier runs in the process do not count).
    pub rss_per_node_mib: f64,
    /// Seconds from first injection to the end.
    pub seconds: f64,
    /// Mean size of the signed transfers injected, bytes.
    pub tx_bytes: f64,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, from /proc (clock ticks of 1/100 s on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs one mesh benchmark (it needs the memory pool: builds with the `stand-ins` feature).
#[cfg(not(feature = "stand-ins"))]
pub async fn run_mesh_bench(_: &MeshArgs) -> anyhow::Result<MeshSummary> {
    Err(crate::without_stand_ins())
}

/// Runs one mesh benchmark.
#[cfg(feature = "stand-ins")]
pub async fn run_mesh_bench(args: &MeshArgs) -> anyhow::Result<MeshSummary> {
    anyhow::ensure!(args.nodes >= 2 && args.txs > 0 && args.rate > 0.0, "need 2+ nodes, txs and a rate");
    let rss_before = rss_mib();
    let mut meshes: Vec<Mesh> = Vec::new();
    let mut pools: Vec<Arc<MemoryPool>> = Vec::new();
    let mut links = 0;
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..args.nodes {
        let mut dial: Vec<usize> = if i == 0 { vec![] } else { vec![i - 1] };
        while i > 1 && dial.len() < args.degree.min(i) {
            let j = rng.usize(0..i);
            if !dial.contains(&j) {
                dial.push(j);
            }
        }
        links += dial.len();
        let settings = MeshSettings {
            listen: vec!["/ip4/127.0.0.1/udp/0/quic-v1".into()],
            peers: dial.iter().flat_map(|j| meshes[*j].addresses()).map(|a| a.to_string()).collect(),
            max_in_flight: args.max_in_flight,
            max_batch: args.max_batch,
            ..MeshSettings::default()
        };
        let (pool, mut fresh) = MemoryPool::new();
        let pool = Arc::new(pool);
        let key = libp2p_key();
        let mesh =
            Mesh::start(settings.parse().map_err(anyhow::Error::msg)?, key, pool.clone(), Some(pool.clone())).await?;
        let forward = mesh.clone();
        tokio::spawn(async move {
            while let Some(raw) = fresh.recv().await {
                let _ = forward.broadcast(raw);
            }
        });
        meshes.push(mesh);
        pools.push(pool);
    }
    // Let the dials complete.
    let deadline = Instant::now() + Duration::from_secs(30);
    for m in &meshes {
        while Instant::now() < deadline {
            let status = m.status().await.ok_or_else(|| anyhow::anyhow!("a node stopped"))?;
            if status.peers.iter().all(|p| p.connected) && !status.peers.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    eprintln!("{} nodes, {links} links up; injecting {} transactions at {}/s", args.nodes, args.txs, args.rate);

    // Real signed EIP-1559 transfers (about 115 bytes each), signed before the clock starts:
    // 20 senders, nonces in order, the sizes a mempool relays.
    let senders: Vec<Wallet> = (0..20).map(|n| Wallet::numbered(1_000 + n, 31_337)).collect();
    let to = senders[0].address();
    let signed: Vec<SignedTx> =
        (0..args.txs).map(|k| senders[(k % 20) as usize].transfer(k / 20, to, 1, Fees::default())).collect();
    let tx_bytes = signed.iter().map(|t| t.raw.len()).sum::<usize>() as f64 / signed.len().max(1) as f64;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut injected = Vec::new();
    for (k, tx) in signed.into_iter().enumerate() {
        tokio::time::sleep_until((t0 + Duration::from_secs_f64(k as f64 / args.rate)).into()).await;
        let origin = rng.usize(0..args.nodes);
        let hash = tx.hash;
        pools[origin].submit(tx.raw.into(), TxSource::Rpc).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        injected.push((hash, origin, Instant::now()));
    }
    let settle_by = Instant::now() + args.settle;
    while Instant::now() < settle_by && pools.iter().any(|p| p.len() < args.txs as usize) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;

    let mut first = Vec::new();
    let mut everyone = Vec::new();
    let mut delivered = 0u64;
    for (hash, origin, at) in &injected {
        let arrivals: Vec<Option<Instant>> = pools.iter().map(|p| p.arrived(hash)).collect();
        delivered += arrivals.iter().filter(|a| a.is_some()).count() as u64;
        let others: Vec<f64> = arrivals
            .iter()
            .enumerate()
            .filter(|(i, _)| i != origin)
            .filter_map(|(_, a)| a.map(|a| a.saturating_duration_since(*at).as_secs_f64() * 1e3))
            .collect();
        if let Some(min) = others.iter().cloned().reduce(f64::min) {
            first.push(min);
        }
        if arrivals.iter().all(|a| a.is_some()) {
            everyone.push(others.iter().cloned().fold(0.0, f64::max));
        }
    }
    first.sort_by(|a, b| a.total_cmp(b));
    everyone.sort_by(|a, b| a.total_cmp(b));
    let (mut failed, mut sent, mut streams, mut skipped) = (0, 0, 0, 0);
    let mut acks = hdrhistogram::Histogram::<u64>::new(2)?;
    for m in &meshes {
        if let Some(s) = m.status().await {
            failed += s.failed() + s.broadcasts_refused;
            sent += s.peers.iter().map(|p| p.counts.sent).sum::<u64>();
            streams += s.peers.iter().map(|p| p.counts.streams).sum::<u64>();
            skipped += s.peers.iter().map(|p| p.counts.skipped).sum::<u64>();
        }
        if let Some(h) = m.ack_times().await {
            acks.add(h)?;
        }
    }
    let ms = |q: f64| acks.value_at_quantile(q) as f64 / 1e3;
    let summary = MeshSummary {
        nodes: args.nodes,
        links,
        injected: args.txs,
        delivered,
        lost: args.txs * args.nodes as u64 - delivered,
        redundant: pools.iter().map(|p| p.duplicates()).sum(),
        failed,
        sent,
        streams,
        skipped,
        first_relay_ms: (quantile(&first, 0.5), quantile(&first, 0.99)),
        everyone_ms: (quantile(&everyone, 0.5), quantile(&everyone, 0.99)),
        ack_ms: (ms(0.5), ms(0.99)),
        cpu_per_node: cpu / seconds / args.nodes as f64,
        rss_per_node_mib: (rss_mib() - rss_before).max(0.0) / args.nodes as f64,
        seconds,
        tx_bytes,
    };
    for m in &meshes {
        m.shutdown().await;
    }
    Ok(summary)
}

fn libp2p_key() -> sluice_mesh::Keypair {
    sluice_mesh::Keypair::generate_ed25519()
}

/// Runs `sluice bench mesh` and prints the summary.
pub async fn run_mesh(args: MeshArgs) -> anyhow::Result<()> {
    let s = run_mesh_bench(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        if args.header {
            println!("{TABLE_HEADER}");
        }
        println!("{}", markdown_row(&args.label(), &s));
    }
    Ok(())
}

impl MeshArgs {
    /// Arguments for `nodes` nodes with the defaults otherwise.
    pub fn new(nodes: usize, txs: u64, rate: f64) -> Self {
        let defaults = sluice_mesh::MeshSettings::default();
        MeshArgs {
            nodes,
            degree: 3,
            txs,
            rate,
            max_in_flight: defaults.max_in_flight,
            max_batch: defaults.max_batch,
            settle: Duration::from_secs(60),
            json: false,
            header: false,
        }
    }

    /// The settings that vary between rows, for the table's first column.
    pub fn label(&self) -> String {
        let rate = if self.rate >= 1e6 { "at once".to_string() } else { format!("{}/s", self.rate) };
        format!(
            "degree {}, {} txs {rate}, {} per stream, {} in flight",
            self.degree, self.txs, self.max_batch, self.max_in_flight
        )
    }

    /// The command that reproduces a row.
    pub fn command(&self) -> String {
        format!(
            "sluice bench mesh --nodes {} --degree {} --txs {} --rate {} --max-batch {} --max-in-flight {}",
            self.nodes, self.degree, self.txs, self.rate, self.max_batch, self.max_in_flight
        )
    }
}

/// One table row.
pub fn markdown_row(label: &str, s: &MeshSummary) -> String {
    format!(
        "| {label} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} / {:.1} | {:.3} | {:.1} | {:.0} |",
        s.nodes,
        s.links,
        s.injected,
        s.delivered,
        s.lost,
        s.redundant,
        s.failed,
        s.sent,
        s.streams,
        s.skipped,
        s.first_relay_ms.0,
        s.first_relay_ms.1,
        s.everyone_ms.0,
        s.everyone_ms.1,
        s.ack_ms.0,
        s.ack_ms.1,
        s.cpu_per_node,
        s.rss_per_node_mib,
        s.tx_bytes
    )
}

/// The header for [`markdown_row`].
pub const TABLE_HEADER: &str = "| settings | nodes | links | txs | delivered | lost | redundant | failed | sent / streams / skipped | first relay p50 / p99 ms | everyone p50 / p99 ms | ack p50 / p99 ms | CPU s/s per node | MiB per node | tx bytes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";
