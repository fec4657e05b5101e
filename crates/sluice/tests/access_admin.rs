//! Keys managed while running, end to end: the admin API of real sluice processes, two
//! replicas sharing a real redis-server, WebSockets closed on revocation, usage per key summed
//! across replicas, a keys file surviving a restart, and bad admin input.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{eventually, ws, BIN};
use serde_json::{json, Value};
use sluice_testkit::{metric, Anvil, RedisServer, Sluice};

const TOKEN: &str = "admin-token-0123456789";

const TIERS: &str = r#"
[access.keys]
k-config = "free"
[access.tiers.free]
[access.tiers.pro]
costs = { "eth_call" = 3 }
[access.tiers.nologs]
deny = ["eth_getLogs"]
"#;

/// A replica with its admin API; `extra` is added to `[access]`.
fn replica(anvil: &Anvil, dir: &Path, name: &str, extra: &str) -> (Sluice, String) {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        "[access]\n{extra}\n[access.admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\nkeys_file = \"{}\"\n{TIERS}\n[[upstreams]]\nurl = \"{}\"\n",
        dir.join(format!("{name}-keys.json")).display(),
        anvil.http_url()
    );
    std::fs::write(&path, text).unwrap();
    let sluice = Sluice::spawn(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", path.to_str().unwrap()]);
    let admin = sluice.admin_url();
    (sluice, admin)
}

/// An admin call: (status, body).
async fn admin(client: &reqwest::Client, method: reqwest::Method, url: &str, body: Option<&str>) -> (u16, Value) {
    let mut request = client.request(method, url).bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

async fn status_of(client: &reqwest::Client, url: &str, method: &str) -> u16 {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": []});
    client.post(url).json(&body).send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_managed_keys_through_redis() {
    let anvil = Anvil::spawn();
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let shared = format!("redis_url = \"{}\"", redis.url());
    let (a, admin_a) = replica(&anvil, dir.path(), "a", &shared);
    let (b, admin_b) = replica(&anvil, dir.path(), "b", &shared);
    let client = reqwest::Client::new();
    use reqwest::Method;

    // Created through A's admin API: works on B within a second.
    let (status, created) =
        admin(&client, Method::POST, &format!("{admin_a}/keys"), Some(r#"{"tier": "free", "label": "acme"}"#)).await;
    assert_eq!(status, 201, "{created}");
    let (key, id) = (created["key"].as_str().unwrap().to_owned(), created["id"].as_str().unwrap().to_owned());
    assert_eq!(created["label"], "acme");
    let on_a = format!("{}/{key}", a.http_url());
    let on_b = format!("{}/{key}", b.http_url());
    assert_eq!(status_of(&client, &on_a, "eth_chainId").await, 200, "at once on the replica that made it");
    let started = Instant::now();
    eventually(Duration::from_secs(1), "the new key works on the other replica", || async {
        status_of(&client, &on_b, "eth_chainId").await == 200
    })
    .await;
    eprintln!("key visible on the other replica after {:?}", started.elapsed());
    let (_, listed) = admin(&client, Method::GET, &format!("{admin_b}/keys"), None).await;
    let ids: Vec<&str> = listed["keys"].as_array().unwrap().iter().filter_map(|k| k["id"].as_str()).collect();
    assert!(ids.contains(&id.as_str()) && ids.len() == 2, "{listed}");
    assert!(listed.to_string().find(&key).is_none(), "the key itself is never listed");

    // A tier change through B applies on A.
    let (status, changed) =
        admin(&client, Method::PATCH, &format!("{admin_b}/keys/{id}"), Some(r#"{"tier": "nologs"}"#)).await;
    assert_eq!((status, changed["tier"].as_str()), (200, Some("nologs")), "{changed}");
    eventually(Duration::from_secs(1), "the new tier applies on A", || async {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_getLogs", "params": [{}]});
        let answer: Value = client.post(&on_a).json(&body).send().await.unwrap().json().await.unwrap();
        answer["error"]["code"] == -32601
    })
    .await;

    // Usage, counted on both replicas, read from either: a fresh key, seen by B through its
    // admin API (which counts nothing), then used on both.
    let (_, metered) = admin(&client, Method::POST, &format!("{admin_a}/keys"), Some(r#"{"tier": "pro"}"#)).await;
    let metered_id = metered["id"].as_str().unwrap().to_owned();
    let metered_key = metered["key"].as_str().unwrap();
    eventually(Duration::from_secs(1), "the metered key on B", || async {
        admin(&client, Method::GET, &format!("{admin_b}/keys/{metered_id}"), None).await.0 == 200
    })
    .await;
    let eth_call = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": [{"to": "0x0000000000000000000000000000000000000001"}, "latest"]},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId"}
    ]);
    for base in [a.http_url(), b.http_url(), b.http_url()] {
        let response = client.post(format!("{base}/{metered_key}")).json(&eth_call).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let expected = json!({
        "total": {"calls": 6, "units": 12},
        "methods": {"eth_call": {"calls": 3, "units": 9}, "eth_chainId": {"calls": 3, "units": 3}}
    });
    eventually(Duration::from_secs(5), "usage from both replicas summed", || async {
        let (_, usage) = admin(&client, Method::GET, &format!("{admin_b}/keys/{metered_id}/usage?days=2"), None).await;
        let today = &usage["days"][1];
        today["total"] == expected["total"] && today["methods"] == expected["methods"]
    })
    .await;

    // Prometheus has the totals by tier, never by key: A served one batch of the pro key.
    assert_eq!(metric(&client, &a.http_url(), "sluice_access_units_total{tier=\"pro\"}").await, Some(4.0));
    assert_eq!(metric(&client, &a.http_url(), "sluice_access_calls_total{tier=\"pro\"}").await, Some(2.0));
    let exposition = client.get(format!("{}/metrics", a.http_url())).send().await.unwrap().text().await.unwrap();
    assert!(!exposition.contains(&metered_id) && !exposition.contains(metered_key));

    // Revoked through A: refused on both, and B's open WebSocket on it is closed.
    let mut socket = ws::connect(&format!("{}/{key}", b.ws_url())).await;
    ws::send(&mut socket, json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})).await;
    assert_eq!(ws::next(&mut socket).await["result"], "0x7a69");
    let (status, _) = admin(&client, Method::DELETE, &format!("{admin_a}/keys/{id}"), None).await;
    assert_eq!(status, 204);
    assert_eq!(status_of(&client, &on_a, "eth_chainId").await, 401);
    let (code, reason) = ws::closed(&mut socket, Duration::from_secs(2)).await;
    assert_eq!((code, reason.as_str()), (1008, "unauthorized: API key revoked"));
    assert_eq!(status_of(&client, &on_b, "eth_chainId").await, 401);
    let (status, _) = admin(&client, Method::GET, &format!("{admin_b}/keys/{id}"), None).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_bad_input_and_a_keys_file_survives_a_restart() {
    let anvil = Anvil::spawn();
    let dir = tempfile::tempdir().unwrap();
    let (sluice, admin_url) = replica(&anvil, dir.path(), "solo", "");
    let client = reqwest::Client::new();
    use reqwest::Method;
    let keys = format!("{admin_url}/keys");

    // No token, a wrong token: 401.
    let bare = client.get(&keys).send().await.unwrap();
    assert_eq!(bare.status(), 401);
    let wrong = client.get(&keys).bearer_auth("not-the-token").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"], "wrong admin token");

    // Bad bodies: 400 naming the field.
    for (body, expected) in [
        ("not json", "body: not JSON"),
        ("[1, 2]", "body: must be a JSON object"),
        (r#"{"tier": 5}"#, "tier: invalid type: integer `5`"),
        (r#"{"tier": "gold"}"#, "tier: \"gold\" is not defined"),
        (r#"{}"#, "tier: missing"),
        (r#"{"tier": "free", "nonsense": 1}"#, "nonsense: unknown field `nonsense`"),
        (r#"{"tier": "free", "contracts": ["0x12"]}"#, "contracts: \"0x12\" is not an address"),
        (r#"{"tier": "free", "allow_ips": ["300.1.1.1"]}"#, "allow_ips[0]: \"300.1.1.1\" is not an address"),
        (r#"{"tier": "free", "methods": ["eth*call"]}"#, "methods: \"eth*call\""),
        (r#"{"tier": "free", "networks": ["base"]}"#, "networks: \"base\" is not served here"),
        (r#"{"tier": "free", "key": 7}"#, "key: must be a string"),
        (r#"{"tier": "free", "key": "short"}"#, "key: must be 16 to 128 characters"),
    ] {
        let (status, answer) = admin(&client, Method::POST, &keys, Some(body)).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(expected), "{body}: {error}");
    }
    let huge = format!(r#"{{"tier": "free", "label": "{}"}}"#, "x".repeat(100_000));
    assert_eq!(admin(&client, Method::POST, &keys, Some(&huge)).await.0, 413);
    let (status, _) = admin(&client, Method::PATCH, &format!("{keys}/nope"), Some(r#"{"tier": "pro"}"#)).await;
    assert_eq!(status, 404);

    // Keys from the file are listed, read-only.
    let (_, listed) = admin(&client, Method::GET, &keys, None).await;
    let config_key = &listed["keys"][0];
    assert_eq!(config_key["source"], "config");
    let config_id = config_key["id"].as_str().unwrap();
    assert_eq!(admin(&client, Method::DELETE, &format!("{keys}/{config_id}"), None).await.0, 409);

    // A key of the caller's choosing, kept in the keys file across a restart.
    let (status, created) =
        admin(&client, Method::POST, &keys, Some(r#"{"tier": "free", "key": "chosen-key-0000000001"}"#)).await;
    assert_eq!(status, 201, "{created}");
    let url = |s: &Sluice| format!("{}/chosen-key-0000000001", s.http_url());
    assert_eq!(status_of(&client, &url(&sluice), "eth_chainId").await, 200);
    drop(sluice);
    let (again, _) = replica(&anvil, dir.path(), "solo", "");
    assert_eq!(status_of(&client, &url(&again), "eth_chainId").await, 200, "the key survived the restart");
}
