//! The generic cell rate algorithm, as pure arithmetic on milliseconds: one number per caller
//! (the theoretical arrival time) says whether a request of some cost fits the rate, and when
//! it would. The same arithmetic runs in memory and, as a Lua script, in Redis.

/// A rate: `per_second` requests per second, with bursts of up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained requests per second.
    pub per_second: f64,
    /// Requests that may arrive at once.
    pub burst: u32,
}

impl Rate {
    /// Milliseconds one unit of cost takes to earn back.
    pub fn interval_ms(&self) -> f64 {
        1000.0 / self.per_second.max(f64::MIN_POSITIVE)
    }
}

/// The verdict on one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RateDecision {
    /// Allowed; store this theoretical arrival time.
    Allow {
        /// The caller's new state.
        tat_ms: f64,
    },
    /// Refused; it would fit after this many milliseconds (state unchanged).
    Deny {
        /// Wait before retrying.
        retry_after_ms: f64,
    },
}

/// Checks a request of `cost` units at `now_ms` against `rate`, given the stored `tat_ms`.
pub fn check(rate: Rate, tat_ms: f64, now_ms: f64, cost: u32) -> RateDecision {
    let interval = rate.interval_ms();
    let tat = tat_ms.max(now_ms);
    let new_tat = tat + interval * f64::from(cost);
    let allow_at = new_tat - interval * f64::from(rate.burst.max(1));
    if now_ms < allow_at {
        RateDecision::Deny { retry_after_ms: allow_at - now_ms }
    } else {
        RateDecision::Allow { tat_ms: new_tat }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rate: Rate, times: &[f64]) -> Vec<bool> {
        let mut tat = 0.0;
        times
            .iter()
            .map(|&t| match check(rate, tat, t, 1) {
                RateDecision::Allow { tat_ms } => {
                    tat = tat_ms;
                    true
                }
                RateDecision::Deny { .. } => false,
            })
            .collect()
    }

    #[test]
    fn a_burst_passes_then_the_rate_holds() {
        let rate = Rate { per_second: 10.0, burst: 3 };
        // Five at once: the burst of three passes.
        assert_eq!(run(rate, &[0.0; 5]), [true, true, true, false, false]);
        // Evenly spaced at the rate: all pass.
        let even: Vec<f64> = (0..50).map(|i| f64::from(i) * 100.0).collect();
        assert!(run(rate, &even).iter().all(|a| *a));
        // Twice the rate for 10 s: about half pass (plus the burst).
        let fast: Vec<f64> = (0..200).map(|i| f64::from(i) * 50.0).collect();
        let passed = run(rate, &fast).iter().filter(|a| **a).count();
        assert!((100..=104).contains(&passed), "{passed}");
    }

    #[test]
    fn a_refusal_says_when_to_come_back_and_cost_counts() {
        let rate = Rate { per_second: 2.0, burst: 1 };
        let RateDecision::Allow { tat_ms } = check(rate, 0.0, 0.0, 1) else { panic!() };
        assert_eq!(check(rate, tat_ms, 100.0, 1), RateDecision::Deny { retry_after_ms: 400.0 });
        assert!(matches!(check(rate, tat_ms, 500.0, 1), RateDecision::Allow { .. }));
        assert!(
            matches!(check(Rate { per_second: 10.0, burst: 5 }, 0.0, 0.0, 6), RateDecision::Deny { .. }),
            "cost above the burst"
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// In any window, no more passes than the burst plus what the rate earns in it.
        #[test]
        fn no_window_admits_more_than_burst_plus_rate(
            per_second in 1.0f64..100.0,
            burst in 1u32..20,
            gaps in proptest::collection::vec(0.0f64..50.0, 1..300),
        ) {
            let rate = Rate { per_second, burst };
            let mut now = 0.0;
            let mut tat = 0.0;
            let mut passed = Vec::new();
            for gap in gaps {
                now += gap;
                if let RateDecision::Allow { tat_ms } = check(rate, tat, now, 1) {
                    tat = tat_ms;
                    passed.push(now);
                }
            }
            for (i, start) in passed.iter().enumerate() {
                for window in [10.0, 100.0, 1000.0] {
                    let inside = passed[i..].iter().take_while(|t| **t < start + window).count() as f64;
                    let bound = f64::from(burst) + window * per_second / 1000.0 + 1e-9;
                    prop_assert!(inside <= bound.floor() + 1.0, "{inside} in {window} ms, bound {bound}");
                }
            }
        }
    }
}
