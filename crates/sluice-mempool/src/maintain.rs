//! Head maintenance: follows the chain and keeps the pool true to it.
//!
//! * each new block: its transactions' senders that the pool knows get their nonces advanced
//!   (their mined transactions leave, the next queued ones are promoted), the base fee for the
//!   next block is set (held transactions are released when it allows), the block gas limit
//!   updated. While the pool is empty no block can mine a pooled transaction: the head feed's
//!   own header (its gas and base fee) is applied, and nothing is fetched — an idle mempool
//!   costs the provider no call;
//! * a reorg: the senders' nonces are read again from the new chain, and the transactions the
//!   dropped blocks had mined are re-validated into the pool;
//! * a timer drops queued transactions past their lifetime.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use alloy_eips::eip1559::BaseFeeParams;
use alloy_primitives::Address;
use serde::Deserialize;
use sluice_chain::{parse_quantity, ChainEvent, Header};
use sluice_jsonrpc::Outcome;
use sluice_upstream::{Answer, Call, Upstreams};
use tokio::sync::{broadcast, oneshot};

use crate::core::Core;
use crate::seams::TxSource;
use crate::view::Pooled;
use crate::writer::Command;
use crate::Rules;

/// Blocks remembered for re-injection after a reorg, and caught up on after a gap.
const DEPTH: u64 = 64;

/// What the mempool needs to know about the chain at start.
pub(crate) struct ChainInfo {
    pub chain_id: u64,
    pub number: u64,
    pub gas_limit: u64,
    pub next_base_fee: u128,
    /// Prague is active (its headers carry `requestsHash`, EIP-7685).
    pub prague: bool,
}

#[derive(Deserialize)]
struct Block {
    number: String,
    #[serde(rename = "gasLimit")]
    gas_limit: String,
    #[serde(rename = "gasUsed")]
    gas_used: String,
    #[serde(rename = "baseFeePerGas")]
    base_fee: Option<String>,
    /// Present from Prague on (EIP-7685).
    #[serde(rename = "requestsHash")]
    requests_hash: Option<String>,
    /// Full transactions, or just hashes when fetched without them (skipped then).
    #[serde(default)]
    transactions: Vec<TxOrHash>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TxOrHash {
    Tx { from: Address, nonce: String },
    Hash(#[allow(dead_code)] String),
}

impl Block {
    fn gas_limit(&self) -> u64 {
        parse_quantity(&self.gas_limit).unwrap_or(30_000_000)
    }

    /// The base fee of the block after this one (0 before London).
    fn next_base_fee(&self) -> u128 {
        let base_fee = self.base_fee.as_deref().and_then(parse_quantity);
        next_base_fee(base_fee, parse_quantity(&self.gas_used).unwrap_or(0), self.gas_limit())
    }
}

/// The base fee of the block after one with `base_fee`, `used` and `limit` (0 before London).
fn next_base_fee(base_fee: Option<u64>, used: u64, limit: u64) -> u128 {
    let Some(base_fee) = base_fee else { return 0 };
    alloy_eips::calc_next_block_base_fee(used, limit, base_fee, BaseFeeParams::ethereum()) as u128
}

/// What a block that mined no pooled transaction changes, read from the head feed's header:
/// the gas limit, Prague, the next base fee. `None` when the header lacks its gas fields.
fn from_header(header: &Header) -> Option<(u64, bool, u128)> {
    let (limit, used) = (header.gas_limit?, header.gas_used?);
    Some((limit, header.requests_hash.is_some(), next_base_fee(header.base_fee, used, limit)))
}

/// Reads the chain id and the latest block.
pub(crate) async fn fetch_chain(upstream: &dyn Upstreams) -> Result<ChainInfo, String> {
    let chain_id = call(upstream, "eth_chainId", "[]").await?;
    let chain_id: String = serde_json::from_str(chain_id.get()).map_err(|e| format!("eth_chainId: {e}"))?;
    let chain_id = parse_quantity(&chain_id).ok_or("eth_chainId: not a quantity")?;
    let block = fetch_block(upstream, "\"latest\"", false).await?.ok_or("the upstream has no latest block")?;
    Ok(ChainInfo {
        chain_id,
        number: parse_quantity(&block.number).unwrap_or(0),
        gas_limit: block.gas_limit(),
        next_base_fee: block.next_base_fee(),
        prague: block.requests_hash.is_some(),
    })
}

async fn call(upstream: &dyn Upstreams, method: &str, params: &str) -> Result<sluice_jsonrpc::SharedRaw, String> {
    match upstream.call(&Call::internal(method, Some(params))).await {
        Ok(Answer { outcome: Outcome::Result(raw), .. }) => Ok(raw),
        Ok(Answer { outcome: Outcome::Error(raw), .. }) => Err(format!("{method}: {}", raw.get())),
        Err(e) => Err(format!("{method}: {e}")),
    }
}

async fn fetch_block(upstream: &dyn Upstreams, tag: &str, full: bool) -> Result<Option<Block>, String> {
    let raw = call(upstream, "eth_getBlockByNumber", &format!("[{tag},{full}]")).await?;
    serde_json::from_str(raw.get()).map_err(|e| format!("eth_getBlockByNumber: {e}"))
}

/// Follows the head feed until it closes.
pub(crate) async fn run(core: Arc<Core>, mut events: broadcast::Receiver<ChainEvent>, start: u64) {
    let mut next = start + 1;
    let mut mined: BTreeMap<u64, Vec<Arc<Pooled>>> = BTreeMap::new();
    let mut expire = tokio::time::interval(core.config.expire_interval);
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(ChainEvent::NewHead(head)) => {
                    if core.snapshot().senders.is_empty() {
                        if let Some(tip) = core.state.tip().filter(|tip| tip.number == head) {
                            if let Some(Ok(gone)) = core.on_quiet_block(&tip).await {
                                // Nothing pooled, nothing mined: the blocks up to it need no read.
                                mined.insert(head, gone);
                                next = head + 1;
                                continue;
                            }
                        }
                    }
                    next = next.max(head.saturating_sub(DEPTH - 1));
                    while next <= head {
                        match core.on_block(next).await {
                            Ok(Some(gone)) => {
                                mined.insert(next, gone);
                                next += 1;
                            }
                            // Not there yet (a lagging upstream) or unreadable: try on the next head.
                            Ok(None) => break,
                            Err(e) => {
                                tracing::warn!(block = next, error = %e, "mempool could not read a block");
                                break;
                            }
                        }
                    }
                    while mined.len() as u64 > DEPTH {
                        mined.pop_first();
                    }
                }
                Ok(ChainEvent::Reorg { fork_point }) => {
                    let dropped: Vec<Arc<Pooled>> = mined.split_off(&fork_point).into_values().flatten().collect();
                    core.on_reorg(dropped).await;
                    next = next.min(fork_point);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => core.on_reorg(Vec::new()).await,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = expire.tick() => {
                let _ = core.commands.send(Command::Expire);
            }
        }
    }
}

impl Core {
    /// Applies one block; returns the pooled transactions it mined, or `None` if the upstream
    /// does not have the block yet.
    async fn on_block(&self, number: u64) -> Result<Option<Vec<Arc<Pooled>>>, String> {
        let Some(block) = fetch_block(self.upstream.as_ref(), &format!("\"{number:#x}\""), true).await? else {
            return Ok(None);
        };
        let snapshot = self.snapshot();
        let mut advanced: HashMap<Address, u64> = HashMap::new();
        for tx in &block.transactions {
            let TxOrHash::Tx { from, nonce } = tx else { continue };
            if snapshot.senders.contains_key(from) {
                let nonce = parse_quantity(nonce).unwrap_or(0) + 1;
                let entry = advanced.entry(*from).or_default();
                *entry = (*entry).max(nonce);
            }
        }
        self.set_block_rules(block.gas_limit(), block.requests_hash.is_some());
        self.apply(number, advanced.into_iter().collect(), block.next_base_fee()).await.map(Some)
    }

    /// Applies a block while the pool is empty, from its header: `None` when the header lacks
    /// what is needed (then the block is fetched).
    async fn on_quiet_block(&self, header: &Header) -> Option<Result<Vec<Arc<Pooled>>, String>> {
        let (gas_limit, prague, base_fee) = from_header(header)?;
        self.set_block_rules(gas_limit, prague);
        Some(self.apply(header.number, Vec::new(), base_fee).await)
    }

    /// The rules a block changes: its gas limit, and whether Prague is active.
    fn set_block_rules(&self, gas_limit: u64, prague: bool) {
        if let Some(rules) = self.rules.load_full().filter(|r| r.block_gas_limit != gas_limit || r.prague != prague) {
            self.rules.store(Some(Arc::new(Rules { block_gas_limit: gas_limit, prague, ..Rules::clone(&rules) })));
        }
    }

    /// Hands block `number` to the writer; the pooled transactions it mined.
    async fn apply(
        &self,
        number: u64,
        advanced: Vec<(Address, u64)>,
        base_fee: u128,
    ) -> Result<Vec<Arc<Pooled>>, String> {
        let (reply, gone) = oneshot::channel();
        let command = Command::Block { number, advanced, base_fee: Some(base_fee), reply };
        self.commands.send(command).map_err(|_| "the mempool writer stopped".to_owned())?;
        let gone = gone.await.map_err(|_| "the mempool writer stopped".to_owned())?;
        if !gone.is_empty() {
            tracing::debug!(block = number, mined = gone.len(), "pooled transactions mined");
        }
        Ok(gone)
    }

    /// After a reorg: re-read every pooled sender's nonce from the new chain, then re-validate
    /// the transactions the dropped blocks had mined.
    async fn on_reorg(&self, dropped: Vec<Arc<Pooled>>) {
        let senders: Vec<Address> = self.snapshot().senders.keys().copied().collect();
        let states = self.state.get_many(&senders).await;
        let nonces: Vec<(Address, u64)> =
            senders.into_iter().zip(states).filter_map(|(a, s)| s.ok().map(|(nonce, _)| (a, nonce))).collect();
        let _ = self.commands.send(Command::Resync(nonces));
        let count = dropped.len();
        // In block order, so each sender's nonces come back in order.
        let raws = dropped.into_iter().map(|p| p.raw.clone()).collect();
        let results = self.submit_in_order(raws, TxSource::Reorg, true).await;
        let back = results.iter().filter(|r| r.is_ok()).count();
        metrics::counter!("sluice_mempool_reinjected_total", "network" => self.config.network.clone())
            .increment(back as u64);
        tracing::info!(dropped = count, back_in_pool = back, "reorg: re-validated the dropped blocks' transactions");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(json: &str) -> Header {
        serde_json::from_str(json).expect("a header")
    }

    #[test]
    fn a_quiet_block_is_applied_from_the_header_the_head_feed_has() {
        let links = r#""number":"0x10","hash":"0xaa","parentHash":"0xbb""#;
        let full = header(&format!(
            r#"{{{links},"gasLimit":"0x1c9c380","gasUsed":"0x1c9c380","baseFeePerGas":"0x3b9aca00"}}"#
        ));
        // A full block: the next base fee rises by an eighth, as a fetched block would say.
        let (limit, prague, base_fee) = from_header(&full).expect("enough to apply");
        assert_eq!((limit, prague), (30_000_000, false));
        assert_eq!(base_fee, 1_125_000_000);
        let block = Block {
            number: "0x10".into(),
            gas_limit: "0x1c9c380".into(),
            gas_used: "0x1c9c380".into(),
            base_fee: Some("0x3b9aca00".into()),
            requests_hash: None,
            transactions: Vec::new(),
        };
        assert_eq!(base_fee, block.next_base_fee());
        let prague = header(&format!(r#"{{{links},"gasLimit":"0x1","gasUsed":"0x0","requestsHash":"0x00"}}"#));
        assert_eq!(from_header(&prague), Some((1, true, 0)), "before London: no base fee");
        // A header without its gas fields (a node that sends less): the block is fetched.
        assert_eq!(from_header(&header(&format!("{{{links}}}"))), None);
    }
}
