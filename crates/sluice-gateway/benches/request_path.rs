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

mod common;

use common::{iterations, measure, Fixed};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sluice_gateway::{Edge, GatewayBuilder, Limits};
use sluice_jsonrpc::{parse_body, write_chunks, Id, Incoming, Outcome, Response};
use sluice_upstream::Call;

fn main() {
    let n = iterations(200_000);
    let runtime = common::runtime();
    let _guard = runtime.enter();
    let (body, answer, fixed_reply) = (common::BODY, common::answer(), Bytes::from_static(common::REPLY));
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
