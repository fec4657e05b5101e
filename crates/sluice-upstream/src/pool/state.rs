//! What the pool knows of one member between calls: health, circuit, latency window, budgets
//! and the rate its provider allows, known block hashes. Pure: time is passed in.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use super::range::{Availability, History};
use super::{AdaptiveRate, Breaker, DailyQuota, Health, RateLimit, Recent};
use crate::UpstreamError;

/// Block hashes a member is known to have (its probed heads, answers by hash).
const KNOWN_HASHES: usize = 256;

pub(super) struct State {
    pub(super) health: Health,
    pub(super) breaker: Breaker,
    pub(super) recent: Recent,
    /// The limiter of the rate in force (configured, or cut by the provider's 429s).
    pub(super) rate: Option<RateLimit>,
    pub(super) adaptive: AdaptiveRate,
    pub(super) quota: Option<DailyQuota>,
    pub(super) known_hashes: VecDeque<String>,
    /// The largest batch the node accepted after refusing a larger one.
    pub(super) batch_limit: Option<usize>,
    /// Answers of "no such block" from this member, for `/status`.
    pub(super) missing_blocks: u64,
    /// Why its last exchange failed, if it did: what a caller is told while its circuit is open.
    pub(super) last_error: Option<UpstreamError>,
    /// Its lowest blocks with state and with chain data.
    pub(super) availability: Availability,
    /// Answers it gave against a consensus majority, in all and in a row.
    pub(super) dissents: u64,
    pub(super) dissent_streak: u32,
    /// Cordoned for dissent until then: no calls.
    pub(super) cordoned_until: Option<Instant>,
    /// Times it was cordoned.
    pub(super) cordons: u64,
    /// When its head was last learned (a probe, a notification, an answer naming its head):
    /// the prober leaves it alone for about a block after.
    pub(super) heard: Option<Instant>,
    /// Its last sign of life: a healthy exchange, a head it announced.
    pub(super) alive: Option<Instant>,
}

/// Whether a member's budgets allow a call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BudgetView {
    /// A call can be sent now or after a wait of at most `budget_wait`.
    pub(super) within: bool,
    /// It would have to wait (its rate's queue, or a `Retry-After`).
    pub(super) waits: bool,
}

impl State {
    pub(super) fn new(
        breaker: Breaker,
        rate: Option<f64>,
        quota: Option<u64>,
        history: History,
        now: Instant,
        wall: SystemTime,
    ) -> Self {
        Self {
            health: Health::default(),
            breaker,
            recent: Recent::default(),
            rate: rate.map(|r| RateLimit::new(r, now)),
            adaptive: AdaptiveRate::new(rate, now),
            quota: quota.map(|q| DailyQuota::new(q, wall)),
            known_hashes: VecDeque::new(),
            batch_limit: None,
            missing_blocks: 0,
            last_error: None,
            availability: Availability::new(history),
            dissents: 0,
            dissent_streak: 0,
            cordoned_until: None,
            cordons: 0,
            heard: None,
            alive: None,
        }
    }

    /// Its score (lower is better): health's, times (1 + its consensus dissents in a row), so a
    /// member that starts to disagree is asked last well before it is cordoned.
    pub(super) fn score(&self, weight: u32) -> f64 {
        self.health.score(weight) * f64::from(1 + self.dissent_streak.min(16))
    }

    /// Cordoned for dissent at `now`.
    pub(super) fn cordoned(&self, now: Instant) -> bool {
        self.cordoned_until.is_some_and(|until| now < until)
    }

    /// Puts the adaptive rate in force into the limiter. After a cut the burst is a tenth of
    /// a second's worth: a provider counting in fixed windows would refuse a full second's
    /// burst on top of the steady rate.
    fn adapt(&mut self, now: Instant) {
        let current = self.adaptive.tick(now);
        let burst = |r: f64| if self.adaptive.is_cut() { r / 10.0 } else { r };
        match (current, &mut self.rate) {
            (None, rate) => *rate = None,
            (Some(r), Some(limit)) if limit.rate() != r => limit.set_rate(r, burst(r), now),
            (Some(_), Some(_)) => {}
            (Some(r), rate @ None) => {
                let mut limit = RateLimit::new(r, now);
                limit.set_rate(r, burst(r), now);
                *rate = Some(limit);
            }
        }
    }

    fn pause(&self, now: Instant) -> Duration {
        self.adaptive.paused_until().map_or(Duration::ZERO, |p| p.saturating_duration_since(now))
    }

    /// Whether the member's budgets allow a call now, or after a wait of at most `max_wait`.
    /// `wall` is read only when there is a daily quota (a clock read less per call otherwise).
    pub(super) fn budget(&mut self, now: Instant, wall: impl Fn() -> SystemTime, max_wait: Duration) -> BudgetView {
        self.adapt(now);
        let pause = self.pause(now);
        let quota_left = self.quota.as_mut().is_none_or(|q| q.left(wall()) > 0);
        let (rate_ok, rate_waits) =
            self.rate.as_mut().map_or((true, false), |r| r.could_reserve(now, max_wait.saturating_sub(pause)));
        BudgetView { within: quota_left && pause <= max_wait && rate_ok, waits: rate_waits || !pause.is_zero() }
    }

    /// Spends up to `n` calls of the budgets: how many may go, and after how long a wait (a
    /// place in the rate's queue, a `Retry-After`). Calls that cannot wait so long are not
    /// taken. `wall` is read only when there is a daily quota.
    pub(super) fn spend(
        &mut self,
        n: usize,
        now: Instant,
        wall: impl Fn() -> SystemTime,
        max_wait: Duration,
    ) -> (usize, Duration) {
        self.adapt(now);
        let pause = self.pause(now);
        if pause > max_wait {
            return (0, Duration::ZERO);
        }
        let (n, wait) = match self.rate.as_mut() {
            None => (n, Duration::ZERO),
            Some(r) => match r.reserve(n, now, max_wait - pause) {
                Some(wait) => (n, wait),
                None => (r.take_up_to(n, now), Duration::ZERO),
            },
        };
        // The quota is only charged for what the rate let through.
        let n = self.quota.as_mut().map_or(n, |q| q.take_up_to(n, wall()));
        (n, wait.max(pause))
    }

    pub(super) fn knows(&self, hash: &str) -> bool {
        self.known_hashes.iter().any(|h| h == hash)
    }

    pub(super) fn learn(&mut self, hash: &str) {
        if !self.knows(hash) {
            if self.known_hashes.len() == KNOWN_HASHES {
                self.known_hashes.pop_front();
            }
            self.known_hashes.push_back(hash.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dissent_in_a_row_scores_a_member_down_and_agreement_restores_it() {
        let now = Instant::now();
        let mut state =
            State::new(Breaker::new(5, Duration::from_secs(5)), None, None, History::Unknown, now, SystemTime::now());
        let fair = state.score(1);
        state.dissent_streak = 2;
        assert_eq!(state.score(1), 3.0 * fair);
        state.dissent_streak = 0;
        assert_eq!(state.score(1), fair);
        assert!(!state.cordoned(now));
        state.cordoned_until = Some(now + Duration::from_secs(1));
        assert!(state.cordoned(now) && !state.cordoned(now + Duration::from_secs(2)));
    }
}
