//! The `sluice` command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use sluice::config::{self, Overrides, UpstreamConfig};
use sluice::{dev, serve};
use tracing_subscriber::EnvFilter;

/// sluice: a JSON-RPC edge node for Ethereum-style chains.
#[derive(Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    /// Log filter (tracing's EnvFilter syntax); RUST_LOG also works.
    #[arg(long, global = true, env = "SLUICE_LOG", default_value = "info")]
    log: String,
    /// Log lines as `text` (for people) or `json` (one object per line, with the spans'
    /// fields such as `request_id`, for log collectors).
    #[arg(long, global = true, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// Where the configuration comes from, besides defaults and `SLUICE_*` variables.
#[derive(clap::Args)]
struct Layers {
    /// TOML configuration file.
    #[arg(long, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8545.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Upstream node URL (http:// or ws://); repeatable.
    #[arg(long = "upstream")]
    upstreams: Vec<String>,
}

impl Layers {
    /// The configuration these layers give, validated.
    fn load(self) -> anyhow::Result<config::Config> {
        self.load_again()
    }

    /// The same, read again (at start, and on each reload).
    fn load_again(&self) -> anyhow::Result<config::Config> {
        let overrides = Overrides { listen: self.listen, upstreams: self.upstreams.clone() };
        config::load(self.config.as_deref(), &overrides)
    }
}

/// How log lines are written.
#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve JSON-RPC over HTTP and WebSocket in front of upstream nodes.
    Serve(Layers),
    /// Start a local anvil devnet and serve in front of it (stops anvil on exit).
    Dev {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8545")]
        listen: SocketAddr,
        /// Path to anvil (default: the project's .tools folder, then PATH).
        #[arg(long)]
        anvil: Option<PathBuf>,
        /// Port for anvil (default: a free one).
        #[arg(long)]
        anvil_port: Option<u16>,
        /// Mine a block every N seconds (default: when a transaction arrives).
        #[arg(long)]
        block_time: Option<u64>,
        /// Networks to start: N anvils on chain ids 31337, 31338, …, served at /devnet1 … (the
        /// first also at /).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
        networks: u16,
        /// UDP address for the QUIC transaction ingress (of the first network).
        #[arg(long, default_value = "127.0.0.1:8547")]
        quic: SocketAddr,
    },
    /// Load tools: `sluice bench rpc URL` drives load; `sluice bench report` writes docs/benchmarks.md.
    Bench {
        #[command(subcommand)]
        action: BenchAction,
    },
    /// Make a client or server key for the QUIC ingress and print its identity.
    Keygen(sluice::quic::KeygenArgs),
    /// Send raw transactions (hex lines from a file or stdin) over the QUIC ingress.
    Send(sluice::quic::SendArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
}

#[derive(Subcommand)]
enum BenchAction {
    /// Load a JSON-RPC endpoint (fixed concurrency, constant rate or ramp) and report.
    Rpc(sluice_bench::cli::RpcArgs),
    /// Send signed transactions at a constant rate (eth_sendRawTransaction) and report.
    Ingest(sluice_bench::ingest::IngestArgs),
    /// The QUIC ingress: `rtt` (one client through emulated RTTs) or `load` (many clients).
    #[command(subcommand)]
    Quic(sluice_bench::quic::QuicCommand),
    /// The peer mesh: N nodes in this process, transactions injected at random nodes.
    Mesh(sluice_bench::mesh::MeshArgs),
    /// Subscriptions: many WebSocket clients on newHeads and a logs filter while blocks come.
    Ws(sluice_bench::ws::WsArgs),
    /// Run the benchmark scenarios against a fresh anvil, directly and through sluice, and
    /// write benchmarks.md with plots.
    Report(sluice::report::ReportArgs),
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Check a configuration file; names the bad key and why.
    Validate {
        /// The TOML file.
        file: PathBuf,
    },
    /// Print the effective configuration (defaults, file, SLUICE_* environment, flags) as
    /// TOML, with API keys, secrets, tokens and URL credentials redacted.
    Dump(Layers),
}

/// mimalloc instead of the C library's malloc: a request allocates a few dozen times, often
/// freed on the other worker thread, where glibc's arenas pay most (docs/benchmarks-wrk.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `serve` reads its configuration before the logger starts: its [telemetry] section sets
    // up the trace exporter beside the log lines.
    let loaded = match &cli.command {
        Command::Serve(layers) => match layers.load_again() {
            Ok(config) => Some(config),
            Err(e) => {
                eprintln!("error: {e:#}");
                return std::process::ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    let traces = match init_logs(&cli.log, cli.log_format, loaded.as_ref().map(|c| &c.telemetry)) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = run(cli.command, loaded).await;
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Log lines to stderr, filtered by `filter` (or `RUST_LOG`); and with `[telemetry]
/// otlp_endpoint`, sluice's spans exported as traces. Each has its own filter, so that traces
/// off leave the request path's debug spans disabled.
fn init_logs(
    filter: &str,
    format: LogFormat,
    telemetry: Option<&sluice_telemetry::TelemetryConfig>,
) -> Result<Option<sluice_telemetry::Traces>, String> {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::Layer;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        // The whole span list: the request's `rpc` span (its request id) stays on every line
        // logged inside it, also below the layers' own spans.
        LogFormat::Json => lines.json().with_current_span(false).with_span_list(true).boxed(),
    };
    let subscriber = tracing_subscriber::registry().with(lines.with_filter(filter));
    match telemetry.filter(|t| t.otlp_endpoint.is_some()) {
        Some(settings) => {
            let (layer, traces) = sluice_telemetry::layer(settings, tokio::runtime::Handle::current())?;
            subscriber.with(layer).init();
            Ok(Some(traces))
        }
        None => {
            subscriber.init();
            Ok(None)
        }
    }
}

async fn run(command: Command, loaded: Option<config::Config>) -> anyhow::Result<()> {
    match command {
        Command::Serve(layers) => {
            let config = match loaded {
                Some(config) => config,
                None => layers.load_again()?,
            };
            serve::run(config, serve::shutdown_signal(), Some(Box::new(move || layers.load_again()))).await
        }
        Command::Dev { listen, anvil, anvil_port, block_time, networks, quic } => {
            let anvil = dev::find_anvil(anvil.as_deref())?;
            let mut children = Vec::new();
            let mut urls = Vec::new();
            for i in 0..u64::from(networks) {
                let port = match (anvil_port, i) {
                    (Some(port), 0) => port,
                    _ => dev::free_port()?,
                };
                let chain_id = dev::FIRST_CHAIN_ID + i;
                children.push(dev::start_anvil(&anvil, port, block_time, Some(chain_id), &[]).await?);
                let url = format!("http://127.0.0.1:{port}");
                println!("anvil devnet on {url} (chain id {chain_id}; {})", anvil.display());
                urls.push(url);
            }
            println!("funded dev account 0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266, key 0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80");
            let mut config = config::load_layers(None, &Overrides { listen: Some(listen), upstreams: vec![] })?;
            let settings = config.ingress.take().unwrap_or_default();
            let quic = config.mempool.enabled.then_some(sluice_ingress::IngressConfig { listen: quic, ..settings });
            if networks == 1 {
                config.upstreams = vec![UpstreamConfig::from_url(urls[0].clone())];
                config.ingress = quic;
            } else {
                config.upstreams.clear();
                config.networks = dev::networks(&urls);
                config.networks[0].ingress = quic;
            }
            config.validate()?;
            let result = serve::run(config, serve::shutdown_signal(), None).await;
            for mut child in children {
                let _ = child.kill().await;
            }
            println!("anvil stopped");
            result
        }
        Command::Bench { action: BenchAction::Rpc(args) } => sluice_bench::cli::run_rpc(args).await,
        Command::Bench { action: BenchAction::Ingest(args) } => sluice_bench::ingest::run_ingest(args).await,
        Command::Bench { action: BenchAction::Quic(command) } => sluice_bench::quic::run_quic(command).await,
        Command::Bench { action: BenchAction::Mesh(args) } => sluice_bench::mesh::run_mesh(args).await,
        Command::Bench { action: BenchAction::Ws(args) } => sluice_bench::ws::run_ws(args).await,
        Command::Bench { action: BenchAction::Report(args) } => sluice::report::run_report(args).await,
        Command::Keygen(args) => sluice::quic::run_keygen(args),
        Command::Send(args) => sluice::quic::run_send(args).await,
        Command::Config { action: ConfigAction::Dump(layers) } => {
            print!("{}", sluice::dump::render(&layers.load()?)?);
            Ok(())
        }
        Command::Config { action: ConfigAction::Validate { file } } => {
            let config = config::validate_file(&file)?;
            let networks = config.networks()?;
            let upstreams: usize = networks.iter().map(|n| n.upstreams.len()).sum();
            match &networks[..] {
                [_] if config.networks.is_empty() => {
                    println!("{}: ok ({upstreams} upstream(s), listen {})", file.display(), config.listen)
                }
                _ => {
                    let ids: Vec<&str> = networks.iter().map(|n| n.id.as_str()).collect();
                    println!(
                        "{}: ok ({} networks: {}; {upstreams} upstream(s), listen {})",
                        file.display(),
                        ids.len(),
                        ids.join(", "),
                        config.listen
                    )
                }
            }
            let ignored = config::ignored_env();
            if !ignored.is_empty() {
                println!("ignored environment variables (they name no configuration key): {}", ignored.join(", "));
            }
            print!("{}", sluice::sizing::render(&sluice::sizing::estimate(&networks, &config.limits)));
            Ok(())
        }
    }
}
