//! `cargo bench -p sluice-gateway --bench access`
//!
//! What access control costs per request, in process (no sockets, no load generator), as
//! ratios against the same handler without access control, side by side in one run:
//!
//! * an API key (SHA-256 of the key, one map lookup);
//! * a JSON Web Token, HS256 and ES256 (signature verified on every request: sluice keeps
//!   no cache of verified tokens);
//! * address rules: 16 allow and 16 deny CIDR blocks, a trusted proxy and `X-Forwarded-For`;
//! * `Access::identify` alone for each, to separate the check from the handler around it.
//!
//! The upstream is a stand-in answering every call with one shared value (as a cache hit
//! does), named as such, in this bench only. Each figure is the median of 7 runs, ns per
//! request, one thread; the handler cases run interleaved (every case once per round). The ES256 key is the test-only one in `crates/sluice/tests/fixtures`.

mod common;

use common::{iterations, measure, Fixed};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sluice_access::{Access, AccessConfig, Credentials};
use sluice_gateway::{Gateway, GatewayBuilder, Limits};
use sluice_jsonrpc::SharedRaw;

const HS_SECRET: &str = "bench-secret-0123456789";

fn config() -> AccessConfig {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../sluice/tests/fixtures/jwt/es256-public.pem");
    let cidrs = |base: u8| (0..16).map(|i| format!("10.{base}.{i}.0/24")).collect::<Vec<_>>();
    let mut allow = cidrs(1);
    allow.push("127.0.0.0/8".into());
    let config = serde_json::json!({
        "allow_ips": allow,
        "deny_ips": cidrs(2),
        "trusted_proxies": ["127.0.0.1"],
        "keys": { "bench-key-0123456789": "pro" },
        "tiers": { "pro": {} },
        "jwt": { "keys": [
            { "kid": "hs", "algorithm": "HS256", "secret": HS_SECRET },
            { "kid": "ec", "algorithm": "ES256", "public_key_file": fixture },
        ] },
    });
    serde_json::from_value(config).expect("the bench's access config")
}

fn token(kid: &str) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let exp = jsonwebtoken::get_current_timestamp() + 3600;
    let claims = serde_json::json!({"sub": "bench", "tier": "pro", "exp": exp});
    let (alg, key) = match kid {
        "hs" => (Algorithm::HS256, EncodingKey::from_secret(HS_SECRET.as_bytes())),
        _ => {
            let pem =
                std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../sluice/tests/fixtures/jwt/es256-private.pem"));
            (Algorithm::ES256, EncodingKey::from_ec_pem(&pem.expect("the test-only ES256 key")))
        }
    };
    let header = Header { kid: Some(kid.into()), ..Header::new(alg) };
    encode(&header, &claims, &key.expect("a key")).expect("a token")
}

fn gateway(answer: &SharedRaw, access: Option<AccessConfig>) -> Arc<Gateway> {
    let builder = GatewayBuilder::single(Arc::new(Fixed(answer.clone())), Limits::default());
    match access {
        Some(config) => builder.access(Access::new(config).expect("valid"), Vec::new()).build(),
        None => builder.build(),
    }
}

fn main() {
    let n = iterations(50_000);
    let runtime = common::runtime();
    let _guard = runtime.enter();
    let (body, answer, expected) = (common::BODY, common::answer(), Bytes::from_static(common::REPLY));
    let open = gateway(&answer, None);
    let guarded = gateway(&answer, Some(config()));
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    let headers = |auth: Option<String>, forwarded: bool| {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        if let Some(auth) = auth {
            h.insert(http::header::AUTHORIZATION, format!("Bearer {auth}").parse().expect("a value"));
        }
        if forwarded {
            h.insert("x-forwarded-for", http::HeaderValue::from_static("203.0.113.9, 10.1.3.7"));
        }
        h
    };
    let (hs, es) = (token("hs"), token("ec"));
    let cases: Vec<(&str, &Arc<Gateway>, http::HeaderMap)> = vec![
        ("no access control", &open, headers(None, false)),
        ("API key", &guarded, headers(Some("bench-key-0123456789".into()), false)),
        ("JWT HS256", &guarded, headers(Some(hs.clone()), false)),
        ("JWT ES256", &guarded, headers(Some(es.clone()), false)),
        ("API key + X-Forwarded-For via trusted proxy", &guarded, headers(Some("bench-key-0123456789".into()), true)),
    ];
    let serve = |gateway: &Gateway, headers: &http::HeaderMap| {
        runtime.block_on(async {
            let response = sluice_gateway::http::serve_rpc(
                gateway,
                0,
                None,
                headers,
                Some(peer),
                Full::new(Bytes::from_static(body)),
            )
            .await;
            response.into_body().collect().await.expect("a body").to_bytes()
        })
    };
    for (name, gateway, headers) in &cases {
        assert_eq!(serve(gateway, headers), expected, "{name}: answered, not refused");
    }
    // Interleaved: each of 7 rounds runs every case once, so drift on a shared machine falls on
    // all of them alike; the median round of each is reported.
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..7 {
        for (i, (_, gateway, headers)) in cases.iter().enumerate() {
            rounds[i].push(common::time(n, &mut || drop(serve(gateway, headers))));
        }
    }
    let figures: Vec<(&str, f64)> =
        cases.iter().zip(rounds.iter_mut()).map(|((name, _, _), runs)| (*name, common::median_ns(runs))).collect();
    let base = figures[0].1;

    let access = Access::new(config()).expect("valid");
    let ip: IpAddr = "127.0.0.1".parse().expect("an address");
    let identify = |key: &str| {
        let key = key.to_owned();
        measure(n, || {
            std::hint::black_box(access.identify(Credentials { key: Some(&key), client_ip: Some(ip) }).ok());
        })
    };
    let alone =
        [("API key", identify("bench-key-0123456789")), ("JWT HS256", identify(&hs)), ("JWT ES256", identify(&es))];
    let caller =
        access.identify(Credentials { key: Some("bench-key-0123456789"), client_ip: Some(ip) }).expect("known");
    let charge = measure(n, || {
        runtime.block_on(async { std::hint::black_box(access.charge(&caller, &["eth_getBalance"]).await.ok()) });
    });
    // A token seen for the first time: the signature checked (nothing remembered).
    let jwt = sluice_access::jwt::Jwt::new(config().jwt.as_ref().expect("jwt configured")).expect("keys");
    let cold_n = (n / 50).max(10);
    let cold_hs = measure(cold_n, || drop(std::hint::black_box(jwt.verify(&hs))));
    let cold_es = measure(cold_n, || drop(std::hint::black_box(jwt.verify(&es))));
    let rules = measure(n, || {
        std::hint::black_box(access.client_ip(ip, Some("203.0.113.9, 10.1.3.7"), None));
    });

    println!("| request (eth_getBalance, cache-like answer, one thread) | ns per request | × no access control |");
    println!("|---|---:|---:|");
    for (name, ns) in &figures {
        println!("| {name} | {ns:.0} | {:.2} |", ns / base);
    }
    println!();
    println!("| check alone | ns |");
    println!("|---|---:|");
    for (name, ns) in alone {
        println!("| Access::identify, {name}, 33 CIDR rules | {ns:.0} |");
    }
    println!("| client address from X-Forwarded-For (trusted proxy) | {rules:.0} |");
    println!("| Access::charge (no quota: usage tallied) | {charge:.0} |");
    println!("| a token seen for the first time: HS256 signature checked | {cold_hs:.0} |");
    println!("| a token seen for the first time: ES256 signature checked | {cold_es:.0} |");
    println!();
    println!("{n} requests per run, median of 7 runs; in process, no sockets");
}
