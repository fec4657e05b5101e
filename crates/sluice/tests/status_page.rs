//! The status page in a real browser: Debian's chromium, driven by playwright-core, against a
//! real sluice in front of two anvils, with a `sluice bench rpc` load running.

mod common;

use std::process::{Command, Stdio};

use common::*;
use serde_json::json;
use sluice_testkit::{rpc_result, workspace_root, Anvil, Sluice};

const TOKEN: &str = "page-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_members_and_turns_a_dead_one_red() {
    let (alpha, beta) = (Anvil::spawn(), Anvil::spawn());
    // Two heads apart, so that each row must show its own member's.
    let client = reqwest::Client::new();
    rpc_result(&client, &alpha.http_url(), "anvil_mine", json!(["0x7"])).await;
    rpc_result(&client, &beta.http_url(), "anvil_mine", json!(["0x4"])).await;
    let dir = tempfile::tempdir().expect("a temporary folder");
    let config = dir.path().join("sluice.toml");
    let text = format!(
        "[access]\n[access.keys]\n\"k-open\" = \"free\"\n[access.tiers.free]\n[access.admin]\nlisten = \"127.0.0.1:0\"\n\
         token = \"{TOKEN}\"\nkeys_file = \"{}\"\n\
         [[upstreams]]\nname = \"alpha\"\nurl = \"{}\"\n[[upstreams]]\nname = \"beta\"\nurl = \"{}\"\n",
        dir.path().join("keys.json").display(),
        alpha.http_url(),
        beta.http_url(),
    );
    std::fs::write(&config, text).expect("config written");
    let sluice = Sluice::spawn(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", config.to_str().expect("utf-8")]);
    let admin = sluice.admin_url();
    // Load through a key: estimates are never cached, so the calls reach both members.
    let target = format!("{}/k-open", sluice.http_url());
    let estimate = r#"[{"from":"0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","to":"0x70997970c51812dc3a010c7d01b50e0d17dc79c8","value":"0x1"}]"#;
    let mut load = Command::new(BIN)
        .args(["bench", "rpc", &target, "--rate", "200", "--duration", "60s", "--method", "eth_estimateGas"])
        .args(["--params", estimate, "--json"])
        .env("SLUICE_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice bench runs");
    let root = workspace_root();
    let shots = root.join("target/status-page");
    std::fs::create_dir_all(&shots).expect("screenshot folder");
    let mut node = Command::new("node");
    node.arg(root.join("crates/sluice/tests/js/status_page.cjs"))
        .args([&admin, TOKEN, &sluice.http_url(), &alpha.http_url(), &beta.http_url()])
        .arg(beta.pid().to_string())
        .arg(shots.join("status-page.png"))
        .env("NODE_PATH", root.join(".tools/node_modules"));
    let out = tokio::task::block_in_place(|| node.output()).expect("node runs");
    let _ = load.kill();
    let _ = load.wait();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser's checks failed:\n{stdout}\n{stderr}");
    let findings: serde_json::Value = serde_json::from_str(stdout.trim()).expect("findings");
    eprintln!("status page: {findings}");
    assert_eq!(findings["without_token"], 401, "{findings}");
    assert!(findings["red_after_ms"].as_u64().is_some_and(|ms| ms <= 2000), "{findings}");
}

/// `[status] page`: on by default for loopback clients, and `off` leaves `/` to JSON-RPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_on_the_main_listener_follows_its_switch() {
    let anvil = Anvil::spawn();
    let client = reqwest::Client::new();
    let on = Sluice::serve(BIN, &anvil.http_url(), &[]);
    let page = client.get(on.http_url()).header("accept", "text/html").send().await.expect("GET /");
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"].to_str().expect("ascii").to_owned();
    assert!(policy.starts_with("default-src 'none'"), "{policy}");
    assert!(page.text().await.expect("body").contains("<title>sluice status</title>"));
    // A JSON-RPC POST to / is still JSON-RPC.
    let answer = rpc_result(&client, &on.http_url(), "eth_chainId", json!([])).await;
    assert_eq!(answer, "0x7a69");
    let mut live = client.get(format!("{}/status/live", on.http_url())).send().await.expect("live");
    assert_eq!(live.headers()["content-type"], "text/event-stream");
    let first = live.chunk().await.expect("a chunk").expect("an event");
    assert!(String::from_utf8_lossy(&first).starts_with("event: status\ndata: {"), "{first:?}");

    let off = Sluice::spawn_env(
        BIN,
        &["serve", "--listen", "127.0.0.1:0", "--upstream", &anvil.http_url()],
        &[("SLUICE_STATUS__PAGE", "off")],
    );
    let page = client.get(off.http_url()).header("accept", "text/html").send().await.expect("GET /");
    assert_eq!(page.status(), 405, "off: / is JSON-RPC only");
    let live = client.get(format!("{}/status/live", off.http_url())).send().await.expect("live");
    assert_eq!(live.status(), 404);
}
