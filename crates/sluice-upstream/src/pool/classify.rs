//! What a failed call means for the next step. Pure.

use sluice_jsonrpc::{codes, RawValue};

/// What to do after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAnswer {
    /// A good answer, or an error that is the request's own fault: return it.
    Final,
    /// The upstream failed (transport, timeout, 429/5xx, garbage, overload): try another one,
    /// and count it against this upstream.
    RetryElsewhere,
    /// This upstream lacks the method: try another one, without counting it as a failure.
    TryAnother,
}

/// Judges a JSON-RPC error from an upstream.
pub fn judge_error(error: &RawValue) -> AfterAnswer {
    let value: serde_json::Value = serde_json::from_str(error.get()).unwrap_or_default();
    let code = value["code"].as_i64().unwrap_or(0);
    let message = value["message"].as_str().unwrap_or("").to_ascii_lowercase();
    if too_large(&message) {
        // The answer would be too large for this node's limits: another node may have larger
        // ones. Not a failure of the node (its circuit stays closed).
        return AfterAnswer::TryAnother;
    }
    match code {
        codes::METHOD_NOT_FOUND => AfterAnswer::TryAnother,
        // Overloaded or rate-limited providers, and internal failures of the node itself.
        codes::LIMIT_EXCEEDED | codes::INTERNAL_ERROR | codes::RESOURCE_UNAVAILABLE | -32099..=-32006 => {
            AfterAnswer::RetryElsewhere
        }
        _ if message.contains("rate limit")
            || message.contains("too many requests")
            || message.contains("capacity") =>
        {
            AfterAnswer::RetryElsewhere
        }
        _ => AfterAnswer::Final, // reverted, invalid params, nonce too low, …
    }
}

/// "Too many requests" as a JSON-RPC error: -32005 (EIP-1474 limit exceeded), or the wordings of
/// providers that answer 200 with an error object (`rate limit`, `too many requests`, `429`).
pub fn is_rate_limited(error: &RawValue) -> bool {
    let value: serde_json::Value = serde_json::from_str(error.get()).unwrap_or_default();
    let code = value["code"].as_i64().unwrap_or(0);
    let message = value["message"].as_str().unwrap_or("").to_ascii_lowercase();
    // Providers also answer -32005 for a query whose answer would be too large: not a rate.
    !too_large(&message)
        && (code == codes::LIMIT_EXCEEDED
            || code == 429
            || message.contains("rate limit")
            || message.contains("too many requests")
            || message.contains("exceeded the quota"))
}

/// Wordings of nodes and providers refusing a query whose answer would be too large (geth,
/// erigon, nethermind and the common hosted providers), lower-case.
pub(crate) const TOO_LARGE: [&str; 8] = [
    "query returned more than",
    "more than 10000 results",
    "response size exceeded",
    "response size should not",
    "log response size exceeded",
    "block range",
    "range too large",
    "too many results",
];

fn too_large(message: &str) -> bool {
    TOO_LARGE.iter().any(|w| message.contains(w))
}

/// "I do not have that block (or its state)", in the wordings of geth, reth, erigon,
/// nethermind, besu, anvil and hosted providers: from a node that is behind or pruned, an
/// answer another node may give. Only meaningful for a call that needs a particular block.
pub fn is_missing_block(error: &RawValue) -> bool {
    let value: serde_json::Value = serde_json::from_str(error.get()).unwrap_or_default();
    let code = value["code"].as_i64().unwrap_or(0);
    let message = value["message"].as_str().unwrap_or("").to_ascii_lowercase();
    code == -32001 // anvil, EIP-1474 "resource not found"
        || [
            "header not found",
            "unknown block",
            "block not found",
            "missing trie node",
            "historical state",
            "state not available",
            "state is not available",
            "pruned",
            "distance to target block exceeds",
            "blockoutofrange", // anvil: "BlockOutOfRangeError: block height is 2 but requested was 9"
        ]
        .iter()
        .any(|w| message.contains(w))
}

/// "The node already has this transaction", in the wordings of geth, reth, erigon, nethermind,
/// besu and anvil: for a broadcast, as good as accepted.
pub fn is_already_known(error: &RawValue) -> bool {
    let value: serde_json::Value = serde_json::from_str(error.get()).unwrap_or_default();
    let message = value["message"].as_str().unwrap_or("").to_ascii_lowercase();
    [
        "already known",                // geth, reth, erigon
        "alreadyknown",                 // nethermind
        "known transaction",            // older geth, besu ("known transaction")
        "transaction already imported", // besu, anvil
        "transaction already exists",
        "already in the mempool",
        "nonce too low: transaction already", // some providers
    ]
    .iter()
    .any(|w| message.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.into()).unwrap()
    }

    #[test]
    fn the_requests_own_faults_are_final() {
        assert_eq!(judge_error(&raw(r#"{"code":3,"message":"execution reverted","data":"0x"}"#)), AfterAnswer::Final);
        assert_eq!(judge_error(&raw(r#"{"code":-32602,"message":"invalid params"}"#)), AfterAnswer::Final);
        assert_eq!(judge_error(&raw(r#"{"code":-32000,"message":"nonce too low"}"#)), AfterAnswer::Final);
    }

    #[test]
    fn upstream_trouble_is_retried_elsewhere() {
        assert_eq!(judge_error(&raw(r#"{"code":-32005,"message":"limit exceeded"}"#)), AfterAnswer::RetryElsewhere);
        assert_eq!(judge_error(&raw(r#"{"code":-32000,"message":"Too Many Requests"}"#)), AfterAnswer::RetryElsewhere);
        assert_eq!(judge_error(&raw(r#"{"code":-32603,"message":"internal"}"#)), AfterAnswer::RetryElsewhere);
        assert_eq!(judge_error(&raw(r#"{"code":-32601,"message":"no such method"}"#)), AfterAnswer::TryAnother);
        let too_large = r#"{"code":-32005,"message":"query returned more than 10000 results"}"#;
        assert_eq!(judge_error(&raw(too_large)), AfterAnswer::TryAnother, "the query's size, not the node's health");
    }

    #[test]
    fn rate_limits_in_many_wordings_but_not_a_query_too_large() {
        for m in [
            r#"{"code":-32005,"message":"limit exceeded"}"#,
            r#"{"code":429,"message":"slow down"}"#,
            r#"{"code":-32000,"message":"Too Many Requests"}"#,
            r#"{"code":-32016,"message":"your app has exceeded the quota"}"#,
            r#"{"code":-32000,"message":"rate limit reached, retry later"}"#,
        ] {
            assert!(is_rate_limited(&raw(m)), "{m}");
        }
        assert!(!is_rate_limited(&raw(r#"{"code":-32005,"message":"query returned more than 10000 results"}"#)));
        assert!(!is_rate_limited(&raw(r#"{"code":3,"message":"execution reverted"}"#)));
    }

    #[test]
    fn missing_blocks_in_many_wordings() {
        for m in [
            r#"{"code":-32001,"message":"Resource not found"}"#,
            r#"{"code":-32000,"message":"header not found"}"#,
            r#"{"code":-32000,"message":"missing trie node 0xab (path ) state 0xab is not available"}"#,
            r#"{"code":-32000,"message":"unknown block"}"#,
            r#"{"code":4444,"message":"pruned history unavailable"}"#,
            r#"{"code":-32602,"message":"BlockOutOfRangeError: block height is 2 but requested was 153"}"#,
        ] {
            assert!(is_missing_block(&raw(m)), "{m}");
        }
        assert!(!is_missing_block(&raw(r#"{"code":3,"message":"execution reverted"}"#)));
        assert!(!is_missing_block(&raw(r#"{"code":-32602,"message":"invalid params"}"#)));
    }

    #[test]
    fn already_known_in_many_wordings() {
        for m in [
            "already known",
            "AlreadyKnown",
            "Known transaction (0xab)",
            "transaction already imported",
            "Transaction already exists",
        ] {
            assert!(is_already_known(&raw(&format!(r#"{{"code":-32000,"message":"{m}"}}"#))), "{m}");
        }
        assert!(!is_already_known(&raw(r#"{"code":-32000,"message":"nonce too low"}"#)));
    }
}
