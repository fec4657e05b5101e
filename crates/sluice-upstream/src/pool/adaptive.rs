//! The rate a provider actually allows: cut when it answers 429 (or a JSON-RPC rate-limit
//! error), raised again slowly while it does not; a `Retry-After` pauses the member. Pure:
//! time is passed in.
//!
//! The cut is multiplicative from what the provider accepted in the last second (not from what
//! sluice offered, which may be far above it), at most once a second, so that a burst of 429s
//! for calls already in flight counts as one signal. The rise is multiplicative too, shaped as
//! TCP CUBIC's is around the rate where the last cut happened (the ceiling): 10 % a second up
//! to 95 % of it, 2 % a second from there to 105 % (where the provider refused last time),
//! 10 % again above (it allows more now). It stops at the configured `rate`; without one the
//! cap stays above demand and costs nothing.

use std::time::{Duration, Instant};

/// What remains of the accepted rate after a cut.
const CUT: f64 = 0.85;
/// Raised by this fraction each second without a limit signal, away from the ceiling …
const RISE: f64 = 0.10;
/// … and near it.
const RISE_NEAR: f64 = 0.02;
/// Never below this many calls per second.
const FLOOR: f64 = 1.0;
/// The longest `Retry-After` honoured (a provider asking for more is treated as this).
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// A member's adaptive rate.
#[derive(Debug, Clone)]
pub struct AdaptiveRate {
    configured: Option<f64>,
    cap: Option<f64>,
    /// The rate the provider refused last.
    ceiling: f64,
    last_cut: Option<Instant>,
    last_raise: Instant,
    paused_until: Option<Instant>,
    window_start: Instant,
    this_second: u32,
    last_second: u32,
    cuts: u64,
}

impl AdaptiveRate {
    /// Starts at the configured rate (`None`: no limit until the provider signals one).
    pub fn new(configured: Option<f64>, now: Instant) -> Self {
        Self {
            configured,
            cap: None,
            ceiling: 0.0,
            last_cut: None,
            last_raise: now,
            paused_until: None,
            window_start: now,
            this_second: 0,
            last_second: 0,
            cuts: 0,
        }
    }

    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= Duration::from_secs(1) {
            self.last_second = if elapsed < Duration::from_secs(2) { self.this_second } else { 0 };
            self.this_second = 0;
            self.window_start = now;
        }
    }

    /// Counts `n` calls the provider accepted.
    pub fn accepted(&mut self, n: usize, now: Instant) {
        self.roll(now);
        self.this_second = self.this_second.saturating_add(n as u32);
    }

    /// The provider refused a call for its rate: cut (once a second at most) and pause for
    /// `retry_after` if it asked.
    pub fn limited(&mut self, retry_after: Option<Duration>, now: Instant) {
        self.roll(now);
        if let Some(pause) = retry_after {
            let until = now + pause.min(MAX_PAUSE);
            self.paused_until = Some(self.paused_until.map_or(until, |p| p.max(until)));
        }
        if self.last_cut.is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1)) {
            return;
        }
        let accepted = f64::from(self.last_second.max(self.this_second));
        let from = match self.current() {
            Some(rate) => rate.min(accepted.max(FLOOR)),
            None => accepted,
        };
        self.ceiling = from.max(FLOOR);
        self.cap = Some((from * CUT).max(FLOOR));
        self.last_cut = Some(now);
        self.last_raise = now;
        self.cuts += 1;
    }

    /// Raises the cap for each whole second without a signal; at the configured rate the cap
    /// is gone. Returns the rate in force.
    pub fn tick(&mut self, now: Instant) -> Option<f64> {
        if let Some(cap) = self.cap {
            let seconds = now.saturating_duration_since(self.last_raise).as_secs();
            if seconds > 0 {
                let mut raised = cap;
                let (near, above) = (self.ceiling * 0.95, self.ceiling * 1.05);
                for _ in 0..seconds.min(600) {
                    raised = if raised < near {
                        (raised + (raised * RISE).max(FLOOR)).min(near)
                    } else if raised < above {
                        raised + raised * RISE_NEAR
                    } else {
                        raised + (raised * RISE).max(FLOOR)
                    };
                }
                self.last_raise += Duration::from_secs(seconds);
                self.cap = match self.configured {
                    Some(configured) if raised >= configured => None,
                    _ => Some(raised),
                };
            }
        }
        if self.paused_until.is_some_and(|p| now >= p) {
            self.paused_until = None;
        }
        self.current()
    }

    /// The rate in force: the configured one, or lower after a cut.
    pub fn current(&self) -> Option<f64> {
        match (self.configured, self.cap) {
            (Some(c), Some(cap)) => Some(c.min(cap)),
            (c, cap) => c.or(cap),
        }
    }

    /// Until when the provider asked for no calls.
    pub fn paused_until(&self) -> Option<Instant> {
        self.paused_until
    }

    /// True while the rate is below the configured one (or limited without one).
    pub fn is_cut(&self) -> bool {
        self.cap.is_some()
    }

    /// How many cuts so far.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn a_limit_cuts_below_what_was_accepted_and_recovery_is_slow() {
        let t0 = Instant::now();
        let mut rate = AdaptiveRate::new(None, t0);
        assert_eq!(rate.tick(t0), None, "no limit until the provider signals one");
        rate.accepted(20, t0); // the provider took 20 in the first second …
        rate.limited(None, second(t0, 1)); // … and then refused
        let cut = rate.current().unwrap();
        assert!((16.0..=18.0).contains(&cut), "{cut}: 85 % of the 20 accepted");
        // Many 429s for calls already in flight: one cut.
        rate.limited(None, second(t0, 1) + Duration::from_millis(300));
        assert_eq!(rate.current(), Some(cut));
        let after_2s = rate.tick(second(t0, 3)).unwrap();
        assert_eq!(after_2s, 19.0, "quickly back to 95 % of the rate refused");
        let after_4s = rate.tick(second(t0, 5)).unwrap();
        assert!(after_4s > 19.7 && after_4s < 19.8, "{after_4s}: then 2 % a second");
        let after_10s = rate.tick(second(t0, 11)).unwrap();
        assert!(after_10s > 25.0, "{after_10s}: past the old ceiling, 10 % a second again");
    }

    #[test]
    fn the_configured_rate_is_the_ceiling_and_the_cap_goes_when_it_is_reached() {
        let t0 = Instant::now();
        let mut rate = AdaptiveRate::new(Some(10.0), t0);
        assert_eq!(rate.tick(t0), Some(10.0));
        rate.accepted(50, t0); // more accepted than configured: the cut starts from 10
        rate.limited(None, second(t0, 1));
        assert_eq!(rate.current(), Some(8.5));
        assert!(rate.is_cut());
        assert!(rate.tick(second(t0, 4)).unwrap() < 10.0, "slowly near the rate refused");
        assert_eq!(rate.tick(second(t0, 7)), Some(10.0));
        assert!(!rate.is_cut());
    }

    #[test]
    fn retry_after_pauses_and_never_for_long() {
        let t0 = Instant::now();
        let mut rate = AdaptiveRate::new(Some(100.0), t0);
        rate.limited(Some(Duration::from_secs(2)), t0);
        assert_eq!(rate.paused_until(), Some(t0 + Duration::from_secs(2)));
        rate.tick(second(t0, 2));
        assert_eq!(rate.paused_until(), None);
        rate.limited(Some(Duration::from_secs(86_400)), second(t0, 3));
        assert_eq!(rate.paused_until(), Some(second(t0, 63)), "at most a minute");
        assert_eq!(rate.current(), Some(FLOOR), "nothing accepted in the last second: the floor");
    }
}
