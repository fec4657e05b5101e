//! The Debian package: built with cargo-deb (pinned in `scripts/install-tools.sh`) from the
//! binary these tests use, installed with dpkg (as root, as on CI), then the installed binary
//! started as the package's own user with the packaged configuration, then purged.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::eventually;
use serde_json::json;
use sluice_bench::txgen::{Fees, Wallet};
use sluice_testkit::{rpc_result, workspace_root, Anvil, Sluice};

fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Purges the package when the test ends, passed or not.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "sluice"]).output();
    }
}

fn owner(path: &str) -> String {
    String::from_utf8_lossy(&run("stat", &["-c", "%U:%G", path]).stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debian_package_installs_a_service_that_runs_as_its_own_user_with_the_packaged_configuration() {
    let uid = String::from_utf8_lossy(&run("id", &["-u"]).stdout).trim().to_owned();
    assert_eq!(uid, "0", "installing the package needs root (CI runs as root)");
    let dir = tempfile::tempdir().unwrap();
    let deb = dir.path().join("sluice.deb");
    // The binary of these tests (the dev profile), stripped: the package's layout is what is
    // tested here; `cargo deb -p sluice` builds the release one.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(&cargo)
        .args(["deb", "-p", "sluice", "--no-build", "--profile", "dev", "--fast", "-o"])
        .arg(&deb)
        .current_dir(workspace_root())
        .output()
        .expect("cargo deb runs (scripts/install-tools.sh installs cargo-deb)");
    assert!(built.status.success(), "cargo deb failed: {}", String::from_utf8_lossy(&built.stderr));

    let _ = Command::new("dpkg").args(["--purge", "sluice"]).output();
    let installed = Installed;
    run("dpkg", &["-i", deb.to_str().unwrap()]);

    // What the package put in place.
    run("getent", &["passwd", "sluice"]);
    assert_eq!(owner("/var/lib/sluice"), "sluice:sluice");
    let config = std::fs::read_to_string("/etc/sluice/sluice.toml").unwrap();
    assert!(config.contains("/var/lib/sluice/mempool.journal"), "{config}");
    let unit = std::fs::read_to_string("/usr/lib/systemd/system/sluice.service").unwrap();
    for line in
        ["User=sluice", "ExecStart=/usr/bin/sluice serve --config /etc/sluice/sluice.toml", "StateDirectory=sluice"]
    {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line:?}:\n{unit}");
    }
    let conffiles =
        String::from_utf8_lossy(&run("dpkg-query", &["--showformat=${Conffiles}", "--show", "sluice"]).stdout)
            .to_string();
    assert!(conffiles.contains("/etc/sluice/sluice.toml"), "the configuration is a conffile: {conffiles}");
    assert!(Path::new("/usr/share/sluice/grafana/sluice.json").exists());
    assert!(Path::new("/usr/share/sluice/prometheus/sluice.rules.yml").exists());
    run("/usr/bin/sluice", &["config", "validate", "/etc/sluice/sluice.toml"]);

    // The installed binary, as the unit starts it (user, working directory, configuration), in
    // front of a real anvil: only the node's address and the port differ from the packaged file.
    let anvil = Anvil::spawn();
    let upstream = anvil.http_url();
    let mut sluice = Sluice::spawn_env(
        "runuser",
        &[
            "-u",
            "sluice",
            "--",
            "env",
            "-u",
            "SLUICE_MEMPOOL__JOURNAL",
            "-C",
            "/var/lib/sluice",
            "/usr/bin/sluice",
            "serve",
            "--config",
            "/etc/sluice/sluice.toml",
            "--listen",
            "127.0.0.1:0",
        ],
        &[("SLUICE_UPSTREAM", upstream.as_str())],
    );
    let http = reqwest::Client::new();
    let url = sluice.http_url();
    assert_eq!(rpc_result(&http, &url, "eth_chainId", json!([])).await, "0x7a69");

    // A transaction accepted is journaled where the packaged configuration says, by the sluice user.
    let wallet = Wallet::numbered(700_001, 31337);
    rpc_result(&http, &upstream, "anvil_setBalance", json!([wallet.address().to_string(), "0xde0b6b3a7640000"])).await;
    let tx = wallet.transfer(0, wallet.address(), 1, Fees::default());
    let hash = rpc_result(&http, &url, "eth_sendRawTransaction", json!([tx.hex()])).await;
    assert_eq!(hash, tx.hash.to_string());
    let journal = "/var/lib/sluice/mempool.journal";
    eventually(Duration::from_secs(5), "the journal holds the transaction", || async {
        std::fs::metadata(journal).map(|m| m.len() > 0).unwrap_or(false)
    })
    .await;
    assert_eq!(owner(journal), "sluice:sluice");
    // runuser passes SIGTERM on to sluice; wait for both to be gone, so that no process of
    // the sluice user is left when the purge removes the user (killing runuser at once would
    // orphan sluice before the signal reached it).
    sluice.terminate();
    assert!(sluice.wait_exit(Duration::from_secs(30)).is_some(), "sluice stops on SIGTERM");
    drop(sluice);

    // Purge takes the state and the user away.
    drop(installed);
    assert!(!Path::new("/var/lib/sluice").exists(), "purge removes /var/lib/sluice");
    assert!(!Path::new("/usr/bin/sluice").exists());
    let user = Command::new("getent").args(["passwd", "sluice"]).output().unwrap();
    assert!(!user.status.success(), "purge removes the sluice user");
}
