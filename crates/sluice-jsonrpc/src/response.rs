//! Building answers for callers and reading answers from upstream nodes.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::error::ErrorObject;
use crate::request::Id;

/// A validated JSON value shared without copying: an upstream answer is read once and then
/// held by the cache, by coalesced callers and by the response writer alike.
pub type SharedRaw = Arc<RawValue>;

/// What a call produced: a raw result or a raw error object, both passed through unchanged.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The `result` member's JSON.
    Result(SharedRaw),
    /// The `error` member's JSON (from an upstream, or from an [`ErrorObject`]).
    Error(SharedRaw),
}

impl Outcome {
    /// An error produced by sluice itself.
    pub fn error(e: &ErrorObject) -> Self {
        Outcome::Error(e.to_raw().into())
    }

    /// A result from raw JSON.
    pub fn result(raw: Box<RawValue>) -> Self {
        Outcome::Result(raw.into())
    }

    /// An error from a raw error object.
    pub fn error_raw(raw: Box<RawValue>) -> Self {
        Outcome::Error(raw.into())
    }

    /// True for an error answer.
    pub fn is_error(&self) -> bool {
        matches!(self, Outcome::Error(_))
    }
}

impl From<ErrorObject> for Outcome {
    fn from(e: ErrorObject) -> Self {
        Outcome::error(&e)
    }
}

/// An answer to one call, with the caller's own id.
#[derive(Debug, Clone)]
pub struct Response {
    /// The caller's id, echoed exactly.
    pub id: Id,
    /// The result or error.
    pub outcome: Outcome,
}

/// Serializes answers: one object for a single call, an array for a batch.
pub fn write_responses(batch: bool, responses: &[Response]) -> Vec<u8> {
    write_chunks(batch, responses).concat()
}

/// Results at least this large are handed to the writer by reference, not copied.
const SHARED_FROM: usize = 4096;

/// Owns a shared result for the time the network writer holds it.
struct SharedBytes(SharedRaw);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.get().as_bytes()
    }
}

/// An answer's bytes as chunks for one vectored write. Most answers are one chunk, held
/// without a separate allocation.
pub type Chunks = smallvec::SmallVec<[Bytes; 1]>;

/// Serializes answers like [`write_responses`], as chunks for a vectored write: small parts are
/// copied together, large results are passed by reference (zero-copy from the cache).
pub fn write_chunks(batch: bool, responses: &[Response]) -> Chunks {
    fn parts(r: &Response) -> (&'static [u8], &SharedRaw) {
        match &r.outcome {
            Outcome::Result(raw) => (b",\"result\":", raw),
            Outcome::Error(raw) => (b",\"error\":", raw),
        }
    }
    const HEAD: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";
    let shared = |raw: &SharedRaw| raw.get().len() >= SHARED_FROM;
    // The copied bytes, counted first: a vector filled to exactly its capacity becomes `Bytes`
    // without a second allocation, and this runs for every answer.
    let commas = responses.len().saturating_sub(1);
    let copied = 2 * usize::from(batch)
        + commas
        + responses
            .iter()
            .map(|r| {
                let (key, raw) = parts(r);
                let inline = if shared(raw) { 0 } else { raw.get().len() };
                HEAD.len() + r.id.get().len() + key.len() + inline + 1
            })
            .sum::<usize>();
    let mut buf = Vec::with_capacity(copied);
    // Where a large result goes between copied parts (none for most answers: no allocation).
    let mut large: Vec<(usize, &SharedRaw)> = Vec::new();
    if batch {
        buf.push(b'[');
    }
    for (i, r) in responses.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        buf.extend_from_slice(HEAD);
        buf.extend_from_slice(r.id.get().as_bytes());
        let (key, raw) = parts(r);
        buf.extend_from_slice(key);
        if shared(raw) {
            large.push((buf.len(), raw));
        } else {
            buf.extend_from_slice(raw.get().as_bytes());
        }
        buf.push(b'}');
    }
    if batch {
        buf.push(b']');
    }
    debug_assert_eq!(buf.len(), copied, "the size counted first is the size written");
    let buf = Bytes::from(buf);
    if large.is_empty() {
        return smallvec::smallvec![buf];
    }
    let mut chunks = Chunks::with_capacity(2 * large.len() + 1);
    let mut from = 0;
    for (at, raw) in large {
        chunks.push(buf.slice(from..at));
        chunks.push(Bytes::from_owner(SharedBytes(raw.clone())));
        from = at;
    }
    chunks.push(buf.slice(from..));
    chunks
}

/// An answer as read from an upstream node, borrowing from its text where nothing needs to
/// outlive the read (the id is only compared with the one sent).
#[derive(Debug, Deserialize)]
pub struct ResponseEnvelope<'a> {
    /// The id the upstream echoed (sluice sends numeric ids).
    #[serde(default, borrow, deserialize_with = "present_borrowed")]
    pub id: Option<&'a RawValue>,
    /// The result member, `Some` even when it is JSON `null`.
    #[serde(default, deserialize_with = "present")]
    pub result: Option<Box<RawValue>>,
    /// The error member.
    #[serde(default, deserialize_with = "present")]
    pub error: Option<Box<RawValue>>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

fn present_borrowed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl ResponseEnvelope<'_> {
    /// The numeric id, if the upstream echoed one of ours.
    pub fn numeric_id(&self) -> Option<u64> {
        self.id.and_then(|raw| raw.get().parse().ok())
    }

    /// The outcome; `None` when the answer has neither `result` nor `error`.
    pub fn into_outcome(self) -> Option<Outcome> {
        match (self.error, self.result) {
            (Some(error), _) if error.get() != "null" => Some(Outcome::error_raw(error)),
            (_, Some(result)) => Some(Outcome::result(result)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_single_and_batch() {
        let ok =
            Response { id: Id::number(1), outcome: Outcome::result(RawValue::from_string("null".into()).unwrap()) };
        let err = Response { id: Id::null(), outcome: ErrorObject::new(-32600, "bad").into() };
        assert_eq!(
            String::from_utf8(write_responses(false, std::slice::from_ref(&ok))).unwrap(),
            r#"{"jsonrpc":"2.0","id":1,"result":null}"#
        );
        assert_eq!(
            String::from_utf8(write_responses(true, &[ok, err])).unwrap(),
            r#"[{"jsonrpc":"2.0","id":1,"result":null},{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}]"#
        );
    }

    #[test]
    fn chunks_say_the_same_and_share_large_results() {
        let big = format!("\"{}\"", "a".repeat(10_000));
        let responses = [
            Response { id: Id::number(1), outcome: Outcome::result(RawValue::from_string("\"0x1\"".into()).unwrap()) },
            Response { id: Id::number(2), outcome: Outcome::result(RawValue::from_string(big.clone()).unwrap()) },
            Response { id: Id::null(), outcome: ErrorObject::new(-32600, "bad").into() },
        ];
        for batch in [false, true] {
            let shown = if batch { &responses[..] } else { &responses[1..2] };
            let chunks = write_chunks(batch, shown);
            assert_eq!(chunks.concat(), write_responses(batch, shown));
            let Outcome::Result(shared) = &responses[1].outcome else { unreachable!() };
            assert!(
                chunks.iter().any(|c| c.as_ptr() == shared.get().as_ptr()),
                "the large result is the cache's own bytes"
            );
        }
    }

    #[test]
    fn reads_upstream_answers() {
        let env: ResponseEnvelope = serde_json::from_str(r#"{"jsonrpc":"2.0","id":7,"result":null}"#).unwrap();
        assert_eq!(env.numeric_id(), Some(7));
        assert!(matches!(env.into_outcome(), Some(Outcome::Result(r)) if r.get() == "null"));
        let env: ResponseEnvelope = serde_json::from_str(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":3,"message":"execution reverted","data":"0x08c379a0"}}"#,
        )
        .unwrap();
        assert!(matches!(env.into_outcome(), Some(Outcome::Error(e)) if e.get().contains("0x08c379a0")));
        let env: ResponseEnvelope = serde_json::from_str(r#"{"jsonrpc":"2.0","id":7}"#).unwrap();
        assert!(env.into_outcome().is_none());
    }
}
