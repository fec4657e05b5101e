//! Load shedding: beyond `max_in_flight`, requests are refused at once (429, Retry-After,
//! -32005) instead of queueing; admitted ones keep their latency; lower tiers are shed first.
//! The upstream is a FakeUpstream that answers after a fixed delay, to hold requests in flight.

mod common;

use std::time::{Duration, Instant};

use common::BIN;
use serde_json::{json, Value};
use sluice_testkit::{FakeUpstream, Fault, Sluice};

fn serve(upstream: &FakeUpstream, toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().unwrap();
    let base = "[cache]\nenabled = false\n[mempool]\nenabled = false\n";
    std::fs::write(file.path(), format!("{base}{toml}\n[[upstreams]]\nurl = \"{}\"\n", upstream.url)).unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", file.path().to_str().unwrap()];
    (Sluice::spawn(BIN, &args), file)
}

/// Fires `n` concurrent calls with `key`; returns (status, Retry-After, body, latency) each.
async fn burst(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    n: usize,
) -> Vec<(u16, Option<String>, Value, Duration)> {
    let calls = (0..n).map(|i| {
        let mut request = client.post(url).json(&json!({"jsonrpc": "2.0", "id": i, "method": "eth_chainId"}));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        async move {
            let started = Instant::now();
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
            (status, retry, response.json().await.unwrap_or(Value::Null), started.elapsed())
        }
    });
    futures_util::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_capacity_is_shed_at_once_and_the_admitted_stay_fast() {
    let upstream = FakeUpstream::spawn(Fault::Slow(Duration::from_millis(300))).await;
    let (sluice, _config) = serve(&upstream, "[limits]\nmax_in_flight = 4");
    let client = reqwest::Client::new();
    let rss_before = sluice.rss_bytes().expect("/proc is readable");
    // Warm-up, then 40 at once (10× the capacity), three times over.
    let mut results = Vec::new();
    for _ in 0..3 {
        results = burst(&client, &sluice.http_url(), None, 40).await;
    }
    let admitted: Vec<_> = results.iter().filter(|r| r.0 == 200).collect();
    let shed: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!(admitted.len() + shed.len(), 40, "every request is answered, admitted or shed");
    let rss_after = sluice.rss_bytes().expect("/proc is readable");
    assert!(rss_after < rss_before + 64 * 1024 * 1024, "memory stays bounded: {rss_before} → {rss_after} bytes");
    assert!((4..=12).contains(&admitted.len()), "{} admitted", admitted.len());
    for (_, retry, body, latency) in &shed {
        assert_eq!((retry.as_deref(), body["error"]["code"].as_i64()), (Some("1"), Some(-32005)), "{body}");
        assert!(*latency < Duration::from_millis(250), "shed at once, not queued: {latency:?}");
    }
    for (_, _, body, latency) in &admitted {
        assert_eq!(body["result"], "0x1");
        assert!(*latency < Duration::from_secs(2), "admitted latency stays bounded: {latency:?}");
    }
    // Still serving afterwards.
    let after = burst(&client, &sluice.http_url(), None, 1).await;
    assert_eq!(after[0].0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_priority_tiers_are_shed_first() {
    let upstream = FakeUpstream::spawn(Fault::Slow(Duration::from_millis(800))).await;
    let toml = "[limits]\nmax_in_flight = 10\n[access.keys]\nhi = \"high\"\nlo = \"low\"\n\
                [access.tiers.high]\npriority = 0\n[access.tiers.low]\npriority = 5\n";
    let (sluice, _config) = serve(&upstream, toml);
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let low = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { burst(&client, &url, Some("lo"), 20).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let high = burst(&client, &url, Some("hi"), 5).await;
    let low = low.await.unwrap();
    let low_admitted = low.iter().filter(|r| r.0 == 200).count();
    assert!(low_admitted <= 5, "low may use half the capacity: {low_admitted}");
    assert!(low_admitted >= 1);
    assert!(
        high.iter().all(|r| r.0 == 200),
        "high is served while low holds its share: {:?}",
        high.iter().map(|r| r.0).collect::<Vec<_>>()
    );
}
