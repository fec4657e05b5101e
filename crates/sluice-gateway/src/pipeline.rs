//! The request pipeline: parse, route each call, call upstream, assemble the answer.

use std::sync::Arc;

use sluice_jsonrpc::{
    codes, parse_body, write_responses, ErrorObject, Id, Incoming, Invalid, Outcome, Request, Response,
};
use sluice_upstream::{Answer, Source, UpstreamError, Upstreams};

use sluice_access::{Access, Caller, Refusal};

use crate::policy::MethodPolicy;
use crate::route::{route, Route};
use crate::telemetry;

/// What answered a request, reported in the `x-sluice-served-by` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// Every call was answered from the same place.
    Only(Source),
    /// A batch answered from several places.
    Mixed,
}

impl ServedBy {
    /// Answered by sluice alone.
    pub const LOCAL: ServedBy = ServedBy::Only(Source::Local);

    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            ServedBy::Only(source) => source.as_str(),
            ServedBy::Mixed => "mixed",
        }
    }

    fn join(this: Option<ServedBy>, source: Source) -> Option<ServedBy> {
        Some(match this {
            None => ServedBy::Only(source),
            Some(ServedBy::Only(s)) if s == source => ServedBy::Only(s),
            Some(_) => ServedBy::Mixed,
        })
    }
}

/// The answer to one body.
#[derive(Debug)]
pub struct Reply {
    /// The JSON to send back; `None` when every call was a notification.
    pub body: Option<Vec<u8>>,
    /// What produced it.
    pub served_by: ServedBy,
    /// Access control refused the whole body (the HTTP status and `Retry-After` follow from it).
    pub refusal: Option<Refusal>,
}

/// The caller of a body, when access control is on.
pub struct Who<'a> {
    /// Keys, tiers and quotas.
    pub access: &'a Access,
    /// The identified caller.
    pub caller: &'a Caller,
    /// Its tier's method policy (the global one merged with the tier's lists).
    pub policy: &'a MethodPolicy,
}

/// Parses bodies and answers their calls through an [`Upstreams`].
pub struct Pipeline {
    upstreams: Arc<dyn Upstreams>,
    max_batch_len: usize,
    policy: MethodPolicy,
}

impl Pipeline {
    /// A pipeline over `upstreams` that refuses batches longer than `max_batch_len`.
    /// Node-key and admin methods are denied (see [`MethodPolicy::default`]).
    pub fn new(upstreams: Arc<dyn Upstreams>, max_batch_len: usize) -> Self {
        Self { upstreams, max_batch_len, policy: MethodPolicy::default() }
    }

    /// The same pipeline with another method policy.
    pub fn with_policy(mut self, policy: MethodPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The upstreams calls go to (for readiness checks).
    pub fn upstreams(&self) -> &Arc<dyn Upstreams> {
        &self.upstreams
    }

    /// Answers one request body (HTTP body or WebSocket message).
    pub async fn handle(&self, body: &[u8]) -> Reply {
        self.handle_as(body, None).await
    }

    /// Answers one body for a caller: charged to its quota first (the whole body, by the cost
    /// of its calls), under its tier's method policy.
    pub async fn handle_as(&self, body: &[u8], who: Option<&Who<'_>>) -> Reply {
        let (items, batch) = match parse_body(body, self.max_batch_len) {
            Err(e) => {
                telemetry::count_call("", if e.code == codes::PARSE_ERROR { "parse_error" } else { "invalid" });
                return Reply::local_error(e);
            }
            Ok(Incoming::Single(item)) => (vec![item], false),
            Ok(Incoming::Batch(items)) => (items, true),
        };
        if let Some(who) = who {
            if let Some(refusal) = self.charge(who, &items).await {
                return refusal;
            }
        }
        self.answer_with(items, batch, who.map_or(&self.policy, |w| w.policy)).await
    }

    /// Charges the caller for these calls; the refusal to send when over quota.
    pub async fn charge(&self, who: &Who<'_>, items: &[Result<Request, Invalid>]) -> Option<Reply> {
        let methods: Vec<&str> = items.iter().filter_map(|i| i.as_ref().ok().map(|r| r.method.as_str())).collect();
        let refusal = who.access.charge(who.caller, &methods).await.err()?;
        let code = match refusal {
            Refusal::OverQuota { .. } => codes::LIMIT_EXCEEDED,
            Refusal::Unavailable => codes::RESOURCE_UNAVAILABLE,
            Refusal::Unauthorized(_) => codes::INVALID_REQUEST,
        };
        let mut reply = Reply::local_error(ErrorObject::new(code, refusal.to_string()));
        reply.refusal = Some(refusal);
        Some(reply)
    }

    /// Answers parsed calls and serializes the answer (an array when `batch`).
    pub async fn answer(&self, items: Vec<Result<Request, Invalid>>, batch: bool) -> Reply {
        self.answer_with(items, batch, &self.policy).await
    }

    /// Like [`Pipeline::answer`], under another method policy (a caller's tier).
    pub async fn answer_with(&self, items: Vec<Result<Request, Invalid>>, batch: bool, policy: &MethodPolicy) -> Reply {
        let (responses, served_by) = self.respond(items, policy).await;
        let body = (!responses.is_empty()).then(|| write_responses(batch, &responses));
        Reply { body, served_by, refusal: None }
    }

    /// Answers parsed calls, in order; notifications are executed but not answered.
    pub async fn answer_responses(
        &self,
        items: Vec<Result<Request, Invalid>>,
        policy: Option<&MethodPolicy>,
    ) -> Vec<Response> {
        self.respond(items, policy.unwrap_or(&self.policy)).await.0
    }

    /// The method policy for callers without a tier of their own.
    pub fn policy(&self) -> &MethodPolicy {
        &self.policy
    }

    async fn respond(&self, items: Vec<Result<Request, Invalid>>, policy: &MethodPolicy) -> (Vec<Response>, ServedBy) {
        let mut slots: Vec<Option<Outcome>> = vec![None; items.len()];
        let mut forward: Vec<usize> = Vec::new();
        let mut served_by: Option<ServedBy> = None;
        for (i, item) in items.iter().enumerate() {
            match item {
                Err((_, e)) => {
                    telemetry::count_call("", "invalid");
                    slots[i] = Some(Outcome::error(e));
                }
                Ok(req) if !policy.permits(&req.method) => {
                    telemetry::count_call(&req.method, "denied");
                    let e = ErrorObject::new(
                        codes::METHOD_NOT_FOUND,
                        format!("the method {} is not allowed here", req.method),
                    );
                    slots[i] = Some(Outcome::error(&e));
                }
                Ok(req) => match route(&req.method) {
                    Route::SocketOnly => {
                        telemetry::count_call(&req.method, "invalid");
                        let e = ErrorObject::new(
                            codes::METHOD_NOT_FOUND,
                            format!("{} is only available on a WebSocket connection", req.method),
                        );
                        slots[i] = Some(Outcome::error(&e));
                    }
                    Route::PassThrough => forward.push(i),
                },
            }
        }
        if forward.len() < items.len() {
            served_by = ServedBy::join(served_by, Source::Local);
        }
        if !forward.is_empty() {
            let calls: Vec<&Request> = forward.iter().filter_map(|&i| items[i].as_ref().ok()).collect();
            let results = if calls.len() == 1 {
                vec![self.upstreams.call(calls[0]).await]
            } else {
                self.upstreams.call_batch(&calls).await
            };
            for ((&i, req), result) in forward.iter().zip(&calls).zip(results) {
                telemetry::count_call(&req.method, outcome_label(&result));
                let (outcome, source) = match result {
                    Ok(Answer { outcome, source }) => (outcome, source),
                    Err(e) => (Outcome::error(&e.to_error_object()), Source::Upstream),
                };
                served_by = ServedBy::join(served_by, source);
                slots[i] = Some(outcome);
            }
        }
        let responses: Vec<Response> = items
            .into_iter()
            .zip(slots)
            .filter_map(|(item, outcome)| {
                let id = match item {
                    Ok(req) => req.id?,
                    Err((id, _)) => id,
                };
                Some(Response { id, outcome: outcome? })
            })
            .collect();
        (responses, served_by.unwrap_or(ServedBy::LOCAL))
    }
}

impl Reply {
    /// A single error answer with a `null` id, for bodies that could not be read at all.
    pub fn local_error(e: ErrorObject) -> Self {
        let response = Response { id: Id::null(), outcome: e.into() };
        Reply { body: Some(write_responses(false, &[response])), served_by: ServedBy::LOCAL, refusal: None }
    }
}

fn outcome_label(result: &Result<Answer, UpstreamError>) -> &'static str {
    match result {
        Ok(Answer { outcome: Outcome::Result(_), .. }) => "ok",
        Ok(Answer { outcome: Outcome::Error(_), .. }) => "rpc_error",
        Err(e) => e.kind(),
    }
}

#[cfg(test)]
mod tests {
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
        async fn call(&self, req: &Request) -> Result<Answer, UpstreamError> {
            self.call_batch(&[req]).await.remove(0)
        }

        async fn call_batch(&self, reqs: &[&Request]) -> Vec<Result<Answer, UpstreamError>> {
            self.batches.lock().unwrap().push(reqs.iter().map(|r| r.method.clone()).collect());
            reqs.iter()
                .map(|r| {
                    if self.fail {
                        return Err(UpstreamError::Unreachable);
                    }
                    Ok(Answer::upstream(Outcome::Result(RawValue::from_string(format!("\"{}\"", r.method)).unwrap())))
                })
                .collect()
        }
    }

    fn pipeline(upstream: Arc<EchoUpstream>) -> Pipeline {
        Pipeline::new(upstream, 100)
    }

    async fn answer(p: &Pipeline, body: &str) -> (serde_json::Value, ServedBy) {
        let reply = p.handle(body.as_bytes()).await;
        let json = reply.body.map_or(serde_json::Value::Null, |b| serde_json::from_slice(&b).unwrap());
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
        let (json, _) = answer(
            &pipeline(upstream),
            r#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]"#,
        )
        .await;
        for item in json.as_array().unwrap() {
            assert_eq!(item["error"]["code"], -32002);
            assert_eq!(item["error"]["message"], "upstream unreachable");
        }
    }
}
