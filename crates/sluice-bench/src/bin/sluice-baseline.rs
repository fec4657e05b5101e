//! `sluice-baseline`: the machine's own limits, measured beside sluice in the same run. A
//! benchmark tool, not part of the `sluice` binary.
//!
//! * `sluice-baseline forward --to URL`: a bare HTTP forwarder (hyper, keep-alive both ways),
//!   body bytes in and out, no JSON parsing: what any gateway costs at least. It reaches the
//!   node through the same keep-alive connections as sluice (`sluice_upstream::Connections`);
//!   with `--general-client`, through hyper-util's general client instead, which costs more
//!   per request (see docs/benchmarks-wrk.md).
//! * `sluice-baseline fixed --body-file F`: a bare server answering every request with the same
//!   bytes: what answering from memory costs at least.
//!
//! * `sluice-baseline fanout --node WS_URL`: a bare WebSocket fan-out: it subscribes once to the
//!   node's `newHeads` and to logs of `sluice bench ws`'s emitter, and writes each event to every
//!   client under that client's subscription id, from the client's own task: what delivering a
//!   notification to N sockets costs at least (`sluice bench ws` against it).
//!
//! * `sluice-baseline count --to URL`: a counting relay for `bench/idle.sh`: forwards like
//!   `forward` and counts JSON-RPC calls by method (each call of a batch, as a provider's meter
//!   does); `GET /count` answers `{"calls": N, "methods": {...}}`. Not a baseline: a meter.
//!
//! Each prints `baseline listening on http://ADDR` once it accepts connections.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_upstream::Connections;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(about = "Bare baselines for sluice's benchmarks: a forwarder and a fixed-body server")]
struct Cli {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0", global = true)]
    listen: SocketAddr,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Forward every request body to URL and its answer back, bytes only.
    Forward {
        /// The node, `http://HOST:PORT`.
        #[arg(long)]
        to: String,
        /// Reach the node through hyper-util's general client (pool keyed by origin) rather
        /// than sluice's keep-alive connections to one node.
        #[arg(long)]
        general_client: bool,
    },
    /// Answer every request with the bytes of FILE.
    Fixed {
        /// The answer.
        #[arg(long)]
        body_file: PathBuf,
        /// Put the request's `"id"` value in place of the answer's (a byte scan, no JSON
        /// parsing), for generators that check ids; without it the bytes are sent as they are.
        #[arg(long)]
        echo_id: bool,
    },
    /// Forward like `forward`, counting JSON-RPC calls by method; `GET /count` reports them.
    Count {
        /// The node, `http://HOST:PORT`.
        #[arg(long)]
        to: String,
    },
    /// Fan the node's newHeads (and the bench emitter's logs) out to every WebSocket client.
    Fanout {
        /// The node's WebSocket, `ws://HOST:PORT`.
        #[arg(long)]
        node: String,
    },
}

/// The same allocator as `sluice`, so that the baselines differ from it only in what they do.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Files are read before the listening line: whoever started this may remove them as soon
    // as it sees that line (`sluice bench report` does).
    let fixed_body = match &cli.what {
        What::Fixed { body_file, .. } => Bytes::from(std::fs::read(body_file)?),
        _ => Bytes::new(),
    };
    let listener = TcpListener::bind(cli.listen).await?;
    println!("baseline listening on http://{}", listener.local_addr()?);
    match cli.what {
        What::Forward { to, general_client: false } => {
            let connections = Arc::new(
                Connections::new(&to.parse()?, Duration::from_secs(5), 1024, Duration::from_secs(60))
                    .map_err(anyhow::Error::msg)?,
            );
            serve(listener, move |req: Request<Incoming>| {
                let connections = connections.clone();
                async move {
                    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    let mut forwarded = Request::new(Full::new(body));
                    *forwarded.method_mut() = hyper::Method::POST;
                    forwarded.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    let answer = match connections.send(forwarded).await {
                        Ok((response, lease)) => {
                            let body = response.into_body().collect().await.map(|b| b.to_bytes()).ok();
                            if body.is_some() {
                                lease.done();
                            }
                            body
                        }
                        Err(_) => None,
                    };
                    Ok::<_, Infallible>(answer.map_or_else(bad_gateway, json))
                }
            })
            .await
        }
        What::Forward { to, general_client: true } => {
            let uri: hyper::Uri = to.parse()?;
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            let client: Client<_, Full<Bytes>> =
                Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build(connector);
            let state = Arc::new((client, uri));
            serve(listener, move |req: Request<Incoming>| {
                let state = state.clone();
                async move {
                    let (client, uri) = &*state;
                    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    Ok::<_, Infallible>(relay(client, uri, body).await)
                }
            })
            .await
        }
        What::Count { to } => {
            let uri: hyper::Uri = to.parse()?;
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
            let counts = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
            let state = Arc::new((client, uri, counts));
            serve(listener, move |req: Request<Incoming>| {
                let state = state.clone();
                async move {
                    let (client, uri, counts) = &*state;
                    if req.method() == hyper::Method::GET && req.uri().path() == "/count" {
                        let counts = counts.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        let calls: u64 = counts.values().sum();
                        let report = serde_json::json!({ "calls": calls, "methods": counts });
                        return Ok::<_, Infallible>(json(Bytes::from(report.to_string())));
                    }
                    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    {
                        let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
                        for method in methods_in(&body) {
                            *counts.entry(method).or_default() += 1;
                        }
                    }
                    Ok::<_, Infallible>(relay(client, uri, body).await)
                }
            })
            .await
        }
        What::Fanout { node } => fanout::run(listener, &node).await,
        What::Fixed { echo_id, .. } => {
            let body = fixed_body;
            let template = if echo_id { Some(Arc::new(IdTemplate::new(&body)?)) } else { None };
            serve(listener, move |req: Request<Incoming>| {
                let (body, template) = (body.clone(), template.clone());
                async move {
                    // Read the request like any server must, then answer the same bytes.
                    let request = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    Ok::<_, Infallible>(json(match template {
                        Some(t) => t.answer(&request),
                        None => body,
                    }))
                }
            })
            .await
        }
    }
}

/// Sends `body` to `uri` through hyper-util's general client; the node's answer, or 502.
async fn relay(client: &Client<HttpConnector, Full<Bytes>>, uri: &hyper::Uri, body: Bytes) -> Response<Full<Bytes>> {
    let forwarded =
        Request::post(uri.clone()).header(CONTENT_TYPE, "application/json").body(Full::new(body)).expect("a request");
    let answer = match client.request(forwarded).await {
        Ok(response) => response.into_body().collect().await.map(|b| b.to_bytes()).ok(),
        Err(_) => None,
    };
    answer.map_or_else(bad_gateway, json)
}

/// The method of each JSON-RPC call in a request body (one call or a batch).
fn methods_in(body: &[u8]) -> Vec<String> {
    let method = |v: &serde_json::Value| v["method"].as_str().map(str::to_owned);
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(items)) => items.iter().filter_map(method).collect(),
        Ok(v) => method(&v).into_iter().collect(),
        Err(_) => Vec::new(),
    }
}

/// A fixed answer split around its `"id":` value, so that each request's id can be put back.
struct IdTemplate {
    before: Vec<u8>,
    after: Vec<u8>,
}

impl IdTemplate {
    fn new(body: &[u8]) -> anyhow::Result<Self> {
        let (start, end) = id_span(body).ok_or_else(|| anyhow::anyhow!("--echo-id: the body has no \"id\""))?;
        Ok(IdTemplate { before: body[..start].to_vec(), after: body[end..].to_vec() })
    }

    fn answer(&self, request: &[u8]) -> Bytes {
        let id = id_span(request).map_or(&b"null"[..], |(s, e)| &request[s..e]);
        let mut out = Vec::with_capacity(self.before.len() + id.len() + self.after.len());
        out.extend_from_slice(&self.before);
        out.extend_from_slice(id);
        out.extend_from_slice(&self.after);
        Bytes::from(out)
    }
}

/// Where the value of the first `"id":` is: up to the next `,` or `}` (numbers and plain strings,
/// which is what load generators send).
fn id_span(body: &[u8]) -> Option<(usize, usize)> {
    let key = body.windows(5).position(|w| w == b"\"id\":")? + 5;
    let len = body[key..].iter().position(|b| matches!(b, b',' | b'}'))?;
    Some((key, key + len))
}

fn bad_gateway() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

fn json(bytes: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(bytes));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

async fn serve<F, Fut>(listener: TcpListener, handler: F) -> anyhow::Result<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service_fn(handler))
                .await;
        });
    }
}

/// The bare WebSocket fan-out.
mod fanout {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use futures_util::{SinkExt, StreamExt};
    use serde_json::value::RawValue;
    use tokio::net::TcpListener;
    use tokio::sync::broadcast;
    use tokio_tungstenite::tungstenite::Message;

    /// The logs filter `sluice bench ws` subscribes its clients to.
    const LOGS: &str = r#"["logs",{"address":"0x00000000000000000000000000000000000051ce"}]"#;

    /// One event: which kind (0 heads, 1 logs) and its `result` JSON.
    type Event = (u8, Arc<str>);

    pub async fn run(listener: TcpListener, node: &str) -> anyhow::Result<()> {
        let (mut upstream, _) = tokio_tungstenite::connect_async(node).await?;
        let mut kinds = Vec::new();
        for (id, params) in [(0u8, r#"["newHeads"]"#), (1, LOGS)] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"eth_subscribe","params":{params}}}"#);
            upstream.send(Message::text(body)).await?;
        }
        while kinds.len() < 2 {
            let Some(Ok(Message::Text(text))) = upstream.next().await else { anyhow::bail!("node closed") };
            let answer: serde_json::Value = serde_json::from_str(&text)?;
            let id = answer["result"].as_str().ok_or_else(|| anyhow::anyhow!("refused: {answer}"))?;
            kinds.push((answer["id"].as_u64().unwrap_or(0) as u8, id.to_owned()));
        }
        let (events, _) = broadcast::channel::<Event>(4096);
        let tx = events.clone();
        tokio::spawn(async move {
            #[derive(serde::Deserialize)]
            struct Params<'a> {
                #[serde(borrow)]
                subscription: &'a str,
                #[serde(borrow)]
                result: &'a RawValue,
            }
            #[derive(serde::Deserialize)]
            struct Note<'a> {
                #[serde(borrow)]
                params: Params<'a>,
            }
            while let Some(Ok(Message::Text(text))) = upstream.next().await {
                let Ok(note) = serde_json::from_str::<Note>(&text) else { continue };
                let kind = kinds.iter().find(|(_, id)| id == note.params.subscription).map_or(0, |(k, _)| *k);
                let _ = tx.send((kind, Arc::from(note.params.result.get())));
            }
        });
        let next = Arc::new(AtomicU64::new(1));
        loop {
            let (tcp, _) = listener.accept().await?;
            let _ = tcp.set_nodelay(true);
            let (mut rx, n) = (events.subscribe(), next.fetch_add(1, Ordering::Relaxed));
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else { return };
                let ids = [format!("0x{n:016x}0000"), format!("0x{n:016x}0001")];
                loop {
                    tokio::select! {
                        message = ws.next() => match message {
                            Some(Ok(Message::Text(text))) => {
                                // eth_subscribe: newHeads gets id 0, anything else id 1.
                                let Ok(call) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
                                let kind = usize::from(call["params"][0] != "newHeads");
                                let answer = serde_json::json!({"jsonrpc": "2.0", "id": call["id"], "result": ids[kind]});
                                if ws.send(Message::text(answer.to_string())).await.is_err() { return }
                            }
                            Some(Ok(_)) => {}
                            _ => return,
                        },
                        event = rx.recv() => match event {
                            Ok((kind, result)) => {
                                let body = format!(
                                    r#"{{"jsonrpc":"2.0","method":"eth_subscription","params":{{"subscription":"{}","result":{}}}}}"#,
                                    ids[usize::from(kind)], result
                                );
                                if ws.send(Message::text(body)).await.is_err() { return }
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(broadcast::error::RecvError::Closed) => return,
                        },
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_id_replaces_the_answers() {
        let t = IdTemplate::new(br#"{"jsonrpc":"2.0","id":1,"result":"0x80"}"#).unwrap();
        let answer = t.answer(br#"{"jsonrpc":"2.0","id":"a-7","method":"eth_blockNumber","params":[]}"#);
        assert_eq!(&answer[..], br#"{"jsonrpc":"2.0","id":"a-7","result":"0x80"}"#);
        let last = t.answer(br#"{"jsonrpc":"2.0","method":"eth_blockNumber","id":12}"#);
        assert_eq!(&last[..], br#"{"jsonrpc":"2.0","id":12,"result":"0x80"}"#);
        assert_eq!(&t.answer(b"{}")[..], br#"{"jsonrpc":"2.0","id":null,"result":"0x80"}"#);
        assert!(IdTemplate::new(b"[]").is_err());
    }
}
