//! One exchange with a member: its concurrency slot, its budgets (local and shared), the send
//! under its timeout and trace span, and what the answer does to its health, circuit and rate.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use sluice_jsonrpc::{Outcome, Request};
use tokio::sync::TryAcquireError;
use tracing::Instrument;

use super::{is_rate_limited, judge_error, AfterAnswer, InFlight, UpstreamPool};
use crate::{Node, Origin, UpstreamError};

impl<N: Node> UpstreamPool<N> {
    /// One exchange with member `i`, within its concurrency limit and budgets, updating its
    /// health, latency window and circuit. Calls the budgets cannot cover come back
    /// [`UpstreamError::BudgetExhausted`] without being sent.
    pub(super) async fn exchange(
        &self,
        i: usize,
        reqs: &[&Request],
        origin: Origin,
    ) -> Vec<Result<Outcome, UpstreamError>> {
        self.exchange_by(i, reqs, None, origin).await
    }

    /// [`Self::exchange`] ending by `deadline`: every wait (a concurrency slot, the rate's
    /// queue, the shared budget) and the send itself. The node's own timeout is cut to the time
    /// left, so one timer bounds both (no second timer around the exchange); a send cut short
    /// by the deadline counts as cancelled, not against the node's health. Past the deadline,
    /// calls come back [`UpstreamError::Timeout`]. The calls sent are counted under `origin`
    /// (`sluice_upstream_metered_calls_total`), as the provider's meter counts them.
    pub(super) async fn exchange_by(
        &self,
        i: usize,
        reqs: &[&Request],
        deadline: Option<tokio::time::Instant>,
        origin: Origin,
    ) -> Vec<Result<Outcome, UpstreamError>> {
        let member = &self.members[i];
        let late = || vec![Err(UpstreamError::Timeout(self.config.deadline)); reqs.len()];
        let _slot = match &member.slots {
            // A free slot is taken without a timer; waiting for one ends at the deadline.
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(TryAcquireError::Closed) => return vec![Err(UpstreamError::NoneAvailable); reqs.len()],
                Err(TryAcquireError::NoPermits) => match by(deadline, slots.clone().acquire_owned()).await {
                    Some(Ok(permit)) => Some(permit),
                    Some(Err(_)) => return vec![Err(UpstreamError::NoneAvailable); reqs.len()],
                    None => return late(),
                },
            },
            None => None,
        };
        // One clock read serves the budgets, the time left and the start of the exchange,
        // unless something was waited for in between.
        let mut started = Instant::now();
        let (allowed, wait) = member.state().spend(reqs.len(), started, SystemTime::now, self.config.budget_wait);
        let shared = self.config.shared_budget.is_some();
        let Some(allowed) = self.spend_shared(i, allowed, deadline).await else { return late() };
        if !wait.is_zero() {
            // Its place in the rate's queue (or the provider's Retry-After).
            let until = tokio::time::Instant::now() + wait;
            tokio::time::sleep_until(deadline.map_or(until, |d| d.min(until))).await;
            if deadline.is_some_and(|d| d < until) {
                return late();
            }
        }
        if shared || !wait.is_zero() {
            started = Instant::now();
        }
        let (sent, refused) = reqs.split_at(allowed);
        let mut results = Vec::with_capacity(reqs.len());
        if !sent.is_empty() {
            let own =
                sent.iter().map(|r| self.timeout_for(&r.method, member)).max().unwrap_or_else(|| member.node.timeout());
            let left = deadline.map(|d| d.into_std().saturating_duration_since(started));
            let timeout = left.map_or(own, |left| left.min(own));
            if timeout.is_zero() {
                return late();
            }
            member.calls[origin as usize].increment(sent.len() as u64);
            member.state().health.in_flight += 1;
            let in_flight = InFlight(member);
            // One span per exchange with a member: its `traceparent` goes to the node.
            let span = tracing::debug_span!(
                "upstream",
                member = member.node.name(),
                calls = sent.len(),
                outcome = tracing::field::Empty
            );
            let answer = member.node.send(sent, timeout).instrument(span.clone()).await;
            span.record("outcome", exchange_outcome(&answer));
            drop(in_flight);
            if timeout < own && matches!(answer, Err(UpstreamError::Timeout(_))) {
                // Cut short by the call's deadline: as if cancelled, nothing learnt of the node.
                return late();
            }
            let healthy = match &answer {
                Ok(outcomes) => outcomes.iter().all(|o| match o {
                    Ok(Outcome::Error(e)) => judge_error(e) != AfterAnswer::RetryElsewhere,
                    Ok(Outcome::Result(_)) => true,
                    Err(_) => false,
                }),
                Err(UpstreamError::BatchRefused) => true,
                Err(_) => false,
            };
            let limited = rate_limited(&answer);
            let mut state = member.state();
            let now = Instant::now();
            let took = now.saturating_duration_since(started);
            state.last_error = answer.as_ref().err().cloned();
            state.health.record(took, healthy);
            match limited {
                // The node is up but over its provider's rate: the adaptive rate answers that,
                // not the circuit.
                Some(retry_after) => {
                    state.adaptive.limited(retry_after, now);
                    metrics::counter!("sluice_upstream_rate_limited_total", "network" => self.config.network.clone(),
                        "upstream" => member.node.name().to_owned())
                    .increment(1);
                }
                None if healthy => {
                    state.alive = Some(now);
                    state.adaptive.accepted(sent.len(), now);
                    state.recent.push(took);
                    state.breaker.on_success();
                }
                None if matches!(answer, Err(UpstreamError::Refused)) => state.breaker.on_down(now),
                None => state.breaker.on_failure(now),
            }
            drop(state);
            match answer {
                Ok(outcomes) if outcomes.len() == sent.len() => results.extend(outcomes),
                Ok(_) => {
                    results.extend(sent.iter().map(|_| Err(UpstreamError::InvalidResponse("batch answer missing"))))
                }
                Err(e) => results.extend(sent.iter().map(|_| Err(e.clone()))),
            }
        }
        results.extend(refused.iter().map(|_| Err(UpstreamError::BudgetExhausted)));
        results
    }

    /// Takes `n` calls of member `i`'s shared budgets, when there are any; how many may go, or
    /// `None` if the shared store did not answer by `deadline`.
    async fn spend_shared(&self, i: usize, n: usize, deadline: Option<tokio::time::Instant>) -> Option<usize> {
        let member = &self.members[i];
        match (&self.config.shared_budget, member.limits) {
            (Some(shared), (rate, daily)) if n > 0 && (rate.is_some() || daily.is_some()) => {
                by(deadline, shared.take(&member.budget_key, rate, daily, n)).await
            }
            _ => Some(n),
        }
    }
}

/// `work`'s output, or `None` once `deadline` passes (no timer without a deadline).
async fn by<F: Future>(deadline: Option<tokio::time::Instant>, work: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, work).await.ok(),
        None => Some(work.await),
    }
}

/// Whether an exchange was refused for the provider's rate (HTTP 429, or a JSON-RPC rate-limit
/// error for any call in it), and the `Retry-After` it gave.
fn rate_limited(answer: &Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError>) -> Option<Option<Duration>> {
    match answer {
        Err(UpstreamError::RateLimited(retry_after)) => Some(*retry_after),
        Ok(outcomes) => outcomes
            .iter()
            .any(|o| match o {
                Ok(Outcome::Error(e)) => is_rate_limited(e),
                Err(UpstreamError::RateLimited(_)) => true,
                _ => false,
            })
            .then_some(None),
        Err(_) => None,
    }
}

/// An exchange's outcome for its trace span: `ok`, `rpc_error` (some answer is an error) or the
/// failure's kind.
fn exchange_outcome(answer: &Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError>) -> &'static str {
    match answer {
        Ok(outcomes) if outcomes.iter().all(|o| matches!(o, Ok(Outcome::Result(_)))) => "ok",
        Ok(_) => "rpc_error",
        Err(e) => e.kind(),
    }
}
