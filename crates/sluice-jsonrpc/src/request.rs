//! Parsing request bodies: single calls, batches, notifications, with per-element errors.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::error::{codes, ErrorObject};

/// A request id, kept as the exact JSON text the caller sent (a number, a string or `null`),
/// so that `1.0`, `1e3` or a 30-digit number come back exactly as written. Held inline when
/// short (most ids are a few digits: no allocation), else shared, so that keeping a call's id
/// for its answer while the call goes down the layers costs no allocation either way.
#[derive(Debug, Clone)]
pub struct Id(smol_str::SmolStr);

impl PartialEq for Id {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Id {}

impl Id {
    /// The `null` id, used when a request's own id cannot be read.
    pub fn null() -> Self {
        Id(smol_str::SmolStr::new_static("null"))
    }

    /// An id from a number, for requests sluice makes itself.
    pub fn number(n: u64) -> Self {
        Id(smol_str::SmolStr::new(itoa::Buffer::new().format(n)))
    }

    /// The exact JSON text of the id.
    pub fn get(&self) -> &str {
        &self.0
    }

    /// Accepts only the JSON types the spec allows for an id.
    fn from_raw(raw: &RawValue) -> Option<Self> {
        let text = raw.get();
        let ok = match text.as_bytes().first() {
            Some(b'"') | Some(b'-') | Some(b'0'..=b'9') => true,
            _ => text == "null",
        };
        ok.then(|| Id(smol_str::SmolStr::new(text)))
    }
}

/// One valid JSON-RPC call.
#[derive(Debug, Clone)]
pub struct Request {
    /// The caller's id; `None` makes this a notification, which gets no answer.
    pub id: Option<Id>,
    /// The method name (held inline up to 23 bytes, as nearly every method name is).
    pub method: smol_str::SmolStr,
    /// The params exactly as sent (an array or object), or `None`.
    pub params: Option<Box<RawValue>>,
}

impl Request {
    /// Builds a request, for calls sluice makes itself and for tests.
    pub fn new(id: Option<Id>, method: impl Into<smol_str::SmolStr>, params: Option<Box<RawValue>>) -> Self {
        Self { id, method: method.into(), params }
    }

    /// True when the caller expects no answer.
    pub fn is_notification(&self) -> bool {
        self.id.is_none()
    }

    /// The params' JSON text, `[]` when absent.
    pub fn params_text(&self) -> &str {
        self.params.as_deref().map_or("[]", RawValue::get)
    }

    /// Writes this call with another id (the upstream's), leaving params untouched.
    pub fn write_with_id(&self, id: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b",\"method\":");
        // Writing a string into a Vec cannot fail.
        serde_json::to_writer(&mut *out, self.method.as_str()).expect("string serializes");
        if let Some(params) = &self.params {
            out.extend_from_slice(b",\"params\":");
            out.extend_from_slice(params.get().as_bytes());
        }
        out.push(b'}');
    }
}

/// An element that could not be read as a request: the id to answer with and why.
pub type Invalid = (Id, ErrorObject);

/// A parsed body.
#[derive(Debug)]
pub enum Incoming {
    /// A single call (or the error answering it).
    Single(Result<Request, Invalid>),
    /// A non-empty batch; each element answered on its own.
    Batch(Vec<Result<Request, Invalid>>),
}

/// Parses a request body. Errors that concern the whole body (not JSON, empty batch, batch
/// longer than `max_batch`) are returned as `Err` and answered once with a `null` id.
pub fn parse_body(body: &[u8], max_batch: usize) -> Result<Incoming, ErrorObject> {
    let text = std::str::from_utf8(body).map_err(ErrorObject::parse_error)?;
    // A single call read in one pass (the common case); anything else, including a single
    // call this pass refuses, goes the general way below, which words the error. (Reading
    // from `&str` after one UTF-8 check costs less than reading bytes: the byte reader checks
    // each string it meets, keys included.)
    if text.trim_start().starts_with('{') {
        if let Ok(fields) = serde_json::from_str::<RawRequest>(text) {
            return Ok(Incoming::Single(request_from(fields)));
        }
    }
    parse_general(text, max_batch)
}

/// Any body: one pass validates the whole document; elements are then read from borrowed slices.
fn parse_general(text: &str, max_batch: usize) -> Result<Incoming, ErrorObject> {
    let doc: &RawValue = serde_json::from_str(text).map_err(ErrorObject::parse_error)?;
    let doc_text = doc.get();
    if doc_text.starts_with('[') {
        let elements: Vec<&RawValue> = serde_json::from_str(doc_text).map_err(ErrorObject::parse_error)?;
        if elements.is_empty() {
            return Err(ErrorObject::invalid_request("empty batch"));
        }
        if elements.len() > max_batch {
            return Err(ErrorObject::new(
                codes::LIMIT_EXCEEDED,
                format!("batch too large: {} calls, limit {max_batch}", elements.len()),
            ));
        }
        Ok(Incoming::Batch(elements.into_iter().map(parse_element).collect()))
    } else {
        Ok(Incoming::Single(parse_element(doc)))
    }
}

/// The fields of one request object, read in one pass: `jsonrpc` and `method` as text when they
/// are strings (borrowed from the body unless they hold escapes), `id` and `params` as the
/// caller's exact JSON.
#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(borrow, default, deserialize_with = "present_text")]
    jsonrpc: Option<Text<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present_text")]
    method: Option<Text<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
}

/// Distinguishes a field set to `null` (Some) from a missing field (None, via `default`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The same for a field that must be a string: `null` is `Some(Text::Other)`.
fn present_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Text<'de>>, D::Error> {
    Text::deserialize(d).map(Some)
}

/// A field's value where a string is expected: the string, or a note that it was something
/// else (which the caller is told about, rather than the whole object being unreadable).
enum Text<'a> {
    /// Borrowed from the body: the common case, no escapes.
    Borrowed(&'a str),
    /// A string with escapes, unescaped.
    Owned(String),
    /// Not a string (a number, `null`, an object…).
    Other,
}

impl Text<'_> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Text::Borrowed(s) => Some(s),
            Text::Owned(s) => Some(s),
            Text::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text::Borrowed(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text::Owned(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text::Owned(v))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Text::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Text::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Text::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Text::Other)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Text::Other)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Text::Other)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Text::Other)
            }
        }
        d.deserialize_any(Visitor)
    }
}

fn parse_element(raw: &RawValue) -> Result<Request, Invalid> {
    let invalid = |id: Option<Id>, why: &str| Err((id.unwrap_or_else(Id::null), ErrorObject::invalid_request(why)));
    if !raw.get().starts_with('{') {
        return invalid(None, "not a JSON-RPC request object");
    }
    let fields: RawRequest = match serde_json::from_str(raw.get()) {
        Ok(fields) => fields,
        Err(e) => return invalid(None, &e.to_string()),
    };
    request_from(fields)
}

/// Checks the fields of one request object and builds the request.
fn request_from(fields: RawRequest<'_>) -> Result<Request, Invalid> {
    let invalid = |id: Option<Id>, why: &str| Err((id.unwrap_or_else(Id::null), ErrorObject::invalid_request(why)));
    let id = match fields.id {
        None => None,
        Some(raw_id) => match Id::from_raw(raw_id) {
            Some(id) => Some(id),
            None => return invalid(None, "id must be a string, a number or null"),
        },
    };
    if fields.jsonrpc.as_ref().and_then(Text::as_str) != Some("2.0") {
        return invalid(id, "jsonrpc must be \"2.0\"");
    }
    let method = match fields.method {
        Some(Text::Borrowed(method)) => smol_str::SmolStr::new(method),
        Some(Text::Owned(method)) => smol_str::SmolStr::from(method),
        Some(Text::Other) => return invalid(id, "method must be a string"),
        None => return invalid(id, "missing method"),
    };
    let params = match fields.params {
        None => None,
        Some(p) if p.get() == "null" => None,
        Some(p) if p.get().starts_with(['[', '{']) => Some(p.to_owned()),
        Some(_) => return invalid(id, "params must be an array or an object"),
    };
    Ok(Request { id, method, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(body: &str) -> Result<Request, Invalid> {
        match parse_body(body.as_bytes(), 10).expect("body parses") {
            Incoming::Single(r) => r,
            Incoming::Batch(_) => panic!("expected a single call"),
        }
    }

    #[test]
    fn ids_are_kept_exactly() {
        for id in ["1", "1.0", "-7", "1e3", "\"abc\"", "null", "123456789012345678901234567890"] {
            let req = single(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"m"}}"#)).unwrap();
            assert_eq!(req.id.unwrap().get(), id);
        }
    }

    #[test]
    fn missing_id_is_a_notification_and_null_id_is_not() {
        assert!(single(r#"{"jsonrpc":"2.0","method":"m"}"#).unwrap().is_notification());
        assert!(!single(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).unwrap().is_notification());
    }

    #[test]
    fn params_pass_through_untouched() {
        let req = single(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[ "0x1" , {"a":1.50}]}"#).unwrap();
        assert_eq!(req.params_text(), r#"[ "0x1" , {"a":1.50}]"#);
    }

    #[test]
    fn whole_body_errors() {
        assert_eq!(parse_body(b"{", 10).unwrap_err().code, codes::PARSE_ERROR);
        assert_eq!(parse_body(b"\xff", 10).unwrap_err().code, codes::PARSE_ERROR);
        // Not UTF-8 inside a well-formed single call: the body is still not JSON.
        for body in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":[\"\xff\"]}"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\xc3\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":\"\xe2\x82\",\"method\":\"m\"}",
        ] {
            assert_eq!(parse_body(body, 10).unwrap_err().code, codes::PARSE_ERROR, "{body:?}");
        }
        assert_eq!(parse_body(b"[]", 10).unwrap_err().code, codes::INVALID_REQUEST);
        let big = format!("[{}]", [r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#; 11].join(","));
        assert_eq!(parse_body(big.as_bytes(), 10).unwrap_err().code, codes::LIMIT_EXCEEDED);
    }

    #[test]
    fn invalid_elements_get_their_own_errors() {
        let body = r#"[1, {"jsonrpc":"1.0","id":5,"method":"m"}, {"jsonrpc":"2.0","id":6,"method":7},
                       {"jsonrpc":"2.0","id":{},"method":"m"}, {"jsonrpc":"2.0","id":8,"method":"m","params":3},
                       {"jsonrpc":"2.0","id":9,"method":"ok"}]"#;
        let Incoming::Batch(items) = parse_body(body.as_bytes(), 10).unwrap() else { panic!("batch") };
        let ids: Vec<String> = items
            .iter()
            .map(|r| match r {
                Ok(req) => format!("ok {}", req.id.as_ref().unwrap().get()),
                Err((id, e)) => format!("{} {}", e.code, id.get()),
            })
            .collect();
        assert_eq!(ids, ["-32600 null", "-32600 5", "-32600 6", "-32600 null", "-32600 8", "ok 9"]);
    }

    #[test]
    fn single_calls_read_in_one_pass_as_the_general_reading_does() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1,{"a":"b"}]}"#,
            r#"  {"jsonrpc":"2.0","id":"x","method":"m"}"#,
            r#"{"jsonrpc":"2.0","method":"notify","params":null}"#,
            r#"{"jsonrpc":"2.0","id":1e3,"method":"m","extra":{"nested":[1,2]}}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":3}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m"} trailing"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m\u00e9"}"#,
        ] {
            let fast = format!("{:?}", parse_body(text.as_bytes(), 10));
            assert_eq!(fast, format!("{:?}", parse_general(text, 10)), "{text}");
        }
    }

    #[test]
    fn fields_with_escapes_are_read_as_their_text() {
        let req = single(r#"{"jsonrpc":"2.\u0030","id":1,"method":"eth_\u0063hainId"}"#).unwrap();
        assert_eq!(req.method, "eth_chainId");
        for bad in [r#"{"jsonrpc":"2.0","id":1,"method":"\ud800"}"#, r#"{"jsonrpc":"2.0","id":1,"method":null}"#] {
            let (_, e) = single(bad).unwrap_err();
            assert_eq!(e.code, codes::INVALID_REQUEST, "{bad}");
        }
        let (id, e) = single(r#"{"jsonrpc":"2.0","id":7,"method":{"a":[1]}}"#).unwrap_err();
        assert_eq!((id.get(), e.message.as_str()), ("7", "invalid request: method must be a string"));
    }

    #[test]
    fn writes_request_with_new_id() {
        let req = single(r#"{"jsonrpc":"2.0","id":"x","method":"eth_call","params":[{"to":"0x1"},"latest"]}"#).unwrap();
        let mut out = Vec::new();
        req.write_with_id("42", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"jsonrpc":"2.0","id":42,"method":"eth_call","params":[{"to":"0x1"},"latest"]}"#
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn id() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            "[a-zA-Z0-9 _\\-]{0,12}".prop_map(|s| format!("\"{s}\"")),
            Just("null".to_owned()),
            Just("1.5e3".to_owned()),
        ]
    }

    proptest! {
        /// Any bytes at all: an answer or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_body(&body, 10);
        }

        /// Any JSON-ish text built from request fragments: never a panic.
        #[test]
        fn request_like_text_never_panics(
            parts in proptest::collection::vec(prop_oneof![
                Just("{"), Just("}"), Just("["), Just("]"), Just(","), Just(":"), Just("\"jsonrpc\""), Just("\"2.0\""),
                Just("\"id\""), Just("\"method\""), Just("\"params\""), Just("\"eth_call\""), Just("1"), Just("null"),
            ], 0..40)
        ) {
            let _ = parse_body(parts.concat().as_bytes(), 10);
        }

        /// The one-pass reading of a single call says exactly what the general one says.
        #[test]
        fn the_single_call_fast_path_agrees_with_the_general_one(
            parts in proptest::collection::vec(prop_oneof![
                Just("{"), Just("}"), Just(","), Just(":"), Just("\"jsonrpc\""), Just("\"2.0\""), Just("\"1.0\""),
                Just("\"id\""), Just("\"method\""), Just("\"params\""), Just("\"eth_call\""), Just("1"), Just("null"),
                Just("[]"), Just("{}"), Just("\"x\""), Just(" "),
            ], 0..24)
        ) {
            let text = parts.concat();
            let fast = format!("{:?}", parse_body(text.as_bytes(), 10));
            let general = format!("{:?}", parse_general(&text, 10));
            prop_assert_eq!(fast, general, "{}", text);
        }

        /// Well-formed calls keep their ids byte for byte, alone and in batches.
        #[test]
        fn ids_come_back_exactly(ids in proptest::collection::vec(id(), 1..8)) {
            let calls: Vec<String> =
                ids.iter().map(|id| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"eth_chainId"}}"#)).collect();
            let body = format!("[{}]", calls.join(","));
            let Ok(Incoming::Batch(items)) = parse_body(body.as_bytes(), 10) else {
                return Err(TestCaseError::fail("a batch"));
            };
            for (item, id) in items.iter().zip(&ids) {
                let request = item.as_ref().map_err(|(_, e)| TestCaseError::fail(e.message.clone()))?;
                prop_assert_eq!(request.id.as_ref().map(|i| i.get().to_owned()), Some(id.clone()));
            }
        }
    }
}
