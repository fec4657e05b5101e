//! Health, readiness, metrics, response headers, graceful shutdown, config validation, `sluice dev`.

mod common;

use std::time::{Duration, Instant};

use common::{Net, BIN};
use serde_json::json;
use sluice_testkit::{free_port, metric, post, FakeUpstream, Fault, Sluice};

#[tokio::test]
async fn health_ready_and_metrics() {
    let net = Net::start(&[]).await;
    let base = net.sluice.http_url();
    let get = |path: &str| net.client.get(format!("{base}{path}")).send();
    assert_eq!(get("/health").await.unwrap().status(), 200);
    assert_eq!(get("/ready").await.unwrap().status(), 200);
    assert_eq!(get("/").await.unwrap().status(), 405, "GET without upgrade");
    post(&net.client, &base, r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#).await;
    post(&net.client, &base, "{").await;
    let ok =
        metric(&net.client, &base, r#"sluice_requests_total{network="default",method="eth_chainId",outcome="ok"} "#)
            .await;
    assert!(ok >= Some(1.0), "{ok:?}");
    let bad =
        metric(&net.client, &base, r#"sluice_requests_total{network="default",method="none",outcome="parse_error"} "#)
            .await;
    assert_eq!(bad, Some(1.0));
    let upstream = metric(
        &net.client,
        &base,
        r#"sluice_upstream_calls_total{network="default",upstream="upstream-0",outcome="ok"} "#,
    )
    .await;
    assert!(upstream >= Some(2.0), "{upstream:?}"); // the call above and the readiness probe
    assert!(
        metric(&net.client, &base, r#"sluice_request_duration_seconds_count{transport="http"} "#).await >= Some(2.0)
    );
    assert_eq!(metric(&net.client, &base, r#"sluice_requests_in_flight{transport="http"} "#).await, Some(0.0));

    let dead = Sluice::serve(BIN, &format!("http://127.0.0.1:{}", free_port()), &["--log", "error"]);
    let status = net.client.get(format!("{}/ready", dead.http_url())).send().await.unwrap().status();
    assert_eq!(status, 503);
}

#[tokio::test]
async fn headers_say_what_served_and_carry_a_request_id() {
    let net = Net::start(&[]).await;
    let send = |body: &'static str, id: Option<&'static str>| {
        let mut request = net.client.post(net.sluice.http_url()).body(body);
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        request.send()
    };
    // `pending` reads are never cached, so they always go upstream.
    let upstream_only = r#"{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","pending"]}"#;
    let r = send(upstream_only, Some("trace-42")).await.unwrap();
    assert_eq!(r.headers()["x-sluice-served-by"], "upstream");
    assert_eq!(r.headers()["x-request-id"], "trace-42");
    let r = send("{", None).await.unwrap();
    assert_eq!(r.headers()["x-sluice-served-by"], "local");
    assert!(!r.headers()["x-request-id"].is_empty());
    let r = send(r#"[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","pending"]},2]"#, None)
        .await
        .unwrap();
    assert_eq!(r.headers()["x-sluice-served-by"], "mixed");
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_then_exits() {
    drains_in_flight_requests_then_exits("3").await;
}

/// The same without lanes: connections served on the shared runtime (`[limits] lanes = 0`).
#[tokio::test]
async fn sigterm_drains_in_flight_requests_then_exits_without_lanes() {
    drains_in_flight_requests_then_exits("0").await;
}

async fn drains_in_flight_requests_then_exits(lanes: &str) {
    let fake = FakeUpstream::spawn(Fault::Slow(Duration::from_millis(800))).await;
    // Cache and mempool off: the fake upstream should see only the request under test.
    let args = ["serve", "--listen", "127.0.0.1:0", "--upstream", &fake.url];
    let env =
        [("SLUICE_CACHE__ENABLED", "false"), ("SLUICE_MEMPOOL__ENABLED", "false"), ("SLUICE_LIMITS__LANES", lanes)];
    let mut sluice = Sluice::spawn_env(BIN, &args, &env);
    let client = reqwest::Client::new();
    let url = sluice.http_url();
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move { post(&client, &url, r#"{"jsonrpc":"2.0","id":5,"method":"eth_chainId"}"#).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.requests_for("eth_chainId"), 1, "the request reached the upstream");
    let started = Instant::now();
    sluice.terminate();
    let (status, answer) = in_flight.await.unwrap();
    assert_eq!((status, answer), (200, json!({"jsonrpc": "2.0", "id": 5, "result": "0x1"})));
    let exit = tokio::task::spawn_blocking(move || {
        let exit = sluice.wait_exit(Duration::from_secs(5));
        (exit, sluice)
    });
    let (exit, sluice) = exit.await.unwrap();
    assert!(exit.expect("exited").success());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(std::net::TcpStream::connect(&sluice.addr).is_err(), "no longer listening");
}

#[tokio::test]
async fn sigterm_closes_websocket_sessions_with_1001_then_exits() {
    let anvil = sluice_testkit::Anvil::spawn();
    let env = [("SLUICE_LIMITS__DRAIN_DELAY", "0s")];
    let mut sluice =
        Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env);
    // One session subscribed, one that has only made a call, one that has done nothing.
    let mut subscribed = common::ws::connect(&sluice.ws_url()).await;
    common::ws::subscribe(&mut subscribed, 1, json!(["newHeads"])).await;
    let mut called = common::ws::connect(&sluice.ws_url()).await;
    common::ws::send(&mut called, json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})).await;
    assert_eq!(common::ws::next(&mut called).await["result"], "0x7a69");
    let mut idle = common::ws::connect(&sluice.ws_url()).await;
    sluice.terminate();
    for ws in [&mut subscribed, &mut called, &mut idle] {
        let (code, reason) = common::ws::closed(ws, Duration::from_secs(10)).await;
        assert_eq!((code, reason.as_str()), (1001, "server shutting down"));
    }
    let exit = tokio::task::spawn_blocking(move || sluice.wait_exit(Duration::from_secs(10))).await.unwrap();
    assert!(exit.expect("exited").success());
}

#[tokio::test]
async fn on_sigterm_ready_turns_503_while_requests_are_still_served() {
    let anvil = sluice_testkit::Anvil::spawn();
    // Long enough that a busy CI machine (a signal, a `kill` to spawn, requests on 2 loaded
    // cores) still sees the drain well inside it; CI once missed a 1 s window.
    let delay = Duration::from_secs(5);
    let env = [("SLUICE_LIMITS__DRAIN_DELAY", "5s")];
    let mut sluice =
        Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env);
    let client = reqwest::Client::new();
    let base = sluice.http_url();
    let last = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(0));
    let status = |path: &'static str| {
        let (client, base, last) = (client.clone(), base.clone(), last.clone());
        async move {
            let code = client.get(format!("{base}{path}")).send().await.map(|r| r.status().as_u16()).unwrap_or(0);
            last.store(code, std::sync::atomic::Ordering::Relaxed);
            code
        }
    };
    common::eventually(Duration::from_secs(5), "ready before the signal", || async { status("/ready").await == 200 })
        .await;
    let started = Instant::now();
    sluice.terminate();
    let seen = tokio::time::timeout(Duration::from_secs(4), async {
        while status("/ready").await != 503 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        seen.is_ok(),
        "/ready did not turn 503 within 4 s of SIGTERM; last answer {} (0: no answer)",
        last.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Still alive and serving while load balancers catch up.
    assert_eq!(status("/health").await, 200);
    let (code, answer) = post(&client, &base, r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#).await;
    assert_eq!((code, answer["result"].as_str()), (200, Some("0x7a69")));
    assert!(started.elapsed() < delay, "all of it seen within the drain delay: {:?}", started.elapsed());
    let exit = tokio::task::spawn_blocking(move || (sluice.wait_exit(Duration::from_secs(15)), sluice)).await.unwrap();
    assert!(exit.0.expect("exited").success());
    assert!(started.elapsed() >= delay, "not before the drain delay: {:?}", started.elapsed());
}

#[test]
fn config_validate_names_the_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "listen = \"127.0.0.1:8545\"\n[[upstreams]]\nurl = \"http://127.0.0.1:8546\"\n").unwrap();
    let out = std::process::Command::new(BIN).args(["config", "validate"]).arg(&good).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[limits]\nmax_batch_len = \"many\"\n[[upstreams]]\nurl = \"http://127.0.0.1:8546\"\n")
        .unwrap();
    let out = std::process::Command::new(BIN).args(["config", "validate"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_batch_len"), "{stderr}");

    let out = std::process::Command::new(BIN).args(["serve", "--upstream", "ftp://x"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("upstreams[0].url"));
}

/// The environment Kubernetes gives every pod of a namespace holding a Service called `sluice`.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("SLUICE_PORT", "tcp://10.96.0.12:8545"),
    ("SLUICE_PORT_8545_TCP", "tcp://10.96.0.12:8545"),
    ("SLUICE_PORT_8545_TCP_ADDR", "10.96.0.12"),
    ("SLUICE_PORT_8545_TCP_PORT", "8545"),
    ("SLUICE_PORT_8545_TCP_PROTO", "tcp"),
    ("SLUICE_SERVICE_HOST", "10.96.0.12"),
    ("SLUICE_SERVICE_PORT", "8545"),
];

#[tokio::test]
async fn kubernetes_service_links_do_not_stop_sluice() {
    let anvil = sluice_testkit::Anvil::spawn();
    let mut env: Vec<(&str, &str)> = SERVICE_LINKS.to_vec();
    env.push(("SLUICE_LIMITS__MAX_BATCH_LEN", "7"));
    let sluice = Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env);
    let client = reqwest::Client::new();
    let (status, body) = post(&client, &sluice.http_url(), r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#).await;
    assert_eq!(status, 200, "{body}");
    // A variable that names a key is still read: the batch limit of 7 holds.
    let batch: Vec<serde_json::Value> =
        (0..8).map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "eth_chainId"})).collect();
    let (_, body) = post(&client, &sluice.http_url(), serde_json::to_string(&batch).unwrap()).await;
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("limit 7"), "{body}");

    // A variable naming a key with a bad value still stops it, naming the key.
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()])
        .envs(SERVICE_LINKS.iter().copied())
        .env("SLUICE_LIMITS__MAX_BATCH_LEN", "many")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(error.contains("MAX_BATCH_LEN") && !error.to_lowercase().contains("port"), "{stderr}");
    assert!(stderr.contains("ignoring environment variables that name no configuration key: SLUICE_PORT,"), "{stderr}");

    // `sluice config validate` lists what it would ignore.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, "[[upstreams]]\nurl = \"http://127.0.0.1:8546\"\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["config", "validate"])
        .arg(&file)
        .envs(SERVICE_LINKS.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "ignored environment variables (they name no configuration key): SLUICE_PORT, SLUICE_PORT_8545_TCP,"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("SLUICE_SERVICE_PORT"), "{stdout}");
}

#[tokio::test]
async fn dev_starts_anvil_serves_it_and_stops_it() {
    let anvil = sluice_testkit::foundry_tool("anvil");
    let mut dev = Sluice::spawn(BIN, &["dev", "--listen", "127.0.0.1:0", "--anvil", anvil.to_str().unwrap()]);
    let anvil_line = dev.preamble.iter().find(|l| l.starts_with("anvil devnet on")).expect("anvil line").clone();
    let anvil_port: u16 =
        anvil_line.split("127.0.0.1:").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let client = reqwest::Client::new();
    let chain = sluice_testkit::rpc_result(&client, &dev.http_url(), "eth_chainId", json!([])).await;
    assert_eq!(chain, "0x7a69");
    dev.terminate();
    let exit = tokio::task::spawn_blocking(move || dev.wait_exit(Duration::from_secs(10))).await.unwrap();
    assert!(exit.expect("sluice dev exited").success());
    assert!(std::net::TcpStream::connect(("127.0.0.1", anvil_port)).is_err(), "anvil stopped");
}

#[tokio::test]
async fn json_logs_carry_the_request_id() {
    // A node that cuts its answers short: the request's upstream call fails, and sluice warns
    // about it inside the request's span. (A node that is gone is taken out before the request
    // reaches it: its refused connection opens its circuit at once.)
    let node = FakeUpstream::spawn(Fault::Truncated).await;
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", &node.url])
        .env("SLUICE_LOG", "debug")
        .env("SLUICE_LOG_FORMAT", "json")
        .env("SLUICE_CACHE__ENABLED", "false")
        .env("SLUICE_MEMPOOL__ENABLED", "false")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let addr = std::io::BufRead::lines(stdout)
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("sluice listening on http://").map(|r| r.split_whitespace().next().unwrap().to_owned())
        })
        .expect("sluice listening");
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, mut lines_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    // The failed upstream call is logged inside the request's span.
    let client = reqwest::Client::new();
    let response = client
        .post(format!("http://{addr}"))
        .header("x-request-id", "req-json-42")
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "req-json-42");
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines_rx.recv().await {
            let entry: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            assert!(entry["timestamp"].is_string() && entry["level"].is_string(), "{line}");
            // sluice's own warning about the failed call, inside the request's span.
            let spans = entry["spans"].as_array().cloned().unwrap_or_default();
            if spans.iter().any(|s| s["request_id"] == "req-json-42") && entry["level"] == "WARN" {
                return entry;
            }
        }
        panic!("stderr closed")
    })
    .await
    .expect("a log line of the request within 10 s");
    assert!(found["target"].as_str().is_some_and(|t| t.starts_with("sluice")), "{found}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn config_dump_shows_every_layer_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(
        &file,
        r#"
[[upstreams]]
url = "https://user:pa55word@node.example/v3/0123456789abcdef0123456789abcdef"
[access]
redis_url = "redis://:hunter2hunter2@127.0.0.1:6379"
[access.keys]
sk_live_do_not_show_1 = "free"
[access.tiers.free]
[access.jwt]
[[access.jwt.keys]]
kid = "a"
algorithm = "HS256"
secret = "jwt-secret-do-not-show"
[access.admin]
listen = "127.0.0.1:8546"
token = "admin-token-do-not-show"
"#,
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["config", "dump", "--config"])
        .arg(&file)
        .args(["--listen", "127.0.0.1:9999"])
        .env("SLUICE_LIMITS__MAX_BATCH_LEN", "9")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dump = String::from_utf8_lossy(&out.stdout);
    // Every layer: the file, the environment, the flag, and the defaults.
    let parsed: toml::Value = toml::from_str(&dump).expect("the dump is TOML");
    assert_eq!(parsed["limits"]["max_batch_len"].as_integer(), Some(9), "{dump}");
    assert_eq!(parsed["listen"].as_str(), Some("127.0.0.1:9999"));
    assert_eq!(parsed["access"]["admin"]["listen"].as_str(), Some("127.0.0.1:8546"));
    assert!(parsed["cache"]["enabled"].as_bool().is_some(), "defaults are shown");
    for secret in ["pa55word", "0123456789abcdef0123456789abcdef", "hunter2", "sk_live", "jwt-secret", "admin-token"] {
        assert!(!dump.contains(secret), "{secret} shown:\n{dump}");
    }
    assert!(dump.contains("https://<redacted>:<redacted>@node.example/v3/<redacted>"), "{dump}");
}
