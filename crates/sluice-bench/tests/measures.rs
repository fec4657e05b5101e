//! The load generator's figures checked against fake targets with known, injected behaviour
//! (named fakes: what is under test here is the generator, not a node).

use std::sync::Arc;
use std::time::Duration;

use sluice_bench::mix::Mix;
use sluice_bench::run::{run, Plan};
use sluice_bench::schedule::Model;
use sluice_testkit::{FakeUpstream, Fault};

fn plan(url: &str, model: Model, duration: Duration) -> Plan {
    Plan {
        url: url.to_owned(),
        model,
        requests: None,
        duration,
        mix: Arc::new(Mix::single("eth_blockNumber", "[]").unwrap()),
        batch: 1,
        page: false,
        timeout: Duration::from_secs(2),
        max_in_flight: 1000,
        progress: false,
        seed: 1,
        sequence: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_5ms_delay_shows_as_p50_of_5ms() {
    let fake = FakeUpstream::spawn(Fault::Slow(Duration::from_millis(5))).await;
    let summary = run(&plan(&fake.url, Model::Concurrency(4), Duration::from_secs(1))).await.unwrap();
    let p50 = summary.latency_us.p50;
    // Upper bound with room for a noisy 2-core machine running the other tests of this file.
    assert!((5_000..10_000).contains(&p50), "p50 {p50} µs");
    assert!(summary.latency_us.min >= 5_000, "nothing faster than the delay: {}", summary.latency_us.min);
    // 4 workers × ~1 request per ~5 ms for 1 s.
    assert!((400..=800).contains(&summary.requests), "{} requests", summary.requests);
    assert_eq!(summary.requests, summary.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shows_in_constant_rate_percentiles_but_hides_in_the_closed_model() {
    let stall = Fault::Stall { at: Duration::from_millis(500), stall: Duration::from_millis(500) };
    // Constant rate: requests keep leaving during the stall, and each waits for it to end,
    // measured from when it was due.
    let open_target = FakeUpstream::spawn(stall.clone()).await;
    let open = run(&plan(&open_target.url, Model::Rate(200.0), Duration::from_secs(2))).await.unwrap();
    assert_eq!(open.requests, 400);
    assert!(open.latency_us.p90 > 200_000, "rate-mode p90 {} µs", open.latency_us.p90);
    assert!(open.latency_us.max > 400_000, "rate-mode max {} µs", open.latency_us.max);
    // Closed model, one worker: only the one request in flight during the stall is slow, so
    // the stall all but vanishes from the percentiles (coordinated omission).
    let closed_target = FakeUpstream::spawn(stall).await;
    let closed = run(&plan(&closed_target.url, Model::Concurrency(1), Duration::from_secs(2))).await.unwrap();
    assert!(closed.latency_us.p90 < 20_000, "closed p90 {} µs", closed.latency_us.p90);
    assert!(closed.latency_us.max > 400_000, "the one stalled request: {} µs", closed.latency_us.max);
    // The per-second series shows it too: the slowest second's p99 holds the stall.
    let worst = open.series.iter().map(|s| s.p99_us).max().unwrap_or(0);
    assert!(worst > 300_000, "worst per-second p99 {worst} µs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_grouped_by_reason_and_unreachable_targets_fail_before_load() {
    let fake = FakeUpstream::spawn(Fault::Garbage(503, "busy")).await;
    let summary = run(&plan(&fake.url, Model::Concurrency(2), Duration::from_millis(300))).await.unwrap();
    assert_eq!(summary.ok, 0);
    assert_eq!(summary.errors.get("http 503").copied(), Some(summary.requests));

    let hang = FakeUpstream::spawn(Fault::Hang).await;
    let mut timing_out = plan(&hang.url, Model::Rate(50.0), Duration::from_millis(200));
    timing_out.timeout = Duration::from_millis(100);
    let err = run(&timing_out).await.unwrap_err().to_string();
    assert!(err.contains("cannot reach"), "{err}");

    let dead = format!("http://127.0.0.1:{}", sluice_testkit::free_port());
    let err = run(&plan(&dead, Model::Concurrency(1), Duration::from_millis(200))).await.unwrap_err().to_string();
    assert!(err.contains("cannot reach"), "{err}");
}
