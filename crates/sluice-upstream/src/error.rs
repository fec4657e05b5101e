//! Why an upstream call produced no usable answer.

use std::time::Duration;

use sluice_jsonrpc::{codes, ErrorObject};

/// EIP-1474's "resource not found".
const RESOURCE_NOT_FOUND: i64 = -32001;

/// A failed upstream call. Displays without addresses or node internals, so it is safe to show
/// to callers; the details are logged where the failure happens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The connection could not be made or broke before an answer arrived.
    #[error("upstream unreachable")]
    Unreachable,
    /// Nothing listens where the node should be (the connection was refused). Shown and counted
    /// as `unreachable`, like any failed connection, but kept apart: it is certain evidence that
    /// the node is down, so the member's circuit opens at once instead of after several failures.
    #[error("upstream unreachable")]
    Refused,
    /// No answer within the deadline.
    #[error("upstream timed out after {0:?}")]
    Timeout(Duration),
    /// The node answered with an HTTP error status and no JSON-RPC answer.
    #[error("upstream answered HTTP {0}")]
    HttpStatus(u16),
    /// The node answered something that is not a JSON-RPC answer to our call.
    #[error("upstream sent an invalid answer: {0}")]
    InvalidResponse(&'static str),
    /// The node's answer exceeded the configured size limit.
    #[error("upstream answer too large")]
    ResponseTooLarge,
    /// No upstream could take the call (all circuits open, or all too far behind).
    #[error("no upstream available")]
    NoneAvailable,
    /// The node refused a batch of this size as a whole (the pool splits it and sends again).
    #[error("upstream refused the batch as too large")]
    BatchRefused,
    /// Every upstream that could take the call has pruned the block it needs.
    #[error("block {block:#x} is not available: the lowest block any upstream keeps is {lowest:#x}")]
    NotCovered {
        /// The lowest block the call needs.
        block: u64,
        /// The lowest block (of the data the call reads) any upstream has.
        lowest: u64,
    },
    /// The call needs a block beyond every upstream's head (an `eth_getLogs` range end, which
    /// a node behind would answer with an empty list that is not evidence).
    #[error("block {block:#x} is beyond the highest upstream head {head:#x}")]
    BeyondHead {
        /// The highest block the call needs.
        block: u64,
        /// The highest head an upstream has.
        head: u64,
    },
    /// Consensus: the upstreams asked did not agree. `answers` counts the upstreams behind each
    /// distinct answer (largest first); `agree` were needed.
    #[error("upstreams disagree: {} distinct answers, {agree} needed to agree", answers.len())]
    Disagreement {
        /// Upstreams per distinct answer, largest first.
        answers: Vec<u32>,
        /// How many had to give the same answer.
        agree: u32,
    },
    /// The node refused for its provider's rate (HTTP 429), with the `Retry-After` it gave.
    #[error("upstream is rate limited")]
    RateLimited(Option<Duration>),
    /// Every upstream that could take the call has spent its rate limit or daily quota.
    #[error("all upstreams are over their request budget; try again later")]
    BudgetExhausted,
}

impl UpstreamError {
    /// A short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Unreachable | UpstreamError::Refused => "unreachable",
            UpstreamError::Timeout(_) => "timeout",
            UpstreamError::HttpStatus(_) => "http_status",
            UpstreamError::InvalidResponse(_) => "invalid_response",
            UpstreamError::ResponseTooLarge => "too_large",
            UpstreamError::NoneAvailable => "none_available",
            UpstreamError::BudgetExhausted => "budget_exhausted",
            UpstreamError::BatchRefused => "batch_refused",
            UpstreamError::NotCovered { .. } => "pruned",
            UpstreamError::BeyondHead { .. } => "beyond_head",
            UpstreamError::Disagreement { answers, agree } if answers.iter().sum::<u32>() < *agree => {
                "consensus_too_few_answers"
            }
            UpstreamError::Disagreement { .. } => "consensus_dispute",
            UpstreamError::RateLimited(_) => "rate_limited",
        }
    }

    /// The JSON-RPC error a caller sees: -32002 (resource unavailable), or -32005 (limit
    /// exceeded) for spent budgets, a message that says which failure it was, and its kind as
    /// `data.reason`.
    pub fn to_error_object(&self) -> ErrorObject {
        let code = match self {
            UpstreamError::BudgetExhausted | UpstreamError::RateLimited(_) => codes::LIMIT_EXCEEDED,
            // EIP-1474 "resource not found": what a node itself says of a block it lacks.
            UpstreamError::NotCovered { .. } | UpstreamError::BeyondHead { .. } => RESOURCE_NOT_FOUND,
            _ => codes::RESOURCE_UNAVAILABLE,
        };
        let data = match self {
            UpstreamError::NotCovered { block, lowest } => {
                serde_json::json!({ "reason": self.kind(), "block": format!("{block:#x}"), "lowest": format!("{lowest:#x}") })
            }
            UpstreamError::BeyondHead { block, head } => {
                serde_json::json!({ "reason": self.kind(), "block": format!("{block:#x}"), "head": format!("{head:#x}") })
            }
            UpstreamError::Disagreement { answers, agree } => {
                serde_json::json!({ "reason": self.kind(), "answers": answers, "agree": agree })
            }
            _ => serde_json::json!({ "reason": self.kind() }),
        };
        ErrorObject::new(code, self.to_string()).with_data(data)
    }
}
