//! Load shedding: beyond `max_in_flight`, requests are refused at once (429, Retry-After,
//! -32005) instead of queueing; admitted ones keep their latency; lower tiers are shed first;
//! submissions are shed before reads. The upstream is a FakeUpstream that answers after a fixed
//! delay (alone, or relaying to a real anvil), to hold requests in flight.

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

/// A flood of transaction submissions must not crowd reads out: a body made only of
/// submissions may hold at most half of what its caller may hold in flight, so reads are
/// admitted while submissions wait, and the submissions beyond that half are refused at once.
/// In front of a real anvil (no mining) through a relay that answers after 2 s: every
/// submission waits that long for its sender's account state, holding its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_submissions_never_crowd_reads_out() {
    use sluice_bench::txgen::{Fees, Wallet};
    let anvil = sluice_testkit::Anvil::spawn_with(&["--no-mining"]);
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::from_secs(2), fail_method: None })
            .await;
    let client = reqwest::Client::new();
    let wallets: Vec<Wallet> = (0..9).map(|i| Wallet::numbered(7_000 + i, 31337)).collect();
    common::fund_all(&client, &anvil, wallets.iter().map(|w| w.address())).await;
    let toml = format!(
        "[limits]\nmax_in_flight = 8\n[cache]\nenabled = false\n[mempool]\nrelay = false\n\
         [[upstreams]]\nurl = \"{}\"\n",
        relay.url
    );
    let config = common::with_config(&toml);
    let url = config.sluice.http_url();
    let to: alloy_primitives::Address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".parse().unwrap();
    // The mempool takes transactions once it knows the chain id (through the slow relay too).
    let first = wallets[8].transfer(0, to, 1, Fees::default()).hex();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answer = sluice_testkit::rpc(&client, &url, "eth_sendRawTransaction", json!([first])).await;
        if answer["result"].is_string() {
            break;
        }
        assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("chain id is not known")), "{answer}");
        assert!(std::time::Instant::now() < deadline, "the mempool learns the chain id: {answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state_reads_before = relay.requests_with("eth_getTransactionCount");
    let submissions: Vec<_> = wallets[..8]
        .iter()
        .map(|w| {
            let (client, url) = (client.clone(), url.clone());
            let raw = w.transfer(0, to, 1, Fees::default()).hex();
            tokio::spawn(async move {
                let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_sendRawTransaction", "params": [raw]});
                let response = client.post(&url).json(&body).send().await.unwrap();
                (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    // The submissions are in flight once sluice reads their senders' state (the relay holds it).
    common::eventually(Duration::from_secs(5), "a sender state read reaches the relay", || async {
        relay.requests_with("eth_getTransactionCount") > state_reads_before
    })
    .await;
    for _ in 0..5 {
        let response = client
            .post(&url)
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "txpool_status", "params": []}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 200, "a read is admitted while submissions wait: {body}");
        assert!(body["result"]["pending"].is_string(), "{body}");
    }
    let mut accepted = 0;
    for submission in submissions {
        let (status, body) = submission.await.unwrap();
        match status {
            200 => {
                assert!(body["result"].as_str().is_some_and(|h| h.len() == 66), "accepted with its hash: {body}");
                accepted += 1;
            }
            429 => assert_eq!(body["error"]["code"], -32005, "{body}"),
            other => panic!("HTTP {other}: {body}"),
        }
    }
    assert!((1..=4).contains(&accepted), "submissions hold at most half of max_in_flight: {accepted} accepted");
}
