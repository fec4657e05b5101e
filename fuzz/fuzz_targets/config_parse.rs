//! Configuration parsing and validation: any text is accepted or refused with a message,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = sluice::config::parse_toml(text);
    }
});
