//! Hedging policy: when to send a second copy of a slow call, and how much extra load that may
//! add. Pure: time and samples are passed in.

use std::time::Duration;

/// Recent latencies of one upstream, for its p95.
#[derive(Debug, Clone)]
pub struct Recent {
    samples: Vec<u32>,
    next: usize,
}

const WINDOW: usize = 128;

impl Default for Recent {
    fn default() -> Self {
        Self { samples: Vec::with_capacity(WINDOW), next: 0 }
    }
}

impl Recent {
    /// Adds one latency.
    pub fn push(&mut self, latency: Duration) {
        let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        if self.samples.len() < WINDOW {
            self.samples.push(micros);
        } else {
            self.samples[self.next] = micros;
        }
        self.next = (self.next + 1) % WINDOW;
    }

    /// The `q` quantile of the window; `None` until there are 20 samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.samples.len() < 20 {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() - 1) as f64 * q).round() as usize;
        Some(Duration::from_micros(u64::from(sorted[index])))
    }
}

/// When to hedge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeAfter {
    /// Never.
    Off,
    /// After this long without an answer.
    Fixed(Duration),
    /// After the upstream's recent p95 (at least `floor`), once it has enough samples.
    P95 {
        /// Never hedge sooner than this.
        floor: Duration,
    },
}

impl HedgeAfter {
    /// The delay for an upstream with these recent latencies; `None`: do not hedge.
    pub fn delay(&self, recent: &Recent) -> Option<Duration> {
        match *self {
            HedgeAfter::Off => None,
            HedgeAfter::Fixed(d) => Some(d),
            HedgeAfter::P95 { floor } => recent.quantile(0.95).map(|p95| p95.max(floor)),
        }
    }
}

/// Caps hedges at a fraction of calls: each call earns `fraction` of a token, each hedge
/// spends one; at most `burst` tokens are kept.
#[derive(Debug, Clone)]
pub struct HedgeBudget {
    fraction: f64,
    burst: f64,
    tokens: f64,
}

impl HedgeBudget {
    /// Hedges may add at most `fraction` (e.g. 0.1 = 10 %) extra calls, `burst` at once.
    pub fn new(fraction: f64, burst: f64) -> Self {
        Self { fraction: fraction.clamp(0.0, 1.0), burst: burst.max(1.0), tokens: 0.0 }
    }

    /// Counts one call.
    pub fn on_call(&mut self) {
        self.tokens = (self.tokens + self.fraction).min(self.burst);
    }

    /// Takes a hedge if the budget allows.
    pub fn try_hedge(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_needs_samples_and_respects_the_floor() {
        let mut recent = Recent::default();
        let policy = HedgeAfter::P95 { floor: Duration::from_millis(5) };
        assert_eq!(policy.delay(&recent), None);
        for i in 1..=100u64 {
            recent.push(Duration::from_millis(i));
        }
        assert_eq!(policy.delay(&recent), Some(Duration::from_millis(95)));
        let mut fast = Recent::default();
        for _ in 0..50 {
            fast.push(Duration::from_micros(100));
        }
        assert_eq!(policy.delay(&fast), Some(Duration::from_millis(5)));
        assert_eq!(HedgeAfter::Off.delay(&recent), None);
    }

    #[test]
    fn the_window_keeps_the_newest_samples() {
        let mut recent = Recent::default();
        for _ in 0..200 {
            recent.push(Duration::from_secs(1));
        }
        for _ in 0..128 {
            recent.push(Duration::from_millis(1));
        }
        assert_eq!(recent.quantile(0.99), Some(Duration::from_millis(1)));
    }

    #[test]
    fn hedges_stay_under_their_fraction() {
        let mut budget = HedgeBudget::new(0.1, 5.0);
        let mut hedges = 0;
        for _ in 0..1000 {
            budget.on_call();
            if budget.try_hedge() {
                hedges += 1;
            }
        }
        assert!((99..=100).contains(&hedges), "{hedges}");
    }
}
