//! `eth_getLogs` over ranges nodes refuse: a layer that splits a long block range into chunks
//! no longer than the configured limit, fetches them (in parallel, bounded) through the
//! inner layer, where finalized chunks are cached, and merges the logs in order. A chunk the
//! node still refuses as too large is bisected, down to single blocks.
//!
//! The decisions ([`chunks`], [`bisect`], [`is_too_large`]) are pure; the layer is the shell.

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::stream::{self, StreamExt};
use serde_json::value::RawValue;
use serde_json::Value;
use sluice_chain::{BlockTag, ChainView, Resolved};
use sluice_jsonrpc::{codes, ErrorObject, Outcome};
use tokio::sync::watch;

use crate::{Answer, Call, CallFuture, Source, UpstreamError, Upstreams};

/// Splitting settings.
#[derive(Debug, Clone)]
pub struct LogsConfig {
    /// Most blocks per upstream `eth_getLogs` call.
    pub max_block_range: u64,
    /// Chunks fetched at once for one call.
    pub concurrency: usize,
    /// Most chunks one call may split into (a bound on the work one request can cause).
    pub max_chunks: usize,
}

impl Default for LogsConfig {
    fn default() -> Self {
        Self { max_block_range: 2_000, concurrency: 4, max_chunks: 1_000 }
    }
}

/// `from..=to` cut into consecutive ranges of at most `max` blocks.
pub fn chunks(from: u64, to: u64, max: u64) -> Vec<(u64, u64)> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut start = from;
    while start <= to {
        let end = to.min(start.saturating_add(max - 1));
        out.push((start, end));
        if end == u64::MAX {
            break;
        }
        start = end + 1;
    }
    out
}

/// The two halves of a range, or `None` for a single block.
pub fn bisect((from, to): (u64, u64)) -> Option<[(u64, u64); 2]> {
    (from < to).then(|| {
        let mid = from + (to - from) / 2;
        [(from, mid), (mid + 1, to)]
    })
}

/// Whether a node's error says the answer would be too large (the wordings of geth, erigon,
/// nethermind and the common hosted providers).
pub fn is_too_large(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    // Besides the pool's wordings for an answer too large: a generic limit, and a query that
    // ran out of time (also cured by a shorter range).
    crate::pool::TOO_LARGE.iter().chain(&["limit exceeded", "query timeout exceeded"]).any(|needle| m.contains(needle))
}

/// Splits long `eth_getLogs` ranges for the inner layer.
pub struct LogsLayer {
    inner: Arc<dyn Upstreams>,
    view: watch::Receiver<Arc<ChainView>>,
    config: LogsConfig,
}

impl LogsLayer {
    /// Wraps `inner`; `view` resolves block tags.
    pub fn new(inner: Arc<dyn Upstreams>, view: watch::Receiver<Arc<ChainView>>, config: LogsConfig) -> Self {
        Self { inner, view, config }
    }

    /// The chunked call when `req` is a range query longer than the limit.
    async fn split(&self, call: &Call) -> Option<Result<Answer, UpstreamError>> {
        let req = &call.req;
        if req.method != "eth_getLogs" {
            return None;
        }
        let params: Vec<Value> = serde_json::from_str(req.params.as_deref()?.get()).ok()?;
        let filter = params.first()?.as_object()?;
        if filter.contains_key("blockHash") {
            return None;
        }
        let (from, to) = {
            // The view the call was admitted with; none when it is behind (then not split).
            let view = call.ctx.view.resolve(&self.view)?;
            (resolve(&view, filter.get("fromBlock"))?, resolve(&view, filter.get("toBlock"))?)
        };
        if from > to || to - from < self.config.max_block_range {
            return None;
        }
        let ranges = chunks(from, to, self.config.max_block_range);
        if ranges.len() > self.config.max_chunks {
            let e = ErrorObject::new(
                codes::LIMIT_EXCEEDED,
                format!(
                    "block range too large: {} blocks, at most {} here",
                    to - from + 1,
                    self.config.max_chunks as u64 * self.config.max_block_range
                ),
            );
            return Some(Ok(Answer { outcome: Outcome::error(&e), source: Source::Local }));
        }
        metrics::counter!("sluice_logs_split_total").increment(1);
        let filter = filter.clone();
        let parts: Vec<Result<Vec<Box<RawValue>>, Outcome>> = stream::iter(ranges)
            .map(|range| self.fetch(call, &filter, range))
            .buffered(self.config.concurrency.max(1))
            .collect()
            .await;
        let mut logs = Vec::new();
        for part in parts {
            match part {
                Ok(chunk) => logs.extend(chunk),
                Err(error) => return Some(Ok(Answer { outcome: error, source: Source::Upstream })),
            }
        }
        let merged = serde_json::value::to_raw_value(&logs).ok()?;
        Some(Ok(Answer { outcome: Outcome::result(merged), source: Source::Upstream }))
    }

    /// One range, bisected while the node says it is too large.
    async fn fetch(
        &self,
        call: &Call,
        filter: &serde_json::Map<String, Value>,
        range: (u64, u64),
    ) -> Result<Vec<Box<RawValue>>, Outcome> {
        let mut pending = vec![range];
        let mut out = Vec::new();
        while let Some(range) = pending.pop() {
            let mut f = filter.clone();
            f.insert("fromBlock".into(), Value::String(format!("{:#x}", range.0)));
            f.insert("toBlock".into(), Value::String(format!("{:#x}", range.1)));
            let Ok(params) = serde_json::value::to_raw_value(&[Value::Object(f)]) else {
                return Err(Outcome::error(&ErrorObject::new(codes::INTERNAL_ERROR, "eth_getLogs: filter")));
            };
            let chunk = call.with_params(params, sluice_chain::BlockNeed::Range { from: range.0, to: range.1 });
            let answer = self.inner.call(&chunk).await;
            match answer {
                Ok(Answer { outcome: Outcome::Result(raw), .. }) => {
                    let logs: Vec<Box<RawValue>> = serde_json::from_str(raw.get()).map_err(|_| {
                        Outcome::error(&ErrorObject::new(codes::INTERNAL_ERROR, "eth_getLogs: not an array of logs"))
                    })?;
                    out.extend(logs);
                }
                Ok(Answer { outcome: Outcome::Error(raw), .. }) if too_large(&raw) => match bisect(range) {
                    Some([low, high]) => {
                        metrics::counter!("sluice_logs_bisected_total").increment(1);
                        // Low half first: popped last-in first-out, so push it last.
                        pending.push(high);
                        pending.push(low);
                    }
                    None => return Err(Outcome::Error(raw)),
                },
                Ok(Answer { outcome, .. }) => return Err(outcome),
                Err(e) => return Err(Outcome::error(&e.to_error_object())),
            }
        }
        Ok(out)
    }
}

fn too_large(raw: &RawValue) -> bool {
    let message = serde_json::from_str::<Value>(raw.get())
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default();
    is_too_large(&message)
}

/// A filter bound as a height: absent means latest; `pending` or unknown heights are not split.
fn resolve(view: &ChainView, value: Option<&Value>) -> Option<u64> {
    let tag = match value {
        None => BlockTag::Latest,
        Some(v) => BlockTag::parse(v)?,
    };
    match (&tag, view.resolve(&tag)) {
        // Explicit heights need no head (a node answers an empty list beyond its head).
        (BlockTag::Number(n), _) => Some(*n),
        (BlockTag::Earliest, _) => Some(0),
        (_, Resolved::Block { number, .. }) => Some(number),
        _ => None,
    }
}

#[async_trait]
impl Upstreams for LogsLayer {
    fn call<'a, 'b, 'f>(&'a self, call: &'b Call) -> CallFuture<'f>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        // Every other method goes down as the inner layer's own future.
        if call.method() != "eth_getLogs" {
            return self.inner.call(call);
        }
        Box::pin(async move {
            match self.split(call).await {
                Some(answer) => answer,
                None => self.inner.call(call).await,
            }
        })
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        if !calls.iter().any(|c| c.method() == "eth_getLogs") {
            return self.inner.call_batch(calls).await;
        }
        futures_util::future::join_all(calls.iter().map(|c| self.call(c))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_cut_into_consecutive_chunks_with_nothing_lost() {
        assert_eq!(chunks(0, 9, 4), vec![(0, 3), (4, 7), (8, 9)]);
        assert_eq!(chunks(5, 5, 100), vec![(5, 5)]);
        assert_eq!(chunks(10, 29, 10), vec![(10, 19), (20, 29)]);
        for (from, to, max) in [(0, 1000, 7), (3, 3, 1), (17, 120, 25)] {
            let c = chunks(from, to, max);
            assert_eq!(c.first().unwrap().0, from);
            assert_eq!(c.last().unwrap().1, to);
            assert!(c.windows(2).all(|w| w[0].1 + 1 == w[1].0));
            assert!(c.iter().all(|(a, b)| b - a < max));
        }
    }

    #[test]
    fn bisection_halves_until_one_block() {
        assert_eq!(bisect((0, 9)), Some([(0, 4), (5, 9)]));
        assert_eq!(bisect((4, 5)), Some([(4, 4), (5, 5)]));
        assert_eq!(bisect((7, 7)), None);
    }

    #[test]
    fn provider_wordings_for_too_large_are_recognised() {
        assert!(is_too_large("query returned more than 10000 results"));
        assert!(is_too_large(
            "Log response size exceeded. You can make eth_getLogs requests with up to a 2K block range"
        ));
        assert!(is_too_large("exceed maximum block range: 5000"));
        assert!(!is_too_large("invalid params"));
        assert!(!is_too_large("execution reverted"));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Chunks cover the range exactly, in order, each within the limit; bisection halves
        /// partition their range.
        #[test]
        fn chunks_partition_the_range(from in 0u64..1_000_000, len in 0u64..50_000, max in 1u64..5_000) {
            let to = from + len;
            let c = chunks(from, to, max);
            prop_assert_eq!(c.first().map(|r| r.0), Some(from));
            prop_assert_eq!(c.last().map(|r| r.1), Some(to));
            prop_assert!(c.windows(2).all(|w| w[0].1 + 1 == w[1].0));
            prop_assert!(c.iter().all(|(a, b)| a <= b && b - a < max));
            if let Some([low, high]) = bisect((from, to)) {
                prop_assert_eq!((low.0, low.1 + 1, high.1), (from, high.0, to));
            }
        }
    }
}
