//! What the in-process benches share: the stand-in upstream and the timing loop.
#![allow(dead_code)]

use std::time::Instant;

use async_trait::async_trait;
use sluice_jsonrpc::{Outcome, SharedRaw};
use sluice_upstream::{Answer, Call, Source, UpstreamError, Upstreams};

/// Stand-in upstream (benches only): every call is answered with the same shared value, as a
/// memory hit is.
pub struct Fixed(pub SharedRaw);

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

/// `cargo bench` passes `--bench`; under `cargo test` the same code runs briefly as a smoke
/// test, with `full / 1000` iterations.
pub fn iterations(full: u32) -> u32 {
    if std::env::args().any(|a| a == "--bench") {
        full
    } else {
        (full / 1000).max(10)
    }
}

/// The median of `runs`.
pub fn median_ns(runs: &mut [f64]) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// ns per call of `f`: the median of 7 runs of `n` calls.
pub fn measure<F: FnMut()>(n: u32, mut f: F) -> f64 {
    let mut runs: Vec<f64> = (0..7).map(|_| time(n, &mut f)).collect();
    median_ns(&mut runs)
}

/// ns per call of `n` calls of `f`.
pub fn time<F: FnMut()>(n: u32, f: &mut F) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The request both benches send: a balance at a fixed block, answered as a cache hit.
pub const BODY: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","0x0"]}"#;
/// What a client gets back for [`BODY`].
pub const REPLY: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":"0x21e19e0c9bab2400000"}"#;

/// The stand-in's answer to [`BODY`].
pub fn answer() -> SharedRaw {
    std::sync::Arc::from(sluice_jsonrpc::RawValue::from_string("\"0x21e19e0c9bab2400000\"".into()).expect("JSON"))
}

/// A current-thread runtime: one thread, as the figures say.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
}
