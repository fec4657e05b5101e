//! The `config_parse` fuzz target's property, run briefly on every test run.

use proptest::prelude::*;

proptest! {
    /// Any text built from configuration fragments is a configuration or an error, never
    /// a panic.
    #[test]
    fn config_like_text_never_panics(parts in proptest::collection::vec(prop_oneof![
        Just("[cache]\n"), Just("[mempool]\n"), Just("[access]\n"), Just("[access.tiers.t]\n"), Just("[logs]\n"),
        Just("[[upstreams]]\n"), Just("url = \"http://127.0.0.1:1\"\n"), Just("enabled = false\n"),
        Just("per_second = -1\n"), Just("max_block_range = 0\n"), Just("deny = [\"a*b\"]\n"), Just("x = 1\n"),
        Just("listen = \"nope\"\n"), Just("timeout = \"5s\"\n"), Just("[ingress]\n"), Just("[ingress.weights]\n"),
        Just("capacity = 0\n"), Just("min_streams = 0\n"), Just("fsync = \"never\"\n"), Just("=\n"), Just("\"\n"),
    ], 0..12)) {
        let _ = super::parse_toml(&parts.concat());
    }
}
