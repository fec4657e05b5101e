//! The keep-alive HTTP/1.1 connections to one node.
//!
//! hyper-util's general client serves any number of origins, and pays for it on every
//! request: it hashes a pool key, takes the pool's lock to check a connection out and again
//! to put it back, clones its connector for a connection it will usually not make, formats a
//! `Host` header, and, when the connection is not ready for its next request as the answer's
//! head arrives (its body still to read, the usual case), spawns a task to wait for it. A node
//! has one origin, and an exchange reads its whole answer before it ends, so here a connection
//! goes back onto a stack once its answer has been read; the next exchange to take it waits,
//! in line, for hyper to be ready for the next request (at once, nearly always).
//!
//! Idle connections are kept per serving lane ([`crate::lane`]): a connection's task runs on
//! the thread that opened it, so an exchange takes only connections its own thread drives.
//!
//! A connection whose answer was not read to its end (a timeout, an answer over the size
//! limit, a broken body) is dropped, never reused. A pooled connection the node has closed
//! meanwhile is skipped, and a request it refused before sending anything is sent on
//! another connection, as hyper-util does.
//!
//! A connection the node closes (not sluice: sluice retires the ones it stops using) is
//! counted, and whoever asked is woken ([`Connections::wake_on_close`]): a node that dies
//! closes every connection at once, so the pool can look at it that instant instead of at its
//! next probe round or its next client's failed call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, CONTENT_LENGTH, HOST};
use hyper::{Request, Response, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use crate::lane::{self, LANE_SLOTS};

/// The body every exchange sends: one JSON-RPC call or batch, already serialized.
type Body = Full<Bytes>;

/// Why an exchange could not be had; the caller classifies and logs it.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The idle keep-alive connections to one node, and how to make more. Shared by reference
/// (each [`HttpUpstream`](crate::HttpUpstream) holds one in an `Arc`).
pub struct Connections {
    connector: HttpsConnector<HttpConnector>,
    /// Where connections are made to (scheme, host, port).
    origin: Uri,
    /// What requests ask for: the URL's path and query, in origin form.
    target: Uri,
    /// The `Host` header every request carries (HTTP/1.1 requires it).
    host: HeaderValue,
    /// Idle connections per lane, the most recently used last: taken from the back (a warm
    /// socket), pruned from the front.
    idle: Box<[Mutex<VecDeque<Idle>>]>,
    max_idle: usize,
    idle_timeout: Duration,
    /// Connections the node closed.
    closes: Arc<NodeCloses>,
}

/// Connections the node closed, and whom to wake when one is.
#[derive(Default)]
struct NodeCloses {
    count: AtomicU64,
    wake: OnceLock<Arc<tokio::sync::Notify>>,
}

/// A connection's request handle. Dropped by sluice while the connection is still open (idle
/// too long, an answer not read to its end), it marks the connection retired, so that its end
/// is not taken for the node's doing.
struct Conn {
    sender: SendRequest<Body>,
    retired: Arc<AtomicBool>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.sender.is_closed() {
            self.retired.store(true, Ordering::Release);
        }
    }
}

struct Idle {
    sender: Conn,
    since: Instant,
    /// The node's close count when the connection was parked: once the node has closed any
    /// connection since, this one may be dead too and not known yet (a killed node's sockets
    /// close at once, but a write on one can still succeed), so it is not reused.
    closes: u64,
}

impl Idle {
    fn usable(&self, now: Instant, idle_timeout: Duration, closes: u64) -> bool {
        !self.sender.sender.is_closed() && now.duration_since(self.since) < idle_timeout && self.closes == closes
    }
}

/// A connection lent to one exchange. [`Lease::done`] puts it back once the answer has been
/// read to its end; dropped without that, the connection is closed.
pub struct Lease<'a> {
    sender: Option<Conn>,
    connections: &'a Connections,
}

impl Lease<'_> {
    /// The answer was read whole: the connection can carry the next exchange.
    pub fn done(mut self) {
        if let Some(sender) = self.sender.take() {
            self.connections.put(sender);
        }
    }
}

impl Connections {
    /// Connections to the node at `url` (`http://` or `https://`, with the webpki roots or the
    /// certificate file set for upstreams), at most `max_idle` kept idle per lane, each for at most
    /// `idle_timeout`.
    pub fn new(url: &Uri, connect_timeout: Duration, max_idle: usize, idle_timeout: Duration) -> Result<Self, String> {
        if !matches!(url.scheme_str(), Some("http") | Some("https")) {
            return Err(format!("upstream URL {url}: use http:// or https://"));
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config((*crate::tls::client_config()).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let name = url.host().ok_or_else(|| format!("upstream URL {url} has no host"))?;
        // As hyper-util writes it: no user info, and the port only when not the scheme's own.
        let host = match (url.port_u16(), url.scheme_str()) {
            (Some(80), Some("http")) | (Some(443), Some("https")) | (None, _) => name.to_owned(),
            (Some(port), _) => format!("{name}:{port}"),
        };
        let host = HeaderValue::from_str(&host).map_err(|e| format!("upstream URL {url}: {e}"))?;
        let path = url.path_and_query().map_or("/", |p| p.as_str());
        let target: Uri = path.parse().map_err(|e| format!("upstream URL {url}: {e}"))?;
        Ok(Self {
            connector,
            origin: url.clone(),
            target,
            host,
            idle: (0..LANE_SLOTS).map(|_| Mutex::default()).collect(),
            max_idle,
            idle_timeout,
            closes: Arc::default(),
        })
    }

    /// Sends `request` (its URI and `Host` are set here) and gives the answer with the
    /// connection it came on.
    pub async fn send(
        &self,
        mut request: Request<Body>,
    ) -> Result<(Response<hyper::body::Incoming>, Lease<'_>), Error> {
        *request.uri_mut() = self.target.clone();
        request.headers_mut().insert(HOST, self.host.clone());
        let length = hyper::body::Body::size_hint(request.body()).exact();
        if let Some(length) = length.and_then(|n| usize::try_from(n).ok()) {
            request.headers_mut().insert(CONTENT_LENGTH, content_length(length));
        }
        // Each pass takes an idle connection (fewer each time) or makes a new one, which ends
        // the loop either way.
        loop {
            let (mut sender, reused) = match self.take() {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            if let Err(e) = sender.sender.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            match sender.sender.try_send_request(request).await {
                Ok(response) => return Ok((response, Lease { sender: Some(sender), connections: self })),
                Err(mut e) => match e.take_message() {
                    // Not sent: the node closed a kept-alive connection as it was taken.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    /// This thread's lane's idle connections.
    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle[lane::current()].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection of this lane still open and not idle for too
    /// long.
    fn take(&self) -> Option<Conn> {
        let now = Instant::now();
        let closes = self.closed_by_node();
        let mut idle = self.idle();
        while let Some(entry) = idle.pop_back() {
            if entry.usable(now, self.idle_timeout, closes) {
                return Some(entry.sender);
            }
        }
        None
    }

    fn put(&self, sender: Conn) {
        if sender.sender.is_closed() || self.max_idle == 0 {
            return;
        }
        let now = Instant::now();
        let closes = self.closed_by_node();
        let mut idle = self.idle();
        // Stale entries leave from the front as connections come back: no sweeper task.
        while idle.front().is_some_and(|oldest| !oldest.usable(now, self.idle_timeout, closes)) {
            idle.pop_front();
        }
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back(Idle { sender, since: now, closes });
    }

    /// Opens a connection (TLS for `https://`) and starts the task that drives it; the task
    /// ends when the connection closes or its last handle is gone.
    async fn connect(&self) -> Result<Conn, Error> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        let stream = connector.call(self.origin.clone()).await?;
        let (sender, connection) = http1::handshake(stream).await?;
        let retired = Arc::new(AtomicBool::new(false));
        let (by_us, closes) = (retired.clone(), self.closes.clone());
        tokio::spawn(async move {
            // Broken (reset, cut mid-answer) is the node's doing even if sluice let go of the
            // connection meanwhile; a clean end is only if sluice did not close it.
            let broken = match connection.await {
                Ok(()) => false,
                Err(e) => {
                    tracing::debug!(error = %e, "upstream connection ended");
                    true
                }
            };
            if broken || !by_us.load(Ordering::Acquire) {
                closes.count.fetch_add(1, Ordering::Relaxed);
                if let Some(wake) = closes.wake.get() {
                    wake.notify_one();
                }
            }
        });
        Ok(Conn { sender, retired })
    }

    /// Whether anything listens at the node's address: a TCP connection made and dropped, no
    /// request sent. `Some(false)` when refused; `None` when it cannot tell (a timeout, a name
    /// that does not resolve).
    pub async fn listening(&self, within: Duration) -> Option<bool> {
        let host = self.origin.host()?.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = self.origin.port_u16().unwrap_or(if self.origin.scheme_str() == Some("https") { 443 } else { 80 });
        match tokio::time::timeout(within, tokio::net::TcpStream::connect((host.as_str(), port))).await {
            Ok(Ok(_)) => Some(true),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(false),
            _ => None,
        }
    }

    /// How many connections the node has closed so far (sluice's own retirements aside).
    pub fn closed_by_node(&self) -> u64 {
        self.closes.count.load(Ordering::Relaxed)
    }

    /// Wakes `wake` whenever the node closes a connection (the first caller's only).
    pub fn wake_on_close(&self, wake: Arc<tokio::sync::Notify>) {
        let _ = self.closes.wake.set(wake);
    }

    /// Idle connections this lane holds now, and how many of them are still open (for tests).
    #[cfg(test)]
    fn idle_counts(&self) -> (usize, usize) {
        let idle = self.idle();
        (idle.len(), idle.iter().filter(|i| !i.sender.sender.is_closed()).count())
    }
}

/// Lengths below this have their `Content-Length` text in [`DIGITS`].
const TABLED: usize = 4096;

/// The decimal text of every length below [`TABLED`], built at compile time.
static DIGITS: [([u8; 4], u8); TABLED] = digits_table();

const fn digits_table() -> [([u8; 4], u8); TABLED] {
    let mut table = [([0u8; 4], 0u8); TABLED];
    let mut n = 0;
    while n < TABLED {
        let (mut width, mut rest) = (1, n / 10);
        while rest > 0 {
            width += 1;
            rest /= 10;
        }
        let (mut digits, mut i, mut rest) = ([0u8; 4], width, n);
        while i > 0 {
            i -= 1;
            digits[i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        table[n] = (digits, width as u8);
        n += 1;
    }
    table
}

/// `Content-Length` for a body of `length` bytes. hyper formats the body's length into a fresh
/// allocation (two, with the header value's) on every request that has no such header; below
/// 4 KiB (every single call, most batches) the text is a static slice instead.
fn content_length(length: usize) -> HeaderValue {
    match DIGITS.get(length).map(|(digits, width)| std::str::from_utf8(&digits[..usize::from(*width)])) {
        Some(Ok(text)) => HeaderValue::from_static(text),
        _ => HeaderValue::from(length),
    }
}

#[cfg(test)]
mod tests {
    //! Against a stand-in HTTP/1.1 server on loopback (a fake, so that connections can be
    //! counted and closed at will); answers from real nodes are tested through the gateway.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use sluice_testkit::read_http_request;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn content_length_text_is_the_length_in_decimal_in_and_beyond_the_table() {
        for n in (0..TABLED + 10).chain([10_000, 123_456_789]) {
            assert_eq!(content_length(n), HeaderValue::from(n), "{n}");
        }
    }

    /// A stand-in node: answers each request with `{"ok":true}`, records each request head,
    /// counts connections; with `one_per_connection`, closes a connection after one answer
    /// (without saying so in the answer, as a node ending an idle keep-alive does).
    struct StandIn {
        url: Uri,
        accepted: Arc<AtomicUsize>,
        heads: Arc<Mutex<Vec<String>>>,
    }

    impl StandIn {
        async fn start(one_per_connection: bool) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/rpc?x=1", listener.local_addr().unwrap()).parse().unwrap();
            let accepted = Arc::new(AtomicUsize::new(0));
            let heads = Arc::new(Mutex::new(Vec::new()));
            let (count, record) = (accepted.clone(), heads.clone());
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    count.fetch_add(1, Ordering::SeqCst);
                    let record = record.clone();
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        while let Ok(Some((head, _))) = read_http_request(&mut socket, &mut buf).await {
                            record.lock().unwrap().push(head);
                            let body = r#"{"ok":true}"#;
                            let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                            if socket.write_all(answer.as_bytes()).await.is_err() || one_per_connection {
                                return;
                            }
                        }
                    });
                }
            });
            Self { url, accepted, heads }
        }

        fn connections(&self) -> Connections {
            Connections::new(&self.url, Duration::from_secs(5), 16, Duration::from_secs(60)).unwrap()
        }
    }

    fn request() -> Request<Body> {
        let mut request = Request::new(Full::new(Bytes::from_static(b"{}")));
        *request.method_mut() = hyper::Method::POST;
        request
    }

    /// One exchange read to its end, its connection put back.
    async fn exchange(connections: &Connections) -> Bytes {
        let (response, lease) = connections.send(request()).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        lease.done();
        body
    }

    /// Waits (bounded) until no idle connection is open any more.
    async fn until_idle_closed(connections: &Connections) {
        for _ in 0..1000 {
            if connections.idle_counts().1 == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the idle connection never closed: {:?}", connections.idle_counts());
    }

    #[tokio::test]
    async fn exchanges_one_after_another_share_one_connection_with_the_urls_target_and_host() {
        let node = StandIn::start(false).await;
        let connections = node.connections();
        for _ in 0..50 {
            assert_eq!(&exchange(&connections).await[..], br#"{"ok":true}"#);
        }
        assert_eq!(node.accepted.load(Ordering::SeqCst), 1);
        assert_eq!(connections.idle_counts(), (1, 1));
        let head = node.heads.lock().unwrap()[0].clone();
        assert!(head.starts_with("post /rpc?x=1 http/1.1\r\n"), "{head}");
        let port = node.url.port_u16().unwrap();
        assert!(head.contains(&format!("\r\nhost: 127.0.0.1:{port}\r\n")), "{head}");
    }

    #[tokio::test]
    async fn concurrent_exchanges_open_one_connection_each_and_keep_them() {
        let node = StandIn::start(false).await;
        let connections = node.connections();
        let answers = futures_util::future::join_all((0..8).map(|_| exchange(&connections))).await;
        assert!(answers.iter().all(|a| &a[..] == br#"{"ok":true}"#));
        let opened = node.accepted.load(Ordering::SeqCst);
        assert!((1..=8).contains(&opened), "{opened}");
        assert_eq!(connections.idle_counts().0, opened);
        // Taken again, not opened again.
        let _ = futures_util::future::join_all((0..opened).map(|_| exchange(&connections))).await;
        assert_eq!(node.accepted.load(Ordering::SeqCst), opened);
    }

    #[tokio::test]
    async fn a_connection_the_node_closed_while_idle_is_passed_over() {
        let node = StandIn::start(true).await;
        let connections = node.connections();
        exchange(&connections).await;
        until_idle_closed(&connections).await;
        assert_eq!(&exchange(&connections).await[..], br#"{"ok":true}"#);
        assert_eq!(node.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_whose_answer_was_not_read_to_its_end_is_not_reused() {
        let node = StandIn::start(false).await;
        let connections = node.connections();
        let (response, lease) = connections.send(request()).await.unwrap();
        drop((response, lease));
        assert_eq!(connections.idle_counts(), (0, 0));
        exchange(&connections).await;
        assert_eq!(node.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn no_more_than_max_idle_connections_are_kept() {
        let node = StandIn::start(false).await;
        let connections = node.connections();
        let leases = futures_util::future::join_all((0..20).map(|_| connections.send(request()))).await;
        assert_eq!(node.accepted.load(Ordering::SeqCst), 20);
        for result in leases {
            let (response, lease) = result.unwrap();
            response.into_body().collect().await.unwrap();
            lease.done();
        }
        assert_eq!(connections.idle_counts().0, 16);
    }

    /// A thread of its own marked as lane `lane`, with a runtime of its own (as a gateway lane
    /// is), that runs `exchanges` exchanges, reports what the lane then holds idle, and keeps
    /// its runtime (so its connections stay open) until the returned sender is dropped.
    fn on_lane(
        connections: &Arc<Connections>,
        lane: usize,
        exchanges: usize,
    ) -> ((usize, usize), tokio::sync::oneshot::Sender<()>) {
        let connections = connections.clone();
        let (report, reported) = std::sync::mpsc::channel();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            crate::lane::enter(lane);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                for _ in 0..exchanges {
                    assert_eq!(&exchange(&connections).await[..], br#"{"ok":true}"#);
                }
                report.send(connections.idle_counts()).unwrap();
                // Driving the lane's connections until told to stop.
                let _ = finished.await;
            });
        });
        (reported.recv().unwrap(), finish)
    }

    // Multi-threaded: the stand-in node runs on the workers while this thread waits for lanes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_lane_reuses_only_the_connections_it_opened() {
        let node = StandIn::start(false).await;
        let connections = Arc::new(node.connections());
        // A lane's connection task runs on the lane's runtime; another lane must not take it
        // (it would work, but every exchange would then wake the other thread twice).
        let (held, _one) = on_lane(&connections, 1, 3);
        assert_eq!(held, (1, 1));
        assert_eq!(node.accepted.load(Ordering::SeqCst), 1);
        let (held, _two) = on_lane(&connections, 2, 3);
        assert_eq!(held, (1, 1));
        assert_eq!(node.accepted.load(Ordering::SeqCst), 2, "lane 2 opened its own, lane 1's still open");
        // This thread is no lane: it has been lent nothing yet, and opens its own too.
        assert_eq!(connections.idle_counts(), (0, 0));
        exchange(&connections).await;
        assert_eq!(node.accepted.load(Ordering::SeqCst), 3);
    }
}
