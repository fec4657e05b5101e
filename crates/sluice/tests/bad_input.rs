//! Bad input gets spec errors, never a crash or a hang; failing upstreams get clear errors.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Net, BIN};
use serde_json::{json, Value};
use sluice_testkit::{post, FakeUpstream, Fault, Sluice};

fn error_code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {answer}"))
}

#[tokio::test]
async fn malformed_and_invalid_requests_get_spec_errors() {
    let net = Net::start(&["--log", "error"]).await;
    let url = net.sluice.http_url();
    let cases: &[(&str, i64)] = &[
        ("{not json", -32700),
        ("", -32700),
        ("\u{feff}garbage", -32700),
        ("[]", -32600),
        ("42", -32600),
        ("\"eth_chainId\"", -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"eth_chainId"}"#, -32600),
        (r#"{"id":1,"method":"eth_chainId"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":7}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":1}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":[1],"method":"eth_chainId"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":"x"}"#, -32600),
    ];
    for (body, code) in cases {
        let (status, answer) = post(&net.client, &url, body.to_string()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(error_code(&answer), *code, "{body}: {answer}");
    }
    // Inside a batch, each bad element gets its own error and good ones still run.
    let (_, answer) =
        post(&net.client, &url, r#"[1, {"jsonrpc":"2.0","id":2,"method":"eth_chainId"}, {"jsonrpc":"2.0","id":3}]"#)
            .await;
    let answers = answer.as_array().unwrap();
    assert_eq!(error_code(&answers[0]), -32600);
    assert_eq!(answers[1]["result"], "0x7a69");
    assert_eq!((error_code(&answers[2]), &answers[2]["id"]), (-32600, &json!(3)));
    // The server is still up.
    let (_, answer) = post(&net.client, &url, r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#).await;
    assert_eq!(answer["result"], "0x7a69");
}

#[tokio::test]
async fn oversized_bodies_and_batches_are_refused() {
    let net = Net::start(&[]).await;
    let sluice = &net.sluice;
    // Default limits: 5 MiB bodies, 1,000-call batches. A declared length over the limit is
    // refused before a byte of the body is read.
    let addr = sluice.addr.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
            .write_all(format!("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", 6 << 20).as_bytes())
            .unwrap();
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("-32005"), "{answer}");
    let one = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#;
    let batch = |n: usize| format!("[{}]", vec![one; n].join(","));
    let (_, answer) = post(&net.client, &sluice.http_url(), batch(1001)).await;
    assert_eq!(error_code(&answer), -32005, "{answer}");
    let (_, answer) = post(&net.client, &sluice.http_url(), batch(1000)).await;
    assert_eq!(answer.as_array().unwrap().len(), 1000);
}

#[tokio::test]
async fn limits_are_configurable_by_environment() {
    let net = Net::start(&[]).await;
    let sluice = Sluice::spawn_env(
        BIN,
        &["serve", "--listen", "127.0.0.1:0"],
        &[
            ("SLUICE_UPSTREAM", &net.anvil.http_url()),
            ("SLUICE_LIMITS__MAX_BATCH_LEN", "2"),
            ("SLUICE_LIMITS__MAX_BODY_BYTES", "200"),
        ],
    );
    let one = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#;
    let (_, answer) = post(&net.client, &sluice.http_url(), format!("[{one},{one},{one}]")).await;
    assert_eq!(error_code(&answer), -32005);
    let (status, _) = post(&net.client, &sluice.http_url(), format!("[{one},{one},{one},{one},{one}]")).await;
    assert_eq!(status, 413);
    // A chunked body (no declared length) is cut off at the limit as it streams in.
    let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(vec![b' '; 300])]);
    let response = net.client.post(sluice.http_url()).body(reqwest::Body::wrap_stream(chunks)).send().await.unwrap();
    assert_eq!(response.status(), 413);
}

#[tokio::test]
async fn unreachable_upstream_is_a_clear_error() {
    let dead = format!("http://127.0.0.1:{}", sluice_testkit::free_port());
    let sluice = Sluice::serve(BIN, &dead, &["--log", "error"]);
    let client = reqwest::Client::new();
    let (status, answer) =
        post(&client, &sluice.http_url(), r#"{"jsonrpc":"2.0","id":9,"method":"eth_chainId"}"#).await;
    assert_eq!(status, 200);
    assert_eq!(answer["id"], 9);
    assert_eq!(error_code(&answer), -32002);
    assert_eq!(answer["error"]["data"]["reason"], "unreachable");
    assert!(!answer.to_string().contains("127.0.0.1"), "no upstream internals leak: {answer}");
}

#[tokio::test]
async fn hanging_upstream_times_out() {
    let fake = FakeUpstream::spawn(Fault::Hang).await;
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        // Nothing else may call the fake: the count below is the gateway's alone.
        format!(
            "[cache]\nenabled = false\n[mempool]\nenabled = false\n[pool]\nmax_attempts = 1\n[[upstreams]]\nurl = \"{}\"\ntimeout = \"300ms\"\n",
            fake.url
        ),
    )
    .unwrap();
    let sluice = Sluice::spawn(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", config.path().to_str().unwrap()]);
    let client = reqwest::Client::new();
    let started = Instant::now();
    let (_, answer) = post(
        &client,
        &sluice.http_url(),
        r#"[{"jsonrpc":"2.0","id":1,"method":"eth_chainId"},{"jsonrpc":"2.0","id":2,"method":"eth_blockNumber"}]"#,
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(3), "answered promptly");
    for item in answer.as_array().unwrap() {
        assert_eq!(error_code(item), -32002);
        assert_eq!(item["error"]["data"]["reason"], "timeout");
    }
    // The prober reads heads with eth_getBlockByNumber; the batch is the only eth_chainId.
    assert_eq!(fake.requests_for("eth_chainId"), 1, "a batch is one upstream call");
    assert_eq!(fake.requests_for("eth_blockNumber"), 1, "in the same request");
}

#[tokio::test]
async fn garbage_from_upstream_is_a_clear_error() {
    for (fault, reason) in [
        (Fault::Garbage(200, "<html>hello</html>"), "invalid_response"),
        (Fault::Garbage(502, "bad gateway"), "http_status"),
        (Fault::Garbage(200, r#"{"jsonrpc":"2.0","id":999999,"result":"0x1"}"#), "invalid_response"),
        (Fault::Truncated, "unreachable"),
    ] {
        let fake = FakeUpstream::spawn(fault).await;
        let sluice = Sluice::serve(BIN, &fake.url, &["--log", "error"]);
        let client = reqwest::Client::new();
        let (_, answer) = post(&client, &sluice.http_url(), r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}"#).await;
        assert_eq!(error_code(&answer), -32002, "{answer}");
        assert_eq!(answer["error"]["data"]["reason"], reason, "{answer}");
    }
}

/// A client that sends nothing, or stops halfway through, is disconnected after the client
/// timeout instead of holding a connection forever.
#[tokio::test]
async fn slow_and_half_open_clients_are_timed_out() {
    let net = Net::start(&[]).await;
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!("[limits]\nclient_timeout = \"500ms\"\n[[upstreams]]\nurl = \"{}\"\n", net.anvil.http_url()),
    )
    .unwrap();
    let sluice = Sluice::spawn(BIN, &["serve", "--listen", "127.0.0.1:0", "--config", config.path().to_str().unwrap()]);
    let addr = sluice.addr.clone();
    tokio::task::spawn_blocking(move || {
        let closed_within = |mut stream: TcpStream| {
            stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let started = Instant::now();
            let mut buf = Vec::new();
            let _ = stream.read_to_end(&mut buf);
            (started.elapsed(), String::from_utf8_lossy(&buf).into_owned())
        };
        // Silent client.
        let (waited, _) = closed_within(TcpStream::connect(&addr).unwrap());
        assert!(waited < Duration::from_secs(3), "silent client held {waited:?}");
        // Headers never finished.
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(b"POST / HTTP/1.1\r\nhost: x\r\n").unwrap();
        let (waited, _) = closed_within(stream);
        assert!(waited < Duration::from_secs(3), "half-sent headers held {waited:?}");
        // Served once, then the next request's headers never finished (the connection's
        // header timer, moved forward for the second request, still goes off).
        let mut stream = TcpStream::connect(&addr).unwrap();
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
        let first = format!("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{call}", call.len());
        stream.write_all(format!("{first}POST / HTTP/1.1\r\nhost: x\r\n").as_bytes()).unwrap();
        let (waited, text) = closed_within(stream);
        assert!(waited < Duration::from_secs(3), "half-sent second headers held {waited:?}");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        // Body promised but never sent: answered 408 with a JSON-RPC error.
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"jsonrpc\"").unwrap();
        let (waited, text) = closed_within(stream);
        assert!(waited < Duration::from_secs(3), "half-sent body held {waited:?}");
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("-32600"), "{text}");
    })
    .await
    .unwrap();
}
