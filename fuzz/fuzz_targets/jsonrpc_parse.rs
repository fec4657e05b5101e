//! JSON-RPC framing: any bytes give an answer or an error, never a panic; ids of parsed calls
//! are valid JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_jsonrpc::{parse_body, Incoming};

fuzz_target!(|data: &[u8]| {
    if let Ok(incoming) = parse_body(data, 100) {
        let items = match incoming {
            Incoming::Single(item) => vec![item],
            Incoming::Batch(items) => items,
        };
        for item in items.into_iter().flatten() {
            if let Some(id) = item.id {
                assert!(serde_json::from_str::<serde_json::Value>(id.get()).is_ok());
            }
        }
    }
});
