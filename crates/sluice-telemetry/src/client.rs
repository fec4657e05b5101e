//! The exporter's HTTP client: hyper on the process's tokio runtime. The batch exporter runs
//! on a thread of its own, so each request is spawned onto the runtime and awaited there.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};

/// Answers from the collector larger than this are an error.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct TokioHttp {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl TokioHttp {
    pub fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> Self {
        // Built inside the runtime: the connection pool's timers are tokio's.
        let _entered = runtime.enter();
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        Self { client, runtime, timeout }
    }
}

#[async_trait::async_trait]
impl HttpClient for TokioHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let exchange = async move {
            let (parts, body) = request.into_parts();
            let answer = client.request(Request::from_parts(parts, Full::new(body))).await?;
            let (parts, body) = answer.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let task = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, exchange).await.map_err(|_| HttpError::from("collector timed out"))?
        });
        task.await?
    }
}
