//! The pool's part of `/status`: each member's state as operators read it.

use std::time::{Instant, SystemTime};

use super::{Data, UpstreamPool};
use crate::Node;

impl<N: Node> UpstreamPool<N> {
    /// A JSON snapshot for `/status`.
    pub fn status(&self) -> serde_json::Value {
        let now = Instant::now();
        let best = self.best_head();
        let members: Vec<serde_json::Value> = self
            .members
            .iter()
            .map(|m| {
                let mut s = m.state();
                serde_json::json!({
                    "name": m.node.name(),
                    "tier": m.tier,
                    "weight": m.weight,
                    "circuit": s.breaker.state(now).as_str(),
                    "latency_ms": (s.health.latency_us / 1000.0 * 100.0).round() / 100.0,
                    "error_rate": (s.health.error_rate * 1000.0).round() / 1000.0,
                    "in_flight": s.health.in_flight,
                    "head": s.health.head,
                    "lag": s.health.lag(best),
                    "score": s.score(m.weight).round(),
                    "rate_left": s.rate.as_mut().map(|r| r.left(now)),
                    "rate": s.rate.as_ref().map(|r| (r.rate() * 10.0).round() / 10.0),
                    "rate_cut": s.adaptive.is_cut(),
                    "rate_cuts": s.adaptive.cuts(),
                    "paused_ms": s.adaptive.paused_until().map(|p| p.saturating_duration_since(now).as_millis() as u64),
                    "daily_quota_left": s.quota.as_mut().map(|q| q.left(SystemTime::now())),
                    "missing_blocks": s.missing_blocks,
                    "batch_limit": s.batch_limit,
                    "lowest_state": s.availability.lowest(Data::State, s.health.head),
                    "lowest_block": s.availability.lowest(Data::Blocks, s.health.head),
                    "range_raised": s.availability.raised,
                    "cordoned": s.cordoned(now),
                    "cordons": s.cordons,
                    "dissents": s.dissents,
                    "last_error": s.last_error.as_ref().map(|e| e.kind()),
                })
            })
            .collect();
        serde_json::json!({ "best_head": best, "upstreams": members })
    }
}
