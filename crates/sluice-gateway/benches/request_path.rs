//! `cargo bench -p sluice-gateway --bench request_path`
//!
//! What one JSON-RPC request costs sluice in process, without sockets or a load generator
//! (deterministic where wrk on a 2-core machine is not), side by side in one run:
//!
//! 1. **bare handler**: what the bare fixed-body server of `bench/core.sh` does per request
//!    (read the body, answer fixed bytes): the floor;
//! 2. **serve_rpc**: sluice's whole HTTP handler (identification, body read with its limit and
//!    deadline, request id, the pipeline, the reply and its headers) over an in-memory upstream
//!    that answers like a cache hit (a shared raw value, no copy), body collected;
//! 3. **Pipeline::handle**: the pipeline alone (parse, admission, policy, the `Call`, the layer
//!    call, the answer written);
//! 4. its parts: `parse_body`, `Call::new` (the block need read from the params), `write_chunks`.
//!
//! Each figure is the median of 7 runs of N calls, in ns per request (one thread, current-thread
//! runtime). The stand-in upstream is named as such: it is in this bench only.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sluice_gateway::{Edge, GatewayBuilder, Limits};
use sluice_jsonrpc::{parse_body, write_chunks, Id, Incoming, Outcome, RawValue, Response, SharedRaw};
use sluice_upstream::{Answer, Call, Source, UpstreamError, Upstreams};

/// Stand-in upstream: every call is answered with the same shared value, as a memory hit is.
struct Fixed(SharedRaw);

#[async_trait]
impl Upstreams for Fixed {
    async fn call(&self, _: &Call) -> Result<Answer, UpstreamError> {
        Ok(Answer { outcome: Outcome::Result(self.0.clone()), source: Source::Memory })
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let mut answers = Vec::with_capacity(calls.len());
        for call in calls {
            answers.push(self.call(call).await);
        }
        answers
    }
}

/// `cargo bench` passes `--bench`; under `cargo test` the same code runs briefly as a smoke test.
fn iterations() -> u32 {
    if std::env::args().any(|a| a == "--bench") {
        200_000
    } else {
        200
    }
}

fn median_ns(runs: &mut [f64]) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn measure<F: FnMut()>(n: u32, mut f: F) -> f64 {
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..n {
                f();
            }
            started.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .collect();
    median_ns(&mut runs)
}

fn main() {
    let n = iterations();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _guard = runtime.enter();
    let body: &'static [u8] = br#"{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]}"#;
    let answer: SharedRaw = Arc::from(RawValue::from_string("\"0x21e19e0c9bab2400000\"".into()).expect("JSON"));
    let fixed_reply = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":"0x21e19e0c9bab2400000"}"#);
    let gateway = GatewayBuilder::single(Arc::new(Fixed(answer.clone())), Limits::default()).build();
    let headers = {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        h.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
        h
    };

    // The answer must be what a client expects, or the figures mean nothing.
    let check = runtime.block_on(async {
        let response =
            sluice_gateway::http::serve_rpc(&gateway, 0, None, &headers, None, Full::new(Bytes::from_static(body)))
                .await;
        response.into_body().collect().await.expect("a body").to_bytes()
    });
    assert_eq!(check, fixed_reply, "serve_rpc answers the stand-in's value");

    let bare = measure(n, || {
        runtime.block_on(async {
            let _ = Full::new(Bytes::from_static(body)).collect().await;
            let response = http::Response::new(Full::new(fixed_reply.clone()));
            let _ = response.into_body().collect().await;
        })
    });
    let handler = measure(n, || {
        runtime.block_on(async {
            let response =
                sluice_gateway::http::serve_rpc(&gateway, 0, None, &headers, None, Full::new(Bytes::from_static(body)))
                    .await;
            let _ = response.into_body().collect().await;
        })
    });
    let pipeline = gateway.pipeline();
    let handle = measure(n, || {
        runtime.block_on(async {
            let reply = pipeline.handle(body, Edge::default()).await;
            std::hint::black_box(reply);
        })
    });
    let parse = measure(n, || {
        std::hint::black_box(parse_body(body, 1000).ok());
    });
    let request = match parse_body(body, 1000) {
        Ok(Incoming::Single(Ok(request))) => request,
        _ => unreachable!("a valid single call"),
    };
    let call = measure(n, || {
        std::hint::black_box(Call::new(request.clone()));
    });
    let responses = [Response { id: Id::number(1), outcome: Outcome::Result(answer.clone()) }];
    let write = measure(n, || {
        std::hint::black_box(write_chunks(false, &responses));
    });

    println!("| step (cached-like eth_getBalance, one thread) | ns per request | × bare handler |");
    println!("|---|---:|---:|");
    for (name, ns) in [
        ("bare handler: read the body, answer fixed bytes", bare),
        ("sluice's HTTP handler (serve_rpc), body collected", handler),
        ("  of which Pipeline::handle", handle),
        ("    of which parse_body", parse),
        ("    of which Call::new (block need read)", call),
        ("    of which write_chunks", write),
    ] {
        println!("| {name} | {ns:.0} | {:.2} |", ns / bare);
    }
    println!();
    println!("{n} calls per run, median of 7 runs; in process, no sockets: the socket and hyper's parsing are the same for both servers and are not here");
}
