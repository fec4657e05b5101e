//! Scenario c's chain: a contract with state and logs, blocks with transactions in them before
//! the run, and a block with transactions every second during it, so that the mix reads a
//! chain that moves, not a still one that the cache answers entirely.

use std::time::Duration;

use sluice_jsonrpc::{Id, Outcome, RawValue, Request};
use sluice_upstream::HttpUpstream;
use tokio::sync::oneshot;

use super::DEV;

/// Where the counter is placed (`anvil_setCode`).
pub(super) const COUNTER: &str = "0x000000000000000000000000000000000000c0de";

/// The counter's topic (its one log's `topics[0]`).
const TOPIC: &str = "0x2222222222222222222222222222222222222222222222222222222222222222";

/// Any call: `slot0 += 1`, emit `LOG1(TOPIC, slot0)` and return `slot0`. So an `eth_call` at
/// `latest` answers the block's count plus one, which changes with every block that calls it.
/// PUSH1 0 SLOAD PUSH1 1 ADD DUP1 PUSH1 0 SSTORE DUP1 PUSH1 0 MSTORE PUSH32 TOPIC
/// PUSH1 32 PUSH1 0 LOG1 PUSH1 32 PUSH1 0 RETURN
fn counter_code() -> String {
    format!("0x6000546001018060005580600052{}{}60206000a160206000f3", "7f", &TOPIC[2..])
}

/// One call; its result's JSON text.
pub(super) async fn call(node: &HttpUpstream, method: &str, params: &str) -> anyhow::Result<String> {
    let request = Request::new(Some(Id::number(1)), method, RawValue::from_string(params.into()).ok());
    match node.call(&request).await.map_err(|e| anyhow::anyhow!("{method}: {e}"))?.outcome {
        Outcome::Result(raw) => Ok(raw.get().to_owned()),
        Outcome::Error(raw) => anyhow::bail!("{method}: {}", raw.get()),
    }
}

/// Mines one block holding `txs` calls of the counter; returns their hashes.
async fn block_of_calls(node: &HttpUpstream, txs: usize) -> anyhow::Result<Vec<String>> {
    let mut hashes = Vec::with_capacity(txs);
    for _ in 0..txs {
        let tx = format!(r#"[{{"from":"{DEV}","to":"{COUNTER}","data":"0x01"}}]"#);
        hashes.push(call(node, "eth_sendTransaction", &tx).await?.trim_matches('"').to_owned());
    }
    call(node, "evm_mine", "[]").await?;
    Ok(hashes)
}

fn quantity(text: &str) -> anyhow::Result<u64> {
    let hex = text.trim_matches('"').trim_start_matches("0x");
    u64::from_str_radix(hex, 16).map_err(|e| anyhow::anyhow!("{text}: {e}"))
}

/// The chain being read and the task that moves it.
pub(super) struct MovingChain {
    /// The mix file, over this chain's blocks, transactions and logs.
    pub mix_text: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<u64>>,
}

impl MovingChain {
    /// Places the counter, mines 20 blocks of 3 calls each (so 60 receipts and logs), turns
    /// automine off and starts a block of 3 calls every second.
    pub(super) async fn start(node: &HttpUpstream) -> anyhow::Result<Self> {
        call(node, "anvil_setCode", &format!(r#"["{COUNTER}","{}"]"#, counter_code())).await?;
        call(node, "evm_setAutomine", "[false]").await?;
        let first = quantity(&call(node, "eth_blockNumber", "[]").await?)? + 1;
        let mut hashes = Vec::new();
        for _ in 0..20 {
            hashes.extend(block_of_calls(node, 3).await?);
        }
        let last = quantity(&call(node, "eth_blockNumber", "[]").await?)?;
        // The counter works as its code says: 60 calls counted, so a call at latest answers 61.
        let count = call(node, "eth_call", &format!(r#"[{{"to":"{COUNTER}","data":"0x"}},"latest"]"#)).await?;
        anyhow::ensure!(quantity(&count)? == 61, "the counter answered {count} after 60 calls");
        let logs =
            call(node, "eth_getLogs", &format!(r#"[{{"address":"{COUNTER}","fromBlock":"0x{first:x}"}}]"#)).await?;
        anyhow::ensure!(logs.matches("\"transactionHash\"").count() == 60, "60 logs expected: {logs}");
        let list = |v: &[String]| v.iter().map(|h| format!("\"{h}\"")).collect::<Vec<_>>().join(", ");
        let mix_text = format!(
            "[vars]\n\
             tx = [{}]\n\
             old = {{ from = 1, to = 120 }}\n\
             from = {{ from = {first}, to = {} }}\n\
             [[call]]\nmethod = \"eth_call\"\nparams = [{{ to = \"{COUNTER}\", data = \"0x\" }}, \"latest\"]\nweight = 25\n\
             [[call]]\nmethod = \"eth_getBalance\"\nparams = [\"{DEV}\", \"latest\"]\nweight = 10\n\
             [[call]]\nmethod = \"eth_blockNumber\"\nparams = []\nweight = 10\n\
             [[call]]\nmethod = \"eth_getBlockByNumber\"\nparams = [\"latest\", false]\nweight = 10\n\
             [[call]]\nmethod = \"eth_getBlockByNumber\"\nparams = [\"{{from}}\", true]\nweight = 10\n\
             [[call]]\nmethod = \"eth_getBlockByNumber\"\nparams = [\"{{old}}\", false]\nweight = 5\n\
             [[call]]\nmethod = \"eth_getTransactionReceipt\"\nparams = [\"{{tx}}\"]\nweight = 15\n\
             [[call]]\nmethod = \"eth_getTransactionByHash\"\nparams = [\"{{tx}}\"]\nweight = 5\n\
             [[call]]\nmethod = \"eth_getLogs\"\nparams = [{{ address = \"{COUNTER}\", fromBlock = \"{{from}}\", toBlock = \"0x{last:x}\" }}]\nweight = 10\n",
            list(&hashes),
            last.saturating_sub(1).max(first),
        );
        let (stop, mut stopped) = oneshot::channel();
        let mover = node.clone();
        let task = tokio::spawn(async move {
            let mut blocks = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = &mut stopped => return Ok(blocks),
                    _ = tick.tick() => {
                        block_of_calls(&mover, 3).await?;
                        blocks += 1;
                    }
                }
            }
        });
        Ok(MovingChain { mix_text, stop: Some(stop), task })
    }

    /// Stops the blocks, turns automine back on; returns how many blocks were mined meanwhile.
    pub(super) async fn stop(mut self, node: &HttpUpstream) -> anyhow::Result<u64> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let blocks = (&mut self.task).await??;
        call(node, "evm_setAutomine", "[true]").await?;
        Ok(blocks)
    }
}
