//! A call several members must each answer with a result that passes its check: a block's
//! header at a height, whose hash `k` members must name (verified reads' `agree`). Unlike a
//! consensus vote, answers are not compared with each other: each is judged by the check
//! alone, so members of different clients (whose block objects differ in extra fields) agree
//! on what the check reads. A member whose result fails is not scored as a liar: a member a
//! block behind or on a brief fork names another hash honestly. The next member is asked.

use futures_util::stream::{FuturesUnordered, StreamExt};
use sluice_jsonrpc::Outcome;

use super::attempt::{judge, Step};
use super::{Node, UpstreamPool};
use crate::{Answer, Call, UpstreamError};

impl<N: Node> UpstreamPool<N> {
    /// `call` asked of `k` distinct members at once (the best in its order, each that fails or
    /// answers otherwise replaced by the next): the first passing result once `k` passed;
    /// otherwise [`UpstreamError::Disagreement`] with how many passed.
    pub(super) async fn call_attested(&self, call: &Call, k: usize) -> Result<Answer, UpstreamError> {
        let mut order = self.members_to_ask(call).await?;
        let ask = |i: usize| self.ask_member(i, call);
        let mut asked: FuturesUnordered<_> = order.by_ref().take(k).map(ask).collect();
        let deadline = self.deadline(call);
        let (mut passed, mut other) = (Vec::with_capacity(k), 0u32);
        while let Ok(Some((i, outcome))) = tokio::time::timeout_at(deadline, asked.next()).await {
            self.learn_from(i, call, &outcome);
            // A `null` (no such block there) names nothing.
            let passes =
                |raw: &str| raw != "null" && call.ctx.check.as_ref().is_none_or(|check| (check.0)(raw).is_ok());
            match (judge(&outcome, &call.ctx.needs, None), outcome) {
                (Step::Done, Ok(outcome @ Outcome::Result(_))) if passes(outcome_text(&outcome)) => {
                    passed.push(outcome);
                    if passed.len() >= k {
                        return Ok(Answer::upstream(passed.swap_remove(0)));
                    }
                }
                _ => {
                    other += 1;
                    if let Some(next) = order.next() {
                        asked.push(ask(next));
                    }
                }
            }
        }
        let answers = [passed.len() as u32, other].into_iter().filter(|n| *n > 0).collect();
        Err(UpstreamError::Disagreement { answers, agree: k as u32 })
    }
}

fn outcome_text(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Result(raw) | Outcome::Error(raw) => raw.get(),
    }
}
