//! Health and scoring per upstream. Pure.

use std::time::Duration;

/// Smoothing for the moving averages: each sample moves them by this fraction.
const ALPHA: f64 = 0.2;

/// What sluice knows of one upstream's recent behaviour.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Moving average of call latency, µs (0 until the first sample).
    pub latency_us: f64,
    /// Moving average of the failure rate, 0..1.
    pub error_rate: f64,
    /// Calls in flight now.
    pub in_flight: u32,
    /// Its latest block height, from the prober.
    pub head: Option<u64>,
}

impl Health {
    /// Records a finished call.
    pub fn record(&mut self, latency: Duration, ok: bool) {
        let micros = latency.as_micros() as f64;
        self.latency_us =
            if self.latency_us == 0.0 { micros } else { self.latency_us + ALPHA * (micros - self.latency_us) };
        self.error_rate += ALPHA * ((!ok as u8 as f64) - self.error_rate);
    }

    /// Lower is better: latency grown by load and by failures, shrunk by weight.
    pub fn score(&self, weight: u32) -> f64 {
        let latency = if self.latency_us == 0.0 { 1_000.0 } else { self.latency_us };
        latency * (1.0 + f64::from(self.in_flight)) * (1.0 + 10.0 * self.error_rate) / f64::from(weight.max(1))
    }

    /// Blocks behind `best`, when both are known.
    pub fn lag(&self, best: Option<u64>) -> Option<u64> {
        Some(best?.saturating_sub(self.head?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_busy_or_failing_upstreams_score_worse() {
        let mut fast = Health::default();
        let mut slow = Health::default();
        for _ in 0..10 {
            fast.record(Duration::from_micros(200), true);
            slow.record(Duration::from_micros(2_000), true);
        }
        assert!(fast.score(1) < slow.score(1));
        let mut failing = fast.clone();
        for _ in 0..5 {
            failing.record(Duration::from_micros(200), false);
        }
        assert!(failing.error_rate > 0.5);
        assert!(failing.score(1) > fast.score(1));
        let mut busy = fast.clone();
        busy.in_flight = 20;
        assert!(busy.score(1) > slow.score(1));
        assert!(fast.score(4) < fast.score(1), "weight favours");
        assert_eq!(Health { head: Some(90), ..Health::default() }.lag(Some(100)), Some(10));
    }
}
