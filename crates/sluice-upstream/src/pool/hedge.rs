//! Hedging policy: when to send a second copy of a slow call, and how much extra load that may
//! add. Pure: time and samples are passed in.

use std::time::Duration;

/// Recent latencies of one upstream, for its p95.
#[derive(Debug, Clone)]
pub struct Recent {
    samples: Vec<u32>,
    next: usize,
    pushes: u64,
    /// The p95, recomputed every [`P95_EVERY`] samples rather than sorted for every call.
    p95: Option<Duration>,
}

/// How often the cached p95 is recomputed, in samples.
const P95_EVERY: u64 = 16;

const WINDOW: usize = 128;

impl Default for Recent {
    fn default() -> Self {
        Self { samples: Vec::with_capacity(WINDOW), next: 0, pushes: 0, p95: None }
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
        self.pushes += 1;
        if self.pushes.is_multiple_of(P95_EVERY) || (self.p95.is_none() && self.samples.len() >= 20) {
            self.p95 = self.quantile(0.95);
        }
    }

    /// The window's p95 as last computed (at most [`P95_EVERY`] samples old); `None` until
    /// there are 20 samples.
    pub fn p95(&self) -> Option<Duration> {
        self.p95
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
            HedgeAfter::P95 { floor } => recent.p95().map(|p95| p95.max(floor)),
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
        // 96 samples: the cached p95 was just recomputed (every 16), so it is the window's own.
        for i in 1..=96u64 {
            recent.push(Duration::from_millis(i));
        }
        assert_eq!(policy.delay(&recent), Some(Duration::from_millis(91)));
        assert_eq!(recent.p95(), recent.quantile(0.95));
        // Between recomputations it may be up to 15 samples old, never older.
        for _ in 0..15 {
            recent.push(Duration::from_millis(1000));
        }
        assert_eq!(recent.p95(), Some(Duration::from_millis(91)));
        recent.push(Duration::from_millis(1000));
        assert_eq!(recent.p95(), recent.quantile(0.95));
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
