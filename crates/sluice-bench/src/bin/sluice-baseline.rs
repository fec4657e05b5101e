//! `sluice-baseline`: the machine's own limits, measured beside sluice in the same run. A
//! benchmark tool, not part of the `sluice` binary.
//!
//! * `sluice-baseline forward --to URL`: a bare HTTP forwarder (hyper, keep-alive both ways),
//!   body bytes in and out, no JSON parsing: what any gateway costs at least.
//! * `sluice-baseline fixed --body-file F`: a bare server answering every request with the same
//!   bytes: what answering from memory costs at least.
//!
//! Each prints `baseline listening on http://ADDR` once it accepts connections.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

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
    },
    /// Answer every request with the bytes of FILE.
    Fixed {
        /// The answer.
        #[arg(long)]
        body_file: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let listener = TcpListener::bind(cli.listen).await?;
    println!("baseline listening on http://{}", listener.local_addr()?);
    match cli.what {
        What::Forward { to } => {
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
                    let forwarded = Request::post(uri.clone())
                        .header(CONTENT_TYPE, "application/json")
                        .body(Full::new(body))
                        .expect("a request");
                    let answer = match client.request(forwarded).await {
                        Ok(response) => response.into_body().collect().await.map(|b| b.to_bytes()).ok(),
                        Err(_) => None,
                    };
                    Ok::<_, Infallible>(match answer {
                        Some(bytes) => json(bytes),
                        None => {
                            let mut r = Response::new(Full::new(Bytes::new()));
                            *r.status_mut() = StatusCode::BAD_GATEWAY;
                            r
                        }
                    })
                }
            })
            .await
        }
        What::Fixed { body_file } => {
            let body = Bytes::from(std::fs::read(&body_file)?);
            serve(listener, move |req: Request<Incoming>| {
                let body = body.clone();
                async move {
                    // Read the request like any server must, then answer the same bytes.
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(json(body))
                }
            })
            .await
        }
    }
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
