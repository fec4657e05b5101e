//! `sluice bench report`: runs the benchmark scenarios on this machine against a fresh anvil,
//! directly and through sluice (this same binary, as child processes), and writes
//! `benchmarks.md` and SVG plots. Every figure in it comes from this run.

mod chain;
mod mempools;
mod page;
mod sections;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sluice_bench::mix::Mix;
use sluice_bench::report::{Row, Section};
use sluice_bench::run::{compare, run, Plan};
use sluice_bench::schedule::Model;
use sluice_upstream::{HttpUpstream, HttpUpstreamConfig};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::dev;

/// Arguments of `sluice bench report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Folder for benchmarks.md and bench/*.svg.
    #[arg(long, default_value = "docs")]
    pub out: PathBuf,
    /// Load time per target for each fixed-concurrency case (split into two alternating rounds).
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub cell: Duration,
    /// The ramp's final rate, requests/s: above what anvil answers on two cores, so that the
    /// ramp finds each target's limit.
    #[arg(long, default_value_t = 50_000.0)]
    pub ramp_to: f64,
    /// The ramp's length.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ramp_duration: Duration,
    /// Concurrency levels for the fixed-concurrency scenarios.
    #[arg(long, value_delimiter = ',', default_value = "10,64,256")]
    pub concurrency: Vec<usize>,
    /// Measured time per point of the QUIC RTT sweep (after the warm-up), with and without
    /// RTT scaling; `0s` skips the sweep.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub quic: Duration,
    /// Warm-up before each point of the QUIC sweep (credit settles on the measured RTT).
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub quic_warmup: Duration,
    /// Emulated RTTs of the QUIC sweep, ms.
    #[arg(long, value_delimiter = ',', default_value = "30,130,220,320")]
    pub quic_rtts: Vec<u64>,
    /// Node counts for the peer mesh rows (`--mesh-txs` transactions at 20/s each); `0` skips
    /// the mesh.
    #[arg(long, value_delimiter = ',', default_value = "50,200")]
    pub mesh_nodes: Vec<usize>,
    /// Transactions per mesh row.
    #[arg(long, default_value_t = 200)]
    pub mesh_txs: u64,
    /// Also run the mesh's batching on/off pairs (50 nodes under load; 3 nodes × 10k at once).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub mesh_pairs: bool,
    /// sluice processes in a line for the mesh through real mempools (scenario g′); `0` skips it.
    #[arg(long, default_value_t = 5)]
    pub mempool_mesh_nodes: usize,
    /// Signed transfers sent into the first of them.
    #[arg(long, default_value_t = 1000)]
    pub mempool_mesh_txs: u64,
    /// The rate they are sent at, per second.
    #[arg(long, default_value_t = 200.0)]
    pub mempool_mesh_rate: f64,
    /// WebSocket clients for the subscription fan-out (scenario h); `0` skips it.
    #[arg(long, default_value_t = 2000)]
    pub ws_clients: usize,
    /// Blocks mined (one per second) during the subscription fan-out.
    #[arg(long, default_value_t = 10)]
    pub ws_blocks: u64,
    /// Path to anvil (default: the project's .tools folder, then PATH).
    #[arg(long)]
    pub anvil: Option<PathBuf>,
    /// Path to `sluice-baseline`, the bare forwarder and server of scenario a″ (default: beside
    /// this binary, then PATH); `--baseline none` skips the scenario.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Filled in by the report: the anvil version it ran against.
    #[arg(skip)]
    pub anvil_version: String,
}

pub(crate) const DEV: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

/// Starts `sluice serve` (this binary) in front of `upstream`; returns the child and its URL.
async fn spawn_sluice(upstream: &str, cache: bool) -> anyhow::Result<(Child, String)> {
    // Each instance journals its (idle) mempool in a file of its own: journals are exclusive.
    static INSTANCE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let journal = std::env::temp_dir().join(format!("sluice-report-{}-{n}.journal", std::process::id()));
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", upstream])
        .env("SLUICE_LOG", "warn")
        .env("SLUICE_CACHE__ENABLED", cache.to_string())
        // Pass-through means every call reaches the node: identical in-flight calls are not
        // coalesced either (the load repeats one call).
        .env("SLUICE_CACHE__COALESCE", cache.to_string())
        .env("SLUICE_MEMPOOL__JOURNAL", &journal)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let line = listening_line(&mut child, "sluice listening on http://").await?;
    let addr = line.split_whitespace().next().unwrap_or_default().to_owned();
    Ok((child, format!("http://{addr}")))
}

/// Reads a child's stdout up to the line starting with `prefix` and returns the rest of that
/// line; the lines after it are read and dropped, so the child never blocks on a full pipe.
pub(super) async fn listening_line(child: &mut Child, prefix: &str) -> anyhow::Result<String> {
    Ok(listening_lines(child, &[prefix]).await?.remove(0))
}

/// [`listening_line`] for several lines: the rest of the first line starting with each of
/// `prefixes`, in that order, whatever order the child prints them in.
pub(super) async fn listening_lines(child: &mut Child, prefixes: &[&str]) -> anyhow::Result<Vec<String>> {
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut found: Vec<Option<String>> = vec![None; prefixes.len()];
    while let Some(line) = lines.next_line().await? {
        for (prefix, slot) in prefixes.iter().zip(found.iter_mut()) {
            if let (None, Some(rest)) = (&slot, line.strip_prefix(prefix)) {
                *slot = Some(rest.trim().to_owned());
            }
        }
        if found.iter().all(Option::is_some) {
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok(found.into_iter().flatten().collect());
        }
    }
    anyhow::bail!("exited before printing {prefixes:?}")
}

/// sluice's /metrics text, over a plain socket.
async fn metrics_text(url: &str) -> Option<String> {
    get_text(url, "/metrics").await
}

/// A GET of `path` over a plain HTTP/1.0 socket: the whole answer, head included.
pub(super) async fn get_text(url: &str, path: &str) -> Option<String> {
    let addr = url.strip_prefix("http://")?;
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    Some(text)
}

/// One series of sluice's /metrics (`series` includes its labels, or ends with a space).
async fn metric(url: &str, series: &str) -> Option<f64> {
    metrics_text(url).await?.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The sum of every series of one metric in sluice's /metrics (0 when absent).
async fn metric_sum(url: &str, name: &str) -> f64 {
    let Some(text) = metrics_text(url).await else { return 0.0 };
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn plan(url: &str, model: Model, duration: Duration, mix: Mix) -> Plan {
    Plan {
        url: url.to_owned(),
        model,
        requests: None,
        duration,
        mix: Arc::new(mix),
        batch: 1,
        page: false,
        timeout: Duration::from_secs(2),
        max_in_flight: 10_000,
        progress: false,
        seed: 1,
        sequence: None,
    }
}

/// Runs the same load against sluice and anvil, alternating.
async fn pair(case: String, sluice: &str, direct: &str, model: Model, cell: Duration, mix: Mix) -> anyhow::Result<Row> {
    eprintln!("  {case}");
    let (sluice, direct) = compare(&plan(sluice, model, cell * 2, mix), direct, 2).await?;
    Ok(Row { case, direct, sluice })
}

/// Runs `sluice bench report`.
pub async fn run_report(mut args: ReportArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.concurrency.is_empty(), "--concurrency needs at least one level");
    anyhow::ensure!(args.mempool_mesh_nodes != 1, "--mempool-mesh-nodes: 0 (skip it) or at least 2");
    anyhow::ensure!(args.mempool_mesh_rate > 0.0, "--mempool-mesh-rate must be more than zero");
    let baseline = match &args.baseline {
        Some(p) if p.as_os_str() == "none" => None,
        given => Some(sections::find_baseline(given.as_deref())?),
    };
    let anvil_path = dev::find_anvil(args.anvil.as_deref())?;
    let version = Command::new(&anvil_path).arg("--version").output().await?;
    args.anvil_version = String::from_utf8_lossy(&version.stdout).lines().next().unwrap_or("unknown").trim().to_owned();
    let port = dev::free_port()?;
    let _anvil = dev::start_anvil(&anvil_path, port, None, None, &[]).await?;
    let anvil = format!("http://127.0.0.1:{port}");
    let node = HttpUpstream::new(HttpUpstreamConfig {
        name: "report".into(),
        network: "bench".into(),
        url: anvil.clone(),
        timeout: Duration::from_secs(30),
        max_response_bytes: 64 << 20,
    })
    .map_err(anyhow::Error::msg)?;
    chain::call(&node, "anvil_mine", r#"["0x80"]"#).await?; // 128 blocks: the first 64 are finalized
    let (_cached_child, cached) = spawn_sluice(&anvil, true).await?;
    let (_plain_child, plain) = spawn_sluice(&anvil, false).await?;
    for _ in 0..100 {
        if metric(&cached, "sluice_chain_head ").await == Some(128.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let one = |method: &str, params: &str| Mix::single(method, params).expect("valid built-in params");
    let cell = args.cell;

    eprintln!("scenario a: fixed concurrency (the Lotus report's shape)");
    let mut cached_rows = Vec::new();
    let mut pass_rows = Vec::new();
    for &c in &args.concurrency {
        let block = one("eth_getBlockByNumber", r#"["0x10",false]"#);
        cached_rows.push(
            pair(
                format!("cached eth_getBlockByNumber(0x10), c={c}"),
                &cached,
                &anvil,
                Model::Concurrency(c),
                cell,
                block,
            )
            .await?,
        );
        let number = one("eth_blockNumber", "[]");
        cached_rows.push(
            pair(format!("local eth_blockNumber, c={c}"), &cached, &anvil, Model::Concurrency(c), cell, number).await?,
        );
        let balance = one("eth_getBalance", &format!(r#"["{DEV}","latest"]"#));
        pass_rows.push(
            pair(format!("pass-through eth_getBalance, c={c}"), &plain, &anvil, Model::Concurrency(c), cell, balance)
                .await?,
        );
    }
    let cached_section = Section {
        title: "a. Fixed concurrency: cached and local answers".into(),
        note: "sluice with its cache on, after one warm-up request, against anvil directly.".into(),
        command: format!("sluice bench rpc SLUICE_URL -c C -d {}s --method eth_getBlockByNumber --params '[\"0x10\",false]' --compare ANVIL_URL", cell.as_secs_f64() * 2.0),
        reference: "anvil".into(),
        rows: cached_rows,
    };
    let pass_section = Section {
        title: "a′. Fixed concurrency: pass-through (cache off)".into(),
        note: "sluice with `SLUICE_CACHE__ENABLED=false SLUICE_CACHE__COALESCE=false`: every call goes to anvil (identical calls in flight are not coalesced either), so this is the cost of the extra hop.".into(),
        command: format!("sluice bench rpc SLUICE_URL -c C -d {}s --method eth_getBalance --params '[\"{DEV}\",\"latest\"]' --compare ANVIL_URL", cell.as_secs_f64() * 2.0),
        reference: "anvil".into(),
        rows: pass_rows,
    };

    // The baselines run at the highest level up to 64 (the issue's c=64 when it is asked for).
    let base_c = args.concurrency.iter().copied().filter(|&c| c <= 64).max().unwrap_or(args.concurrency[0]);
    let baselines = match &baseline {
        Some(path) => {
            eprintln!("scenario a″: against bare baselines ({})", path.display());
            Some(sections::baseline_section(path, &cached, &plain, &anvil, base_c, cell).await?)
        }
        None => None,
    };

    eprintln!("scenario b: incremental ramp (the ddosify report's shape)");
    let ramp = Model::Ramp { from: 0.0, to: args.ramp_to };
    let ramp_direct = run(&plan(&anvil, ramp, args.ramp_duration, one("eth_blockNumber", "[]"))).await?;
    let ramp_sluice = run(&plan(&cached, ramp, args.ramp_duration, one("eth_blockNumber", "[]"))).await?;
    let ramp_row = Row {
        case: format!("ramp 0 → {} req/s over {:?}", args.ramp_to, args.ramp_duration),
        direct: ramp_direct,
        sluice: ramp_sluice,
    };

    eprintln!("scenario c: a realistic method mix");
    let moving = chain::MovingChain::start(&node).await?;
    let mix_text = moving.mix_text.clone();
    let mix = Mix::parse(&mix_text).map_err(anyhow::Error::msg)?;
    let cache_before =
        (metric_sum(&cached, "sluice_cache_hits_total").await, metric_sum(&cached, "sluice_cache_misses_total").await);
    let mix_row = pair(
        "eth_call, balances, blocks, receipts, logs on a moving chain, c=64".into(),
        &cached,
        &anvil,
        Model::Concurrency(64),
        cell,
        mix,
    )
    .await;
    let blocks = moving.stop(&node).await?;
    let mix_row = mix_row?;
    let hits = metric_sum(&cached, "sluice_cache_hits_total").await - cache_before.0;
    let misses = metric_sum(&cached, "sluice_cache_misses_total").await - cache_before.1;
    let mix_section = Section {
        title: "c. A realistic method mix".into(),
        note: format!(
            "A chain that moves: a counter contract (`{}`: each call adds one, logs it, returns the count) \
             called by 3 transactions in each of 20 blocks before the run, then a block of 3 such transactions \
             every second during it ({blocks} blocks). The mix (below) reads at `latest` (`eth_call` of the counter, \
             balance, block), recent blocks with their transactions, old blocks, receipts and transactions of the \
             60 calls, and `eth_getLogs` over their logs. Cache hit ratio over sluice's rounds: **{:.1} %** \
             ({hits:.0} hits, {misses:.0} misses; `sluice_cache_hits_total` and `_misses_total` before and after).",
            chain::COUNTER,
            100.0 * hits / (hits + misses).max(1.0)
        ),
        command: format!(
            "sluice bench rpc SLUICE_URL -c 64 -d {}s --mix MIX.toml --compare ANVIL_URL",
            cell.as_secs_f64() * 2.0
        ),
        reference: "anvil".into(),
        rows: vec![mix_row],
    };

    if !sluice_bench::STAND_INS {
        eprintln!("scenarios f and g skipped: built without sluice-bench/stand-ins");
    }
    let quic = if args.quic.is_zero() || !sluice_bench::STAND_INS {
        None
    } else {
        eprintln!("scenario f: the QUIC ingress through emulated RTTs");
        let sweep = sluice_bench::quic::RttArgs {
            rtts: args.quic_rtts.clone(),
            rate: 10_000.0,
            capacity: 12_000.0,
            duration: args.quic,
            warmup: args.quic_warmup,
            tx_bytes: 150,
            json: false,
        };
        Some((sluice_bench::quic::rtt_table(&sluice_bench::quic::rtt_sweep(&sweep).await?), sweep))
    };

    let mesh = if args.mesh_nodes.contains(&0) || !sluice_bench::STAND_INS {
        None
    } else {
        Some(sections::mesh_section(&args.mesh_nodes, args.mesh_txs, args.mesh_pairs).await?)
    };

    let mempool_mesh = if args.mempool_mesh_nodes == 0 {
        None
    } else {
        eprintln!("scenario g′: the peer mesh through {} real mempools", args.mempool_mesh_nodes);
        let (nodes, txs, rate) = (args.mempool_mesh_nodes, args.mempool_mesh_txs, args.mempool_mesh_rate);
        Some(mempools::section(&anvil_path, nodes, txs, rate).await?)
    };

    let ws = match (args.ws_clients, _cached_child.id()) {
        (0, _) | (_, None) => None,
        (clients, Some(pid)) => {
            eprintln!("scenario h: subscription fan-out to {clients} WebSocket clients");
            Some(sections::ws_section(&cached, &anvil, pid, clients, args.ws_blocks).await?)
        }
    };

    let figures = page::Figures {
        cached: cached_section,
        pass: pass_section,
        baselines,
        mix: mix_section,
        mix_text,
        mix_hit_ratio: 100.0 * hits / (hits + misses).max(1.0),
        ramp: ramp_row,
        quic,
        mesh,
        mempool_mesh,
        ws,
    };
    page::write(&args, &figures)
}
