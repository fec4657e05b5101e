//! A circuit breaker per upstream. Pure: time is passed in.
//!
//! Closed: calls flow; `threshold` consecutive failures open it, and so does one failure that
//! proves the node down (a refused connection: a dead node is out at once, not after a
//! threshold of clients' calls failed over or five probe rounds). Open: no calls until
//! `cooldown` has passed. Then one call is let through as a probe (half-open): success closes
//! the circuit, failure opens it for another cooldown.

use std::time::{Duration, Instant};

/// The breaker's state, for metrics and `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Circuit {
    /// Calls flow.
    Closed,
    /// No calls until the cooldown ends.
    Open,
    /// One probe call is in flight.
    HalfOpen,
}

impl Circuit {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Circuit::Closed => "closed",
            Circuit::Open => "open",
            Circuit::HalfOpen => "half-open",
        }
    }
}

/// One upstream's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self { threshold: threshold.max(1), cooldown, failures: 0, open_until: None, probing: false }
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> Circuit {
        match self.open_until {
            None => Circuit::Closed,
            Some(_) if self.probing => Circuit::HalfOpen,
            Some(until) if now >= until => Circuit::HalfOpen,
            Some(_) => Circuit::Open,
        }
    }

    /// Whether a call may go now; a call let through after the cooldown is the probe.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.open_until {
            None => true,
            Some(until) if now >= until && !self.probing => {
                self.probing = true;
                true
            }
            Some(_) => false,
        }
    }

    /// Whether a call could go now, without taking the probe slot (for ordering).
    pub fn would_allow(&self, now: Instant) -> bool {
        match self.open_until {
            None => true,
            Some(until) => now >= until && !self.probing,
        }
    }

    /// Records a good answer.
    pub fn on_success(&mut self) {
        self.failures = 0;
        self.open_until = None;
        self.probing = false;
    }

    /// Records a failure that proves the node down (a refused connection) at `now`: the
    /// circuit opens at once.
    pub fn on_down(&mut self, now: Instant) {
        self.failures = self.failures.max(self.threshold);
        self.open_until = Some(now + self.cooldown);
        self.probing = false;
    }

    /// Records a failure at `now`.
    pub fn on_failure(&mut self, now: Instant) {
        self.failures += 1;
        if self.probing || self.failures >= self.threshold {
            self.open_until = Some(now + self.cooldown);
            self.probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_proven_down_opens_at_once_and_recovers_through_one_probe() {
        let now = Instant::now();
        let mut b = Breaker::new(5, Duration::from_secs(5));
        b.on_down(now);
        assert_eq!(b.state(now), Circuit::Open);
        assert!(!b.allow(now + Duration::from_secs(1)));
        assert!(b.allow(now + Duration::from_secs(5)), "the probe after the cooldown");
        b.on_success();
        assert_eq!(b.state(now + Duration::from_secs(5)), Circuit::Closed);
    }

    #[test]
    fn opens_after_consecutive_failures_and_recovers_through_one_probe() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(5));
        b.on_failure(t0);
        b.on_failure(t0);
        b.on_success(); // not consecutive any more
        b.on_failure(t0);
        b.on_failure(t0);
        assert_eq!(b.state(t0), Circuit::Closed);
        b.on_failure(t0);
        assert_eq!(b.state(t0), Circuit::Open);
        assert!(!b.allow(t0 + Duration::from_secs(1)));
        let later = t0 + Duration::from_secs(5);
        assert!(b.would_allow(later));
        assert!(b.allow(later), "the probe");
        assert!(!b.allow(later), "only one probe at a time");
        assert_eq!(b.state(later), Circuit::HalfOpen);
        b.on_failure(later);
        assert_eq!(b.state(later + Duration::from_secs(1)), Circuit::Open, "a failed probe reopens");
        let again = later + Duration::from_secs(5);
        assert!(b.allow(again));
        b.on_success();
        assert_eq!(b.state(again), Circuit::Closed);
    }
}
