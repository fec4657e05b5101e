//! Drives load against a target and records what happened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use sluice_jsonrpc::{Id, Outcome, RawValue, Request};
use sluice_upstream::{HttpUpstream, HttpUpstreamConfig, UpstreamError, UpstreamSocket};
use tokio::sync::Semaphore;

use crate::mix::Mix;
use crate::schedule::Model;
use crate::stats::{process_cpu_time, ratio, Recorder, Summary};

/// One run's settings.
#[derive(Clone)]
pub struct Plan {
    /// Target URL, `http://` or `ws://`.
    pub url: String,
    /// The load model.
    pub model: Model,
    /// Stop after this many requests.
    pub requests: Option<u64>,
    /// Stop after this long (the open models need it).
    pub duration: Duration,
    /// What to send.
    pub mix: Arc<Mix>,
    /// Calls per request (a JSON-RPC batch when more than one).
    pub batch: usize,
    /// Send a request's calls as concurrent HTTP requests (a page load) instead of one batch.
    pub page: bool,
    /// Per-request deadline; later answers count as `timeout`.
    pub timeout: Duration,
    /// Most requests in flight in the open models; beyond it requests are counted as
    /// `generator overloaded` instead of piling up.
    pub max_in_flight: usize,
    /// Show a progress bar.
    pub progress: bool,
    /// Seed for the method mix.
    pub seed: u64,
    /// A fixed sequence of calls sent in order instead of drawing from the mix (signed
    /// transactions, each sendable once); the run stops when it is used up.
    pub sequence: Option<Arc<Vec<Request>>>,
}

/// A connection to the target.
enum Client {
    Http(Box<HttpUpstream>),
    Ws(Vec<UpstreamSocket>),
}

impl Client {
    async fn connect(plan: &Plan, sockets: usize) -> anyhow::Result<Client> {
        if plan.url.starts_with("ws://") {
            let mut all = Vec::new();
            for _ in 0..sockets.max(1) {
                let (socket, _events) = UpstreamSocket::connect(&plan.url, plan.timeout)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot reach {}: {e}", plan.url))?;
                all.push(socket);
            }
            Ok(Client::Ws(all))
        } else {
            let config = HttpUpstreamConfig {
                name: "bench".into(),
                network: "bench".into(),
                url: plan.url.clone(),
                timeout: plan.timeout,
                max_response_bytes: 256 << 20,
            };
            Ok(Client::Http(Box::new(HttpUpstream::new(config).map_err(anyhow::Error::msg)?)))
        }
    }

    /// Sends one request (a call or a batch); `Err(reason)` when it failed.
    async fn send(&self, calls: Vec<Request>, n: u64, page: bool) -> Result<(), String> {
        let outcomes: Vec<Result<Outcome, UpstreamError>> = match self {
            Client::Http(http) if calls.len() == 1 => vec![http.call(&calls[0]).await.map(|a| a.outcome)],
            Client::Http(http) if page => {
                futures_util::future::join_all(calls.iter().map(|c| async { http.call(c).await.map(|a| a.outcome) }))
                    .await
            }
            Client::Http(http) => {
                let refs: Vec<&Request> = calls.iter().collect();
                http.call_batch(&refs).await.into_iter().map(|r| r.map(|a| a.outcome)).collect()
            }
            Client::Ws(sockets) => {
                let socket = &sockets[n as usize % sockets.len()];
                futures_util::future::join_all(calls.into_iter().map(|c| socket.call(c))).await
            }
        };
        for outcome in outcomes {
            match outcome {
                Ok(Outcome::Result(_)) => {}
                Ok(Outcome::Error(raw)) => return Err(rpc_reason(&raw)),
                Err(UpstreamError::HttpStatus(code)) => return Err(format!("http {code}")),
                Err(UpstreamError::Unreachable | UpstreamError::Refused) => return Err("connection failed".into()),
                Err(e) => return Err(e.kind().replace('_', " ")),
            }
        }
        Ok(())
    }
}

/// `rpc CODE`, with the message's wording for server errors (-32000…-32099: pool refusals
/// such as "nonce too low"), numbers left out so the reasons group.
fn rpc_reason(raw: &RawValue) -> String {
    let error = serde_json::from_str::<serde_json::Value>(raw.get()).unwrap_or_default();
    match error["code"].as_i64() {
        Some(c) if (-32099..=-32000).contains(&c) => {
            let message = error["message"].as_str().unwrap_or_default();
            let wording = message.split(':').next().unwrap_or_default().trim();
            if wording.is_empty() {
                format!("rpc {c}")
            } else {
                format!("rpc {c} {wording}")
            }
        }
        Some(c) => format!("rpc {c}"),
        None => "rpc error".into(),
    }
}

fn draw(plan: &Plan, rng: &mut fastrand::Rng, n: u64) -> Vec<Request> {
    if let Some(sequence) = &plan.sequence {
        return sequence.get(n as usize).cloned().into_iter().collect();
    }
    (0..plan.batch.max(1))
        .map(|i| {
            let (method, params) = plan.mix.draw(rng);
            Request::new(Some(Id::number(i as u64 + 1)), method, RawValue::from_string(params).ok())
        })
        .collect()
}

/// Runs one plan and summarizes it.
pub async fn run(plan: &Plan) -> anyhow::Result<Summary> {
    let (recorder, wall, cpu) = run_raw(plan).await?;
    Ok(recorder.summarize(&plan.url, describe(plan), wall, cpu))
}

/// Describes the model for the report.
pub fn describe(plan: &Plan) -> String {
    let limit = match plan.requests {
        Some(n) => format!("{n} requests or {}", humantime::format_duration(plan.duration)),
        None => humantime::format_duration(plan.duration).to_string(),
    };
    let batch = match (plan.page, plan.batch) {
        (true, n) => format!(", pages of {n} calls"),
        (false, n) if n > 1 => format!(", batches of {n}"),
        _ => String::new(),
    };
    match plan.model {
        Model::Concurrency(c) => format!("concurrency {c}, {limit}{batch}"),
        Model::Rate(r) => format!("constant rate {r} req/s, {limit}{batch}"),
        Model::Ramp { from, to } => format!("ramp {from} → {to} req/s, {limit}{batch}"),
    }
}

/// Runs one plan: the raw recorder, wall time and generator CPU time.
pub async fn run_raw(plan: &Plan) -> anyhow::Result<(Recorder, Duration, Option<Duration>)> {
    plan.model.validate().map_err(anyhow::Error::msg)?;
    let sockets = match plan.model {
        Model::Concurrency(c) => c.min(64),
        _ => 16,
    };
    let client = Arc::new(Client::connect(plan, sockets).await?);
    // Preflight: a target that cannot be reached is an error before any load.
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let preflight = match plan.sequence {
        // A sequence's calls are sendable once each: probe with a harmless call instead.
        Some(_) => vec![Request::new(Some(Id::number(0)), "eth_chainId", None)],
        None => draw(plan, &mut rng, 0),
    };
    if let Err(reason) = client.send(preflight, 0, plan.page).await {
        if reason == "connection failed" || reason == "timeout" {
            anyhow::bail!("cannot reach {}: {reason}", plan.url);
        }
    }
    let recorder = Arc::new(Mutex::new(Recorder::default()));
    let counters = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let progress = progress_bar(plan, counters.clone());
    let cpu_before = process_cpu_time();
    let start = Instant::now();
    match plan.model {
        Model::Concurrency(workers) => closed(plan, client, workers, start, &recorder, &counters).await,
        _ => open(plan, client, start, &recorder, &counters).await,
    }
    let wall = start.elapsed();
    let cpu = process_cpu_time().zip(cpu_before).map(|(after, before)| after.saturating_sub(before));
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let recorder = Arc::try_unwrap(recorder).map_err(|_| anyhow::anyhow!("requests still running"))?;
    Ok((recorder.into_inner().unwrap_or_else(|e| e.into_inner()), wall, cpu))
}

type Counters = Arc<(AtomicU64, AtomicU64)>;

fn record(recorder: &Mutex<Recorder>, counters: &Counters, start: Instant, sent: Instant, result: Result<(), String>) {
    let now = Instant::now();
    let failed = result.is_err();
    if let Ok(mut r) = recorder.lock() {
        r.record(now - start, now - sent, result.err());
    }
    counters.0.fetch_add(1, Ordering::Relaxed);
    if failed {
        counters.1.fetch_add(1, Ordering::Relaxed);
    }
}

/// The closed model: each worker sends when its last request is answered.
async fn closed(
    plan: &Plan,
    client: Arc<Client>,
    workers: usize,
    start: Instant,
    recorder: &Arc<Mutex<Recorder>>,
    counters: &Counters,
) {
    let limit = plan.sequence.as_ref().map_or(u64::MAX, |s| s.len() as u64);
    let budget = Arc::new(AtomicU64::new(plan.requests.unwrap_or(u64::MAX).min(limit)));
    let next = Arc::new(AtomicU64::new(0));
    let deadline = start + plan.duration;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (plan, client, budget, recorder, counters, next) =
            (plan.clone(), client.clone(), budget.clone(), recorder.clone(), counters.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(plan.seed.wrapping_add(w as u64 + 1));
            let mut n = w as u64;
            while Instant::now() < deadline
                && budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_ok()
            {
                let calls = draw(&plan, &mut rng, next.fetch_add(1, Ordering::Relaxed));
                let sent = Instant::now();
                let result = client.send(calls, n, plan.page).await;
                record(&recorder, &counters, start, sent, result);
                n += workers as u64;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// The open models: requests leave on schedule whatever the answers do; latency counts from
/// the scheduled time. The schedule runs on a thread of its own with precise sleeps: tokio's
/// timer wheel ticks in milliseconds, which would add up to 1 ms of send lag to every request.
async fn open(plan: &Plan, client: Arc<Client>, start: Instant, recorder: &Arc<Mutex<Recorder>>, counters: &Counters) {
    let in_flight = Arc::new(Semaphore::new(plan.max_in_flight));
    let runtime = tokio::runtime::Handle::current();
    let (plan_owned, permits, recorder_owned, counters_owned) =
        (plan.clone(), in_flight.clone(), recorder.clone(), counters.clone());
    let scheduler = tokio::task::spawn_blocking(move || {
        let (plan, recorder, counters) = (plan_owned, recorder_owned, counters_owned);
        let mut rng = fastrand::Rng::with_seed(plan.seed);
        let mut i = 0u64;
        while let Some(offset) = plan.model.intended_offset(i, plan.duration) {
            if plan.requests.is_some_and(|n| i >= n) || plan.sequence.as_ref().is_some_and(|s| i >= s.len() as u64) {
                break;
            }
            let due = start + offset;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if let Ok(mut r) = recorder.lock() {
                r.record_send_lag(Instant::now().saturating_duration_since(due));
            }
            let calls = draw(&plan, &mut rng, i);
            match permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let (client, recorder, counters) = (client.clone(), recorder.clone(), counters.clone());
                    let page = plan.page;
                    runtime.spawn(async move {
                        let result = client.send(calls, i, page).await;
                        record(&recorder, &counters, start, due, result);
                        // Release the recorder before the permit: the run unwraps it once all
                        // permits are back.
                        drop(recorder);
                        drop(permit);
                    });
                }
                Err(_) => record(&recorder, &counters, start, due, Err("generator overloaded (max in flight)".into())),
            }
            i += 1;
        }
    });
    let _ = scheduler.await;
    let all = u32::try_from(plan.max_in_flight).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(plan.timeout + Duration::from_secs(5), in_flight.acquire_many(all)).await;
}

fn progress_bar(plan: &Plan, counters: Counters) -> Option<ProgressBar> {
    if !plan.progress {
        return None;
    }
    let bar = ProgressBar::new(plan.duration.as_millis() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let ticker = bar.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let mut last = 0u64;
        while !ticker.is_finished() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let (done, failed) = (counters.0.load(Ordering::Relaxed), counters.1.load(Ordering::Relaxed));
            ticker.set_position(started.elapsed().as_millis() as u64);
            ticker.set_message(format!("{done} done · {:.0} req/s · {failed} errors", (done - last) as f64 * 4.0));
            last = done;
        }
    });
    Some(bar)
}

/// One target's rounds, added up.
#[derive(Default)]
struct Rounds {
    recorder: Recorder,
    wall: Duration,
    cpu: Option<Duration>,
    measured_cpu: bool,
}

impl Rounds {
    fn add(&mut self, (recorder, wall, cpu): (Recorder, Duration, Option<Duration>)) {
        self.recorder.merge(&recorder, self.wall);
        self.wall += wall;
        self.cpu = match (self.measured_cpu, self.cpu, cpu) {
            (false, _, c) => c,
            (true, Some(total), Some(c)) => Some(total + c),
            _ => None,
        };
        self.measured_cpu = true;
    }

    fn summarize(&self, target: &str, model: String) -> Summary {
        self.recorder.summarize(target, model, self.wall, self.cpu)
    }
}

/// Runs the same plan against `a` and `b` alternately (`rounds` each), then summarizes both.
pub async fn compare(plan: &Plan, b: &str, rounds: usize) -> anyhow::Result<(Summary, Summary)> {
    let rounds = rounds.max(1);
    let slice = Plan {
        duration: plan.duration / rounds as u32,
        requests: plan.requests.map(|n| n.div_ceil(rounds as u64)),
        ..plan.clone()
    };
    let other = Plan { url: b.to_owned(), ..slice.clone() };
    let (mut first, mut second) = (Rounds::default(), Rounds::default());
    for _ in 0..rounds {
        first.add(run_raw(&slice).await?);
        second.add(run_raw(&other).await?);
    }
    let model = describe(plan);
    Ok((first.summarize(&plan.url, model.clone()), second.summarize(b, model)))
}

/// The ratio table printed by `--compare`: the first target over the second.
pub fn ratio_table(a: &Summary, b: &Summary) -> String {
    let (la, lb) = (&a.latency_us, &b.latency_us);
    let rows = [
        ("req/s", a.req_per_sec, b.req_per_sec),
        ("p50 µs", la.p50 as f64, lb.p50 as f64),
        ("p90 µs", la.p90 as f64, lb.p90 as f64),
        ("p99 µs", la.p99 as f64, lb.p99 as f64),
        ("max µs", la.max as f64, lb.max as f64),
    ];
    let mut out = format!("| | {} | {} | ratio |\n|---|---:|---:|---:|\n", a.target, b.target);
    for (name, x, y) in rows {
        out.push_str(&format!("| {name} | {x:.0} | {y:.0} | {} |\n", ratio(x, y)));
    }
    out.push_str(&format!("| errors | {} | {} | |\n", a.requests - a.ok, b.requests - b.ok));
    out
}
