//! Test helpers for sluice: real processes on free loopback ports, killed when dropped.
//!
//! * [`Anvil`]: a real anvil devnet from the project-local tools folder.
//! * [`Sluice`]: the real `sluice` binary, started with arguments, its address read from stdout.
//! * [`rpc`]: one JSON-RPC call or raw body over HTTP.
//! * [`FakeUpstream`]: a fault-injecting fake node (hangs, garbage, slowness, a provider's 429s
//!   above a rate) or a counting relay in front of a real one — never the source of a correct
//!   answer.
//! * [`WsRelay`]: a WebSocket relay in front of a node's socket that counts subscriptions and
//!   can cut every connection.
//!
//! Correct answers always come from a real node: the fake upstream only injects faults,
//! counts calls, or stands in where sluice's own speed is measured. Missing tools fail loudly
//! with the command that installs them.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod fake_upstream;
pub use fake_upstream::{read_http_request, FakeUpstream, Fault, RateWindow};
pub use tls_relay::TlsRelay;
pub use ws_relay::WsRelay;
mod tls_relay;
mod ws_relay;

/// The workspace root (two levels above the crate under test). Read when the test runs
/// (cargo sets `CARGO_MANIFEST_DIR` for it), so that a build reused from another checkout of
/// the same tree still finds this checkout's tools; the compile-time value is the fallback.
pub fn workspace_root() -> PathBuf {
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
    manifest.ancestors().nth(2).expect("workspace root").to_owned()
}

/// Path of a Foundry tool (`anvil`, `cast`) in the project-local tools folder.
pub fn foundry_tool(name: &str) -> PathBuf {
    let path = workspace_root().join(format!(".tools/node_modules/@foundry-rs/{name}-linux-amd64/bin/{name}"));
    assert!(path.is_file(), "{} missing: run scripts/install-tools.sh first", path.display());
    path
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A real anvil devnet, killed on drop.
pub struct Anvil {
    child: Child,
    /// The anvil port.
    pub port: u16,
}

impl Anvil {
    /// Starts anvil with default settings (mines on each transaction).
    pub fn spawn() -> Self {
        Self::spawn_with(&[])
    }

    /// Starts anvil with extra arguments and waits until it answers JSON-RPC.
    ///
    /// A free port can be taken by another process between the check and anvil's bind (tests
    /// run in parallel), and then something else answers on it while anvil exits: so the port
    /// must answer `eth_chainId`, from an anvil that is still running, or a new port is tried.
    pub fn spawn_with(args: &[&str]) -> Self {
        for _ in 0..5 {
            if let Some(anvil) = Self::try_spawn(free_port(), args) {
                return anvil;
            }
        }
        panic!("anvil did not start on any of 5 free ports");
    }

    /// Starts anvil on a given port (to bring a killed node back where it was).
    pub fn spawn_on(port: u16, args: &[&str]) -> Self {
        Self::try_spawn(port, args).unwrap_or_else(|| panic!("anvil did not start on port {port}"))
    }

    fn try_spawn(port: u16, args: &[&str]) -> Option<Self> {
        let child = Command::new(foundry_tool("anvil"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("anvil starts");
        let mut anvil = Anvil { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = anvil.child.try_wait() {
                return None;
            }
            if answers_chain_id(port) {
                return Some(anvil);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        None
    }

    /// `http://127.0.0.1:PORT`.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The anvil process's id (for a test that kills it from elsewhere).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `ws://127.0.0.1:PORT`.
    pub fn ws_url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether an Ethereum JSON-RPC server answers `eth_chainId` on the port (plain std I/O, so it
/// works outside any runtime).
fn answers_chain_id(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
    let request = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"result\"")
}

fn wait_for_port(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listening on port {port} after {within:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A real `redis-server` on a free loopback port, with persistence off; killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
}

impl RedisServer {
    /// Starts redis-server from PATH (installed by scripts/install-tools.sh).
    pub fn spawn() -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts (run scripts/install-tools.sh)");
        wait_for_port(port, Duration::from_secs(10));
        Self { child: Some(child), port }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Number of keys, via redis-cli.
    pub fn dbsize(&self) -> u64 {
        let out =
            Command::new("redis-cli").args(["-p", &self.port.to_string(), "dbsize"]).output().expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The real `sluice` binary, killed on drop.
pub struct Sluice {
    child: Child,
    /// Where it listens, read from its `sluice listening on` line on stdout.
    pub addr: String,
    /// The lines it printed before that one.
    pub preamble: Vec<String>,
    /// Its own folder for the mempool journal (unless the caller named one), removed on drop.
    _data: Option<tempfile::TempDir>,
}

impl Sluice {
    /// Runs `BIN ARGS…` (pass `env!("CARGO_BIN_EXE_sluice")`) and waits for its
    /// `sluice listening on http://ADDR` line.
    pub fn spawn(bin: &str, args: &[&str]) -> Self {
        Self::spawn_env(bin, args, &[])
    }

    /// Like [`Sluice::spawn`], with extra environment variables for the child only.
    /// Each instance journals its mempool in a temporary folder of its own unless `env` sets
    /// `SLUICE_MEMPOOL__JOURNAL`.
    pub fn spawn_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let data = tempfile::tempdir().expect("a temporary folder");
        let journal = data.path().join("mempool.journal");
        let mut child = Command::new(bin)
            .args(args)
            .env("SLUICE_LOG", "warn")
            .env("SLUICE_MEMPOOL__JOURNAL", &journal)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("sluice starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let mut preamble = Vec::new();
        let addr = loop {
            let line = lines.next().expect("sluice printed its address").expect("stdout is readable");
            if let Some(rest) = line.strip_prefix("sluice listening on http://") {
                break rest.split_whitespace().next().expect("an address").to_owned();
            }
            preamble.push(line);
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Sluice { child, addr, preamble, _data: Some(data) }
    }

    /// Starts `sluice serve` on a free port in front of `upstream`, with extra arguments.
    pub fn serve(bin: &str, upstream: &str, extra: &[&str]) -> Self {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--upstream", upstream];
        args.extend_from_slice(extra);
        Self::spawn(bin, &args)
    }

    /// The admin API's base URL, from the `sluice admin on …` line it printed at start.
    ///
    /// # Panics
    /// When it printed none (no `[access.admin]`).
    pub fn admin_url(&self) -> String {
        self.preamble
            .iter()
            .find_map(|l| l.strip_prefix("sluice admin on "))
            .unwrap_or_else(|| panic!("no admin line in {:?}", self.preamble))
            .to_owned()
    }

    /// `http://ADDR`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `ws://ADDR`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory, from `/proc` (Linux), in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Kills the process at once (SIGKILL, as `kill -9`): no drain, no cleanup.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM, as an operator or a service manager would.
    pub fn terminate(&self) {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit by itself, up to `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Posts a raw body and returns the HTTP status and the body parsed as JSON (`Null` if empty).
pub async fn post(client: &reqwest::Client, url: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let response =
        client.post(url).header("content-type", "application/json").body(body).send().await.expect("request sent");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("body read");
    let value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("JSON answer") };
    (status, value)
}

/// Makes one call and returns the whole answer object.
pub async fn rpc(client: &reqwest::Client, url: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    post(client, url, body.to_string()).await.1
}

/// Makes one call and returns its `result`, panicking on an error answer.
pub async fn rpc_result(client: &reqwest::Client, url: &str, method: &str, params: Value) -> Value {
    let answer = rpc(client, url, method, params).await;
    assert!(answer.get("error").is_none(), "{method} failed: {answer}");
    answer["result"].clone()
}

/// A JSON-RPC quantity (`"0x1f"`) as a number; panics on anything else (tests only).
pub fn quantity(value: &Value) -> u64 {
    let text = value.as_str().unwrap_or_else(|| panic!("not a quantity: {value}"));
    u64::from_str_radix(text.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("not a quantity: {value}: {e}"))
}

/// Reads one sample of a Prometheus metric from `/metrics` (the line starting with `series`).
pub async fn metric(client: &reqwest::Client, base: &str, series: &str) -> Option<f64> {
    let text = client.get(format!("{base}/metrics")).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// The method of each JSON-RPC call in a request body (a single call or a batch); nothing for
/// text that is not JSON-RPC.
pub(crate) fn methods_in(text: &str) -> Vec<String> {
    let method = |v: &Value| v["method"].as_str().map(str::to_owned);
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items.iter().filter_map(method).collect(),
        Ok(v) => method(&v).into_iter().collect(),
        Err(_) => Vec::new(),
    }
}
