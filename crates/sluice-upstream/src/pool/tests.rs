//! The pool with in-memory nodes: failover, retries, budgets, batching and block coverage,
//! without sockets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_jsonrpc::{Outcome, RawValue, Request};

use super::*;
use crate::{Call, Node, UpstreamError, Upstreams};

type Behaviour = dyn Fn(&Request, usize) -> Result<Outcome, UpstreamError> + Send + Sync;

/// An in-memory node: answers each call with `behaviour(call, exchange number)`, counts
/// exchanges and calls, and refuses batches longer than `max_batch`.
struct TestNode {
    name: String,
    exchanges: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    max_batch: usize,
    behaviour: Box<Behaviour>,
}

#[async_trait]
impl Node for TestNode {
    fn name(&self) -> &str {
        &self.name
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }

    async fn send(
        &self,
        reqs: &[&Request],
        _timeout: Duration,
    ) -> Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError> {
        let n = self.exchanges.fetch_add(1, Ordering::SeqCst);
        if reqs.len() > self.max_batch {
            return Err(UpstreamError::BatchRefused);
        }
        self.calls.fetch_add(reqs.len(), Ordering::SeqCst);
        Ok(reqs.iter().map(|r| (self.behaviour)(r, n)).collect())
    }
}

struct Counts {
    exchanges: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Counts {
    fn exchanges(&self) -> usize {
        self.exchanges.load(Ordering::SeqCst)
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn node(
    name: &str,
    behaviour: impl Fn(&Request, usize) -> Result<Outcome, UpstreamError> + Send + Sync + 'static,
) -> (MemberConfig<TestNode>, Counts) {
    let exchanges = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let node = TestNode {
        name: name.into(),
        exchanges: exchanges.clone(),
        calls: calls.clone(),
        max_batch: usize::MAX,
        behaviour: Box::new(behaviour),
    };
    (MemberConfig::new(node), Counts { exchanges, calls })
}

fn ok(text: &str) -> Result<Outcome, UpstreamError> {
    Ok(Outcome::result(RawValue::from_string(text.to_owned()).unwrap()))
}

fn rpc_error(text: &str) -> Result<Outcome, UpstreamError> {
    Ok(Outcome::error_raw(RawValue::from_string(text.to_owned()).unwrap()))
}

fn config() -> PoolConfig {
    PoolConfig { hedge: HedgeAfter::Off, ..PoolConfig::default() }
}

fn balance_at(block: &str) -> Call {
    Call::internal("eth_getBalance", Some(&format!(r#"["0x0000000000000000000000000000000000000001","{block}"]"#)))
}

fn result_text(answer: &Result<crate::Answer, UpstreamError>) -> String {
    match answer {
        Ok(crate::Answer { outcome: Outcome::Result(r), .. }) => r.get().to_owned(),
        Ok(crate::Answer { outcome: Outcome::Error(e), .. }) => format!("error {}", e.get()),
        Err(e) => format!("err {}", e.kind()),
    }
}

#[tokio::test]
async fn one_member_keeps_its_rate() {
    let (mut member, counts) = node("a", |_, _| ok("\"0x1\""));
    member.rate = Some(5.0);
    let pool = UpstreamPool::without_prober(vec![member], PoolConfig { budget_wait: Duration::ZERO, ..config() });
    let calls: Vec<Call> = (0..60).map(|i| balance_at(&format!("0x{i:x}"))).collect();
    let answers = futures_util::future::join_all(calls.iter().map(|c| pool.call(c))).await;
    let over = answers.iter().filter(|a| matches!(a, Err(UpstreamError::BudgetExhausted))).count();
    assert!(counts.calls() <= 6, "{} calls reached a node limited to 5/s", counts.calls());
    assert_eq!(over + counts.calls(), 60, "every other call is refused as over budget");
}

#[tokio::test]
async fn calls_over_the_rate_wait_their_turn_until_the_queue_is_full() {
    let (mut member, counts) = node("a", |_, _| ok("\"0x1\""));
    member.rate = Some(10.0);
    let wait = Duration::from_millis(500);
    let pool = UpstreamPool::without_prober(vec![member], PoolConfig { budget_wait: wait, ..config() });
    let calls: Vec<Call> = (0..40).map(|i| balance_at(&format!("0x{i:x}"))).collect();
    let started = tokio::time::Instant::now();
    let answers = futures_util::future::join_all(calls.iter().map(|c| pool.call(c))).await;
    let answered = answers.iter().filter(|a| a.is_ok()).count();
    let over = answers.iter().filter(|a| matches!(a, Err(UpstreamError::BudgetExhausted))).count();
    // A burst of 10, then half a second's queue at 10/s; the rest refused at once.
    assert_eq!((answered, over), (15, 25));
    assert_eq!(counts.calls(), 15);
    assert!(started.elapsed() >= Duration::from_millis(500), "the last waited its turn");
}

#[tokio::test]
async fn a_429_cuts_the_rate_and_calls_wait_instead_of_failing() {
    // A node that accepts 10 calls a second and answers 429 to the rest (real time: the
    // budgets read the clock).
    let window = Arc::new(std::sync::Mutex::new((std::time::Instant::now(), 0u32)));
    let (member, counts) = node("a", move |_, _| {
        let mut w = window.lock().unwrap();
        if w.0.elapsed() >= Duration::from_secs(1) {
            *w = (std::time::Instant::now(), 0);
        }
        w.1 += 1;
        if w.1 > 10 {
            Err(UpstreamError::RateLimited(None))
        } else {
            ok("\"0x1\"")
        }
    });
    let pool = Arc::new(UpstreamPool::without_prober(
        vec![member],
        PoolConfig { budget_wait: Duration::from_secs(2), ..config() },
    ));
    // 20 calls a second for 4 seconds, each its own task.
    let mut tasks = Vec::new();
    for i in 0..80u64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move { pool.call(&balance_at(&format!("0x{i:x}"))).await }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut errors = std::collections::BTreeMap::new();
    let mut answered = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => answered += 1,
            Err(e) => *errors.entry(e.kind()).or_insert(0) += 1,
        }
    }
    let status = pool.status();
    let member = &status["upstreams"][0];
    assert_eq!(member["rate_cut"], true, "{member}");
    let rate = member["rate"].as_f64().unwrap();
    assert!(rate <= 12.0, "the rate settled near what the node accepts: {rate}");
    // Callers see -32005: over budget once the queue is full; the node's 429 itself only when
    // three attempts in a row met one (rare: the rate rises slowly past the node's).
    assert!(errors.keys().all(|k| *k == "budget_exhausted" || *k == "rate_limited"), "{errors:?}");
    assert!(errors.get("rate_limited").copied().unwrap_or(0) <= 4, "{errors:?}");
    assert!(answered >= 25, "the node's capacity was used: {answered} answered of {} sent", counts.calls());
}

#[tokio::test]
async fn one_member_is_retried_after_node_trouble() {
    let (member, counts) = node("a", |_, n| if n < 2 { Err(UpstreamError::Unreachable) } else { ok("\"0x2\"") });
    let pool = UpstreamPool::without_prober(vec![member], config());
    let answer = pool.call(&balance_at("latest")).await;
    assert_eq!(result_text(&answer), "\"0x2\"");
    assert_eq!(counts.exchanges(), 3, "max_attempts = 3 on the only member");
}

#[tokio::test]
async fn the_requests_own_errors_are_not_retried() {
    let (member, counts) = node("a", |_, _| rpc_error(r#"{"code":3,"message":"execution reverted"}"#));
    let (other, other_counts) = node("b", |_, _| ok("\"0x0\""));
    let pool = UpstreamPool::without_prober(vec![member, other], config());
    pool.set_head(0, 10, None);
    pool.set_head(1, 10, None);
    let answer = pool.call(&Call::internal("eth_call", Some(r#"[{"to":"0x01"},"latest"]"#))).await;
    assert!(result_text(&answer).contains("reverted"));
    assert_eq!(counts.calls() + other_counts.calls(), 1);
}

#[tokio::test]
async fn a_batch_is_one_exchange_per_member_and_chunk() {
    let (a, a_counts) = node("a", |_, _| ok("\"0x1\""));
    let (b, b_counts) = node("b", |_, _| ok("\"0x1\""));
    let pool = UpstreamPool::without_prober(vec![a, b], PoolConfig { max_batch: 100, ..config() });
    let calls: Vec<Call> = (0..400).map(|i| balance_at(&format!("0x{i:x}"))).collect();
    let refs: Vec<&Call> = calls.iter().collect();
    let answers = pool.call_batch(&refs).await;
    assert!(answers.iter().all(|a| result_text(a) == "\"0x1\""));
    assert_eq!(a_counts.calls() + b_counts.calls(), 400);
    assert!(a_counts.exchanges() + b_counts.exchanges() <= 4, "{} + {}", a_counts.exchanges(), b_counts.exchanges());
}

#[tokio::test]
async fn a_refused_batch_size_is_halved_until_the_node_takes_it() {
    let exchanges = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let node = TestNode {
        name: "a".into(),
        exchanges: exchanges.clone(),
        calls: calls.clone(),
        max_batch: 30,
        behaviour: Box::new(|_, _| ok("\"0x1\"")),
    };
    let pool = UpstreamPool::without_prober(vec![MemberConfig::new(node)], PoolConfig { max_batch: 100, ..config() });
    let batch: Vec<Call> = (0..100).map(|i| balance_at(&format!("0x{i:x}"))).collect();
    let refs: Vec<&Call> = batch.iter().collect();
    let answers = pool.call_batch(&refs).await;
    assert!(answers.iter().all(|a| result_text(a) == "\"0x1\""), "every call answered");
    assert_eq!(calls.load(Ordering::SeqCst), 100, "each call sent once it fits");
    assert_eq!(pool.members[0].state().batch_limit, Some(25), "learned: 100 → 50 → 25");
}

#[tokio::test]
async fn batch_elements_fail_over_one_by_one() {
    // Member a fails every other call; b answers everything.
    let (a, _) =
        node(
            "a",
            |r, _| if r.params_text().contains("\"0x1\"") { Err(UpstreamError::Unreachable) } else { ok("\"a\"") },
        );
    let (mut b, _) = node("b", |_, _| ok("\"b\""));
    b.tier = 1;
    let pool = UpstreamPool::without_prober(vec![a, b], config());
    let calls = [balance_at("0x0"), balance_at("0x1"), balance_at("0x2")];
    let refs: Vec<&Call> = calls.iter().collect();
    let answers: Vec<String> = pool.call_batch(&refs).await.iter().map(result_text).collect();
    assert_eq!(answers, ["\"a\"", "\"b\"", "\"a\""]);
}

#[tokio::test]
async fn missing_block_is_answered_by_a_member_that_has_it() {
    let missing = r#"{"code":-32001,"message":"Resource not found"}"#;
    let (behind, behind_counts) = node("behind", move |_, _| rpc_error(missing));
    let (ahead, _) = node("ahead", |_, _| ok("\"0x5\""));
    let pool = UpstreamPool::without_prober(vec![behind, ahead], config());
    // Neither is known to have the hash (the block was just mined): both may be asked.
    let hash = format!("0x{}", "cd".repeat(32));
    let call = Call::internal(
        "eth_getBalance",
        Some(&format!(r#"["0x0000000000000000000000000000000000000001",{{"blockHash":"{hash}"}}]"#)),
    );
    for _ in 0..10 {
        assert_eq!(result_text(&pool.call(&call).await), "\"0x5\"");
    }
    assert!(pool.members[1].state().knows(&hash), "learned from its answer");
    let before = behind_counts.calls();
    assert_eq!(result_text(&pool.call(&call).await), "\"0x5\"");
    assert_eq!(behind_counts.calls(), before, "now known: only the member that has it is asked");
}

#[tokio::test]
async fn missing_block_everywhere_is_the_answer_but_node_trouble_wins_over_it() {
    let missing = r#"{"code":-32000,"message":"header not found"}"#;
    let (a, _) = node("a", move |_, _| rpc_error(missing));
    let (b, _) = node("b", move |_, _| rpc_error(missing));
    let pool = UpstreamPool::without_prober(vec![a, b], config());
    assert!(result_text(&pool.call(&balance_at("0x99")).await).contains("header not found"));
    let (a, _) = node("a", move |_, _| rpc_error(missing));
    let (b, _) = node("b", |_, _| Err(UpstreamError::Unreachable));
    let pool = UpstreamPool::without_prober(vec![a, b], config());
    assert_eq!(result_text(&pool.call(&balance_at("0x99")).await), "err unreachable");
}

#[tokio::test]
async fn a_block_beyond_a_members_head_goes_elsewhere() {
    let (low, low_counts) = node("low", |_, _| ok("null"));
    let (high, _) = node("high", |_, _| ok("\"block\""));
    let pool = UpstreamPool::without_prober(vec![low, high], config());
    pool.set_head(0, 10, None);
    pool.set_head(1, 20, None);
    let call = Call::internal("eth_getBlockByNumber", Some(r#"["0xf",false]"#));
    for _ in 0..5 {
        assert_eq!(result_text(&pool.call(&call).await), "\"block\"");
    }
    assert_eq!(low_counts.calls(), 0);
}

#[tokio::test]
async fn transactions_go_to_every_member_in_one_exchange_each() {
    let (a, a_counts) = node("a", |_, _| rpc_error(r#"{"code":-32000,"message":"already known"}"#));
    let (b, b_counts) = node("b", |_, _| rpc_error(r#"{"code":-32000,"message":"nonce too low"}"#));
    let pool = UpstreamPool::without_prober(vec![a, b], config());
    let calls: Vec<Call> = (0..20).map(|_| Call::internal("eth_sendRawTransaction", Some(r#"["0x"]"#))).collect();
    let refs: Vec<&Call> = calls.iter().collect();
    let answers = pool.call_batch(&refs).await;
    for answer in &answers {
        assert_eq!(result_text(answer), "\"0xc5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470\"");
    }
    assert_eq!((a_counts.exchanges(), b_counts.exchanges()), (1, 1));
}

/// A node that answers after `delay`, honouring the timeout it is given as `HttpUpstream` does.
struct SlowNode {
    delay: Duration,
}

#[async_trait]
impl Node for SlowNode {
    fn name(&self) -> &str {
        "slow"
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }

    async fn send(
        &self,
        reqs: &[&Request],
        timeout: Duration,
    ) -> Result<Vec<Result<Outcome, UpstreamError>>, UpstreamError> {
        if self.delay > timeout {
            tokio::time::sleep(timeout).await;
            return Err(UpstreamError::Timeout(timeout));
        }
        tokio::time::sleep(self.delay).await;
        Ok(reqs.iter().map(|_| ok("\"0x1\"")).collect())
    }
}

#[tokio::test]
async fn the_deadline_ends_a_call_without_counting_against_the_node() {
    let deadline = Duration::from_millis(100);
    let pool = UpstreamPool::without_prober(
        vec![MemberConfig::new(SlowNode { delay: Duration::from_secs(10) })],
        PoolConfig { deadline, ..config() },
    );
    let started = tokio::time::Instant::now();
    let answer = pool.call(&balance_at("latest")).await;
    assert_eq!(answer.unwrap_err(), UpstreamError::Timeout(deadline));
    let took = started.elapsed();
    assert!(
        took >= deadline && took < Duration::from_secs(2),
        "{took:?}: answered at the deadline, not the node's 5 s"
    );
    // The node was cut short by the call's deadline, not found slow by its own timeout.
    let mut state = pool.members[0].state();
    assert_eq!(state.last_error, None);
    assert!(state.breaker.allow(std::time::Instant::now()));
}

#[tokio::test]
async fn a_callers_deadline_ends_a_wait_for_the_rate() {
    let (mut member, counts) = node("a", |_, _| ok("\"0x1\""));
    member.rate = Some(1.0);
    let pool =
        UpstreamPool::without_prober(vec![member], PoolConfig { budget_wait: Duration::from_secs(10), ..config() });
    assert!(pool.call(&balance_at("0x1")).await.is_ok(), "the first call is within the rate");
    let mut late = balance_at("0x2");
    late.ctx.deadline = Some(std::time::Instant::now() + Duration::from_millis(200));
    let started = tokio::time::Instant::now();
    assert!(matches!(pool.call(&late).await, Err(UpstreamError::Timeout(_))));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}: waited for the rate (10 s) past the deadline (200 ms)");
    assert_eq!(counts.calls(), 1, "the late call never reached the node");
}
