//! The Redis that replicas share, made highly available: a Sentinel-managed master
//! (`redis+sentinel://`) failing over under load, and a three-node Redis Cluster
//! (`redis+cluster://`) serving the cache tier, quotas and head following. Real `redis-server`
//! processes on loopback (Sentinels are `redis-server --sentinel`), real anvil, real sluice
//! replicas; a counting relay in front of anvil counts what reaches the provider.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_testkit::{free_port, Anvil, FakeUpstream, Fault};

/// A `redis-server` with arguments of its own, killed on drop.
struct Server {
    child: Option<Child>,
    port: u16,
}

impl Server {
    fn spawn(args: &[&str]) -> Self {
        Self::spawn_on(free_port(), args)
    }

    fn spawn_on(port: u16, args: &[&str]) -> Self {
        Self::launch(port, &[], args)
    }

    /// A Sentinel watching `master` as `mymaster` (quorum 2), from a config file it may rewrite.
    fn sentinel(dir: &std::path::Path, master: u16) -> Self {
        let port = free_port();
        let file = dir.join(format!("sentinel-{port}.conf"));
        let conf = format!(
            "sentinel monitor mymaster 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds mymaster 1000\n\
             sentinel failover-timeout mymaster 4000\n\
             sentinel parallel-syncs mymaster 1\n"
        );
        std::fs::write(&file, conf).unwrap();
        Self::launch(port, &[file.to_str().unwrap()], &["--sentinel"])
    }

    /// `redis-server [before…] --port PORT --bind 127.0.0.1 [after…]`, once it answers PING.
    fn launch(port: u16, before: &[&str], after: &[&str]) -> Self {
        let child = Command::new("redis-server")
            .args(before)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(after)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts (run scripts/install-tools.sh)");
        let server = Self { child: Some(child), port };
        server.wait_until(Duration::from_secs(10), |s| s.cli(&["PING"]) == "PONG", "answering PING");
        server
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw"])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn wait_until(&self, within: Duration, done: impl Fn(&Self) -> bool, what: &str) {
        let deadline = Instant::now() + within;
        while !done(self) {
            assert!(Instant::now() < deadline, "redis on port {}: not {what} within {within:?}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One call's outcome as its caller sees it: "ok", or the HTTP status, error code and message.
async fn outcome(client: &reqwest::Client, url: &str, key: &str, i: usize) -> String {
    let address = format!("0x{:040x}", i + 1);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [address, "0x0"]});
    let sent = client.post(url).header("x-api-key", key).json(&body).timeout(Duration::from_secs(10)).send().await;
    let Ok(response) = sent else { return "no answer".into() };
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    match (answer.get("result"), answer.get("error")) {
        (Some(_), None) => "ok".into(),
        (None, Some(e)) => format!("{status} {} {}", e["code"], e["message"].as_str().unwrap_or("")),
        _ => format!("{status} unreadable: {answer}"),
    }
}

fn config(redis_url: &str, upstream: &str, per_day: u64) -> String {
    format!(
        "[cache]\nenabled = false\n[mempool]\nenabled = false\n\
         [pool]\nprobe_interval = \"10s\"\nbudget_store = \"{redis_url}\"\nbudget_store_fail_open = true\n\
         [access]\nredis_url = \"{redis_url}\"\nfail_open = false\n\
         [access.keys]\nk = \"day\"\n[access.tiers.day]\nper_day = {per_day}\n\
         [[upstreams]]\nurl = \"{upstream}\"\ndaily_quota = 1000000\n"
    )
}

/// Three replicas keep serving 200 calls a second while the Redis master they share is killed
/// and the Sentinels promote its replica: every call is answered or refused with a documented
/// error (`-32002` while no master is reachable, the key being fail-closed; `-32005` once its
/// daily quota is spent), the quota counted before the failover still holds after it, and
/// the provider sees no more calls than the key was allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_sentinel_managed_redis_ride_through_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let mut master = Server::spawn(&["--save", "", "--appendonly", "no"]);
    let port = master.port.to_string();
    let replica = Server::spawn(&["--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", &port]);
    replica.wait_until(
        Duration::from_secs(10),
        |r| r.cli(&["INFO", "replication"]).contains("master_link_status:up"),
        "in sync",
    );
    let sentinels: Vec<Server> = (0..3).map(|_| Server::sentinel(dir.path(), master.port)).collect();
    for s in &sentinels {
        let knows = |s: &Server| s.cli(&["SENTINEL", "replicas", "mymaster"]).contains(&replica.port.to_string());
        s.wait_until(Duration::from_secs(15), knows, "aware of the replica");
    }
    let hosts: Vec<String> = sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
    let url = format!("redis+sentinel://{}/mymaster", hosts.join(","));

    let anvil = Anvil::spawn();
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    const PER_DAY: u64 = 1500;
    let toml = config(&url, &relay.url, PER_DAY);
    let replicas: Vec<common::Configured> = (0..3).map(|_| common::with_config(&toml)).collect();
    let urls: Vec<String> = replicas.iter().map(|r| r.sluice.http_url()).collect();
    let client = reqwest::Client::new();

    // 200 calls a second for 16 s, round robin; the master killed after 3 s (a failover slower than 8 s would leave the quota unspent).
    let (rate, seconds) = (200u64, 16u64);
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate));
    let mut tasks = Vec::new();
    let started = Instant::now();
    let mut killed_at = None;
    for i in 0..(rate * seconds) as usize {
        tick.tick().await;
        if killed_at.is_none() && started.elapsed() >= Duration::from_secs(3) {
            master.kill();
            killed_at = Some(i);
        }
        let (client, url) = (client.clone(), urls[i % urls.len()].clone());
        tasks.push(tokio::spawn(async move { outcome(&client, &url, "k", i).await }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let killed_at = killed_at.expect("the master was killed");

    let count = |what: &dyn Fn(&str) -> bool| outcomes.iter().filter(|o| what(o)).count();
    let ok = count(&|o| o == "ok");
    let unavailable = count(&|o| o.starts_with("503 -32002"));
    let over_quota = count(&|o| o.starts_with("429 -32005") && o.contains("daily quota"));
    let other: Vec<&String> = outcomes
        .iter()
        .filter(|o| {
            *o != "ok" && !o.starts_with("503 -32002") && !(o.starts_with("429 -32005") && o.contains("daily quota"))
        })
        .collect();
    eprintln!(
        "{} calls: {ok} ok, {unavailable} refused while no master answered, {over_quota} over the daily quota; \
         the master killed at call {killed_at}",
        outcomes.len()
    );
    assert!(other.is_empty(), "every call answered or refused as documented: {:?}", &other[..other.len().min(5)]);
    assert!(outcomes[..killed_at].iter().all(|o| o == "ok"), "all answered before the failover");
    // The quota is reached after the failover (fewer than 1,500 calls came before it): the
    // new master counts on from what the old one had replicated.
    assert!(over_quota > 0, "the quota was spent through the new master");
    assert!(outcomes.last().is_some_and(|o| o.contains("daily quota")), "Redis answers again at the end");
    // Writes the old master acknowledged but had not replicated are lost with it (Redis
    // replicates asynchronously): a few calls at most, on loopback.
    let provider = relay.requests_for("eth_getBalance") as usize;
    assert_eq!(provider, ok, "every call answered ok reached the provider once, no other did");
    assert!(ok <= PER_DAY as usize + 10, "{ok} calls allowed of a quota of {PER_DAY}");
    assert!(ok >= PER_DAY as usize - 10, "{ok} calls allowed of a quota of {PER_DAY}");
    // The member's shared budget counted each call once, across the failover: what the
    // promoted replica holds is no more than the provider saw, and short of it only by the
    // charges fail-open let through uncounted while no master answered (each one counted
    // as a store error).
    let keys = replica.cli(&["--scan", "--pattern", "sluice:upstream-budget:*:day:*"]);
    let counted: u64 = keys.lines().map(|key| replica.cli(&["GET", key]).parse::<u64>().unwrap_or(0)).sum();
    let seen = relay.methods().len() as u64;
    let mut uncounted = 0;
    for url in &urls {
        let errors = sluice_testkit::metric(&client, url, "sluice_upstream_budget_store_errors_total").await;
        uncounted += errors.unwrap_or(0.0) as u64;
    }
    eprintln!("the shared budget counted {counted} calls, {uncounted} let through uncounted; the provider saw {seen}");
    assert!(counted <= seen, "budget counted {counted} of {seen} calls seen");
    assert!(counted + uncounted >= seen, "budget counted {counted} + {uncounted} uncounted of {seen} seen");
}

/// A three-node Redis Cluster behind two replicas: the key's daily quota holds across both,
/// an answer one replica cached is the other's hit (the provider sees it once), and one
/// replica holds the head-following lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_serves_the_cache_tier_quotas_and_head_following() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes: Vec<Server> = ports
        .iter()
        .map(|port| {
            let conf = dir.path().join(format!("nodes-{port}.conf"));
            Server::spawn_on(
                *port,
                &[
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    conf.to_str().unwrap(),
                ],
            )
        })
        .collect();
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&hosts)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli runs");
    assert!(created.status.success(), "cluster created: {}", String::from_utf8_lossy(&created.stdout));
    for node in &nodes {
        node.wait_until(
            Duration::from_secs(15),
            |n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"),
            "in a cluster",
        );
    }
    let url = format!("redis+cluster://{}", hosts.join(","));

    let anvil = Anvil::spawn();
    sluice_testkit::rpc_result(&reqwest::Client::new(), &anvil.http_url(), "anvil_mine", json!(["0x3"])).await;
    let relay =
        FakeUpstream::spawn(Fault::Relay { to: anvil.http_url(), delay: Duration::ZERO, fail_method: None }).await;
    let toml = format!(
        "[mempool]\nenabled = false\n[cache.redis]\nurl = \"{url}\"\n\
         [access]\nredis_url = \"{url}\"\nfail_open = false\n[access.keys]\nk = \"day\"\n[access.tiers.day]\nper_day = 30\n\
         [[upstreams]]\nurl = \"{}\"\n",
        relay.url
    );
    let (a, b) = (common::with_config(&toml), common::with_config(&toml));
    let urls = [a.sluice.http_url(), b.sluice.http_url()];
    let client = reqwest::Client::new();
    let call = |url: &str, method: &str, params: Value| {
        let request = client
            .post(url)
            .header("x-api-key", "k")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };

    // Both replicas have connected their cache tier to the cluster and hold the head.
    for url in &urls {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let connected = sluice_testkit::metric(&client, url, "sluice_cache_redis_connected").await;
            // Read from /metrics: a keyed call would count against the quota below.
            let head = sluice_testkit::metric(&client, url, "sluice_chain_head{network=\"default\"}").await;
            if connected == Some(1.0) && head == Some(3.0) {
                break;
            }
            assert!(Instant::now() < deadline, "{url}: tier connected {connected:?}, head {head:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // An answer one replica cached is the other's hit, through the cluster.
    let params = json!(["0x00000000000000000000000000000000000000aa", "0x2"]);
    let first = call(&urls[0], "eth_getBalance", params.clone()).await;
    assert!(first["result"].is_string(), "{first}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let stored = || nodes.iter().any(|n| !n.cli(&["--scan", "--pattern", "sluice:31337:*"]).is_empty());
    while !stored() {
        assert!(Instant::now() < deadline, "the answer reached the cluster");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = call(&urls[1], "eth_getBalance", params).await;
    assert_eq!(again["result"], first["result"]);
    assert_eq!(relay.requests_for("eth_getBalance"), 1, "the second replica's answer came from the cluster");

    // The quota's script keys share a slot (a hash tag): 30 a day hold across both replicas.
    let mut allowed = 2; // the two block reads above
    for i in 0..40 {
        if call(&urls[i % 2], "eth_chainId", json!([])).await.get("result").is_some() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 30, "the key's 30 a day hold across both replicas");

    // One replica follows the chain for both: its lease is in the cluster.
    let lease = |n: &Server| !n.cli(&["-c", "GET", "sluice:heads:{default}:lease"]).is_empty();
    nodes[0].wait_until(Duration::from_secs(10), lease, "holding a follower's lease");
}
