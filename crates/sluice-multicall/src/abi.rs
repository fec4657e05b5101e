//! The Multicall3 `aggregate3` call: encoding the calls, decoding the results. Pure.

use alloy_primitives::{address, Address, Bytes};
use alloy_sol_types::{sol, SolCall};

/// Where Multicall3 lives on every chain that has it (deployed with a keyless transaction).
pub const MULTICALL3: Address = address!("cA11bde05977b3631167028862bE2a173976CA11");

sol! {
    /// One call of an aggregate.
    struct Call3 {
        address target;
        bool allowFailure;
        bytes callData;
    }

    /// One call's outcome inside an aggregate.
    struct Result3 {
        bool success;
        bytes returnData;
    }

    /// Multicall3's `aggregate3`: each call made in turn, failures allowed per call.
    function aggregate3(Call3[] calls) external payable returns (Result3[] returnData);
}

/// One call as the aggregate carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subcall {
    /// The contract (or account) called.
    pub to: Address,
    /// The call data.
    pub data: Bytes,
}

/// The `data` of an `eth_call` to Multicall3 running `targets`, every failure allowed (so that
/// one revert does not spoil the others).
pub fn encode(targets: &[Subcall]) -> Vec<u8> {
    let calls = targets.iter().map(|t| Call3 { target: t.to, allowFailure: true, callData: t.data.clone() }).collect();
    aggregate3Call { calls }.abi_encode()
}

/// One call's outcome read back from the aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inner {
    /// It returned this data.
    Returned(Bytes),
    /// It reverted (or ran out of gas) inside the aggregate: only a direct call can tell how.
    Failed,
}

/// Reads the aggregate's return data: one outcome per target, or `None` when the data is not
/// `aggregate3`'s answer for `expected` calls (no code at that block, another contract).
pub fn decode(returned: &[u8], expected: usize) -> Option<Vec<Inner>> {
    let results = aggregate3Call::abi_decode_returns_validate(returned).ok()?;
    if results.len() != expected {
        return None;
    }
    Some(results.into_iter().map(|r| if r.success { Inner::Returned(r.returnData) } else { Inner::Failed }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_sol_types::SolValue;

    #[test]
    fn the_selector_is_multicall3s() {
        assert_eq!(aggregate3Call::SELECTOR, [0x82, 0xad, 0x56, 0xcb]);
        let data = encode(&[Subcall { to: MULTICALL3, data: Bytes::from_static(&[1, 2, 3]) }]);
        assert_eq!(&data[..4], &[0x82, 0xad, 0x56, 0xcb]);
    }

    #[test]
    fn results_are_read_back_in_order_and_wrong_shapes_refused() {
        let results = vec![
            Result3 { success: true, returnData: Bytes::from_static(b"\x00\x2a") },
            Result3 { success: false, returnData: Bytes::from_static(b"\x08\xc3\x79\xa0") },
            Result3 { success: true, returnData: Bytes::new() },
        ];
        let encoded = results.abi_encode();
        let decoded = decode(&encoded, 3).unwrap();
        assert_eq!(
            decoded,
            vec![Inner::Returned(Bytes::from_static(b"\x00\x2a")), Inner::Failed, Inner::Returned(Bytes::new())]
        );
        assert_eq!(decode(&encoded, 2), None, "another count");
        assert_eq!(decode(&[], 3), None, "no code at that block: empty return data");
        assert_eq!(decode(&encoded[..encoded.len() - 1], 3), None, "truncated");
    }
}
