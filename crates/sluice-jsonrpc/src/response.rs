//! Building answers for callers and reading answers from upstream nodes.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::error::ErrorObject;
use crate::request::Id;

/// What a call produced: a raw result or a raw error object, both passed through unchanged.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The `result` member's JSON.
    Result(Box<RawValue>),
    /// The `error` member's JSON (from an upstream, or from an [`ErrorObject`]).
    Error(Box<RawValue>),
}

impl Outcome {
    /// An error produced by sluice itself.
    pub fn error(e: &ErrorObject) -> Self {
        Outcome::Error(e.to_raw())
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

impl Response {
    /// Appends this response's JSON to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        out.extend_from_slice(self.id.get().as_bytes());
        let (key, raw): (&[u8], _) = match &self.outcome {
            Outcome::Result(raw) => (b",\"result\":", raw),
            Outcome::Error(raw) => (b",\"error\":", raw),
        };
        out.extend_from_slice(key);
        out.extend_from_slice(raw.get().as_bytes());
        out.push(b'}');
    }
}

/// Serializes answers: one object for a single call, an array for a batch.
pub fn write_responses(batch: bool, responses: &[Response]) -> Vec<u8> {
    let size: usize = responses.iter().map(|r| 40 + r.id.get().len() + outcome_len(&r.outcome)).sum();
    let mut out = Vec::with_capacity(size + 2);
    if batch {
        out.push(b'[');
    }
    for (i, r) in responses.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        r.write_to(&mut out);
    }
    if batch {
        out.push(b']');
    }
    out
}

fn outcome_len(o: &Outcome) -> usize {
    match o {
        Outcome::Result(r) | Outcome::Error(r) => r.get().len(),
    }
}

/// An answer as read from an upstream node.
#[derive(Debug, Deserialize)]
pub struct ResponseEnvelope {
    /// The id the upstream echoed (sluice sends numeric ids).
    #[serde(default, deserialize_with = "present")]
    pub id: Option<Box<RawValue>>,
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

impl ResponseEnvelope {
    /// The numeric id, if the upstream echoed one of ours.
    pub fn numeric_id(&self) -> Option<u64> {
        self.id.as_deref().and_then(|raw| raw.get().parse().ok())
    }

    /// The outcome; `None` when the answer has neither `result` nor `error`.
    pub fn into_outcome(self) -> Option<Outcome> {
        match (self.error, self.result) {
            (Some(error), _) if error.get() != "null" => Some(Outcome::Error(error)),
            (_, Some(result)) => Some(Outcome::Result(result)),
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
            Response { id: Id::number(1), outcome: Outcome::Result(RawValue::from_string("null".into()).unwrap()) };
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
