//! The finality-aware cache, against real anvil and a real redis-server.

mod common;

use std::time::{Duration, Instant};

use common::{call, wait_receipt, Net, BIN, DEV_ACCOUNT};
use serde_json::{json, Value};
use sluice_testkit::{metric, post, rpc_result, Anvil, FakeUpstream, Fault, RedisServer, Sluice};

/// Posts a body and returns (answer, x-sluice-served-by).
async fn served(client: &reqwest::Client, url: &str, body: &Value) -> (Value, String) {
    let response =
        client.post(url).header("content-type", "application/json").body(body.to_string()).send().await.unwrap();
    let by = response.headers()["x-sluice-served-by"].to_str().unwrap().to_owned();
    (response.json().await.unwrap(), by)
}

/// Waits until sluice's tracker has anvil's head: `latest` names the same block and
/// `eth_blockNumber` is answered locally with the same number.
async fn wait_head(client: &reqwest::Client, sluice: &str, anvil: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let want = rpc_result(client, anvil, "eth_getBlockByNumber", json!(["latest", false])).await;
        let (got, _) = served(client, sluice, &call(json!(1), "eth_getBlockByNumber", &json!(["latest", false]))).await;
        // Served locally means the head came from sluice's tracker, not passed through.
        let (number, number_by) = served(client, sluice, &call(json!(1), "eth_blockNumber", &json!([]))).await;
        if got["result"]["hash"] == want["hash"] && number["result"] == want["number"] && number_by == "local" {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "sluice did not follow the head within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn cached_answers_equal_anvils_and_come_from_memory_the_second_time() {
    let net = Net::start(&[]).await;
    wait_head(&net.client, &net.sluice.http_url(), &net.anvil.http_url(), Duration::from_secs(5)).await;
    let mut from_memory = 0;
    for round in 0..2 {
        for (i, (method, params)) in net.corpus().iter().enumerate() {
            if params[0] == "pending" {
                continue; // anvil stamps its pending block with the current time
            }
            let body = call(json!(i), method, params);
            let (via, by) = served(&net.client, &net.sluice.http_url(), &body).await;
            let direct = post(&net.client, &net.anvil.http_url(), body.to_string()).await.1;
            assert_eq!(via, direct, "round {round}: {method} {params}");
            if round == 1 && by == "cache-memory" {
                from_memory += 1;
            }
        }
    }
    assert!(from_memory >= 15, "only {from_memory} second-round answers came from memory");
    let (_, by) = served(&net.client, &net.sluice.http_url(), &call(json!(1), "eth_blockNumber", &json!([]))).await;
    assert_eq!(by, "local", "eth_blockNumber comes from the head tracker");
}

#[tokio::test]
async fn a_new_head_shows_within_500_ms_without_any_ttl() {
    let net = Net::start(&[]).await;
    let (sluice, anvil) = (net.sluice.http_url(), net.anvil.http_url());
    wait_head(&net.client, &sluice, &anvil, Duration::from_secs(5)).await;
    for _ in 0..5 {
        // Warm the cache with the current head, then mine.
        served(&net.client, &sluice, &call(json!(1), "eth_getBlockByNumber", &json!(["latest", false]))).await;
        rpc_result(&net.client, &anvil, "evm_mine", json!([])).await;
        let took = wait_head(&net.client, &sluice, &anvil, Duration::from_millis(500)).await;
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}

#[tokio::test]
async fn no_stale_answer_after_a_reorg() {
    let net = Net::start(&[]).await;
    let (sluice, anvil) = (net.sluice.http_url(), net.anvil.http_url());
    // The tracker follows (and gap-fills) from its first head on; make the blocks after it.
    wait_head(&net.client, &sluice, &anvil, Duration::from_secs(5)).await;
    let receiver = "0x000000000000000000000000000000000000beef";
    let tx = rpc_result(
        &net.client,
        &anvil,
        "eth_sendTransaction",
        json!([{"from": DEV_ACCOUNT, "to": receiver, "value": "0x1234"}]),
    )
    .await;
    let receipt = wait_receipt(&net.client, &anvil, tx.as_str().unwrap()).await;
    let block = receipt["blockNumber"].as_str().unwrap().to_owned();
    rpc_result(&net.client, &anvil, "evm_mine", json!([])).await;
    wait_head(&net.client, &sluice, &anvil, Duration::from_secs(5)).await;
    // Read (and cache) unfinalized blocks, balances and logs from the fork that will be lost.
    let reads = [
        call(json!(1), "eth_getBlockByNumber", &json!([block, true])),
        call(json!(2), "eth_getBlockByNumber", &json!(["latest", false])),
        call(json!(3), "eth_getBalance", &json!([receiver, "latest"])),
        call(json!(4), "eth_getBalance", &json!([receiver, block])),
        call(json!(5), "eth_getLogs", &json!([{"fromBlock": "0x0", "toBlock": "latest"}])),
        call(json!(6), "eth_getTransactionCount", &json!([DEV_ACCOUNT, "latest"])),
        call(json!(7), "eth_getBlockTransactionCountByNumber", &json!([block])),
        call(json!(8), "eth_blockNumber", &json!([])),
    ];
    for read in &reads {
        served(&net.client, &sluice, read).await;
        let (_, by) = served(&net.client, &sluice, read).await;
        assert!(by == "cache-memory" || by == "local", "{read}: {by}");
    }
    let before = served(&net.client, &sluice, &reads[2]).await.0;
    assert_eq!(before["result"], "0x1234");
    // Replace the last three blocks with empty ones: the transfer and the deploy's log vanish.
    rpc_result(&net.client, &anvil, "anvil_reorg", json!([3, []])).await;
    wait_head(&net.client, &sluice, &anvil, Duration::from_secs(5)).await;
    for read in &reads {
        let (via, _) = served(&net.client, &sluice, read).await;
        let direct = post(&net.client, &anvil, read.to_string()).await.1;
        assert_eq!(via, direct, "stale answer after the reorg for {read}");
    }
    assert_eq!(served(&net.client, &sluice, &reads[2]).await.0["result"], "0x0");
    let reorgs = metric(&net.client, &sluice, r#"sluice_chain_reorgs_total{network="default"} "#).await;
    assert!(reorgs >= Some(1.0), "{reorgs:?}");
}

// The relay runs on this runtime while sluice starts: give it threads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_misses_make_one_upstream_call() {
    let anvil = Anvil::spawn();
    let relay = FakeUpstream::spawn(Fault::Relay {
        to: anvil.http_url(),
        delay: Duration::from_millis(300),
        fail_method: None,
    })
    .await;
    let sluice = Sluice::serve(BIN, &relay.url, &[]);
    let client = reqwest::Client::builder().pool_max_idle_per_host(1000).build().unwrap();
    wait_head(&client, &sluice.http_url(), &anvil.http_url(), Duration::from_secs(10)).await;
    let body = call(json!("same"), "eth_getBalance", &json!([DEV_ACCOUNT, "latest"]));
    let expected = post(&client, &anvil.http_url(), body.to_string()).await.1;
    let before = relay.requests_for("eth_getBalance");
    let url = sluice.http_url();
    let answers = futures_util::future::join_all((0..1000).map(|_| served(&client, &url, &body))).await;
    assert_eq!(relay.requests_for("eth_getBalance") - before, 1, "exactly one upstream call");
    let count = |who: &str| answers.iter().filter(|(_, by)| by == who).count();
    for (answer, _) in &answers {
        assert_eq!(answer, &expected);
    }
    assert_eq!(count("upstream"), 1);
    assert_eq!(count("coalesced") + count("cache-memory"), 999);
    assert!(count("coalesced") > 0);
}

// The relay runs on this runtime while sluice starts: give it threads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_of_a_failed_leader_get_a_clear_error() {
    let anvil = Anvil::spawn();
    let fail = Some("eth_getBlockByHash");
    let relay = FakeUpstream::spawn(Fault::Relay {
        to: anvil.http_url(),
        delay: Duration::from_millis(200),
        fail_method: fail,
    })
    .await;
    let sluice = Sluice::serve(BIN, &relay.url, &["--log", "error"]);
    let client = reqwest::Client::new();
    let body = call(json!(3), "eth_getBlockByHash", &json!([format!("0x{}", "ab".repeat(32)), false]));
    let url = sluice.http_url();
    let answers = futures_util::future::join_all((0..100).map(|_| served(&client, &url, &body))).await;
    for (answer, _) in &answers {
        assert_eq!(answer["id"], 3);
        assert_eq!(answer["error"]["code"], -32002, "{answer}");
        assert_eq!(answer["error"]["data"]["reason"], "http_status");
    }
    assert!(relay.requests_for("eth_getBlockByHash") < 10, "coalesced even when failing");
}

#[tokio::test]
async fn replicas_share_the_redis_tier_and_survive_its_death() {
    let anvil = Anvil::spawn();
    let mut redis = RedisServer::spawn();
    let env = [("SLUICE_CACHE__REDIS__URL", redis.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()];
    let (a, b) = (Sluice::spawn_env(BIN, &args, &env), Sluice::spawn_env(BIN, &args, &env));
    let client = reqwest::Client::new();
    for _ in 0..5 {
        rpc_result(&client, &anvil.http_url(), "evm_mine", json!([])).await;
    }
    wait_head(&client, &a.http_url(), &anvil.http_url(), Duration::from_secs(5)).await;
    wait_head(&client, &b.http_url(), &anvil.http_url(), Duration::from_secs(5)).await;
    let body = call(
        json!(1),
        "eth_getBlockByHash",
        &json!([
            rpc_result(&client, &anvil.http_url(), "eth_getBlockByNumber", json!(["0x2", false])).await["hash"],
            true
        ]),
    );
    let (first, by) = served(&client, &a.http_url(), &body).await;
    assert_eq!(by, "upstream");
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis.dbsize() == 0 {
        assert!(Instant::now() < deadline, "replica a never wrote to redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (second, by) = served(&client, &b.http_url(), &body).await;
    assert_eq!((second, by.as_str()), (first, "cache-redis"), "a miss filled by a is a redis hit for b");

    // Kill Redis in the middle of a stream of reads across many keys: no client sees an error.
    let reads: Vec<Value> = (0..400)
        .map(|i| {
            call(json!(i), "eth_getBalance", &json!([format!("0x{:040x}", i % 200 + 1), format!("0x{:x}", i % 5 + 1)]))
        })
        .collect();
    let stream = async {
        let mut errors = 0;
        for chunk in reads.chunks(16) {
            let answers = futures_util::future::join_all(chunk.iter().enumerate().map(|(i, r)| {
                let target = if i % 2 == 0 { a.http_url() } else { b.http_url() };
                let client = client.clone();
                async move { served(&client, &target, r).await.0 }
            }))
            .await;
            errors += answers.iter().filter(|a| a.get("error").is_some() || a["result"] != "0x0").count();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        errors
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.kill();
    };
    let (errors, ()) = tokio::join!(stream, killer);
    assert_eq!(errors, 0, "client errors while redis died");
    let redis_errors = metric(&client, &a.http_url(), "sluice_cache_redis_errors_total ").await.unwrap_or(0.0)
        + metric(&client, &b.http_url(), "sluice_cache_redis_errors_total ").await.unwrap_or(0.0);
    assert!(redis_errors > 0.0, "the outage was counted");
}

/// Init code of a contract whose runtime returns as many (zero) bytes as the first calldata word.
const BIG_ANSWER_INIT: &str = "6006600c60003960066000f36000356000f3";

#[tokio::test]
async fn the_memory_bound_holds_under_large_answers() {
    let anvil = Anvil::spawn();
    let client = reqwest::Client::new();
    let tx = rpc_result(
        &client,
        &anvil.http_url(),
        "eth_sendTransaction",
        json!([{"from": DEV_ACCOUNT, "data": format!("0x{BIG_ANSWER_INIT}")}]),
    )
    .await;
    let contract = wait_receipt(&client, &anvil.http_url(), tx.as_str().unwrap()).await["contractAddress"].clone();
    let limit = 1u64 << 20;
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()];
    let sluice = Sluice::spawn_env(BIN, &args, &[("SLUICE_CACHE__MEMORY_BYTES", &limit.to_string())]);
    wait_head(&client, &sluice.http_url(), &anvil.http_url(), Duration::from_secs(5)).await;
    // 60 distinct answers of ~200 KB of hex each: 12 MB through a 1 MiB cache.
    for i in 0..60u64 {
        let size = 100_000 + i;
        let body = call(json!(i), "eth_call", &json!([{"to": contract, "data": format!("0x{size:064x}")}, "latest"]));
        let (answer, _) = served(&client, &sluice.http_url(), &body).await;
        assert_eq!(answer["result"].as_str().unwrap().len(), 2 + 2 * size as usize);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await; // the gauge is refreshed every second
    let bytes = metric(&client, &sluice.http_url(), "sluice_cache_bytes{network=\"default\"} ").await.expect("gauge");
    assert!(bytes > 0.0 && bytes <= limit as f64, "{bytes} bytes cached, limit {limit}");
    let evicted = metric(&client, &sluice.http_url(), r#"sluice_cache_evictions_total{cause="size"} "#).await;
    assert!(evicted > Some(0.0), "{evicted:?}");
}
