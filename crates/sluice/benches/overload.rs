//! `cargo bench -p sluice --bench overload`
//!
//! Ten times the capacity, with and without load shedding, side by side in one run. The
//! upstream is a FAKE node of fixed capacity (8 requests at a time, 20 ms each: 400 req/s),
//! so that the overload is known; sluice (the real binary, cache and mempool off) sits in front
//! of it, once with `max_in_flight = 8` (sheds the excess at once with 429) and once with
//! shedding effectively off. `sluice bench`'s constant-rate generator offers 4,000 req/s and
//! counts latency from each request's scheduled time (no coordinated omission).

use std::sync::Arc;
use std::time::Duration;

use sluice_bench::run::{run, Plan};
use sluice_bench::schedule::Model;
use sluice_testkit::{FakeUpstream, Fault, Sluice};

fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn serve(upstream: &str, max_in_flight: &str) -> Sluice {
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", upstream];
    let env = [
        ("SLUICE_CACHE__ENABLED", "false"),
        ("SLUICE_MEMPOOL__ENABLED", "false"),
        ("SLUICE_LIMITS__MAX_IN_FLIGHT", max_in_flight),
    ];
    Sluice::spawn_env(env!("CARGO_BIN_EXE_sluice"), &args, &env)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let upstream = FakeUpstream::spawn(Fault::capacity(Duration::from_millis(20), 8)).await;
        let (rate, seconds) = if full_run() { (4_000.0, 8) } else { (400.0, 1) };
        println!(
            "| sluice | offered | admitted req/s | shed (429) | timeouts | other errors | admitted p50 / p99 µs |"
        );
        println!("|---|---:|---:|---:|---:|---|---:|");
        for (label, max_in_flight) in [("shedding (max_in_flight = 8)", "8"), ("no shedding", "1000000")] {
            let sluice = serve(&upstream.url, max_in_flight);
            let plan = Plan {
                url: sluice.http_url(),
                model: Model::Rate(rate),
                requests: None,
                duration: Duration::from_secs(seconds),
                mix: Arc::new(sluice_bench::mix::Mix::single("eth_blockNumber", "[]").expect("a valid call")),
                batch: 1,
                page: false,
                timeout: Duration::from_secs(2),
                max_in_flight: 50_000,
                progress: false,
                seed: 1,
                sequence: None,
            };
            let s = run(&plan).await.expect("the run completes");
            let shed = s.errors.get("http 429").copied().unwrap_or(0);
            let timeouts = s.errors.get("timeout").copied().unwrap_or(0);
            let other: Vec<String> = s
                .errors
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "http 429" | "timeout"))
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            println!(
                "| {label} | {rate:.0} req/s | {:.0} | {shed} | {timeouts} | {} | {} / {} |",
                s.ok as f64 / s.seconds,
                if other.is_empty() { "none".to_owned() } else { other.join(", ") },
                s.ok_latency_us.p50,
                s.ok_latency_us.p99
            );
            assert!(s.ok > 0, "something was admitted: {:?}", s.errors);
        }
    });
}
