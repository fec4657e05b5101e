//! The verifying step's log queries: every block of the range trusted (the top one, then its
//! parents linked down in batches), each ruled out by its header's logs bloom or searched in
//! its checked receipts.

use alloy_primitives::Bloom;
use alloy_rpc_types_eth::{BlockNumberOrTag, Filter, FilterBlockOption, Log};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use serde_json::Value;
use sluice_chain::BlockTag;
use sluice_upstream::Call;

use crate::linking::Goal;
use crate::trust::Trusted;
use crate::{Unverified, VerifyLayer};

/// Blocks whose receipts are fetched at once.
const RECEIPTS_AT_ONCE: usize = 4;

impl VerifyLayer {
    /// The logs `filter` selects, from trusted headers and checked receipts: a block whose
    /// bloom rules the filter out costs its header alone (fetched in batches while linking).
    pub(crate) async fn logs(&self, call: &Call, filter: &Filter) -> Result<Value, Unverified> {
        let (low, high) = match filter.block_option {
            FilterBlockOption::AtBlockHash(hash) => {
                let block = self.trusted_block(call, &BlockTag::Hash(format!("{hash:#x}"))).await?;
                (block.0, block)
            }
            FilterBlockOption::Range { from_block, to_block } => {
                let (low, _) = self.trusted_block(call, &tag(from_block)).await?;
                let high = self.trusted_block(call, &tag(to_block)).await?;
                if low > high.0 {
                    return Ok(Value::Array(Vec::new()));
                }
                if high.0 - low >= self.link_limit {
                    return Err(Unverified::NoTrustedHeader(format!(
                        "a verified log query covers at most link_limit = {} blocks, this one {}",
                        self.link_limit,
                        high.0 - low + 1
                    )));
                }
                (low, high)
            }
        };
        let top = self.trusted(call, high.0, high.1).await?;
        if low < top.number {
            self.walk_down(call, &top, Goal::Height(low)).await?;
        }
        let blocks = self.range_down(&top, low)?;
        // A block with no log at all has an empty bloom, which even a filter of nothing matches.
        let searched: Vec<Trusted> = blocks
            .into_iter()
            .rev()
            .filter(|b| b.logs_bloom != Bloom::ZERO && filter.matches_bloom(b.logs_bloom))
            .collect();
        let receipts: Vec<Value> = stream::iter(searched)
            .map(|block| async move { self.receipts_at(call, block.number, block.hash).await })
            .buffered(RECEIPTS_AT_ONCE)
            .try_collect()
            .await?;
        let mut logs = Vec::new();
        for receipt in receipts.iter().filter_map(Value::as_array).flatten() {
            for log in receipt["logs"].as_array().into_iter().flatten() {
                let parsed: Log = serde_json::from_value(log.clone())
                    .map_err(|e| Unverified::Proof(format!("an unreadable log: {e}")))?;
                if filter.matches(&parsed.inner) {
                    logs.push(log.clone());
                }
            }
        }
        Ok(Value::Array(logs))
    }

    /// The trusted headers from `top` down to height `low`, by their parent links.
    fn range_down(&self, top: &Trusted, low: u64) -> Result<Vec<Trusted>, Unverified> {
        let trust = self.trust();
        let mut blocks = vec![*top];
        let mut at = *top;
        while at.number > low {
            at = trust.get(&at.parent).ok_or_else(|| {
                Unverified::NoTrustedHeader(format!("block {} was forgotten while the range was read", at.number - 1))
            })?;
            blocks.push(at);
        }
        Ok(blocks)
    }
}

/// A filter's block bound as a tag (absent: `latest`, as nodes read it).
fn tag(bound: Option<BlockNumberOrTag>) -> BlockTag {
    match bound.unwrap_or_default() {
        BlockNumberOrTag::Number(n) => BlockTag::Number(n),
        BlockNumberOrTag::Earliest => BlockTag::Earliest,
        BlockNumberOrTag::Safe => BlockTag::Safe,
        BlockNumberOrTag::Finalized => BlockTag::Finalized,
        BlockNumberOrTag::Pending => BlockTag::Pending,
        BlockNumberOrTag::Latest => BlockTag::Latest,
    }
}
