//! JSON Web Tokens end to end: real anvils on two networks behind one sluice, tokens signed
//! here with HS256 (two keys, for rotation), ES256 and RS256 (test-only keys in
//! `tests/fixtures/jwt`), sent as `Authorization: Bearer` over HTTP and WebSocket.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{ws, BIN};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use sluice_testkit::{Anvil, Sluice};

const OLD_SECRET: &str = "old-secret-0123456789";
const NEW_SECRET: &str = "new-secret-0123456789";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt").join(name)
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// A token signed with key `kid` (HS256 secrets or the fixture's private keys).
fn token(alg: Algorithm, kid: Option<&str>, claims: Value) -> String {
    let key = match alg {
        Algorithm::HS256 if kid == Some("hs-old") => EncodingKey::from_secret(OLD_SECRET.as_bytes()),
        Algorithm::HS256 => EncodingKey::from_secret(NEW_SECRET.as_bytes()),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&std::fs::read(fixture("es256-private.pem")).unwrap()),
        _ => EncodingKey::from_rsa_pem(&std::fs::read(fixture("rs256-private.pem")).unwrap()),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, &claims, &key.unwrap()).unwrap()
}

fn serve(a: &Anvil, b: &Anvil, dir: &Path) -> Sluice {
    let text = format!(
        r#"
[access.tiers.pro]
[access.tiers.free]
per_day = 100000

[access.jwt]
[[access.jwt.keys]]
kid = "hs-old"
algorithm = "HS256"
secret = "{OLD_SECRET}"
[[access.jwt.keys]]
kid = "hs-new"
algorithm = "HS256"
secret = "{NEW_SECRET}"
[[access.jwt.keys]]
kid = "ec-1"
algorithm = "ES256"
public_key_file = "{}"
[[access.jwt.keys]]
kid = "rsa-1"
algorithm = "RS256"
public_key_file = "{}"

[[networks]]
id = "eth"
chain_id = 31337
[[networks.upstreams]]
url = "{}"
[[networks]]
id = "base"
chain_id = 31338
[[networks.upstreams]]
url = "{}"
"#,
        fixture("es256-public.pem").display(),
        fixture("rs256-public.pem").display(),
        a.http_url(),
        b.http_url()
    );
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    let journal = dir.join("pool.journal");
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", path.to_str().unwrap()];
    Sluice::spawn_env(BIN, &args, &[("SLUICE_MEMPOOL__JOURNAL", journal.to_str().unwrap())])
}

/// `eth_chainId` with `Authorization: Bearer {bearer}`: (status, body).
async fn call(client: &reqwest::Client, url: &str, bearer: &str) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []});
    let response = client.post(url).bearer_auth(bearer).json(&body).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_verified_and_each_refusal_says_which() {
    let a = Anvil::spawn_with(&["--chain-id", "31337"]);
    let b = Anvil::spawn_with(&["--chain-id", "31338"]);
    let dir = tempfile::tempdir().unwrap();
    let sluice = serve(&a, &b, dir.path());
    let client = reqwest::Client::new();
    let (eth, base) = (format!("{}/eth", sluice.http_url()), format!("{}/base", sluice.http_url()));
    let claims = json!({"sub": "alice", "tier": "pro", "exp": now() + 600});

    // Every key verifies its own tokens; the two HS256 keys are a rotation in progress.
    for (alg, kid) in [
        (Algorithm::HS256, "hs-old"),
        (Algorithm::HS256, "hs-new"),
        (Algorithm::ES256, "ec-1"),
        (Algorithm::RS256, "rsa-1"),
    ] {
        let (status, body) = call(&client, &eth, &token(alg, Some(kid), claims.clone())).await;
        assert_eq!((status, body["result"].as_str()), (200, Some("0x7a69")), "{kid}: {body}");
    }
    // Without a kid, each key of the token's algorithm is tried.
    assert_eq!(call(&client, &eth, &token(Algorithm::ES256, None, claims.clone())).await.0, 200);

    let refused = [
        (
            token(Algorithm::HS256, Some("hs-new"), json!({"tier": "pro", "exp": now() - 120})),
            "unauthorized: token expired",
        ),
        // Signed with the old secret but naming the new key.
        (
            encode(
                &Header { kid: Some("hs-new".into()), ..Header::new(Algorithm::HS256) },
                &claims,
                &EncodingKey::from_secret(OLD_SECRET.as_bytes()).unwrap(),
            )
            .unwrap(),
            "unauthorized: bad token signature",
        ),
        (token(Algorithm::HS256, Some("gone"), claims.clone()), "unauthorized: unknown token key id (kid) \"gone\""),
        // alg none: a header and claims, no signature.
        (format!("eyJhbGciOiJub25lIn0.{}.", b64(&claims)), "unauthorized: unsigned tokens (alg none) are not accepted"),
        ("eyJhbGciOi!!.e30.sig".to_owned(), "unauthorized: malformed token"),
        (
            token(Algorithm::HS256, Some("hs-new"), json!({"tier": "gold", "exp": now() + 60})),
            "unauthorized: token claim tier \"gold\" is not a tier here",
        ),
        (token(Algorithm::HS256, Some("hs-new"), json!({"tier": "pro"})), "unauthorized: token claim exp is missing"),
    ];
    for (bearer, expected) in refused {
        let (status, body) = call(&client, &eth, &bearer).await;
        assert_eq!((status, message(&body)), (401, expected), "{body}");
        assert_eq!(body["error"]["code"], -32600);
        assert!(body.get("result").is_none());
    }

    // Claims limit the networks.
    let eth_only = token(
        Algorithm::ES256,
        Some("ec-1"),
        json!({"sub": "bob", "tier": "free", "exp": now() + 600, "networks": ["eth"]}),
    );
    assert_eq!(call(&client, &eth, &eth_only).await.0, 200);
    let (status, body) = call(&client, &base, &eth_only).await;
    assert_eq!(status, 403, "{body}");
    assert!(message(&body).contains("outside this key's scope (networks: eth)"), "{body}");
    let anyone = token(Algorithm::ES256, Some("ec-1"), json!({"sub": "bob", "tier": "free", "exp": now() + 600}));
    assert_eq!(call(&client, &base, &anyone).await.0, 200);

    // A huge header is refused by the HTTP layer; nothing else changes.
    let huge = format!("eyJ{}", "A".repeat(200_000));
    let response = client.post(&eth).bearer_auth(huge).body("{}").send().await;
    if let Ok(response) = response {
        assert!(response.status().is_client_error(), "{}", response.status());
    }
    assert_eq!(call(&client, &eth, &anyone).await.0, 200);
}

fn b64(value: &Value) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_opened_with_a_token_closes_when_it_expires() {
    let a = Anvil::spawn_with(&["--chain-id", "31337"]);
    let b = Anvil::spawn_with(&["--chain-id", "31338"]);
    let dir = tempfile::tempdir().unwrap();
    let sluice = serve(&a, &b, dir.path());
    let short = token(Algorithm::HS256, Some("hs-new"), json!({"tier": "pro", "exp": now() + 3}));
    let auth = format!("Bearer {short}");
    let mut socket = ws::connect_with(&format!("{}/eth", sluice.ws_url()), &[("authorization", &auth)]).await;
    ws::send(&mut socket, json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})).await;
    assert_eq!(ws::next(&mut socket).await["result"], "0x7a69");
    let (code, reason) = ws::closed(&mut socket, Duration::from_secs(10)).await;
    assert_eq!((code, reason.as_str()), (1008, "unauthorized: token expired"));
    // And the upgrade with an expired token is refused.
    let stale = token(Algorithm::HS256, Some("hs-new"), json!({"tier": "pro", "exp": now() - 120}));
    let url = format!("{}/eth", sluice.ws_url());
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {stale}").parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401),
        other => panic!("expected 401, got {:?}", other.map(|(_, r)| r.status())),
    }
}
