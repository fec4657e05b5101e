//! Scenario g′: the peer mesh through real mempools. `nodes` sluice processes (this binary) in
//! a line, each dialling the one before it, each with its own mempool (decode, sender recovery,
//! state from the node, journal) in front of one non-mining anvil. Signed transfers go into the
//! first; the figure is how long until every pool holds every acknowledged transaction. The
//! same measurement as `bench/mesh-mempools.sh`, so that the report carries it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::dev;

/// How long the pools get, after the last send, to hold everything.
const SETTLE: Duration = Duration::from_secs(60);

/// One `sluice serve` of the line.
struct Node {
    child: Child,
    url: String,
    /// Its mesh address, which the next node dials.
    mesh: String,
}

async fn spawn_node(anvil: &str, work: &Path, i: usize, previous: Option<&str>) -> anyhow::Result<Node> {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
    let peers = previous.map_or("[]".to_owned(), |p| format!("[\"{p}\"]"));
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", anvil])
        .env("SLUICE_LOG", "warn")
        .env("SLUICE_MEMPOOL__JOURNAL", work.join(format!("{i}.journal")))
        .env("SLUICE_MEMPOOL__RELAY", "false")
        .env("SLUICE_MESH__LISTEN", format!("[\"/ip4/127.0.0.1/udp/{udp}/quic-v1\"]"))
        .env("SLUICE_MESH__PEERS", peers)
        .env("SLUICE_MESH__KEY", work.join(format!("{i}.key")))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let lines = super::listening_lines(&mut child, &["sluice mesh peer ", "sluice listening on http://"]).await?;
    // "PEER_ID on ADDRESS …"
    let mesh = lines[0]
        .split(" on ")
        .nth(1)
        .and_then(|a| a.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("node {i} printed no mesh address: {:?}", lines[0]))?
        .to_owned();
    let url = format!("http://{}", lines[1].split_whitespace().next().unwrap_or_default());
    Ok(Node { child, url, mesh })
}

/// `/status` as JSON.
async fn status(url: &str) -> Option<serde_json::Value> {
    let text = super::get_text(url, "/status").await?;
    serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
}

/// True once every mesh peer `url` dials is connected.
async fn linked(url: &str) -> bool {
    let Some(status) = status(url).await else { return false };
    status["mesh"]["peers"]
        .as_array()
        .is_some_and(|peers| !peers.is_empty() && peers.iter().all(|p| p["connected"] == true))
}

/// The mesh messages that failed at `url`, sent and received.
async fn failed(url: &str) -> u64 {
    let Some(status) = status(url).await else { return 0 };
    let sent: u64 = status["mesh"]["peers"]
        .as_array()
        .map_or(0, |peers| peers.iter().filter_map(|p| p["counts"]["failed"].as_u64()).sum());
    sent + status["mesh"]["inbound"]["failed"].as_u64().unwrap_or(0)
}

/// Pending transactions in the pool at `url` (`txpool_status`).
async fn pending(url: &str) -> anyhow::Result<u64> {
    let body =
        super::sections::post_raw(url, r#"{"jsonrpc":"2.0","id":1,"method":"txpool_status","params":[]}"#).await?;
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    let hex = answer["result"]["pending"].as_str().ok_or_else(|| anyhow::anyhow!("txpool_status: {answer}"))?;
    Ok(u64::from_str_radix(hex.trim_start_matches("0x"), 16)?)
}

/// Resident memory of a process, MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What the scenario measured.
pub(super) struct MempoolMesh {
    /// Its Markdown section.
    pub markdown: String,
    /// Processes in the line.
    pub nodes: usize,
    /// Seconds from the first send until every pool held every acknowledged transaction.
    pub everyone_s: f64,
}

/// Runs the scenario.
pub(super) async fn section(anvil_path: &Path, nodes: usize, txs: u64, rate: f64) -> anyhow::Result<MempoolMesh> {
    anyhow::ensure!(nodes >= 2, "the mesh through mempools needs at least 2 nodes");
    let work = std::env::temp_dir().join(format!("sluice-report-{}-mempools", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let port = dev::free_port()?;
    let _anvil = dev::start_anvil(anvil_path, port, None, None, &["--no-mining"]).await?;
    let anvil = format!("http://127.0.0.1:{port}");
    let mut line: Vec<Node> = Vec::new();
    for i in 0..nodes {
        let node = spawn_node(&anvil, &work, i, line.last().map(|n| n.mesh.as_str())).await?;
        line.push(node);
    }
    // Every link up before the clock starts.
    for node in &line[1..] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !linked(&node.url).await {
            anyhow::ensure!(Instant::now() < deadline, "{} never connected to its peer", node.url);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let ingest = sluice_bench::ingest::IngestArgs {
        url: line[0].url.clone(),
        rate,
        duration: Duration::from_secs_f64(txs as f64 / rate),
        senders: 20,
        first_sender: 0,
        fund: true,
        mix_out: None,
        timeout: Duration::from_secs(5),
        max_in_flight: 10_000,
        json: false,
    };
    let started = Instant::now();
    let summary = sluice_bench::ingest::ingest(&ingest).await?;
    // The summary's seconds are the sending alone; funding and signing came before it.
    let first_send = started + started.elapsed().saturating_sub(Duration::from_secs_f64(summary.seconds));
    let deadline = Instant::now() + SETTLE;
    for node in &line {
        while pending(&node.url).await? < summary.ok && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let everyone = first_send.elapsed();
    let (mut held, mut rss, mut failures) = (Vec::new(), Vec::new(), 0);
    for node in &line {
        held.push(pending(&node.url).await?.to_string());
        rss.push(format!("{:.0}", node.child.id().map_or(0.0, rss_mib)));
        failures += failed(&node.url).await;
    }
    drop(line);
    let _ = std::fs::remove_dir_all(&work);
    let markdown = format!(
        "## g′. Peer mesh through real mempools\n\n\
         {nodes} sluice processes in a line (each dials the one before it), each with its own mempool (decode, \
         sender recovery, state from the node, journal; relay off) in front of one non-mining anvil. \
         {txs} signed transfers from 20 senders go into the first node at {rate:.0}/s (`sluice bench ingest`); \
         the figure is the time from the first send until every pool holds every acknowledged transaction. \
         Everything runs on this machine's two cores. The same measurement as a script: \
         `NODES={nodes} TXS={txs} RATE={rate:.0} bash bench/mesh-mempools.sh`.\n\n\
         Command: `sluice bench report --mempool-mesh-nodes {nodes} --mempool-mesh-txs {txs} --mempool-mesh-rate \
         {rate:.0}`\n\n\
         | nodes (line) | txs sent / acknowledged | held by each pool | sending s | until every pool holds all, s \
         from the first send | failed mesh messages | RSS per process MiB |\n\
         |---:|---:|---|---:|---:|---:|---|\n\
         | {nodes} | {} / {} | {} | {:.2} | {:.2} | {failures} | {} |\n\n",
        summary.requests,
        summary.ok,
        held.join(" / "),
        summary.seconds,
        everyone.as_secs_f64(),
        rss.join(" / "),
    );
    Ok(MempoolMesh { markdown, nodes, everyone_s: everyone.as_secs_f64() })
}
