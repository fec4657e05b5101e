//! Cross-request batching for one node: single calls that meet within a short window leave as
//! one JSON-RPC batch. The pool still judges each call's answer alone (failover per element),
//! so a batch only changes how many HTTP requests the provider sees.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_jsonrpc::{Outcome, Request};
use tokio::sync::oneshot;

use crate::{HttpUpstream, UpstreamError};

type Reply = oneshot::Sender<Result<Outcome, UpstreamError>>;

struct Waiting {
    req: Request,
    timeout: Duration,
    reply: Reply,
}

struct Open {
    id: u64,
    waiting: Vec<Waiting>,
}

/// The batch filling up for one node.
pub(crate) struct Batcher {
    window: Duration,
    max: usize,
    open: Mutex<Option<Open>>,
    next: std::sync::atomic::AtomicU64,
}

impl Batcher {
    pub(crate) fn new(window: Duration, max: usize) -> Self {
        Self { window, max: max.max(2), open: Mutex::new(None), next: Default::default() }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Option<Open>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a call to the open batch (opening one, whose window then starts) and waits for its
    /// answer. A full batch leaves at once.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        node: &HttpUpstream,
        req: &Request,
        timeout: Duration,
    ) -> Result<Outcome, UpstreamError> {
        let (reply, answer) = oneshot::channel();
        let full = {
            let mut open = self.open();
            let batch = open.get_or_insert_with(|| {
                let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (batcher, node) = (self.clone(), node.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(batcher.window).await;
                    let due = {
                        let mut open = batcher.open();
                        if open.as_ref().is_some_and(|b| b.id == id) {
                            open.take()
                        } else {
                            None // it filled up and left already
                        }
                    };
                    if let Some(batch) = due {
                        send(&node, batch.waiting).await;
                    }
                });
                Open { id, waiting: Vec::new() }
            });
            batch.waiting.push(Waiting { req: req.clone(), timeout, reply });
            if batch.waiting.len() >= self.max {
                open.take()
            } else {
                None
            }
        };
        if let Some(batch) = full {
            let node = node.clone();
            tokio::spawn(async move { send(&node, batch.waiting).await });
        }
        answer.await.unwrap_or(Err(UpstreamError::InvalidResponse("batch dropped")))
    }
}

/// Sends what met as one batch (alone: a plain call); a node refusing the batch's size gets
/// the calls one by one.
async fn send(node: &HttpUpstream, waiting: Vec<Waiting>) {
    let timeout = waiting.iter().map(|w| w.timeout).max().unwrap_or(Duration::from_secs(10));
    let reqs: Vec<&Request> = waiting.iter().map(|w| &w.req).collect();
    metrics::histogram!("sluice_upstream_batch_size", "upstream" => node.config.name.clone()).record(reqs.len() as f64);
    match node.call_batch_within(&reqs, timeout).await {
        Ok(outcomes) => {
            for (w, outcome) in waiting.into_iter().zip(outcomes) {
                let _ = w.reply.send(outcome);
            }
        }
        Err(UpstreamError::BatchRefused) => {
            let calls = waiting.into_iter().map(|w| async move {
                let outcome = node.call_within(&w.req, w.timeout).await.map(|a| a.outcome);
                let _ = w.reply.send(outcome);
            });
            futures_util::future::join_all(calls).await;
        }
        Err(e) => {
            for w in waiting {
                let _ = w.reply.send(Err(e.clone()));
            }
        }
    }
}
