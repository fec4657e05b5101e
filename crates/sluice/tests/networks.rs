//! Several networks behind one sluice: real anvils on different chain ids, one `sluice serve`
//! with `[[networks]]`, every path checked against each node's own answers.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{eventually, ws, BIN, DEV_ACCOUNT, DEV_KEY};
use futures_util::StreamExt;
use serde_json::{json, Value};
use sluice_testkit::{foundry_tool, post, rpc, rpc_result, Anvil, RedisServer, Sluice};

/// Two anvils on different chains (and different genesis times, so their blocks differ).
fn two_chains(b_args: &[&str]) -> (Anvil, Anvil) {
    let a = Anvil::spawn_with(&["--chain-id", "31337"]);
    let mut args = vec!["--chain-id", "31338", "--timestamp", "1700000000"];
    args.extend_from_slice(b_args);
    (a, Anvil::spawn_with(&args))
}

/// A configuration serving `eth` (chain 31337, at `a`) and `base` (31338, at `b`), with `extra`
/// top-level text before the networks.
fn config(dir: &Path, extra: &str, a: &[String], b: &[String]) -> std::path::PathBuf {
    let upstreams =
        |urls: &[String]| urls.iter().map(|u| format!("[[networks.upstreams]]\nurl = \"{u}\"\n")).collect::<String>();
    let text = format!(
        "{extra}\n[[networks]]\nid = \"eth\"\nchain_id = 31337\n{}\n[[networks]]\nid = \"base\"\nchain_id = 31338\n{}",
        upstreams(a),
        upstreams(b)
    );
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

fn serve(file: &Path, journal: &Path) -> Sluice {
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", file.to_str().expect("a path")];
    Sluice::spawn_env(BIN, &args, &[("SLUICE_MEMPOOL__JOURNAL", journal.to_str().expect("a path"))])
}

/// The calls compared per network: chain, heads, blocks by number and tag, state, errors.
fn corpus() -> Vec<(&'static str, Value)> {
    vec![
        ("eth_chainId", json!([])),
        ("net_version", json!([])),
        ("eth_blockNumber", json!([])),
        ("eth_getBlockByNumber", json!(["0x0", false])),
        ("eth_getBlockByNumber", json!(["0x1", true])),
        ("eth_getBlockByNumber", json!(["0x2", false])),
        ("eth_getBlockByNumber", json!(["latest", false])),
        ("eth_getBalance", json!([DEV_ACCOUNT, "0x1"])),
        ("eth_getTransactionCount", json!([DEV_ACCOUNT, "latest"])),
        ("eth_getBlockByNumber", json!(["0xffff", false])),
        ("eth_doesNotExist", json!([])),
        ("eth_getBalance", json!(["not-an-address", "latest"])),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_network_answers_as_its_own_node_and_the_cache_never_mixes_them() {
    let (a, b) = two_chains(&[]);
    let client = reqwest::Client::new();
    for (anvil, blocks) in [(&a, 3), (&b, 5)] {
        for _ in 0..blocks {
            rpc_result(&client, &anvil.http_url(), "evm_mine", json!([])).await;
        }
    }
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("[cache.redis]\nurl = \"{}\"\n", redis.url());
    let file = config(dir.path(), &extra, &[a.http_url()], &[b.http_url()]);
    let first = serve(&file, &dir.path().join("one.journal"));
    let base = first.http_url();
    let paths = [("eth", "evm/31337", &a), ("base", "evm/31338", &b)];
    // Twice each (the second from the cache), by id and by chain id, one network after the other.
    for round in 0..2 {
        for (id, by_chain, anvil) in paths {
            for (method, params) in corpus() {
                let direct = rpc(&client, &anvil.http_url(), method, params.clone()).await;
                for path in [id, by_chain] {
                    let via = rpc(&client, &format!("{base}/{path}"), method, params.clone()).await;
                    assert_eq!(via, direct, "round {round}, /{path} {method} {params}");
                }
            }
        }
    }
    let hash_a =
        rpc_result(&client, &a.http_url(), "eth_getBlockByNumber", json!(["0x1", false])).await["hash"].clone();
    let hash_b =
        rpc_result(&client, &b.http_url(), "eth_getBlockByNumber", json!(["0x1", false])).await["hash"].clone();
    assert_ne!(hash_a, hash_b, "the two chains' blocks differ, so a mixed-up cache would show");
    // A second sluice sharing the Redis tier, asked in the other order: still each network's own.
    let second = serve(&file, &dir.path().join("two.journal"));
    for (id, _, anvil) in paths.iter().rev() {
        for (method, params) in corpus() {
            let direct = rpc(&client, &anvil.http_url(), method, params.clone()).await;
            let via = rpc(&client, &format!("{}/{id}", second.http_url()), method, params.clone()).await;
            assert_eq!(via, direct, "second sluice, /{id} {method} {params}");
        }
    }
    assert!(redis.dbsize() > 0, "the Redis tier was used");
    for (id, _, _) in paths {
        let series = format!("sluice_cache_hits_total{{network=\"{id}\",tier=\"memory\"}} ");
        let hits = sluice_testkit::metric(&client, &base, &series).await.unwrap_or(0.0);
        assert!(hits > 0.0, "{id}'s own cache answered the second round");
        let series = format!("sluice_requests_total{{network=\"{id}\",method=\"eth_chainId\",outcome=\"ok\"}} ");
        assert_eq!(sluice_testkit::metric(&client, &base, &series).await, Some(4.0), "{id}: 2 rounds × 2 paths");
    }
    // `/` has no default here: an error naming the paths; an unknown network is 404.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).to_string();
    let (status, root) = post(&client, &base, body.clone()).await;
    assert_eq!(status, 404);
    let message = root["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("/eth or /evm/31337") && message.contains("/base or /evm/31338"), "{root}");
    for path in ["op", "evm/10", "evm/x", "eth/key/extra"] {
        let (status, answer) = post(&client, &format!("{base}/{path}"), body.clone()).await;
        assert_eq!(status, 404, "/{path}: {answer}");
        assert_eq!(answer["error"]["code"], -32600, "/{path}: {answer}");
        assert!(!answer.to_string().contains("base\""), "/{path} lists nothing: {answer}");
    }
    let status: Value = client.get(format!("{base}/status")).send().await.unwrap().json().await.unwrap();
    assert_eq!(status["networks"]["eth"]["chain_id"], 31337, "{status}");
    assert_eq!(status["networks"]["base"]["upstreams"][0]["name"], "base-0", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_sent_to_one_network_never_reaches_the_other() {
    // Neither anvil mines by itself: the transaction stays visible in the pools until mined.
    let a = Anvil::spawn_with(&["--chain-id", "31337", "--no-mining"]);
    let b = Anvil::spawn_with(&["--chain-id", "31338", "--no-mining"]);
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "", &[a.http_url()], &[b.http_url()]);
    let sluice = serve(&file, &dir.path().join("pool.journal"));
    let (eth, base) = (format!("{}/eth", sluice.http_url()), format!("{}/evm/31338", sluice.http_url()));
    // A real client signs for the chain the path serves (cast reads eth_chainId from it).
    let out = std::process::Command::new(foundry_tool("cast"))
        .args(["mktx", "--rpc-url", &base, "--private-key", DEV_KEY])
        .args(["0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "--value", "7"])
        .output()
        .expect("cast runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let raw = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let hash = rpc_result(&client, &base, "eth_sendRawTransaction", json!([raw])).await;
    let hash = hash.as_str().expect("a hash").to_owned();
    // The other network's pool refuses it: it is signed for another chain.
    let elsewhere = rpc(&client, &eth, "eth_sendRawTransaction", json!([raw])).await;
    assert!(elsewhere["error"]["message"].as_str().unwrap_or_default().contains("chain"), "{elsewhere}");
    let pending = |url: String| {
        let client = client.clone();
        async move { rpc_result(&client, &url, "txpool_content", json!([])).await["pending"].to_string() }
    };
    assert!(pending(base.clone()).await.contains(&hash), "in base's pool");
    let accepted = |id: &str| {
        let series = format!("sluice_mempool_accepted_total{{network=\"{id}\"}} ");
        let (client, url) = (client.clone(), sluice.http_url());
        async move { sluice_testkit::metric(&client, &url, &series).await }
    };
    // Every network registers its counter at zero, so that dashboards see it before the first transaction.
    assert_eq!((accepted("base").await, accepted("eth").await), (Some(1.0), Some(0.0)), "counted on base only");
    assert!(!pending(eth.clone()).await.contains(&hash), "not in eth's pool");
    eventually(Duration::from_secs(5), "relayed to base's anvil", || async {
        rpc_result(&client, &b.http_url(), "txpool_status", json!([])).await["pending"] == "0x1"
    })
    .await;
    rpc_result(&client, &b.http_url(), "evm_mine", json!([])).await;
    rpc_result(&client, &a.http_url(), "evm_mine", json!([])).await;
    let receipt = rpc_result(&client, &b.http_url(), "eth_getTransactionReceipt", json!([hash])).await;
    assert_eq!(receipt["status"], "0x1", "mined on base: {receipt}");
    assert_eq!(rpc_result(&client, &a.http_url(), "txpool_status", json!([])).await["pending"], "0x0");
    assert!(rpc_result(&client, &a.http_url(), "eth_getTransactionByHash", json!([hash])).await.is_null());
    // Journals: base's holds the transaction's bytes, eth's does not.
    let bytes = alloy_primitives::hex::decode(&raw).expect("hex");
    let holds = |name: &str| {
        let journal = std::fs::read(dir.path().join(name)).unwrap_or_default();
        journal.windows(bytes.len()).any(|w| w == bytes.as_slice())
    };
    assert!(holds("pool-base.journal"), "journaled on base");
    assert!(!holds("pool-eth.journal"), "never journaled on eth");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_heads_on_each_path_follow_only_that_networks_blocks() {
    let (a, b) = two_chains(&[]);
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "", &[a.http_url()], &[b.http_url()]);
    let sluice = serve(&file, &dir.path().join("pool.journal"));
    let mut on_eth = ws::connect(&format!("{}/eth", sluice.ws_url())).await;
    let mut on_base = ws::connect(&format!("{}/evm/31338", sluice.ws_url())).await;
    ws::subscribe(&mut on_eth, 1, json!(["newHeads"])).await;
    ws::subscribe(&mut on_base, 1, json!(["newHeads"])).await;
    for round in 0..3 {
        for (anvil, socket, other) in [(&b, &mut on_base, &a), (&a, &mut on_eth, &b)] {
            rpc_result(&client, &anvil.http_url(), "evm_mine", json!([])).await;
            let head = rpc_result(&client, &anvil.http_url(), "eth_getBlockByNumber", json!(["latest", false])).await;
            let note = ws::next(socket).await;
            assert_eq!(note["params"]["result"]["hash"], head["hash"], "round {round}: {note}");
            let other_head =
                rpc_result(&client, &other.http_url(), "eth_getBlockByNumber", json!(["latest", false])).await;
            assert_ne!(note["params"]["result"]["hash"], other_head["hash"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_limited_to_one_network_is_refused_on_the_other() {
    let (a, b) = two_chains(&[]);
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let access = "[access.keys]\nk1 = \"eth-only\"\nk2 = \"all\"\n[access.tiers.eth-only]\nnetworks = [\"eth\"]\n[access.tiers.all]\n";
    let file = config(dir.path(), access, &[a.http_url()], &[b.http_url()]);
    let sluice = serve(&file, &dir.path().join("pool.journal"));
    let base = sluice.http_url();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).to_string();
    let (status, answer) = post(&client, &format!("{base}/eth/k1"), body.clone()).await;
    assert_eq!((status, answer["result"].clone()), (200, json!("0x7a69")), "{answer}");
    let (status, answer) = post(&client, &format!("{base}/base/k1"), body.clone()).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["code"], -32600);
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("network base"), "{answer}");
    let (status, _) = post(&client, &format!("{base}/evm/31338/k1"), body.clone()).await;
    assert_eq!(status, 403);
    let (status, answer) = post(&client, &format!("{base}/evm/31338/k2"), body.clone()).await;
    assert_eq!((status, answer["result"].clone()), (200, json!("0x7a6a")), "{answer}");
    // The same key in a header, and on a WebSocket.
    let refused = client
        .post(format!("{base}/base"))
        .header("content-type", "application/json")
        .header("x-api-key", "k1")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    match tokio_tungstenite::connect_async(format!("{}/base/k1", sluice.ws_url())).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => assert_eq!(response.status().as_u16(), 403),
        other => panic!("a WebSocket on a network the key may not use: {:?}", other.map(|(_, r)| r.status())),
    }
    let mut allowed = ws::connect(&format!("{}/eth/k1", sluice.ws_url())).await;
    ws::send(&mut allowed, json!({"jsonrpc": "2.0", "id": 5, "method": "eth_chainId", "params": []})).await;
    assert_eq!(ws::next(&mut allowed).await["result"], "0x7a69");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_networks_upstreams_down_the_other_keeps_answering() {
    let (a, b) = two_chains(&[]);
    // eth also lists base's node: on another chain, it is refused at start and eth serves alone.
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "", &[a.http_url(), b.http_url()], &[b.http_url()]);
    let sluice = serve(&file, &dir.path().join("pool.journal"));
    let base = sluice.http_url();
    let status: Value = client.get(format!("{base}/status")).send().await.unwrap().json().await.unwrap();
    let members = status["networks"]["eth"]["upstreams"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 1, "the node on chain 31338 is not in eth's pool: {status}");
    for _ in 0..20 {
        assert_eq!(rpc_result(&client, &format!("{base}/eth"), "eth_chainId", json!([])).await, "0x7a69");
    }
    drop(a);
    // 400 calls on base, 8 at a time, while eth has no node left: none fails.
    let calls = (0..400u64).map(|i| {
        let (client, url) = (client.clone(), format!("{base}/base"));
        async move {
            let tag = ["0x0", "latest", "earliest"][i as usize % 3];
            let params = json!([DEV_ACCOUNT, tag]);
            rpc(&client, &url, "eth_getBalance", params).await
        }
    });
    let answers: Vec<Value> = futures_util::stream::iter(calls).buffer_unordered(8).collect().await;
    let errors: Vec<&Value> = answers.iter().filter(|a| a.get("result").is_none()).collect();
    assert!(errors.is_empty(), "{} of 400 failed, first: {:?}", errors.len(), errors.first());
    let down = rpc(&client, &format!("{base}/eth"), "eth_getBalance", json!([DEV_ACCOUNT, "latest"])).await;
    assert!(down.get("error").is_some(), "eth has no node: {down}");
    let ready = client.get(format!("{base}/ready")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    assert!(ready.text().await.unwrap().contains("eth"));
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Signs a transfer for the chain `url` serves (cast reads its chain id and nonce there).
fn signed_transfer(url: &str) -> String {
    let out = std::process::Command::new(foundry_tool("cast"))
        .args(["mktx", "--rpc-url", url, "--private-key", DEV_KEY])
        .args(["0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "--value", "7"])
        .output()
        .expect("cast runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_messages_name_their_chain_and_reach_only_that_networks_pool() {
    let a = Anvil::spawn_with(&["--chain-id", "31337", "--no-mining"]);
    let b = Anvil::spawn_with(&["--chain-id", "31338", "--no-mining"]);
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    // X serves eth and base; Y serves eth only and dials X.
    let mesh = |name: &str, peers: &str| {
        let key = dir.path().join(format!("{name}.key"));
        format!(
            "[mesh]\nlisten = [\"/ip4/127.0.0.1/udp/{}/quic-v1\"]\npeers = [{peers}]\nkey = \"{}\"\n",
            free_udp_port(),
            key.display()
        )
    };
    let x_dir = dir.path().join("x");
    std::fs::create_dir_all(&x_dir).unwrap();
    let x_file = config(&x_dir, &mesh("x", ""), &[a.http_url()], &[b.http_url()]);
    let x = serve(&x_file, &x_dir.join("pool.journal"));
    let line = x.preamble.iter().find(|l| l.starts_with("sluice mesh peer ")).expect("a mesh line");
    let x_address = line.split(" on ").nth(1).and_then(|a| a.split_whitespace().next()).expect("an address");
    let y_text = format!(
        "{}\n[[networks]]\nid = \"eth\"\nchain_id = 31337\n[[networks.upstreams]]\nurl = \"{}\"\n",
        mesh("y", &format!("\"{x_address}\"")),
        a.http_url()
    );
    let y_file = dir.path().join("y.toml");
    std::fs::write(&y_file, y_text).unwrap();
    let y = serve(&y_file, &dir.path().join("y.journal"));
    let status = |node: String| {
        let client = client.clone();
        async move {
            let status: Value = client.get(format!("{node}/status")).send().await.unwrap().json().await.unwrap();
            status["mesh"].clone()
        }
    };
    eventually(Duration::from_secs(10), "the two nodes connected", || async {
        status(y.http_url()).await["peers"].as_array().is_some_and(|p| p.iter().any(|p| p["connected"] == true))
    })
    .await;
    let in_pool = |url: String, hash: String| {
        let client = client.clone();
        async move { rpc_result(&client, &url, "txpool_content", json!([])).await["pending"].to_string().contains(&hash) }
    };
    // A base transaction: Y serves no base, refuses it (counted), holds nothing against X.
    let raw_base = signed_transfer(&format!("{}/base", x.http_url()));
    let on_base =
        rpc_result(&client, &format!("{}/base", x.http_url()), "eth_sendRawTransaction", json!([raw_base])).await;
    eventually(Duration::from_secs(10), "Y refused base's transaction as a chain it does not serve", || async {
        status(y.http_url()).await["inbound"]["unserved_chain"].as_u64().unwrap_or(0) >= 1
    })
    .await;
    let y_mesh = status(y.http_url()).await;
    assert_eq!(y_mesh["inbound"]["malformed"], 0, "not held against the sender: {y_mesh}");
    assert!(!in_pool(format!("{}/eth", y.http_url()), on_base.as_str().unwrap().to_owned()).await);
    // An eth transaction reaches Y's eth pool.
    let raw_eth = signed_transfer(&format!("{}/eth", x.http_url()));
    let on_eth =
        rpc_result(&client, &format!("{}/eth", x.http_url()), "eth_sendRawTransaction", json!([raw_eth])).await;
    let on_eth = on_eth.as_str().unwrap().to_owned();
    eventually(Duration::from_secs(10), "eth's transaction in Y's eth pool", || {
        in_pool(format!("{}/eth", y.http_url()), on_eth.clone())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_dev_with_networks_serves_one_anvil_per_chain() {
    let quic = format!("127.0.0.1:{}", free_udp_port());
    let args = ["dev", "--networks", "3", "--listen", "127.0.0.1:0", "--quic", quic.as_str()];
    let mut dev = Sluice::spawn(BIN, &args);
    let client = reqwest::Client::new();
    let anvils = dev.preamble.iter().filter(|l| l.starts_with("anvil devnet on ")).count();
    assert_eq!(anvils, 3, "{:?}", dev.preamble);
    for (i, chain) in [31337u64, 31338, 31339].into_iter().enumerate() {
        let hex = json!(format!("0x{chain:x}"));
        for path in [format!("devnet{}", i + 1), format!("evm/{chain}")] {
            let url = format!("{}/{path}", dev.http_url());
            assert_eq!(rpc_result(&client, &url, "eth_chainId", json!([])).await, hex, "/{path}");
        }
        assert!(dev.preamble.iter().any(|l| l.contains(&format!("/devnet{} and /evm/{chain}", i + 1))), "printed");
    }
    assert_eq!(rpc_result(&client, &dev.http_url(), "eth_chainId", json!([])).await, "0x7a69", "/ is the first");
    // Stopped as an operator would, so that it stops its anvils too.
    dev.terminate();
    assert!(dev.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()), "exits after stopping its anvils");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_networks_own_quic_ingress_feeds_only_its_pool() {
    let a = Anvil::spawn_with(&["--chain-id", "31337", "--no-mining"]);
    let b = Anvil::spawn_with(&["--chain-id", "31338", "--no-mining"]);
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let quic = format!("127.0.0.1:{}", free_udp_port());
    let file = config(dir.path(), "", &[a.http_url()], &[b.http_url()]);
    let ingress =
        format!("[networks.ingress]\nlisten = \"{quic}\"\nkey = \"{}\"\n", dir.path().join("q.key").display());
    std::fs::write(&file, std::fs::read_to_string(&file).unwrap() + &ingress).unwrap();
    let sluice = serve(&file, &dir.path().join("pool.journal"));
    assert!(
        sluice.preamble.iter().any(|l| l.contains(&format!("quic://{quic} for network base"))),
        "{:?}",
        sluice.preamble
    );
    let (eth, base) = (format!("{}/eth", sluice.http_url()), format!("{}/base", sluice.http_url()));
    let send = |raw: &str| {
        let mut child = std::process::Command::new(BIN)
            .args(["send", "--quic", &quic, "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sluice send runs");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), format!("{raw}\n").as_bytes()).unwrap();
        child.wait_with_output().expect("sluice send ends")
    };
    // Signed for base: taken into base's pool, not eth's.
    let out = send(&signed_transfer(&base));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let pending = |url: &str| {
        let (client, url) = (client.clone(), url.to_owned());
        async move { rpc_result(&client, &url, "txpool_content", json!([])).await["pending"].to_string() }
    };
    assert!(pending(&base).await.contains(&hash), "{hash} in base's pool");
    assert!(!pending(&eth).await.contains(&hash));
    // Signed for eth: base's ingress refuses it.
    let out = send(&signed_transfer(&eth));
    assert!(!out.status.success(), "refused: {}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("chain"), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(rpc_result(&client, &eth, "txpool_status", json!([])).await["pending"], "0x0");
}
