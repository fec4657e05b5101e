//! The HTTP answer to a JSON-RPC body: its body type (chunks, not boxed), its headers and the
//! request id.

use std::sync::atomic::{AtomicU64, Ordering};

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::pipeline::{Payload, Reply};

/// Header naming what answered: `local`, `upstream` or `mixed`.
pub const SERVED_BY: &str = "x-sluice-served-by";
/// Header carrying the request id (the caller's, if it sent a short one, else sluice's).
pub const REQUEST_ID: &str = "x-request-id";

/// The header names as values built once (a name given as `&str` is parsed on every insert).
const SERVED_BY_NAME: HeaderName = HeaderName::from_static(SERVED_BY);
const REQUEST_ID_NAME: HeaderName = HeaderName::from_static(REQUEST_ID);

/// The caller's request id if it sent a short printable one, else the next of sluice's own (hex).
pub(crate) fn request_id(headers: &HeaderMap) -> HeaderValue {
    let given = headers.get(&REQUEST_ID_NAME).filter(|v| !v.is_empty() && v.len() <= 64 && v.to_str().is_ok());
    match given {
        // A header value clones by reference count.
        Some(value) => value.clone(),
        None => {
            let mut digits = [0u8; 16];
            let hex = hex_digits(next_request_id(), &mut digits);
            HeaderValue::from_bytes(hex).unwrap_or_else(|_| HeaderValue::from_static("0"))
        }
    }
}

/// Ids handed to a thread at a time: each thread counts through its own block, so that
/// threads serving requests side by side do not share one counter's cache line per request.
const ID_BLOCK: u64 = 1 << 16;

/// A request id not given out before in this process (ids are not in order across threads).
fn next_request_id() -> u64 {
    static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        /// The next id this thread gives out, and the end of its block.
        static NEXT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    NEXT.with(|cell| {
        let (mut next, mut end) = cell.get();
        if next == end {
            next = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed) * ID_BLOCK;
            end = next + ID_BLOCK;
            // 0 is never given out.
            next = next.max(1);
        }
        cell.set((next + 1, end));
        next
    })
}

/// `n` in lower-case hex without leading zeros, written into `out`.
fn hex_digits(n: u64, out: &mut [u8; 16]) -> &[u8] {
    let len = (16 - n.leading_zeros() as usize / 4).max(1);
    for (i, digit) in out[..len].iter_mut().rev().enumerate() {
        *digit = b"0123456789abcdef"[(n >> (4 * i)) as usize & 0xf];
    }
    &out[..len]
}

/// The HTTP answer. The request id is moved in, not cloned: a cloned header value made from
/// bytes costs an allocation.
pub(crate) fn respond(status: StatusCode, reply: Reply, request_id: HeaderValue) -> RpcResponse {
    let has_body = reply.body.is_some();
    let chunks = reply.body.map(Payload::into_chunks).unwrap_or_default();
    let mut response = RpcResponse::new(ChunkBody::new(chunks));
    *response.status_mut() = status;
    *response.headers_mut() = answer_headers(has_body, reply.served_by.as_str(), request_id);
    response
}

/// The headers of a JSON-RPC answer: `content-type` (when there is a body), what served it and
/// the request id. Copied from a map made once per thread, and the two values set by
/// position: inserting by name hashes each name and probes the table on every answer.
fn answer_headers(has_body: bool, served_by: &'static str, request_id: HeaderValue) -> HeaderMap {
    thread_local! {
        static TEMPLATES: [HeaderMap; 2] = [false, true].map(|has_body| {
            let mut headers = HeaderMap::with_capacity(3);
            if has_body {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            headers.insert(SERVED_BY_NAME, HeaderValue::from_static("local"));
            headers.insert(REQUEST_ID_NAME, HeaderValue::from_static("0"));
            headers
        });
    }
    let mut headers = TEMPLATES.with(|t| t[usize::from(has_body)].clone());
    let mut request_id = Some(request_id);
    for (name, value) in headers.iter_mut() {
        if name == SERVED_BY_NAME {
            *value = HeaderValue::from_static(served_by);
        } else if name == REQUEST_ID_NAME {
            if let Some(id) = request_id.take() {
                *value = id;
            }
        }
    }
    headers
}

/// A JSON-RPC answer over HTTP: its body type is concrete, so that the server hands it to
/// hyper without boxing it (the router's own answers are boxed `axum` bodies).
pub type RpcResponse = http::Response<ChunkBody>;

/// A response body of chunks written together (hyper writes them with one vectored write).
pub struct ChunkBody {
    chunks: sluice_jsonrpc::Chunks,
    /// The next chunk to hand out.
    next: usize,
    remaining: u64,
}

impl ChunkBody {
    fn new(chunks: sluice_jsonrpc::Chunks) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        let mut chunks = chunks;
        chunks.retain(|c| !c.is_empty());
        Self { chunks, next: 0, remaining }
    }
}

impl http_body::Body for ChunkBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = &mut *self;
        // Taken out, leaving an empty `Bytes` (no allocation) behind.
        let next = this.chunks.get_mut(this.next).map(std::mem::take);
        if let Some(chunk) = &next {
            this.next += 1;
            this.remaining -= chunk.len() as u64;
        }
        std::task::Poll::Ready(next.map(|c| Ok(http_body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.chunks.len()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_headers_carry_their_values_and_a_content_type_only_with_a_body() {
        for has_body in [true, false] {
            for (served_by, id) in [("cache-memory", "ab12"), ("upstream", "trace-42")] {
                let headers = answer_headers(has_body, served_by, HeaderValue::from_static(id));
                assert_eq!(headers.len(), 2 + usize::from(has_body));
                assert_eq!(headers[SERVED_BY], served_by);
                assert_eq!(headers[REQUEST_ID], id);
                assert_eq!(headers.get(CONTENT_TYPE).is_some(), has_body);
            }
        }
    }

    #[test]
    fn hex_digits_have_no_leading_zeros() {
        let mut out = [0u8; 16];
        for (n, hex) in [(0, "0"), (1, "1"), (0xabc, "abc"), (0x10, "10"), (u64::MAX, "ffffffffffffffff")] {
            assert_eq!(hex_digits(n, &mut out), hex.as_bytes(), "{n:#x}");
        }
    }

    #[test]
    fn request_ids_are_unique_across_threads() {
        // More ids per thread than one block holds, so threads go through several blocks.
        let per_thread = (ID_BLOCK * 2 + 5) as usize;
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || (0..per_thread).map(|_| next_request_id()).collect::<Vec<u64>>()))
            .collect();
        let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().expect("thread ends")).collect();
        let given = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), given, "an id was given out twice");
        assert!(all[0] > 0, "0 is never an id");
    }

    #[test]
    fn a_short_printable_request_id_is_kept_and_others_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID_NAME, HeaderValue::from_static("trace-42"));
        assert_eq!(request_id(&headers), "trace-42");
        headers.insert(REQUEST_ID_NAME, HeaderValue::from_bytes(&[b'a'; 65]).expect("valid"));
        let own = request_id(&headers);
        assert!(own.len() <= 16 && own.to_str().expect("ascii").bytes().all(|b| b.is_ascii_hexdigit()), "{own:?}");
    }
}
