//! The head feed: follows the node's chain and publishes it to the cache and the pool.
//!
//! A task subscribes to `newHeads` over the node's WebSocket and feeds each header, as the
//! notification carries it, to the pure [`HeadTracker`]; it polls `latest` only when no
//! notification came for about two blocks. Without a WebSocket, or while the subscription is
//! down, it polls `latest` when the next block is due ([`Cadence`], the chain's pace learned from
//! the heads seen) and tries the WebSocket again, less and less often. Missing parents (gaps,
//! reorgs) are fetched by hash. The node's safe and finalized heights are read once an epoch
//! ([`FinalityClock`]). What it learns that the pool can use instead of probing (a member's
//! own head, the chain's pace) it hands to the pool.
//! A block that an answer relayed to a client named above the head ([`Seen`]) is fetched at
//! once, so that the client's next reads are not answered from before it.
//!
//! Readers get an `Arc<ChainView>` snapshot from a watch channel (published first), then a
//! [`ChainEvent`] on a broadcast channel: a reader never sees an event before the view that
//! explains it.
//!
//! Replicas sharing a store follow as one ([`shared`]): one holds the lease and follows as
//! above, publishing; the others read its feed.

mod shared;

use shared::RENEW;
pub use shared::{HeadNews, Role, SharedHeads, StoreError};

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use sluice_chain::{
    parse_quantity, BlockNeed, Cadence, ChainEvent, ChainView, Feed, FinalityClock, HeadTracker, Header, NamedBlock,
};
use sluice_jsonrpc::{Id, Outcome, Request};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::{Call, HeadView, Seen, UpstreamSocket, Upstreams};

/// Settings for the head feed.
#[derive(Debug, Clone)]
pub struct HeadConfig {
    /// Recent blocks remembered (height → hash).
    pub window: usize,
    /// How often `latest` is polled at most while there is no subscription: the poll comes
    /// when the next block is due (the chain's pace, learned), then this often (or a quarter
    /// of a block, when shorter) until it shows.
    pub poll_interval: Duration,
    /// The first wait before trying the WebSocket again while polling; each failure doubles
    /// it, up to a minute.
    pub resubscribe_every: Duration,
    /// Deadline for connecting and subscribing.
    pub timeout: Duration,
    /// The network followed: the `network` label of the head and reorg metrics.
    pub network: String,
    /// How long a call that resolves `latest` waits for the tracker to reach a block an
    /// answer already showed a client (then the call resolves no tag itself).
    pub catch_up: Duration,
}

impl Default for HeadConfig {
    fn default() -> Self {
        Self {
            window: 512,
            poll_interval: Duration::from_secs(1),
            resubscribe_every: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            network: "default".to_owned(),
            catch_up: CATCH_UP,
        }
    }
}

/// The default of [`HeadConfig::catch_up`]: a block fetch or two from a distant provider.
pub const CATCH_UP: Duration = Duration::from_secs(2);

/// Where readers follow the chain.
#[derive(Clone)]
pub struct HeadFeed {
    /// The latest snapshot.
    pub view: watch::Receiver<Arc<ChainView>>,
    /// New heads and reorgs, after the view that shows them was published.
    pub events: broadcast::Sender<ChainEvent>,
    /// Blocks answers named above the head, which the watcher fetches and calls wait for.
    pub seen: Arc<Seen>,
    /// This replica's part in following, when replicas share it (for `/status`).
    pub role: Option<watch::Receiver<Role>>,
    /// The lease task, when replicas share the following: [`HeadFeed::step_down`] ends it.
    lease: Option<Arc<shared::HeadLease>>,
}

impl HeadFeed {
    /// Gives up this replica's part in a shared following, at shutdown: a follower releases
    /// its lease, so that another replica takes over at its next try instead of when the lease
    /// lapses. Nothing to do without sharing.
    pub async fn step_down(&self) {
        if let Some(lease) = &self.lease {
            lease.release().await;
        }
    }

    /// A feed that never moves, for components used without a head watcher.
    pub fn fixed(view: ChainView) -> (Self, watch::Sender<Arc<ChainView>>) {
        let (tx, rx) = watch::channel(Arc::new(view));
        let seen = Arc::new(Seen::new(CATCH_UP));
        (Self { view: rx, events: broadcast::channel(16).0, seen, role: None, lease: None }, tx)
    }

    /// The head as the pipeline of network `network` sees it: one view per call, and what
    /// the answers it relays teach.
    pub fn head_view(&self, network: &str) -> HeadView {
        HeadView::new(self.view.clone(), self.seen.clone(), network)
    }
}

/// Starts following the chain of `upstream` (calls) and `ws_urls` (subscriptions, tried in
/// turn: when the socket that announces heads dies, the next one takes over). Each socket is
/// named as its member is in the pool, which is told the heads it announces.
pub fn spawn_head_watcher(
    upstream: Arc<dyn Upstreams>,
    ws_urls: Vec<(String, String)>,
    config: HeadConfig,
) -> HeadFeed {
    spawn_shared_head_watcher(upstream, ws_urls, config, None)
}

/// As [`spawn_head_watcher`], one follower for the replicas that share `shared` (see
/// [`shared`]): this replica follows the chain only while it holds the lease.
pub fn spawn_shared_head_watcher(
    upstream: Arc<dyn Upstreams>,
    ws_urls: Vec<(String, String)>,
    config: HeadConfig,
    shared: Option<Arc<dyn SharedHeads>>,
) -> HeadFeed {
    let (role, lease) = match shared.clone() {
        Some(store) => {
            let (tx, rx) = watch::channel(Role::Alone);
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(shared::keep_lease(store, tx, config.network.clone(), stopped));
            (Some(rx), Some(Arc::new(shared::HeadLease::new(stop, task))))
        }
        None => (None, None),
    };
    let (view_tx, view) = watch::channel(Arc::new(ChainView::default()));
    let (events, _) = broadcast::channel(1024);
    let seen = Arc::new(Seen::new(config.catch_up));
    let watcher = Watcher {
        hints: seen.hints(),
        tracker: HeadTracker::new(config.window),
        upstream,
        view_tx,
        events: events.clone(),
        cadence: Cadence::new(config.poll_interval),
        finality: FinalityClock::default(),
        polled: None,
        config,
        backfilled: false,
        shared,
        role: role.clone(),
    };
    tokio::spawn(watcher.run(ws_urls));
    HeadFeed { view, events, seen, role, lease }
}

struct Watcher {
    tracker: HeadTracker,
    upstream: Arc<dyn Upstreams>,
    view_tx: watch::Sender<Arc<ChainView>>,
    events: broadcast::Sender<ChainEvent>,
    config: HeadConfig,
    /// The window below the first head has been filled.
    backfilled: bool,
    /// Blocks answers named above the head.
    hints: watch::Receiver<Option<NamedBlock>>,
    /// The chain's pace: when to poll, how long a subscription may be silent.
    cadence: Cadence,
    /// When `safe` and `finalized` are read again.
    finality: FinalityClock,
    /// When the head was last polled.
    polled: Option<std::time::Instant>,
    /// The store replicas share following through, when there is one.
    shared: Option<Arc<dyn SharedHeads>>,
    /// This replica's part, as the lease task tells it (with a store).
    role: Option<watch::Receiver<Role>>,
}

/// Resolves when this replica becomes a reader of the shared feed (never, without a store).
async fn became_reader(role: &mut Option<watch::Receiver<Role>>) {
    let Some(role) = role else { return std::future::pending().await };
    loop {
        if role.changed().await.is_err() {
            return std::future::pending().await;
        }
        if *role.borrow() == Role::Reader {
            return;
        }
    }
}

/// The longest wait between attempts to subscribe again, while following by polling.
const MAX_RESUBSCRIBE: Duration = Duration::from_secs(60);

impl Watcher {
    async fn run(mut self, ws_urls: Vec<(String, String)>) {
        if let Some(role) = &mut self.role {
            // The lease task's first answer: a replica beside a follower must not backfill.
            let _ = tokio::time::timeout(RENEW, role.changed()).await;
        }
        let mut next = 0;
        let mut wait = self.config.resubscribe_every;
        // Sockets whose failure was logged at warn since they last worked: the next attempts,
        // less and less often, log at debug (an HTTP-only provider would fill the log).
        let mut told: std::collections::HashSet<String> = Default::default();
        loop {
            if self.reads_shared() {
                self.follow_shared().await;
                continue;
            }
            // One round over the sockets, starting after the last one that failed; polling
            // through the pool (which fails over) covers the time in between.
            for _ in 0..ws_urls.len() {
                if self.reads_shared() {
                    break;
                }
                let (member, url) = &ws_urls[next % ws_urls.len()];
                match self.follow_subscription(url, member).await {
                    Ok(()) => {
                        wait = self.config.resubscribe_every;
                        told.remove(url);
                    }
                    Err(why) if told.insert(url.clone()) => tracing::warn!(
                        %why, %url,
                        "newHeads subscription unavailable: following by polling (about a call per block); \
                         tried again less and less often (debug logs each attempt)"
                    ),
                    Err(why) => tracing::debug!(%why, %url, "newHeads subscription still unavailable"),
                }
                next += 1;
            }
            if self.reads_shared() {
                continue;
            }
            self.poll_for(wait).await;
            // A member without a WebSocket is asked less and less often.
            wait = (wait * 2).min(MAX_RESUBSCRIBE.max(self.config.resubscribe_every));
        }
    }

    /// Follows `newHeads` of member `member` until the subscription ends; `Ok` when it had
    /// subscribed. Each notification is the header itself: nothing is fetched for it but the
    /// parents of a gap or a reorg. The head is polled only when no notification came for
    /// about two blocks (a node that skipped one, a socket stalled without closing).
    async fn follow_subscription(&mut self, url: &str, member: &str) -> Result<(), String> {
        let (socket, mut notifications) =
            UpstreamSocket::connect(url, self.config.timeout).await.map_err(|e| e.to_string())?;
        let params = RawValue::from_string(r#"["newHeads"]"#.into()).ok();
        match socket.call(Request::new(Some(Id::number(1)), "eth_subscribe", params)).await {
            Ok(Outcome::Result(_)) => {}
            Ok(Outcome::Error(e)) => return Err(format!("eth_subscribe refused: {}", e.get())),
            Err(e) => return Err(e.to_string()),
        }
        tracing::info!("following newHeads");
        if self.tracker.latest().is_none() {
            self.poll_once().await; // the head as of now, before the first notification
        }
        let mut silent_until = Instant::now() + self.cadence.silence_limit();
        loop {
            tokio::select! {
                event = notifications.recv() => {
                    let Some(event) = event else { break };
                    match serde_json::from_str::<Header>(event.result.get()) {
                        Ok(header) => {
                            self.upstream.member_head(member, header.number, &header.hash);
                            self.ingest(header, Some(member)).await;
                        }
                        Err(e) => tracing::warn!(error = %e, "newHeads sent an unreadable header"),
                    }
                    silent_until = Instant::now() + self.cadence.silence_limit();
                }
                _ = tokio::time::sleep_until(silent_until) => {
                    tracing::debug!("no newHeads notification for two blocks; polling the head");
                    self.poll_once().await;
                    silent_until = Instant::now() + self.cadence.silence_limit();
                }
                Ok(()) = self.hints.changed() => self.follow_hint().await,
                _ = became_reader(&mut self.role) => break,
            }
        }
        Ok(())
    }

    /// Follows the chain by polling for `period`: when the next block is due, then a little
    /// apart while it is late ([`Cadence::next_poll`]).
    async fn poll_for(&mut self, period: Duration) {
        let deadline = Instant::now() + period;
        loop {
            let due = self.polled.map_or(Instant::now(), |at| Instant::from_std(self.cadence.next_poll(at)));
            if due <= Instant::now() {
                self.poll_once().await;
                continue;
            }
            let next = due.min(deadline);
            // Between polls, a block an answer named is fetched at once.
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => break,
                    Ok(()) = self.hints.changed() => self.follow_hint().await,
                    _ = became_reader(&mut self.role) => return,
                }
            }
            if next >= deadline {
                return;
            }
        }
    }

    /// Fetches the newest block an answer named above the head (by hash when the answer gave
    /// it), and feeds it: once it links to the tracked chain it is the served head.
    async fn follow_hint(&mut self) {
        let Some(block) = self.hints.borrow_and_update().clone() else { return };
        if self.tracker.latest().is_some_and(|latest| latest >= block.number) {
            return; // the subscription or a poll brought it meanwhile
        }
        let (method, params, needs) = match &block.hash {
            Some(hash) => (
                "eth_getBlockByHash",
                format!(r#"["{hash}",false]"#),
                BlockNeed::Hash { hash: hash.clone(), number: Some(block.number) },
            ),
            None => {
                ("eth_getBlockByNumber", format!(r#"["{:#x}",false]"#, block.number), BlockNeed::Number(block.number))
            }
        };
        let Ok(params) = RawValue::from_string(params) else { return };
        let mut call = Call::internal_needing(Request::new(Some(Id::number(1)), method, Some(params)), needs);
        // A member named it: a `null` from one that has not got it yet is not believed.
        call.ctx.expect_found = true;
        let header = match self.upstream.call(&call).await.map(|a| a.outcome) {
            Ok(Outcome::Result(raw)) => serde_json::from_str::<Header>(raw.get()).ok(),
            _ => None,
        };
        match header {
            Some(header) => self.ingest(header, None).await,
            None => tracing::debug!(number = block.number, "a block an answer named could not be fetched"),
        }
    }

    async fn poll_once(&mut self) {
        self.polled = Some(std::time::Instant::now());
        if self.tracker.view().chain_id.is_none() {
            if let Some(id) = self.fetch("eth_chainId", "[]").await.and_then(|v| v.as_str().and_then(parse_quantity)) {
                self.tracker.set_chain_id(id);
            }
        }
        if let Some(header) = self.fetch_header(r#"["latest",false]"#, "eth_getBlockByNumber").await {
            self.ingest(header, None).await;
        }
    }

    /// Feeds a header (announced by `member`, when a notification), fetching parents the
    /// tracker asks for, then publishes (and shares, when this replica is the follower).
    async fn ingest(&mut self, header: Header, member: Option<&str>) {
        let mut pending = vec![header];
        let mut fork_point: Option<u64> = None;
        let mut fed: Vec<Header> = Vec::new();
        while let Some(next) = pending.last().cloned() {
            match self.tracker.feed(next) {
                Feed::NeedParent { hash, .. } => {
                    if pending.len() > self.config.window {
                        tracing::warn!("parent chain longer than the window; giving up on this head");
                        break;
                    }
                    match self.fetch_header(&format!(r#"["{hash}",false]"#), "eth_getBlockByHash").await {
                        Some(parent) => pending.push(parent),
                        None => break, // try again with the next head
                    }
                }
                Feed::Reorg { fork_point: at } => {
                    fork_point = Some(fork_point.map_or(at, |f: u64| f.min(at)));
                    fed.extend(pending.pop());
                }
                Feed::Extended => fed.extend(pending.pop()),
                Feed::Known | Feed::Stale => {
                    pending.pop();
                }
            }
        }
        if fed.is_empty() {
            return;
        }
        let newest = fed.len() - 1;
        for (i, header) in fed.into_iter().enumerate() {
            let member = if i == newest { member.map(str::to_owned) } else { None };
            self.share(HeadNews::Header { header, member }).await;
        }
        if !self.backfilled {
            self.backfilled = true;
            self.backfill().await;
        }
        let latest = self.tracker.latest();
        if let Some(latest) = latest {
            let pace = self.cadence.interval();
            self.cadence.saw(latest, std::time::Instant::now());
            if let Some(interval) = self.cadence.interval().filter(|t| Some(*t) != pace) {
                self.upstream.block_interval(interval);
            }
            // A reader takes finality from the follower's feed.
            if self.finality.due(latest) && !self.reads_shared() {
                self.refresh_finality(latest).await;
            }
        }
        self.publish_view(fork_point);
    }

    /// Publishes the tracker's view, then the events it explains.
    fn publish_view(&mut self, fork_point: Option<u64>) {
        let latest = self.tracker.latest();
        let view = Arc::new(self.tracker.view());
        self.view_tx.send_replace(view);
        if let Some(fork_point) = fork_point {
            tracing::info!(fork_point, "reorg");
            metrics::counter!("sluice_chain_reorgs_total", "network" => self.config.network.clone()).increment(1);
            let _ = self.events.send(ChainEvent::Reorg { fork_point });
        }
        if let Some(latest) = latest {
            metrics::gauge!("sluice_chain_head", "network" => self.config.network.clone()).set(latest as f64);
            let _ = self.events.send(ChainEvent::NewHead(latest));
        }
    }

    /// Sets the node's safe and finalized heights (lower bounds: finality only moves forward).
    fn set_finality(&mut self, safe: Option<u64>, finalized: Option<u64>) {
        if let Some(n) = finalized {
            self.tracker.set_finalized(n);
        }
        if let Some(n) = safe {
            self.tracker.set_safe(n);
        }
    }

    /// At start, fills the window below the first head (newest first, in batches), so that
    /// recent blocks are cacheable at once instead of only once they are finalized.
    async fn backfill(&mut self) {
        const BATCH: u64 = 100;
        let mut filled = 0usize;
        // The chain's own timestamps give its pace at once (number, seconds), rather than
        // after three heads seen live.
        let mut stamps: Vec<(u64, u64)> =
            self.tracker.view().tip.iter().filter_map(|h| Some((h.number, h.timestamp?))).collect();
        let mut backfilled: Vec<Header> = Vec::new();
        while self.tracker.room_below() > 0 {
            let Some((lowest, _)) = self.tracker.lowest() else { break };
            let count = (self.tracker.room_below() as u64).min(BATCH);
            let calls: Vec<Call> = (1..=count)
                .map(|k| Call::internal("eth_getBlockByNumber", Some(&format!(r#"["{:#x}",false]"#, lowest - k))))
                .collect();
            let refs: Vec<&Call> = calls.iter().collect();
            let answers = self.upstream.call_batch(&refs).await;
            let mut linked = 0;
            for answer in answers {
                let header = match answer {
                    Ok(answer) => match answer.outcome {
                        Outcome::Result(raw) => serde_json::from_str::<Header>(raw.get()).ok(),
                        Outcome::Error(_) => None,
                    },
                    Err(_) => None,
                };
                // Stops at the first block that does not link (a reorg meanwhile, a pruned node).
                let stamp = header.as_ref().and_then(|h| Some((h.number, h.timestamp?)));
                let Some(header) = header else { break };
                if !self.tracker.prepend(header.clone()) {
                    break;
                }
                backfilled.push(header);
                stamps.extend(stamp);
                linked += 1;
            }
            filled += linked;
            if linked < count as usize {
                break;
            }
        }
        if filled > 0 {
            tracing::info!(blocks = filled, "backfilled the head tracker's window");
        }
        self.share_window(&backfilled).await;
        if self.cadence.interval().is_none() {
            self.cadence.seed(&stamps);
            if let Some(interval) = self.cadence.interval() {
                self.upstream.block_interval(interval);
            }
        }
    }

    /// Reads `safe` and `finalized` (at head `head`). Between reads the view keeps them as
    /// lower bounds, and the tags go to the node as sent ([`ChainView::finality_is_current`]).
    async fn refresh_finality(&mut self, head: u64) {
        let finalized = RawValue::from_string(r#"["finalized",false]"#.into()).ok();
        let safe = RawValue::from_string(r#"["safe",false]"#.into()).ok();
        let calls = [
            Call::internal_request(Request::new(Some(Id::number(1)), "eth_getBlockByNumber", finalized)),
            Call::internal_request(Request::new(Some(Id::number(2)), "eth_getBlockByNumber", safe)),
        ];
        let answers = self.upstream.call_batch(&[&calls[0], &calls[1]]).await;
        let number = |i: usize| match &answers[i] {
            Ok(answer) => match &answer.outcome {
                Outcome::Result(raw) => serde_json::from_str::<Header>(raw.get()).ok().map(|h| h.number),
                Outcome::Error(_) => None,
            },
            Err(_) => None,
        };
        let (finalized, safe) = (number(0), number(1));
        self.set_finality(safe, finalized);
        self.finality.read(head, safe, finalized);
        self.share(HeadNews::Finality { safe, finalized, at: head }).await;
    }

    async fn fetch_header(&self, params: &str, method: &str) -> Option<Header> {
        let value = self.fetch(method, params).await?;
        serde_json::from_value(value).ok()
    }

    async fn fetch(&self, method: &str, params: &str) -> Option<serde_json::Value> {
        let answer = self.upstream.call(&Call::internal(method, Some(params))).await.ok()?;
        match answer.outcome {
            Outcome::Result(raw) => serde_json::from_str(raw.get()).ok(),
            Outcome::Error(_) => None,
        }
    }
}
