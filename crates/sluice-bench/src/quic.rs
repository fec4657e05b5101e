//! `sluice bench quic`: the QUIC ingress under load.
//!
//! * `rtt`: one client offering a constant rate through an emulated RTT, with and without RTT
//!   scaling of stream credit, beside Agave's published figures.
//! * `load`: many clients at once on loopback, as fast as their credit allows.
//!
//! Both run an ingress in this process in front of the *counting intake*, a stand-in pool that
//! takes everything (it isolates the ingress's own speed). `load --target` sends signed
//! transfers to a running sluice instead, through its real mempool, on bidirectional streams,
//! counting the pool's answers.
#![cfg_attr(not(feature = "stand-ins"), allow(dead_code, unused_imports))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;
#[cfg(feature = "stand-ins")]
use sluice_ingress::netem::{delayed_socket, Netem};
#[cfg(feature = "stand-ins")]
use sluice_ingress::null::CountingIntake;
use sluice_ingress::{Client, ClientOptions, Identity, Ingress, IngressConfig, KeyPair};
use tokio::time::Instant;

/// `sluice bench quic …`.
#[derive(Debug, Subcommand)]
pub enum QuicCommand {
    /// Throughput of one client against emulated RTTs, with and without RTT scaling.
    Rtt(RttArgs),
    /// Aggregate ingest of many clients on loopback.
    Load(LoadArgs),
}

/// `sluice bench quic rtt`.
#[derive(Debug, Args)]
pub struct RttArgs {
    /// Emulated RTTs, milliseconds.
    #[arg(long, value_delimiter = ',', default_value = "30,130,220,320")]
    pub rtts: Vec<u64>,
    /// Transactions per second the client offers.
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// The ingress's capacity (a lone client's rate).
    #[arg(long, default_value_t = 12_000.0)]
    pub capacity: f64,
    /// Measured time per run, after the warm-up.
    #[arg(short = 'd', long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Time before measuring: credit follows the RTT estimate, which takes a few round trips,
    /// and the backlog offered meanwhile must drain, or it would count as extra throughput.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Bytes per transaction.
    #[arg(long, default_value_t = 150)]
    pub tx_bytes: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `sluice bench quic load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Client connections (each its own identity).
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Streams each client keeps in flight (opening more waits for credit).
    #[arg(long, default_value_t = 512)]
    pub streams: usize,
    /// Offer this many tx/s in total, open loop, shared by the clients (in-process runs);
    /// without it, clients send as fast as their credit allows (a saturating closed loop,
    /// whose latency is mostly queueing: streams in flight / throughput).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured time.
    #[arg(short = 'd', long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Bytes per transaction (in-process runs).
    #[arg(long, default_value_t = 150)]
    pub tx_bytes: usize,
    /// A running sluice's ingress; without it, an in-process ingress with the counting intake.
    #[arg(long)]
    pub target: Option<SocketAddr>,
    /// With `--target`: its HTTP URL, to fund the senders with `anvil_setBalance`.
    #[arg(long)]
    pub rpc: Option<String>,
    /// With `--target`: signed transfers to send (from 1,000 deterministic senders).
    #[arg(long, default_value_t = 20_000)]
    pub txs: u64,
    /// With `--target`: index of the first deterministic sender (use a fresh range per run).
    #[arg(long, default_value_t = 50_000)]
    pub first_sender: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One RTT point.
#[derive(Debug, Clone, Serialize)]
pub struct RttPoint {
    /// Emulated RTT, ms.
    pub rtt_ms: u64,
    /// Offered, tx/s.
    pub offered: f64,
    /// Accepted with RTT scaling, tx/s.
    pub scaled: f64,
    /// Accepted with fixed credit, tx/s.
    pub fixed: f64,
    /// RTT quinn measured on the scaled run, ms.
    pub measured_rtt_ms: f64,
    /// Credit granted on the scaled run (streams).
    pub credit_scaled: u64,
    /// Credit granted on the fixed run (streams).
    pub credit_fixed: u64,
}

/// Agave's published single-client figures, RTT ms → TPS with and without their RTT scaling:
/// the means of six 10 s runs against testnet nodes over the public internet (SLC, Tokyo and
/// Singapore to Dallas), from <https://github.com/anza-xyz/agave/pull/8948>.
const AGAVE: [(u64, Option<u64>, Option<u64>); 3] =
    [(30, Some(9_788), Some(9_780)), (130, Some(8_074), Some(3_180)), (220, Some(6_609), Some(1_702))];

/// Runs `sluice bench quic …`.
pub async fn run_quic(command: QuicCommand) -> anyhow::Result<()> {
    match command {
        QuicCommand::Rtt(args) => {
            let points = rtt_sweep(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&points)?);
            } else {
                print!("{}", rtt_table(&points));
            }
            Ok(())
        }
        QuicCommand::Load(args) => {
            let summary = match args.target {
                None => load_in_process(&args).await?,
                Some(target) => load_target(&args, target).await?,
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                println!("{}", summary.line());
            }
            Ok(())
        }
    }
}

/// The RTT sweep: each RTT with scaling on, then off.
pub async fn rtt_sweep(args: &RttArgs) -> anyhow::Result<Vec<RttPoint>> {
    let mut points = Vec::new();
    for &rtt_ms in &args.rtts {
        let rtt = Duration::from_millis(rtt_ms);
        let scaled = rtt_run(args, rtt, true).await?;
        let fixed = rtt_run(args, rtt, false).await?;
        eprintln!(
            "rtt {rtt_ms} ms: {:.0} tx/s with scaling, {:.0} without (offered {:.0})",
            scaled.accepted, fixed.accepted, args.rate
        );
        points.push(RttPoint {
            rtt_ms,
            offered: args.rate,
            scaled: scaled.accepted,
            fixed: fixed.accepted,
            measured_rtt_ms: scaled.rtt.as_secs_f64() * 1e3,
            credit_scaled: scaled.credit,
            credit_fixed: fixed.credit,
        });
    }
    Ok(points)
}

/// The sweep as a Markdown table beside Agave's figures.
pub fn rtt_table(points: &[RttPoint]) -> String {
    let mut out = String::from(
        "| RTT | offered tx/s | sluice, RTT scaling | sluice, fixed credit | credit (scaled / fixed) | Agave with / without |\n\
         |---|---|---|---|---|---|\n",
    );
    for p in points {
        let agave = AGAVE.iter().find(|(r, _, _)| *r == p.rtt_ms).map_or("—".to_string(), |(_, with, without)| {
            let f = |v: &Option<u64>| v.map_or("—".to_string(), |v| v.to_string());
            format!("{} / {}", f(with), f(without))
        });
        out += &format!(
            "| {} ms (measured {:.0}) | {:.0} | {:.0} ({:.1} %) | {:.0} ({:.1} %) | {} / {} | {} |\n",
            p.rtt_ms,
            p.measured_rtt_ms,
            p.offered,
            p.scaled,
            100.0 * p.scaled / p.offered,
            p.fixed,
            100.0 * p.fixed / p.offered,
            p.credit_scaled,
            p.credit_fixed,
            agave
        );
    }
    out
}

struct RunResult {
    accepted: f64,
    rtt: Duration,
    credit: u64,
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[cfg(not(feature = "stand-ins"))]
async fn rtt_run(_: &RttArgs, _: Duration, _: bool) -> anyhow::Result<RunResult> {
    Err(crate::without_stand_ins())
}

#[cfg(feature = "stand-ins")]
async fn rtt_run(args: &RttArgs, rtt: Duration, scaling: bool) -> anyhow::Result<RunResult> {
    let key = KeyPair::generate();
    let config = IngressConfig {
        listen: loopback(),
        capacity: args.capacity,
        rtt_scaling: scaling,
        weights: [(key.identity().to_string(), 1.0)].into_iter().collect(),
        max_connections_per_ip: 1_024,
        ..IngressConfig::default()
    };
    let intake = Arc::new(CountingIntake::default());
    let ingress = Ingress::start(config, &KeyPair::generate(), intake.clone())?;
    let socket = delayed_socket(loopback(), Netem { rtt, ..Netem::default() })?;
    let options = ClientOptions { server_identity: Some(ingress.identity()), socket: Some(socket) };
    let client = Arc::new(Client::connect(ingress.local_addr(), &key, options).await?);

    let total = args.warmup + args.duration;
    let offer = tokio::spawn(offer_open_loop(client.clone(), args.rate, total, args.tx_bytes));
    tokio::time::sleep(args.warmup).await;
    let before = intake.taken.load(Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(args.duration).await;
    let accepted = (intake.taken.load(Relaxed) - before) as f64 / t0.elapsed().as_secs_f64();
    let measured = client.rtt();
    let credit = ingress.snapshot().classes.values().map(|c| c.credit).max().unwrap_or(0);
    offer.abort();
    let _ = offer.await;
    if let Ok(client) = Arc::try_unwrap(client) {
        client.close().await;
    }
    ingress.shutdown().await;
    Ok(RunResult { accepted, rtt: measured, credit })
}

/// Offers `rate` tx/s for `for_`, each on its own stream, never waiting for earlier ones (an
/// open-loop client without coordinated omission: a send that waits for credit does not delay
/// the schedule of the next). Like a real sender, it gives up on what it cannot send: at most a
/// quarter second of offered load waits for credit, and the rest is dropped and counted (so a
/// backlog built while the connection warms up cannot later pass for extra throughput).
/// Answers the transactions dropped.
async fn offer_open_loop(client: Arc<Client>, rate: f64, for_: Duration, tx_bytes: usize) -> u64 {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let max_waiting = (rate * 0.25).max(64.0) as usize;
    let (mut n, mut dropped): (u64, u64) = (0, 0);
    while start.elapsed() < for_ {
        let due = start + Duration::from_secs_f64(n as f64 / rate);
        tokio::time::sleep_until(due).await;
        while tasks.try_join_next().is_some() {}
        // Everything due by now goes out in one go (timers tick in milliseconds).
        while start + Duration::from_secs_f64(n as f64 / rate) <= Instant::now() {
            n += 1;
            if tasks.len() >= max_waiting {
                dropped += 1;
                continue;
            }
            let client = client.clone();
            let tx = payload(n, tx_bytes);
            tasks.spawn(async move {
                let _ = client.send(&tx).await;
            });
        }
    }
    tasks.abort_all();
    dropped
}

fn payload(n: u64, len: usize) -> Vec<u8> {
    let mut tx = vec![0xa5u8; len.max(8)];
    tx[..8].copy_from_slice(&n.to_le_bytes());
    tx
}

/// What a load run measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadSummary {
    /// `in-process counting intake` or `sluice mempool at ADDR`.
    pub into: String,
    /// Client connections.
    pub clients: usize,
    /// Transactions the pool (or the counting intake) accepted per second.
    pub accepted_per_second: f64,
    /// Refused by the pool (target runs).
    pub rejected: u64,
    /// Stream-to-pool p50, µs (in-process: measured by the ingress; target: the client's full
    /// round trip on a bidirectional stream).
    pub p50_us: Option<u64>,
    /// Stream-to-pool p99, µs (as above).
    pub p99_us: Option<u64>,
}

impl LoadSummary {
    fn line(&self) -> String {
        let us = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v} µs"));
        format!(
            "{} clients into {}: {:.0} tx/s accepted, {} rejected, p50 {}, p99 {}",
            self.clients,
            self.into,
            self.accepted_per_second,
            self.rejected,
            us(self.p50_us),
            us(self.p99_us)
        )
    }
}

#[cfg(not(feature = "stand-ins"))]
async fn load_in_process(_: &LoadArgs) -> anyhow::Result<LoadSummary> {
    Err(crate::without_stand_ins())
}

#[cfg(feature = "stand-ins")]
async fn load_in_process(args: &LoadArgs) -> anyhow::Result<LoadSummary> {
    let keys: Vec<KeyPair> = (0..args.clients).map(|_| KeyPair::generate()).collect();
    let config = IngressConfig {
        listen: loopback(),
        // Capacity far above what two cores can do: this measures the ingress, not the QoS.
        capacity: 10_000_000.0,
        weights: keys.iter().map(|k| (k.identity().to_string(), 1.0)).collect(),
        max_connections_per_ip: 4_096,
        handshakes_per_ip_per_second: 0.0,
        ..IngressConfig::default()
    };
    let intake = Arc::new(CountingIntake::default());
    let ingress = Ingress::start(config, &KeyPair::generate(), intake.clone())?;
    let mut clients = Vec::new();
    for key in &keys {
        let options = ClientOptions { server_identity: Some(ingress.identity()), socket: None };
        clients.push(Arc::new(Client::connect(ingress.local_addr(), key, options).await?));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    if let Some(rate) = args.rate {
        let each = rate / clients.len() as f64;
        for client in &clients {
            let (client, len, for_) = (client.clone(), args.tx_bytes, args.duration + Duration::from_secs(2));
            workers.spawn(async move {
                offer_open_loop(client, each, for_, len).await;
            });
        }
    }
    for client in clients.iter().filter(|_| args.rate.is_none()) {
        for w in 0..args.streams {
            let (client, stop, len) = (client.clone(), stop.clone(), args.tx_bytes);
            workers.spawn(async move {
                let mut n = (w as u64) << 32;
                while !stop.load(Relaxed) {
                    if client.send(&payload(n, len)).await.is_err() {
                        break;
                    }
                    n += 1;
                }
            });
        }
    }
    // A second of warm-up, then measure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = ingress.stats();
    stats.latency.reset();
    let before = intake.taken.load(Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(args.duration).await;
    let accepted = (intake.taken.load(Relaxed) - before) as f64 / t0.elapsed().as_secs_f64();
    let snapshot = ingress.snapshot();
    stop.store(true, Relaxed);
    workers.abort_all();
    while workers.join_next().await.is_some() {}
    for client in clients {
        if let Ok(client) = Arc::try_unwrap(client) {
            client.close().await;
        }
    }
    ingress.shutdown().await;
    Ok(LoadSummary {
        into: match args.rate {
            Some(rate) => format!("the in-process counting intake (no validation), {rate:.0} tx/s offered"),
            None => "the in-process counting intake (no validation), saturating".into(),
        },
        clients: args.clients,
        accepted_per_second: accepted,
        rejected: 0,
        p50_us: snapshot.p50_us,
        p99_us: snapshot.p99_us,
    })
}

async fn load_target(args: &LoadArgs, target: SocketAddr) -> anyhow::Result<LoadSummary> {
    let rpc = args.rpc.clone().ok_or_else(|| anyhow::anyhow!("--target needs --rpc URL (to fund the senders)"))?;
    let senders = 1_000u64.min(args.txs.max(1));
    let wallets: Vec<crate::txgen::Wallet> =
        (args.first_sender..args.first_sender + senders).map(|i| crate::txgen::Wallet::numbered(i, 31337)).collect();
    crate::ingest::fund_at(&rpc, &wallets).await?;
    let txs = Arc::new(crate::ingest::sign(&wallets, args.txs));
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let options = ClientOptions { server_identity: None::<Identity>, socket: None };
        clients.push(Arc::new(Client::connect(target, &KeyPair::generate(), options).await?));
    }
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let latency = Arc::new(std::sync::Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let t0 = Instant::now();
    let deadline = t0 + args.duration;
    let mut workers = tokio::task::JoinSet::new();
    for client in &clients {
        for _ in 0..args.streams {
            let (client, txs, next, accepted, rejected, latency) =
                (client.clone(), txs.clone(), next.clone(), accepted.clone(), rejected.clone(), latency.clone());
            workers.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Relaxed) as usize;
                    if i >= txs.len() || Instant::now() >= deadline {
                        break;
                    }
                    let sent = Instant::now();
                    match client.submit(&txs[i].raw).await {
                        Ok(_) => {
                            accepted.fetch_add(1, Relaxed);
                            let us = sent.elapsed().as_micros() as u64;
                            let _ = latency.lock().unwrap_or_else(|e| e.into_inner()).record(us);
                        }
                        Err(_) => {
                            rejected.fetch_add(1, Relaxed);
                        }
                    }
                }
            });
        }
    }
    while workers.join_next().await.is_some() {}
    let elapsed = t0.elapsed().as_secs_f64();
    let h = latency.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for client in clients {
        if let Ok(client) = Arc::try_unwrap(client) {
            client.close().await;
        }
    }
    Ok(LoadSummary {
        into: format!("the sluice mempool behind {target} (full validation)"),
        clients: args.clients,
        accepted_per_second: accepted.load(Relaxed) as f64 / elapsed,
        rejected: rejected.load(Relaxed),
        p50_us: (!h.is_empty()).then(|| h.value_at_quantile(0.5)),
        p99_us: (!h.is_empty()).then(|| h.value_at_quantile(0.99)),
    })
}
