//! Block parameters: tags, numbers and EIP-1898 objects.

use serde_json::Value;

/// What a block parameter names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockTag {
    /// The newest block.
    Latest,
    /// The newest block the consensus layer calls safe.
    Safe,
    /// The newest finalized block.
    Finalized,
    /// The block being built; never cacheable.
    Pending,
    /// Block 0.
    Earliest,
    /// A block by number.
    Number(u64),
    /// A block by hash (EIP-1898 `{"blockHash": …}`), lower-case `0x…`.
    Hash(String),
}

impl BlockTag {
    /// Reads a block parameter: a tag string, a hex number, or an EIP-1898 object.
    /// `None` for anything else (left for the node to reject).
    pub fn parse(value: &Value) -> Option<BlockTag> {
        match value {
            Value::String(s) => Self::parse_str(s),
            Value::Object(map) => {
                if let Some(Value::String(hash)) = map.get("blockHash") {
                    is_hash(hash).then(|| BlockTag::Hash(hash.to_ascii_lowercase()))
                } else if let Some(Value::String(number)) = map.get("blockNumber") {
                    Self::parse_str(number)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    fn parse_str(s: &str) -> Option<BlockTag> {
        Some(match s {
            "latest" => BlockTag::Latest,
            "safe" => BlockTag::Safe,
            "finalized" => BlockTag::Finalized,
            "pending" => BlockTag::Pending,
            "earliest" => BlockTag::Earliest,
            hex => {
                if is_hash(hex) {
                    return Some(BlockTag::Hash(hex.to_ascii_lowercase()));
                }
                BlockTag::Number(parse_quantity(hex)?)
            }
        })
    }
}

/// Parses a JSON-RPC quantity (`0x…`, no leading zeros required).
pub fn parse_quantity(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

fn is_hash(s: &str) -> bool {
    s.len() == 66 && s.starts_with("0x") && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_every_form() {
        let h = format!("0x{}", "Ab".repeat(32));
        assert_eq!(BlockTag::parse(&json!("latest")), Some(BlockTag::Latest));
        assert_eq!(BlockTag::parse(&json!("pending")), Some(BlockTag::Pending));
        assert_eq!(BlockTag::parse(&json!("0x1f")), Some(BlockTag::Number(31)));
        assert_eq!(BlockTag::parse(&json!({"blockNumber": "0x2"})), Some(BlockTag::Number(2)));
        assert_eq!(BlockTag::parse(&json!({"blockHash": h})), Some(BlockTag::Hash(h.to_lowercase())));
        assert_eq!(BlockTag::parse(&json!(h)), Some(BlockTag::Hash(h.to_lowercase())));
        for bad in [json!("0x"), json!("12"), json!(5), json!("0x10000000000000000"), json!({})] {
            assert_eq!(BlockTag::parse(&bad), None, "{bad}");
        }
    }
}
