//! Which `eth_call`s an aggregate can carry exactly. Pure.
//!
//! Inside `aggregate3` a call runs with Multicall3 as its sender, no value, the state of the
//! block the aggregate runs at, and whatever gas is left. So only calls that set nothing but
//! `to` and `data` (or `input`) qualify: no `from` (a direct call's sender is then the zero
//! address, which no contract can tell from Multicall3 except through `msg.sender`), no
//! `value`, no `gas` or fee fields (a call that would run out of its own gas limit must fail as
//! it would alone), no access list, no state or block overrides. Anything unusual, including
//! malformed fields, goes to the node as sent, so its own error reaches the caller.

use alloy_primitives::{Address, Bytes};
use serde_json::value::RawValue;

use crate::abi::Subcall;

/// An `eth_call` an aggregate can carry: its target and the block it runs at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligible {
    /// What to call.
    pub target: Subcall,
    /// The block parameter's JSON text as sent (or pinned by the cache); `None` when the
    /// caller sent none (the node's default, `latest`). Calls are grouped by it.
    pub block: Option<String>,
}

/// The call object's fields an aggregate can carry.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CallObject<'a> {
    to: &'a str,
    #[serde(default)]
    data: Option<&'a str>,
    #[serde(default)]
    input: Option<&'a str>,
}

/// Reads `params` of an `eth_call`; `None` when it cannot be aggregated exactly.
pub fn eligible(params: &str) -> Option<Eligible> {
    let params: Vec<&RawValue> = serde_json::from_str(params).ok()?;
    let (object, block) = match params.as_slice() {
        [object] => (object, None),
        [object, block] => (object, Some(block.get().trim().to_owned())),
        _ => return None, // state overrides, block overrides, or nothing at all
    };
    let object: CallObject = serde_json::from_str(object.get()).ok()?;
    let to: Address = strict_hex(object.to).filter(|b| b.len() == 20).map(|b| Address::from_slice(&b))?;
    let data = match (object.data, object.input) {
        (Some(d), Some(i)) if d != i => return None, // the node's rule decides between them
        (Some(d), _) | (None, Some(d)) => strict_hex(d)?,
        (None, None) => Vec::new(),
    };
    if block.as_deref() == Some("null") {
        return None;
    }
    Some(Eligible { target: Subcall { to, data: Bytes::from(data) }, block })
}

/// `0x`-prefixed hex with an even number of digits; anything else is left to the node.
fn strict_hex(text: &str) -> Option<Vec<u8>> {
    let digits = text.strip_prefix("0x")?;
    if digits.len() % 2 != 0 {
        return None;
    }
    alloy_primitives::hex::decode(digits).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TO: &str = "0x5fbdb2315678afecb367f032d93f642f64180aa3";

    #[test]
    fn plain_calls_qualify_and_keep_their_block() {
        let e = eligible(&format!(r#"[{{"to":"{TO}","data":"0x70a08231"}},"latest"]"#)).unwrap();
        assert_eq!((e.target.data.as_ref(), e.block.as_deref()), (&[0x70, 0xa0, 0x82, 0x31][..], Some(r#""latest""#)));
        let e = eligible(&format!(r#"[{{"to":"{TO}","input":"0x"}}]"#)).unwrap();
        assert_eq!((e.target.data.len(), e.block), (0, None));
        let e = eligible(&format!(r#"[{{"to":"{TO}"}}, {{"blockHash":"0xab"}}]"#)).unwrap();
        assert_eq!(e.block.as_deref(), Some(r#"{"blockHash":"0xab"}"#));
        assert!(eligible(&format!(r#"[{{"to":"{TO}","data":"0x01","input":"0x01"}},"0x5"]"#)).is_some());
    }

    #[test]
    fn anything_an_aggregate_would_change_goes_direct() {
        for params in [
            format!(r#"[{{"to":"{TO}","from":"{TO}","data":"0x"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}","value":"0x1"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}","gas":"0x5208"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}","gasPrice":"0x1"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}","accessList":[]}},"latest"]"#),
            format!(r#"[{{"to":"{TO}"}},"latest",{{"{TO}":{{"balance":"0x1"}}}}]"#),
            format!(r#"[{{"to":"{TO}"}},"latest",{{}},{{"number":"0x1"}}]"#),
            format!(r#"[{{"to":"{TO}","data":"0x01","input":"0x02"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}","data":"0x1"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}","data":"zz"}},"latest"]"#),
            format!(r#"[{{"to":"{TO}"}},null]"#),
            r#"[{"data":"0x6080"},"latest"]"#.to_owned(),
            r#"[{"to":"0x1234","data":"0x"},"latest"]"#.to_owned(),
            r#"[]"#.to_owned(),
            r#"{"to":"0x"}"#.to_owned(),
            "not json".to_owned(),
        ] {
            assert_eq!(eligible(&params), None, "{params}");
        }
    }
}
