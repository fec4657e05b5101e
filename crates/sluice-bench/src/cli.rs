//! `sluice bench rpc`: arguments, checks and output.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::mix::Mix;
use crate::run::{self, Plan};
use crate::schedule::Model;

/// Load a JSON-RPC endpoint and report throughput, latency percentiles and errors by reason.
#[derive(Debug, Args)]
pub struct RpcArgs {
    /// Target URL: http://… (keep-alive) or ws://….
    pub url: String,
    /// Fixed concurrency: this many workers, each sending when answered (default model, 10).
    #[arg(short = 'c', long, conflicts_with_all = ["rate", "ramp"])]
    pub concurrency: Option<usize>,
    /// Constant arrival rate, requests/s; latency counts from the scheduled send time.
    #[arg(long, conflicts_with = "ramp")]
    pub rate: Option<f64>,
    /// Ramp: the rate rises linearly to this many requests/s over the duration.
    #[arg(long)]
    pub ramp: Option<f64>,
    /// Where the ramp starts, requests/s.
    #[arg(long, default_value_t = 0.0, requires = "ramp")]
    pub ramp_from: f64,
    /// Stop after this many requests.
    #[arg(short = 'n', long)]
    pub requests: Option<u64>,
    /// Stop after this long (default 10s; the rate models always run for it).
    #[arg(short = 'd', long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// One method to call (instead of --mix).
    #[arg(long, default_value = "eth_blockNumber", conflicts_with = "mix")]
    pub method: String,
    /// Its params, a JSON array.
    #[arg(long, default_value = "[]", conflicts_with = "mix")]
    pub params: String,
    /// A method mix file (TOML, see docs/bench.md).
    #[arg(long)]
    pub mix: Option<PathBuf>,
    /// Calls per request: more than one sends JSON-RPC batches.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// A page load: N calls from the mix sent at once, each its own HTTP request, as a dapp
    /// front-end does; rates and counts are then pages, a page's latency lasts until its last
    /// answer, and a page fails when any of its calls does.
    #[arg(long, conflicts_with = "batch")]
    pub page: Option<usize>,
    /// Per-request timeout.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Also load this URL, alternately, and print the ratios (first URL over this one).
    #[arg(long)]
    pub compare: Option<String>,
    /// Alternating rounds per target with --compare.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Most requests in flight in the rate models.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// Seed for the method mix draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the summary as JSON (no progress bar).
    #[arg(long)]
    pub json: bool,
}

impl RpcArgs {
    /// Checks everything that can be checked before load starts, and builds the plan.
    pub fn plan(&self) -> anyhow::Result<Plan> {
        let model = match (self.concurrency, self.rate, self.ramp) {
            (_, Some(rate), _) => Model::Rate(rate),
            (_, _, Some(to)) => Model::Ramp { from: self.ramp_from, to },
            (c, None, None) => Model::Concurrency(c.unwrap_or(10)),
        };
        model.validate().map_err(anyhow::Error::msg)?;
        anyhow::ensure!(self.batch >= 1, "--batch must be at least 1");
        anyhow::ensure!(self.page.is_none_or(|p| p >= 1), "--page must be at least 1");
        anyhow::ensure!(
            self.page.is_none() || self.url.starts_with("http://"),
            "--page: use an http:// URL (over WebSocket, --batch sends concurrent calls)"
        );
        anyhow::ensure!(!self.timeout.is_zero(), "--timeout must be more than zero");
        anyhow::ensure!(self.max_in_flight >= 1, "--max-in-flight must be at least 1");
        anyhow::ensure!(
            self.url.starts_with("http://") || self.url.starts_with("ws://"),
            "{}: use an http:// or ws:// URL",
            self.url
        );
        if let Some(other) = &self.compare {
            anyhow::ensure!(
                other.starts_with("http://") || other.starts_with("ws://"),
                "--compare {other}: use an http:// or ws:// URL"
            );
        }
        let mix = match &self.mix {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                Mix::parse(&text).map_err(anyhow::Error::msg)?
            }
            None => Mix::single(&self.method, &self.params).map_err(anyhow::Error::msg)?,
        };
        Ok(Plan {
            url: self.url.clone(),
            model,
            requests: self.requests,
            duration: self.duration.unwrap_or(if self.requests.is_some() {
                Duration::from_secs(3600)
            } else {
                Duration::from_secs(10)
            }),
            mix: Arc::new(mix),
            batch: self.page.unwrap_or(self.batch),
            page: self.page.is_some(),
            timeout: self.timeout,
            max_in_flight: self.max_in_flight,
            progress: !self.json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
            seed: self.seed,
            sequence: None,
        })
    }
}

/// Runs `sluice bench rpc`.
pub async fn run_rpc(args: RpcArgs) -> anyhow::Result<()> {
    let plan = args.plan()?;
    match &args.compare {
        None => {
            let summary = run::run(&plan).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{}", summary.human());
            }
        }
        Some(other) => {
            let (a, b) = run::compare(&plan, other, args.rounds).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "a": a, "b": b }))?);
            } else {
                print!("{}\n{}\n{}", a.human(), b.human(), run::ratio_table(&a, &b));
            }
        }
    }
    Ok(())
}
