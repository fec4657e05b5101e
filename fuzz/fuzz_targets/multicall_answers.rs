//! What the aggregation layer reads from the network: any `eth_call` params are judged
//! eligible or not, and any bytes as an `aggregate3` answer are read back or refused, never a
//! panic; what qualifies keeps its block parameter as sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_multicall::{abi, eligible};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(e) = eligible(text) {
            if let Some(block) = &e.block {
                assert!(text.contains(block.as_str()), "the block parameter is the caller's own");
            }
            let encoded = abi::encode(std::slice::from_ref(&e.target));
            assert_eq!(&encoded[..4], &[0x82, 0xad, 0x56, 0xcb]);
        }
    }
    let expected = data.first().map_or(0, |b| usize::from(*b % 8));
    if let Some(results) = abi::decode(data, expected) {
        assert_eq!(results.len(), expected);
    }
});
