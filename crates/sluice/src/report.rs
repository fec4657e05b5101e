//! `sluice bench report`: runs the benchmark scenarios on this machine against a fresh anvil,
//! directly and through sluice (this same binary, as child processes), and writes
//! `benchmarks.md` and SVG plots. Every figure in it comes from this run.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sluice_bench::mix::Mix;
use sluice_bench::report::{latency_svg, overhead_markdown, section_markdown, series_svg, Row, Section};
use sluice_bench::run::{compare, run, Plan};
use sluice_bench::schedule::Model;
use sluice_jsonrpc::{Id, RawValue, Request};
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
    /// The ramp's final rate, requests/s.
    #[arg(long, default_value_t = 10_000.0)]
    pub ramp_to: f64,
    /// The ramp's length.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ramp_duration: Duration,
    /// Concurrency levels for the fixed-concurrency scenarios.
    #[arg(long, value_delimiter = ',', default_value = "10,64,256")]
    pub concurrency: Vec<usize>,
    /// Measured time per point of the QUIC RTT sweep (after a 4 s warm-up), with and without
    /// RTT scaling; `0s` skips the sweep.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub quic: Duration,
    /// Node counts for the peer mesh rows (200 transactions at 20/s each); `0` skips the mesh.
    #[arg(long, value_delimiter = ',', default_value = "50,200")]
    pub mesh_nodes: Vec<usize>,
    /// WebSocket clients for the subscription fan-out (scenario h, 10 blocks); `0` skips it.
    #[arg(long, default_value_t = 2000)]
    pub ws_clients: usize,
    /// Path to anvil (default: the project's .tools folder, then PATH).
    #[arg(long)]
    pub anvil: Option<PathBuf>,
    /// Filled in by the report: the anvil version it ran against.
    #[arg(skip)]
    pub anvil_version: String,
}

const DEV: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

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
        .env("SLUICE_MEMPOOL__JOURNAL", &journal)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(rest) = line.strip_prefix("sluice listening on http://") {
            let addr = rest.split_whitespace().next().unwrap_or_default().to_owned();
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok((child, format!("http://{addr}")));
        }
    }
    anyhow::bail!("sluice exited before listening")
}

async fn call(node: &HttpUpstream, method: &str, params: &str) -> anyhow::Result<()> {
    let request = Request::new(Some(Id::number(1)), method, RawValue::from_string(params.into()).ok());
    node.call(&request).await.map_err(|e| anyhow::anyhow!("{method}: {e}"))?;
    Ok(())
}

/// Reads one metric from sluice's /metrics over a plain socket.
async fn metric(url: &str, series: &str) -> Option<f64> {
    let addr = url.strip_prefix("http://")?;
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
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
    let anvil_path = dev::find_anvil(args.anvil.as_deref())?;
    let version = Command::new(&anvil_path).arg("--version").output().await?;
    args.anvil_version = String::from_utf8_lossy(&version.stdout).lines().next().unwrap_or("unknown").trim().to_owned();
    let port = dev::free_port()?;
    let _anvil = dev::start_anvil(&anvil_path, port, None, None).await?;
    let anvil = format!("http://127.0.0.1:{port}");
    let node = HttpUpstream::new(HttpUpstreamConfig {
        name: "report".into(),
        network: "bench".into(),
        url: anvil.clone(),
        timeout: Duration::from_secs(30),
        max_response_bytes: 64 << 20,
    })
    .map_err(anyhow::Error::msg)?;
    call(&node, "anvil_mine", r#"["0x80"]"#).await?; // 128 blocks: the first 64 are finalized
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
    let mut sections = Vec::new();

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
    sections.push(Section {
        title: "a. Fixed concurrency: cached and local answers".into(),
        note: "sluice with its cache on, after one warm-up request, against anvil directly.".into(),
        command: format!("sluice bench rpc SLUICE_URL -c C -d {}s --method eth_getBlockByNumber --params '[\"0x10\",false]' --compare ANVIL_URL", cell.as_secs_f64() * 2.0),
        rows: cached_rows,
    });
    sections.push(Section {
        title: "a′. Fixed concurrency: pass-through (cache off)".into(),
        note: "sluice with `SLUICE_CACHE__ENABLED=false`: every call goes to anvil, so this is the cost of the extra hop.".into(),
        command: format!("sluice bench rpc SLUICE_URL -c C -d {}s --method eth_getBalance --params '[\"{DEV}\",\"latest\"]' --compare ANVIL_URL", cell.as_secs_f64() * 2.0),
        rows: pass_rows,
    });

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
    let mix_text = format!(
        "[vars]\naddress = [\"{DEV}\", \"0x70997970c51812dc3a010c7d01b50e0d17dc79c8\", \"0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc\"]\n\
         block = {{ from = 1, to = 120 }}\n\
         [[call]]\nmethod = \"eth_call\"\nparams = [{{ to = \"{{address}}\", data = \"0x70a08231\" }}, \"latest\"]\nweight = 70\n\
         [[call]]\nmethod = \"eth_getBalance\"\nparams = [\"{{address}}\", \"latest\"]\nweight = 20\n\
         [[call]]\nmethod = \"eth_getBlockByNumber\"\nparams = [\"{{block}}\", false]\nweight = 10\n"
    );
    let mix = Mix::parse(&mix_text).map_err(anyhow::Error::msg)?;
    let mix_row = pair(
        "70% eth_call, 20% eth_getBalance, 10% eth_getBlockByNumber, c=64".into(),
        &cached,
        &anvil,
        Model::Concurrency(64),
        cell,
        mix,
    )
    .await?;
    sections.push(Section {
        title: "c. A realistic method mix".into(),
        note: "The mix file is written into the report below; `{address}` draws from three accounts, `{block}` from blocks 1–120.".into(),
        command: format!("sluice bench rpc SLUICE_URL -c 64 -d {}s --mix MIX.toml --compare ANVIL_URL", cell.as_secs_f64() * 2.0),
        rows: vec![mix_row],
    });

    let quic = if args.quic.is_zero() {
        None
    } else {
        eprintln!("scenario f: the QUIC ingress through emulated RTTs");
        let sweep = sluice_bench::quic::RttArgs {
            rtts: vec![30, 130, 220, 320],
            rate: 10_000.0,
            capacity: 12_000.0,
            duration: args.quic,
            warmup: Duration::from_secs(4),
            tx_bytes: 150,
            json: false,
        };
        Some((sluice_bench::quic::rtt_table(&sluice_bench::quic::rtt_sweep(&sweep).await?), sweep))
    };

    let mesh = if args.mesh_nodes.contains(&0) { None } else { Some(mesh_section(&args.mesh_nodes).await?) };

    let ws = match (args.ws_clients, _cached_child.id()) {
        (0, _) | (_, None) => None,
        (clients, Some(pid)) => {
            eprintln!("scenario h: subscription fan-out to {clients} WebSocket clients");
            Some(ws_section(&cached, &anvil, pid, clients).await?)
        }
    };

    write(&args, &sections, ramp_row, &mix_text, quic, mesh, ws).await
}

/// Scenario h: `clients` WebSocket clients on newHeads and a logs filter through the cached
/// sluice, one block with one log per second.
async fn ws_section(sluice: &str, anvil: &str, pid: u32, clients: usize) -> anyhow::Result<String> {
    let ws = |url: &str| url.replacen("http://", "ws://", 1);
    let args = sluice_bench::ws::WsArgs {
        url: ws(sluice),
        reference: ws(anvil),
        clients,
        blocks: 10,
        mine: Some(anvil.to_owned()),
        block_time: Duration::from_secs(1),
        pid: Some(pid),
        metrics: Some(sluice.to_owned()),
        json: false,
    };
    let s = sluice_bench::ws::measure(&args).await?;
    let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    Ok(format!(
        "## h. Subscriptions: fan-out to many WebSocket clients

         `sluice bench ws SLUICE_WS --reference ANVIL_WS --clients {clients} --blocks 10 --mine ANVIL_URL --pid PID          --metrics SLUICE_URL`: each client subscribes to `newHeads` and a logs filter; one block with one log per          second. Latency runs from a direct subscriber to anvil receiving the head to each client receiving it          from sluice; the fan-out is the last client's. The clients run in the report's process, on the same          cores as sluice and anvil: compare the two CPU columns. The machine's own limit, a bare fan-out          (`sluice-baseline fanout`) beside sluice, is `bench/ws.sh` (figures in          [subscriptions.md](subscriptions.md#benchmark)).

         | clients | fan-out p50 / p99 ms | each delivery p50 / p99 ms | notifications/s | missed / duplicated / closed |          KiB per client | upstream sockets | CPU per block: sluice / generator ms |
         |---:|---:|---:|---:|---:|---:|---:|---:|
         | {} | {} / {} | {} / {} | {:.0} | {} / {} / {} | {} | {} | {} / {} |

",
        s.clients,
        ms(s.fanout_us[0]),
        ms(s.fanout_us[1]),
        ms(s.delivery_us[0]),
        ms(s.delivery_us[1]),
        s.messages_per_s,
        s.missed,
        s.duplicated,
        s.closed,
        opt(s.kib_per_client, 1),
        opt(s.upstream_sockets, 0),
        opt(s.server_cpu_ms_per_block, 0),
        opt(s.generator_cpu_ms_per_block, 0),
    ))
}

/// Scenario g: the peer mesh at the sizes asked for, then batching on and off side by side.
async fn mesh_section(sizes: &[usize]) -> anyhow::Result<String> {
    use sluice_bench::mesh::{markdown_row, run_mesh_bench, MeshArgs, TABLE_HEADER};
    let unbatched = |mut a: MeshArgs| {
        a.max_batch = 1;
        a.max_in_flight = 256;
        a
    };
    let loaded = || MeshArgs::new(50, 1_000, 100.0);
    let burst = || MeshArgs { degree: 2, ..MeshArgs::new(3, 30_000, 1e9) };
    let mut runs: Vec<MeshArgs> = sizes.iter().map(|n| MeshArgs::new(*n, 200, 20.0)).collect();
    runs.extend([loaded(), unbatched(loaded()), burst(), unbatched(burst())]);
    let mut md = String::from(
        "## g. Peer mesh

All nodes in this process, QUIC on loopback, each behind the memory pool (a stand-in that \
         takes each transaction once and forwards it, as the mempool's pending feed does), so this measures the \
         mesh on two shared cores. Transactions are injected at random nodes. \"per stream\" is `max_batch` (1: one \
         transaction per stream always, the first design) and \"in flight\" is `max_in_flight`, streams per peer. \
         The last four rows are two pairs, batching on and off side by side: 50 nodes under load, and 3 nodes with \
         30,000 transactions at once (3 × 10k). Details in [mesh.md](mesh.md).\n\n",
    );
    md.push_str(TABLE_HEADER);
    md.push('\n');
    let mut summaries = Vec::new();
    for run in &runs {
        eprintln!("scenario g: {}", run.command());
        let summary = run_mesh_bench(run).await?;
        md.push_str(&markdown_row(&run.label(), &summary));
        md.push('\n');
        summaries.push(summary);
    }
    md.push_str("\nCommands, one per row:\n\n");
    for run in &runs {
        md.push_str(&format!("* `{}`\n", run.command()));
    }
    let pair = |on: &sluice_bench::mesh::MeshSummary, off: &sluice_bench::mesh::MeshSummary| {
        format!(
            "time to everyone p50 {:.1}× shorter, ack p99 {:.1}× shorter, {:.1}× fewer streams",
            off.everyone_ms.0 / on.everyone_ms.0.max(1e-9),
            off.ack_ms.1 / on.ack_ms.1.max(1e-9),
            off.streams as f64 / on.streams.max(1) as f64
        )
    };
    let k = sizes.len();
    md.push_str(&format!(
        "\nBatching on vs off: 50 nodes, {}; 3 × 10k, {}.\n\n",
        pair(&summaries[k], &summaries[k + 1]),
        pair(&summaries[k + 2], &summaries[k + 3])
    ));
    Ok(md)
}

async fn write(
    args: &ReportArgs,
    sections: &[Section],
    ramp: Row,
    mix_text: &str,
    quic: Option<(String, sluice_bench::quic::RttArgs)>,
    mesh: Option<String>,
    ws: Option<String>,
) -> anyhow::Result<()> {
    let plots = args.out.join("bench");
    std::fs::create_dir_all(&plots)?;
    let all: Vec<(String, &Row)> = sections.iter().flat_map(|s| s.rows.iter().map(|r| (r.case.clone(), r))).collect();
    latency_svg(&all, &plots.join("latency.svg"))?;
    series_svg(
        &ramp.direct,
        &ramp.sluice,
        "ramp: successful requests per second, direct (red) vs sluice (blue)",
        &plots.join("ramp.svg"),
    )?;

    let mut md = String::from("# Benchmarks\n\n");
    md.push_str(
        "Generated by `sluice bench report` (re-run it to refresh: `cargo run --release -p sluice -- bench report`). \
         Every figure below comes from one run of it on the machine described here. The load generator, sluice \
         and anvil share this machine, so read the ratios, which are measured side by side (alternating rounds), \
         not the absolute numbers. The rate models measure latency from each request's scheduled send time, \
         so stalls are not hidden. \"generator saturated\" flags rows where the generator itself was the limit.\n\n\
         The request path's own cost against the machine's limits, a bare forwarder and a bare server answering \
         the same bytes (`sluice-baseline`), is measured by `bench/core.sh` with wrk: see \
         [benchmarks-wrk.md](benchmarks-wrk.md#the-request-path-against-bare-baselines).\n\n",
    );
    md.push_str(&machine(&args.anvil_version));
    for s in &sections[..2] {
        md.push_str(&section_markdown(s));
    }
    md.push_str("### d. Pass-through overhead per percentile (sluice − direct)\n\nFrom scenario a′.\n\n");
    md.push_str(&overhead_markdown(&sections[1].rows));
    let ramp_section = Section {
        title: "b. Incremental ramp".into(),
        note: "The rate rises linearly from 0 over the whole run, with a 2 s timeout. It runs once per target, one after the other (a ramp has one shape), with `eth_blockNumber`, which sluice answers from its head tracker.".into(),
        command: format!("sluice bench rpc URL --ramp {} -d {}s --timeout 2s", args.ramp_to, args.ramp_duration.as_secs_f64()),
        rows: vec![ramp],
    };
    md.push_str(&section_markdown(&ramp_section));
    md.push_str("![ramp](bench/ramp.svg)\n\n");
    md.push_str(&section_markdown(&sections[2]));
    md.push_str(&format!("```toml\n{mix_text}```\n\n"));
    md.push_str(
        "## e. Pool reads under ingest\n\nMeasured by `bench/mempool.sh` (it needs wrk-style read mixes over a \
         filled pool); figures and commands in [mempool.md](mempool.md).\n\n",
    );
    if let Some((table, sweep)) = quic {
        md.push_str(&format!(
            "## f. QUIC ingress: one client through an emulated RTT\n\n\
             One client offers {:.0} tx/s, one transaction per stream, to an in-process ingress (capacity {:.0} tx/s) \
             in front of the counting intake, a stand-in pool that takes everything, so this measures the \
             transport and the credit. The RTT is added by the client's delaying socket (docs/ingress.md). \
             \"Fixed credit\" sizes credit for a 50 ms RTT whatever the real one, as before Agave's change. \
             Agave's figures are theirs (one client, public internet), for comparison only.\n\n\
             Command: `sluice bench quic rtt --rate {:.0} --capacity {:.0} -d {}s --warmup {}s`\n\n{table}\n",
            sweep.rate,
            sweep.capacity,
            sweep.rate,
            sweep.capacity,
            sweep.duration.as_secs_f64(),
            sweep.warmup.as_secs_f64()
        ));
    }
    if let Some(mesh) = mesh {
        md.push_str(&mesh);
    }
    if let Some(ws) = ws {
        md.push_str(&ws);
    }
    md.push_str("## Latency overview\n\n![latency](bench/latency.svg)\n\n");
    md.push_str(
        "Other measurements, from scripts with wrk (heavy cached answers, coalescing): see \
         [benchmarks-wrk.md](benchmarks-wrk.md).\n",
    );
    std::fs::write(args.out.join("benchmarks.md"), md)?;
    eprintln!("wrote {}", args.out.join("benchmarks.md").display());
    Ok(())
}

fn machine(anvil: &str) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0)))
        .map_or("unknown".into(), |kb| format!("{:.0} GiB", kb as f64 / 1024.0 / 1024.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!(
        "| machine | |\n|---|---|\n| CPU | {cpu} |\n| cores | {cores} |\n| memory | {memory} |\n| kernel | {} |\n| sluice | {} |\n| anvil | {anvil} |\n\n",
        kernel.trim(),
        env!("CARGO_PKG_VERSION")
    )
}
