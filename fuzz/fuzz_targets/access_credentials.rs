//! Credentials and forwarded addresses from the network: any bearer token, API key or
//! `X-Forwarded-For` / `Forwarded` value is identified or refused with a message, never a panic.
#![no_main]

use std::net::IpAddr;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_access::{Access, AccessConfig, Credentials};

fn access() -> &'static Access {
    static ACCESS: OnceLock<Access> = OnceLock::new();
    ACCESS.get_or_init(|| {
        let config: AccessConfig = serde_json::from_value(serde_json::json!({
            "allow_ips": ["127.0.0.0/8", "::1", "10.0.0.0/8"],
            "deny_ips": ["10.6.0.0/16"],
            "trusted_proxies": ["127.0.0.1"],
            "keys": { "fuzz-key-0123456789": { "tier": "t", "allow_ips": ["10.1.0.0/16"] } },
            "tiers": { "t": {} },
            "jwt": { "default_tier": "t", "keys": [{ "kid": "k", "algorithm": "HS256", "secret": "fuzz-secret-0123456789" }] },
        }))
        .expect("a valid config");
        Access::new(config).expect("valid")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut parts = text.splitn(3, '\n');
    let (key, xff, forwarded) = (parts.next(), parts.next(), parts.next());
    let access = access();
    let peer: IpAddr = "127.0.0.1".parse().expect("an address");
    let client = access.client_ip(peer, xff, forwarded);
    if let Err(refusal) = access.identify(Credentials { key, client_ip: Some(client) }) {
        assert!(!refusal.to_string().is_empty());
    }
});
