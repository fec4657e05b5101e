//! Upstream budgets shared by replicas: the pool's [`SharedBudget`] seam over the same Redis
//! GCRA script as the access quotas, so that N sluices together stay under a provider's rate
//! and daily quota.

use async_trait::async_trait;
use sluice_access::gcra::Rate;
use sluice_access::RedisLimiter;
use sluice_upstream::pool::SharedBudget;

/// Members' budgets in Redis (`[pool] budget_store`).
pub struct RedisBudgets {
    limiter: RedisLimiter,
}

impl std::fmt::Debug for RedisBudgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisBudgets")
    }
}

impl RedisBudgets {
    /// Budgets on `url`, failing open or closed when Redis does not answer.
    pub fn new(url: &str, fail_open: bool) -> Result<Self, String> {
        Ok(Self { limiter: RedisLimiter::for_upstream_budgets(url, fail_open)? })
    }

    async fn charge(&self, key: &str, rate: Option<f64>, daily: Option<u64>, n: usize) -> bool {
        // The provider's rate with a burst of one second's worth, as the local limiter has.
        let rate = rate.map(|r| Rate { per_second: r, burst: r.max(1.0) as u32 });
        self.limiter.charge(key, rate, daily, n as u32, 0).await.is_ok()
    }
}

#[async_trait]
impl SharedBudget for RedisBudgets {
    async fn take(&self, key: &str, rate: Option<f64>, daily: Option<u64>, n: usize) -> usize {
        if self.charge(key, rate, daily, n).await {
            return n;
        }
        // A batch larger than what is left: one call at a time, as far as the budgets go.
        let mut taken = 0;
        while taken < n && self.charge(key, rate, daily, 1).await {
            taken += 1;
        }
        taken
    }
}
