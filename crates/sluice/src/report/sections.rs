//! The report's scenarios that are not a plain rpc pair: the machine's limits (bare
//! baselines), the peer mesh and the subscription fan-out.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sluice_bench::mix::Mix;
use sluice_bench::report::Section;
use sluice_bench::schedule::Model;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::{pair, DEV};

/// `sluice-baseline`: given, beside this binary (`cargo build --release -p sluice-bench --bin
/// sluice-baseline` puts it there), or on PATH. It is a benchmark tool, not part of `sluice`.
pub(super) fn find_baseline(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        anyhow::ensure!(path.is_file(), "sluice-baseline not found at {}", path.display());
        return Ok(path.to_owned());
    }
    let beside = std::env::current_exe()?.with_file_name("sluice-baseline");
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("sluice-baseline"));
    std::iter::once(beside).chain(on_path).find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "sluice-baseline not found: cargo build --release -p sluice-bench --bin sluice-baseline, or pass --baseline PATH"
        )
    })
}

/// Starts `sluice-baseline ARGS…` on a free loopback port; returns the child and its URL.
async fn spawn_baseline(path: &Path, args: &[&str]) -> anyhow::Result<(Child, String)> {
    let mut child = Command::new(path)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let url = super::listening_line(&mut child, "baseline listening on ").await?;
    Ok((child, url))
}

/// POSTs `body` over a plain HTTP/1.0 socket and returns the answer's body bytes, exactly.
pub(super) async fn post_raw(url: &str, body: &str) -> anyhow::Result<Vec<u8>> {
    let addr = url.strip_prefix("http://").ok_or_else(|| anyhow::anyhow!("{url}: not http://"))?;
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!("POST / HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| anyhow::anyhow!("no HTTP head"))?;
    Ok(answer.split_off(split + 4))
}

/// Scenario a″: sluice against the machine's own limits, measured in this run. Pass-through
/// (cache off) beside a bare forwarder to the same anvil; cached answers beside a bare server
/// sending the very bytes sluice sends (with the caller's id put back, as sluice does).
pub(super) async fn baseline_section(
    baseline: &Path,
    cached: &str,
    plain: &str,
    anvil: &str,
    c: usize,
    cell: Duration,
) -> anyhow::Result<Section> {
    let mut children = Vec::new();
    let (child, forwarder) = spawn_baseline(baseline, &["forward", "--to", anvil]).await?;
    children.push(child);
    let balance = format!(r#"["{DEV}","latest"]"#);
    let one = |method: &str, params: &str| Mix::single(method, params).expect("valid built-in params");
    let mut rows = Vec::new();
    for c in [c, 1] {
        let case = format!("pass-through eth_getBalance vs bare forwarder, c={c}");
        rows.push(pair(case, plain, &forwarder, Model::Concurrency(c), cell, one("eth_getBalance", &balance)).await?);
    }
    for (name, method, params) in [
        ("local eth_blockNumber", "eth_blockNumber", "[]"),
        ("cached eth_getBlockByNumber(0x10)", "eth_getBlockByNumber", r#"["0x10",false]"#),
    ] {
        let request = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#);
        post_raw(cached, &request).await?; // the first call fills the cache
        let bytes = post_raw(cached, &request).await?;
        let file = std::env::temp_dir().join(format!("sluice-report-{}-{method}.json", std::process::id()));
        std::fs::write(&file, &bytes)?;
        let path = file.to_str().ok_or_else(|| anyhow::anyhow!("temp path is not UTF-8"))?;
        let spawned = spawn_baseline(baseline, &["fixed", "--body-file", path, "--echo-id"]).await;
        let _ = std::fs::remove_file(&file); // read at start
        let (child, fixed) = spawned?;
        children.push(child);
        let case = format!("{name} vs bare server, same {} bytes, c={c}", bytes.len());
        rows.push(pair(case, cached, &fixed, Model::Concurrency(c), cell, one(method, params)).await?);
    }
    Ok(Section {
        title: "a″. Against the machine's limits: bare baselines in the same run".into(),
        note: "`sluice-baseline forward` is a bare hyper forwarder to the same anvil (body bytes in and out, no JSON \
               parsing, through the same keep-alive connections as sluice); `sluice-baseline fixed --echo-id` answers every request with the bytes sluice answers from \
               its cache, with the caller's id put back. Either is what any gateway costs at least on this machine, \
               so the ratio is sluice's own cost. The generator here is `sluice bench rpc`, heavier than wrk: \
               compare its CPU column with the cores; `bench/core.sh` measures the same with wrk \
               ([benchmarks-wrk.md](benchmarks-wrk.md#the-request-path-against-bare-baselines))."
            .into(),
        command: format!(
            "sluice bench rpc SLUICE_URL -c C -d {}s --method eth_getBalance --params '[\"{DEV}\",\"latest\"]' --compare BASELINE_URL",
            cell.as_secs_f64() * 2.0
        ),
        reference: "baseline".into(),
        rows,
    })
}

/// Scenario h: `clients` WebSocket clients on newHeads and a logs filter through the cached
/// sluice, `blocks` blocks with one log each, one per second.
pub(super) async fn ws_section(
    sluice: &str,
    anvil: &str,
    pid: u32,
    clients: usize,
    blocks: u64,
) -> anyhow::Result<String> {
    let ws = |url: &str| url.replacen("http://", "ws://", 1);
    let args = sluice_bench::ws::WsArgs {
        url: ws(sluice),
        reference: ws(anvil),
        clients,
        blocks,
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
        "## h. Subscriptions: fan-out to many WebSocket clients\n\n\
         `sluice bench ws SLUICE_WS --reference ANVIL_WS --clients {clients} --blocks {blocks} --mine ANVIL_URL \
         --pid PID --metrics SLUICE_URL`: each client subscribes to `newHeads` and a logs filter; one block with \
         one log per second. Latency runs from a direct subscriber to anvil receiving the head to each client \
         receiving it from sluice; the fan-out is the last client's. The clients run in the report's process, on \
         the same cores as sluice and anvil: compare the two CPU columns. The machine's own limit, a bare fan-out \
         (`sluice-baseline fanout`) beside sluice, is `bench/ws.sh` (figures in \
         [subscriptions.md](subscriptions.md#benchmark)).\n\n\
         | clients | fan-out p50 / p99 ms | each delivery p50 / p99 ms | notifications/s | missed / duplicated / \
         closed | KiB per client | upstream sockets | CPU per block: sluice / generator ms |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n\
         | {} | {} / {} | {} / {} | {:.0} | {} / {} / {} | {} | {} | {} / {} |\n\n",
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

/// One mesh row in a process of its own (this binary, `sluice bench mesh … --json`), so that its
/// memory per node is what those nodes cost, not what earlier rows left allocated.
async fn mesh_row(run: &sluice_bench::mesh::MeshArgs) -> anyhow::Result<sluice_bench::mesh::MeshSummary> {
    let command = run.command();
    let out = Command::new(std::env::current_exe()?)
        .args(command.split_whitespace().skip(1))
        .arg("--json")
        .env("SLUICE_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "`{command}` failed");
    serde_json::from_slice(&out.stdout).map_err(|e| anyhow::anyhow!("`{command}` printed no summary: {e}"))
}

/// Scenario g: the peer mesh at the sizes asked for (`txs` transactions at 20/s), then, with
/// `pairs`, batching on and off side by side.
pub(super) async fn mesh_section(sizes: &[usize], txs: u64, pairs: bool) -> anyhow::Result<String> {
    use sluice_bench::mesh::{markdown_row, MeshArgs, TABLE_HEADER};
    let unbatched = |mut a: MeshArgs| {
        a.max_batch = 1;
        a.max_in_flight = 256;
        a
    };
    let loaded = || MeshArgs::new(50, 1_000, 100.0);
    let burst = || MeshArgs { degree: 2, ..MeshArgs::new(3, 30_000, 1e9) };
    let mut runs: Vec<MeshArgs> = sizes.iter().map(|n| MeshArgs::new(*n, txs, 20.0)).collect();
    if pairs {
        runs.extend([loaded(), unbatched(loaded()), burst(), unbatched(burst())]);
    }
    let mut md = String::from(
        "## g. Peer mesh

All nodes of a row in one process of their own (so \"MiB per node\" is the row's RSS growth over its \
         nodes, not what earlier rows left allocated), QUIC on loopback, each behind the memory pool (a stand-in that \
         takes each transaction once and forwards it, as the mempool's pending feed does), so this measures the \
         mesh on two shared cores. Transactions are injected at random nodes. \"per stream\" is `max_batch` (1: one \
         transaction per stream always, the first design) and \"in flight\" is `max_in_flight`, streams per peer. \
         With the pairs on, the last four rows are two pairs, batching on and off side by side: 50 nodes under \
         load, and 3 nodes with 30,000 transactions at once (3 × 10k). Details in [mesh.md](mesh.md).\n\n",
    );
    md.push_str(TABLE_HEADER);
    md.push('\n');
    let mut summaries = Vec::new();
    for run in &runs {
        eprintln!("scenario g: {}", run.command());
        let summary = mesh_row(run).await?;
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
    if pairs {
        md.push_str(&format!(
            "\nBatching on vs off: 50 nodes, {}; 3 × 10k, {}.\n\n",
            pair(&summaries[k], &summaries[k + 1]),
            pair(&summaries[k + 2], &summaries[k + 3])
        ));
    } else {
        md.push('\n');
    }
    Ok(md)
}
