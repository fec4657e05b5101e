//! The verifying step's chain reads: blocks, a block's receipts, one receipt.

use std::sync::Arc;

use alloy_consensus::TxEnvelope;
use alloy_primitives::B256;
use alloy_rpc_types_eth::Transaction;
use serde_json::{json, Value};
use sluice_chain::BlockTag;
use sluice_jsonrpc::Outcome;
use sluice_upstream::{AnswerCheck, Call};

use crate::chain::{check_full_block, check_receipts, check_transaction, with_hashes, CheckedBlock};
use crate::layer::result_of;
use crate::linking::found;
use crate::{Unverified, VerifyLayer};

impl VerifyLayer {
    /// A block, fetched with its transactions at its trusted hash and checked; answered with
    /// full transactions or their hashes, as asked. A block sluice has not seen (beyond its
    /// head, an unknown hash) is asked of the node: its `null` passes, anything else is refused.
    pub(crate) async fn block(&self, call: &Call, at: &BlockTag, full: bool) -> Result<Value, Unverified> {
        let (number, hash) = match self.trusted_block(call, at).await {
            Ok(block) => block,
            Err(e) => return self.null_or(call, e).await,
        };
        let (block, checked) = self.checked_block(call, number, hash).await?;
        Ok(if full { block } else { with_hashes(&block, &checked) })
    }

    /// A block's receipts at its trusted hash, checked against the checked block.
    pub(crate) async fn block_receipts(&self, call: &Call, at: &BlockTag) -> Result<Value, Unverified> {
        let (number, hash) = match self.trusted_block(call, at).await {
            Ok(block) => block,
            Err(e) => return self.null_or(call, e).await,
        };
        self.receipts_at(call, number, hash).await
    }

    /// One receipt: where the node says it is, then found among that block's checked
    /// receipts. A `null` (not mined, or unknown) passes: absence is not proven.
    pub(crate) async fn receipt(&self, call: &Call, hash: B256) -> Result<Value, Unverified> {
        let pointer = result_of(Some(self.inner.call(call).await))?;
        if pointer.is_null() {
            return Ok(Value::Null);
        }
        let block: B256 = serde_json::from_value(pointer["blockHash"].clone())
            .map_err(|_| Unverified::NoProof("a receipt without its block hash".into()))?;
        let (number, block) = self.trusted_block(call, &BlockTag::Hash(format!("{block:#x}"))).await?;
        let receipts = self.receipts_at(call, number, block).await?;
        let wanted = format!("{hash:#x}");
        receipts
            .as_array()
            .and_then(|all| all.iter().find(|r| r["transactionHash"].as_str() == Some(wanted.as_str())))
            .cloned()
            .ok_or_else(|| Unverified::Proof(format!("{hash} is not in block {block}, whose receipt named it")))
    }

    /// One transaction: where the node says it is, then found among that block's checked
    /// transactions. One not mined yet has no block to commit to it: its own hash and
    /// signer are checked. A `null` passes: absence is not proven.
    pub(crate) async fn transaction(&self, call: &Call, hash: B256) -> Result<Value, Unverified> {
        let found = result_of(Some(self.inner.call(call).await))?;
        if found.is_null() {
            return Ok(Value::Null);
        }
        let tx: Transaction<TxEnvelope> = serde_json::from_value(found.clone())
            .map_err(|e| Unverified::Proof(format!("an unreadable transaction: {e}")))?;
        let (recomputed, _) = check_transaction(&tx)?;
        if recomputed != hash {
            return Err(Unverified::Proof(format!("asked for {hash}, given {recomputed}")));
        }
        let Some(block) = tx.block_hash else { return Ok(found) };
        let (number, block) = self.trusted_block(call, &BlockTag::Hash(format!("{block:#x}"))).await?;
        let (full, _) = self.checked_block(call, number, block).await?;
        let wanted = format!("{hash:#x}");
        full["transactions"]
            .as_array()
            .and_then(|all| all.iter().find(|t| t["hash"].as_str() == Some(wanted.as_str())))
            .cloned()
            .ok_or_else(|| Unverified::Proof(format!("{hash} is not in block {block}, where the node placed it")))
    }

    pub(crate) async fn receipts_at(&self, call: &Call, number: u64, hash: B256) -> Result<Value, Unverified> {
        let (_, checked) = self.checked_block(call, number, hash).await?;
        let checked = Arc::new(checked);
        let mut receipts_call = self.internal(call, "eth_getBlockReceipts", json!([hash]), number, hash);
        let against = checked.clone();
        receipts_call.ctx.check = Some(AnswerCheck(Arc::new(move |text: &str| {
            let receipts: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            check_receipts(&receipts, &against).map_err(|e| e.to_string())
        })));
        let receipts = result_of(Some(self.inner.call(&receipts_call).await))?;
        check_receipts(&receipts, &checked)?;
        Ok(receipts)
    }

    /// The block `hash` with its transactions, checked (each member's answer by the pool).
    async fn checked_block(&self, call: &Call, number: u64, hash: B256) -> Result<(Value, CheckedBlock), Unverified> {
        if self.strict() {
            // The block's hash must be agreed, or linked to the checkpoint, before its
            // contents are checked against it.
            self.trusted(call, number, hash).await?;
        }
        let mut block_call = self.internal(call, "eth_getBlockByHash", json!([hash, true]), number, hash);
        block_call.ctx.check = Some(AnswerCheck(Arc::new(move |text: &str| {
            if text == "null" {
                return Ok(()); // no block there: not a lie (see `found`)
            }
            let block: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            check_full_block(&block, hash).map(drop).map_err(|e| e.to_string())
        })));
        let block = found(result_of(Some(self.inner.call(&block_call).await))?, hash)?;
        let checked = check_full_block(&block, hash)?;
        Ok((block, checked))
    }

    /// For a block sluice holds no trusted header of: the node's `null` passes (a block not
    /// there yet), anything else is refused with `why`.
    async fn null_or(&self, call: &Call, why: Unverified) -> Result<Value, Unverified> {
        if matches!(why, Unverified::NoTrustedHeader(_)) {
            if let Ok(answer) = self.inner.call(call).await {
                if matches!(&answer.outcome, Outcome::Result(raw) if raw.get() == "null") {
                    return Ok(Value::Null);
                }
            }
        }
        Err(why)
    }
}
