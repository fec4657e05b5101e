//! The prober: reads the head (number and hash) of each member nothing else told it about
//! lately; it doubles as the half-open probe that lets a recovered member back in without
//! client traffic.
//!
//! It looks every `probe_interval`, but a member whose head was learned within about a block
//! and a half (its `newHeads` notification, the head feed's poll, an answer naming its head) is
//! not asked: on an idle deployment the members the head feed follows cost no probe at all, and
//! the others one per block or so ([`wants_probe`]). A member that closed a connection itself
//! (a node that dies closes them all) is looked at once, by a TCP connect and no call: nothing
//! listening there opens its circuit within moments, with no client call spent on it.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sluice_chain::parse_quantity;
use sluice_jsonrpc::{Id, Outcome, RawValue, Request};

use super::{Circuit, Data, Node, UpstreamPool};
use crate::Origin;

/// The head as a probe reads it.
#[derive(serde::Deserialize)]
struct Head {
    number: String,
    hash: String,
}

pub(super) async fn run<N: Node>(pool: Weak<UpstreamPool<N>>, closed: Arc<tokio::sync::Notify>) {
    let (interval, mut closes) = match pool.upgrade() {
        Some(p) => (p.config.probe_interval, p.members.iter().map(|m| m.node.closed_by_node()).collect::<Vec<_>>()),
        None => return,
    };
    // When each member was last looked at for a connection it closed.
    let mut looked: Vec<Option<Instant>> = vec![None; closes.len()];
    let mut tick = tokio::time::interval(interval);
    loop {
        let woken = tokio::select! {
            _ = tick.tick() => false,
            _ = closed.notified() => true,
        };
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        // A member that closed a connection itself: is anything still listening? A TCP connect,
        // no call: free at a metered provider, and it carries no request, so it cannot close
        // anything that would wake this again.
        let dropped: Vec<usize> = (0..pool.members.len())
            .filter(|&i| {
                let count = pool.members[i].node.closed_by_node();
                let before = closes.get_mut(i).map(|seen| std::mem::replace(seen, count));
                let news = before.is_some_and(|b| b != count) && closed_is_news(looked.get(i).copied().flatten(), now);
                if news {
                    if let Some(at) = looked.get_mut(i) {
                        *at = Some(now);
                    }
                }
                news
            })
            .collect();
        let pool_ref = &pool;
        let checks = dropped.iter().map(|&i| async move {
            // A killed node's connections can close a moment before its listening socket does:
            // still listening at once is asked again a little later.
            for wait in [Duration::ZERO, RECHECK] {
                tokio::time::sleep(wait).await;
                match pool_ref.members[i].node.listening().await {
                    Some(false) => return pool_ref.member_down(i),
                    Some(true) => continue,
                    None => return,
                }
            }
        });
        futures_util::future::join_all(checks).await;
        if woken {
            publish(&pool);
            continue;
        }
        let fresh = freshness(interval, pool.block_interval());
        let due: Vec<usize> = (0..pool.members.len())
            .filter(|&i| {
                let state = pool.members[i].state();
                wants_probe(state.breaker.state(now), state.heard, now, fresh)
            })
            .collect();
        let probes = due.into_iter().map(|i| probe_one(&pool, i));
        futures_util::future::join_all(probes).await;
        pool.heads_read.send_replace(true);
        publish(&pool);
    }
}

/// Whether a member closing a connection is worth a look: at most one a second (a node that
/// closes every connection after its answer, under load, is looked at no more often).
pub(super) fn closed_is_news(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= CLOSE_LOOKS)
}

/// The shortest time between two looks at a member for connections it closed.
const CLOSE_LOOKS: Duration = Duration::from_secs(1);
/// When a member that closed a connection still listens, how long until it is asked again.
const RECHECK: Duration = Duration::from_millis(250);

/// How long a member's head stays as good as probed: a block and a half (so that a member
/// announcing every block is never asked, whatever the jitter), at least one probe interval;
/// [`UNKNOWN_PACE`] until the head feed has learned the chain's pace (its first three heads).
pub(super) fn freshness(probe_interval: Duration, pace: Option<Duration>) -> Duration {
    probe_interval.max(pace.map_or(UNKNOWN_PACE, |pace| pace + pace / 2))
}

/// How long a member's head stays as good as probed while the chain's pace is not known: a
/// slow chain's first blocks would otherwise cost a probe a second.
const UNKNOWN_PACE: Duration = Duration::from_secs(10);

/// Whether the prober asks a member: always while its circuit is not closed (the probe is
/// what closes it), otherwise when its head was not learned within `fresh`.
pub(super) fn wants_probe(circuit: Circuit, heard: Option<Instant>, now: Instant, fresh: Duration) -> bool {
    circuit != Circuit::Closed || heard.is_none_or(|at| now.saturating_duration_since(at) >= fresh)
}

/// Sets each member's gauges (what `/status` shows), once per probe round, so that a dashboard
/// sees score, lag, circuit and budgets move without anyone polling `/status`.
fn publish<N: Node>(pool: &UpstreamPool<N>) {
    let now = Instant::now();
    let best = pool.best_head();
    for m in &pool.members {
        let labels = [("network", pool.config.network.clone()), ("upstream", m.node.name().to_owned())];
        let mut s = m.state();
        let open = s.breaker.state(now) != Circuit::Closed;
        metrics::gauge!("sluice_upstream_circuit_open", &labels).set(open as u8 as f64);
        if let Some(head) = s.health.head {
            metrics::gauge!("sluice_upstream_head", &labels).set(head as f64);
        }
        if let Some(lag) = s.health.lag(best) {
            metrics::gauge!("sluice_upstream_lag_blocks", &labels).set(lag as f64);
        }
        metrics::gauge!("sluice_upstream_score", &labels).set(s.score(m.weight));
        for data in [Data::State, Data::Blocks] {
            if let Some(lowest) = s.availability.lowest(data, s.health.head) {
                metrics::gauge!("sluice_upstream_lowest_block", "network" => labels[0].1.clone(),
                    "upstream" => labels[1].1.clone(), "data" => data.as_str())
                .set(lowest as f64);
            }
        }
        metrics::gauge!("sluice_upstream_error_rate", &labels).set(s.health.error_rate);
        metrics::gauge!("sluice_upstream_in_flight", &labels).set(s.health.in_flight as f64);
        if let Some(rate) = s.rate.as_ref().map(|r| r.rate()) {
            // The rate in force: the configured one, or lower after the provider's 429s.
            metrics::gauge!("sluice_upstream_rate_limit", &labels).set(rate);
        }
        let (network, upstream) = (labels[0].1.clone(), labels[1].1.clone());
        if let Some(left) = s.rate.as_mut().map(|r| r.left(now)) {
            metrics::gauge!("sluice_upstream_budget_left", "network" => network.clone(),
                "upstream" => upstream.clone(), "budget" => "rate")
            .set(left as f64);
        }
        if let Some(quota) = s.quota.as_mut() {
            let left = quota.left(std::time::SystemTime::now());
            metrics::gauge!("sluice_upstream_budget_left", "network" => network.clone(),
                "upstream" => upstream.clone(), "budget" => "daily")
            .set(left as f64);
            metrics::gauge!("sluice_upstream_budget_size", "network" => network, "upstream" => upstream,
                "budget" => "daily")
            .set(quota.limit() as f64);
        }
    }
}

/// Reads member `i`'s head (when its circuit and quota allow).
pub(super) async fn probe_one<N: Node>(pool: &UpstreamPool<N>, i: usize) {
    let request = Request::new(
        Some(Id::number(1)),
        "eth_getBlockByNumber",
        RawValue::from_string(r#"["latest",false]"#.to_owned()).ok(),
    );
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
    let head = match pool.exchange(i, &[&request], Origin::Internal).await.pop() {
        Some(Ok(Outcome::Result(raw))) => serde_json::from_str::<Head>(raw.get())
            .ok()
            .and_then(|h| Some((parse_quantity(&h.number)?, h.hash.to_ascii_lowercase()))),
        _ => None,
    };
    if let Some((number, hash)) = &head {
        pool.set_head(i, *number, Some(hash));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_heard_from_within_a_block_and_a_half_is_not_probed() {
        let now = Instant::now();
        let block = Duration::from_secs(12);
        let fresh = freshness(Duration::from_secs(1), Some(block));
        assert_eq!(fresh, Duration::from_secs(18));
        let heard = |ago: u64| Some(now - Duration::from_secs(ago));
        assert!(!wants_probe(Circuit::Closed, heard(12), now, fresh));
        assert!(!wants_probe(Circuit::Closed, heard(17), now, fresh));
        assert!(wants_probe(Circuit::Closed, heard(18), now, fresh));
        assert!(wants_probe(Circuit::Closed, None, now, fresh), "never heard of: probed");
        assert!(wants_probe(Circuit::Open, heard(0), now, fresh), "an open circuit is probed to close it");
        assert!(wants_probe(Circuit::HalfOpen, heard(0), now, fresh));
    }

    #[test]
    fn without_a_known_pace_a_head_is_fresh_for_ten_seconds() {
        let interval = Duration::from_secs(1);
        assert_eq!(freshness(interval, None), UNKNOWN_PACE);
        assert_eq!(freshness(Duration::from_secs(30), None), Duration::from_secs(30), "the interval, when longer");
        // A chain faster than the probe interval: not probed more often than the interval.
        assert_eq!(freshness(interval, Some(Duration::from_millis(250))), interval);
    }

    #[test]
    fn closed_connections_are_looked_at_once_a_second_at_most() {
        let now = Instant::now();
        assert!(closed_is_news(None, now), "the first close is looked at");
        assert!(!closed_is_news(Some(now - Duration::from_millis(300)), now));
        assert!(closed_is_news(Some(now - CLOSE_LOOKS), now));
    }
}
