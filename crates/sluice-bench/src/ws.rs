//! `sluice bench ws`: many WebSocket clients, each subscribed to `newHeads` and a logs filter,
//! while blocks are produced; measures how long each head takes to reach every client.
//!
//! A head's arrival is taken where a direct subscriber to the node sees it (`--reference`, a
//! socket to the node itself): the latency of a delivery is the client's receipt minus that
//! arrival, so it includes sluice's own detection of the block. Per block, the last client's
//! latency is the fan-out time. Also: deliveries per second, heads missed or duplicated, memory
//! per client (the sluice process's RSS before and after the clients subscribed, `--pid`), and
//! the upstream sockets sluice holds (its `sluice_upstream_sockets`, `--metrics`). All clients
//! run in this process: on a small machine the generator shares the cores with sluice and the
//! node, which the report says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// A contract that emits one log (topic `0x11…11`) on any call: PUSH32 topic, PUSH1 0,
/// PUSH1 0, LOG1, STOP.
const EMITTER_CODE: &str = "0x7f111111111111111111111111111111111111111111111111111111111111111160006000a100";
/// Where `--mine` places it.
const EMITTER: &str = "0x00000000000000000000000000000000000051ce";
/// anvil's first dev account (unlocked).
const DEV_ACCOUNT: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

/// Arguments of `sluice bench ws`.
#[derive(Debug, Args)]
pub struct WsArgs {
    /// sluice's WebSocket URL (ws://…).
    pub url: String,
    /// A WebSocket URL of the node itself, where a head's arrival is taken.
    #[arg(long)]
    pub reference: String,
    /// Clients, each with a `newHeads` and a logs subscription.
    #[arg(long, default_value_t = 1000)]
    pub clients: usize,
    /// Blocks to measure after every client has subscribed.
    #[arg(long, default_value_t = 20)]
    pub blocks: u64,
    /// Produce the blocks: one transaction per `--block-time` to an anvil at this HTTP URL (a
    /// contract emitting one log is placed first, with `anvil_setCode`), each mined at once.
    #[arg(long)]
    pub mine: Option<String>,
    /// Time between blocks with `--mine`.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub block_time: Duration,
    /// sluice's process id, for its memory per client.
    #[arg(long)]
    pub pid: Option<u32>,
    /// sluice's base HTTP URL, for the upstream sockets it holds.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What one client saw.
#[derive(Default)]
struct Seen {
    heads: Vec<(u64, Instant)>,
    logs: u64,
    closed: bool,
}

/// The figures of one run.
#[derive(Debug, serde::Serialize)]
pub struct WsSummary {
    /// Clients connected and subscribed.
    pub clients: usize,
    /// Blocks measured.
    pub blocks: u64,
    /// Every delivery of a measured head: p50 / p99 / max, µs after the reference saw it.
    pub delivery_us: [u64; 3],
    /// Per block, the last client's delivery: p50 / p99 / max, µs.
    pub fanout_us: [u64; 3],
    /// Notifications (heads and logs) received per second over the measured blocks.
    pub messages_per_s: f64,
    /// Measured heads a client never received, and heads received twice.
    pub missed: u64,
    /// Heads a client received more than once.
    pub duplicated: u64,
    /// Clients the server closed.
    pub closed: usize,
    /// sluice's RSS growth per client, KiB, when `--pid` was given.
    pub kib_per_client: Option<f64>,
    /// sluice's upstream sockets at the end, when `--metrics` was given.
    pub upstream_sockets: Option<f64>,
    /// CPU this generator used per measured block, ms (reading every client's messages).
    pub generator_cpu_ms_per_block: Option<f64>,
    /// CPU the server under test used per measured block, ms, when `--pid` was given.
    pub server_cpu_ms_per_block: Option<f64>,
}

/// Runs `sluice bench ws`.
pub async fn run_ws(args: WsArgs) -> anyhow::Result<()> {
    let summary = measure(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("{}", human(&summary));
    }
    Ok(())
}

/// One line per figure.
pub fn human(s: &WsSummary) -> String {
    let ms = |us: u64| format!("{:.1} ms", us as f64 / 1000.0);
    format!(
        "{} clients, {} blocks\nhead to every client (fan-out, per block): p50 {} p99 {} max {}\n\
         each delivery: p50 {} p99 {} max {}\nnotifications: {:.0}/s; missed {}, duplicated {}, clients closed {}\n\
         memory per client: {}; upstream sockets: {}; CPU per block: server {}, generator {}",
        s.clients,
        s.blocks,
        ms(s.fanout_us[0]),
        ms(s.fanout_us[1]),
        ms(s.fanout_us[2]),
        ms(s.delivery_us[0]),
        ms(s.delivery_us[1]),
        ms(s.delivery_us[2]),
        s.messages_per_s,
        s.missed,
        s.duplicated,
        s.closed,
        s.kib_per_client.map_or("-".into(), |k| format!("{k:.1} KiB")),
        s.upstream_sockets.map_or("-".into(), |n| format!("{n}")),
        s.server_cpu_ms_per_block.map_or("-".into(), |c| format!("{c:.1} ms")),
        s.generator_cpu_ms_per_block.map_or("-".into(), |c| format!("{c:.1} ms")),
    )
}

fn small_buffers() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(8 * 1024).write_buffer_size(0)
}

/// Measures one run.
pub async fn measure(args: &WsArgs) -> anyhow::Result<WsSummary> {
    anyhow::ensure!(args.url.starts_with("ws://"), "{}: use a ws:// URL", args.url);
    anyhow::ensure!(args.clients > 0 && args.blocks > 0, "--clients and --blocks must be more than zero");
    let http = node_rpc::Client::new();
    if let Some(node) = &args.mine {
        http.call(node, "anvil_setCode", json!([EMITTER, EMITTER_CODE])).await?;
    }
    let filter = json!(["logs", {"address": EMITTER}]);
    let rss_before = args.pid.and_then(rss_kib);
    // The reference: a direct subscriber to the node.
    let arrivals: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let reference = {
        let (mut ws, _) =
            tokio_tungstenite::connect_async_with_config(args.reference.as_str(), Some(small_buffers()), false).await?;
        subscribe(&mut ws, 1, json!(["newHeads"])).await?;
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            while let Some(Ok(Message::Text(text))) = ws.next().await {
                if let Some(n) = head_number(&text) {
                    arrivals.lock().unwrap_or_else(|e| e.into_inner()).entry(n).or_insert_with(Instant::now);
                }
            }
        })
    };
    // The clients, connected 200 at a time.
    let mut seen: Vec<Arc<Mutex<Seen>>> = Vec::with_capacity(args.clients);
    let mut tasks = Vec::with_capacity(args.clients);
    let mut left = args.clients;
    while left > 0 {
        let n = left.min(200);
        left -= n;
        let joined = futures_util::future::join_all((0..n).map(|_| client(&args.url, filter.clone()))).await;
        for c in joined {
            let (state, task) = c?;
            seen.push(state);
            tasks.push(task);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = args.pid.and_then(rss_kib);
    let start_head = arrivals.lock().unwrap_or_else(|e| e.into_inner()).keys().max().copied();
    let cpu_before = crate::stats::process_cpu_time();
    let server_before = args.pid.and_then(process_cpu);
    let started = Instant::now();
    // Produce (or wait for) the measured blocks.
    // With --mine, block `head + k` is the k-th transaction's (anvil mines each at once); its
    // send time is kept to show how long the node took to announce it.
    let mut mined: HashMap<u64, Instant> = HashMap::new();
    let first = match &args.mine {
        Some(node) => {
            let head = http.call(node, "eth_blockNumber", json!([])).await?;
            let head =
                head.as_str().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()).unwrap_or(0);
            let mut tick = tokio::time::interval(args.block_time);
            for k in 1..=args.blocks {
                tick.tick().await;
                mined.insert(head + k, Instant::now());
                http.call(node, "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "to": EMITTER}])).await?;
            }
            head + 1
        }
        None => start_head.map_or(0, |h| h + 1),
    };
    let last = first + args.blocks - 1;
    // Wait until every client has the last block (or 10 s after it arrived).
    let deadline = Instant::now() + args.block_time * (args.blocks as u32 + 2) + Duration::from_secs(10);
    loop {
        let done = seen.iter().all(|s| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            s.closed || s.heads.last().is_some_and(|(n, _)| *n >= last)
        });
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall = started.elapsed();
    let per_block = |d: Duration| d.as_secs_f64() * 1000.0 / args.blocks as f64;
    let cpu = crate::stats::process_cpu_time().zip(cpu_before).map(|(a, b)| per_block(a - b));
    let server_cpu = args.pid.and_then(process_cpu).zip(server_before).map(|(a, b)| per_block(a - b));
    let upstream_sockets = match &args.metrics {
        Some(base) => http.metric(base, "sluice_upstream_sockets ").await,
        None => None,
    };
    reference.abort();
    for task in &tasks {
        task.abort();
    }
    let arrivals = arrivals.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut delivery = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut fanout = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut last_delivery: HashMap<u64, Instant> = HashMap::new();
    let (mut missed, mut duplicated, mut closed, mut messages) = (0u64, 0u64, 0usize, 0u64);
    for s in &seen {
        let s = s.lock().unwrap_or_else(|e| e.into_inner());
        closed += usize::from(s.closed);
        messages += s.logs;
        let mut got: HashMap<u64, usize> = HashMap::new();
        for (n, at) in &s.heads {
            if !(first..=last).contains(n) {
                continue;
            }
            messages += 1;
            *got.entry(*n).or_default() += 1;
            if let Some(arrived) = arrivals.get(n) {
                delivery.saturating_record(at.saturating_duration_since(*arrived).as_micros() as u64);
                let latest = last_delivery.entry(*n).or_insert(*at);
                *latest = (*latest).max(*at);
            }
        }
        missed += (first..=last).filter(|n| !got.contains_key(n)).count() as u64;
        duplicated += got.values().map(|c| c.saturating_sub(1) as u64).sum::<u64>();
    }
    for (n, at) in &last_delivery {
        if let Some(arrived) = arrivals.get(n) {
            fanout.saturating_record(at.saturating_duration_since(*arrived).as_micros() as u64);
        }
    }
    let p = |h: &Histogram<u64>| [h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.max()];
    let kib_per_client = rss_before.zip(rss_after).map(|(b, a)| a.saturating_sub(b) as f64 / args.clients as f64);
    Ok(WsSummary {
        clients: seen.len(),
        blocks: args.blocks,
        delivery_us: p(&delivery),
        fanout_us: p(&fanout),
        messages_per_s: messages as f64 / wall.as_secs_f64(),
        missed,
        duplicated,
        closed,
        kib_per_client,
        upstream_sockets,
        generator_cpu_ms_per_block: cpu,
        server_cpu_ms_per_block: server_cpu,
    })
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn subscribe(ws: &mut Socket, id: u64, params: Value) -> anyhow::Result<String> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "eth_subscribe", "params": params});
    ws.send(Message::text(body.to_string())).await?;
    while let Some(message) = ws.next().await {
        if let Message::Text(text) = message? {
            let answer: Value = serde_json::from_str(&text)?;
            if answer["id"] == id {
                return answer["result"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow::anyhow!("refused: {answer}"));
            }
        }
    }
    anyhow::bail!("closed while subscribing")
}

/// Connects one client, subscribes it, and reads in the background.
async fn client(url: &str, filter: Value) -> anyhow::Result<(Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>)> {
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(small_buffers()), false).await?;
    let heads = subscribe(&mut ws, 1, json!(["newHeads"])).await?;
    subscribe(&mut ws, 2, filter).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let state = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(message) = ws.next().await {
            let text = match message {
                Ok(Message::Text(text)) => text,
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let at = Instant::now();
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            // The heads subscription's id appears in its messages; the number is read
            // without parsing the whole block.
            if text.contains(heads.as_str()) {
                if let Some(n) = head_number(&text) {
                    s.heads.push((n, at));
                }
            } else {
                s.logs += 1;
            }
        }
        state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
    });
    Ok((seen, task))
}

/// The `"number"` of a head notification (a block object's own key; logs have
/// `"blockNumber"`).
fn head_number(text: &str) -> Option<u64> {
    let at = text.find("\"number\":\"0x")? + "\"number\":\"0x".len();
    let digits: String = text[at..].chars().take_while(char::is_ascii_hexdigit).collect();
    u64::from_str_radix(&digits, 16).ok()
}

/// CPU time (user + system) a process has used, from `/proc/PID/stat` (10 ms ticks).
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A few HTTP JSON-RPC calls, through sluice-upstream's client (no extra HTTP stack).
mod node_rpc {
    use std::time::Duration;

    use serde_json::Value;
    use sluice_jsonrpc::{Id, Outcome, Request};
    use sluice_upstream::{HttpUpstream, HttpUpstreamConfig};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    pub struct Client;

    impl Client {
        pub fn new() -> Self {
            Client
        }

        pub async fn call(&self, url: &str, method: &str, params: Value) -> anyhow::Result<Value> {
            let node = HttpUpstream::new(HttpUpstreamConfig {
                name: "bench-ws".into(),
                network: "bench".into(),
                url: url.to_owned(),
                timeout: Duration::from_secs(10),
                max_response_bytes: 16 << 20,
            })
            .map_err(anyhow::Error::msg)?;
            let params = serde_json::value::to_raw_value(&params)?;
            match node.call(&Request::new(Some(Id::number(1)), method, Some(params))).await?.outcome {
                Outcome::Result(raw) => Ok(serde_json::from_str(raw.get())?),
                Outcome::Error(e) => anyhow::bail!("{method}: {}", e.get()),
            }
        }

        /// One series of a Prometheus text page at `base/metrics` (`http://host:port`).
        pub async fn metric(&self, base: &str, series: &str) -> Option<f64> {
            let host = base.strip_prefix("http://")?.trim_end_matches('/');
            let mut tcp = tokio::net::TcpStream::connect(host).await.ok()?;
            let request = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
            tcp.write_all(request.as_bytes()).await.ok()?;
            let mut page = String::new();
            tcp.read_to_string(&mut page).await.ok()?;
            page.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn head_numbers_are_read_from_blocks_not_logs() {
        let head = r#"{"params":{"subscription":"0x1","result":{"hash":"0xab","number":"0x1f","x":1}}}"#;
        assert_eq!(super::head_number(head), Some(31));
        assert_eq!(super::head_number(r#"{"result":{"blockNumber":"0x5"}}"#), None);
    }
}
