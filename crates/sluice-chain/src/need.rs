//! Which block a call needs, read once from its method and params. Pure code.
//!
//! The gateway resolves a call's [`BlockNeed`] when it parses the call; the cache narrows it
//! when it pins a block, and the upstream pool routes by it: a call that needs block `n` goes
//! only to members whose head covers `n`, one that needs hash `h` to members known to have `h`.
//! Nobody downstream re-reads params to guess.

use serde_json::Value;

use crate::methods::{info, BlockParam, MethodInfo};
use crate::tag::BlockTag;

/// The block a call needs a node to have.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BlockNeed {
    /// No particular block (chain id, transactions by hash, sends).
    #[default]
    Any,
    /// The head, or close to it (`latest`, `pending`, `safe`, `finalized`, an omitted block
    /// parameter, gas prices).
    Head,
    /// One block by height.
    Number(u64),
    /// One block by hash; `number` when the caller's layer knows it (the cache does).
    Hash {
        /// Lower-case `0x…`.
        hash: String,
        /// Its height, if known.
        number: Option<u64>,
    },
    /// Every block of an inclusive range (`eth_getLogs`).
    Range {
        /// First height.
        from: u64,
        /// Last height.
        to: u64,
    },
}

impl BlockNeed {
    /// Reads what `method` with these params needs. Unknown methods and unreadable params
    /// need [`BlockNeed::Any`]: the node will say what is wrong with them.
    pub fn of(method: &str, params: &str) -> BlockNeed {
        BlockNeed::of_row(info(method), params)
    }

    /// [`BlockNeed::of`] for a method whose table row the caller holds.
    pub fn of_row(method: &MethodInfo, params: &str) -> BlockNeed {
        let index = match method.block {
            BlockParam::None => return BlockNeed::Any,
            BlockParam::Head => return BlockNeed::Head,
            BlockParam::Filter => return logs_need(params),
            BlockParam::Hash(index) => {
                return match nth(params, index) {
                    Some(Value::String(hash)) if is_hash(&hash) => {
                        BlockNeed::Hash { hash: hash.to_ascii_lowercase(), number: None }
                    }
                    _ => BlockNeed::Any,
                }
            }
            BlockParam::At { index, .. } => index,
        };
        let Ok(Value::Array(params)) = serde_json::from_str::<Value>(params) else { return BlockNeed::Any };
        match params.get(index) {
            // An omitted block parameter means `latest` for these methods.
            None if index == params.len() => BlockNeed::Head,
            None => BlockNeed::Any,
            Some(value) => BlockTag::parse(value).map_or(BlockNeed::Any, |tag| BlockNeed::of_tag(&tag)),
        }
    }

    /// What a block tag needs.
    pub fn of_tag(tag: &BlockTag) -> BlockNeed {
        match tag {
            BlockTag::Latest | BlockTag::Pending | BlockTag::Safe | BlockTag::Finalized => BlockNeed::Head,
            BlockTag::Earliest => BlockNeed::Number(0),
            BlockTag::Number(n) => BlockNeed::Number(*n),
            BlockTag::Hash(hash) => BlockNeed::Hash { hash: hash.clone(), number: None },
        }
    }

    /// The highest height the call needs, when it names one.
    pub fn highest(&self) -> Option<u64> {
        match self {
            BlockNeed::Number(n) => Some(*n),
            BlockNeed::Hash { number, .. } => *number,
            BlockNeed::Range { to, .. } => Some(*to),
            BlockNeed::Any | BlockNeed::Head => None,
        }
    }

    /// The lowest height the call needs, when it names one.
    pub fn lowest(&self) -> Option<u64> {
        match self {
            BlockNeed::Range { from, .. } => Some(*from),
            other => other.highest(),
        }
    }

    /// True when the answer depends on one particular block (or range) existing on the node,
    /// so that "unknown block" from one node may be answered by another.
    pub fn is_specific(&self) -> bool {
        matches!(self, BlockNeed::Number(_) | BlockNeed::Hash { .. } | BlockNeed::Range { .. })
    }
}

fn logs_need(params: &str) -> BlockNeed {
    let Some(Value::Object(filter)) = nth(params, 0) else { return BlockNeed::Any };
    if let Some(Value::String(hash)) = filter.get("blockHash") {
        return if is_hash(hash) {
            BlockNeed::Hash { hash: hash.to_ascii_lowercase(), number: None }
        } else {
            BlockNeed::Any
        };
    }
    let bound = |field: &str| match filter.get(field) {
        None => Some(BlockTag::Latest),
        Some(v) => BlockTag::parse(v),
    };
    match (bound("fromBlock"), bound("toBlock")) {
        (Some(from), Some(to)) => match (BlockNeed::of_tag(&from), BlockNeed::of_tag(&to)) {
            (BlockNeed::Number(from), BlockNeed::Number(to)) if from <= to => BlockNeed::Range { from, to },
            (_, BlockNeed::Head) => BlockNeed::Head,
            (_, BlockNeed::Number(to)) => BlockNeed::Number(to),
            _ => BlockNeed::Any,
        },
        _ => BlockNeed::Any,
    }
}

fn nth(params: &str, index: usize) -> Option<Value> {
    match serde_json::from_str::<Value>(params) {
        Ok(Value::Array(mut params)) if index < params.len() => Some(params.swap_remove(index)),
        _ => None,
    }
}

fn is_hash(s: &str) -> bool {
    s.len() == 66 && s.starts_with("0x") && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash() -> String {
        format!("0x{}", "ab".repeat(32))
    }

    #[test]
    fn block_parameters_by_position() {
        let a = "\"0x0000000000000000000000000000000000000001\"";
        assert_eq!(BlockNeed::of("eth_getBalance", &format!("[{a},\"0x10\"]")), BlockNeed::Number(16));
        assert_eq!(BlockNeed::of("eth_getBalance", &format!("[{a}]")), BlockNeed::Head, "omitted means latest");
        assert_eq!(BlockNeed::of("eth_getBalance", &format!("[{a},\"pending\"]")), BlockNeed::Head);
        assert_eq!(BlockNeed::of("eth_getBalance", &format!("[{a},\"earliest\"]")), BlockNeed::Number(0));
        assert_eq!(
            BlockNeed::of("eth_getStorageAt", &format!("[{a},\"0x0\",{{\"blockHash\":\"{}\"}}]", hash())),
            BlockNeed::Hash { hash: hash(), number: None }
        );
        assert_eq!(BlockNeed::of("eth_getBlockByNumber", "[\"0x5\",false]"), BlockNeed::Number(5));
        assert_eq!(BlockNeed::of("eth_getBlockByNumber", "[]"), BlockNeed::Head);
        assert_eq!(BlockNeed::of("eth_getBlockByNumber", "[7]"), BlockNeed::Any, "left for the node to refuse");
    }

    #[test]
    fn only_the_block_parameter_is_read_from_the_params() {
        // The call object around it (escapes, nesting, long calldata) is skipped, not read.
        let call = format!(
            r#"{{"to":"0x01","data":"0x{}","note":"a \"quoted\" \u00e9","nested":[{{"a":[1,2]}}]}}"#,
            "ab".repeat(2048)
        );
        assert_eq!(BlockNeed::of("eth_call", &format!("[{call},\"0x2a\"]")), BlockNeed::Number(42));
        assert_eq!(
            BlockNeed::of("eth_call", &format!("[{call}, {{ \"blockNumber\" : \"0x7\" }} ]")),
            BlockNeed::Number(7)
        );
        assert_eq!(BlockNeed::of("eth_call", &format!("[{call}]")), BlockNeed::Head, "omitted means latest");
        assert_eq!(
            BlockNeed::of("eth_call", &format!("[{call},\"0x2a\",{{}}]")),
            BlockNeed::Number(42),
            "state overrides after it"
        );
        // Params that are not one well-formed array need nothing in particular: the node refuses them.
        assert_eq!(BlockNeed::of("eth_call", &format!("[{call},\"0x2a\"")), BlockNeed::Any);
        assert_eq!(BlockNeed::of("eth_call", &format!("{{\"0\":{call}}}")), BlockNeed::Any);
        assert_eq!(BlockNeed::of("eth_getBlockByHash", "[\"0xzz\",false"), BlockNeed::Any);
    }

    #[test]
    fn by_hash_methods_and_others() {
        assert_eq!(
            BlockNeed::of("eth_getBlockByHash", &format!("[\"{}\",false]", hash().to_uppercase().replace("0X", "0x"))),
            BlockNeed::Hash { hash: hash(), number: None }
        );
        assert_eq!(BlockNeed::of("eth_getBlockByHash", "[\"0x12\",false]"), BlockNeed::Any);
        assert_eq!(BlockNeed::of("eth_chainId", "[]"), BlockNeed::Any);
        assert_eq!(BlockNeed::of("eth_getTransactionByHash", &format!("[\"{}\"]", hash())), BlockNeed::Any);
        assert_eq!(BlockNeed::of("eth_blockNumber", "[]"), BlockNeed::Head);
        assert_eq!(BlockNeed::of("eth_call", "not json"), BlockNeed::Any);
    }

    #[test]
    fn log_filters() {
        assert_eq!(
            BlockNeed::of("eth_getLogs", r#"[{"fromBlock":"0x1","toBlock":"0x9"}]"#),
            BlockNeed::Range { from: 1, to: 9 }
        );
        assert_eq!(BlockNeed::of("eth_getLogs", r#"[{"fromBlock":"0x1"}]"#), BlockNeed::Head);
        assert_eq!(BlockNeed::of("eth_getLogs", r#"[{}]"#), BlockNeed::Head);
        assert_eq!(BlockNeed::of("eth_getLogs", r#"[{"fromBlock":"latest","toBlock":"0x9"}]"#), BlockNeed::Number(9));
        assert_eq!(
            BlockNeed::of("eth_getLogs", &format!(r#"[{{"blockHash":"{}"}}]"#, hash())),
            BlockNeed::Hash { hash: hash(), number: None }
        );
        // A reversed range: the node says what is wrong; it needs at least the end block.
        assert_eq!(BlockNeed::of("eth_getLogs", r#"[{"fromBlock":"0x9","toBlock":"0x1"}]"#), BlockNeed::Number(1));
    }

    #[test]
    fn highest_and_specific() {
        assert_eq!(BlockNeed::Range { from: 1, to: 4 }.highest(), Some(4));
        assert_eq!(BlockNeed::Hash { hash: hash(), number: Some(3) }.highest(), Some(3));
        assert!(BlockNeed::Number(1).is_specific());
        assert!(!BlockNeed::Head.is_specific() && !BlockNeed::Any.is_specific());
        assert_eq!(BlockNeed::Range { from: 1, to: 4 }.lowest(), Some(1));
        assert_eq!(BlockNeed::Number(7).lowest(), Some(7));
        assert_eq!(BlockNeed::Head.lowest(), None);
    }

    #[test]
    fn state_reads_and_null_answers() {
        let reads_state = |m| info(m).reads_state();
        assert!(reads_state("eth_getBalance") && reads_state("eth_call") && reads_state("debug_traceCall"));
        assert!(!reads_state("eth_getBlockByNumber") && !reads_state("eth_getLogs"));
        assert!(info("eth_getTransactionReceipt").null_when_unknown);
        assert!(!info("eth_call").null_when_unknown);
    }
}
