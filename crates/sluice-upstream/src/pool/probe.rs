//! The prober: reads every member's head (number and hash) each interval; it doubles as the
//! half-open probe that lets a recovered member back in without client traffic.

use std::sync::Weak;
use std::time::Instant;

use sluice_chain::parse_quantity;
use sluice_jsonrpc::{Id, Outcome, RawValue, Request};

use super::{Circuit, Node, Pool};

/// The head as a probe reads it.
#[derive(serde::Deserialize)]
struct Head {
    number: String,
    hash: String,
}

pub(super) async fn run<N: Node>(pool: Weak<Pool<N>>) {
    let interval = match pool.upgrade() {
        Some(p) => p.config.probe_interval,
        None => return,
    };
    let request = Request::new(
        Some(Id::number(1)),
        "eth_getBlockByNumber",
        RawValue::from_string(r#"["latest",false]"#.to_owned()).ok(),
    );
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let probes = (0..pool.members.len()).map(|i| probe_one(&pool, i, &request));
        futures_util::future::join_all(probes).await;
    }
}

async fn probe_one<N: Node>(pool: &Pool<N>, i: usize, request: &Request) {
    let member = &pool.members[i];
    // A member with a daily quota is probed only to close its circuit: probes would otherwise
    // spend the provider's quota.
    let quota = member.state().quota.is_some();
    if quota && member.state().breaker.state(Instant::now()) == Circuit::Closed {
        return;
    }
    if !member.state().breaker.allow(Instant::now()) {
        return;
    }
    let head = match pool.exchange(i, &[request]).await.pop() {
        Some(Ok(Outcome::Result(raw))) => serde_json::from_str::<Head>(raw.get())
            .ok()
            .and_then(|h| Some((parse_quantity(&h.number)?, h.hash.to_ascii_lowercase()))),
        _ => None,
    };
    if let Some((number, hash)) = &head {
        pool.set_head(i, *number, Some(hash));
    }
    let name = member.node.name().to_owned();
    let circuit = member.state().breaker.state(Instant::now());
    metrics::gauge!("sluice_upstream_circuit_open", "upstream" => name.clone())
        .set((circuit != Circuit::Closed) as u8 as f64);
    if let Some((number, _)) = head {
        metrics::gauge!("sluice_upstream_head", "upstream" => name).set(number as f64);
    }
}
