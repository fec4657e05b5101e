//! JSON-RPC error objects and the standard codes sluice answers with.

use serde::Serialize;
use serde_json::value::RawValue;

/// Standard JSON-RPC 2.0 codes plus the EIP-1474 server codes Ethereum clients match on.
pub mod codes {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist or is not available.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal JSON-RPC error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// EIP-1474: the requested resource is unavailable (used for upstream failures).
    pub const RESOURCE_UNAVAILABLE: i64 = -32002;
    /// EIP-1474: request exceeds a defined limit (body size, batch length, rate).
    pub const LIMIT_EXCEEDED: i64 = -32005;
}

/// A JSON-RPC error object produced by sluice itself (upstream errors pass through raw).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorObject {
    /// Numeric error code, see [`codes`].
    pub code: i64,
    /// Human-readable message; never contains upstream internals such as addresses.
    pub message: String,
    /// Optional structured detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl ErrorObject {
    /// An error with a code and message and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }

    /// Attaches structured `data`.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }

    /// -32700, for bodies that are not JSON.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(codes::PARSE_ERROR, format!("parse error: {detail}"))
    }

    /// -32600, for JSON that is not a request object.
    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(codes::INVALID_REQUEST, format!("invalid request: {detail}"))
    }

    /// Serializes into raw JSON for an [`crate::Outcome::Error`].
    pub fn to_raw(&self) -> Box<RawValue> {
        // Serializing a struct of integers, strings and a Value cannot fail.
        serde_json::value::to_raw_value(self).expect("error object serializes")
    }
}
