//! `sluice keygen` and `sluice send --quic`: identities and sending over the QUIC ingress.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use sluice_ingress::{Client, ClientError, ClientOptions, Identity, KeyPair};
use tokio::sync::Semaphore;

/// `sluice keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the new key (PEM, mode 0600); never overwrites.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Print the identity of an existing key file instead.
    #[arg(long, conflicts_with = "out")]
    pub show: Option<PathBuf>,
}

/// Makes a key, or shows an existing key's identity (what `[ingress.weights]` lists).
pub fn run_keygen(args: KeygenArgs) -> anyhow::Result<()> {
    match (args.out, args.show) {
        (_, Some(path)) => println!("{}", KeyPair::load(&path)?.identity()),
        (Some(path), None) => {
            let key = KeyPair::generate();
            key.save(&path)?;
            println!("{}", key.identity());
            eprintln!("wrote {}; its identity (above) goes in [ingress.weights]", path.display());
        }
        (None, None) => anyhow::bail!("give --out FILE for a new key, or --show FILE"),
    }
    Ok(())
}

/// `sluice send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The ingress address, e.g. 127.0.0.1:8547.
    #[arg(long)]
    pub quic: SocketAddr,
    /// The client's key file (see `sluice keygen`); without it a throwaway key is used, which
    /// the ingress charges to its unknown class.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Accept only the server with this identity (64 hex digits).
    #[arg(long)]
    pub server_identity: Option<Identity>,
    /// Fire and forget: one unidirectional stream per transaction, no answer from the pool
    /// (the default waits for each transaction's hash or error on a bidirectional stream).
    #[arg(long)]
    pub no_wait: bool,
    /// Streams in flight at once (opening more also waits for the server's credit).
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// File of raw transactions, one 0x-hex per line; `-` or nothing reads stdin.
    pub file: Option<PathBuf>,
}

fn read_lines(file: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let reader: Box<dyn BufRead> = match file {
        Some(p) if p.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let mut lines = Vec::new();
    for line in reader.lines() {
        let line = line?;
        let line = line.trim();
        if !line.is_empty() && !line.starts_with('#') {
            lines.push(line.to_string());
        }
    }
    Ok(lines)
}

/// Sends each line's transaction; prints, in input order, the hash or the error of each (or,
/// with `--no-wait`, whether each stream was delivered whole). Fails when any was not accepted.
pub async fn run_send(args: SendArgs) -> anyhow::Result<()> {
    let lines = read_lines(args.file.as_deref())?;
    let key = match &args.key {
        Some(path) => KeyPair::load(path)?,
        None => KeyPair::generate(),
    };
    let options = ClientOptions { server_identity: args.server_identity, socket: None };
    let client = Arc::new(Client::connect(args.quic, &key, options).await?);
    let permits = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let mut tasks = Vec::with_capacity(lines.len());
    for (i, line) in lines.into_iter().enumerate() {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        let no_wait = args.no_wait;
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let raw = match hex::decode(line.trim_start_matches("0x")) {
                Ok(raw) => raw,
                Err(e) => return Err(format!("line {}: not hex: {e}", i + 1)),
            };
            let answer = if no_wait {
                client.send_acknowledged(&raw).await.map(|()| "delivered".to_string())
            } else {
                client.submit(&raw).await
            };
            answer.map_err(|e: ClientError| e.to_string())
        }));
    }
    let mut failed = 0;
    for task in tasks {
        match task.await? {
            Ok(answer) => println!("{answer}"),
            Err(e) => {
                failed += 1;
                println!("error: {e}");
            }
        }
    }
    if let Ok(client) = Arc::try_unwrap(client) {
        client.close().await;
    }
    anyhow::ensure!(failed == 0, "{failed} transaction(s) not accepted");
    Ok(())
}
