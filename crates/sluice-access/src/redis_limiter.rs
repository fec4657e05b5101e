//! Quotas shared by every replica: one Lua script per request runs the GCRA and the daily
//! count atomically in Redis, on Redis's own clock (replicas' clocks may differ).

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::{gcra, Refusal};

/// Deadline for one quota check.
const TIMEOUT: Duration = Duration::from_millis(250);

const SCRIPT: &str = r#"
-- KEYS[1]: the caller's rate state; KEYS[2]: prefix of its daily counter.
-- ARGV: interval ms (-1: no rate), burst, cost, daily limit (-1: none).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local day_limit = tonumber(ARGV[4])
local day_ms = 86400000
local day_key = KEYS[2] .. ':' .. math.floor(now / day_ms)
local rest_of_day = day_ms - (now % day_ms)
if day_limit >= 0 then
  local used = tonumber(redis.call('GET', day_key) or '0')
  if used + cost > day_limit then return {0, rest_of_day, 1} end
end
if interval >= 0 then
  local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
  if tat < now then tat = now end
  local new_tat = tat + interval * cost
  local allow_at = new_tat - interval * burst
  if now < allow_at then return {0, math.ceil(allow_at - now), 2} end
  redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil(new_tat - now) + 1000)
end
if day_limit >= 0 then
  redis.call('INCRBY', day_key, cost)
  redis.call('PEXPIRE', day_key, rest_of_day + 60000)
end
return {1, 0, 0}
"#;

/// Quota state in Redis.
pub struct RedisLimiter {
    redis: sluice_redis::Redis,
    script: redis::Script,
    fail_open: bool,
    warned: AtomicBool,
    /// Prefix of its keys in Redis.
    prefix: &'static str,
    /// The counter of store failures.
    errors_metric: &'static str,
}

impl RedisLimiter {
    /// A limiter on `url`; connects on first use.
    pub fn new(url: &str, fail_open: bool) -> Result<Self, String> {
        let redis = sluice_redis::Redis::open(url).map_err(|e| format!("access.redis_url: {e}"))?;
        Ok(Self {
            redis,
            script: redis::Script::new(SCRIPT),
            fail_open,
            warned: AtomicBool::new(false),
            prefix: "sluice:quota",
            errors_metric: "sluice_access_store_errors_total",
        })
    }

    /// A limiter for upstream members' budgets shared by replicas (`[pool] budget_store`): its
    /// own keys (`sluice:upstream-budget:…`) and failure counter
    /// (`sluice_upstream_budget_store_errors_total`).
    pub fn for_upstream_budgets(url: &str, fail_open: bool) -> Result<Self, String> {
        let mut limiter = Self::new(url, fail_open).map_err(|e| e.replace("access.redis_url", "pool.budget_store"))?;
        limiter.prefix = "sluice:upstream-budget";
        limiter.errors_metric = "sluice_upstream_budget_store_errors_total";
        metrics::counter!(limiter.errors_metric).increment(0);
        Ok(limiter)
    }

    /// Charges `cost` to `id`'s rate and daily count atomically, on Redis's clock; refused
    /// when either is spent, or when Redis fails and the limiter is fail-closed.
    pub async fn charge(
        &self,
        id: &str,
        rate: Option<gcra::Rate>,
        per_day: Option<u64>,
        cost: u32,
        _now_ms: u64,
    ) -> Result<(), Refusal> {
        let result = tokio::time::timeout(TIMEOUT, self.run(id, rate, per_day, cost)).await;
        match result {
            Ok(Ok(answer)) => {
                self.warned.store(false, Ordering::Relaxed);
                match answer.as_slice() {
                    [1, ..] => Ok(()),
                    [0, wait, 1] => {
                        Err(Refusal::OverQuota { what: "daily", retry_after: Duration::from_millis(*wait as u64) })
                    }
                    [0, wait, _] => {
                        Err(Refusal::OverQuota { what: "per-second", retry_after: Duration::from_millis(*wait as u64) })
                    }
                    _ => self.store_failed("unexpected script answer"),
                }
            }
            Ok(Err(e)) => self.store_failed(&e.to_string()),
            Err(_) => self.store_failed("timed out"),
        }
    }

    async fn run(
        &self,
        id: &str,
        rate: Option<gcra::Rate>,
        per_day: Option<u64>,
        cost: u32,
    ) -> redis::RedisResult<Vec<i64>> {
        let mut connection = self.redis.connection().await?;
        // The key itself never goes to Redis, only a hash of it.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut hasher);
        // In a Redis Cluster the script's two keys must share a slot: the hash is their tag.
        let bucket = if self.redis.is_cluster() {
            format!("{}:{{{:016x}}}", self.prefix, hasher.finish())
        } else {
            format!("{}:{:016x}", self.prefix, hasher.finish())
        };
        let (interval, burst) = rate.map_or((-1.0, 0), |r| (r.interval_ms(), r.burst));
        self.script
            .key(format!("{bucket}:rate"))
            .key(format!("{bucket}:day"))
            .arg(interval)
            .arg(burst)
            .arg(cost)
            .arg(per_day.map_or(-1, |d| d as i64))
            .invoke_async(&mut connection)
            .await
    }

    fn store_failed(&self, why: &str) -> Result<(), Refusal> {
        metrics::counter!(self.errors_metric).increment(1);
        if !self.warned.swap(true, Ordering::Relaxed) {
            let mode = if self.fail_open { "letting requests through" } else { "refusing requests" };
            tracing::warn!(error = %why, "quota store (Redis) unavailable; {mode} until it answers");
        }
        if self.fail_open {
            Ok(())
        } else {
            Err(Refusal::Unavailable)
        }
    }
}
