//! A block header as a node sends it, checked: its hash recomputed from its fields.
//!
//! A node's block object carries the header's fields and more (its hash, size, total
//! difficulty, transactions, uncles, withdrawals). The header is read from the fields of every
//! fork through Prague (alloy's `Header`), RLP-encoded and hashed; the result must be the hash
//! the node named. A field sluice does not know fails closed: a fork that adds one would
//! otherwise be hashed without it, and every header of that chain refused as forged, which is
//! the safe way to be wrong.

use alloy_consensus::Header;
use alloy_primitives::{Bloom, B256};
use serde_json::Value;

use crate::Unverified;

/// The header fields of every fork through Prague, as nodes name them.
const HEADER_FIELDS: &[&str] = &[
    "parentHash",
    "sha3Uncles",
    "miner",
    "stateRoot",
    "transactionsRoot",
    "receiptsRoot",
    "logsBloom",
    "difficulty",
    "number",
    "gasLimit",
    "gasUsed",
    "timestamp",
    "extraData",
    "mixHash",
    "nonce",
    "baseFeePerGas",
    "withdrawalsRoot",
    "blobGasUsed",
    "excessBlobGas",
    "parentBeaconBlockRoot",
    "requestsHash",
];

/// What a block object carries besides its header.
const BODY_FIELDS: &[&str] = &["hash", "size", "totalDifficulty", "transactions", "uncles", "withdrawals"];

/// A header whose hash was recomputed from its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedHeader {
    /// Its hash, as recomputed.
    pub hash: B256,
    /// Its height.
    pub number: u64,
    /// Its parent's hash: what links it to the headers before it.
    pub parent: B256,
    /// The root of the state after the block.
    pub state_root: B256,
    /// The bloom of every log of the block: a filter it does not match has no log there.
    pub logs_bloom: Bloom,
}

/// Checks a block object (`eth_getBlockBy…` with or without transactions): its header's hash
/// recomputed must be the hash it names.
pub fn check_header(block: &Value) -> Result<CheckedHeader, Unverified> {
    let Some(object) = block.as_object() else {
        return Err(Unverified::Header("not a block object".into()));
    };
    let mut fields = serde_json::Map::new();
    for (name, value) in object {
        if HEADER_FIELDS.contains(&name.as_str()) {
            fields.insert(name.clone(), value.clone());
        } else if !BODY_FIELDS.contains(&name.as_str()) {
            return Err(Unverified::Header(format!("unknown header field {name:?}")));
        }
    }
    let named: B256 = object
        .get("hash")
        .and_then(|h| serde_json::from_value(h.clone()).ok())
        .ok_or_else(|| Unverified::Header("no hash".into()))?;
    let header: Header =
        serde_json::from_value(Value::Object(fields)).map_err(|e| Unverified::Header(format!("unreadable: {e}")))?;
    let hash = header.hash_slow();
    if hash != named {
        return Err(Unverified::Header(format!("its fields hash to {hash}, not {named}")));
    }
    Ok(CheckedHeader {
        hash,
        number: header.number,
        parent: header.parent_hash,
        state_root: header.state_root,
        logs_bloom: header.logs_bloom,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mainnet block 22,431,084 (Prague: every field through `requestsHash`), as geth sends it.
    pub(crate) const PRAGUE_BLOCK: &str = r#"{
        "baseFeePerGas":"0x1f9a7e4c","blobGasUsed":"0x40000","difficulty":"0x0",
        "excessBlobGas":"0x0","extraData":"0x546974616e2028746974616e6275696c6465722e78797a29",
        "gasLimit":"0x2255100","gasUsed":"0x1d5e5a0",
        "hash":"0x0000000000000000000000000000000000000000000000000000000000000000",
        "logsBloom":"0x00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "miner":"0x4838b106fce9647bdf1e7877bf73ce8b0bad5f97",
        "mixHash":"0x1b3dc9bd2d8ad7b6e1e3e1c59c8ea3e8e6b2e4a7b5a3f9c3d0d5f8b1a7c3e9d1",
        "nonce":"0x0000000000000000","number":"0x1564a6c",
        "parentBeaconBlockRoot":"0x3b8c5b6fa8b8fd3a1b2a8d0a3a4e0b0c6e1f2d3c4b5a69788796a5b4c3d2e1f0",
        "parentHash":"0x9a6c2b4f7e3d1c0b8a9f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291",
        "receiptsRoot":"0x6c0b7f3e2d1a0918f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180",
        "requestsHash":"0xe3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "sha3Uncles":"0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347",
        "size":"0x1d8e1","stateRoot":"0x5e2b9d8c7a6f5e4d3c2b1a0918f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5",
        "timestamp":"0x681c3f5b","totalDifficulty":"0x0","transactions":[],
        "transactionsRoot":"0x2a1908f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3",
        "uncles":[],"withdrawals":[],
        "withdrawalsRoot":"0x56e81f171bcc55a6ff8345e692c0f86e5b48e01b996cadc001622fb5e363b421"
    }"#;

    fn block() -> Value {
        let mut block: Value = serde_json::from_str(PRAGUE_BLOCK).unwrap();
        // The fields above are made up: name the hash they really hash to, as a node would.
        let mut fields = block.clone();
        for body in BODY_FIELDS {
            fields.as_object_mut().unwrap().remove(*body);
        }
        let header: Header = serde_json::from_value(fields).unwrap();
        block["hash"] = serde_json::to_value(header.hash_slow()).unwrap();
        block
    }

    #[test]
    fn a_headers_hash_is_recomputed_from_every_field_through_prague() {
        let block = block();
        let checked = check_header(&block).expect("the named hash is the fields' hash");
        assert_eq!(checked.number, 0x1564a6c);
        assert_eq!(format!("{:#x}", checked.hash), block["hash"].as_str().unwrap());
        // Any field changed, the hash no longer holds: the state root a liar would swap.
        let mut forged = block.clone();
        forged["stateRoot"] = Value::String(format!("0x{}", "11".repeat(32)));
        assert!(matches!(check_header(&forged), Err(Unverified::Header(m)) if m.contains("hash to")));
        // A Prague field left out changes the encoding too.
        let mut short = block.clone();
        short.as_object_mut().unwrap().remove("requestsHash");
        assert!(check_header(&short).is_err());
    }

    #[test]
    fn a_field_sluice_does_not_know_fails_closed() {
        let mut block = block();
        block["someFutureRoot"] = Value::String(format!("0x{}", "22".repeat(32)));
        assert!(matches!(check_header(&block), Err(Unverified::Header(m)) if m.contains("someFutureRoot")));
        assert!(check_header(&Value::Null).is_err());
    }
}
