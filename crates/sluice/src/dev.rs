//! `sluice dev`: a local anvil devnet with sluice in front of it, for a first run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// Where the project's install script puts anvil, relative to the project root.
pub const LOCAL_ANVIL: &str = ".tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil";

/// Finds anvil: the given path, `$SLUICE_ANVIL`, the project-local tools folder (looked for
/// from the current directory and from the executable's folder upwards), then `PATH`.
pub fn find_anvil(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        anyhow::ensure!(path.is_file(), "anvil not found at {}", path.display());
        return Ok(path.to_owned());
    }
    if let Some(path) = std::env::var_os("SLUICE_ANVIL") {
        return Ok(PathBuf::from(path));
    }
    let starts = [std::env::current_dir().ok(), std::env::current_exe().ok()];
    for start in starts.into_iter().flatten() {
        for dir in start.ancestors() {
            let candidate = dir.join(LOCAL_ANVIL);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("anvil"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| anyhow::anyhow!("anvil not found: run scripts/install-tools.sh, or pass --anvil PATH"))
}

/// Picks a free loopback port.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts anvil on `port` (on chain `chain_id`, anvil's 31337 by default; with `extra`
/// arguments such as `--no-mining`) and waits until it answers JSON-RPC. The child is killed
/// on drop.
pub async fn start_anvil(
    anvil: &Path,
    port: u16,
    block_time: Option<u64>,
    chain_id: Option<u64>,
    extra: &[&str],
) -> anyhow::Result<Child> {
    let mut command = Command::new(anvil);
    command.args(["--host", "127.0.0.1", "--port", &port.to_string()]).args(extra);
    if let Some(chain_id) = chain_id {
        command.args(["--chain-id", &chain_id.to_string()]);
    }
    if let Some(seconds) = block_time {
        command.args(["--block-time", &seconds.to_string()]);
    }
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", anvil.display()))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("anvil exited before answering: {status}");
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(child);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("anvil did not start listening on port {port} within 30 s")
}

/// The first chain id `sluice dev` gives its anvils (anvil's own default); the next ones count up.
pub const FIRST_CHAIN_ID: u64 = 31337;

/// The `[[networks]]` of `sluice dev --networks N`: `devnet1` (the default, chain 31337),
/// `devnet2` (31338), … each in front of its anvil at `urls[i]`.
pub fn networks(urls: &[String]) -> Vec<crate::config::NetworkSection> {
    urls.iter()
        .enumerate()
        .map(|(i, url)| crate::config::NetworkSection {
            id: format!("devnet{}", i + 1),
            chain_id: FIRST_CHAIN_ID + i as u64,
            default: i == 0,
            upstreams: vec![crate::config::UpstreamConfig::from_url(url.clone())],
            cache: None,
            mempool: None,
            logs: None,
            pool: None,
            aggregate: None,
            subscriptions: None,
            verify: None,
            ingress: None,
        })
        .collect()
}
