//! One upstream node over HTTP/1.1 with a keep-alive connection pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use sluice_jsonrpc::{Outcome, Request, ResponseEnvelope};

use crate::batcher::Batcher;
use crate::keepalive::Connections;
use crate::{Answer, Node, UpstreamError};

/// Settings for an [`HttpUpstream`].
#[derive(Debug, Clone)]
pub struct HttpUpstreamConfig {
    /// A short name for logs and metrics.
    pub name: String,
    /// The network this node serves (the `network` label of its metrics).
    pub network: String,
    /// The node's `http://` or `https://` URL.
    pub url: String,
    /// Deadline for one call, from sending to the last byte of the answer.
    pub timeout: Duration,
    /// Largest answer accepted, to keep memory bounded.
    pub max_response_bytes: usize,
}

/// One node reached over HTTP. Calls get fresh numeric ids, so the caller's ids never reach the
/// node and a mismatched answer is detected. Cloning is cheap and shares everything.
#[derive(Clone)]
pub struct HttpUpstream {
    pub(crate) config: HttpUpstreamConfig,
    connections: Arc<Connections>,
    next_id: Arc<AtomicU64>,
    metrics: Arc<std::sync::OnceLock<Handles>>,
    /// Single calls meeting within a window leave as one batch (`batch_window`).
    batcher: Option<Arc<Batcher>>,
}

/// The outcomes calls are counted by: `ok` and each [`UpstreamError::kind`].
const OUTCOMES: [&str; 11] = [
    "ok",
    "unreachable",
    "timeout",
    "http_status",
    "invalid_response",
    "too_large",
    "none_available",
    "budget_exhausted",
    "batch_refused",
    "not_covered",
    "rate_limited",
];

/// Metric handles, registered once per node (on its first call, after the recorder is in).
struct Handles {
    calls: Vec<metrics::Counter>,
    duration: metrics::Histogram,
}

impl HttpUpstream {
    /// Builds a client; fails if the URL is not an `http://` or `https://` URL.
    pub fn new(config: HttpUpstreamConfig) -> Result<Self, String> {
        let uri: hyper::Uri = config.url.parse().map_err(|e| format!("bad upstream URL {:?}: {e}", config.url))?;
        let connect_timeout = config.timeout.min(Duration::from_secs(5));
        let connections = Connections::new(&uri, connect_timeout, 1024, Duration::from_secs(60))?;
        Ok(Self {
            config,
            connections: Arc::new(connections),
            next_id: Arc::new(AtomicU64::new(1)),
            metrics: Arc::default(),
            batcher: None,
        })
    }

    /// Sends single calls that meet within `window` as one JSON-RPC batch of at most `max`
    /// (cross-request batching; for providers that bill or limit per HTTP request).
    pub fn with_batching(mut self, window: Duration, max: usize) -> Self {
        self.batcher = Some(Arc::new(Batcher::new(window, max)));
        self
    }

    fn ids(&self, n: u64) -> u64 {
        self.next_id.fetch_add(n, Ordering::Relaxed)
    }

    /// POSTs a body and returns the answer's bytes, classifying every failure.
    async fn post_within(&self, body: Vec<u8>, timeout: Duration) -> Result<Reply, UpstreamError> {
        // Built in place rather than through `Request::builder` (which allocates a header map
        // and extensions of its own): this runs once per upstream call.
        let mut request = hyper::Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = hyper::Method::POST;
        request.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // The W3C trace context of this exchange's span, when traces are on.
        sluice_telemetry::inject(request.headers_mut());
        let exchange = async {
            let (response, connection) = self.connections.send(request).await.map_err(|e| {
                tracing::warn!(upstream = %self.config.name, error = %e, "upstream request failed");
                if refused(&*e) {
                    UpstreamError::Refused
                } else {
                    UpstreamError::Unreachable
                }
            })?;
            let status = response.status().as_u16();
            // Only a 429 is read for it: a header lookup less on every other answer.
            let retry_after = if status == 429 { retry_after(response.headers()) } else { None };
            let body = Limited::new(response.into_body(), self.config.max_response_bytes)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        UpstreamError::ResponseTooLarge
                    } else {
                        tracing::warn!(upstream = %self.config.name, error = %e, "upstream body failed");
                        UpstreamError::Unreachable
                    }
                })?
                .to_bytes();
            // Read to its end: the connection can carry the next exchange.
            connection.done();
            Ok(Reply { status, retry_after, body })
        };
        tokio::time::timeout(timeout, exchange).await.map_err(|_| UpstreamError::Timeout(timeout))?
    }

    fn record(&self, started: Instant, outcome: &'static str) {
        let handles = self.metrics.get_or_init(|| {
            let (name, network) = (self.config.name.clone(), self.config.network.clone());
            Handles {
                calls: OUTCOMES
                    .iter()
                    .map(|&o| {
                        metrics::counter!("sluice_upstream_calls_total", "network" => network.clone(),
                            "upstream" => name.clone(), "outcome" => o)
                    })
                    .collect(),
                duration: metrics::histogram!("sluice_upstream_call_duration_seconds", "network" => network,
                    "upstream" => name),
            }
        });
        let index = OUTCOMES.iter().position(|&o| o == outcome).unwrap_or(0);
        handles.calls[index].increment(1);
        handles.duration.record(started.elapsed().as_secs_f64());
    }
}

/// A node's HTTP answer.
struct Reply {
    status: u16,
    /// `Retry-After` in seconds, with a 429.
    retry_after: Option<Duration>,
    body: Bytes,
}

/// `Retry-After` as a number of seconds (the HTTP-date form is not honoured: the adaptive rate
/// still backs off).
fn retry_after(headers: &hyper::HeaderMap) -> Option<Duration> {
    let text = headers.get(hyper::header::RETRY_AFTER)?.to_str().ok()?;
    text.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Reads an answer body: a JSON-RPC answer wins over a bad HTTP status, since some providers
/// send errors with 4xx/5xx; anything else is classified.
fn parse_answer<'a, T: serde::Deserialize<'a>>(reply: &'a Reply) -> Result<T, UpstreamError> {
    let (status, body) = (reply.status, &reply.body[..]);
    if status == 429 {
        // Rate limited or shedding: the body answers no particular call (its id is null).
        return Err(UpstreamError::RateLimited(reply.retry_after));
    }
    match serde_json::from_slice(body) {
        Ok(answer) => Ok(answer),
        Err(_) if !(200..300).contains(&status) => Err(UpstreamError::HttpStatus(status)),
        Err(_) => Err(UpstreamError::InvalidResponse("not a JSON-RPC answer")),
    }
}

impl HttpUpstream {
    /// Makes one call with its own deadline (longer for slow methods such as `eth_getLogs`).
    pub async fn call_within(&self, req: &Request, timeout: Duration) -> Result<Answer, UpstreamError> {
        let started = Instant::now();
        let id = self.ids(1);
        let mut body = Vec::with_capacity(64 + req.method.len() + req.params_text().len());
        // The id is formatted on the stack: one allocation less per call.
        req.write_with_id(itoa::Buffer::new().format(id), &mut body);
        let result = match self.post_within(body, timeout).await {
            Ok(reply) => parse_answer::<ResponseEnvelope>(&reply).and_then(|env| {
                if env.numeric_id() != Some(id) {
                    return Err(UpstreamError::InvalidResponse("answer id does not match"));
                }
                env.into_outcome()
                    .map(Answer::upstream)
                    .ok_or(UpstreamError::InvalidResponse("answer has no result or error"))
            }),
            Err(e) => Err(e),
        };
        self.record(started, result.as_ref().map_or_else(UpstreamError::kind, |_| "ok"));
        result
    }
}

impl HttpUpstream {
    /// Makes one call with the configured deadline (for tools and start-up checks; the
    /// gateway reaches nodes through the pool).
    pub async fn call(&self, req: &Request) -> Result<Answer, UpstreamError> {
        self.call_within(req, self.config.timeout).await
    }

    /// Sends calls as one JSON-RPC batch with the configured deadline, one result per call (for
    /// tools such as the load generator).
    pub async fn call_batch(&self, reqs: &[&Request]) -> Vec<Result<Answer, UpstreamError>> {
        match self.call_batch_within(reqs, self.config.timeout).await {
            Ok(outcomes) => outcomes.into_iter().map(|o| o.map(Answer::upstream)).collect(),
            Err(e) => vec![Err(e); reqs.len()],
        }
    }

    /// Sends calls as one JSON-RPC batch (one call alone as a plain call) and places each
    /// answer by its id. `Err` for the whole exchange: transport trouble, or
    /// [`UpstreamError::BatchRefused`] when the node refuses a batch of this size.
    pub async fn call_batch_within(
        &self,
        reqs: &[&Request],
        timeout: Duration,
    ) -> Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError> {
        if reqs.len() == 1 {
            return match self.call_within(reqs[0], timeout).await {
                Ok(answer) => Ok(vec![Ok(answer.outcome)]),
                Err(e) => Err(e),
            };
        }
        let started = Instant::now();
        let first = self.ids(reqs.len() as u64);
        let mut body = Vec::with_capacity(2 + reqs.iter().map(|r| 64 + r.params_text().len()).sum::<usize>());
        body.push(b'[');
        for (i, req) in reqs.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            req.write_with_id(itoa::Buffer::new().format(first + i as u64), &mut body);
        }
        body.push(b']');
        let reply = self.post_within(body, timeout).await;
        let results = reply.as_ref().map_err(Clone::clone).and_then(parse_batch).map(|envelopes| {
            // Nodes may answer a batch in any order: place each answer by its id.
            let mut results = vec![Err(UpstreamError::InvalidResponse("batch answer missing")); reqs.len()];
            for env in envelopes {
                let slot = env.numeric_id().and_then(|id| id.checked_sub(first)).map(|i| i as usize);
                if let Some(slot) = slot.filter(|&i| i < reqs.len()) {
                    results[slot] =
                        env.into_outcome().ok_or(UpstreamError::InvalidResponse("answer has no result or error"));
                }
            }
            results
        });
        let outcome = match &results {
            Err(e) => e.kind(),
            Ok(results) => results.iter().find_map(|r| r.as_ref().err()).map_or("ok", UpstreamError::kind),
        };
        self.record(started, outcome);
        results
    }
}

/// Reads a batch answer. A node that refuses the batch as a whole (HTTP 413, or one error
/// object instead of an array, as geth and most providers answer an over-long batch) gives
/// [`UpstreamError::BatchRefused`], so that the pool can split it.
fn parse_batch(reply: &Reply) -> Result<Vec<ResponseEnvelope<'_>>, UpstreamError> {
    if reply.status == 413 {
        return Err(UpstreamError::BatchRefused);
    }
    let body = &reply.body[..];
    match parse_answer::<Vec<ResponseEnvelope>>(reply) {
        Err(UpstreamError::InvalidResponse(_)) | Err(UpstreamError::HttpStatus(_))
            if serde_json::from_slice::<ResponseEnvelope>(body).is_ok_and(|e| e.numeric_id().is_none()) =>
        {
            Err(UpstreamError::BatchRefused)
        }
        other => other,
    }
}

#[async_trait]
impl Node for HttpUpstream {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn closed_by_node(&self) -> u64 {
        self.connections.closed_by_node()
    }

    fn wake_on_close(&self, wake: Arc<tokio::sync::Notify>) {
        self.connections.wake_on_close(wake);
    }

    async fn listening(&self) -> Option<bool> {
        self.connections.listening(self.config.timeout.min(Duration::from_secs(5))).await
    }

    fn timeout(&self) -> Duration {
        self.config.timeout
    }

    async fn send(
        &self,
        reqs: &[&Request],
        timeout: Duration,
    ) -> Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError> {
        match (&self.batcher, reqs) {
            (Some(batcher), [one]) => match batcher.submit(self, one, timeout).await {
                // The exchange as a whole failed: the same for this call as if it went alone.
                Err(e) if !matches!(e, UpstreamError::InvalidResponse("batch answer missing")) => Err(e),
                outcome => Ok(vec![outcome]),
            },
            _ => self.call_batch_within(reqs, timeout).await,
        }
    }
}

/// Whether a failure was a refused connection: nothing listens at the node's address.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused) {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &'static [u8]) -> Reply {
        Reply { status, retry_after: None, body: Bytes::from_static(body) }
    }

    #[test]
    fn a_refused_batch_is_told_apart_from_a_broken_answer() {
        let one_error = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"batch too large"}}"#;
        assert_eq!(parse_batch(&reply(200, one_error)).unwrap_err(), UpstreamError::BatchRefused);
        assert_eq!(parse_batch(&reply(413, b"")).unwrap_err(), UpstreamError::BatchRefused);
        assert_eq!(
            parse_batch(&reply(200, b"nonsense")).unwrap_err(),
            UpstreamError::InvalidResponse("not a JSON-RPC answer")
        );
        assert_eq!(parse_batch(&reply(500, b"")).unwrap_err(), UpstreamError::HttpStatus(500));
        assert_eq!(parse_batch(&reply(200, br#"[{"jsonrpc":"2.0","id":1,"result":"0x1"}]"#)).unwrap().len(), 1);
    }

    #[test]
    fn a_429_is_a_rate_limit_with_its_retry_after() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(hyper::header::RETRY_AFTER, "3".parse().unwrap());
        let limited = Reply { status: 429, retry_after: retry_after(&headers), body: Bytes::new() };
        assert_eq!(
            parse_answer::<ResponseEnvelope>(&limited).unwrap_err(),
            UpstreamError::RateLimited(Some(Duration::from_secs(3)))
        );
        headers.insert(hyper::header::RETRY_AFTER, "Wed, 21 Oct 2026 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }
}
