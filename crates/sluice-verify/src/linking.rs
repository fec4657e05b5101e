//! The verifying step's trust, fetched: headers named by `agree` members, linked by
//! `parentHash` down to a trusted header or the checkpoint (the pure rules are `trust`'s).

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};

use alloy_primitives::B256;
use serde_json::{json, Value};
use sluice_chain::{BlockNeed, ChainView};
use sluice_upstream::{AnswerCheck, Call, UpstreamError};
use tokio::sync::OnceCell;

use crate::header::{check_header, CheckedHeader};
use crate::layer::{result_of, HEADERS};
use crate::trust::{links, TrustSource, Trusted};
use crate::{Unverified, VerifyLayer};

/// Headers fetched by height in one batch while linking.
const BATCH: u64 = 64;

/// Where a walk down the parents stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    /// At this height: the hash of the block there is what the walk finds.
    Height(u64),
    /// At a trusted header or the checkpoint: the walk proves descent from it.
    Trusted,
}

impl VerifyLayer {
    /// The trusted header `hash` at `number`: known, or established now, once per block (reads
    /// of it meanwhile wait for that one check; a failed check is tried again by the next).
    pub(crate) async fn trusted(&self, call: &Call, number: u64, hash: B256) -> Result<Trusted, Unverified> {
        let known = self.trust().get(&hash);
        if let Some(known) = known {
            return Ok(known);
        }
        let cell = {
            let mut checking = self.checking.lock().unwrap_or_else(PoisonError::into_inner);
            match checking.iter().find(|(h, _)| *h == hash) {
                Some((_, cell)) => cell.clone(),
                None => {
                    if checking.len() == HEADERS {
                        checking.pop_front();
                    }
                    let cell = Arc::new(OnceCell::new());
                    checking.push_back((hash, cell.clone()));
                    cell
                }
            }
        };
        cell.get_or_try_init(|| self.establish(call, number, hash)).await.copied()
    }

    /// Checks the header `hash` at `number`: named by `agree` members, and with a checkpoint,
    /// linked to it.
    async fn establish(&self, call: &Call, number: u64, hash: B256) -> Result<Trusted, Unverified> {
        let header = self.named_header(call, number, hash).await?;
        let source = match self.checkpoint {
            None => TrustSource::Agreed,
            Some(pinned) if number == pinned.number => {
                if hash != pinned.hash {
                    return Err(Unverified::NoTrustedHeader(format!(
                        "block {number} is {hash}, not the checkpoint {}",
                        pinned.hash
                    )));
                }
                TrustSource::Checkpoint
            }
            Some(pinned) if number > pinned.number => {
                self.walk_down(call, &Trusted::from_checked(&header, TrustSource::Linked), Goal::Trusted).await?;
                TrustSource::Linked
            }
            Some(pinned) => {
                let checkpoint = Box::pin(self.trusted(call, pinned.number, pinned.hash)).await.map_err(|e| {
                    Unverified::NoTrustedHeader(format!(
                        "the checkpoint {} at block {}: {e}",
                        pinned.hash, pinned.number
                    ))
                })?;
                if self.walk_down(call, &checkpoint, Goal::Height(number)).await? != hash {
                    return Err(Unverified::NoTrustedHeader(format!("{hash} is not an ancestor of the checkpoint")));
                }
                TrustSource::Linked
            }
        };
        let trusted = Trusted::from_checked(&header, source);
        self.trust().insert(trusted);
        metrics::counter!("sluice_verify_trusted_headers_total", "network" => self.network.to_string(),
            "source" => source.as_str())
        .increment(1);
        Ok(trusted)
    }

    /// The header `hash` at `number`, its hash recomputed: from one member by hash, or with
    /// `agree` above 1, from that many members each naming it at its height.
    async fn named_header(&self, call: &Call, number: u64, hash: B256) -> Result<CheckedHeader, Unverified> {
        if self.agree <= 1 {
            return self.header_by_hash(call, Some(number), hash).await;
        }
        let params = json!([format!("{number:#x}"), false]);
        let mut asked = self.internal_needing(call, "eth_getBlockByNumber", params, BlockNeed::Number(number));
        asked.ctx.check = Some(names(hash, Some(number)));
        asked.ctx.attest = self.agree;
        let answer = match self.inner.call(&asked).await {
            Err(UpstreamError::Disagreement { answers, .. }) => {
                let named = answers.first().copied().unwrap_or(0);
                return Err(Unverified::NoTrustedHeader(format!(
                    "{named} member(s) named {hash} at block {number}, agree = {} needed",
                    self.agree
                )));
            }
            answer => found(result_of(Some(answer))?, hash)?,
        };
        let header = check_header(&answer)?;
        links(&header, number, hash)?;
        Ok(header)
    }

    /// The header `hash` (at `number`, when known), from one member, its hash recomputed.
    pub(crate) async fn header_by_hash(
        &self,
        call: &Call,
        number: Option<u64>,
        hash: B256,
    ) -> Result<CheckedHeader, Unverified> {
        let needs = BlockNeed::Hash { hash: format!("{hash:#x}"), number };
        let mut asked = self.internal_needing(call, "eth_getBlockByHash", json!([hash, false]), needs);
        asked.ctx.check = Some(names(hash, number));
        let header = check_header(&found(result_of(Some(self.inner.call(&asked).await))?, hash)?)?;
        match number {
            Some(number) => links(&header, number, hash)?,
            None if header.hash != hash => {
                return Err(Unverified::Header(format!("asked for {hash}, given {}", header.hash)))
            }
            None => {}
        }
        Ok(header)
    }

    /// Walks down from `from` (trusted, or being established) by `parentHash` until `goal`:
    /// headers fetched by height in batches, one by hash where a batch's block is not the
    /// parent named (a reorg between two reads, or a member on another fork). The headers
    /// walked are trusted once the goal is reached. Gives the hash at the goal.
    pub(crate) async fn walk_down(&self, call: &Call, from: &Trusted, goal: Goal) -> Result<B256, Unverified> {
        let (mut number, mut expected) = (from.number, from.parent);
        let mut walked: Vec<Trusted> = Vec::new();
        let mut fetched: VecDeque<Value> = VecDeque::new();
        // The lowest height the walk looks at, and the lowest it fetches.
        let (lowest, floor) = match (goal, self.checkpoint) {
            (Goal::Height(height), _) => (height, height),
            (Goal::Trusted, Some(pinned)) => (pinned.number, pinned.number + 1),
            (Goal::Trusted, None) => return Ok(from.hash),
        };
        loop {
            let Some(n) = number.checked_sub(1).filter(|n| *n >= lowest) else {
                return Err(Unverified::NoTrustedHeader(format!(
                    "block {} links to nothing sluice trusts",
                    from.number
                )));
            };
            let known = self.trust().get(&expected);
            if let Some(known) = known {
                if goal == Goal::Trusted || goal == Goal::Height(n) {
                    break;
                }
                (number, expected) = (n, known.parent);
                fetched.clear();
                continue;
            }
            if let (Goal::Trusted, Some(pinned)) = (goal, self.checkpoint) {
                if n == pinned.number {
                    if expected == pinned.hash {
                        break;
                    }
                    return Err(Unverified::NoTrustedHeader(format!(
                        "block {} does not descend from the checkpoint {} (its block {n} is {expected})",
                        from.number, pinned.hash
                    )));
                }
            }
            if walked.len() as u64 >= self.link_limit {
                return Err(Unverified::NoTrustedHeader(format!(
                    "linking block {} to a trusted header takes more than link_limit = {} headers",
                    from.number, self.link_limit
                )));
            }
            let Some(header) = fetched.pop_front() else {
                let left = self.link_limit - walked.len() as u64;
                let low = n.saturating_sub(BATCH.min(left) - 1).max(floor);
                fetched = self.headers_by_height(call, low, n).await?;
                continue;
            };
            let header = match check_header(&header) {
                Ok(header) if links(&header, n, expected).is_ok() => header,
                _ => {
                    fetched.clear();
                    self.header_by_hash(call, Some(n), expected).await?
                }
            };
            walked.push(Trusted::from_checked(&header, TrustSource::Linked));
            (number, expected) = (n, header.parent);
            if goal == Goal::Height(n) {
                expected = header.hash;
                break;
            }
        }
        let linked = walked.len() as u64;
        let mut trust = self.trust();
        for header in walked {
            trust.insert(header);
        }
        drop(trust);
        metrics::counter!("sluice_verify_trusted_headers_total", "network" => self.network.to_string(), "source" => "linked")
            .increment(linked);
        Ok(expected)
    }

    /// Headers `high` down to `low`, by height, in one batch.
    async fn headers_by_height(&self, call: &Call, low: u64, high: u64) -> Result<VecDeque<Value>, Unverified> {
        let asked: Vec<Call> = (low..=high)
            .rev()
            .map(|n| {
                let params = json!([format!("{n:#x}"), false]);
                self.internal_needing(call, "eth_getBlockByNumber", params, BlockNeed::Number(n))
            })
            .collect();
        let refs: Vec<&Call> = asked.iter().collect();
        self.inner.call_batch(&refs).await.into_iter().map(|answer| result_of(Some(answer))).collect()
    }

    /// A block below the head tracker's window, at height `number`: linked down from the
    /// window's oldest block. Gives its hash, trusted.
    pub(crate) async fn below_window(&self, call: &Call, number: u64, view: &ChainView) -> Result<B256, Unverified> {
        let Some((oldest, hash)) = view.oldest() else {
            return Err(Unverified::NoTrustedHeader("no head yet".into()));
        };
        let hash = hash.parse().map_err(|_| Unverified::NoTrustedHeader(format!("unreadable hash {hash}")))?;
        let top = self.trusted(call, oldest, hash).await?;
        self.walk_down(call, &top, Goal::Height(number)).await
    }

    /// A block named by a hash the head tracker's window does not hold: trusted when it is
    /// an ancestor of the window (older than it, and linked), refused otherwise (a block a
    /// reorg left behind, one beyond the head, or one never on this chain).
    pub(crate) async fn outside_window(&self, call: &Call, hash: B256, view: &ChainView) -> Result<u64, Unverified> {
        let Some((oldest, _)) = view.oldest() else {
            return Err(Unverified::NoTrustedHeader("no head yet".into()));
        };
        let known = self.trust().get(&hash);
        let number = match known {
            Some(known) => known.number,
            None => self.header_by_hash(call, None, hash).await?.number,
        };
        if number >= oldest || self.below_window(call, number, view).await? != hash {
            return Err(Unverified::NoTrustedHeader(format!("{hash} is not on the chain sluice follows")));
        }
        Ok(number)
    }
}

/// A block the members answered, or why none did: a `null` (no member has the block: one
/// behind, or past a reorg) proves nothing either way.
pub(crate) fn found(block: Value, hash: B256) -> Result<Value, Unverified> {
    match block {
        Value::Null => Err(Unverified::NoProof(format!("no member has block {hash}"))),
        block => Ok(block),
    }
}

/// A check that a member's block object is the header `hash` (at `number`, when known).
fn names(hash: B256, number: Option<u64>) -> AnswerCheck {
    AnswerCheck(Arc::new(move |text: &str| {
        if text == "null" {
            // A member without the block (one behind, or past a reorg) says so: no lie.
            return Ok(());
        }
        let block: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let header = check_header(&block).map_err(|e| e.to_string())?;
        match number {
            Some(number) => links(&header, number, hash).map_err(|e| e.to_string()),
            None if header.hash != hash => Err(format!("asked for {hash}, given {}", header.hash)),
            None => Ok(()),
        }
    }))
}
