//! The range prober: searches each member's lowest block with state and with chain data (a
//! bounded binary search, [`Search`]) once its head is known, then every
//! `range_probe_interval`. Members declared archives, and members with a daily quota (whose
//! calls cost), are not searched: their answers still raise their bounds.

use std::sync::Weak;
use std::time::Instant;

use sluice_jsonrpc::{Id, Outcome, RawValue, Request};

use super::classify::is_missing_block;
use super::range::{Data, Search};
use super::{Circuit, Node, UpstreamPool};
use crate::Origin;

/// Whether the member has block `n`'s `data`: `None` when it could not tell (node trouble).
async fn has<N: Node>(pool: &UpstreamPool<N>, i: usize, data: Data, n: u64) -> Option<bool> {
    let params = match data {
        // The zero address: every node can read its balance at a block whose state it has.
        Data::State => format!(r#"["0x0000000000000000000000000000000000000000","{n:#x}"]"#),
        Data::Blocks => format!(r#"["{n:#x}",false]"#),
    };
    let method = match data {
        Data::State => "eth_getBalance",
        Data::Blocks => "eth_getBlockByNumber",
    };
    let request = Request::new(Some(Id::number(1)), method, RawValue::from_string(params).ok());
    match pool.exchange(i, &[&request], Origin::Internal).await.pop()? {
        Ok(Outcome::Result(raw)) => Some(raw.get() != "null"),
        Ok(Outcome::Error(e)) if is_missing_block(&e) => Some(false),
        _ => None,
    }
}

/// Searches member `i`'s lowest block of `data` below `head`; `None` when it stopped answering.
async fn search<N: Node>(pool: &UpstreamPool<N>, i: usize, data: Data, head: u64) -> Option<u64> {
    let mut search = Search::new(head);
    while let Some(n) = search.next() {
        search.record(n, has(pool, i, data, n).await?);
    }
    Some(search.lowest())
}

/// Searches member `i`, when it can be, and records what was found.
async fn probe_member<N: Node>(pool: &UpstreamPool<N>, i: usize) -> bool {
    let member = &pool.members[i];
    let head = {
        let state = member.state();
        let closed = state.breaker.state(Instant::now()) == Circuit::Closed;
        if !state.availability.wants_probe() || state.quota.is_some() || !closed {
            return false;
        }
        match state.health.head {
            Some(head) => head,
            None => return false,
        }
    };
    for data in [Data::State, Data::Blocks] {
        let Some(lowest) = search(pool, i, data, head).await else { return false };
        member.state().availability.learned(data, lowest, head);
        if lowest > 0 {
            tracing::info!(upstream = member.node.name(), data = data.as_str(), lowest, head, "upstream range learned");
        }
    }
    true
}

pub(super) async fn run<N: Node>(pool: Weak<UpstreamPool<N>>) {
    let (tick_every, every) = match pool.upgrade() {
        Some(p) => (p.config.probe_interval, p.config.range_probe_interval),
        None => return,
    };
    let mut searched: Vec<Option<Instant>> = Vec::new();
    let mut tick = tokio::time::interval(tick_every);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        searched.resize(pool.members.len(), None);
        let due: Vec<usize> =
            (0..pool.members.len()).filter(|&i| searched[i].is_none_or(|at| at.elapsed() >= every)).collect();
        let done = futures_util::future::join_all(due.iter().map(|&i| probe_member(&pool, i))).await;
        for (i, ok) in due.into_iter().zip(done) {
            if ok {
                searched[i] = Some(Instant::now());
            }
        }
    }
}
