//! A fault-injecting *fake* upstream, for failures a real node will not produce on demand
//! (hanging, answering garbage, answering slowly), a relay in front of a real node that counts
//! or alters calls, and a fixed-answer stand-in (`Slow`, `Stall`) where sluice's own queueing or
//! speed is measured. Answers checked for correctness always come from real anvil.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the fake upstream does with each request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Accepts the connection, reads the request, never answers.
    Hang,
    /// Answers with this HTTP status and body.
    Garbage(u16, &'static str),
    /// Promises a longer body than it sends, then closes the connection.
    Truncated,
    /// Answers `{"result":"0x1"}` with the request's id, after a delay.
    Slow(Duration),
    /// Answers `{"result":"0x1"}` at once, except that requests arriving between `at` and
    /// `at + stall` after the server started are held until the stall ends.
    Stall {
        /// When the stall starts, after spawn.
        at: Duration,
        /// How long it lasts.
        stall: Duration,
    },
    /// Relays to a real node after a delay, except bodies mentioning `fail_method`, which get
    /// HTTP 502 after the same delay. Counts requests by method for coalescing tests.
    Relay {
        /// The real node's URL.
        to: String,
        /// Added before answering.
        delay: Duration,
        /// A method to fail.
        fail_method: Option<&'static str>,
    },
    /// Relays to a real node, except that every `every`-th request (counting from the first)
    /// gets the next fault of a cycle: connection closed without an answer, a non-JSON body,
    /// HTTP 500, a truncated answer. Every body is recorded.
    FaultyRelay {
        /// The real node's URL.
        to: String,
        /// One request in this many is faulted.
        every: usize,
    },
    /// A node with a fixed capacity: answers `{"result":"0x1"}` after `service`, at most
    /// `slots.available_permits()` requests at a time; the rest wait their turn (build it
    /// with [`Fault::capacity`]).
    Capacity {
        /// Time each request takes.
        service: Duration,
        /// Requests served at once.
        slots: Arc<tokio::sync::Semaphore>,
    },
    /// Relays to a real node within a provider's rate ([`RateWindow`]); above it, HTTP 429 with
    /// a JSON-RPC error body (and `Retry-After` when `retry_after` is set).
    RateLimited {
        /// The real node's URL.
        to: String,
        /// The limit and the log.
        window: Arc<RateWindow>,
        /// Seconds sent in `Retry-After`.
        retry_after: Option<u64>,
    },
    /// Relays to a real node and passes each answer (of a single call, or each call of a batch)
    /// with its request through `alter`: a node that lies, or answers `null` where it should
    /// not. Every body is recorded (see `requests_for`).
    Alter {
        /// The real node's URL.
        to: String,
        /// Changes an answer in place, given its request.
        alter: fn(&serde_json::Value, &mut serde_json::Value),
    },
    /// Relays to a real node, except single `eth_getLogs` calls spanning more than
    /// `max_range` blocks, refused as providers do ("query returned more than 10000
    /// results"). Every body is recorded (see `requests_for`).
    LogsLimit {
        /// The real node's URL.
        to: String,
        /// The widest range answered.
        max_range: u64,
    },
}

/// A provider's rate limit, for [`Fault::RateLimited`]: at most `limit` requests in each
/// wall-clock second (fixed windows, as many providers count), the limit changeable while
/// running; every request logged with its time and whether it was relayed.
#[derive(Debug)]
pub struct RateWindow {
    limit: AtomicUsize,
    window: std::sync::Mutex<(std::time::Instant, usize)>,
    log: std::sync::Mutex<Vec<(std::time::Instant, bool)>>,
}

impl RateWindow {
    /// A limit of `per_second`.
    pub fn new(per_second: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicUsize::new(per_second),
            window: std::sync::Mutex::new((std::time::Instant::now(), 0)),
            log: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Changes the limit.
    pub fn set_limit(&self, per_second: usize) {
        self.limit.store(per_second, Ordering::SeqCst);
    }

    fn admit(&self) -> bool {
        let now = std::time::Instant::now();
        let mut window = self.window.lock().unwrap();
        if now.duration_since(window.0) >= Duration::from_secs(1) {
            *window = (now, 0);
        }
        let admitted = window.1 < self.limit.load(Ordering::SeqCst);
        if admitted {
            window.1 += 1;
        }
        self.log.lock().unwrap().push((now, admitted));
        admitted
    }

    /// Requests relayed and refused (429) from `since` on.
    pub fn counts_since(&self, since: std::time::Instant) -> (usize, usize) {
        let log = self.log.lock().unwrap();
        let recent = log.iter().filter(|(at, _)| *at >= since);
        recent
            .fold((0, 0), |(ok, refused), (_, admitted)| if *admitted { (ok + 1, refused) } else { (ok, refused + 1) })
    }
}

/// A fake upstream on a loopback port; stops when dropped.
pub struct FakeUpstream {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    requests: Arc<AtomicUsize>,
    bodies: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Fault {
    /// A node serving `concurrent` requests at a time, each taking `service`.
    pub fn capacity(service: Duration, concurrent: usize) -> Fault {
        Fault::Capacity { service, slots: Arc::new(tokio::sync::Semaphore::new(concurrent)) }
    }
}

impl FakeUpstream {
    /// Starts serving `fault` (call from inside a tokio runtime).
    pub async fn spawn(fault: Fault) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (counter, log) = (requests.clone(), bodies.clone());
        let started = tokio::time::Instant::now();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (fault, counter, log) = (fault.clone(), counter.clone(), log.clone());
                tokio::spawn(async move {
                    let _ = answer(stream, fault, counter, log, started).await;
                });
            }
        });
        Self { url, requests, bodies, task }
    }

    /// How many requests mentioned `method` (a batch counts once per request).
    pub fn requests_for(&self, method: &str) -> usize {
        let needle = format!("\"{method}\"");
        self.bodies.lock().unwrap().iter().filter(|b| b.contains(&needle)).count()
    }

    /// How many requests contain `text` (case-insensitive).
    pub fn requests_with(&self, text: &str) -> usize {
        let needle = text.to_ascii_lowercase();
        self.bodies.lock().unwrap().iter().filter(|b| b.to_ascii_lowercase().contains(&needle)).count()
    }

    /// The method of every JSON-RPC call that arrived, in order: each call of a batch counts,
    /// as a provider's meter counts them.
    pub fn methods(&self) -> Vec<String> {
        self.bodies.lock().unwrap().iter().flat_map(|b| crate::methods_in(b)).collect()
    }

    /// How many requests arrived.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    mut stream: TcpStream,
    fault: Fault,
    counter: Arc<AtomicUsize>,
    log: Arc<std::sync::Mutex<Vec<String>>>,
    started: tokio::time::Instant,
) -> std::io::Result<()> {
    let body = read_request(&mut stream).await?;
    let n = counter.fetch_add(1, Ordering::SeqCst);
    log.lock().unwrap().push(String::from_utf8_lossy(&body).into_owned());
    let ok = |body: &[u8]| {
        let id = serde_json::from_slice::<serde_json::Value>(body).ok().map(|v| v["id"].clone()).unwrap_or_default();
        (200, serde_json::json!({"jsonrpc": "2.0", "id": id, "result": "0x1"}).to_string())
    };
    let (status, payload) = match fault {
        Fault::Truncated => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n";
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(br#"{"jsonrpc":"2.0","id":1,"res"#).await?;
            return stream.shutdown().await;
        }
        Fault::FaultyRelay { every, .. } if every > 0 && n % every == every - 1 => match (n / every) % 4 {
            0 => return stream.shutdown().await,
            1 => (200, "<html>not json</html>".to_owned()),
            2 => (500, "internal server error".to_owned()),
            _ => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n";
                stream.write_all(head.as_bytes()).await?;
                stream.write_all(br#"[{"jsonrpc":"2.0","id":1,"res"#).await?;
                return stream.shutdown().await;
            }
        },
        Fault::FaultyRelay { to, .. } => relay(&to, body).await,
        Fault::Alter { to, alter } => {
            let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let (status, text) = relay(&to, body).await;
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(mut answer) => {
                    match (&request, &mut answer) {
                        (serde_json::Value::Array(reqs), serde_json::Value::Array(answers)) => {
                            for a in answers.iter_mut() {
                                if let Some(req) = reqs.iter().find(|r| r["id"] == a["id"]) {
                                    alter(req, a);
                                }
                            }
                        }
                        (req, answer) => alter(req, answer),
                    }
                    (status, answer.to_string())
                }
                Err(_) => (status, text),
            }
        }
        Fault::Stall { at, stall } => {
            let now = started.elapsed();
            if now >= at && now < at + stall {
                tokio::time::sleep_until(started + at + stall).await;
            }
            ok(&body)
        }
        Fault::Relay { to, delay, fail_method } => {
            tokio::time::sleep(delay).await;
            let text = String::from_utf8_lossy(&body);
            if fail_method.is_some_and(|m| text.contains(&format!("\"{m}\""))) {
                (502, "bad gateway".to_owned())
            } else {
                relay(&to, body).await
            }
        }
        Fault::RateLimited { to, window, retry_after } => {
            if window.admit() {
                relay(&to, body).await
            } else {
                let payload = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32005,"message":"rate limit exceeded"}}"#;
                let retry = retry_after.map(|s| format!("retry-after: {s}\r\n")).unwrap_or_default();
                let head = format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n{retry}content-length: {}\r\nconnection: close\r\n\r\n",
                    payload.len()
                );
                stream.write_all(head.as_bytes()).await?;
                stream.write_all(payload.as_bytes()).await?;
                return stream.shutdown().await;
            }
        }
        Fault::LogsLimit { to, max_range } => {
            let refused = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|req| {
                if req["method"] != "eth_getLogs" {
                    return None;
                }
                let quantity =
                    |v: &serde_json::Value| u64::from_str_radix(v.as_str()?.trim_start_matches("0x"), 16).ok();
                let filter = &req["params"][0];
                let (from, to) = (quantity(&filter["fromBlock"])?, quantity(&filter["toBlock"])?);
                (to - from + 1 > max_range).then(|| req["id"].clone())
            });
            match refused {
                Some(id) => (
                    200,
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32005, "message": "query returned more than 10000 results"}})
                        .to_string(),
                ),
                None => relay(&to, body).await,
            }
        }
        Fault::Capacity { service, slots } => {
            let _slot = slots.acquire().await.expect("never closed");
            tokio::time::sleep(service).await;
            ok(&body)
        }
        Fault::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return Ok(());
        }
        Fault::Garbage(status, text) => (status, text.to_owned()),
        Fault::Slow(delay) => {
            tokio::time::sleep(delay).await;
            ok(&body)
        }
    };
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        payload.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(payload.as_bytes()).await?;
    stream.shutdown().await
}

/// Forwards a body to the real node; its status and answer.
async fn relay(to: &str, body: Vec<u8>) -> (u16, String) {
    let relayed = reqwest::Client::new().post(to).header("content-type", "application/json").body(body).send().await;
    match relayed {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(_) => (502, "relay failed".to_owned()),
    }
}

/// Reads one HTTP/1.1 request and returns its body.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    Ok(read_http_request(stream, &mut buf).await?.map(|(_, body)| body).unwrap_or_default())
}

/// Reads one HTTP/1.1 request from a connection that may carry more (what follows it stays in
/// `buf` for the next call): its head, lowercased, and its body; `None` once the peer closes.
pub async fn read_http_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                if stream.read_buf(buf).await? == 0 {
                    return Ok(None);
                }
            }
            let body = buf[end + 4..end + 4 + length].to_vec();
            buf.drain(..end + 4 + length);
            return Ok(Some((head, body)));
        }
        if stream.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}
