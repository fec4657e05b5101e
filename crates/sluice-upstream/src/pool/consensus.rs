//! Consensus across members, opt-in per method: a call goes to `ask` members at once, and the
//! answer that at least `agree` of them give, byte for byte after canonical JSON, is returned.
//! Otherwise the caller gets an error that counts the distinct answers (never a value no
//! majority stands behind). Members that dissent from a majority are counted; one that keeps
//! dissenting is cordoned. Never for writes.
//!
//! [`tally`] is pure; [`UpstreamPool::call_consensus`] asks the members.

use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use sluice_jsonrpc::Outcome;

use super::attempt::{judge, Step};
use super::{Node, Order, UpstreamPool};
use crate::{Answer, Call, UpstreamError};

/// One consensus rule (`[[pool.consensus]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsensusRule {
    /// Method names or `prefix*` patterns it applies to.
    pub methods: Vec<String>,
    /// Members asked at once.
    #[serde(default = "default_ask")]
    pub ask: usize,
    /// Members that must give the same answer.
    #[serde(default = "default_agree")]
    pub agree: usize,
    /// Dissents in a row from a majority that cordon a member.
    #[serde(default = "default_cordon_after")]
    pub cordon_after: u32,
    /// How long a cordoned member gets no calls.
    #[serde(default = "default_cordon_for", with = "humantime_serde")]
    pub cordon_for: Duration,
}

fn default_ask() -> usize {
    3
}

fn default_agree() -> usize {
    2
}

/// Failed proofs in a row that cordon a member.
pub(super) const UNPROVEN_CORDON_AFTER: u32 = 3;
/// How long a member cordoned for failed proofs gets no calls.
pub(super) const UNPROVEN_CORDON_FOR: Duration = Duration::from_secs(60);

fn default_cordon_after() -> u32 {
    3
}

fn default_cordon_for() -> Duration {
    Duration::from_secs(60)
}

impl ConsensusRule {
    /// Whether the rule applies to `method`.
    pub fn applies(&self, method: &str) -> bool {
        // Methods that change something are never under consensus (sent once per member is a
        // broadcast, not a vote).
        sluice_chain::method_info(method).may_vote()
            && self.methods.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => method.starts_with(prefix),
                None => p == method,
            })
    }

    /// Checks the numbers: 1 ≤ agree ≤ ask, and no write method named.
    pub fn validate(&self) -> Result<(), String> {
        if self.agree == 0 || self.agree > self.ask {
            return Err(format!("consensus: agree ({}) must be 1 to ask ({})", self.agree, self.ask));
        }
        if let Some(write) = self.methods.iter().find(|m| !sluice_chain::method_info(m).may_vote()) {
            return Err(format!("consensus: {write} is a write; writes are never put to a vote"));
        }
        Ok(())
    }
}

/// An answer as compared: its canonical JSON (object keys sorted, no spaces), result and error
/// kept apart.
pub(super) fn canonical(outcome: &Outcome) -> String {
    let (tag, raw) = match outcome {
        Outcome::Result(raw) => ('r', raw.get()),
        Outcome::Error(raw) => ('e', raw.get()),
    };
    // serde_json's maps are sorted (no `preserve_order`), so a round trip is canonical.
    let text = serde_json::from_str::<serde_json::Value>(raw).map_or_else(|_| raw.to_owned(), |v| v.to_string());
    format!("{tag}{text}")
}

/// What the answers decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tally {
    /// `answers[winner]` is returned; `dissent` lists the members that answered otherwise and
    /// `agreed` those that gave it.
    Agreed {
        /// Index into the answers of one that carries the majority's answer.
        winner: usize,
        /// Members with the majority.
        agreed: Vec<usize>,
        /// Members against it.
        dissent: Vec<usize>,
    },
    /// No answer has `agree` members: upstreams per distinct answer, largest first.
    Dispute(Vec<u32>),
}

/// Pure: groups `(member, canonical answer)` pairs and decides.
pub(super) fn tally(answers: &[(usize, String)], agree: usize) -> Tally {
    let mut groups: Vec<(&str, Vec<usize>, usize)> = Vec::new();
    for (at, (member, key)) in answers.iter().enumerate() {
        match groups.iter_mut().find(|(k, ..)| k == key) {
            Some((_, members, _)) => members.push(*member),
            None => groups.push((key, vec![*member], at)),
        }
    }
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.2.cmp(&b.2)));
    match groups.first() {
        Some((_, members, at)) if members.len() >= agree.max(1) => Tally::Agreed {
            winner: *at,
            agreed: members.clone(),
            dissent: groups[1..].iter().flat_map(|(_, m, _)| m.iter().copied()).collect(),
        },
        _ => Tally::Dispute(groups.iter().map(|(_, m, _)| m.len() as u32).collect()),
    }
}

impl<N: Node> UpstreamPool<N> {
    /// The consensus rule for `method`, if one applies.
    pub(super) fn consensus_rule(&self, method: &str) -> Option<&ConsensusRule> {
        self.config.consensus.iter().find(|r| r.applies(method))
    }

    /// A call under `rule`: `ask` members at once (the best in the call's order), a member that
    /// fails or lacks the block replaced by the next; then the tally.
    pub(super) async fn call_consensus(&self, call: &Call, rule: &ConsensusRule) -> Result<Answer, UpstreamError> {
        let mut order = self.members_to_ask(call).await?;
        let ask = |i: usize| self.ask_member(i, call);
        let mut asked = FuturesUnordered::new();
        for i in order.by_ref().take(rule.ask) {
            asked.push(ask(i));
        }
        let deadline = self.deadline(call);
        let mut answers: Vec<(usize, String)> = Vec::with_capacity(rule.ask);
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(rule.ask);
        let mut last_failure = None;
        while let Ok(Some((i, outcome))) = tokio::time::timeout_at(deadline, asked.next()).await {
            self.learn_from(i, call, &outcome);
            match (judge(&outcome, &call.ctx.needs, None), outcome) {
                (Step::Done, Ok(outcome)) => {
                    answers.push((i, canonical(&outcome)));
                    outcomes.push(outcome);
                }
                (_, failed) => {
                    last_failure = failed.err();
                    if let Some(next) = order.next() {
                        asked.push(ask(next));
                    }
                }
            }
        }
        let network = self.config.network.clone();
        match tally(&answers, rule.agree) {
            Tally::Agreed { winner, agreed, dissent } => {
                metrics::counter!("sluice_pool_consensus_total", "network" => network, "outcome" => "agreed")
                    .increment(1);
                self.score_dissent(&agreed, &dissent, rule);
                Ok(Answer::upstream(outcomes.swap_remove(winner)))
            }
            Tally::Dispute(counts) => {
                let outcome = if answers.is_empty() { "no_answer" } else { "dispute" };
                metrics::counter!("sluice_pool_consensus_total", "network" => network, "outcome" => outcome)
                    .increment(1);
                match (answers.is_empty(), last_failure) {
                    (true, Some(failure)) => Err(self.unavailable(failure)),
                    _ => Err(UpstreamError::Disagreement { answers: counts, agree: rule.agree as u32 }),
                }
            }
        }
    }

    /// The members a call asked of several at once goes to, best first (consensus, attested
    /// calls).
    pub(super) async fn members_to_ask(&self, call: &Call) -> Result<std::vec::IntoIter<usize>, UpstreamError> {
        match self.resolve_order(call).await? {
            Order::Try(order) => Ok(order.into_iter()),
            _ => Err(UpstreamError::BudgetExhausted),
        }
    }

    /// `call` asked of member `i` alone, unless its circuit is open; gives `i` back with the
    /// outcome.
    pub(super) async fn ask_member(&self, i: usize, call: &Call) -> (usize, Result<Outcome, UpstreamError>) {
        if !self.members[i].state().breaker.allow(Instant::now()) {
            return (i, Err(UpstreamError::NoneAvailable));
        }
        (i, self.exchange(i, &[&call.req], call.ctx.origin).await.remove(0))
    }

    /// A member answered a result its call's check refused (a proof that does not hold against
    /// a trusted header): counted, scored down as a dissent is, and cordoned for
    /// [`UNPROVEN_CORDON_FOR`] at [`UNPROVEN_CORDON_AFTER`] in a row.
    pub(super) fn score_unproven(&self, i: usize) {
        let member = &self.members[i];
        metrics::counter!("sluice_verify_failures_total", "network" => self.config.network.clone(),
            "upstream" => member.node.name().to_owned())
        .increment(1);
        let now = Instant::now();
        let mut state = member.state();
        state.dissent_streak += 1;
        if state.dissent_streak >= UNPROVEN_CORDON_AFTER && !state.cordoned(now) {
            state.cordoned_until = Some(now + UNPROVEN_CORDON_FOR);
            state.cordons += 1;
            tracing::warn!(upstream = member.node.name(), "upstream cordoned: its proofs keep failing");
            metrics::counter!("sluice_pool_cordons_total", "network" => self.config.network.clone(),
                "upstream" => member.node.name().to_owned())
            .increment(1);
        }
    }

    /// Members with the majority start their count again; dissenters add one, and are cordoned
    /// at `cordon_after` in a row.
    fn score_dissent(&self, agreed: &[usize], dissent: &[usize], rule: &ConsensusRule) {
        for &i in agreed {
            self.members[i].state().dissent_streak = 0;
        }
        let now = Instant::now();
        for &i in dissent {
            let member = &self.members[i];
            metrics::counter!("sluice_pool_consensus_dissent_total", "network" => self.config.network.clone(),
                "upstream" => member.node.name().to_owned())
            .increment(1);
            let mut state = member.state();
            state.dissents += 1;
            state.dissent_streak += 1;
            if state.dissent_streak >= rule.cordon_after && !state.cordoned(now) {
                state.cordoned_until = Some(now + rule.cordon_for);
                state.cordons += 1;
                tracing::warn!(
                    upstream = member.node.name(),
                    dissents = state.dissent_streak,
                    "upstream cordoned: it keeps dissenting from the consensus"
                );
                metrics::counter!("sluice_pool_cordons_total", "network" => self.config.network.clone(),
                    "upstream" => member.node.name().to_owned())
                .increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_jsonrpc::RawValue;

    fn key(json: &str) -> String {
        canonical(&Outcome::result(RawValue::from_string(json.to_owned()).unwrap()))
    }

    #[test]
    fn answers_compare_as_canonical_json() {
        assert_eq!(key(r#"{"b":1, "a":[1,2]}"#), key(r#"{"a":[1,2],"b":1}"#));
        assert_ne!(key(r#""0x1""#), key(r#""0x2""#));
        let error = canonical(&Outcome::error_raw(RawValue::from_string(r#""0x1""#.into()).unwrap()));
        assert_ne!(error, key(r#""0x1""#), "an error is not a result");
    }

    #[test]
    fn the_majority_wins_and_the_rest_dissent() {
        let answers = [(0, key("1")), (1, key("2")), (2, key("1"))];
        assert_eq!(tally(&answers, 2), Tally::Agreed { winner: 0, agreed: vec![0, 2], dissent: vec![1] });
        assert_eq!(tally(&answers, 3), Tally::Dispute(vec![2, 1]));
        let split = [(0, key("1")), (1, key("2")), (2, key("3"))];
        assert_eq!(tally(&split, 2), Tally::Dispute(vec![1, 1, 1]));
        assert_eq!(tally(&[], 2), Tally::Dispute(vec![]));
        assert_eq!(tally(&[(4, key("1"))], 1), Tally::Agreed { winner: 0, agreed: vec![4], dissent: vec![] });
    }

    #[test]
    fn rules_match_methods_but_never_writes() {
        let rule = ConsensusRule {
            methods: vec!["eth_call".into(), "eth_get*".into(), "eth_send*".into()],
            ask: 3,
            agree: 2,
            cordon_after: 3,
            cordon_for: Duration::from_secs(60),
        };
        assert!(rule.applies("eth_call") && rule.applies("eth_getBalance"));
        assert!(!rule.applies("eth_sendRawTransaction") && !rule.applies("eth_chainId"));
        assert!(rule.validate().is_ok());
        assert!(ConsensusRule { agree: 4, ..rule.clone() }.validate().is_err());
        assert!(ConsensusRule { methods: vec!["eth_sendRawTransaction".into()], ..rule }.validate().is_err());
    }
}
