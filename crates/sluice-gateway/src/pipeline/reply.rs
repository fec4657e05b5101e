//! What the pipeline answers a body with: the bytes, what produced them, and whether the body
//! was refused as a whole.

use sluice_access::Refusal;
use sluice_jsonrpc::{write_responses, Chunks, ErrorObject, Id, Response};
use sluice_upstream::Source;

/// What answered a request, reported in the `x-sluice-served-by` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// Every call was answered from the same place.
    Only(Source),
    /// A batch answered from several places.
    Mixed,
}

impl ServedBy {
    /// Answered by sluice alone.
    pub const LOCAL: ServedBy = ServedBy::Only(Source::Local);

    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            ServedBy::Only(source) => source.as_str(),
            ServedBy::Mixed => "mixed",
        }
    }

    pub(super) fn join(this: Option<ServedBy>, source: Source) -> Option<ServedBy> {
        Some(match this {
            None => ServedBy::Only(source),
            Some(ServedBy::Only(s)) if s == source => ServedBy::Only(s),
            Some(_) => ServedBy::Mixed,
        })
    }
}

/// Why a whole body was refused before its calls ran.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// Too many bodies in flight for the caller's priority: 429, `Retry-After: 1`.
    Busy,
    /// Access control: no or unknown key (401), over quota (429), quota store down (503).
    Access(Refusal),
}

/// The answer to one body.
#[derive(Debug)]
pub struct Reply {
    /// The JSON to send back; `None` when every call was a notification.
    pub body: Option<Payload>,
    /// What produced it.
    pub served_by: ServedBy,
    /// Set when the body was refused as a whole (the HTTP status and `Retry-After` follow).
    pub refused: Option<Refused>,
}

/// An answer's bytes, as chunks for one vectored write: large results are the cache's (or
/// the upstream answer's) own bytes, never copied into the response.
#[derive(Debug, Clone, Default)]
pub struct Payload(pub(super) Chunks);

impl Payload {
    /// The chunks.
    pub fn chunks(&self) -> &[bytes::Bytes] {
        &self.0
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.0.iter().map(|c| c.len()).sum()
    }

    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes in one piece (a WebSocket message, a test).
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.concat()
    }

    /// The chunks, to hand to the network writer.
    pub fn into_chunks(self) -> Chunks {
        self.0
    }
}

impl Reply {
    /// A single error answer with a `null` id, for bodies that could not be read at all.
    pub fn local_error(e: ErrorObject) -> Self {
        let response = Response { id: Id::null(), outcome: e.into() };
        let body = Payload(Chunks::from_iter([write_responses(false, &[response]).into()]));
        Reply { body: Some(body), served_by: ServedBy::LOCAL, refused: None }
    }
}
