//! Quality of service, as pure arithmetic: how fast each client may send (its weight's share of
//! the capacity) and how much stream credit each connection gets (that rate times its RTT).
//!
//! Agave scales stream credit with RTT so that far-away clients are not throttled by credit that
//! returns only once per round trip; the open question there was RTT spoofing. Here the *rate*
//! is set by weight alone, through one reservation bucket per client across all its connections;
//! credit only buffers that rate over a round trip. A client that inflates its RTT gets more
//! streams in flight, but its streams still wait for the same reservations, so it gains nothing.
//!
//! Time is passed in as nanoseconds from any fixed origin, so every decision is testable without
//! clocks or sockets.

use std::collections::HashMap;
use std::time::Duration;

use crate::identity::Identity;

/// Settings that shape rates and credit.
#[derive(Debug, Clone, PartialEq)]
pub struct QosConfig {
    /// Transactions per second the ingress admits in total when clients compete for it.
    pub capacity: f64,
    /// The share of `capacity` that clients without a configured weight share between them.
    pub unknown_share: f64,
    /// Nobody waits while the measured total load is below this fraction of `capacity`.
    pub throttle_above: f64,
    /// How far ahead of its schedule a client may be before its streams wait (a burst allowance).
    pub burst: Duration,
    /// Stream credit is never below this.
    pub min_streams: u32,
    /// Stream credit is never above this (it bounds the stream state one connection can pin).
    pub max_streams: u32,
    /// RTTs above this are treated as this when computing credit.
    pub max_rtt: Duration,
    /// Scale credit with the measured RTT; when off, credit is computed for `reference_rtt`
    /// whatever the real RTT is (a fixed credit, as before Agave's change).
    pub rtt_scaling: bool,
    /// The RTT that fixed credit is computed for.
    pub reference_rtt: Duration,
    /// The transaction size the connection receive window is sized for.
    pub typical_tx_bytes: u32,
    /// The largest transaction a stream may carry.
    pub max_tx_bytes: u32,
}

impl Default for QosConfig {
    fn default() -> Self {
        QosConfig {
            capacity: 20_000.0,
            unknown_share: 0.05,
            throttle_above: 0.5,
            burst: Duration::from_millis(20),
            min_streams: 32,
            max_streams: 8_192,
            max_rtt: Duration::from_millis(350),
            rtt_scaling: true,
            reference_rtt: Duration::from_millis(50),
            typical_tx_bytes: 512,
            max_tx_bytes: 128 * 1024,
        }
    }
}

/// Who a stream is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// A client whose identity has a configured weight.
    Known(Identity),
    /// Any client without one: they share one bucket.
    Unknown,
}

impl Class {
    /// A short label for metrics and logs (the identity's first 16 hex digits, or `unknown`).
    pub fn label(&self) -> String {
        match self {
            Class::Known(id) => id.short(),
            Class::Unknown => "unknown".to_string(),
        }
    }
}

/// When a stream may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// At once.
    Now,
    /// At this time (nanoseconds), its reserved slot.
    At(u64),
}

/// How much a connection may have in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    /// Concurrent unidirectional streams.
    pub streams: u32,
    /// Connection receive window, bytes.
    pub window: u64,
}

/// A client counts as active (and takes part in the sharing) this long after its last stream.
const ACTIVE_FOR: u64 = 1_000_000_000;
/// Buckets idle this long are forgotten, which bounds memory.
const FORGET_AFTER: u64 = 10_000_000_000;
/// The active set is recomputed at most this often.
const REFRESH_EVERY: u64 = 50_000_000;
/// The load meter's window and resolution.
const LOAD_SLOTS: usize = 10;
const LOAD_SLOT_NS: u64 = 100_000_000;

#[derive(Debug, Clone)]
struct Bucket {
    /// Theoretical arrival time of the next stream (GCRA), nanoseconds.
    next: u64,
    last_seen: u64,
    weight: f64,
}

/// Streams admitted over the last second, in 100 ms slots.
#[derive(Debug, Clone, Default)]
struct LoadMeter {
    slots: [(u64, u64); LOAD_SLOTS],
}

impl LoadMeter {
    fn record(&mut self, now: u64) {
        let epoch = now / LOAD_SLOT_NS;
        let slot = &mut self.slots[(epoch % LOAD_SLOTS as u64) as usize];
        if slot.0 != epoch {
            *slot = (epoch, 0);
        }
        slot.1 += 1;
    }

    /// Streams per second over the last full window.
    fn rate(&self, now: u64) -> f64 {
        let epoch = now / LOAD_SLOT_NS;
        let count: u64 =
            self.slots.iter().filter(|(e, _)| *e + (LOAD_SLOTS as u64) > epoch && *e <= epoch).map(|(_, c)| c).sum();
        count as f64 * 1e9 / (LOAD_SLOTS as u64 * LOAD_SLOT_NS) as f64
    }
}

/// The rate and credit state of one ingress: weights, one bucket per client, the load meter.
#[derive(Debug, Clone)]
pub struct Qos {
    config: QosConfig,
    weights: HashMap<Identity, f64>,
    buckets: HashMap<Class, Bucket>,
    load: LoadMeter,
    active_known_weight: f64,
    unknown_active: bool,
    refreshed: u64,
}

impl Qos {
    /// A QoS state with these weights (identities not listed are `Unknown`).
    pub fn new(config: QosConfig, weights: HashMap<Identity, f64>) -> Self {
        Qos {
            config,
            weights: weights.into_iter().filter(|(_, w)| *w > 0.0 && w.is_finite()).collect(),
            buckets: HashMap::new(),
            load: LoadMeter::default(),
            active_known_weight: 0.0,
            unknown_active: false,
            refreshed: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &QosConfig {
        &self.config
    }

    /// The class a client identity is charged to.
    pub fn classify(&self, identity: Option<Identity>) -> Class {
        match identity {
            Some(id) if self.weights.contains_key(&id) => Class::Known(id),
            _ => Class::Unknown,
        }
    }

    /// The class's rate, transactions per second: the unknown class gets `unknown_share` of the
    /// capacity; a known client gets its weight's share of what is left, among the clients
    /// active now (so an idle client's share goes to the others).
    pub fn rate(&self, class: Class) -> f64 {
        let c = &self.config;
        match class {
            Class::Unknown => c.capacity * c.unknown_share,
            Class::Known(id) => {
                let weight = self.weights.get(&id).copied().unwrap_or(0.0);
                let active = self.buckets.get(&class).is_some_and(|b| b.last_seen + ACTIVE_FOR > self.refreshed);
                // A client not yet counted as active would share with itself included.
                let total = if active { self.active_known_weight } else { self.active_known_weight + weight };
                let left = if self.unknown_active { 1.0 - c.unknown_share } else { 1.0 };
                if total <= 0.0 {
                    return 0.0;
                }
                c.capacity * left * weight / total
            }
        }
    }

    /// Measured admissions per second over the last second.
    pub fn load(&self, now: u64) -> f64 {
        self.load.rate(now)
    }

    /// Reserves a slot for one stream of `class` arriving at `now`.
    pub fn admit(&mut self, now: u64, class: Class) -> Admission {
        let weight = match class {
            Class::Known(id) => self.weights.get(&id).copied().unwrap_or(0.0),
            Class::Unknown => 0.0,
        };
        let newly_active = match self.buckets.get_mut(&class) {
            Some(b) => {
                let was = b.last_seen + ACTIVE_FOR > self.refreshed;
                b.last_seen = now;
                !was
            }
            None => {
                self.buckets.insert(class, Bucket { next: now, last_seen: now, weight });
                true
            }
        };
        if newly_active {
            match class {
                Class::Known(_) => self.active_known_weight += weight,
                Class::Unknown => self.unknown_active = true,
            }
        }
        self.refresh(now);
        self.load.record(now);

        let rate = self.rate(class);
        let under_threshold = self.load.rate(now) < self.config.throttle_above * self.config.capacity;
        let Some(bucket) = self.buckets.get_mut(&class) else { return Admission::Now };
        if under_threshold {
            // Not charged: a quiet ingress throttles nobody.
            bucket.next = bucket.next.max(now);
            return Admission::Now;
        }
        if rate <= 0.0 {
            // No share at all (zero capacity): wait one burst window and try again then.
            return Admission::At(now + self.config.burst.as_nanos() as u64);
        }
        let interval = (1e9 / rate) as u64;
        let tolerance = self.config.burst.as_nanos() as u64;
        let at = now.max(bucket.next.saturating_sub(tolerance));
        bucket.next = bucket.next.max(now) + interval;
        if at <= now {
            Admission::Now
        } else {
            Admission::At(at)
        }
    }

    /// The credit for a connection of `class` whose smoothed RTT is `rtt`.
    pub fn credit(&self, class: Class, rtt: Duration) -> Credit {
        credit_for(&self.config, self.rate(class), rtt)
    }

    /// Recomputes which clients are active, at most every `REFRESH_EVERY`, and forgets idle ones.
    fn refresh(&mut self, now: u64) {
        if now < self.refreshed + REFRESH_EVERY && self.refreshed != 0 {
            return;
        }
        self.refreshed = now;
        self.buckets.retain(|_, b| b.last_seen + FORGET_AFTER > now);
        let mut known = 0.0;
        let mut unknown = false;
        for (class, b) in &self.buckets {
            if b.last_seen + ACTIVE_FOR > now {
                match class {
                    Class::Known(_) => known += b.weight,
                    Class::Unknown => unknown = true,
                }
            }
        }
        self.active_known_weight = known;
        self.unknown_active = unknown;
    }
}

/// Credit beyond rate × RTT: QUIC hands credit back in MAX_STREAMS frames that ride on later
/// packets, and timers are coarse, so exactly rate × RTT would idle the pipe now and then.
pub const CREDIT_HEADROOM: f64 = 1.25;

/// Credit = max(floor, rate × RTT × [`CREDIT_HEADROOM`]) streams, capped; the window holds that
/// many typical transactions and at least one of the largest.
pub fn credit_for(config: &QosConfig, rate: f64, rtt: Duration) -> Credit {
    let rtt = if config.rtt_scaling { rtt.min(config.max_rtt) } else { config.reference_rtt };
    let wanted = (rate.max(0.0) * rtt.as_secs_f64() * CREDIT_HEADROOM).ceil();
    let streams = if wanted.is_finite() { wanted.min(config.max_streams as f64) as u32 } else { config.max_streams };
    let streams = streams.clamp(config.min_streams.min(config.max_streams), config.max_streams);
    let window = (streams as u64 * config.typical_tx_bytes as u64).max(config.max_tx_bytes as u64);
    Credit { streams, window }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn id(n: u8) -> Identity {
        Identity::from_bytes([n; 32])
    }

    fn config() -> QosConfig {
        QosConfig { capacity: 1_000.0, unknown_share: 0.1, throttle_above: 0.5, ..QosConfig::default() }
    }

    fn qos(weights: &[(u8, f64)]) -> Qos {
        Qos::new(config(), weights.iter().map(|(n, w)| (id(*n), *w)).collect())
    }

    /// Offers each class streams as fast as they are admitted, interleaved, and counts how many
    /// each got over `secs` seconds of steady state (a pure simulation of saturated clients).
    /// The first second is a warm-up: the ingress starts quiet, and a quiet ingress lets a
    /// burst through unthrottled.
    fn saturate(q: &mut Qos, classes: &[Class], secs: u64) -> Vec<u64> {
        let mut next = vec![S; classes.len()];
        let mut counts = vec![0; classes.len()];
        let start = 2 * S;
        let end = start + secs * S;
        loop {
            let (i, &t) = next.iter().enumerate().min_by_key(|(_, t)| **t).expect("classes");
            if t >= end {
                break;
            }
            let at = match q.admit(t, classes[i]) {
                Admission::Now => t,
                Admission::At(at) => at,
            };
            if (start..end).contains(&at) {
                counts[i] += 1;
            }
            // A saturated client offers its next stream as soon as this one is admitted.
            next[i] = at.max(t + 1);
        }
        counts
    }

    #[test]
    fn weights_share_the_capacity_when_saturated() {
        let mut q = qos(&[(1, 3.0), (2, 1.0)]);
        let got = saturate(&mut q, &[Class::Known(id(1)), Class::Known(id(2))], 5);
        let ratio = got[0] as f64 / got[1] as f64;
        assert!((2.8..3.2).contains(&ratio), "{got:?}");
        let total = (got[0] + got[1]) as f64 / 5.0;
        assert!((950.0..1_100.0).contains(&total), "total {total}/s");
    }

    #[test]
    fn an_idle_clients_share_goes_to_the_active_ones() {
        let mut q = qos(&[(1, 3.0), (2, 1.0)]);
        let got = saturate(&mut q, &[Class::Known(id(2))], 3);
        assert!(got[0] as f64 / 3.0 > 900.0, "{got:?}");
    }

    #[test]
    fn unknown_clients_get_their_class_share_only() {
        let mut q = qos(&[(1, 1.0)]);
        let got = saturate(&mut q, &[Class::Known(id(1)), Class::Unknown], 4);
        let unknown = got[1] as f64 / 4.0;
        assert!((80.0..120.0).contains(&unknown), "{got:?}");
        assert!(got[0] as f64 / 4.0 > 850.0, "{got:?}");
    }

    #[test]
    fn a_quiet_ingress_throttles_nobody() {
        let mut q = qos(&[(1, 1.0), (2, 1.0)]);
        // 300 streams/s in total, under half the capacity: always at once.
        for i in 0..900 {
            let t = S + i * (S / 300);
            assert_eq!(q.admit(t, Class::Known(id(1 + (i % 2) as u8))), Admission::Now, "stream {i}");
        }
    }

    #[test]
    fn credit_is_rate_times_rtt_within_bounds() {
        let c = config();
        assert_eq!(credit_for(&c, 10_000.0, Duration::from_millis(128)).streams, 1_600);
        assert_eq!(credit_for(&c, 10_000.0, Duration::from_millis(1)).streams, c.min_streams);
        // Capped at max_rtt.
        assert_eq!(credit_for(&c, 10_000.0, Duration::from_secs(2)).streams, 4_375);
        assert_eq!(credit_for(&c, 1e9, Duration::from_millis(300)).streams, c.max_streams);
        let fixed = QosConfig { rtt_scaling: false, ..c.clone() };
        assert_eq!(credit_for(&fixed, 10_000.0, Duration::from_millis(300)).streams, 625);
        assert!(credit_for(&c, 0.0, Duration::ZERO).window >= c.max_tx_bytes as u64);
    }

    #[test]
    fn inflating_the_rtt_buys_credit_but_not_rate() {
        let mut q = qos(&[(1, 1.0), (2, 1.0)]);
        let honest = q.credit(Class::Known(id(1)), Duration::from_millis(20));
        let spoofed = q.credit(Class::Known(id(2)), Duration::from_millis(340));
        assert!(spoofed.streams > honest.streams);
        // Both saturate; the spoofer's extra credit only lets more of its streams wait.
        let got = saturate(&mut q, &[Class::Known(id(1)), Class::Known(id(2))], 4);
        let ratio = got[1] as f64 / got[0] as f64;
        assert!((0.9..1.1).contains(&ratio), "{got:?}");
    }

    #[test]
    fn idle_buckets_are_forgotten() {
        let mut q = qos(&[]);
        for n in 0..100u8 {
            q.admit(S + n as u64 * MS, Class::Known(id(n)));
        }
        q.admit(S + 20 * S, Class::Unknown);
        assert_eq!(q.buckets.len(), 1);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Credit never leaves [min, max], and the window always fits the largest transaction.
            #[test]
            fn credit_is_bounded(rate in 0.0f64..1e9, rtt_ms in 0u64..10_000, scaling: bool) {
                let c = QosConfig { rtt_scaling: scaling, ..QosConfig::default() };
                let credit = credit_for(&c, rate, Duration::from_millis(rtt_ms));
                prop_assert!(credit.streams >= c.min_streams && credit.streams <= c.max_streams);
                prop_assert!(credit.window >= c.max_tx_bytes as u64);
            }

            /// More RTT never means less credit, up to the cap.
            #[test]
            fn credit_grows_with_rtt(rate in 0.0f64..1e6, a in 0u64..1_000, b in 0u64..1_000) {
                let c = QosConfig::default();
                let (lo, hi) = (a.min(b), a.max(b));
                prop_assert!(credit_for(&c, rate, Duration::from_millis(lo)).streams
                    <= credit_for(&c, rate, Duration::from_millis(hi)).streams);
            }

            /// Saturated clients with any weights get throughput in proportion to their weights.
            #[test]
            fn saturated_shares_follow_weights(w1 in 1u32..10, w2 in 1u32..10) {
                let mut q = qos(&[(1, w1 as f64), (2, w2 as f64)]);
                let got = saturate(&mut q, &[Class::Known(id(1)), Class::Known(id(2))], 3);
                let want = w1 as f64 / w2 as f64;
                let ratio = got[0] as f64 / got[1].max(1) as f64;
                prop_assert!((ratio / want - 1.0).abs() < 0.15, "{:?} for {}:{}", got, w1, w2);
            }

            /// Admissions never go back in time, and a client is never scheduled further ahead
            /// than its queue of reservations explains.
            #[test]
            fn admissions_are_monotonic(gaps in proptest::collection::vec(0u64..5_000_000, 1..300)) {
                let mut q = qos(&[(1, 1.0)]);
                let mut t = S;
                let mut last = 0;
                for (i, gap) in gaps.iter().enumerate() {
                    t += gap;
                    let at = match q.admit(t, Class::Known(id(1))) { Admission::Now => t, Admission::At(at) => at };
                    prop_assert!(at >= t);
                    prop_assert!(at + 1 >= last || at == t);
                    let bound = t + (i as u64 + 1) * (S / 1_000) * 2;
                    prop_assert!(at <= bound);
                    last = at;
                }
            }
        }
    }
}
