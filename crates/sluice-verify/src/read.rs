//! The state reads sluice verifies, read from a call's params, and their answers made from a
//! checked proof in the format the node would have used.

use alloy_primitives::{Address, Bytes, B256};
use alloy_rpc_types_eth::{EIP1186AccountProofResponse, Filter};
use alloy_serde::JsonStorageKey;
use serde_json::Value;
use sluice_chain::methods::{MethodInfo, VerifyBy};
use sluice_chain::BlockTag;

use crate::proof::slot_word;

/// What a state read asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// `eth_getBalance`.
    Balance,
    /// `eth_getTransactionCount`.
    Nonce,
    /// `eth_getCode`.
    Code,
    /// `eth_getStorageAt`.
    Slot(B256),
    /// `eth_getProof`, of these slots.
    Proof(Vec<B256>),
}

/// A read sluice verifies, from its method's row and its params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// Of an account's state, from its proof.
    State(StateRead),
    /// A block (`eth_getBlockByNumber`/`ByHash`), with full transactions or their hashes.
    Block {
        /// Which block.
        at: BlockTag,
        /// Full transaction objects.
        full: bool,
    },
    /// A block's receipts (`eth_getBlockReceipts`).
    BlockReceipts(BlockTag),
    /// One receipt (`eth_getTransactionReceipt`), by transaction hash.
    Receipt(B256),
    /// One transaction (`eth_getTransactionByHash`), by its hash.
    Transaction(B256),
    /// Logs (`eth_getLogs`) of a filter.
    Logs(Box<Filter>),
}

impl Read {
    /// The read a method (its row) with `params` makes; `Ok(None)` when sluice does not verify
    /// it, `Err` when its params are not what it takes.
    pub fn of(info: &MethodInfo, params: &[Value]) -> Result<Option<Self>, String> {
        let Some(by) = info.verify else { return Ok(None) };
        let tag = |value: Option<&Value>| match value {
            None | Some(Value::Null) => Ok(BlockTag::Latest),
            Some(value) => BlockTag::parse(value).ok_or("expected a block number, tag or hash"),
        };
        Ok(Some(match by {
            VerifyBy::Block => {
                let full = match params.get(1) {
                    Some(Value::Bool(full)) => *full,
                    None => false,
                    Some(_) => return Err("expected a boolean (full transactions)".into()),
                };
                let at = match params.first() {
                    Some(Value::String(hash)) if hash.len() == 66 => {
                        BlockTag::Hash(hash.parse::<B256>().map_err(|_| "expected a block hash")?.to_string())
                    }
                    value => tag(value)?,
                };
                Read::Block { at, full }
            }
            VerifyBy::BlockReceipts => Read::BlockReceipts(tag(params.first())?),
            VerifyBy::Logs => {
                let filter = params.first().and_then(|f| serde_json::from_value::<Filter>(f.clone()).ok());
                Read::Logs(Box::new(filter.ok_or("expected a filter object")?))
            }
            VerifyBy::Receipt | VerifyBy::Transaction => {
                let hash = params.first().and_then(|h| serde_json::from_value::<B256>(h.clone()).ok());
                let hash = hash.ok_or("expected a transaction hash")?;
                if by == VerifyBy::Receipt {
                    Read::Receipt(hash)
                } else {
                    Read::Transaction(hash)
                }
            }
            _ => match StateRead::of(info, params)? {
                Some(read) => Read::State(read),
                None => return Ok(None),
            },
        }))
    }
}

/// A state read: of which account, what, at which block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRead {
    /// The account.
    pub address: Address,
    /// What of it.
    pub asked: Asked,
    /// At which block (omitted: `latest`).
    pub block: BlockTag,
}

impl StateRead {
    /// The read a method (its row in the method table) with `params` makes; `Ok(None)` when
    /// it is not a state read sluice verifies, `Err` when its params are not what it takes.
    pub fn of(info: &MethodInfo, params: &[Value]) -> Result<Option<Self>, String> {
        let Some(read) = info.verify else { return Ok(None) };
        let (asked, block_at) = match read {
            VerifyBy::Balance => (Asked::Balance, 1),
            VerifyBy::Nonce => (Asked::Nonce, 1),
            VerifyBy::Code => (Asked::Code, 1),
            VerifyBy::Slot => (Asked::Slot(slot(params.get(1))?), 2),
            VerifyBy::Proof => {
                let slots = match params.get(1) {
                    Some(Value::Array(keys)) => keys.iter().map(|k| slot(Some(k))).collect::<Result<_, _>>()?,
                    _ => return Err("expected an array of storage keys".into()),
                };
                (Asked::Proof(slots), 2)
            }
            VerifyBy::Block | VerifyBy::BlockReceipts | VerifyBy::Receipt | VerifyBy::Transaction | VerifyBy::Logs => {
                return Ok(None)
            }
        };
        let address = params
            .first()
            .and_then(|a| serde_json::from_value::<Address>(a.clone()).ok())
            .ok_or("expected an address")?;
        let block = match params.get(block_at) {
            None | Some(Value::Null) => BlockTag::Latest,
            Some(value) => BlockTag::parse(value).ok_or("expected a block number, tag or hash")?,
        };
        if params.len() > block_at + 1 {
            return Err("too many params".into());
        }
        Ok(Some(Self { address, asked, block }))
    }

    /// The slots its proof must cover.
    pub fn slots(&self) -> Vec<B256> {
        match &self.asked {
            Asked::Slot(slot) => vec![*slot],
            Asked::Proof(slots) => slots.clone(),
            _ => Vec::new(),
        }
    }

    /// The answer, from a checked proof (and the code checked against it, for `eth_getCode`);
    /// `eth_getProof` answers the node's own JSON (`proof_json`), checked.
    pub fn answer(&self, proof: &EIP1186AccountProofResponse, code: Option<&Bytes>, proof_json: &Value) -> Value {
        match &self.asked {
            Asked::Balance => Value::String(format!("{:#x}", proof.balance)),
            Asked::Nonce => Value::String(format!("{:#x}", proof.nonce)),
            Asked::Code => Value::String(format!("{}", code.cloned().unwrap_or_default())),
            Asked::Slot(_) => {
                let value = proof.storage_proof.first().map(|s| s.value).unwrap_or_default();
                Value::String(format!("{:#x}", slot_word(value)))
            }
            Asked::Proof(_) => proof_json.clone(),
        }
    }
}

/// A storage key as nodes take it: 32 bytes, or a quantity.
fn slot(value: Option<&Value>) -> Result<B256, String> {
    value
        .and_then(|v| serde_json::from_value::<JsonStorageKey>(v.clone()).ok())
        .map(|k| k.as_b256())
        .ok_or_else(|| "expected a storage key".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_chain::methods::info;

    #[test]
    fn each_state_read_is_read_from_its_params() {
        let a = "0x00000000000000000000000000000000000000aa";
        let read = StateRead::of(info("eth_getBalance"), &[json!(a)]).unwrap().unwrap();
        assert_eq!((read.asked, read.block), (Asked::Balance, BlockTag::Latest));
        let read = StateRead::of(info("eth_getStorageAt"), &[json!(a), json!("0x3"), json!("0x10")]).unwrap().unwrap();
        assert_eq!(read.asked, Asked::Slot(B256::with_last_byte(3)));
        assert_eq!(read.block, BlockTag::Number(0x10));
        let hash = format!("0x{}", "ab".repeat(32));
        let read =
            StateRead::of(info("eth_getProof"), &[json!(a), json!(["0x1", "0x2"]), json!({ "blockHash": hash })])
                .unwrap()
                .unwrap();
        assert_eq!(read.slots(), [B256::with_last_byte(1), B256::with_last_byte(2)]);
        assert_eq!(read.block, BlockTag::Hash(hash));
        assert_eq!(StateRead::of(info("eth_call"), &[]), Ok(None));
        assert!(StateRead::of(info("eth_getBalance"), &[json!("0x12")]).is_err());
        assert!(StateRead::of(info("eth_getBalance"), &[json!(a), json!("soon")]).is_err());
        assert!(StateRead::of(info("eth_getCode"), &[json!(a), json!("latest"), json!(1)]).is_err());
    }

    #[test]
    fn answers_are_in_the_nodes_formats() {
        let read = |asked| StateRead { address: Address::ZERO, asked, block: BlockTag::Latest };
        let proof = EIP1186AccountProofResponse { balance: alloy_primitives::U256::from(1000), ..Default::default() };
        assert_eq!(read(Asked::Balance).answer(&proof, None, &Value::Null), json!("0x3e8"));
        assert_eq!(read(Asked::Nonce).answer(&proof, None, &Value::Null), json!("0x0"));
        assert_eq!(
            read(Asked::Slot(B256::ZERO)).answer(&proof, None, &Value::Null),
            json!(format!("0x{}", "00".repeat(32))),
            "an empty slot is 32 zero bytes"
        );
        assert_eq!(
            read(Asked::Code).answer(&proof, Some(&Bytes::from_static(&[0x60, 0x00])), &Value::Null),
            json!("0x6000")
        );
        assert_eq!(read(Asked::Code).answer(&proof, None, &Value::Null), json!("0x"));
    }
}
