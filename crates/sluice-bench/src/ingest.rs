//! `sluice bench ingest`: signed transactions sent with `eth_sendRawTransaction` at a constant
//! rate (latency from each transaction's scheduled time, so a stalled target shows), with
//! errors by the pool's wording. Optionally funds the senders (anvil) and writes a read mix
//! over the transactions it sent, for the read-under-ingest scenario.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::value::RawValue;
use sluice_jsonrpc::{Id, Outcome, Request};
use sluice_upstream::{HttpUpstream, HttpUpstreamConfig};

use crate::run::{self, Plan};
use crate::schedule::Model;
use crate::txgen::{Fees, SignedTx, Wallet};

/// Send signed transfers at a constant rate and report.
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Target URL (http://…).
    pub url: String,
    /// Transactions per second.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// How long to send for.
    #[arg(short = 'd', long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Distinct senders; transactions go round-robin, each sender's nonces in order.
    #[arg(long, default_value_t = 1000)]
    pub senders: u64,
    /// Index of the first deterministic sender (use a fresh range per run: nonces start at 0).
    #[arg(long, default_value_t = 0)]
    pub first_sender: u64,
    /// Fund the senders first with `anvil_setBalance` through the URL (anvil upstreams only).
    #[arg(long)]
    pub fund: bool,
    /// Write a read mix (TOML) over the senders and hashes sent: pending nonces and lookups by hash.
    #[arg(long)]
    pub mix_out: Option<PathBuf>,
    /// Per-request timeout.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Most requests in flight.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sluice bench ingest`.
pub async fn run_ingest(args: IngestArgs) -> anyhow::Result<()> {
    let summary = ingest(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.human());
    }
    Ok(())
}

/// Funds (with `fund`), signs and sends the transactions of `args`; the run's summary.
pub async fn ingest(args: &IngestArgs) -> anyhow::Result<crate::stats::Summary> {
    anyhow::ensure!(args.url.starts_with("http://"), "{}: use an http:// URL", args.url);
    anyhow::ensure!(args.rate > 0.0 && args.senders > 0, "--rate and --senders must be more than zero");
    let node = HttpUpstream::new(HttpUpstreamConfig {
        name: "ingest".into(),
        network: "bench".into(),
        url: args.url.clone(),
        timeout: args.timeout,
        max_response_bytes: 64 << 20,
    })
    .map_err(anyhow::Error::msg)?;
    let chain_id = chain_id(&node).await?;
    let total = (args.rate * args.duration.as_secs_f64()).ceil() as u64;
    let wallets: Vec<Wallet> =
        (args.first_sender..args.first_sender + args.senders).map(|n| Wallet::numbered(n, chain_id)).collect();
    if args.fund {
        fund(&node, &wallets).await?;
    }
    eprintln!("signing {total} transactions from {} senders…", wallets.len());
    let txs = sign(&wallets, total);
    if let Some(path) = &args.mix_out {
        std::fs::write(path, read_mix(&wallets, &txs)).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    let sequence: Vec<Request> = txs
        .iter()
        .map(|t| {
            let params = RawValue::from_string(format!("[\"{}\"]", t.hex())).ok();
            Request::new(Some(Id::number(1)), "eth_sendRawTransaction", params)
        })
        .collect();
    let plan = Plan {
        url: args.url.clone(),
        model: Model::Rate(args.rate),
        requests: Some(total),
        duration: args.duration,
        mix: Arc::new(crate::mix::Mix::single("eth_chainId", "[]").map_err(anyhow::Error::msg)?),
        batch: 1,
        page: false,
        timeout: args.timeout,
        max_in_flight: args.max_in_flight,
        progress: false,
        seed: 1,
        sequence: Some(Arc::new(sequence)),
    };
    eprintln!("sending {total} transactions at {}/s", args.rate);
    run::run(&plan).await
}

async fn chain_id(node: &HttpUpstream) -> anyhow::Result<u64> {
    let answer = node
        .call(&Request::new(Some(Id::number(1)), "eth_chainId", None))
        .await
        .map_err(|e| anyhow::anyhow!("eth_chainId: {e}"))?;
    let Outcome::Result(raw) = answer.outcome else { anyhow::bail!("eth_chainId: {:?}", answer.outcome) };
    let text: String = serde_json::from_str(raw.get())?;
    Ok(u64::from_str_radix(text.trim_start_matches("0x"), 16)?)
}

async fn fund(node: &HttpUpstream, wallets: &[Wallet]) -> anyhow::Result<()> {
    for chunk in wallets.chunks(500) {
        let requests: Vec<Request> = chunk
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let params = RawValue::from_string(format!(r#"["{}","0xffffffffffffffffffffffff"]"#, w.address())).ok();
                Request::new(Some(Id::number(i as u64)), "anvil_setBalance", params)
            })
            .collect();
        let refs: Vec<&Request> = requests.iter().collect();
        for answer in node.call_batch(&refs).await {
            match answer {
                Ok(a) if !a.outcome.is_error() => {}
                Ok(a) => anyhow::bail!("anvil_setBalance: {:?}", a.outcome),
                Err(e) => anyhow::bail!("anvil_setBalance: {e}"),
            }
        }
    }
    Ok(())
}

/// Funds the wallets with `anvil_setBalance` through `url`.
pub(crate) async fn fund_at(url: &str, wallets: &[Wallet]) -> anyhow::Result<()> {
    let node = HttpUpstream::new(HttpUpstreamConfig {
        name: "fund".into(),
        network: "bench".into(),
        url: url.to_string(),
        timeout: Duration::from_secs(30),
        max_response_bytes: 64 << 20,
    })
    .map_err(anyhow::Error::msg)?;
    fund(&node, wallets).await
}

/// Signs `total` transfers round-robin over the wallets, on every core.
pub(crate) fn sign(wallets: &[Wallet], total: u64) -> Vec<SignedTx> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let n = wallets.len() as u64;
    let mut parts: Vec<Vec<(u64, SignedTx)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t..total)
                        .step_by(threads as usize)
                        .map(|i| {
                            let wallet = &wallets[(i % n) as usize];
                            (i, wallet.transfer(i / n, wallet.address(), 1, Fees::default()))
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut all: Vec<(u64, SignedTx)> = parts.drain(..).flatten().collect();
    all.sort_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, t)| t).collect()
}

/// A mix reading what was sent: half pending nonces, half lookups by hash.
fn read_mix(wallets: &[Wallet], txs: &[SignedTx]) -> String {
    let quote = |items: Vec<String>| items.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    let senders = quote(wallets.iter().take(1000).map(|w| format!("{}", w.address())).collect());
    let hashes = quote(txs.iter().take(1000).map(|t| format!("{}", t.hash)).collect());
    format!(
        "# Written by `sluice bench ingest --mix-out`: reads of the pool it filled.\n\
         [vars]\nsender = [{senders}]\nhash = [{hashes}]\n\n\
         [[call]]\nmethod = \"eth_getTransactionCount\"\nparams = [\"{{sender}}\", \"pending\"]\n\n\
         [[call]]\nmethod = \"eth_getTransactionByHash\"\nparams = [\"{{hash}}\"]\n"
    )
}
