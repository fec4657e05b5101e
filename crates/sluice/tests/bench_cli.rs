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

/// `sluice-baseline` beside the sluice binary, where the report looks for it: built by `cargo
/// test --workspace`, and here when this crate's tests run alone.
fn baseline_binary() -> std::path::PathBuf {
    let beside = std::path::Path::new(BIN).with_file_name("sluice-baseline");
    if !beside.is_file() {
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let mut build = Command::new(cargo);
        build.args(["build", "-q", "-p", "sluice-bench", "--bin", "sluice-baseline"]);
        if BIN.contains("/release/") {
            build.arg("--release");
        }
        assert!(build.status().expect("cargo runs").success(), "building sluice-baseline");
    }
    assert!(beside.is_file(), "{} after building it", beside.display());
    beside
}

/// The Markdown tables of a page: each as its header cells and its rows' cells.
fn tables(md: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let cells = |line: &str| line.trim().trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect::<Vec<_>>();
    let mut out: Vec<(Vec<String>, Vec<Vec<String>>)> = Vec::new();
    let mut lines = md.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with('|') || !lines.peek().is_some_and(|l| l.starts_with("|---")) {
            continue;
        }
        lines.next();
        let mut rows = Vec::new();
        while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
            rows.push(cells(row));
        }
        out.push((cells(line), rows));
    }
    out
}

fn number(cell: &str) -> f64 {
    let first = cell.split_whitespace().next().unwrap_or_default().replace(',', "");
    first.parse().unwrap_or_else(|_| panic!("not a number: {cell:?}"))
}

/// `a / b / c` cells.
fn numbers(cell: &str) -> Vec<f64> {
    cell.split(" / ").map(number).collect()
}

#[test]
fn the_report_writes_sane_figures_fast() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let anvil = sluice_testkit::foundry_tool("anvil");
    let baseline = baseline_binary();
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
        "--quic",
        "300ms",
        "--quic-warmup",
        "300ms",
        "--quic-rtts",
        "30",
        "--mesh-nodes",
        "5",
        "--mesh-txs",
        "20",
        "--mesh-pairs",
        "false",
        "--mempool-mesh-nodes",
        "3",
        "--mempool-mesh-txs",
        "40",
        "--mempool-mesh-rate",
        "100",
        "--ws-clients",
        "20",
        "--ws-blocks",
        "3",
        "--anvil",
        anvil.to_str().unwrap(),
        "--baseline",
        baseline.to_str().unwrap(),
    ];
    let (ok, _, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let md = std::fs::read_to_string(dir.path().join("benchmarks.md")).unwrap();
    assert!(md.contains("| anvil | anvil Version: "), "the report names the anvil it measured");
    let tables = tables(&md);
    let find =
        |first: &str| tables.iter().find(|(h, _)| h[0] == first).unwrap_or_else(|| panic!("no table headed {first:?}"));

    // Every side-by-side table: non-zero rates, the ratio is their quotient, no errors at this
    // load, the generator's CPU measured.
    let pairs: Vec<_> = tables.iter().filter(|(h, _)| h.get(3).is_some_and(|c| c == "ratio")).collect();
    assert_eq!(pairs.len(), 4, "a, a′, a″ and c");
    let mut cases = std::collections::HashMap::new();
    for (header, rows) in &pairs {
        assert!(!rows.is_empty(), "{header:?} has rows");
        for row in rows {
            let (reference, sluice, ratio) = (number(&row[1]), number(&row[2]), number(&row[3]));
            assert!(reference > 0.0 && sluice > 0.0, "{row:?}");
            assert!((ratio - sluice / reference).abs() < 0.006, "the ratio is the quotient: {row:?}");
            assert_eq!(numbers(&row[6]), vec![0.0, 0.0], "no errors: {row:?}");
            assert!(numbers(&row[7]).iter().all(|c| *c > 0.0), "generator CPU: {row:?}");
            for latency in [&row[4], &row[5]] {
                let l = numbers(latency);
                assert!(l[0] > 0.0 && l[0] <= l[1] && l[1] <= l[2], "p50 ≤ p90 ≤ p99: {row:?}");
            }
            cases.insert(row[0].clone(), row.clone());
        }
    }
    let baseline_rows = &pairs.iter().find(|(h, _)| h[1] == "baseline req/s").expect("the baselines ran").1;
    assert_eq!(baseline_rows.len(), 4, "pass-through at c=2 and c=1, two cached answers: {baseline_rows:?}");
    // d: the added latency is sluice's p50 minus anvil's, row by row of a′.
    let (_, added) = tables.iter().find(|(h, _)| h[1] == "p50 added µs").expect("table d");
    for row in added {
        let pass = &cases[&row[0]];
        assert_eq!(number(&row[1]), numbers(&pass[5])[0] - numbers(&pass[4])[0], "{row:?}");
    }

    // The headline repeats figures of the sections, each naming a section that exists.
    let (_, headline) = find("figure");
    assert!(headline.len() >= 7, "{headline:?}");
    for row in headline {
        number(&row[1]);
        assert!(md.contains(&format!("## {}. ", row[2])), "section {} exists", row[2]);
    }
    let mix = cases.iter().find(|(case, _)| case.starts_with("eth_call, balances")).expect("the mix row").1;
    let headline_mix = headline.iter().find(|r| r[0].starts_with("method mix")).expect("mix in the headline");
    assert_eq!(headline_mix[1], mix[3]);
    let hit = headline.iter().find(|r| r[0].contains("cache hit ratio")).expect("hit ratio in the headline");
    assert!((0.1..=100.0).contains(&number(&hit[1])), "the mix reaches the cache: {hit:?}");
    let c1 = cases.iter().find(|(case, _)| case.ends_with("vs bare forwarder, c=1")).expect("c=1 row").1;
    let headline_c1 = headline.iter().find(|r| r[0].contains("added over the bare forwarder")).expect("c=1 headline");
    assert_eq!(number(&headline_c1[1]), numbers(&c1[5])[0] - numbers(&c1[4])[0]);

    // b: a sustained rate per target, from a ramp that failed nothing at 300/s.
    let (_, ramp) = find("target");
    assert_eq!(ramp.len(), 2);
    for row in ramp {
        assert!(number(&row[1]) > 0.0, "{row:?}");
        let (ok, all) = (numbers(&row[3])[0], numbers(&row[3])[1]);
        assert!(ok > 0.0 && ok == all, "{row:?}");
    }

    // f: the QUIC point carried transactions both ways, and Agave's figures are cited.
    let (_, quic) = find("RTT");
    assert_eq!(quic.len(), 1);
    assert!(number(&quic[0][1]) > 0.0 && number(&quic[0][2]) > 0.0 && number(&quic[0][3]) > 0.0, "{quic:?}");
    assert!(md.contains("https://github.com/anza-xyz/agave/pull/8948"));

    // g: the mesh row (its own process) lost nothing, and carried real transfers.
    let (_, mesh) = find("settings");
    assert_eq!(mesh.len(), 1);
    assert_eq!((number(&mesh[0][1]), number(&mesh[0][5])), (5.0, 0.0), "5 nodes, none lost: {mesh:?}");
    assert!(number(&mesh[0][4]) > 0.0, "{mesh:?}");
    assert!(number(&mesh[0][14]) >= 100.0, "real signed transfers, not stand-in bytes: {mesh:?}");

    // g′: three real mempools in a line, each holding all 40 transfers, nothing failed.
    let (_, line) = find("nodes (line)");
    assert_eq!(line.len(), 1);
    let row = &line[0];
    assert_eq!(number(&row[0]), 3.0, "{row:?}");
    assert_eq!(numbers(&row[1]), vec![40.0, 40.0], "all acknowledged: {row:?}");
    assert_eq!(numbers(&row[2]), vec![40.0; 3], "every pool holds every transaction: {row:?}");
    assert!(number(&row[3]) > 0.0 && number(&row[4]) >= number(&row[3]) * 0.5, "{row:?}");
    assert_eq!(number(&row[5]), 0.0, "no mesh message failed: {row:?}");
    assert!(numbers(&row[6]).iter().all(|mib| *mib > 1.0), "each process's memory: {row:?}");
    let headline_line =
        headline.iter().find(|r| r[0].starts_with("mesh through 3 real mempools")).expect("g′ headline");
    assert_eq!(number(&headline_line[1]), number(&row[4]));

    // h: 20 clients, 3 blocks: every head delivered once, nobody closed, one upstream socket.
    let (_, ws) = find("clients");
    assert_eq!(number(&ws[0][0]), 20.0);
    assert_eq!(numbers(&ws[0][4]), vec![0.0, 0.0, 0.0], "no head missed or duplicated, no client closed");
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
