//! Several upstreams behind one sluice: failover, no retries for the request's own faults,
//! lagging nodes kept away from head reads, transactions to every node, and /status.
//! Real anvil nodes; relays (fault-injecting fakes, here only counting) where calls are counted.

mod common;

use std::time::{Duration, Instant};

use common::{call, status, wait_status, BIN, DEV_ACCOUNT, DEV_KEY};
use serde_json::{json, Value};
use sluice_testkit::{foundry_tool, post, rpc_result, Anvil, FakeUpstream, Fault, Sluice};

/// sluice in front of `upstreams`, cache off (every call goes upstream), mempool off (it
/// would make calls of its own), quick breaker.
fn pool(upstreams: &[&str], extra_env: &[(&str, &str)]) -> Sluice {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    for u in upstreams {
        args.extend(["--upstream", u]);
    }
    let mut env = vec![
        ("SLUICE_CACHE__ENABLED", "false"),
        ("SLUICE_MEMPOOL__ENABLED", "false"),
        ("SLUICE_POOL__BREAKER_COOLDOWN", "300ms"),
        ("SLUICE_POOL__PROBE_INTERVAL", "100ms"),
    ];
    env.extend_from_slice(extra_env);
    Sluice::spawn_env(BIN, &args, &env)
}

fn relay(to: &Anvil) -> Fault {
    Fault::Relay { to: to.http_url(), delay: Duration::ZERO, fail_method: None }
}

#[tokio::test]
async fn killing_an_upstream_under_load_costs_no_client_errors_and_it_rejoins() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let a_port = a.port;
    let sluice = pool(&[&a.http_url(), &b.http_url()], &[]);
    let client = reqwest::Client::new();
    wait_status(&client, &sluice, "both heads known", |s| s["upstreams"][1]["head"].is_u64()).await;
    let body = call(json!(1), "eth_getBalance", &json!([DEV_ACCOUNT, "0x0"]));
    let expected = post(&client, &b.http_url(), body.to_string()).await.1;
    let mut a = Some(a);
    let url = sluice.http_url();
    let mut errors = Vec::new();
    for round in 0..50 {
        if round == 10 {
            drop(a.take()); // kill upstream A mid-load
        }
        let answers = futures_util::future::join_all((0..8).map(|_| post(&client, &url, body.to_string()))).await;
        errors.extend(answers.into_iter().filter(|(status, answer)| *status != 200 || answer != &expected));
    }
    assert!(errors.is_empty(), "{} client-visible errors, e.g. {:?}", errors.len(), errors.first());
    let s = wait_status(&client, &sluice, "a's circuit opens", |s| s["upstreams"][0]["circuit"] != "closed").await;
    assert_eq!(s["upstreams"][1]["circuit"], "closed");
    // Bring A back on its port: the prober's half-open probe closes its circuit.
    let _a = Anvil::spawn_on(a_port, &[]);
    wait_status(&client, &sluice, "a rejoins", |s| s["upstreams"][0]["circuit"] == "closed").await;
}

// Relays run on this runtime while sluice starts: give them threads of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_own_errors_come_back_at_once_after_one_call() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let (ra, rb) = (FakeUpstream::spawn(relay(&a)).await, FakeUpstream::spawn(relay(&b)).await);
    let sluice = pool(&[&ra.url, &rb.url], &[]);
    let client = reqwest::Client::new();
    // A call that reverts (calldata to the zero address with value it does not have is fine to
    // use: a call from an empty account paying value fails).
    let reverting = call(
        json!(1),
        "eth_call",
        &json!([{"from": "0x0000000000000000000000000000000000000001", "to": DEV_ACCOUNT, "value": "0xffffffffffffffffffffffff"}, "0x0"]),
    );
    let invalid = call(json!(2), "eth_getBalance", &json!(["not-an-address", "0x0"]));
    for (body, method) in [(reverting, "eth_call"), (invalid, "eth_getBalance")] {
        let direct = post(&client, &a.http_url(), body.to_string()).await.1;
        assert!(direct.get("error").is_some(), "{direct}");
        let before = ra.requests_for(method) + rb.requests_for(method);
        let (_, via) = post(&client, &sluice.http_url(), body.to_string()).await;
        assert_eq!(via, direct, "unchanged error");
        assert_eq!(
            ra.requests_for(method) + rb.requests_for(method) - before,
            1,
            "{method}: exactly one upstream call"
        );
    }
}

// Relays run on this runtime while sluice starts: give them threads of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_upstream_is_not_used_for_latest_reads() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let (ra, rb) = (FakeUpstream::spawn(relay(&a)).await, FakeUpstream::spawn(relay(&b)).await);
    rpc_result(&reqwest::Client::new(), &a.http_url(), "anvil_mine", json!(["0xa"])).await;
    let sluice = pool(&[&ra.url, &rb.url], &[("SLUICE_POOL__MAX_LAG", "2")]);
    let client = reqwest::Client::new();
    wait_status(&client, &sluice, "b seen 10 behind", |s| s["upstreams"][1]["lag"] == 10).await;
    let before_b = rb.requests_for("eth_getBalance");
    for _ in 0..30 {
        let (_, answer) = post(
            &client,
            &sluice.http_url(),
            call(json!(1), "eth_getBalance", &json!([DEV_ACCOUNT, "latest"])).to_string(),
        )
        .await;
        assert!(answer["result"].is_string(), "{answer}");
    }
    assert_eq!(rb.requests_for("eth_getBalance"), before_b, "no latest read went to the lagging upstream");
    assert!(ra.requests_for("eth_getBalance") >= 30);
}

#[tokio::test]
async fn transactions_go_to_every_upstream_and_already_imported_counts_as_accepted() {
    let (a, b) = (Anvil::spawn_with(&["--no-mining"]), Anvil::spawn_with(&["--no-mining"]));
    let sluice = pool(&[&a.http_url(), &b.http_url()], &[]);
    let client = reqwest::Client::new();
    let out = std::process::Command::new(foundry_tool("cast"))
        .args([
            "mktx",
            "--private-key",
            DEV_KEY,
            "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
            "--value",
            "1",
            "--nonce",
            "0",
        ])
        .args([
            "--chain",
            "31337",
            "--gas-limit",
            "21000",
            "--gas-price",
            "2000000000",
            "--priority-gas-price",
            "1000000000",
        ])
        .args(["--rpc-url", &a.http_url()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let raw = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let send = call(json!(1), "eth_sendRawTransaction", &json!([raw]));
    let (_, first) = post(&client, &sluice.http_url(), send.to_string()).await;
    let hash = first["result"].as_str().unwrap_or_else(|| panic!("{first}")).to_owned();
    for node in [&a, &b] {
        let tx = rpc_result(&client, &node.http_url(), "eth_getTransactionByHash", json!([hash])).await;
        assert_eq!(tx["hash"], hash.as_str(), "in every upstream's pool");
    }
    // Both nodes now answer "transaction already imported": still a success, with the hash.
    let (_, again) = post(&client, &sluice.http_url(), send.to_string()).await;
    assert_eq!(again["result"], hash.as_str(), "{again}");
}

#[tokio::test]
async fn status_lists_every_upstream_and_wrong_chains_are_refused() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let sluice = pool(&[&a.http_url(), &b.http_url()], &[]);
    let client = reqwest::Client::new();
    let every_head_known =
        |s: &Value| s["upstreams"].as_array().is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["head"].is_u64()));
    let s = wait_status(&client, &sluice, "every head known", every_head_known).await;
    let members = s["upstreams"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    for (i, m) in members.iter().enumerate() {
        assert_eq!(m["name"], format!("upstream-{i}"));
        assert_eq!(m["circuit"], "closed");
        assert_eq!(m["lag"], 0);
    }
    let other_chain = Anvil::spawn_with(&["--chain-id", "5"]);
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", &a.http_url(), "--upstream", &other_chain.http_url()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upstream-1 is on chain") && stderr.contains("refusing"), "{stderr}");
}

/// sluice from a TOML config (per-upstream settings need the file), cache and mempool off.
fn pool_from(toml: &str) -> (Sluice, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("[cache]\nenabled = false\n[mempool]\nenabled = false\n{toml}")).unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", file.path().to_str().unwrap()];
    (Sluice::spawn(BIN, &args), file)
}

fn slow_relay(to: &Anvil, delay_ms: u64) -> Fault {
    Fault::Relay { to: to.http_url(), delay: Duration::from_millis(delay_ms), fail_method: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_primary_is_hedged_to_a_fast_fallback_within_the_cap() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let (slow, fast) = (FakeUpstream::spawn(slow_relay(&a, 300)).await, FakeUpstream::spawn(slow_relay(&b, 0)).await);
    let upstreams =
        format!("[[upstreams]]\nurl = \"{}\"\ntier = 0\n[[upstreams]]\nurl = \"{}\"\ntier = 1\n", slow.url, fast.url);
    let client = reqwest::Client::new();
    let body = call(json!(1), "eth_getBalance", &json!([DEV_ACCOUNT, "0x0"])).to_string();

    // Every call may hedge: each one ends near the fast upstream's latency, not the slow one's.
    let (sluice, _f) = pool_from(&format!("[pool]\nhedge = \"50ms\"\nhedge_max_extra = 1.0\n{upstreams}"));
    for _ in 0..10 {
        let started = Instant::now();
        let (_, answer) = post(&client, &sluice.http_url(), body.clone()).await;
        assert!(answer["result"].is_string(), "{answer}");
        assert!(started.elapsed() < Duration::from_millis(250), "hedged call took {:?}", started.elapsed());
    }
    drop(sluice);

    // A 20 % cap: of 50 slow calls, at most 10 (the burst) + 20 % are hedged.
    let before = fast.requests_for("eth_getBalance");
    let (sluice, _f) = pool_from(&format!("[pool]\nhedge = \"20ms\"\nhedge_max_extra = 0.2\n{upstreams}"));
    let url = sluice.http_url();
    // Distinct calls: identical ones in flight would share one upstream call.
    let bodies: Vec<String> = (0..50)
        .map(|i| call(json!(i), "eth_getBalance", &json!([format!("0x{:040x}", 0x100 + i), "0x0"])).to_string())
        .collect();
    futures_util::future::join_all(bodies.iter().map(|b| post(&client, &url, b.clone()))).await;
    let hedges = fast.requests_for("eth_getBalance") - before;
    assert!(hedges <= 10, "{hedges} hedges for 50 calls with a 20 % cap");
    assert!(hedges >= 1, "some calls were hedged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_are_never_exceeded_and_beyond_them_callers_get_32005() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let (ra, rb) = (FakeUpstream::spawn(relay(&a)).await, FakeUpstream::spawn(relay(&b)).await);
    let client = reqwest::Client::new();
    let body = call(json!(1), "eth_getBalance", &json!([DEV_ACCOUNT, "0x0"])).to_string();

    // Daily quotas of 3 and 2: five calls succeed, then -32005, and the relays saw exactly five.
    let (sluice, _f) = pool_from(&format!(
        "[[upstreams]]\nurl = \"{}\"\ndaily_quota = 3\n[[upstreams]]\nurl = \"{}\"\ndaily_quota = 2\n",
        ra.url, rb.url
    ));
    let mut ok = 0;
    for _ in 0..8 {
        let (_, answer) = post(&client, &sluice.http_url(), body.clone()).await;
        if answer["result"].is_string() {
            ok += 1;
        } else {
            assert_eq!(answer["error"]["code"], -32005, "{answer}");
            assert_eq!(answer["error"]["data"]["reason"], "budget_exhausted");
        }
    }
    assert_eq!(ok, 5);
    assert_eq!(ra.requests_for("eth_getBalance"), 3);
    assert_eq!(rb.requests_for("eth_getBalance"), 2);
    let s = status(&client, &sluice).await;
    assert_eq!(s["upstreams"][0]["daily_quota_left"], 0);
    drop(sluice);

    // A rate of 5/s each: over about a second of hammering, each relay sees at most 5/s + the
    // burst. Calls wait up to 200 ms for their turn (the queue), then are refused.
    let (sluice, _f) = pool_from(&format!(
        "[pool]\nbudget_wait = \"200ms\"\n[[upstreams]]\nurl = \"{}\"\nrate = 5\n[[upstreams]]\nurl = \"{}\"\nrate = 5\n",
        ra.url, rb.url
    ));
    let (before_a, before_b) = (ra.requests_for("eth_getBalance"), rb.requests_for("eth_getBalance"));
    let started = Instant::now();
    // Twenty callers at once (asking for different accounts: identical calls would be joined),
    // so that the queue fills.
    let (client, url) = (&client, sluice.http_url());
    let callers = (0..20).map(|i| {
        let url = url.clone();
        async move {
            let body = call(json!(1), "eth_getBalance", &json!([format!("0x{:040x}", 0x100 + i), "0x0"])).to_string();
            let mut limited = 0;
            while started.elapsed() < Duration::from_secs(1) {
                let (_, answer) = post(client, &url, body.clone()).await;
                limited += (answer["error"]["code"] == -32005) as usize;
            }
            limited
        }
    });
    let limited: usize = futures_util::future::join_all(callers).await.into_iter().sum();
    let allowed = 5.0 * started.elapsed().as_secs_f64() + 5.0 + 1.0;
    for (relay, before) in [(&ra, before_a), (&rb, before_b)] {
        let seen = (relay.requests_for("eth_getBalance") - before) as f64;
        assert!(seen <= allowed, "{seen} calls in {:?} against a 5/s budget", started.elapsed());
    }
    assert!(limited > 0, "callers beyond the budget were told so");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_filters_route_calls_away_from_upstreams_that_exclude_them() {
    let (a, b) = (Anvil::spawn(), Anvil::spawn());
    let (ra, rb) = (FakeUpstream::spawn(relay(&a)).await, FakeUpstream::spawn(relay(&b)).await);
    let (sluice, _f) = pool_from(&format!(
        "[[upstreams]]\nurl = \"{}\"\nexclude_methods = [\"eth_getBal*\"]\n[[upstreams]]\nurl = \"{}\"\nmethods = [\"eth_getBalance\", \"eth_blockNumber\"]\n",
        ra.url, rb.url
    ));
    let client = reqwest::Client::new();
    // The start-up chain-id check asks every upstream once; count from here.
    let (chain_a, chain_b) = (ra.requests_for("eth_chainId"), rb.requests_for("eth_chainId"));
    for _ in 0..10 {
        let (_, answer) = post(
            &client,
            &sluice.http_url(),
            call(json!(1), "eth_getBalance", &json!([DEV_ACCOUNT, "0x0"])).to_string(),
        )
        .await;
        assert!(answer["result"].is_string());
        let (_, answer) =
            post(&client, &sluice.http_url(), call(json!(2), "eth_chainId", &json!([])).to_string()).await;
        assert_eq!(answer["result"], "0x7a69");
    }
    assert_eq!(ra.requests_for("eth_getBalance"), 0);
    assert_eq!(rb.requests_for("eth_getBalance"), 10);
    assert_eq!(ra.requests_for("eth_chainId") - chain_a, 10, "only a serves eth_chainId");
    assert_eq!(rb.requests_for("eth_chainId"), chain_b);
}
