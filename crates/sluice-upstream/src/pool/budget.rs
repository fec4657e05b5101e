//! Per-upstream budgets: a request rate (token bucket) and a daily quota, enforced on sluice's
//! side so a provider's limits are never exceeded. Pure: time is passed in.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A token bucket: `rate` per second, up to `burst` at once.
#[derive(Debug, Clone)]
pub struct RateLimit {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// `rate` requests per second; bursts up to one second's worth (at least 1).
    pub fn new(rate: f64, now: Instant) -> Self {
        let burst = rate.max(1.0);
        Self { rate, burst, tokens: burst, last: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
    }

    /// Takes one request's token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes up to `n` tokens and says how many it took.
    pub fn take_up_to(&mut self, n: usize, now: Instant) -> usize {
        self.refill(now);
        let taken = (self.tokens.floor().max(0.0) as usize).min(n);
        self.tokens -= taken as f64;
        taken
    }

    /// Tokens left now, rounded down (0 while calls wait for tokens already promised).
    pub fn left(&mut self, now: Instant) -> u64 {
        self.refill(now);
        self.tokens.max(0.0) as u64
    }

    /// The rate in force, per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Changes the rate and the burst (an adaptive cut or rise); what is owed stays owed.
    pub fn set_rate(&mut self, rate: f64, burst: f64, now: Instant) {
        self.refill(now);
        self.rate = rate.max(f64::MIN_POSITIVE);
        self.burst = burst.max(1.0);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Reserves `n` calls: at once if the tokens are there, else in turn behind the calls
    /// already waiting, as long as the wait is at most `max_wait` (the queue is bounded by
    /// time: `rate × max_wait` calls). Gives how long to wait, or `None` when the queue is
    /// full (nothing is taken then).
    pub fn reserve(&mut self, n: usize, now: Instant, max_wait: Duration) -> Option<Duration> {
        self.refill(now);
        let after = self.tokens - n as f64;
        if after >= 0.0 {
            self.tokens = after;
            return Some(Duration::ZERO);
        }
        let wait = Duration::from_secs_f64(-after / self.rate);
        if wait > max_wait {
            return None;
        }
        self.tokens = after;
        Some(wait)
    }

    /// Whether one more call could be reserved within `max_wait`, and whether it would wait.
    pub fn could_reserve(&mut self, now: Instant, max_wait: Duration) -> (bool, bool) {
        self.refill(now);
        let after = self.tokens - 1.0;
        (after >= 0.0 || Duration::from_secs_f64(-after / self.rate) <= max_wait, after < 0.0)
    }
}

/// A quota of requests per UTC day.
#[derive(Debug, Clone)]
pub struct DailyQuota {
    limit: u64,
    used: u64,
    day: u64,
}

fn utc_day(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs() / 86_400
}

impl DailyQuota {
    /// `limit` requests per UTC day.
    pub fn new(limit: u64, now: SystemTime) -> Self {
        Self { limit, used: 0, day: utc_day(now) }
    }

    fn roll(&mut self, now: SystemTime) {
        let today = utc_day(now);
        if today != self.day {
            self.day = today;
            self.used = 0;
        }
    }

    /// Requests allowed per day.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Requests left today.
    pub fn left(&mut self, now: SystemTime) -> u64 {
        self.roll(now);
        self.limit.saturating_sub(self.used)
    }

    /// Takes up to `n` requests of today's and says how many it took.
    pub fn take_up_to(&mut self, n: usize, now: SystemTime) -> usize {
        self.roll(now);
        let taken = self.limit.saturating_sub(self.used).min(n as u64);
        self.used += taken;
        taken as usize
    }

    /// Takes one request if any are left today.
    pub fn take(&mut self, now: SystemTime) -> bool {
        self.roll(now);
        if self.used < self.limit {
            self.used += 1;
            true
        } else {
            false
        }
    }
}

/// Which methods an upstream serves: an allow-list (if any) and a deny-list, with `prefix_*`
/// wildcards.
#[derive(Debug, Clone, Default)]
pub struct MethodFilter {
    /// Only these, when not empty.
    pub include: Vec<String>,
    /// Never these.
    pub exclude: Vec<String>,
}

fn matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => method.starts_with(prefix),
        None => pattern == method,
    }
}

impl MethodFilter {
    /// Whether `method` may go to this upstream.
    pub fn allows(&self, method: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|p| matches(p, method)))
            && !self.exclude.iter().any(|p| matches(p, method))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_never_exceeds_its_budget() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(10.0, t0);
        // Hammer it for 3 simulated seconds, one attempt per millisecond.
        let taken = (0..3000).filter(|ms| limit.take(t0 + Duration::from_millis(*ms))).count();
        assert!((30..=40).contains(&taken), "{taken}: 10/s for 3 s plus a 10-request burst");
    }

    #[test]
    fn reservations_queue_behind_each_other_up_to_the_wait() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(10.0, t0);
        let max = Duration::from_secs(1);
        let waits: Vec<Option<Duration>> = (0..25).map(|_| limit.reserve(1, t0, max)).collect();
        assert!(waits[..10].iter().all(|w| *w == Some(Duration::ZERO)), "the burst goes at once");
        assert_eq!(waits[10], Some(Duration::from_millis(100)), "then one every 100 ms");
        assert_eq!(waits[19], Some(Duration::from_secs(1)));
        assert!(waits[20..].iter().all(Option::is_none), "a second's queue, then refused");
        assert_eq!((limit.left(t0), limit.could_reserve(t0, max)), (0, (false, true)));
        // Half a second later, five places are free again.
        let later = t0 + Duration::from_millis(500);
        assert_eq!(limit.reserve(5, later, max), Some(Duration::from_secs(1)));
        limit.set_rate(5.0, 5.0, later);
        assert_eq!(limit.rate(), 5.0);
        assert_eq!(limit.reserve(1, later, max), None, "a slower rate: the queue is longer in time");
    }

    #[test]
    fn batches_take_what_the_budgets_have() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(5.0, t0);
        assert_eq!(limit.take_up_to(8, t0), 5);
        assert_eq!(limit.take_up_to(8, t0), 0);
        assert_eq!(limit.take_up_to(8, t0 + Duration::from_millis(400)), 2);
        let day = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400);
        let mut quota = DailyQuota::new(3, day);
        assert_eq!((quota.take_up_to(2, day), quota.take_up_to(2, day), quota.take_up_to(2, day)), (2, 1, 0));
    }

    #[test]
    fn the_daily_quota_resets_at_utc_midnight() {
        let day = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400);
        let mut quota = DailyQuota::new(3, day);
        assert!(quota.take(day) && quota.take(day) && quota.take(day));
        assert!(!quota.take(day + Duration::from_secs(86_399)));
        assert_eq!(quota.left(day + Duration::from_secs(86_400)), 3);
    }

    #[test]
    fn method_filters_with_wildcards() {
        let filter = MethodFilter { include: vec![], exclude: vec!["debug_*".into(), "trace_block".into()] };
        assert!(filter.allows("eth_call"));
        assert!(!filter.allows("debug_traceTransaction"));
        assert!(!filter.allows("trace_block"));
        let only = MethodFilter { include: vec!["eth_*".into()], exclude: vec!["eth_sendRawTransaction".into()] };
        assert!(only.allows("eth_getLogs") && !only.allows("net_version") && !only.allows("eth_sendRawTransaction"));
    }
}
