//! Counters per client class, readable at any time (for `/status`, tests and benchmarks) and
//! mirrored to Prometheus through the `metrics` facade.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::qos::Class;

/// Prometheus handles of one class, made once so the per-stream path neither formats labels
/// nor looks them up.
#[derive(Debug, Clone)]
pub struct ClassMetrics {
    /// `sluice_ingress_streams_total{outcome="accepted"}`.
    pub accepted: metrics::Counter,
    /// `…{outcome="rejected"}`.
    pub rejected: metrics::Counter,
    /// `…{outcome="throttled"}`.
    pub throttled: metrics::Counter,
    /// `…{outcome="oversized"|"truncated"|"empty"|"timed_out"}`.
    pub abuse: [metrics::Counter; 4],
    /// `sluice_ingress_bytes_total`.
    pub bytes: metrics::Counter,
    /// `sluice_ingress_credit_streams`.
    pub credit: metrics::Gauge,
    /// `sluice_ingress_rtt_seconds`.
    pub rtt: metrics::Gauge,
}

impl ClassMetrics {
    fn new(label: &str) -> Self {
        let streams = |outcome: &'static str| metrics::counter!("sluice_ingress_streams_total", "identity" => label.to_string(), "outcome" => outcome);
        ClassMetrics {
            accepted: streams("accepted"),
            rejected: streams("rejected"),
            throttled: streams("throttled"),
            abuse: [streams("oversized"), streams("truncated"), streams("empty"), streams("timed_out")],
            bytes: metrics::counter!("sluice_ingress_bytes_total", "identity" => label.to_string()),
            credit: metrics::gauge!("sluice_ingress_credit_streams", "identity" => label.to_string()),
            rtt: metrics::gauge!("sluice_ingress_rtt_seconds", "identity" => label.to_string()),
        }
    }
}

/// What happened to streams and connections of one class.
#[derive(Debug)]
pub struct ClassStats {
    /// Its Prometheus handles.
    pub metrics: ClassMetrics,
    /// Transactions the pool accepted.
    pub accepted: AtomicU64,
    /// Transactions the pool refused (invalid, refused by its rules, unavailable or busy).
    pub rejected: AtomicU64,
    /// Streams that waited for their slot (the client was over its rate).
    pub throttled: AtomicU64,
    /// Streams longer than `max_tx_bytes`, stopped with `TOO_LARGE`.
    pub oversized: AtomicU64,
    /// Streams the client reset before finishing them.
    pub truncated: AtomicU64,
    /// Streams finished with no bytes.
    pub empty: AtomicU64,
    /// Streams not finished within `stream_timeout`, stopped with `TIMED_OUT`.
    pub timed_out: AtomicU64,
    /// Transaction bytes received.
    pub bytes: AtomicU64,
    /// The stream credit last granted to one of its connections.
    pub credit: AtomicU64,
    /// The RTT last measured on one of its connections, microseconds.
    pub rtt_us: AtomicU64,
    /// Connections open now.
    pub connections: AtomicU64,
}

/// A copy of [`ClassStats`].
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ClassSnapshot {
    /// See [`ClassStats::accepted`].
    pub accepted: u64,
    /// See [`ClassStats::rejected`].
    pub rejected: u64,
    /// See [`ClassStats::throttled`].
    pub throttled: u64,
    /// See [`ClassStats::oversized`].
    pub oversized: u64,
    /// See [`ClassStats::truncated`].
    pub truncated: u64,
    /// See [`ClassStats::empty`].
    pub empty: u64,
    /// See [`ClassStats::timed_out`].
    pub timed_out: u64,
    /// See [`ClassStats::bytes`].
    pub bytes: u64,
    /// See [`ClassStats::credit`].
    pub credit: u64,
    /// See [`ClassStats::rtt_us`].
    pub rtt_us: u64,
    /// See [`ClassStats::connections`].
    pub connections: u64,
}

impl ClassStats {
    fn snapshot(&self) -> ClassSnapshot {
        ClassSnapshot {
            accepted: self.accepted.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            throttled: self.throttled.load(Relaxed),
            oversized: self.oversized.load(Relaxed),
            truncated: self.truncated.load(Relaxed),
            empty: self.empty.load(Relaxed),
            timed_out: self.timed_out.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            credit: self.credit.load(Relaxed),
            rtt_us: self.rtt_us.load(Relaxed),
            connections: self.connections.load(Relaxed),
        }
    }
}

/// Stream-to-pool latency in 25 µs buckets up to 100 ms (and one overflow bucket): fixed memory,
/// lock-free recording.
#[derive(Debug)]
pub struct Latency {
    buckets: Vec<AtomicU64>,
}

const BUCKET_US: u64 = 25;
const BUCKETS: usize = 4_000;

impl Default for Latency {
    fn default() -> Self {
        Latency { buckets: (0..=BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl Latency {
    /// Records one sample.
    pub fn record(&self, d: Duration) {
        let i = ((d.as_micros() as u64) / BUCKET_US).min(BUCKETS as u64) as usize;
        self.buckets[i].fetch_add(1, Relaxed);
    }

    /// The `q` quantile (0..=1), as the upper edge of its bucket; `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Duration::from_micros((i as u64 + 1) * BUCKET_US));
            }
        }
        None
    }

    /// Forgets every sample (between benchmark phases).
    pub fn reset(&self) {
        self.buckets.iter().for_each(|b| b.store(0, Relaxed));
    }
}

/// Every counter of one ingress.
#[derive(Debug, Default)]
pub struct Stats {
    classes: Mutex<BTreeMap<String, Arc<ClassStats>>>,
    /// Connections refused before or after the handshake, by reason.
    pub refused: Mutex<BTreeMap<&'static str, u64>>,
    /// Stream-to-pool latency of accepted transactions.
    pub latency: Latency,
}

/// A copy of [`Stats`], for `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatsSnapshot {
    /// Per class (identity prefix or `unknown`).
    pub classes: BTreeMap<String, ClassSnapshot>,
    /// Connections refused, by reason.
    pub refused: BTreeMap<&'static str, u64>,
    /// Stream-to-pool p50, microseconds.
    pub p50_us: Option<u64>,
    /// Stream-to-pool p99, microseconds.
    pub p99_us: Option<u64>,
}

impl Stats {
    /// The counters of `class` (made on first use; one entry per configured identity, plus one).
    pub fn class(&self, class: Class) -> Arc<ClassStats> {
        let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        let label = class.label();
        classes
            .entry(label.clone())
            .or_insert_with(|| {
                Arc::new(ClassStats {
                    metrics: ClassMetrics::new(&label),
                    accepted: AtomicU64::new(0),
                    rejected: AtomicU64::new(0),
                    throttled: AtomicU64::new(0),
                    oversized: AtomicU64::new(0),
                    truncated: AtomicU64::new(0),
                    empty: AtomicU64::new(0),
                    timed_out: AtomicU64::new(0),
                    bytes: AtomicU64::new(0),
                    credit: AtomicU64::new(0),
                    rtt_us: AtomicU64::new(0),
                    connections: AtomicU64::new(0),
                })
            })
            .clone()
    }

    /// Counts a refused connection.
    pub fn refuse(&self, reason: &'static str) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
        metrics::counter!("sluice_ingress_connections_refused_total", "reason" => reason).increment(1);
    }

    /// A copy of everything.
    pub fn snapshot(&self) -> StatsSnapshot {
        let classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        StatsSnapshot {
            classes: classes.iter().map(|(k, v)| (k.clone(), v.snapshot())).collect(),
            refused: self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            p50_us: self.latency.quantile(0.5).map(|d| d.as_micros() as u64),
            p99_us: self.latency.quantile(0.99).map(|d| d.as_micros() as u64),
        }
    }
}

impl StatsSnapshot {
    /// The counters of one class, or zeros.
    pub fn class(&self, class: Class) -> ClassSnapshot {
        self.classes.get(&class.label()).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_buckets() {
        let l = Latency::default();
        assert_eq!(l.quantile(0.5), None);
        for us in 1..=100 {
            l.record(Duration::from_micros(us * 10));
        }
        assert_eq!(l.quantile(0.5), Some(Duration::from_micros(525)));
        assert_eq!(l.quantile(0.99), Some(Duration::from_micros(1_000)));
        l.record(Duration::from_secs(5));
        assert_eq!(l.quantile(1.0), Some(Duration::from_micros(100_025)));
    }
}
