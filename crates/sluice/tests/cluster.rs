//! One head follower per deployment: replicas sharing a real redis-server follow the chain as
//! one. Real anvil (a block a second), counting relays in front of its HTTP and WebSocket
//! endpoints (each call of a batch counted, as a provider's meter counts them).

mod common;

use std::time::{Duration, Instant};

use common::with_config;
use serde_json::{json, Value};
use sluice_testkit::{metric, quantity, rpc_result, Anvil, FakeUpstream, Fault, RedisServer, Sluice, WsRelay};

/// Calls by method.
fn by_method(methods: &[String]) -> std::collections::BTreeMap<&str, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for m in methods {
        *counts.entry(m.as_str()).or_insert(0) += 1;
    }
    counts
}

fn relay_to(anvil: &Anvil) -> Fault {
    Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }
}

async fn status(client: &reqwest::Client, sluice: &Sluice) -> Value {
    client.get(format!("{}/status", sluice.http_url())).send().await.expect("status").json().await.expect("json")
}

/// This replica's part: `follower`, `reader` or `alone`.
async fn role(client: &reqwest::Client, sluice: &Sluice) -> String {
    status(client, sluice).await["chain"]["following"].as_str().unwrap_or_default().to_owned()
}

async fn head(client: &reqwest::Client, url: &str) -> u64 {
    quantity(&rpc_result(client, url, "eth_blockNumber", json!([])).await)
}

/// Waits until every replica serves a head within two blocks of the node's.
async fn all_follow(client: &reqwest::Client, anvil: &Anvil, replicas: &[&Sluice], within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let node = head(client, &anvil.http_url()).await;
        let mut behind = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            let served = status(client, r).await["chain"]["head"].as_u64().unwrap_or(0);
            if served + 2 < node {
                behind.push((i, served));
            }
        }
        if behind.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: replicas behind the node's {node}: {behind:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_sharing_redis_follow_the_chain_as_one_and_survive_the_followers_death() {
    let anvil = Anvil::spawn_with(&["--block-time", "1"]);
    let client = reqwest::Client::new();
    rpc_result(&client, &anvil.http_url(), "anvil_mine", json!(["0x20"])).await;
    let http = FakeUpstream::spawn(relay_to(&anvil)).await;
    let ws = WsRelay::start(&anvil.ws_url()).await;
    let redis = RedisServer::spawn();
    let toml = format!(
        "[cluster]\nredis_url = \"redis://127.0.0.1:{}\"\n[[upstreams]]\nurl = \"{}\"\nws_url = \"{}\"\n",
        redis.port, http.url, ws.url
    );
    let calls = || http.methods().len() + ws.methods().len();

    // The first replica follows and backfills the window; the next two start from it.
    let a = with_config(&toml);
    all_follow(&client, &anvil, &[&a.sluice], Duration::from_secs(20), "the first replica").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = calls();
    let (http_first, ws_first) = (http.methods().len(), ws.methods().len());
    let b = with_config(&toml);
    let c = with_config(&toml);
    let replicas = [&a.sluice, &b.sluice, &c.sluice];
    all_follow(&client, &anvil, &replicas, Duration::from_secs(20), "three replicas").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let two_more = calls() - first;
    let (h, w) = (http.methods(), ws.methods());
    let before: Vec<String> = [&h[..http_first], &w[..ws_first]].concat();
    let after: Vec<String> = [&h[http_first..], &w[ws_first..]].concat();
    eprintln!(
        "cluster: the first replica's start-up: {first} calls {:?}; two more replicas: {two_more} {:?}",
        by_method(&before),
        by_method(&after)
    );
    // The window is backfilled once (by the follower); a replica that joins checks the chain id
    // and reads its member's head and range once: each costs less than a quarter of the first.
    assert!(two_more * 2 <= first, "two more replicas cost {two_more} calls, the first alone {first}");

    let mut roles = Vec::new();
    for r in replicas {
        roles.push(role(&client, r).await);
    }
    assert_eq!(roles.iter().filter(|r| *r == "follower").count(), 1, "one follower: {roles:?}");
    assert_eq!(roles.iter().filter(|r| *r == "reader").count(), 2, "two readers: {roles:?}");

    // A quiet half minute: the three together cost what one costs (no probe, no poll).
    let (before, start) = (calls(), head(&client, &anvil.http_url()).await);
    let (http_before, ws_before) = (http.methods().len(), ws.methods().len());
    let window_start = Instant::now();
    while window_start.elapsed() < Duration::from_secs(30) {
        all_follow(&client, &anvil, &replicas, Duration::from_secs(5), "while quiet").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let blocks = head(&client, &anvil.http_url()).await - start;
    let spent = calls() - before;
    let (h, w) = (http.methods(), ws.methods());
    eprintln!(
        "cluster: three replicas, {blocks} blocks: {spent} calls ({:.2} per block) {:?}",
        spent as f64 / blocks as f64,
        by_method(&[&h[http_before..], &w[ws_before..]].concat())
    );
    assert!(blocks >= 20, "the chain moved {blocks} blocks");
    assert!(spent as f64 <= 0.2 * blocks as f64, "three replicas spent {spent} calls in {blocks} blocks");

    // kill -9 the follower: another takes over within a few seconds, and heads keep moving.
    let follower = roles.iter().position(|r| r == "follower").expect("a follower");
    let mut configured = [a, b, c];
    configured[follower].sluice.kill();
    let survivors: Vec<&Sluice> =
        configured.iter().enumerate().filter(|(i, _)| *i != follower).map(|(_, c)| &c.sluice).collect();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(15);
    loop {
        let mut now = Vec::new();
        for r in &survivors {
            now.push(role(&client, r).await);
        }
        if now.iter().filter(|r| *r == "follower").count() == 1 {
            eprintln!("cluster: a new follower {:.1} s after the kill", killed.elapsed().as_secs_f64());
            break;
        }
        assert!(Instant::now() < deadline, "no new follower 15 s after the kill: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    all_follow(&client, &anvil, &survivors, Duration::from_secs(10), "after the follower's death").await;
    let node = head(&client, &anvil.http_url()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    all_follow(&client, &anvil, &survivors, Duration::from_secs(5), "the new follower's feed").await;
    assert!(head(&client, &anvil.http_url()).await > node);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_redis_gone_every_replica_follows_by_itself() {
    let anvil = Anvil::spawn_with(&["--block-time", "1"]);
    let client = reqwest::Client::new();
    let mut redis = RedisServer::spawn();
    let toml = format!(
        "[cluster]\nredis_url = \"redis://127.0.0.1:{}\"\n[[upstreams]]\nurl = \"{}\"\n",
        redis.port,
        anvil.http_url()
    );
    let (a, b) = (with_config(&toml), with_config(&toml));
    let replicas = [&a.sluice, &b.sluice];
    all_follow(&client, &anvil, &replicas, Duration::from_secs(20), "two replicas").await;
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ra, rb) = (role(&client, &a.sluice).await, role(&client, &b.sluice).await);
        if ra == "alone" && rb == "alone" {
            break;
        }
        assert!(Instant::now() < deadline, "still {ra} and {rb} 10 s after Redis went");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each follows the chain by itself.
    let node = head(&client, &anvil.http_url()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    all_follow(&client, &anvil, &replicas, Duration::from_secs(10), "alone").await;
    assert!(head(&client, &anvil.http_url()).await > node);
    for r in replicas {
        let fallbacks = metric(&client, &r.http_url(), "sluice_head_share_fallbacks_total{network=\"default\"}").await;
        assert!(fallbacks.is_some_and(|n| n >= 1.0), "counted: {fallbacks:?}");
    }
}

/// The lease in Redis, as `redis-cli` reads it (`None`: nobody holds it).
fn lease(redis: &RedisServer) -> Option<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "--raw", "GET", "sluice:heads:{default}:lease"])
        .output()
        .expect("redis-cli runs");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_stopped_gracefully_hands_the_lease_over_at_once() {
    let anvil = Anvil::spawn_with(&["--block-time", "1"]);
    let client = reqwest::Client::new();
    let redis = RedisServer::spawn();
    let toml = format!(
        "[cluster]\nredis_url = \"redis://127.0.0.1:{}\"\n[[upstreams]]\nurl = \"{}\"\n",
        redis.port,
        anvil.http_url()
    );
    let mut replicas = [with_config(&toml), with_config(&toml)];
    all_follow(&client, &anvil, &[&replicas[0].sluice, &replicas[1].sluice], Duration::from_secs(20), "two").await;
    let mut roles = Vec::new();
    for r in &replicas {
        roles.push(role(&client, &r.sluice).await);
    }
    let follower = roles.iter().position(|r| r == "follower").unwrap_or_else(|| panic!("a follower: {roles:?}"));
    // The lease names its holder by process id.
    let pid = replicas[follower].sluice.pid();
    let held = lease(&redis).expect("the follower holds the lease");
    assert!(held.starts_with(&format!("{pid}-")), "{held} is not held by {pid}");
    // SIGTERM, as a rolling restart stops a pod: once it has exited, its lease is gone (or
    // already the other replica's), not left to lapse for up to 5 s.
    replicas[follower].sluice.terminate();
    assert!(replicas[follower].sluice.wait_exit(Duration::from_secs(20)).is_some(), "the follower exited");
    let after = lease(&redis);
    assert!(after.as_ref().is_none_or(|h| !h.starts_with(&format!("{pid}-"))), "still held by {pid}: {after:?}");
    let other = &replicas[1 - follower].sluice;
    let exited = Instant::now();
    let deadline = exited + Duration::from_secs(10);
    while role(&client, other).await != "follower" {
        assert!(Instant::now() < deadline, "the other replica did not take over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("cluster: the other replica follows {:.1} s after a graceful stop", exited.elapsed().as_secs_f64());
}
