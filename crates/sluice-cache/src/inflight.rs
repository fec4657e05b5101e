//! Coalescing of every identical in-flight read, cacheable or not: a layer between the cache
//! and the upstream pool.
//!
//! The cache coalesces its own misses (Redis, then upstream, then store) under its cache key.
//! Calls it passes through (a block the head tracker has not seen yet, `latest` reads it
//! cannot pin, uncacheable reads such as traces and gas estimates) reach this layer, which
//! joins a call to an identical one in flight: same network, method and params text.
//! Which methods join is the method table's `join`: reads, and submissions, whose identical
//! params are the same transaction (the same hash); never methods with other effects.
//!
//! The first caller (the leader) makes the call itself, so the fast path spawns nothing. If the
//! leader goes away before its answer, its followers make the call on their own instead of
//! failing. A batch's new calls go down together as one batch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sluice_upstream::{Answer, Call, Source, UpstreamError, Upstreams};
use tokio::sync::watch;
use tracing::Instrument;

type Shared = Result<Answer, UpstreamError>;
type Flights = Arc<Mutex<HashMap<String, watch::Receiver<Option<Shared>>>>>;

/// The key: network, method and params exactly as they will be sent.
fn key(call: &Call) -> String {
    let params = call.req.params_text();
    let mut key = String::with_capacity(call.ctx.network.len() + call.req.method.len() + params.len() + 2);
    key.push_str(&call.ctx.network);
    key.push('\0');
    key.push_str(&call.req.method);
    key.push('\0');
    key.push_str(params);
    key
}

/// A leader's place: publishing the answer, or leaving, frees the key.
struct Lead {
    flights: Flights,
    key: String,
    tx: watch::Sender<Option<Shared>>,
    gauge: metrics::Gauge,
}

impl Lead {
    fn publish(self, answer: &Shared) {
        let _ = self.tx.send(Some(answer.clone()));
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if let Ok(mut map) = self.flights.lock() {
            map.remove(&self.key);
        }
        self.gauge.decrement(1.0);
    }
}

enum Claim {
    Lead(Lead),
    Follow(watch::Receiver<Option<Shared>>),
}

/// Joins identical in-flight reads before they reach `inner`.
pub struct CoalesceLayer {
    inner: Arc<dyn Upstreams>,
    flights: Flights,
    /// `sluice_coalesce_in_flight`: distinct reads in flight, each led by one call (so at most
    /// the calls in flight, `limits.max_in_flight` per listener and the internal ones).
    gauge: metrics::Gauge,
}

impl CoalesceLayer {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Upstreams>) -> Self {
        Self { inner, flights: Arc::default(), gauge: metrics::gauge!("sluice_coalesce_in_flight") }
    }

    fn claim(&self, key: String) -> Claim {
        let mut map = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = map.get(&key) {
            return Claim::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        map.insert(key.clone(), rx);
        self.gauge.increment(1.0);
        Claim::Lead(Lead { flights: self.flights.clone(), key, tx, gauge: self.gauge.clone() })
    }

    /// A follower's answer: the leader's, or its own call if the leader went away.
    async fn follow(&self, mut rx: watch::Receiver<Option<Shared>>, call: &Call) -> Shared {
        let shared = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone(),
            Err(_) => None,
        };
        match shared {
            Some(answer) => {
                metrics::counter!("sluice_coalesced_total").increment(1);
                answer.map(|a| Answer { source: Source::Coalesced, ..a })
            }
            None => self.inner.call(call).await,
        }
    }

    /// Keys in flight now.
    pub fn in_flight(&self) -> usize {
        self.flights.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[async_trait]
impl Upstreams for CoalesceLayer {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        if !call.info.join {
            return self.inner.call(call).await;
        }
        match self.claim(key(call)) {
            Claim::Lead(lead) => {
                let span = tracing::debug_span!("coalesce", role = "lead");
                let answer = self.inner.call(call).instrument(span).await;
                lead.publish(&answer);
                answer
            }
            Claim::Follow(rx) => {
                self.follow(rx, call).instrument(tracing::debug_span!("coalesce", role = "follow")).await
            }
        }
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let mut leads: Vec<(usize, Option<Lead>)> = Vec::new();
        let mut follows: Vec<(usize, watch::Receiver<Option<Shared>>)> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut same: Vec<(usize, usize)> = Vec::new(); // a duplicate inside this batch → its first
        for (i, call) in calls.iter().enumerate() {
            if !call.info.join {
                leads.push((i, None));
                continue;
            }
            let key = key(call);
            if let Some(&first) = seen.get(&key) {
                same.push((i, first));
                continue;
            }
            seen.insert(key.clone(), i);
            match self.claim(key) {
                Claim::Lead(lead) => leads.push((i, Some(lead))),
                Claim::Follow(rx) => follows.push((i, rx)),
            }
        }
        let down: Vec<&Call> = leads.iter().map(|(i, _)| calls[*i]).collect();
        let led = async {
            match down.len() {
                0 => Vec::new(),
                1 => vec![self.inner.call(down[0]).await],
                _ => self.inner.call_batch(&down).await,
            }
        };
        let followed = futures_util::future::join_all(
            follows.into_iter().map(|(i, rx)| async move { (i, self.follow(rx, calls[i]).await) }),
        );
        let (led, followed) = tokio::join!(led, followed);
        let mut out: Vec<Option<Shared>> = (0..calls.len()).map(|_| None).collect();
        for ((i, lead), answer) in leads.into_iter().zip(led) {
            if let Some(lead) = lead {
                lead.publish(&answer);
            }
            out[i] = Some(answer);
        }
        for (i, answer) in followed {
            out[i] = Some(answer);
        }
        for (i, first) in same {
            out[i] = out[first].clone();
        }
        out.into_iter().map(|a| a.unwrap_or(Err(UpstreamError::NoneAvailable))).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use sluice_jsonrpc::{Outcome, RawValue};

    use super::*;

    /// Counts calls and answers each after a pause (no I/O).
    #[derive(Default)]
    struct Slow {
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Upstreams for Slow {
        async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(30)).await;
            let text = format!("\"{}\"", call.req.params_text().len());
            Ok(Answer::upstream(Outcome::result(RawValue::from_string(text).unwrap())))
        }
    }

    fn balance(block: &str) -> Call {
        Call::internal("eth_getBalance", Some(&format!(r#"["0x01","{block}"]"#)))
    }

    #[tokio::test]
    async fn identical_reads_share_one_call_and_others_do_not() {
        let inner = Arc::new(Slow::default());
        let layer = Arc::new(CoalesceLayer::new(inner.clone()));
        let calls: Vec<Call> = (0..100).map(|i| balance(if i % 2 == 0 { "0x10" } else { "0x11" })).collect();
        let answers = futures_util::future::join_all(calls.iter().map(|c| layer.call(c))).await;
        assert!(answers.iter().all(Result::is_ok));
        assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
        assert_eq!(layer.in_flight(), 0);
        let filters: Vec<Call> = (0..5).map(|_| Call::internal("eth_getFilterChanges", Some(r#"["0x1"]"#))).collect();
        futures_util::future::join_all(filters.iter().map(|c| layer.call(c))).await;
        assert_eq!(inner.calls.load(Ordering::SeqCst), 7, "calls with effects are never joined");
    }

    #[tokio::test]
    async fn a_leader_that_leaves_does_not_fail_its_followers() {
        let inner = Arc::new(Slow::default());
        let layer = Arc::new(CoalesceLayer::new(inner.clone()));
        let leader = {
            let layer = layer.clone();
            tokio::spawn(async move { layer.call(&balance("0x1")).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let follower = {
            let layer = layer.clone();
            tokio::spawn(async move { layer.call(&balance("0x1")).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        leader.abort();
        assert!(follower.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_batch_joins_calls_in_flight_and_its_own_duplicates() {
        let inner = Arc::new(Slow::default());
        let layer = Arc::new(CoalesceLayer::new(inner.clone()));
        let single = {
            let layer = layer.clone();
            tokio::spawn(async move { layer.call(&balance("0x1")).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let batch = [balance("0x1"), balance("0x2"), balance("0x2")];
        let refs: Vec<&Call> = batch.iter().collect();
        let answers = layer.call_batch(&refs).await;
        assert!(answers.iter().all(Result::is_ok) && single.await.unwrap().is_ok());
        assert_eq!(inner.calls.load(Ordering::SeqCst), 2, "0x1 joined, 0x2 once");
        assert_eq!(answers[0].as_ref().unwrap().source, Source::Coalesced);
    }
}
