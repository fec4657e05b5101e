//! Integrity checks on members' answers: what a right-looking answer from an imperfect node can
//! still get wrong. Pure: the facts the pool knows are passed in.
//!
//! * `highest_head`: head-bound reads go to the members at the best head first, a `latest`
//!   block older than the head already served is asked of another member, and
//!   `eth_blockNumber` never goes backwards for clients.
//! * `retry_nulls`: a `null` block, transaction or receipt that another member should have
//!   (a height at or below the served head, a hash some member is known to have, a transaction
//!   a layer above knows was mined) is asked of another member before it is returned.
//! * `logs_need_head`: `eth_getLogs` goes only to members whose head reaches the range's end;
//!   an empty list from a member behind is not evidence.

use serde::{Deserialize, Serialize};
use sluice_chain::{parse_quantity, BlockNeed};
use sluice_jsonrpc::Outcome;

use crate::{Call, UpstreamError};

/// Which integrity checks are on (all, by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntegrityConfig {
    /// `eth_blockNumber` and `latest` never go backwards for clients.
    pub highest_head: bool,
    /// A `null` block, transaction or receipt another member should have is asked of another
    /// member first.
    pub retry_nulls: bool,
    /// `eth_getLogs` is answered only by members whose head reaches the range's end.
    pub logs_need_head: bool,
}

impl Default for IntegrityConfig {
    fn default() -> Self {
        Self { highest_head: true, retry_nulls: true, logs_need_head: true }
    }
}

impl IntegrityConfig {
    /// Every check off.
    pub fn off() -> Self {
        Self { highest_head: false, retry_nulls: false, logs_need_head: false }
    }
}

/// What the pool knows when it judges an answer.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Facts {
    /// The highest head of a member.
    pub(super) best_head: Option<u64>,
    /// Some member is known to have the block hash the call needs.
    pub(super) hash_known: bool,
}

/// Why an answer that looks good is not trusted yet; the pool asks another member, and gives
/// this answer only when no member gives a better one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Suspect {
    /// `null` for an object another member should have.
    Null,
    /// A `latest` block older than the best head.
    Behind,
    /// A result the call's own check refused (a proof that does not hold).
    Unproven,
}

impl Suspect {
    /// For the `reason` label of `sluice_pool_integrity_retries_total`.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Suspect::Null => "null",
            Suspect::Behind => "behind",
            Suspect::Unproven => "unproven",
        }
    }
}

/// Judges an answer to `call`; `facts` is asked only for answers a check applies to (it takes
/// the members' locks).
pub(super) fn suspect(
    config: &IntegrityConfig,
    call: &Call,
    outcome: &Result<Outcome, UpstreamError>,
    facts: impl FnOnce() -> Facts,
) -> Option<Suspect> {
    let Ok(Outcome::Result(raw)) = outcome else { return None };
    if let Some(check) = &call.ctx.check {
        if (check.0)(raw.get()).is_err() {
            return Some(Suspect::Unproven);
        }
    }
    let method = call.method();
    if config.retry_nulls && raw.get() == "null" && call.info.null_when_unknown {
        let facts = facts();
        let should_exist = match &call.ctx.needs {
            BlockNeed::Number(n) => facts.best_head.is_some_and(|head| *n <= head),
            BlockNeed::Hash { number, .. } => {
                facts.hash_known || number.zip(facts.best_head).is_some_and(|(n, head)| n <= head)
            }
            BlockNeed::Head => true,
            BlockNeed::Any | BlockNeed::Range { .. } => call.ctx.expect_found,
        };
        return should_exist.then_some(Suspect::Null);
    }
    if config.highest_head && method == "eth_getBlockByNumber" && call.ctx.needs == BlockNeed::Head {
        let number = block_number(raw.get())?;
        return facts().best_head.is_some_and(|head| number < head).then_some(Suspect::Behind);
    }
    None
}

/// The `number` of a block object.
pub(super) fn block_number(json: &str) -> Option<u64> {
    #[derive(Deserialize)]
    struct Numbered {
        number: String,
    }
    parse_quantity(&serde_json::from_str::<Numbered>(json).ok()?.number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_jsonrpc::RawValue;

    fn result(json: &str) -> Result<Outcome, UpstreamError> {
        Ok(Outcome::result(RawValue::from_string(json.to_owned()).unwrap()))
    }

    fn facts(best: u64) -> impl FnOnce() -> Facts {
        move || Facts { best_head: Some(best), hash_known: false }
    }

    #[test]
    fn a_null_for_a_block_at_or_below_the_head_is_suspect_and_beyond_it_is_not() {
        let on = IntegrityConfig::default();
        let block = |n: u64| Call::internal("eth_getBlockByNumber", Some(&format!("[\"{n:#x}\",false]")));
        assert_eq!(suspect(&on, &block(10), &result("null"), facts(12)), Some(Suspect::Null));
        assert_eq!(suspect(&on, &block(13), &result("null"), facts(12)), None, "not mined yet");
        assert_eq!(suspect(&IntegrityConfig::off(), &block(10), &result("null"), facts(12)), None);
        let receipt = Call::internal("eth_getTransactionReceipt", Some(&format!("[\"0x{}\"]", "ab".repeat(32))));
        assert_eq!(suspect(&on, &receipt, &result("null"), facts(12)), None, "may well be pending");
        let mut mined = receipt.clone();
        mined.ctx.expect_found = true;
        assert_eq!(suspect(&on, &mined, &result("null"), facts(12)), Some(Suspect::Null));
        let call = Call::internal("eth_call", Some("[{},\"0x1\"]"));
        assert_eq!(suspect(&on, &call, &result("null"), facts(12)), None, "null is a value there");
    }

    #[test]
    fn a_latest_block_older_than_the_best_head_is_suspect() {
        let on = IntegrityConfig::default();
        let latest = Call::internal("eth_getBlockByNumber", Some("[\"latest\",false]"));
        assert_eq!(suspect(&on, &latest, &result(r#"{"number":"0x9"}"#), facts(10)), Some(Suspect::Behind));
        assert_eq!(suspect(&on, &latest, &result(r#"{"number":"0xa"}"#), facts(10)), None);
        assert_eq!(suspect(&on, &latest, &result("null"), facts(10)), Some(Suspect::Null));
    }
}
