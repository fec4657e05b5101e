//! The upstream economy as a metered provider sees it, on real anvils behind relays (fakes only
//! in that they count calls or play the provider's limit): concurrent calls leave as one batch
//! per window; two replicas sharing a real Redis keep a member's daily quota exactly; a
//! provider that answers 429 above 20 calls a second gets no more than that from sluice, whose
//! callers wait in its queue instead of failing, and gets more again when it allows more.
//! (Multicall3 aggregation has its own file, aggregate.rs.)

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_testkit::{rpc, Anvil, FakeUpstream, Fault, RateWindow, RedisServer};

fn balance(i: usize) -> Value {
    json!([format!("0x{:040x}", 0x1000 + i), "latest"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_leave_as_one_batch_per_window_and_each_gets_its_own_answer() {
    let anvil = Anvil::spawn();
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    let net = common::with_config(&format!(
        "[cache]\nenabled = false\n[mempool]\nenabled = false\n[pool]\nprobe_interval = \"10s\"\n\
         [[upstreams]]\nurl = \"{}\"\nbatch_window = \"5ms\"\nmax_batch = 50\n",
        relay.url
    ));
    let client = reqwest::Client::new();
    // 200 calls from 200 clients at once; every tenth is invalid (its own error, not the batch's).
    let params: Vec<Value> =
        (0..200).map(|i| if i % 10 == 9 { json!(["0xzz", "latest"]) } else { balance(i) }).collect();
    let before = relay.requests();
    let url = net.sluice.http_url();
    let through =
        futures_util::future::join_all(params.iter().map(|p| rpc(&client, &url, "eth_getBalance", p.clone()))).await;
    let requests = relay.requests() - before;
    let anvil_url = anvil.http_url();
    let direct =
        futures_util::future::join_all(params.iter().map(|p| rpc(&client, &anvil_url, "eth_getBalance", p.clone())))
            .await;
    for ((p, got), want) in params.iter().zip(&through).zip(&direct) {
        assert_eq!((&got["result"], &got["error"]), (&want["result"], &want["error"]), "{p}");
    }
    assert_eq!(through.iter().filter(|a| a.get("error").is_some()).count(), 20);
    println!("200 concurrent calls: {requests} HTTP requests to the node");
    assert!(requests <= 50, "{requests} HTTP requests for 200 calls within a 5 ms window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_redis_keep_a_daily_quota_exactly() {
    let anvil = Anvil::spawn();
    let redis = RedisServer::spawn();
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    let config = format!(
        "[cache]\nenabled = false\n[mempool]\nenabled = false\n[pool]\nprobe_interval = \"10s\"\n\
         budget_store = \"{}\"\n[[upstreams]]\nurl = \"{}\"\ndaily_quota = 30\n",
        redis.url(),
        relay.url
    );
    let (a, b) = (common::with_config(&config), common::with_config(&config));
    let client = reqwest::Client::new();
    let urls = [a.sluice.http_url(), b.sluice.http_url()];
    // 100 distinct calls, half to each replica, ten at a time.
    let mut answers = Vec::new();
    for chunk in (0..100).collect::<Vec<_>>().chunks(10) {
        let calls = chunk.iter().map(|&i| rpc(&client, &urls[i % 2], "eth_getBalance", balance(i)));
        answers.extend(futures_util::future::join_all(calls).await);
    }
    let answered = answers.iter().filter(|a| a.get("result").is_some()).count();
    let refused = answers.iter().filter(|a| a["error"]["code"] == -32005).count();
    assert_eq!(relay.requests_for("eth_getBalance"), 30, "the provider saw exactly its quota");
    assert_eq!((answered, refused), (30, 70), "the rest refused as over budget: {:?}", answers.last());
    for url in &urls {
        let text = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(text.contains("sluice_upstream_budget_store_errors_total 0"), "Redis answered every charge");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_budget_store_fails_fail_open_lets_calls_through_and_fail_closed_refuses() {
    let anvil = Anvil::spawn();
    let mut redis = RedisServer::spawn();
    let config = |fail_open: bool| {
        format!(
            "[cache]\nenabled = false\n[mempool]\nenabled = false\n[pool]\nprobe_interval = \"10s\"\n\
             budget_store = \"{}\"\nbudget_store_fail_open = {fail_open}\n[[upstreams]]\nurl = \"{}\"\ndaily_quota = 1000\n",
            redis.url(),
            anvil.http_url()
        )
    };
    let (open, closed) = (common::with_config(&config(true)), common::with_config(&config(false)));
    let client = reqwest::Client::new();
    let (open_url, closed_url) = (open.sluice.http_url(), closed.sluice.http_url());
    for url in [&open_url, &closed_url] {
        assert!(rpc(&client, url, "eth_getBalance", balance(1)).await.get("result").is_some());
    }
    redis.kill();
    let through = rpc(&client, &open_url, "eth_getBalance", balance(2)).await;
    assert!(through.get("result").is_some(), "fail-open: the local budgets still hold, the call goes: {through}");
    let refused = rpc(&client, &closed_url, "eth_getBalance", balance(3)).await;
    assert_eq!(refused["error"]["code"], -32005, "fail-closed: {refused}");
    for url in [&open_url, &closed_url] {
        let errors = sluice_testkit::metric(&client, url, "sluice_upstream_budget_store_errors_total").await;
        assert!(errors.unwrap_or(0.0) >= 1.0, "counted: {errors:?}");
    }
}

/// One call's outcome as a caller sees it: "ok", or its error code and reason.
async fn outcome(client: &reqwest::Client, url: &str, i: usize) -> String {
    let answer = rpc(client, url, "eth_getBalance", balance(i)).await;
    match answer.get("error") {
        None => "ok".to_owned(),
        Some(e) => format!("{} {}", e["code"], e["data"]["reason"]),
    }
}

/// Offers `rate` calls a second for `seconds`, each call its own task; the outcomes.
async fn offer(client: &reqwest::Client, url: &str, rate: u64, seconds: u64, first: usize) -> Vec<String> {
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate));
    let mut tasks = Vec::new();
    for i in 0..(rate * seconds) as usize {
        tick.tick().await;
        let (client, url) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move { outcome(&client, &url, first + i).await }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_limiting_at_20_per_second_gets_no_more_and_callers_wait_their_turn() {
    let anvil = Anvil::spawn();
    let window = RateWindow::new(20);
    let relay =
        FakeUpstream::spawn(Fault::RateLimited { to: anvil.http_url(), window: window.clone(), retry_after: None })
            .await;
    let net = common::with_config(&format!(
        "[cache]\nenabled = false\n[mempool]\nenabled = false\n[pool]\nprobe_interval = \"10s\"\nhedge = \"off\"\n\
         budget_wait = \"2s\"\n[[upstreams]]\nurl = \"{}\"\n",
        relay.url
    ));
    let client = reqwest::Client::new();
    let url = net.sluice.http_url();

    // 40 calls a second, twice what the provider allows, for 10 seconds.
    let started = Instant::now();
    let settled_from = started + Duration::from_secs(4);
    let first = offer(&client, &url, 40, 10, 0).await;
    let phase_one = settled_from.elapsed().as_secs_f64();
    let (relayed, limited) = window.counts_since(settled_from);
    let per_second = relayed as f64 / phase_one;
    println!("settled: {per_second:.1} calls/s relayed, {limited} answered 429 in {phase_one:.1} s");
    assert!(per_second <= 21.0, "no more than the provider allows: {per_second:.1}/s");
    assert!(per_second >= 12.0, "most of what it allows is used: {per_second:.1}/s");
    assert!((limited as f64) <= phase_one, "the 429s became rare: {limited} in {phase_one:.1} s");
    let ok = first.iter().filter(|o| *o == "ok").count();
    let refused: Vec<&String> = first.iter().filter(|o| *o != "ok").collect();
    assert!(refused.iter().all(|o| o.starts_with("-32005")), "callers see -32005 or an answer: {refused:?}");
    let queue_full = refused.iter().filter(|o| o.ends_with("\"budget_exhausted\"")).count();
    assert!(queue_full * 10 >= refused.len() * 9, "refusals come from sluice's full queue: {refused:?}");
    assert!(ok >= 150, "{ok} of 400 answered");
    let status: Value = client.get(format!("{url}/status")).send().await.unwrap().json().await.unwrap();
    let member = &status["upstreams"][0];
    assert_eq!(member["rate_cut"], true, "{member}");

    // The provider allows more: sluice's rate rises again, slowly.
    window.set_limit(100);
    let raised = Instant::now();
    let second = offer(&client, &url, 40, 16, 1000).await;
    let (relayed, limited) = window.counts_since(raised + Duration::from_secs(12));
    let late = (raised + Duration::from_secs(12)).elapsed().as_secs_f64();
    let per_second = relayed as f64 / late;
    println!("raised: {per_second:.1} calls/s relayed in the last {late:.1} s, {limited} answered 429");
    assert!(per_second >= 30.0, "recovered towards the 40/s offered: {per_second:.1}/s");
    assert_eq!(limited, 0);
    assert!(second.iter().rev().take(80).all(|o| o == "ok"), "the last two seconds all answered");
}
