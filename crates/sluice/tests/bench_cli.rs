//! `sluice bench` from the command line: bad input is refused before any load, and the report
//! writes its Markdown and plots from a real run against anvil and sluice.

mod common;

use std::process::Command;

use common::BIN;
use sluice_testkit::Anvil;

fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).arg("bench").args(args).env("SLUICE_LOG", "error").output().expect("sluice runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_is_refused_before_any_load() {
    let anvil = Anvil::spawn();
    let url = anvil.http_url();
    let dir = tempfile::tempdir().unwrap();
    let mix = dir.path().join("mix.toml");
    std::fs::write(&mix, "[[call]]\nmethod = \"eth_chainId\"\nwieght = 1\n").unwrap();
    for (args, expected) in [
        (vec!["rpc", &url, "--rate", "0"], "rate must be positive"),
        (vec!["rpc", &url, "--ramp=-5"], "ramp rates"),
        (vec!["rpc", &url, "--mix", mix.to_str().unwrap()], "wieght"),
        (vec!["rpc", &url, "--params", "{}"], "JSON array"),
        (vec!["rpc", "ftp://x"], "http:// or ws://"),
        (vec!["rpc", "http://127.0.0.1:1", "-d", "1s"], "cannot reach"),
    ] {
        let (ok, _, stderr) = bench(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let (ok, stdout, stderr) = bench(&["rpc", &url, "-n", "50", "-c", "2", "--json"]);
    assert!(ok, "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!((summary["requests"].as_u64(), summary["ok"].as_u64()), (Some(50), Some(50)));
}

#[test]
fn the_report_writes_tables_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let anvil = sluice_testkit::foundry_tool("anvil");
    let args = [
        "report",
        "--out",
        out,
        "--cell",
        "200ms",
        "--ramp-to",
        "300",
        "--ramp-duration",
        "1s",
        "--concurrency",
        "2",
        "--ws-clients",
        "20",
        "--anvil",
        anvil.to_str().unwrap(),
    ];
    let (ok, _, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let md = std::fs::read_to_string(dir.path().join("benchmarks.md")).unwrap();
    for heading in [
        "a. Fixed concurrency",
        "a′. Fixed concurrency: pass-through",
        "d. Pass-through overhead",
        "b. Incremental ramp",
        "c. A realistic method mix",
        "h. Subscriptions",
    ] {
        assert!(md.contains(heading), "missing {heading}");
    }
    assert!(md.contains("| cached eth_getBlockByNumber(0x10), c=2 |"));
    assert!(md.contains("| anvil | anvil Version: "), "the report names the anvil it measured");
    // 20 clients, 10 blocks: every head delivered once, nobody closed, one upstream socket.
    assert!(md.contains("| 20 | "), "the subscription row");
    assert!(md.contains(" | 0 / 0 / 0 | "), "no head missed or duplicated, no client closed");
    for plot in ["latency.svg", "ramp.svg"] {
        let svg = std::fs::read_to_string(dir.path().join("bench").join(plot)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{plot}");
    }
}

#[test]
fn ingest_sends_signed_transactions_into_the_pool_and_writes_a_read_mix() {
    let anvil = Anvil::spawn_with(&["--no-mining"]);
    let sluice = sluice_testkit::Sluice::serve(BIN, &anvil.http_url(), &[]);
    let url = sluice.http_url();
    let dir = tempfile::tempdir().unwrap();
    let mix = dir.path().join("read.toml");
    let mix = mix.to_str().unwrap();
    let args = ["ingest", &url, "--rate", "200", "-d", "1s", "--senders", "20", "--fund", "--mix-out", mix, "--json"];
    let (ok, stdout, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((summary["requests"].as_u64(), summary["ok"].as_u64()), (Some(200), Some(200)), "{summary}");
    // Every transaction is in sluice's pool (anvil does not mine), and the mix reads them.
    let status = std::process::Command::new("curl")
        .args(["-s", &url, "-H", "content-type: application/json"])
        .args(["-d", r#"{"jsonrpc":"2.0","id":1,"method":"txpool_status"}"#])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["result"]["pending"], "0xc8", "{status}");
    let (ok, stdout, stderr) = bench(&["rpc", &url, "--mix", mix, "-n", "100", "-c", "4", "--json"]);
    assert!(ok, "{stderr}");
    let reads: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(reads["ok"].as_u64(), Some(100), "{reads}");
}
