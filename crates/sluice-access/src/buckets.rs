//! Each caller's quota bucket in memory, when no Redis is shared: the per-second rate (GCRA)
//! and what the day has spent. The map is pruned of callers gone quiet, so it holds about the
//! day's callers, not every caller (every token subject) ever seen.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::{day_of, gcra, Refusal};

#[derive(Default)]
pub(crate) struct Bucket {
    tat_ms: f64,
    day: u64,
    used_today: u64,
}

/// Each caller's bucket, in memory (no Redis). A bucket whose rate has recovered and that
/// spent nothing today is as good as none: such buckets are dropped whenever the map has
/// doubled since the last look, so the map holds about the callers of the day, not every
/// caller (every JWT subject) ever seen.
#[derive(Default)]
pub(crate) struct Buckets {
    map: HashMap<String, Bucket>,
    /// The size at which idle buckets are dropped next.
    prune_at: usize,
}

/// The smallest map worth pruning.
const PRUNE_FROM: usize = 1024;

impl Buckets {
    fn prune(&mut self, now: u64) {
        if self.map.len() < self.prune_at.max(PRUNE_FROM) {
            return;
        }
        let (today, _) = day_of(now);
        self.map.retain(|_, b| b.tat_ms > now as f64 || (b.day == today && b.used_today > 0));
        self.prune_at = self.map.len() * 2;
        metrics::gauge!("sluice_access_buckets").set(self.map.len() as f64);
    }
}

pub(crate) fn charge_memory(
    buckets: &Mutex<Buckets>,
    id: &str,
    rate: Option<gcra::Rate>,
    per_day: Option<u64>,
    cost: u32,
    now: u64,
) -> Result<(), Refusal> {
    // The lock covers arithmetic only: no I/O, no await.
    let mut buckets = buckets.lock().unwrap_or_else(|e| e.into_inner());
    if !buckets.map.contains_key(id) {
        buckets.prune(now);
        metrics::gauge!("sluice_access_buckets").set(buckets.map.len() as f64 + 1.0);
    }
    let bucket = buckets.map.entry(id.to_owned()).or_default();
    let (day, rest_of_day) = day_of(now);
    if bucket.day != day {
        bucket.day = day;
        bucket.used_today = 0;
    }
    if per_day.is_some_and(|limit| bucket.used_today + u64::from(cost) > limit) {
        return Err(Refusal::OverQuota { what: "daily", retry_after: rest_of_day });
    }
    let mut tat = bucket.tat_ms;
    if let Some(rate) = rate {
        match gcra::check(rate, bucket.tat_ms, now as f64, cost) {
            gcra::RateDecision::Allow { tat_ms } => tat = tat_ms,
            gcra::RateDecision::Deny { retry_after_ms } => {
                return Err(Refusal::OverQuota {
                    what: "per-second",
                    retry_after: Duration::from_millis(retry_after_ms.ceil() as u64),
                })
            }
        }
    }
    bucket.tat_ms = tat;
    bucket.used_today += u64::from(cost);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token service's subjects come and go: each yesterday's caller leaves its bucket, and
    /// the map must hold today's callers, not every caller ever seen.
    #[test]
    fn the_buckets_of_callers_gone_quiet_are_dropped() {
        let buckets = Mutex::new(Buckets::default());
        let rate = Some(gcra::Rate { per_second: 10.0, burst: 10 });
        let day = 86_400_000;
        let t0 = 1_000 * day;
        for d in 0..20u64 {
            for caller in 0..1000u64 {
                let id = format!("jwt:user-{d}-{caller}");
                assert!(charge_memory(&buckets, &id, rate, Some(100), 1, t0 + d * day + caller).is_ok());
            }
        }
        let held = buckets.lock().unwrap().map.len();
        assert!(held <= 3 * 1000, "{held} buckets held for 1000 callers a day over 20 days");
        // Today's callers keep theirs: the daily quota still counts.
        for _ in 0..99 {
            assert!(charge_memory(&buckets, "jwt:user-19-5", None, Some(100), 1, t0 + 19 * day + 10).is_ok());
        }
        assert!(charge_memory(&buckets, "jwt:user-19-5", None, Some(100), 1, t0 + 19 * day + 10).is_err());
    }

    #[test]
    fn per_second_and_daily_quotas_refuse_with_when_to_come_back() {
        let buckets = Mutex::new(Buckets::default());
        let rate = Some(gcra::Rate { per_second: 2.0, burst: 2 });
        let t0 = 1_000_000_000_000;
        assert!(charge_memory(&buckets, "a", rate, Some(5), 1, t0).is_ok());
        assert!(charge_memory(&buckets, "a", rate, Some(5), 1, t0).is_ok());
        let Err(Refusal::OverQuota { what, retry_after }) = charge_memory(&buckets, "a", rate, Some(5), 1, t0) else {
            panic!("over the burst")
        };
        assert_eq!((what, retry_after), ("per-second", Duration::from_millis(500)));
        assert!(charge_memory(&buckets, "b", rate, Some(5), 1, t0).is_ok(), "buckets are per caller");
        assert!(charge_memory(&buckets, "a", rate, Some(5), 3, t0 + 5_000).is_err(), "cost 3 over a burst of 2");
        assert!(charge_memory(&buckets, "a", rate, Some(5), 2, t0 + 5_000).is_ok());
        let Err(Refusal::OverQuota { what, .. }) = charge_memory(&buckets, "a", rate, Some(5), 2, t0 + 10_000) else {
            panic!("over the day")
        };
        assert_eq!(what, "daily");
        assert!(charge_memory(&buckets, "a", rate, Some(5), 1, t0 + 86_400_000).is_ok(), "a new day");
    }
}
