#[test]
fn only_variables_that_name_a_top_level_key_are_read() {
    for named in ["LISTEN", "limits__max_batch_len", "ACCESS__ADMIN__TOKEN", "networks", "Mesh__peers"] {
        assert!(names_a_key(named), "{named}");
    }
    // Kubernetes' service links for a Service called sluice, and other strays.
    for stray in ["PORT", "PORT_8545_TCP_ADDR", "SERVICE_HOST", "SERVICE_PORT_RPC", "LIMITS_SERVICE_HOST", ""] {
        assert!(!names_a_key(stray), "{stray}");
    }
    // KEYS is the whole list: serde names the same fields when refusing an unknown one.
    let refusal = parse_toml("nonsense = 1\n").unwrap_err().to_string();
    let expected: Vec<String> = KEYS.iter().map(|k| format!("`{k}`")).collect();
    assert!(refusal.contains(&expected.join(", ")), "{refusal}");
}

use super::*;
use std::io::Write;

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn a_full_file_loads() {
    let f = file(
        r#"listen = "127.0.0.1:9000"
           [limits]
           max_body_bytes = 1024
           client_timeout = "5s"
           [[upstreams]]
           url = "http://127.0.0.1:8546"
           ws_url = "ws://127.0.0.1:8547"
           timeout = "2s"
        "#,
    );
    let c = validate_file(f.path()).unwrap();
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.limits.max_body_bytes, 1024);
    assert_eq!(c.limits.max_batch_len, 1000);
    assert_eq!(c.limits.client_timeout, Duration::from_secs(5));
    assert_eq!(c.upstreams[0].endpoints().unwrap(), ("http://127.0.0.1:8546".into(), "ws://127.0.0.1:8547".into()));
}

#[test]
fn errors_name_the_bad_key() {
    let unknown = validate_file(file("bogus = 1\n[[upstreams]]\nurl = \"http://a:1\"").path()).unwrap_err();
    assert!(unknown.to_string().contains("bogus"), "{unknown}");
    let wrong_type =
        validate_file(file("[limits]\nmax_body_bytes = \"big\"\n[[upstreams]]\nurl = \"http://a:1\"").path())
            .unwrap_err();
    assert!(wrong_type.to_string().contains("max_body_bytes"), "{wrong_type}");
    let zero =
        validate_file(file("[limits]\nmax_batch_len = 0\n[[upstreams]]\nurl = \"http://a:1\"").path()).unwrap_err();
    assert!(zero.to_string().contains("limits.max_batch_len"), "{zero}");
    let scheme = validate_file(file("[[upstreams]]\nurl = \"ftp://a:1\"").path()).unwrap_err();
    assert!(scheme.to_string().contains("upstreams[0].url"), "{scheme}");
    let tls = UpstreamConfig::from_url("https://node.example:8545/key").endpoints().unwrap();
    assert_eq!(tls.1, "wss://node.example:8545/key");
    let none = validate_file(file("").path()).unwrap_err();
    assert!(none.to_string().contains("no upstream"), "{none}");
}

#[test]
fn ws_upstream_derives_http() {
    let (http, ws) = UpstreamConfig::from_url("ws://127.0.0.1:8546").endpoints().unwrap();
    assert_eq!((http.as_str(), ws.as_str()), ("http://127.0.0.1:8546/", "ws://127.0.0.1:8546"));
}

#[test]
fn the_ingress_section_is_checked() {
    let base = "[[upstreams]]\nurl = \"http://127.0.0.1:1\"\n";
    let id = "ab".repeat(32);
    let ok = super::parse_toml(&format!(
        "{base}[ingress]\nlisten = \"127.0.0.1:9547\"\nmax_rtt = \"300ms\"\n[ingress.weights]\n\"{id}\" = 3\n"
    ))
    .unwrap();
    let ingress = ok.ingress.expect("on when the section is present");
    assert_eq!((ingress.listen.port(), ingress.max_rtt.as_millis(), ingress.weights[&id]), (9547, 300, 3.0));
    assert!(super::parse_toml(base).unwrap().ingress.is_none(), "off by default");
    for (bad, says) in [
        ("[ingress.weights]\n\"nothex\" = 1\n", "identity"),
        (&format!("[ingress.weights]\n\"{id}\" = 0\n"), "positive"),
        ("[ingress]\nunknown_share = 2.0\n", "unknown_share"),
        ("[ingress]\nnope = 1\n", "nope"),
        ("[mempool]\nenabled = false\n[ingress]\n", "needs the mempool"),
    ] {
        let e = super::parse_toml(&format!("{base}{bad}")).unwrap_err().to_string();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}

#[test]
fn the_mesh_section_is_checked() {
    let base = "[[upstreams]]\nurl = \"http://127.0.0.1:1\"\n";
    let ok = super::parse_toml(&format!(
        "{base}[mesh]\nlisten = [\"/ip4/127.0.0.1/udp/9100/quic-v1\"]\ndeadline = \"7s\"\n"
    ))
    .unwrap();
    let mesh = ok.mesh.expect("on when the section is present").parse().unwrap();
    assert_eq!(mesh.outbox.deadline.as_secs(), 7);
    for (bad, says) in [
        ("[mesh]\nlisten = [\"not an address\"]\n", "mesh.listen"),
        ("[mesh]\npeers = [\"/ip4/127.0.0.1/udp/1/quic-v1\"]\n", "/p2p/"),
        ("[mesh]\nmax_in_flight = 0\n", "max_in_flight"),
        ("[mempool]\nenabled = false\n[mesh]\n", "needs the mempool"),
    ] {
        let e = super::parse_toml(&format!("{base}{bad}")).unwrap_err().to_string();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}

#[test]
fn flags_win_over_env_and_file() {
    // Env is process-wide: this is the only test that sets SLUICE_* variables.
    let f = file("listen = \"127.0.0.1:9001\"\n[limits]\nmax_batch_len = 7\n[[upstreams]]\nurl = \"http://file:1\"");
    std::env::set_var("SLUICE_LIMITS__MAX_BATCH_LEN", "9");
    std::env::set_var("SLUICE_UPSTREAM", "http://env:1,http://env:2");
    let from_env = load(Some(f.path()), &Overrides::default()).unwrap();
    let flags = Overrides { listen: Some("127.0.0.1:9002".parse().unwrap()), upstreams: vec!["http://flag:1".into()] };
    let from_flags = load(Some(f.path()), &flags).unwrap();
    std::env::remove_var("SLUICE_LIMITS__MAX_BATCH_LEN");
    std::env::remove_var("SLUICE_UPSTREAM");
    assert_eq!(from_env.limits.max_batch_len, 9);
    assert_eq!(from_env.listen.port(), 9001);
    assert_eq!(from_env.upstreams.len(), 2);
    assert_eq!(from_flags.listen.port(), 9002);
    assert_eq!(from_flags.upstreams[0].url, "http://flag:1");
}
