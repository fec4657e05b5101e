//! JSON-RPC 2.0 framing for sluice.
//!
//! Pure code, no I/O. Requests are parsed without re-encoding their `params`, and results are
//! carried as raw JSON ([`RawValue`]), so large answers pass through sluice byte for byte.
//! The caller's `id` is kept as the exact JSON text it sent, so it is echoed exactly.
//!
//! * [`parse_body`] turns an HTTP body or WebSocket message into an [`Incoming`] single call or
//!   batch, with a per-element [`ErrorObject`] for elements that are not valid requests.
//! * [`Response`] and [`write_responses`] produce the answer.
//! * [`ResponseEnvelope`] reads an upstream node's answer.

mod error;
mod request;
mod response;

pub use error::{codes, ErrorObject};
pub use request::{parse_body, Id, Incoming, Invalid, Request};
pub use response::{write_chunks, write_responses, Chunks, Outcome, Response, ResponseEnvelope, SharedRaw};
pub use serde_json::value::RawValue;
