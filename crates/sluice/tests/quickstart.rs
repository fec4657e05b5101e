//! The quickstart as a new user meets it: a fresh clone, a user without root, a machine with
//! Rust and npm but without Prometheus, Redis or cargo-deb on its PATH. `scripts/dev.sh` must
//! build and start sluice in front of anvil, `cast block-number` through it must work, and
//! Ctrl-C (SIGINT to the terminal's process group) must stop both.
//!
//! Runs as root (as CI does), to create that user. It builds the `quickstart` profile from
//! nothing and so takes minutes: marked ignored, it is run by `scripts/test.sh` on its own
//! (`--ignored`), after the rest of the suite, so that its build does not starve the others.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::{foundry_tool, free_port, workspace_root};

const USER: &str = "sluice-quickstart";

fn run(what: &str, command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A folder of links to every program of /usr/bin and /bin but Prometheus's, Redis's and
/// cargo-deb: a PATH on which they are absent.
fn path_without_test_tools(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin folder");
    let absent = |name: &str| name.starts_with("redis") || name.starts_with("prometheus") || name == "promtool";
    for folder in ["/usr/local/bin", "/usr/bin", "/bin"] {
        let Ok(entries) = std::fs::read_dir(folder) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let (name_str, link) = (name.to_string_lossy().into_owned(), bin.join(&name));
            if !absent(&name_str) && !link.exists() {
                let _ = std::os::unix::fs::symlink(entry.path(), link);
            }
        }
    }
    bin
}

/// The toolchain rustup gave root, linked (not copied) where the user can read it: root's home
/// is closed to others.
fn toolchain_for_others(dir: &Path) -> PathBuf {
    let sysroot = run("rustc --print sysroot", Command::new("rustc").args(["--print", "sysroot"]));
    let sysroot = std::fs::canonicalize(sysroot.trim()).expect("the sysroot");
    let linked = dir.join("toolchain");
    let copied = Command::new("cp").arg("-al").arg(&sysroot).arg(&linked).status().is_ok_and(|s| s.success());
    if !copied {
        run("cp -a toolchain", Command::new("cp").arg("-a").arg(&sysroot).arg(&linked));
    }
    linked.join("bin")
}

#[test]
#[ignore = "minutes of building: scripts/test.sh runs it on its own, after the suite (--ignored)"]
fn the_quickstart_runs_as_a_user_without_root_or_the_test_tools() {
    assert!(
        run("id -u", Command::new("id").arg("-u")).trim() == "0",
        "this test creates a user, so it runs as root (as CI does)"
    );
    if !Command::new("id").arg(USER).stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        run("useradd", Command::new("useradd").args(["--create-home", "--shell", "/bin/bash", USER]));
    }
    let home = PathBuf::from(format!("/home/{USER}"));
    // Shared tools in a folder everyone can read.
    let shared = tempfile::Builder::new().prefix("sluice-quickstart-").tempdir_in("/var/tmp").expect("a folder");
    std::fs::set_permissions(shared.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let bin = path_without_test_tools(shared.path());
    let rust = toolchain_for_others(shared.path());
    let path = format!("{}:{}", rust.display(), bin.display());
    for tool in ["redis-server", "prometheus", "promtool", "cargo-deb"] {
        let found = Command::new("bash").args(["-c", &format!("command -v {tool}")]).env("PATH", &path).output();
        assert!(found.is_ok_and(|o| !o.status.success()), "{tool} is on the quickstart's PATH");
    }

    // A fresh clone of this commit, the user's own (no hard links into this checkout).
    let clone = home.join("sluice");
    let _ = std::fs::remove_dir_all(&clone);
    let root = workspace_root();
    run("git clone", Command::new("git").args(["clone", "-q", "--no-hardlinks"]).arg(&root).arg(&clone));
    run("chown", Command::new("chown").args(["-R", &format!("{USER}:{USER}")]).arg(&clone));

    let port = free_port();
    let started = Instant::now();
    // The machine's own network settings (its CA bundle, proxies) are the new user's too.
    let network: Vec<String> = std::env::vars()
        .filter(|(k, _)| {
            let k = k.to_ascii_uppercase();
            ["CA_CERT", "CA_BUNDLE", "CERT_FILE", "CERT_DIR", "CAINFO", "PROXY"].iter().any(|part| k.contains(part))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut dev = Command::new("runuser");
    dev.args(["-u", USER, "--", "env", "-i"])
        .arg(format!("HOME={}", home.display()))
        .arg(format!("PATH={path}"))
        .args(&network)
        .args(["bash", "scripts/dev.sh", "--listen", &format!("127.0.0.1:{port}")])
        .current_dir(&clone)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0); // as a terminal's foreground job: Ctrl-C reaches every process in it
    let mut dev = dev.spawn().expect("dev.sh starts");
    let group = dev.id() as i32;
    let stderr = dev.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
    let stdout = BufReader::new(dev.stdout.take().expect("stdout"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let listening = format!("sluice listening on http://127.0.0.1:{port}");
    let deadline = started + Duration::from_secs(30 * 60);
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(5)) {
            Ok(line) if line.contains(&listening) => break,
            Ok(line) => seen.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(_) => {
                let _ = nix_kill(group, "KILL");
                panic!("dev.sh never served: {seen:?}\n{:?}", errors.join());
            }
        }
    }
    let first_run = started.elapsed();
    eprintln!(
        "quickstart: first run (install anvil, fetch crates, build, start) took {:.0} s",
        first_run.as_secs_f64()
    );
    assert!(clone.join(".tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil").is_file(), "anvil in .tools/");

    let url = format!("http://127.0.0.1:{port}");
    let number = run("cast block-number", Command::new(foundry_tool("cast")).args(["block-number", "--rpc-url", &url]));
    assert!(number.trim().parse::<u64>().is_ok(), "cast block-number through sluice: {number:?}");
    // pgrep exits 1 when it finds none: only its count matters here.
    let count = |out: std::io::Result<std::process::Output>| {
        out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().ok()).unwrap_or(0)
    };
    let running = || count(Command::new("pgrep").args(["-c", "-u", USER, "-f", "anvil-linux-amd64"]).output());
    assert_eq!(running(), 1, "one anvil runs beside sluice");

    // Ctrl-C: SIGINT to the whole foreground group, as a terminal sends it.
    nix_kill(group, "INT").expect("SIGINT sent");
    let stop_deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = dev.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < stop_deadline, "dev.sh did not stop within 20 s of Ctrl-C");
        std::thread::sleep(Duration::from_millis(100));
    };
    let gone = Instant::now() + Duration::from_secs(10);
    while running() > 0 && Instant::now() < gone {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(running(), 0, "anvil still runs after Ctrl-C");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "sluice still listens after Ctrl-C");
    eprintln!("quickstart: stopped by Ctrl-C ({status})");
    let _ = std::fs::remove_dir_all(&clone); // its build is a few GiB
}

/// `kill -SIGNAL -GROUP`: a signal to every process of a group.
fn nix_kill(group: i32, signal: &str) -> std::io::Result<()> {
    let status = Command::new("kill").arg(format!("-{signal}")).arg("--").arg(format!("-{group}")).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill -{signal} -{group}: {status}")))
    }
}
