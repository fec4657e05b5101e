//! A FAKE upstream, named as such: a chain that never moves, answered in process. Used only
//! to isolate the mempool's own speed (benches) and to drive the writer without a node
//! (invariant tests); every behaviour against a real node is tested on anvil in
//! `crates/sluice/tests/mempool.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde_json::value::RawValue;
use sluice_jsonrpc::Outcome;
use sluice_upstream::{Answer, Call, UpstreamError, Upstreams};

/// Chain id 31337 at block 1; every account has nonce 0 and a large balance.
#[derive(Default)]
pub struct FixedChain {
    /// Calls answered, all methods.
    pub calls: AtomicU64,
    /// `eth_sendRawTransaction` calls (relayed transactions).
    pub relayed: AtomicU64,
}

#[async_trait]
impl Upstreams for FixedChain {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let req = &call.req;
        self.calls.fetch_add(1, Ordering::Relaxed);
        let result = match req.method.as_str() {
            "eth_chainId" => r#""0x7a69""#,
            "eth_getBlockByNumber" => {
                r#"{"number":"0x1","gasLimit":"0x1c9c380","gasUsed":"0x0","baseFeePerGas":"0x1","transactions":[]}"#
            }
            "eth_getTransactionCount" => r#""0x0""#,
            "eth_getBalance" => r#""0xffffffffffffffffffffffffffff""#,
            "eth_sendRawTransaction" => {
                self.relayed.fetch_add(1, Ordering::Relaxed);
                r#""0x00""#
            }
            _ => "null",
        };
        Ok(Answer::upstream(Outcome::result(RawValue::from_string(result.to_owned()).expect("JSON literal"))))
    }
}
