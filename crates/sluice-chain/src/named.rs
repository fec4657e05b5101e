//! The block an answer names: a receipt's or transaction's block, a block itself, the newest
//! block of a list of logs or receipts, a node's `eth_blockNumber`. Pure code.
//!
//! A client that has been shown block N must never be answered from before N, so the head
//! tracker learns of every block an answer names above the head it serves (see
//! `sluice_upstream::consistency`). Only the fields needed are read; the rest of the answer is
//! skipped by serde without being kept.

use serde::Deserialize;

use crate::methods::{info, Names};
use crate::tag::parse_quantity;

/// A block an answer named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedBlock {
    /// Its height.
    pub number: u64,
    /// Its hash, lower-case, when the answer gave it.
    pub hash: Option<String>,
}

/// Whether answers of `method` may name a block (the methods [`named_block`] reads).
pub fn may_name_block(method: &str) -> bool {
    info(method).names != Names::Nothing
}

/// An object that names its block as transactions, receipts and logs do. The fields borrow
/// from the answer's text (hex has no escapes): a list of logs costs one vector, not two
/// strings per log.
#[derive(Deserialize)]
struct InBlock<'a> {
    #[serde(rename = "blockNumber", borrow)]
    number: Option<&'a str>,
    #[serde(rename = "blockHash", borrow)]
    hash: Option<&'a str>,
}

/// A block, by its own fields.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow)]
    number: Option<&'a str>,
    #[serde(borrow)]
    hash: Option<&'a str>,
}

/// The highest block the answer `result` (JSON text) of `method` names, if any. A pending
/// transaction (no block yet), `null` and anything unreadable name none.
pub fn named_block(method: &str, result: &str) -> Option<NamedBlock> {
    let named = |number: Option<&str>, hash: Option<&str>| {
        Some(NamedBlock { number: parse_quantity(number?)?, hash: hash.map(str::to_ascii_lowercase) })
    };
    match info(method).names {
        Names::Object => {
            let InBlock { number, hash } = serde_json::from_str::<Option<InBlock>>(result).ok()??;
            named(number, hash)
        }
        Names::Block => {
            let Block { number, hash } = serde_json::from_str::<Option<Block>>(result).ok()??;
            named(number, hash)
        }
        Names::List => {
            let newest = serde_json::from_str::<Option<Vec<InBlock>>>(result)
                .ok()??
                .into_iter()
                .filter_map(|item| Some((parse_quantity(item.number?)?, item.hash)))
                .max_by_key(|(number, _)| *number)?;
            Some(NamedBlock { number: newest.0, hash: newest.1.map(str::to_ascii_lowercase) })
        }
        Names::Number => named(serde_json::from_str::<&str>(result).ok(), None),
        Names::Nothing => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(number: u64, hash: &str) -> Option<NamedBlock> {
        Some(NamedBlock { number, hash: Some(hash.to_owned()) })
    }

    #[test]
    fn receipts_and_transactions_name_their_block_pending_ones_none() {
        let receipt = r#"{"blockNumber":"0x1f","blockHash":"0xAB","logs":[{"blockNumber":"0x1f"}],"status":"0x1"}"#;
        assert_eq!(named_block("eth_getTransactionReceipt", receipt), block(31, "0xab"));
        assert_eq!(named_block("eth_sendRawTransactionSync", receipt), block(31, "0xab"));
        let pending = r#"{"blockNumber":null,"blockHash":null,"hash":"0x01","nonce":"0x0"}"#;
        assert_eq!(named_block("eth_getTransactionByHash", pending), None);
        assert_eq!(named_block("eth_getTransactionReceipt", "null"), None);
    }

    #[test]
    fn blocks_name_themselves_not_their_transactions() {
        let full = r#"{"number":"0x10","hash":"0xcd","transactions":[{"blockNumber":"0x10","blockHash":"0xcd"}]}"#;
        assert_eq!(named_block("eth_getBlockByNumber", full), block(16, "0xcd"));
        assert_eq!(named_block("eth_getBlockByHash", full), block(16, "0xcd"));
        // A pending block has no hash and no number on some nodes.
        assert_eq!(named_block("eth_getBlockByNumber", r#"{"number":null,"hash":null}"#), None);
    }

    #[test]
    fn lists_name_their_newest_block() {
        let logs = r#"[{"blockNumber":"0x5","blockHash":"0x05"},{"blockNumber":"0x7","blockHash":"0x07"},{"blockNumber":"0x6","blockHash":"0x06"}]"#;
        assert_eq!(named_block("eth_getLogs", logs), block(7, "0x07"));
        assert_eq!(named_block("eth_getLogs", "[]"), None);
        assert_eq!(
            named_block("eth_getBlockReceipts", r#"[{"blockNumber":"0x9","blockHash":"0x09"}]"#),
            block(9, "0x09")
        );
    }

    #[test]
    fn a_nodes_block_number_names_a_height_without_a_hash() {
        assert_eq!(named_block("eth_blockNumber", r#""0x2a""#), Some(NamedBlock { number: 42, hash: None }));
        assert_eq!(named_block("eth_blockNumber", "42"), None);
    }

    #[test]
    fn other_methods_and_unreadable_answers_name_nothing() {
        assert!(!may_name_block("eth_call"));
        assert_eq!(named_block("eth_call", r#"{"blockNumber":"0x1"}"#), None);
        assert_eq!(named_block("eth_getTransactionReceipt", "{not json"), None);
        assert_eq!(named_block("eth_getLogs", r#"{"blockNumber":"0x1"}"#), None);
        for method in ["eth_getTransactionReceipt", "eth_getBlockByHash", "eth_getLogs", "eth_blockNumber"] {
            assert!(may_name_block(method), "{method}");
        }
    }
}
