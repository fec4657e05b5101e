//! Batches through the pool: grouped by chosen member, one JSON-RPC batch per group, failover
//! per element; and transactions, sent to every member.

use std::collections::BTreeMap;
use std::time::Instant;

use sluice_chain::methods::Submit;
use sluice_jsonrpc::{Outcome, RawValue, Request};

use super::attempt::Attempts;
use super::classify::is_already_known;
use super::{Node, UpstreamPool};
use crate::{Answer, Call, Origin, UpstreamError, Upstreams};

/// Groups of calls for member `i`, as (member, indices into the batch).
type Groups = BTreeMap<usize, Vec<usize>>;

/// Pure: group the calls that have a next member by that member, in call order.
pub(super) fn group(next: impl IntoIterator<Item = (usize, Option<usize>)>) -> (Groups, Vec<usize>) {
    let mut groups = Groups::new();
    let mut none = Vec::new();
    for (call, member) in next {
        match member {
            Some(m) => groups.entry(m).or_default().push(call),
            None => none.push(call),
        }
    }
    (groups, none)
}

/// The origin a batch is counted under: a client's when any of its calls is (batches are a
/// client's or sluice's own; the two do not mix in practice).
fn origin_of<'a>(mut calls: impl Iterator<Item = &'a Call>) -> Origin {
    match calls.any(|c| c.ctx.origin == Origin::Client) {
        true => Origin::Client,
        false => Origin::Internal,
    }
}

/// Pure: cut `len` calls into chunks of at most `max` (at least 1).
pub(super) fn chunks(len: usize, max: usize) -> Vec<std::ops::Range<usize>> {
    let max = max.max(1);
    (0..len).step_by(max).map(|start| start..(start + max).min(len)).collect()
}

impl<N: Node> UpstreamPool<N> {
    /// Several calls: transactions to every member, the rest grouped by member.
    pub(super) async fn call_many(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let (sends, reads): (Vec<usize>, Vec<usize>) = (0..calls.len()).partition(|&i| calls[i].info.is_submission());
        // Calls under a vote, and calls on node-side filters (each to its own member), one by one.
        let (voted, reads): (Vec<usize>, Vec<usize>) = reads
            .into_iter()
            .partition(|&i| calls[i].info.filter.is_some() || self.consensus_rule(calls[i].method()).is_some());
        let send_calls: Vec<&Call> = sends.iter().map(|&i| calls[i]).collect();
        let read_calls: Vec<&Call> = reads.iter().map(|&i| calls[i]).collect();
        let votes = futures_util::future::join_all(voted.iter().map(|&i| Upstreams::call(self, calls[i])));
        let (sent, read, votes) = tokio::join!(
            async {
                if send_calls.is_empty() {
                    Vec::new()
                } else {
                    self.broadcast(&send_calls).await
                }
            },
            self.grouped(&read_calls),
            votes
        );
        let mut out: Vec<Option<Result<Answer, UpstreamError>>> = (0..calls.len()).map(|_| None).collect();
        let answered =
            sends.into_iter().zip(sent).chain(reads.into_iter().zip(read)).chain(voted.into_iter().zip(votes));
        for (i, answer) in answered {
            out[i] = Some(answer);
        }
        out.into_iter().map(|a| a.unwrap_or(Err(UpstreamError::NoneAvailable))).collect()
    }

    /// Reads in rounds: each call's next member, one exchange per member, the failures of a
    /// round regrouped for the next.
    async fn grouped(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let mut out: Vec<Option<Result<Answer, UpstreamError>>> = (0..calls.len()).map(|_| None).collect();
        let mut attempts: Vec<Attempts> =
            futures_util::future::join_all(calls.iter().map(|c| self.attempts_for(c))).await;
        let deadline = calls.iter().map(|c| self.deadline(c)).min();
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        while !pending.is_empty() {
            let (groups, exhausted) = group(pending.drain(..).map(|c| (c, attempts[c].next())));
            for c in exhausted {
                out[c] = Some(attempts[c].finish().map_err(|e| self.unavailable(e)));
            }
            if groups.is_empty() {
                break;
            }
            let exchanges = groups.into_iter().map(|(member, members_calls)| async move {
                let reqs: Vec<&Request> = members_calls.iter().map(|&c| &calls[c].req).collect();
                let outcomes = self.send_group(member, &reqs, origin_of(members_calls.iter().map(|&c| calls[c]))).await;
                (member, members_calls, outcomes)
            });
            let round = futures_util::future::join_all(exchanges);
            let results = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, round).await {
                    Ok(results) => results,
                    Err(_) => break, // what is unanswered times out below
                },
                None => round.await,
            };
            for (member, members_calls, outcomes) in results {
                for (c, outcome) in members_calls.into_iter().zip(outcomes) {
                    self.learn_from(member, calls[c], &outcome);
                    let suspect = self.suspect(calls[c], &outcome);
                    match attempts[c].record(member, outcome, &calls[c].ctx.needs, suspect) {
                        Some(answer) => out[c] = Some(answer),
                        None => pending.push(c),
                    }
                }
            }
        }
        out.into_iter().map(|a| a.unwrap_or(Err(UpstreamError::Timeout(self.config.deadline)))).collect()
    }

    /// Sends one member its group: chunks of at most `max_batch` (or what the node accepted),
    /// at once; a chunk the node refuses as too large is halved and sent again.
    async fn send_group(
        &self,
        member: usize,
        reqs: &[&Request],
        origin: Origin,
    ) -> Vec<Result<Outcome, UpstreamError>> {
        if !self.members[member].state().breaker.allow(Instant::now()) {
            return vec![Err(UpstreamError::NoneAvailable); reqs.len()];
        }
        let limit = self.members[member].state().batch_limit.unwrap_or(self.members[member].max_batch);
        let parts = chunks(reqs.len(), limit);
        let sent = futures_util::future::join_all(
            parts.iter().map(|range| self.send_chunk(member, &reqs[range.clone()], origin)),
        );
        sent.await.into_iter().flatten().collect()
    }

    async fn send_chunk(
        &self,
        member: usize,
        reqs: &[&Request],
        origin: Origin,
    ) -> Vec<Result<Outcome, UpstreamError>> {
        let mut out = Vec::with_capacity(reqs.len());
        // Ranges still to send, first to last.
        let mut todo = Vec::with_capacity(4);
        todo.push(0..reqs.len());
        while let Some(range) = todo.pop() {
            let outcomes = self.exchange(member, &reqs[range.clone()], origin).await;
            let refused = range.len() > 1 && outcomes.iter().all(|o| matches!(o, Err(UpstreamError::BatchRefused)));
            if refused {
                let half = range.len() / 2;
                self.members[member].state().batch_limit = Some(half.max(1));
                metrics::counter!("sluice_pool_batch_splits_total").increment(1);
                todo.push(range.start + half..range.end);
                todo.push(range.start..range.start + half);
            } else {
                out.extend(outcomes.into_iter().map(|o| match o {
                    // A single call refused "as a batch" is node trouble like any other.
                    Err(UpstreamError::BatchRefused) => Err(UpstreamError::InvalidResponse("batch refused")),
                    other => other,
                }));
            }
        }
        out
    }

    /// Transactions to every member whose circuit lets them through (every member when none
    /// does), one exchange each; per transaction, any acceptance or "already known" is success.
    pub(super) async fn broadcast(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let now = Instant::now();
        let open: Vec<usize> =
            (0..self.members.len()).filter(|&i| self.members[i].state().breaker.would_allow(now)).collect();
        let targets = if open.is_empty() { (0..self.members.len()).collect() } else { open };
        let reqs: Vec<&Request> = calls.iter().map(|c| &c.req).collect();
        let origin = origin_of(calls.iter().copied());
        let per_member =
            futures_util::future::join_all(targets.iter().map(|&m| self.send_group(m, &reqs, origin))).await;
        // Per transaction, the best answer any member gave: accepted or already known, then the
        // node's refusal (nonce too low, …), then node trouble. A submission answered with a
        // receipt (`…Sync`) is best answered by a member that gave one: "already known" is not
        // a receipt.
        let rank = |o: &Result<Outcome, UpstreamError>, receipt: bool| match o {
            Ok(Outcome::Result(_)) => 4,
            Ok(Outcome::Error(e)) if is_already_known(e) => 4 - u8::from(receipt),
            Ok(Outcome::Error(_)) => 2,
            Err(_) => 1,
        };
        let wants_receipt: Vec<bool> = calls.iter().map(|c| c.info.submit == Some(Submit::Receipt)).collect();
        let mut best: Vec<Option<Result<Outcome, UpstreamError>>> = (0..calls.len()).map(|_| None).collect();
        for outcomes in per_member {
            for (c, outcome) in outcomes.into_iter().enumerate() {
                let receipt = wants_receipt[c];
                if best[c].as_ref().is_none_or(|b| rank(&outcome, receipt) > rank(b, receipt)) {
                    best[c] = Some(outcome);
                }
            }
        }
        let best: Vec<Option<Result<Answer, UpstreamError>>> = best
            .into_iter()
            .zip(calls)
            .map(|(outcome, call)| {
                outcome.map(|o| match o {
                    Ok(Outcome::Error(e)) if is_already_known(&e) && call.info.submit != Some(Submit::Receipt) => {
                        match tx_hash(&call.req) {
                            Some(hash) => Ok(Answer::upstream(Outcome::result(hash))),
                            None => Ok(Answer::upstream(Outcome::Error(e))),
                        }
                    }
                    other => other.map(Answer::upstream),
                })
            })
            .collect();
        best.into_iter().map(|b| b.unwrap_or(Err(UpstreamError::NoneAvailable))).collect()
    }
}

/// keccak256 of the raw transaction bytes (`params[0]`): its hash, for "already known" answers.
fn tx_hash(req: &Request) -> Option<Box<RawValue>> {
    let params: Vec<&RawValue> = serde_json::from_str(req.params_text()).ok()?;
    let hex: String = serde_json::from_str(params.first()?.get()).ok()?;
    let bytes = alloy_primitives::hex::decode(hex.strip_prefix("0x")?).ok()?;
    RawValue::from_string(format!("\"{}\"", alloy_primitives::keccak256(bytes))).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_jsonrpc::Id;

    #[test]
    fn calls_are_grouped_by_member_in_order() {
        let (groups, none) = group([(0, Some(1)), (1, Some(0)), (2, None), (3, Some(1))]);
        assert_eq!(groups.into_iter().collect::<Vec<_>>(), [(0, vec![1]), (1, vec![0, 3])]);
        assert_eq!(none, [2]);
    }

    #[test]
    fn groups_are_cut_at_the_batch_limit() {
        assert_eq!(chunks(5, 2), [0..2, 2..4, 4..5]);
        assert_eq!(chunks(400, 100).len(), 4);
        assert_eq!(chunks(3, 0), [0..1, 1..2, 2..3]);
        assert!(chunks(0, 10).is_empty());
    }

    #[test]
    fn transaction_hash_is_keccak_of_the_raw_bytes() {
        let req =
            |p: &str| Request::new(Some(Id::number(1)), "eth_sendRawTransaction", RawValue::from_string(p.into()).ok());
        // keccak256 of the empty input.
        let hash = tx_hash(&req(r#"["0x"]"#)).unwrap();
        assert_eq!(hash.get(), "\"0xc5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470\"");
        assert!(tx_hash(&req(r#"["0xabc"]"#)).is_none());
    }
}
