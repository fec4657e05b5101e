//! Shared set-up of the verified-reads tests: an account with a balance, a nonce, code and a
//! slot, and sluice verifying in front of a node.

use serde_json::json;
use sluice_testkit::rpc_result;

/// An account `craft` gives a balance, a nonce, code and a slot.
pub const ACCOUNT: &str = "0x00000000000000000000000000000000000c0de1";
/// An account that never existed.
pub const ABSENT: &str = "0x00000000000000000000000000000000000a0b5e";
/// The slot `craft` sets (to 42).
pub const SLOT: &str = "0x0000000000000000000000000000000000000000000000000000000000000007";
/// A slot never written (anvil takes only 32-byte storage keys in `eth_getProof`).
pub const EMPTY_SLOT: &str = "0x0000000000000000000000000000000000000000000000000000000000000008";

/// sluice verifying in front of `upstream`; `extra` continues the `[verify]` section.
pub fn verifying(upstream: &str, extra: &str) -> super::Configured {
    super::with_config(&format!(
        "[mempool]\nenabled = false\n[verify]\nenabled = true\n{extra}\n[[upstreams]]\nurl = \"{upstream}\"\n"
    ))
}

/// Gives `ACCOUNT` a balance, a nonce, code and one storage slot, then mines a block.
pub async fn craft(client: &reqwest::Client, anvil: &str) {
    rpc_result(client, anvil, "anvil_setBalance", json!([ACCOUNT, "0x1bc16d674ec80000"])).await;
    rpc_result(client, anvil, "anvil_setNonce", json!([ACCOUNT, "0x5"])).await;
    rpc_result(client, anvil, "anvil_setCode", json!([ACCOUNT, "0x6000600055"])).await;
    rpc_result(client, anvil, "anvil_setStorageAt", json!([ACCOUNT, SLOT, format!("0x{:064x}", 0x2a)])).await;
    rpc_result(client, anvil, "anvil_mine", json!(["0x3"])).await;
}

/// Waits until sluice's head is anvil's.
pub async fn synced(client: &reqwest::Client, sluice: &str, anvil: &str) {
    let target = rpc_result(client, anvil, "eth_blockNumber", json!([])).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rpc_result(client, sluice, "eth_blockNumber", json!([])).await != target {
        assert!(std::time::Instant::now() < deadline, "sluice did not reach anvil's head");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
