//! The operations kit against a real Prometheus (Debian's `prometheus`, installed by
//! `scripts/install-tools.sh`): the rules pass `promtool check rules` and their unit tests, and
//! while a sluice is under load (`sluice bench rpc`, `sluice bench ingest`, `sluice bench quic
//! load`, a mesh peer), every query of the Grafana dashboard and every recording rule returns data.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::BIN;
use serde_json::{json, Value};
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{free_port, post, rpc, workspace_root, Anvil, Sluice};

/// The dashboard's `$network` for these runs: the implicit network.
const NETWORK: &str = "default";
/// What the test puts for Grafana's `$__rate_interval`.
const RATE_INTERVAL: &str = "30s";

fn deploy() -> PathBuf {
    workspace_root().join("deploy")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy().join("prometheus"))
        .output()
        .expect("promtool runs (Debian package prometheus; scripts/install-tools.sh installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_rules_are_valid_and_their_alerts_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", "sluice.rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "tests/alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// A Prometheus process scraping one target every second, with sluice's rules loaded.
struct Prometheus {
    child: Child,
    url: String,
    _data: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let data = tempfile::tempdir().unwrap();
        let rules = deploy().join("prometheus/sluice.rules.yml");
        let config = data.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.path().join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts (Debian package prometheus; scripts/install-tools.sh installs it)");
        Prometheus { child, url: format!("http://127.0.0.1:{port}"), _data: data }
    }

    /// An instant query's result vector (empty when it returned nothing), or the error it got.
    async fn query(&self, http: &reqwest::Client, expr: &str) -> Result<Vec<Value>, String> {
        let answer = http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = answer.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{body}"));
        }
        Ok(body["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    async fn rules(&self, http: &reqwest::Client) -> Vec<Value> {
        let body: Value = http.get(format!("{}/api/v1/rules", self.url)).send().await.unwrap().json().await.unwrap();
        body["data"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap().clone()).collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every query of the dashboard, with Grafana's variables put in.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy().join("grafana/sluice.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let expr = expr.replace("$network", NETWORK).replace("$__rate_interval", RATE_INTERVAL);
            out.push((format!("{} / {}", panel["title"].as_str().unwrap(), target["refId"]), expr));
        }
    }
    out
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `sluice bench …` as a child process, its output kept for the failure message.
fn bench(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice bench starts")
}

/// Stops the load generators; answers what they printed.
fn stop(load: Vec<Child>) -> String {
    let mut printed = String::new();
    for mut child in load {
        let _ = child.kill();
        if let Ok(out) = child.wait_with_output() {
            printed += &String::from_utf8_lossy(&out.stdout);
            printed += &String::from_utf8_lossy(&out.stderr);
        }
    }
    printed
}

fn the_line<'a>(sluice: &'a Sluice, prefix: &str) -> &'a str {
    sluice
        .preamble
        .iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in {:?}", sluice.preamble))
}

/// sluice with two upstreams (one with a per-second budget, one with a daily quota), the
/// anonymous access tier, Multicall3 aggregation, the QUIC ingress and the mesh on.
fn loaded_sluice(anvil: &Anvil, dir: &Path) -> (Sluice, String, String) {
    let config = dir.join("sluice.toml");
    let url = anvil.http_url();
    std::fs::write(
        &config,
        format!(
            "[[upstreams]]\nurl = \"{url}\"\nname = \"rated\"\nrate = 100000\n\n\
             [[upstreams]]\nurl = \"{url}\"\nname = \"quota\"\ndaily_quota = 100000000\n\n\
             [aggregate]\neth_call = true\n\n\
             [access]\nanonymous = \"free\"\n\n[access.keys]\n\"prometheus-test-key-0001\" = \"pro\"\n\n\
             [access.tiers.free]\n\n[access.tiers.pro]\n"
        ),
    )
    .unwrap();
    let ingress = format!("127.0.0.1:{}", free_udp_port());
    let mesh = format!("[\"/ip4/127.0.0.1/udp/{}/quic-v1\"]", free_udp_port());
    let env = [
        ("SLUICE_INGRESS__LISTEN", ingress.as_str()),
        ("SLUICE_INGRESS__KEY", &*dir.join("ingress.key").to_string_lossy()),
        ("SLUICE_MESH__LISTEN", mesh.as_str()),
        ("SLUICE_MESH__KEY", &*dir.join("a.key").to_string_lossy()),
        ("SLUICE_MEMPOOL__JOURNAL", &*dir.join("a.journal").to_string_lossy()),
    ]
    .map(|(k, v)| (k, v.to_owned()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice =
        Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", config.to_str().unwrap()], &env);
    let mesh_line = the_line(&sluice, "sluice mesh peer ");
    let mesh_address = mesh_line.split(" on ").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    (sluice, ingress, mesh_address)
}

/// A second sluice that dials the first over the mesh, so that it has a peer and messages.
fn mesh_peer(anvil: &Anvil, dir: &Path, dial: &str) -> Sluice {
    let listen = format!("[\"/ip4/127.0.0.1/udp/{}/quic-v1\"]", free_udp_port());
    let peers = format!("[\"{dial}\"]");
    let key = dir.join("b.key");
    let journal = dir.join("b.journal");
    let env = [
        ("SLUICE_MESH__LISTEN", listen.as_str()),
        ("SLUICE_MESH__PEERS", peers.as_str()),
        ("SLUICE_MESH__KEY", key.to_str().unwrap()),
        ("SLUICE_MEMPOOL__JOURNAL", journal.to_str().unwrap()),
    ];
    Sluice::spawn_env(BIN, &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()], &env)
}

/// The answers that only mistakes produce: errors by reason, refusals, a mempool refusal.
async fn mistakes(http: &reqwest::Client, url: &str) {
    let (status, _) = post(http, url, "{not json").await;
    assert_eq!(status, 200);
    let denied = rpc(http, url, "personal_unlockAccount", json!(["0x00", "x", 1])).await;
    assert!(denied["error"].is_object(), "{denied}");
    let refused = http
        .post(url)
        .header("x-api-key", "not-a-key-at-all-0000")
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401, "an unknown key");
    // The same transaction twice: the second is refused by the pool.
    let wallet = Wallet::numbered(900_001, 31337);
    let raw = wallet.transfer(0, wallet.address(), 1, Fees::default()).hex();
    for _ in 0..2 {
        rpc(http, url, "eth_sendRawTransaction", json!([raw])).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_recording_rule_returns_data_from_a_sluice_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let anvil = Anvil::spawn();
    let (sluice, ingress, mesh_address) = loaded_sluice(&anvil, dir.path());
    let peer = mesh_peer(&anvil, dir.path(), &mesh_address);
    let prometheus = Prometheus::start(&sluice.addr);
    let http = reqwest::Client::new();
    let url = sluice.http_url();

    // The load starts once Prometheus scrapes sluice, so that short bursts are seen.
    let up = Instant::now() + Duration::from_secs(30);
    while prometheus.query(&http, "up{job=\"sluice\"} == 1").await.map(|r| r.is_empty()).unwrap_or(true) {
        assert!(Instant::now() < up, "Prometheus did not scrape sluice within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mix = workspace_root().join("bench/mix.toml");
    let load = vec![
        bench(&["bench", "rpc", &url, "-c", "4", "-d", "40s", "--mix", mix.to_str().unwrap()]),
        bench(&["bench", "ingest", &url, "--rate", "20", "-d", "40s", "--senders", "20", "--fund"]),
        bench(&[
            "bench",
            "quic",
            "load",
            "--target",
            &ingress,
            "--rpc",
            &url,
            "--txs",
            "5000",
            "--clients",
            "2",
            "-d",
            "40s",
        ]),
    ];
    mistakes(&http, &url).await;

    // Each query must return data at least once while the load runs: a query that never does
    // names a series sluice does not export, a label it does not set, or a broken rule.
    let queries = dashboard_queries();
    assert!(queries.len() > 30, "the dashboard has its panels: {}", queries.len());
    let mut waiting: BTreeSet<usize> = (0..queries.len()).collect();
    let mut errors = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !waiting.is_empty() && Instant::now() < deadline {
        for i in waiting.clone() {
            match prometheus.query(&http, &queries[i].1).await {
                Ok(result) if !result.is_empty() => {
                    waiting.remove(&i);
                }
                Ok(_) => {}
                Err(e) if e.contains("bad_data") => errors.push(format!("{}: {e}", queries[i].0)),
                Err(_) => {} // Prometheus still starting
            }
        }
        assert!(errors.is_empty(), "queries Prometheus refused: {errors:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let empty: Vec<&(String, String)> = waiting.iter().map(|&i| &queries[i]).collect();
    if !empty.is_empty() {
        panic!("dashboard queries that returned nothing under load: {empty:#?}\nthe load: {}", stop(load));
    }

    // Every recording rule is healthy and its series has data; every alert rule evaluates.
    let rules = prometheus.rules(&http).await;
    assert!(rules.len() >= 18, "{} rules loaded", rules.len());
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
        if rule["type"] == "recording" {
            let name = rule["name"].as_str().unwrap();
            let result = prometheus.query(&http, name).await.unwrap();
            assert!(!result.is_empty(), "recording rule {name} has no data");
        }
    }

    stop(load);
    drop(peer);
}
