//! Transaction decoding and stateless validation: any bytes are refused with a reason or
//! decoded, never a panic; a decoded transaction's hash is keccak of its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_mempool::{decode, Rules};

fuzz_target!(|data: &[u8]| {
    let rules = Rules { chain_id: 31337, ..Rules::default() };
    if let Ok((tx, _)) = decode(data, &rules, std::time::Instant::now()) {
        assert_eq!(tx.hash, alloy_primitives::keccak256(data));
    }
});
