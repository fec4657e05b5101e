//! The hub: `newHeads` and `logs` served from the head tracker, shared by every client.
//!
//! One task follows the tracker's view. For each step of the [`Emitted`] plan it sends the
//! dropped blocks' logs again with `removed: true` (lowest block first, in log order), then for
//! each new block, in height order, the block (`eth_getBlockByHash(hash, false)`, the node's
//! own object, as the node's `newHeads` sends it) and its logs (`eth_getLogs` by block hash),
//! fetched once through the network's layers whichever upstream answers. A block is recorded
//! as sent only once both answers were usable and matched the hash; otherwise the step is
//! tried again shortly, so a failover never leaves a gap. Nothing is fetched while no client
//! listens.
//!
//! Subscribers with the same log filter share one group (one match per log per group), each
//! client reading the group's bounded broadcast; one that falls `client_buffer` events behind
//! is closed with 1008, never silently skipped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use sluice_chain::ChainView;
use sluice_jsonrpc::Outcome;
use sluice_upstream::{Call, Upstreams};
use tokio::sync::{broadcast, watch};

use crate::emitted::{Emitted, Plan};
use crate::filter::{parse_hex, Address, LogFields, LogFilter, Topic};
use crate::{broadcast_stream, FeedStream, LocalFeeds, SubscriptionsConfig};

/// How soon a step whose fetch failed is tried again.
const RETRY: Duration = Duration::from_millis(250);
/// Most blocks sent in one step (a long outage is caught up step by step).
const MAX_STEP: usize = 64;
/// How long the first subscription waits for the head feed's first head (just after a start),
/// so that it starts after the head current then. Past it (every upstream down), the first
/// head learned is sent.
const FIRST_HEAD_WAIT: Duration = Duration::from_secs(10);

/// Serves `newHeads` and `logs` for one network.
pub struct Hub {
    shared: Arc<Shared>,
    /// Starts the follower (and, through `view`, the head feed) on the first subscription, so
    /// that a sluice nobody subscribes to makes no calls for it (a metered provider's quota).
    /// An async lock: subscriptions made while the first one waits for a head wait with it.
    start: tokio::sync::Mutex<Option<Start>>,
}

struct Start {
    follower: Follower,
    view: Box<dyn FnOnce() -> watch::Receiver<Arc<ChainView>> + Send>,
}

/// What the follower and the subscribers share.
struct Shared {
    heads: broadcast::Sender<Arc<RawValue>>,
    groups: Mutex<HashMap<LogFilter, broadcast::Sender<Arc<RawValue>>>>,
    buffer: usize,
}

/// A log as the hub keeps it: what filters look at, and the node's JSON both ways.
#[derive(Debug)]
struct Log {
    address: Address,
    topics: Vec<Topic>,
    raw: Arc<RawValue>,
    removed: Arc<RawValue>,
}

impl LogFields for Log {
    fn address(&self) -> &Address {
        &self.address
    }
    fn topics(&self) -> &[Topic] {
        &self.topics
    }
}

/// What is kept with each block sent: its logs, when anyone wanted them then.
type Kept = Option<Arc<Vec<Log>>>;

impl Hub {
    /// A hub that, on its first subscription, follows the view `view()` gives (starting the
    /// head feed then, if it was not running), fetching through `upstream` (the network's layers).
    pub fn new(
        upstream: Arc<dyn Upstreams>,
        view: impl FnOnce() -> watch::Receiver<Arc<ChainView>> + Send + 'static,
        config: &SubscriptionsConfig,
        network: &str,
    ) -> Arc<Hub> {
        let shared = Arc::new(Shared {
            heads: broadcast::channel(config.client_buffer).0,
            groups: Mutex::new(HashMap::new()),
            buffer: config.client_buffer,
        });
        let follower = Follower {
            hub: shared.clone(),
            upstream,
            sent: Emitted::new(config.reorg_window, MAX_STEP),
            metrics: Counters::new(network),
        };
        Arc::new(Hub { shared, start: tokio::sync::Mutex::new(Some(Start { follower, view: Box::new(view) })) })
    }

    /// Starts the follower on the first subscription, before that client gets its answer.
    async fn started(&self) {
        let mut start = self.start.lock().await;
        if let Some(Start { mut follower, view }) = start.take() {
            let mut view = view();
            // The head current as the first client subscribes is where subscribers start: only
            // blocks after it are sent (as a node's own subscription does). Settled here, before
            // the client is answered, so that a block it mines next is never taken for it. Just
            // after a start the head feed may not have read a head yet: wait for it, briefly.
            let known = tokio::time::timeout(FIRST_HEAD_WAIT, view.wait_for(|v| v.latest().is_some()))
                .await
                .map(|seen| seen.is_ok())
                .unwrap_or(false);
            if !known {
                tracing::warn!("no head known yet: subscribers get the first head learned");
            }
            if let Some((number, hash)) = view.borrow().latest() {
                follower.sent.record(number, hash.to_owned(), None);
            }
            tokio::spawn(follower.run(view));
        }
    }

    async fn subscribe_heads(&self) -> FeedStream {
        let stream = broadcast_stream(self.shared.heads.subscribe(), None, ());
        self.started().await;
        stream
    }

    async fn subscribe_logs(&self, filter: LogFilter) -> FeedStream {
        let stream = {
            let mut groups = self.shared.groups.lock().unwrap_or_else(|e| e.into_inner());
            let tx = groups.entry(filter).or_insert_with(|| broadcast::channel(self.shared.buffer).0);
            broadcast_stream(tx.subscribe(), None, ())
        };
        self.started().await;
        stream
    }
}

impl Shared {
    /// The groups someone still reads, after dropping the rest.
    fn live_groups(&self) -> Vec<(LogFilter, broadcast::Sender<Arc<RawValue>>)> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.retain(|_, tx| tx.receiver_count() > 0);
        groups.iter().map(|(f, tx)| (f.clone(), tx.clone())).collect()
    }
}

#[async_trait::async_trait]
impl LocalFeeds for Hub {
    async fn subscribe(&self, params: &[serde_json::Value]) -> Option<FeedStream> {
        match (params.first()?.as_str()?, params.len()) {
            ("newHeads", 1) => Some(self.subscribe_heads().await),
            ("logs", 1 | 2) => Some(self.subscribe_logs(LogFilter::parse(params.get(1))?).await),
            _ => None,
        }
    }
}

struct Counters {
    heads: metrics::Counter,
    logs: metrics::Counter,
    removed: metrics::Counter,
    retries: metrics::Counter,
    groups: metrics::Gauge,
}

impl Counters {
    fn new(network: &str) -> Self {
        let n = network.to_owned();
        Self {
            heads: metrics::counter!("sluice_subscription_heads_total", "network" => n.clone()),
            logs: metrics::counter!("sluice_subscription_logs_total", "network" => n.clone()),
            removed: metrics::counter!("sluice_subscription_removed_logs_total", "network" => n.clone()),
            retries: metrics::counter!("sluice_subscription_fetch_retries_total", "network" => n.clone()),
            groups: metrics::gauge!("sluice_subscription_log_filters", "network" => n),
        }
    }
}

struct Follower {
    hub: Arc<Shared>,
    upstream: Arc<dyn Upstreams>,
    sent: Emitted<Kept>,
    metrics: Counters,
}

impl Follower {
    async fn run(mut self, mut view: watch::Receiver<Arc<ChainView>>) {
        let mut retry_at: Option<tokio::time::Instant> = None;
        // The view may have moved between the subscription and this task's first poll.
        view.mark_changed();
        loop {
            tokio::select! {
                changed = view.changed() => if changed.is_err() { return },
                _ = async { if let Some(at) = retry_at { tokio::time::sleep_until(at).await } }, if retry_at.is_some() => {}
            }
            retry_at = None;
            loop {
                let current = view.borrow_and_update().clone();
                let plan = self.sent.plan(&*current);
                if plan.is_empty() {
                    break;
                }
                if self.apply(plan).await.is_err() {
                    self.metrics.retries.increment(1);
                    retry_at = Some(tokio::time::Instant::now() + RETRY);
                    break;
                }
            }
        }
    }

    /// Sends one step; `Err` when a block could not be fetched (what was sent stays recorded).
    async fn apply(&mut self, plan: Plan) -> Result<(), ()> {
        let groups = self.hub.live_groups();
        self.metrics.groups.set(groups.len() as f64);
        for number in plan.removed {
            let Some(Some(logs)) = self.sent.remove(number) else { continue };
            for log in logs.iter() {
                for (filter, tx) in &groups {
                    if filter.matches(log) {
                        let _ = tx.send(log.removed.clone());
                        self.metrics.removed.increment(1);
                    }
                }
            }
        }
        for (number, hash) in plan.added {
            let groups = self.hub.live_groups();
            let want_head = self.hub.heads.receiver_count() > 0;
            if !want_head && groups.is_empty() {
                self.sent.record(number, hash, None);
                continue;
            }
            let (block, logs) = self.fetch(number, &hash, want_head, !groups.is_empty()).await?;
            if let Some(block) = block {
                let _ = self.hub.heads.send(block);
                self.metrics.heads.increment(1);
            }
            if let Some(logs) = &logs {
                for log in logs.iter() {
                    for (filter, tx) in &groups {
                        if filter.matches(log) {
                            let _ = tx.send(log.raw.clone());
                            self.metrics.logs.increment(1);
                        }
                    }
                }
            }
            self.sent.record(number, hash, logs);
        }
        Ok(())
    }

    /// The block and its logs, as asked; `Err` unless every answer asked for is usable.
    async fn fetch(
        &self,
        number: u64,
        hash: &str,
        block: bool,
        logs: bool,
    ) -> Result<(Option<Arc<RawValue>>, Kept), ()> {
        let mut calls = Vec::with_capacity(2);
        if block {
            calls.push(Call::internal("eth_getBlockByHash", Some(&format!(r#"["{hash}",false]"#))));
        }
        if logs {
            calls.push(Call::internal("eth_getLogs", Some(&format!(r#"[{{"blockHash":"{hash}"}}]"#))));
        }
        let refs: Vec<&Call> = calls.iter().collect();
        let mut answers = self.upstream.call_batch(&refs).await.into_iter();
        let mut result = || match answers.next() {
            Some(Ok(answer)) => match answer.outcome {
                Outcome::Result(raw) => Ok(raw),
                Outcome::Error(e) => {
                    tracing::debug!(number, error = e.get(), "subscription fetch refused");
                    Err(())
                }
            },
            Some(Err(e)) => {
                tracing::debug!(number, error = %e, "subscription fetch failed");
                Err(())
            }
            None => Err(()),
        };
        let block = if block { Some(checked_block(result()?, number, hash)?) } else { None };
        let logs = if logs { Some(Arc::new(parse_logs(&result()?)?)) } else { None };
        Ok((block, logs))
    }
}

/// The block, when it is the one asked for (a node without it answers `null`).
fn checked_block(raw: Arc<RawValue>, number: u64, hash: &str) -> Result<Arc<RawValue>, ()> {
    #[derive(Deserialize)]
    struct Head<'a> {
        #[serde(borrow)]
        hash: &'a str,
        #[serde(borrow)]
        number: &'a str,
    }
    let head: Option<Head> = serde_json::from_str(raw.get()).map_err(|_| ())?;
    match head {
        Some(h) if h.hash.eq_ignore_ascii_case(hash) && sluice_chain::parse_quantity(h.number) == Some(number) => {
            Ok(raw)
        }
        _ => Err(()),
    }
}

/// The logs of one block, each kept as the node sent it and as its removed copy.
fn parse_logs(raw: &RawValue) -> Result<Vec<Log>, ()> {
    #[derive(Deserialize)]
    struct Fields<'a> {
        #[serde(borrow)]
        address: &'a str,
        #[serde(borrow)]
        topics: Vec<&'a str>,
    }
    let items: Vec<Box<RawValue>> = serde_json::from_str(raw.get()).map_err(|_| ())?;
    items
        .into_iter()
        .map(|item| {
            let fields: Fields = serde_json::from_str(item.get()).map_err(|_| ())?;
            let address = parse_hex::<20>(fields.address).ok_or(())?;
            let topics = fields.topics.iter().map(|t| parse_hex::<32>(t)).collect::<Option<Vec<_>>>().ok_or(())?;
            let removed = removed_copy(&item)?;
            Ok(Log { address, topics, raw: Arc::from(item), removed })
        })
        .collect()
}

/// The same log with `"removed": true`. The node's bytes are kept (key order included) by
/// editing its `"removed":false` in place; a log written otherwise is rebuilt.
fn removed_copy(log: &RawValue) -> Result<Arc<RawValue>, ()> {
    let text = log.get();
    if text.matches("\"removed\":false").count() == 1 {
        let edited = text.replacen("\"removed\":false", "\"removed\":true", 1);
        return RawValue::from_string(edited).map(Arc::from).map_err(|_| ());
    }
    let mut value: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(|_| ())?;
    value.insert("removed".into(), serde_json::Value::Bool(true));
    serde_json::value::to_raw_value(&value).map(Arc::from).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use sluice_chain::{HeadTracker, Header};
    use sluice_upstream::{Answer, UpstreamError};

    use crate::FeedItem;

    /// A stand-in for the network's layers that knows blocks by hash (isolates the hub).
    struct Blocks;

    #[async_trait::async_trait]
    impl Upstreams for Blocks {
        async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
            let params: serde_json::Value = serde_json::from_str(call.req.params_text()).unwrap();
            let hash = params[0].as_str().unwrap().to_owned();
            let number = u64::from_str_radix(&hash[hash.len() - 2..], 16).unwrap();
            let block = format!(r#"{{"number":"{number:#x}","hash":"{hash}"}}"#);
            Ok(Answer::upstream(Outcome::Result(Arc::from(RawValue::from_string(block).unwrap()))))
        }
    }

    fn header(number: u64) -> Header {
        let hash = |n: u64| format!("0x{:064x}", n);
        Header::new(number, hash(number), hash(number.wrapping_sub(1)))
    }

    // The block mined right after the first subscription, before the hub's task first runs,
    // is the first head subscribers get: it is not taken for the head they started from.
    #[tokio::test(flavor = "current_thread")]
    async fn a_block_mined_as_the_first_client_subscribes_is_sent() {
        let mut tracker = HeadTracker::new(16);
        tracker.feed(header(0));
        let (tx, rx) = watch::channel(Arc::new(tracker.view()));
        let config = SubscriptionsConfig::default();
        let hub = Hub::new(Arc::new(Blocks), move || rx, &config, "test");
        let mut heads = hub.subscribe(&[serde_json::json!("newHeads")]).await.unwrap();
        tracker.feed(header(1));
        tx.send_replace(Arc::new(tracker.view()));
        let first = tokio::time::timeout(Duration::from_secs(5), heads.next()).await.expect("a head").unwrap();
        let FeedItem::Event(block) = first else { panic!("closed") };
        assert!(block.get().contains(r#""number":"0x1""#), "{}", block.get());
    }

    // Just after a start no head is known: the first subscription is answered only once the
    // head feed read one, and that head (current as the client was answered) is not sent.
    #[tokio::test(flavor = "current_thread")]
    async fn the_first_subscription_waits_for_a_head_and_starts_after_it() {
        let tracker = HeadTracker::new(16);
        let (tx, rx) = watch::channel(Arc::new(tracker.view()));
        let config = SubscriptionsConfig::default();
        let hub = Hub::new(Arc::new(Blocks), move || rx, &config, "test");
        let waiting = tokio::spawn({
            let hub = hub.clone();
            async move { hub.subscribe(&[serde_json::json!("newHeads")]).await.unwrap() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "answered before any head was known");
        let mut tracker = tracker;
        tracker.feed(header(0));
        tx.send_replace(Arc::new(tracker.view()));
        let mut heads = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").unwrap();
        tracker.feed(header(1));
        tx.send_replace(Arc::new(tracker.view()));
        let first = tokio::time::timeout(Duration::from_secs(5), heads.next()).await.expect("a head").unwrap();
        let FeedItem::Event(block) = first else { panic!("closed") };
        assert!(block.get().contains(r#""number":"0x1""#), "{}", block.get());
    }

    #[test]
    fn logs_keep_the_nodes_bytes_and_their_removed_copy_differs_only_in_the_flag() {
        let raw = RawValue::from_string(
            r#"[{"address":"0x00000000000000000000000000000000000000e1","topics":["0xbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"],"data":"0x01","logIndex":"0x1","removed":false},{"topics":[],"address":"0x00000000000000000000000000000000000000E2"}]"#.into(),
        )
        .unwrap();
        let logs = parse_logs(&raw).unwrap();
        assert_eq!(logs.len(), 2);
        let mut e1 = [0u8; 20];
        e1[19] = 0xe1;
        assert_eq!(logs[0].address, e1);
        assert_eq!(logs[0].topics, vec![[0xbb; 32]]);
        assert!(logs[0].raw.get().starts_with(r#"{"address":"0x0000"#));
        assert_eq!(logs[0].removed.get(), logs[0].raw.get().replace("\"removed\":false", "\"removed\":true"));
        let rebuilt: serde_json::Value = serde_json::from_str(logs[1].removed.get()).unwrap();
        assert_eq!(rebuilt["removed"], true);
        assert!(parse_logs(&RawValue::from_string(r#"[{"address":"0x1","topics":[]}]"#.into()).unwrap()).is_err());
        assert!(parse_logs(&RawValue::from_string("null".into()).unwrap()).is_err());
    }

    #[test]
    fn a_block_is_used_only_when_it_is_the_one_asked_for() {
        let raw = |s: &str| Arc::<RawValue>::from(RawValue::from_string(s.into()).unwrap());
        assert!(checked_block(raw(r#"{"number":"0x5","hash":"0xAB"}"#), 5, "0xab").is_ok());
        assert!(checked_block(raw(r#"{"number":"0x6","hash":"0xab"}"#), 5, "0xab").is_err());
        assert!(checked_block(raw(r#"{"number":"0x5","hash":"0xcd"}"#), 5, "0xab").is_err());
        assert!(checked_block(raw("null"), 5, "0xab").is_err());
    }
}
