//! One head follower per deployment: replicas that share a store ([`SharedHeads`], Redis in
//! `sluice-cluster`) elect one follower per network with a lease; it follows the chain as a
//! lone replica would and publishes what it learns (each header as fed, the member that
//! announced it, finality) and keeps the window of recent headers in the store. The others
//! follow that feed: they start from the stored window instead of backfilling from the node,
//! and make no call of their own while it flows. When the follower goes (killed, partitioned
//! from the store) its lease lapses and another replica takes over within a few seconds; with
//! the store down every replica follows by itself (counted, logged once).
//!
//! The lease is kept by its own task ([`keep_lease`]), which tells the watcher its role.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_chain::{parse_quantity, Header};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::Watcher;

/// What the follower publishes.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadNews {
    /// A header the follower fed, and the member that announced it, when one did.
    Header {
        /// The header.
        header: Header,
        /// The pool's name of the member whose notification it was.
        member: Option<String>,
    },
    /// The node's `safe` and `finalized` heights, read at head `at`.
    Finality {
        /// The safe height.
        safe: Option<u64>,
        /// The finalized height.
        finalized: Option<u64>,
        /// The head they were read at.
        at: u64,
    },
}

impl HeadNews {
    /// As sent through the store.
    pub fn to_json(&self) -> String {
        match self {
            HeadNews::Header { header, member } => {
                serde_json::json!({ "header": header.to_json(), "member": member }).to_string()
            }
            HeadNews::Finality { safe, finalized, at } => {
                serde_json::json!({ "finality": { "safe": safe, "finalized": finalized, "at": at } }).to_string()
            }
        }
    }

    /// Read back from the store; `None` for anything else (a newer replica's message).
    pub fn from_json(text: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        if let Some(header) = value.get("header") {
            let header = serde_json::from_value(header.clone()).ok()?;
            let member = value.get("member").and_then(|m| m.as_str()).map(str::to_owned);
            return Some(HeadNews::Header { header, member });
        }
        let f = value.get("finality")?;
        Some(HeadNews::Finality {
            safe: f.get("safe").and_then(|v| v.as_u64()),
            finalized: f.get("finalized").and_then(|v| v.as_u64()),
            at: f.get("at")?.as_u64()?,
        })
    }
}

/// A store failure (the store is down or refused): the replica then follows by itself.
#[derive(Debug, Clone, thiserror::Error)]
#[error("shared head store: {0}")]
pub struct StoreError(pub String);

/// Where replicas share one network's head following.
#[async_trait]
pub trait SharedHeads: Send + Sync + 'static {
    /// Takes the follower's lease, or keeps it when this replica holds it, for `ttl`; whether
    /// this replica holds it now.
    async fn hold(&self, ttl: Duration) -> Result<bool, StoreError>;
    /// Gives the lease up (a replica that stops), so another takes over at once.
    async fn release(&self) -> Result<(), StoreError>;
    /// Publishes news to the other replicas. A header also goes into the stored window of the
    /// newest `window` headers, replacing any at or above its height (an abandoned branch);
    /// finality is stored as the latest.
    async fn publish(&self, news: &HeadNews, window: usize) -> Result<(), StoreError>;
    /// Adds older headers (the follower's backfill) to the stored window.
    async fn store(&self, headers: &[Header], window: usize) -> Result<(), StoreError>;
    /// The news the follower publishes from now on; the channel closes when the store's
    /// connection is lost.
    async fn subscribe(&self) -> Result<mpsc::Receiver<HeadNews>, StoreError>;
    /// The stored window, newest first, and the latest finality.
    async fn window(&self) -> Result<(Vec<Header>, Option<HeadNews>), StoreError>;
}

/// A replica's part in following one network's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It holds the lease: it follows the chain and publishes.
    Follower,
    /// Another replica holds it: this one reads the shared feed.
    Reader,
    /// The store is down: it follows by itself.
    Alone,
}

impl Role {
    /// Lower-case name, for `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Reader => "reader",
            Role::Alone => "alone",
        }
    }
}

/// How long a lease lasts without renewal: a killed follower is replaced about this long
/// after its last renewal.
pub const LEASE: Duration = Duration::from_secs(5);
/// How often the lease is renewed, or, by a reader, tried.
pub const RENEW: Duration = Duration::from_millis(1500);

/// The task keeping a replica's lease, and the way to end it.
pub struct HeadLease {
    stop: std::sync::Mutex<Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>>,
}

impl HeadLease {
    pub(super) fn new(stop: oneshot::Sender<()>, task: tokio::task::JoinHandle<()>) -> Self {
        Self { stop: std::sync::Mutex::new(Some((stop, task))) }
    }

    /// Ends the task, which releases the lease if this replica holds it; waits for that, at
    /// most a renewal period (a Redis that does not answer leaves the lease to lapse).
    pub async fn release(&self) {
        let Some((stop, task)) = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let _ = stop.send(());
        let _ = tokio::time::timeout(RENEW, task).await;
    }
}

/// Keeps trying for, or renewing, the lease; tells the watcher its role as it changes. Ends,
/// releasing the lease, when `stop` fires; a dropped sender is no stop (the watcher still
/// follows by the role this task keeps).
pub(super) async fn keep_lease(
    shared: Arc<dyn SharedHeads>,
    role: watch::Sender<Role>,
    network: String,
    mut stop: oneshot::Receiver<()>,
) {
    let mut tick = tokio::time::interval(RENEW);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut down_logged = false;
    let mut first = true;
    let mut stoppable = true;
    loop {
        tokio::select! {
            biased;
            stopped = &mut stop, if stoppable => match stopped {
                // Checked before every renewal, so no renewal follows the release.
                Ok(()) => {
                    if *role.borrow() == Role::Follower {
                        let _ = shared.release().await;
                        tracing::info!(%network, "head following: lease released at shutdown");
                    }
                    // For the rest of the shutdown this replica neither publishes nor reads.
                    role.send_replace(Role::Alone);
                    return;
                }
                Err(_) => {
                    stoppable = false;
                    continue;
                }
            },
            _ = tick.tick() => {}
        }
        let now = match tokio::time::timeout(RENEW, shared.hold(LEASE)).await {
            Ok(Ok(true)) => Role::Follower,
            Ok(Ok(false)) => Role::Reader,
            Ok(Err(e)) => {
                if !down_logged {
                    tracing::warn!(%network, error = %e, "shared head store unavailable: following the chain by this replica alone");
                    down_logged = true;
                }
                Role::Alone
            }
            Err(_) => Role::Alone,
        };
        if now != Role::Alone {
            down_logged = false;
        }
        if *role.borrow() != now || first {
            first = false;
            if now == Role::Alone {
                metrics::counter!("sluice_head_share_fallbacks_total", "network" => network.clone()).increment(1);
            }
            tracing::info!(%network, role = ?now, "head following");
            role.send_replace(now);
        }
        if role.is_closed() {
            let _ = shared.release().await;
            return;
        }
    }
}

impl Watcher {
    /// Whether this replica is the deployment's follower (it publishes).
    fn publishes(&self) -> bool {
        self.role.as_ref().is_some_and(|r| *r.borrow() == Role::Follower)
    }

    /// Publishes news when this replica is the deployment's follower.
    pub(super) async fn share(&self, news: HeadNews) {
        if let (Some(shared), true) = (&self.shared, self.publishes()) {
            if let Err(e) = shared.publish(&news, self.config.window).await {
                tracing::debug!(error = %e, "could not publish to the shared head store");
            }
        }
    }

    /// Stores the backfilled headers when this replica is the deployment's follower.
    pub(super) async fn share_window(&self, headers: &[Header]) {
        if let (Some(shared), true) = (&self.shared, self.publishes() && !headers.is_empty()) {
            if let Err(e) = shared.store(headers, self.config.window).await {
                tracing::debug!(error = %e, "could not store the window in the shared head store");
            }
        }
    }

    /// Whether this replica reads the shared feed now.
    pub(super) fn reads_shared(&self) -> bool {
        self.role.as_ref().is_some_and(|r| *r.borrow() == Role::Reader)
    }

    /// Fills the tracker from the stored window (newest first) instead of the node: a replica
    /// that starts beside a follower costs the node nothing. Returns whether it got a head.
    pub(super) async fn start_from_shared(&mut self) -> bool {
        let Some(shared) = self.shared.clone() else { return false };
        let Ok((window, finality)) = shared.window().await else { return false };
        let mut headers = window.into_iter();
        let Some(newest) = headers.next() else { return false };
        let mut stamps: Vec<(u64, u64)> = newest.timestamp.map(|t| (newest.number, t)).into_iter().collect();
        self.tracker.feed(newest);
        let mut blocks = 1;
        for header in headers {
            let stamp = header.timestamp.map(|t| (header.number, t));
            // Headers of an abandoned branch do not link: skipped.
            if self.tracker.prepend(header) {
                stamps.extend(stamp);
                blocks += 1;
            }
        }
        if let Some(HeadNews::Finality { safe, finalized, .. }) = finality {
            self.set_finality(safe, finalized);
        }
        // What the store lacks (a window shorter than this replica's) is fetched as usual.
        self.backfilled = self.tracker.room_below() == 0;
        if self.cadence.interval().is_none() {
            self.cadence.seed(&stamps);
            if let Some(interval) = self.cadence.interval() {
                self.upstream.block_interval(interval);
            }
        }
        self.publish_view(None);
        tracing::info!(blocks, "head window read from the shared store");
        true
    }

    /// Follows the shared feed while this replica is a reader. The head is polled only when
    /// the feed is silent for two blocks (a follower that died and whose lease has not lapsed
    /// yet), as when a subscription falls silent.
    pub(super) async fn follow_shared(&mut self) {
        let Some(shared) = self.shared.clone() else { return };
        let Ok(mut news) = shared.subscribe().await else {
            // The store is unreachable: the lease task will say so; meanwhile, poll.
            self.poll_for(RENEW).await;
            return;
        };
        if self.tracker.latest().is_none() && !self.start_from_shared().await {
            self.poll_once().await;
        }
        if self.tracker.view().chain_id.is_none() {
            // Answered locally from then on, as on the follower.
            if let Some(id) = self.fetch("eth_chainId", "[]").await.and_then(|v| v.as_str().and_then(parse_quantity)) {
                self.tracker.set_chain_id(id);
                self.publish_view(None);
            }
        }
        let Some(mut role) = self.role.clone() else { return };
        let mut silent_until = Instant::now() + self.cadence.silence_limit();
        loop {
            tokio::select! {
                item = news.recv() => {
                    let Some(item) = item else { return };
                    match item {
                        HeadNews::Header { header, member } => {
                            if let Some(member) = &member {
                                self.upstream.member_head(member, header.number, &header.hash);
                            }
                            self.ingest(header, None).await;
                        }
                        HeadNews::Finality { safe, finalized, .. } => {
                            self.set_finality(safe, finalized);
                            self.publish_view(None);
                        }
                    }
                    silent_until = Instant::now() + self.cadence.silence_limit();
                }
                _ = tokio::time::sleep_until(silent_until) => {
                    tracing::debug!("the shared head feed is silent for two blocks; polling the head");
                    self.poll_once().await;
                    silent_until = Instant::now() + self.cadence.silence_limit();
                }
                changed = role.changed() => {
                    if changed.is_err() || *role.borrow() != Role::Reader {
                        return;
                    }
                }
                Ok(()) = self.hints.changed() => self.follow_hint().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn news_goes_through_the_store_unchanged() {
        let mut header = Header::new(0x1f, "0xab".into(), "0xcd".into());
        header.timestamp = Some(1_700_000_000);
        header.base_fee = Some(7);
        header.requests_hash = Some("0xee".into());
        for news in [
            HeadNews::Header { header: header.clone(), member: Some("alpha".into()) },
            HeadNews::Header { header, member: None },
            HeadNews::Finality { safe: Some(30), finalized: None, at: 31 },
        ] {
            assert_eq!(HeadNews::from_json(&news.to_json()), Some(news));
        }
        assert_eq!(HeadNews::from_json(r#"{"something":"newer"}"#), None);
    }
}
