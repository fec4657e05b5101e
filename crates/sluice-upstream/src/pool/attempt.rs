//! Failover for one call: which member next, and when to stop.
//!
//! [`Attempts`] is pure bookkeeping, shared by single calls and by each element of a batch.

use std::time::Instant;

use sluice_chain::BlockNeed;
use sluice_jsonrpc::Outcome;

use super::classify::{is_missing_block, judge_error, AfterAnswer};
use super::integrity::Suspect;
use super::{Node, Order, UpstreamPool};
use crate::{Answer, Call, UpstreamError};

/// What one answer from a member means for the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Return it.
    Done,
    /// Node trouble: another member, or this one again if it is the only one left.
    Retry,
    /// This member cannot serve it (no such method, over budget, circuit open): another member.
    Another,
    /// This member lacks the block the call needs: another member; returned only when no
    /// member can give a better answer.
    Missing,
}

/// Judges one outcome for a call that needs `needs`; a result the integrity checks find
/// `suspect` is treated as "missing": another member first.
pub(super) fn judge(outcome: &Result<Outcome, UpstreamError>, needs: &BlockNeed, suspect: Option<Suspect>) -> Step {
    match outcome {
        Ok(Outcome::Result(_)) if suspect.is_some() => Step::Missing,
        Ok(Outcome::Result(_)) => Step::Done,
        Ok(Outcome::Error(e)) if needs.is_specific() && is_missing_block(e) => Step::Missing,
        Ok(Outcome::Error(e)) => match judge_error(e) {
            AfterAnswer::Final => Step::Done,
            AfterAnswer::RetryElsewhere => Step::Retry,
            AfterAnswer::TryAnother => Step::Another,
        },
        Err(UpstreamError::BudgetExhausted | UpstreamError::NoneAvailable) => Step::Another,
        Err(_) => Step::Retry,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    No,
    /// Failed with node trouble: may be tried again while attempts remain.
    Again,
    /// Not again for this call.
    Never,
}

/// The failover state of one call.
pub(super) struct Attempts {
    order: Vec<usize>,
    tried: Vec<Tried>,
    made: usize,
    max: usize,
    /// The last answer that was not "missing block" (node trouble, its error answer).
    last: Option<Result<Answer, UpstreamError>>,
    /// The last "missing block" answer.
    missing: Option<Answer>,
}

impl Attempts {
    pub(super) fn new(order: Order, members: usize, max: usize) -> Self {
        let (order, last) = match order {
            Order::Try(order) => (order, None),
            Order::OverBudget => (Vec::new(), Some(Err(UpstreamError::BudgetExhausted))),
            // The pool resolves these before failover starts.
            Order::NotCovered { .. } | Order::BeyondHead { .. } => (Vec::new(), None),
        };
        Self { order, tried: vec![Tried::No; members], made: 0, max: max.max(1), last, missing: None }
    }

    /// No member to ask, for this reason (an answer the pool gives itself).
    pub(super) fn refused(error: UpstreamError, members: usize) -> Self {
        let mut attempts = Self::new(Order::Try(Vec::new()), members, 1);
        attempts.last = Some(Err(error));
        attempts
    }

    /// The member to try next, if any: untried members in order, then members that failed
    /// with node trouble (with one member, retries go to it again).
    pub(super) fn next(&mut self) -> Option<usize> {
        if self.made >= self.max {
            return None;
        }
        let pick = self
            .order
            .iter()
            .copied()
            .find(|&i| self.tried[i] == Tried::No)
            // Then members that had trouble: they may have the block that others lack.
            .or_else(|| self.order.iter().copied().find(|&i| self.tried[i] == Tried::Again))?;
        self.made += 1;
        self.tried[pick] = Tried::Never;
        Some(pick)
    }

    /// The member after `i` in the order that has not been tried (the hedge target).
    pub(super) fn peek_after_next(&self) -> Option<usize> {
        self.order.iter().copied().find(|&i| self.tried[i] == Tried::No)
    }

    /// Marks `i` as asked by a hedge.
    pub(super) fn mark(&mut self, i: usize) {
        self.tried[i] = Tried::Never;
        self.made += 1;
    }

    /// Records member `i`'s answer; `Some` when the call is answered.
    pub(super) fn record(
        &mut self,
        i: usize,
        outcome: Result<Outcome, UpstreamError>,
        needs: &BlockNeed,
        suspect: Option<Suspect>,
    ) -> Option<Result<Answer, UpstreamError>> {
        if let Some(why) = suspect {
            metrics::counter!("sluice_pool_integrity_retries_total", "reason" => why.as_str()).increment(1);
        }
        match judge(&outcome, needs, suspect) {
            Step::Done => return Some(outcome.map(Answer::upstream)),
            Step::Retry => {
                self.tried[i] = Tried::Again;
                metrics::counter!("sluice_pool_retries_total").increment(1);
                self.last = Some(outcome.map(Answer::upstream));
            }
            Step::Another => {
                // Keep the more telling of "over budget" and an earlier failure.
                if self.last.is_none() || matches!(outcome, Err(UpstreamError::BudgetExhausted)) {
                    self.last = Some(outcome.map(Answer::upstream));
                }
            }
            Step::Missing => {
                if suspect.is_none() {
                    metrics::counter!("sluice_pool_missing_block_retries_total").increment(1);
                }
                if let Ok(outcome) = outcome {
                    // A suspect result is kept over a "missing block" error: it may be right.
                    let keep = !matches!(
                        (&self.missing, &outcome),
                        (Some(Answer { outcome: Outcome::Result(_), .. }), Outcome::Error(_))
                    );
                    if keep {
                        self.missing = Some(Answer::upstream(outcome));
                    }
                }
                // Members that failed for other reasons get another chance before this
                // answer is given: they may well have the block.
            }
        }
        None
    }

    /// The answer when no member gave a final one: a node-trouble error if any member had
    /// trouble (the block may exist there), else "missing block" (every member said so: it is
    /// the truth), else why no member could be asked.
    pub(super) fn finish(&mut self) -> Result<Answer, UpstreamError> {
        match (self.last.take(), self.missing.take()) {
            // Every member that answered gave a suspect result: it is the best answer had.
            (_, Some(missing @ Answer { outcome: Outcome::Result(_), .. })) => Ok(missing),
            (Some(Err(e)), _) if !matches!(e, UpstreamError::BudgetExhausted | UpstreamError::NoneAvailable) => Err(e),
            (_, Some(missing)) => Ok(missing),
            (Some(last), None) => last,
            (None, None) => Err(UpstreamError::NoneAvailable),
        }
    }
}

impl<N: Node> UpstreamPool<N> {
    /// One call (not a transaction): ordered, hedged on its first attempt, failed over.
    pub(super) async fn call_one(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let mut attempts = self.attempts_for(call).await;
        // One clock read for the deadline and the first circuit check (a failover reads it
        // again).
        let mut now = Instant::now();
        let deadline = self.deadline_from(call, now);
        let mut first = true;
        while let Some(i) = attempts.next() {
            if !self.members[i].state().breaker.allow(now) {
                attempts.record(i, Err(UpstreamError::NoneAvailable), &call.ctx.needs, None);
                continue;
            }
            let hedge_to = if first { attempts.peek_after_next() } else { None };
            first = false;
            // Every exchange ends by the deadline itself (its node timeout cut to the time
            // left): no timer around the attempt as well.
            let (outcome, answered_by, hedged) = self.hedged(i, hedge_to, call, deadline).await;
            if let Some(j) = hedged {
                attempts.mark(j); // already asked this call
            }
            self.learn_from(answered_by, call, &outcome);
            let suspect = self.suspect(call, &outcome);
            if suspect == Some(Suspect::Unproven) {
                self.score_unproven(answered_by);
            } else if call.ctx.check.is_some() && matches!(outcome, Ok(Outcome::Result(_))) {
                self.members[answered_by].state().dissent_streak = 0;
            }
            if let Some(answer) = attempts.record(answered_by, outcome, &call.ctx.needs, suspect) {
                return answer;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(UpstreamError::Timeout(self.config.deadline));
            }
            now = Instant::now();
        }
        attempts.finish().map_err(|e| self.unavailable(e))
    }

    /// When a call must be answered by: its caller's deadline or the pool's, the sooner.
    pub(super) fn deadline(&self, call: &Call) -> tokio::time::Instant {
        self.deadline_from(call, Instant::now())
    }

    /// [`Self::deadline`] for a call starting at `now`.
    fn deadline_from(&self, call: &Call, now: Instant) -> tokio::time::Instant {
        let own = now + self.config.deadline;
        let at = call.ctx.deadline.map_or(own, |d| d.min(own));
        tokio::time::Instant::from_std(at)
    }

    /// One attempt on `first`, hedged to `second` if it is slower than the hedge delay and the
    /// hedge budget allows. The first good answer wins; the other call is cancelled. Gives the
    /// outcome, the member that gave it, and the hedge target if it was asked.
    async fn hedged(
        &self,
        first: usize,
        second: Option<usize>,
        call: &Call,
        deadline: tokio::time::Instant,
    ) -> (Result<Outcome, UpstreamError>, usize, Option<usize>) {
        let one = |i: usize| async move {
            self.exchange_by(i, &[&call.req], Some(deadline), call.ctx.origin).await.remove(0)
        };
        self.hedges.lock().unwrap_or_else(|e| e.into_inner()).on_call();
        let delay = self.config.hedge.delay(&self.members[first].state().recent);
        let (Some(delay), Some(second)) = (delay, second) else { return (one(first).await, first, None) };
        let primary = one(first);
        tokio::pin!(primary);
        tokio::select! {
            result = &mut primary => return (result, first, None),
            _ = tokio::time::sleep(delay) => {}
        }
        let allowed = self.hedges.lock().unwrap_or_else(|e| e.into_inner()).try_hedge()
            && self.members[second].state().breaker.allow(Instant::now());
        if !allowed {
            return (primary.await, first, None);
        }
        metrics::counter!("sluice_pool_hedges_total").increment(1);
        let backup = one(second);
        tokio::pin!(backup);
        let good = |o: &Result<Outcome, UpstreamError>| judge(o, &call.ctx.needs, self.suspect(call, o)) == Step::Done;
        tokio::select! {
            result = &mut primary => {
                if good(&result) { (result, first, Some(second)) } else { (backup.await, second, Some(second)) }
            }
            result = &mut backup => {
                if good(&result) {
                    metrics::counter!("sluice_pool_hedge_wins_total").increment(1);
                    (result, second, Some(second))
                } else {
                    (primary.await, first, Some(second))
                }
            }
        }
    }
}
