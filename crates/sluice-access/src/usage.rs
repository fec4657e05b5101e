//! Usage accounting: calls and compute units per caller, UTC day and method.
//!
//! Prometheus gets totals by tier only (`sluice_access_calls_total{tier}`,
//! `sluice_access_units_total{tier}`): one series per key would grow without bound. Per key,
//! the admin API reads the tallies kept here, in memory, or, with Redis, summed over every
//! replica: each replica adds what it counted to Redis once a second (hash
//! `sluice:usage:<caller>:<day>`, fields `<method>|calls` and `<method>|units`, kept 40 days).
//!
//! Bounded: at most [`MAX_METHODS`] method names per caller and day (the rest count as
//! `other`, since callers choose method names), and [`KEEP_DAYS`] days in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// Method names kept apart per caller and day.
pub const MAX_METHODS: usize = 64;
/// Days kept in memory.
pub const KEEP_DAYS: u64 = 31;
const FLUSH_EVERY: Duration = Duration::from_secs(1);
const REDIS_TTL_SECS: i64 = 40 * 86_400;

/// Calls and units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Calls.
    pub calls: u64,
    /// Compute units.
    pub units: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.calls += other.calls;
        self.units += other.units;
    }
}

/// One day's usage of one caller.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DayUsage {
    /// The UTC day number (days since 1970-01-01).
    pub day: u64,
    /// All methods together.
    pub total: Tally,
    /// Per method.
    pub methods: BTreeMap<String, Tally>,
}

/// Caller → day → method → tally.
type Days = HashMap<String, HashMap<u64, HashMap<String, Tally>>>;

/// The tallies.
pub struct Usage {
    days: Mutex<Days>,
    /// Counted since the last flush to Redis.
    pending: Mutex<Days>,
    redis: Option<sluice_redis::Redis>,
    /// Each tier's Prometheus counters (calls, units), registered once.
    counters: HashMap<String, (metrics::Counter, metrics::Counter)>,
}

/// Adds to a caller's day, looking up by reference: no allocation once the method is known.
fn add(days: &mut Days, caller: &str, day: u64, method: &str, tally: Tally) {
    if !days.contains_key(caller) {
        days.insert(caller.to_owned(), HashMap::new());
    }
    let Some(by_day) = days.get_mut(caller) else { return };
    let methods = by_day.entry(day).or_default();
    if let Some(t) = methods.get_mut(method) {
        return t.add(tally);
    }
    let name = if methods.len() < MAX_METHODS { method } else { "other" };
    methods.entry(name.to_owned()).or_default().add(tally);
}

impl Usage {
    /// Tallies in memory, and in Redis at `redis_url` when given, for callers of `tiers`.
    pub fn new<'a>(redis_url: Option<&str>, tiers: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let redis = match redis_url {
            Some(url) => Some(sluice_redis::Redis::open(url).map_err(|e| format!("access.redis_url: {e}"))?),
            None => None,
        };
        let counters = tiers
            .into_iter()
            .map(|tier| {
                let calls = metrics::counter!("sluice_access_calls_total", "tier" => tier.to_owned());
                let units = metrics::counter!("sluice_access_units_total", "tier" => tier.to_owned());
                (tier.to_owned(), (calls, units))
            })
            .collect();
        Ok(Self { days: Mutex::default(), pending: Mutex::default(), redis, counters })
    }

    /// Counts one request of `calls` (method and cost each) by `caller` of `tier` on `day`.
    pub fn record(&self, caller: &str, tier: &str, day: u64, calls: &[(&str, u32)]) {
        let units: u64 = calls.iter().map(|(_, c)| u64::from(*c)).sum();
        match self.counters.get(tier) {
            Some((c, u)) => {
                c.increment(calls.len() as u64);
                u.increment(units);
            }
            // A tier added by a reload: registered on use.
            None => {
                metrics::counter!("sluice_access_calls_total", "tier" => tier.to_owned()).increment(calls.len() as u64);
                metrics::counter!("sluice_access_units_total", "tier" => tier.to_owned()).increment(units);
            }
        }
        let mut days = self.days.lock().unwrap_or_else(|e| e.into_inner());
        if days.get(caller).is_none_or(|d| !d.contains_key(&day)) {
            // A new day for this caller: drop what is older than KEEP_DAYS, everyone's.
            days.retain(|_, by_day| {
                by_day.retain(|d, _| d + KEEP_DAYS > day);
                !by_day.is_empty()
            });
        }
        let new_caller = !days.contains_key(caller);
        for (method, cost) in calls {
            add(&mut days, caller, day, method, Tally { calls: 1, units: u64::from(*cost) });
        }
        if new_caller {
            // Callers of the last KEEP_DAYS days, each with at most MAX_METHODS methods a day.
            metrics::gauge!("sluice_access_usage_callers").set(days.len() as f64);
        }
        drop(days);
        if self.redis.is_some() {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            for (method, cost) in calls {
                add(&mut pending, caller, day, method, Tally { calls: 1, units: u64::from(*cost) });
            }
        }
    }

    /// `caller`'s usage on each of `days` (oldest first), from Redis when shared.
    pub async fn read(&self, caller: &str, days: std::ops::RangeInclusive<u64>) -> Result<Vec<DayUsage>, String> {
        let mut out = Vec::new();
        for day in days {
            let methods = match &self.redis {
                Some(_) => self.read_redis(caller, day).await?,
                None => {
                    let all = self.days.lock().unwrap_or_else(|e| e.into_inner());
                    all.get(caller).and_then(|d| d.get(&day)).cloned().unwrap_or_default()
                }
            };
            let mut usage = DayUsage { day, ..DayUsage::default() };
            for (method, tally) in methods {
                usage.total.add(tally);
                usage.methods.insert(method, tally);
            }
            out.push(usage);
        }
        Ok(out)
    }

    async fn connection(&self) -> Result<sluice_redis::Connection, String> {
        let Some(redis) = &self.redis else { return Err("no Redis".into()) };
        tokio::time::timeout(Duration::from_secs(2), redis.connection())
            .await
            .map_err(|_| "redis: connection timed out".to_owned())?
            .map_err(|e| format!("redis: {e}"))
    }

    async fn read_redis(&self, caller: &str, day: u64) -> Result<HashMap<String, Tally>, String> {
        let mut c = self.connection().await?;
        let fields: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(redis_key(caller, day))
            .query_async(&mut c)
            .await
            .map_err(|e| format!("redis: {e}"))?;
        let mut methods: HashMap<String, Tally> = HashMap::new();
        for (field, n) in fields {
            let Some((method, what)) = field.rsplit_once('|') else { continue };
            let tally = methods.entry(method.to_owned()).or_default();
            match what {
                "calls" => tally.calls += n,
                "units" => tally.units += n,
                _ => {}
            }
        }
        Ok(methods)
    }

    /// Adds what was counted since the last flush to Redis. On failure the counts are kept for
    /// the next flush.
    pub async fn flush(&self) -> Result<(), String> {
        if self.redis.is_none() {
            return Ok(());
        }
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.is_empty() {
            return Ok(());
        }
        // One pipeline; in a Redis Cluster one per caller and day (a pipeline there stays in
        // one slot), sent together. Counts of a pipeline that failed go back for the next flush.
        let per_key = self.redis.as_ref().is_some_and(sluice_redis::Redis::is_cluster);
        let groups: Vec<Group<'_>> = pending
            .iter()
            .flat_map(|(caller, by_day)| by_day.iter().map(move |(day, methods)| (caller.as_str(), *day, methods)))
            .collect();
        let chunks: Vec<&[Group<'_>]> = if per_key { groups.chunks(1).collect() } else { vec![&groups[..]] };
        let pipes: Vec<redis::Pipeline> = chunks.iter().map(|chunk| tally_pipe(chunk)).collect();
        let outcomes: Vec<Result<(), String>> = match self.connection().await {
            Ok(c) => {
                let sent = pipes.iter().map(|pipe| {
                    let mut c = c.clone();
                    async move {
                        match tokio::time::timeout(Duration::from_secs(2), pipe.query_async::<()>(&mut c)).await {
                            Ok(done) => done.map_err(|e| format!("redis: {e}")),
                            Err(_) => Err("redis: timed out".to_owned()),
                        }
                    }
                });
                futures_util::future::join_all(sent).await
            }
            Err(e) => vec![Err(e); chunks.len()],
        };
        let mut result = Ok(());
        let mut back = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (chunk, outcome) in chunks.iter().zip(outcomes) {
            if let Err(e) = outcome {
                for (caller, day, methods) in chunk.iter() {
                    for (method, tally) in methods.iter() {
                        add(&mut back, caller, *day, method, *tally);
                    }
                }
                result = Err(e);
            }
        }
        result
    }

    /// Flushes once a second while `self` lives.
    pub fn spawn_flush(self: &std::sync::Arc<Self>) {
        if self.redis.is_none() {
            return;
        }
        let usage = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                let Some(usage) = usage.upgrade() else { return };
                if let Err(e) = usage.flush().await {
                    metrics::counter!("sluice_access_store_errors_total").increment(1);
                    tracing::debug!(error = %e, "usage not flushed to Redis; kept for the next flush");
                }
            }
        });
    }
}

/// One caller's tallies of one day: caller, day, per method.
type Group<'a> = (&'a str, u64, &'a HashMap<String, Tally>);

/// The writes of some callers' days, as one pipeline.
fn tally_pipe(groups: &[Group<'_>]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for (caller, day, methods) in groups {
        let key = redis_key(caller, *day);
        for (method, tally) in methods.iter() {
            pipe.hincr(&key, format!("{method}|calls"), tally.calls).ignore();
            pipe.hincr(&key, format!("{method}|units"), tally.units).ignore();
        }
        pipe.expire(&key, REDIS_TTL_SECS).ignore();
    }
    pipe
}

fn redis_key(caller: &str, day: u64) -> String {
    format!("sluice:usage:{caller}:{day}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tallies_by_day_and_method_with_a_bound_on_method_names() {
        let usage = Usage::new(None, ["free"]).unwrap();
        usage.record("k", "free", 10, &[("eth_call", 2), ("eth_call", 2), ("eth_chainId", 1)]);
        usage.record("k", "free", 11, &[("eth_call", 2)]);
        for i in 0..100 {
            usage.record("k", "free", 11, &[(format!("m{i}").as_str(), 1)]);
        }
        let read = usage.read("k", 10..=11).await.unwrap();
        assert_eq!(read[0].total, Tally { calls: 3, units: 5 });
        assert_eq!(read[0].methods["eth_call"], Tally { calls: 2, units: 4 });
        assert_eq!(read[1].total.calls, 101);
        assert_eq!(read[1].methods.len(), MAX_METHODS + 1, "the rest under other");
        assert!(read[1].methods["other"].calls > 0);
        assert_eq!(usage.read("nobody", 10..=10).await.unwrap()[0].total, Tally::default());
        // Days older than KEEP_DAYS go.
        usage.record("k", "free", 10 + KEEP_DAYS, &[("eth_call", 1)]);
        assert_eq!(usage.read("k", 10..=10).await.unwrap()[0].total.calls, 0);
    }
}
