use std::sync::Mutex;

use async_trait::async_trait;
use sluice_jsonrpc::RawValue;

use super::*;

/// A fake upstream (no I/O): answers each call with its method name and records the batches.
#[derive(Default)]
struct EchoUpstream {
    batches: Mutex<Vec<Vec<String>>>,
    fail: bool,
}

#[async_trait]
impl Upstreams for EchoUpstream {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        self.call_batch(&[call]).await.remove(0)
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        self.batches.lock().unwrap().push(calls.iter().map(|c| c.method().to_owned()).collect());
        calls
            .iter()
            .map(|c| {
                if self.fail {
                    return Err(UpstreamError::Unreachable);
                }
                Ok(Answer::upstream(Outcome::result(RawValue::from_string(format!("\"{}\"", c.method())).unwrap())))
            })
            .collect()
    }
}

fn pipeline(upstream: Arc<EchoUpstream>) -> Pipeline {
    Pipeline::new(upstream, 100, 8, MethodPolicy::default(), None)
}

async fn answer(p: &Pipeline, body: &str) -> (serde_json::Value, ServedBy) {
    let reply = p.handle(body.as_bytes(), Edge::default()).await;
    let json = reply.body.map_or(serde_json::Value::Null, |b| serde_json::from_slice(&b.to_vec()).unwrap());
    (json, reply.served_by)
}

#[tokio::test]
async fn a_batch_is_one_upstream_call_answered_in_order() {
    let upstream = Arc::new(EchoUpstream::default());
    let p = pipeline(upstream.clone());
    let body = r#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"note"},7,
                  {"jsonrpc":"2.0","id":"x","method":"eth_subscribe"},{"jsonrpc":"2.0","id":2,"method":"b"}]"#;
    let (json, served_by) = answer(&p, body).await;
    let ids: Vec<_> = json.as_array().unwrap().iter().map(|a| a["id"].clone()).collect();
    assert_eq!(ids, [serde_json::json!(1), serde_json::Value::Null, serde_json::json!("x"), serde_json::json!(2)]);
    assert_eq!(json[0]["result"], "a");
    assert_eq!(json[1]["error"]["code"], -32600);
    assert_eq!(json[2]["error"]["code"], -32601);
    assert_eq!(json[3]["result"], "b");
    assert_eq!(served_by, ServedBy::Mixed);
    assert_eq!(*upstream.batches.lock().unwrap(), [vec!["a", "note", "b"]], "notifications still run");
}

#[tokio::test]
async fn only_notifications_means_no_body() {
    let upstream = Arc::new(EchoUpstream::default());
    let (json, served_by) = answer(&pipeline(upstream.clone()), r#"{"jsonrpc":"2.0","method":"n"}"#).await;
    assert_eq!((json, served_by), (serde_json::Value::Null, ServedBy::Only(Source::Upstream)));
    assert_eq!(upstream.batches.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn upstream_failures_become_errors_per_call() {
    let upstream = Arc::new(EchoUpstream { fail: true, ..Default::default() });
    let (json, _) =
        answer(&pipeline(upstream), r#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]"#)
            .await;
    for item in json.as_array().unwrap() {
        assert_eq!(item["error"]["code"], -32002);
        assert_eq!(item["error"]["message"], "upstream unreachable");
    }
}

#[tokio::test]
async fn a_single_call_is_answered_as_the_same_call_in_a_batch_of_one() {
    let upstream = Arc::new(EchoUpstream::default());
    let policy = MethodPolicy::new(vec!["admin_*".into()], vec![]);
    let p = Pipeline::new(upstream.clone(), 100, 8, policy, None);
    for call in [
        r#"{"jsonrpc":"2.0","id":7,"method":"eth_chainId"}"#,
        r#"{"jsonrpc":"2.0","id":"a","method":"admin_peers"}"#,
        r#"{"jsonrpc":"2.0","id":8,"method":"eth_subscribe","params":["newHeads"]}"#,
        r#"{"jsonrpc":"2.0","id":9,"method":7}"#,
    ] {
        let (single, single_by) = answer(&p, call).await;
        let (batch, batch_by) = answer(&p, &format!("[{call}]")).await;
        assert_eq!(serde_json::json!([single]), batch, "{call}");
        assert_eq!(single_by, batch_by, "{call}");
    }
    assert_eq!(answer(&p, r#"{"jsonrpc":"2.0","id":1,"method":"admin_peers"}"#).await.1, ServedBy::LOCAL);
    assert_eq!(answer(&p, r#"{"jsonrpc":"2.0","id":1,"method":"x"}"#).await.1, ServedBy::Only(Source::Upstream));
    assert_eq!(upstream.batches.lock().unwrap().len(), 3, "only the permitted calls went down");
}

#[test]
fn lower_priorities_get_a_smaller_share_of_the_capacity() {
    let other = BodyKind::Other;
    assert_eq!(admission_limit(100, 0, other), 100);
    assert_eq!(admission_limit(100, 1, other), 90);
    assert_eq!(admission_limit(100, 5, other), 50);
    assert_eq!(admission_limit(100, 9, other), 10);
    assert_eq!(admission_limit(100, 200, other), 10, "clamped at 9");
    assert_eq!(admission_limit(4, 0, other), 4);
}

#[test]
fn bodies_of_submissions_only_get_half_of_their_tiers_share() {
    let kind = |body: &str| match parse_body(body.as_bytes(), 10).expect("parses") {
        Incoming::Single(item) => BodyKind::of(&[item]),
        Incoming::Batch(items) => BodyKind::of(&items),
    };
    let send = r#"{"jsonrpc":"2.0","id":1,"method":"eth_sendRawTransaction","params":["0x00"]}"#;
    let read = r#"{"jsonrpc":"2.0","id":2,"method":"eth_getTransactionCount","params":["0x00","pending"]}"#;
    assert_eq!(kind(send), BodyKind::Submissions);
    assert_eq!(kind(&format!("[{send},{send}]")), BodyKind::Submissions);
    assert_eq!(kind(read), BodyKind::Other);
    assert_eq!(kind(&format!("[{send},{read}]")), BodyKind::Other, "a read in the body makes it a read");
    assert_eq!(kind(&format!("[{send},1]")), BodyKind::Other, "an invalid element too");
    assert_eq!(admission_limit(100, 0, BodyKind::Submissions), 50);
    assert_eq!(admission_limit(100, 5, BodyKind::Submissions), 25);
    assert_eq!(admission_limit(9, 0, BodyKind::Submissions), 5, "rounded up");
    assert_eq!(admission_limit(1, 0, BodyKind::Submissions), 1, "never none");
}

#[tokio::test]
async fn bodies_beyond_the_in_flight_limit_are_refused_busy() {
    let p = Pipeline::new(Arc::new(EchoUpstream::default()), 100, 1, MethodPolicy::default(), None);
    let items = vec![Ok(Request::new(Some(Id::number(1)), "a", None))];
    let held = p.admit_and_charge(&items, Edge::default()).await.ok().unwrap();
    let refused = p.handle(br#"{"jsonrpc":"2.0","id":1,"method":"a"}"#, Edge::default()).await;
    assert_eq!(refused.refused, Some(Refused::Busy));
    drop(held);
    assert_eq!(p.handle(br#"{"jsonrpc":"2.0","id":1,"method":"a"}"#, Edge::default()).await.refused, None);
    assert_eq!(p.in_flight(), 0);
}
