//! The request pipeline, one for HTTP and WebSocket, built once. Read top to bottom:
//!
//! 1. parse the body (single, batch, notifications; per-element errors);
//! 2. **admission**: a place among `max_in_flight` bodies being answered (lower tiers shed
//!    first), taken only once the body is in, so slow senders hold no place;
//! 3. **access and quotas**: the body's cost charged to the caller;
//! 4. **method policy** per call (node-key and admin methods never forwarded) and routing
//!    (subscriptions need a socket);
//! 5. each call becomes a [`Call`] with its context (tier, priority, the block it needs) and goes
//!    down the layers built in `sluice serve`: mempool methods → `eth_getLogs` splitting →
//!    cache → coalescing → the upstream pool; a batch's calls go down together;
//! 6. the answers are assembled in order with the caller's ids.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_access::{Caller, Refusal};
use sluice_chain::{method_info, BlockNeed};
use sluice_jsonrpc::{codes, parse_body, write_chunks, ErrorObject, Id, Incoming, Invalid, Outcome, Request, Response};
use sluice_upstream::{Admission, Answer, Call, CallView, HeadView, Source, UpstreamError, Upstreams};

pub use reply::{Payload, Refused, Reply, ServedBy};

use crate::policy::{MethodPolicy, Policies};
use crate::route::{route, Route};
use crate::telemetry;
use crate::AccessControl;

/// Who sent a body, as the edge (HTTP handler, WebSocket session) identified it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Edge<'a> {
    /// The caller, with access control on.
    pub caller: Option<&'a Caller>,
}

/// A place among the bodies being answered; leaving gives it back.
pub struct Admitted(Arc<AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a body asks for, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// Only transaction submissions: each may wait on the mempool's verifiers or the node, and a
    /// flood of them must not hold every place.
    Submissions,
    /// Anything else (reads, or reads mixed with submissions).
    Other,
}

impl BodyKind {
    /// The kind of a parsed body (invalid elements count as "other").
    pub fn of(items: &[Result<Request, Invalid>]) -> Self {
        let all_submissions =
            !items.is_empty() && items.iter().all(|i| i.as_ref().is_ok_and(|r| method_info(&r.method).is_submission()));
        if all_submissions {
            BodyKind::Submissions
        } else {
            BodyKind::Other
        }
    }
}

/// How many bodies a caller of `priority` may find in flight and still be admitted. Pure.
/// A tier of priority p may use (10 − p)/10 of `max_in_flight`; a body of submissions only half
/// of that (rounded up), so that waiting submissions never crowd out reads: they are refused
/// first.
pub fn admission_limit(max_in_flight: usize, priority: u8, kind: BodyKind) -> usize {
    let tier = max_in_flight * (10 - usize::from(priority.min(9))) / 10;
    match kind {
        BodyKind::Submissions => tier.div_ceil(2),
        BodyKind::Other => tier,
    }
}

/// What every network's pipeline shares: the batch limit, admission (one in-flight count for
/// the whole process), the method policy and access control.
pub struct Shared {
    max_batch_len: usize,
    max_in_flight: usize,
    in_flight: Arc<AtomicUsize>,
    policies: arc_swap::ArcSwap<Policies>,
    access: Option<AccessControl>,
}

impl Shared {
    /// Batches of at most `max_batch_len`, at most `max_in_flight` bodies answered at once
    /// across all networks, calls filtered by `policies`, and with `access` callers identified,
    /// charged and held to their tier's method lists and networks.
    pub fn new(
        max_batch_len: usize,
        max_in_flight: usize,
        policies: Policies,
        access: Option<AccessControl>,
    ) -> Arc<Self> {
        let policies = arc_swap::ArcSwap::from_pointee(policies);
        Arc::new(Self { max_batch_len, max_in_flight, in_flight: Arc::default(), policies, access })
    }

    /// Puts new method policies in force (a reload); bodies being answered keep the old ones.
    pub fn set_policies(&self, policies: Policies) {
        self.policies.store(Arc::new(policies));
    }

    /// Access control, when on.
    pub fn access(&self) -> Option<&AccessControl> {
        self.access.as_ref()
    }

    /// Bodies being answered now, on every network.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// One network's pipeline: parses bodies and answers their calls through its layered
/// [`Upstreams`].
pub struct Pipeline {
    network: Arc<str>,
    upstreams: Arc<dyn Upstreams>,
    shared: Arc<Shared>,
    /// The network's head, when it follows one: each call's view, and what answers teach it.
    head: Option<HeadView>,
}

impl Pipeline {
    /// A single network's pipeline over `upstreams` (see [`Shared::new`] for the rest): for tests.
    #[cfg(test)]
    pub(crate) fn new(
        upstreams: Arc<dyn Upstreams>,
        max_batch_len: usize,
        max_in_flight: usize,
        policy: MethodPolicy,
        access: Option<AccessControl>,
    ) -> Self {
        let shared = Shared::new(max_batch_len, max_in_flight, Policies::new(policy, &[]), access);
        Self::for_network(Arc::from(sluice_upstream::DEFAULT_NETWORK), upstreams, shared)
    }

    /// The pipeline of `network` over its `upstreams`, sharing admission and access.
    pub fn for_network(network: Arc<str>, upstreams: Arc<dyn Upstreams>, shared: Arc<Shared>) -> Self {
        Self { network, upstreams, shared, head: None }
    }

    /// The same pipeline, giving each call its view of the chain from `head` when it is
    /// admitted and teaching `head` the blocks its answers name.
    pub fn with_head(self, head: Option<HeadView>) -> Self {
        Self { head, ..self }
    }

    /// The network's id.
    pub fn network(&self) -> &Arc<str> {
        &self.network
    }

    /// Access control, when on.
    pub fn access(&self) -> Option<&AccessControl> {
        self.shared.access.as_ref()
    }

    /// Bodies being answered now, on every network.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    /// Most calls in one batch.
    pub fn max_batch_len(&self) -> usize {
        self.shared.max_batch_len
    }

    /// Answers one body (HTTP body or WebSocket message) from `edge`.
    pub async fn handle(&self, body: &[u8], edge: Edge<'_>) -> Reply {
        let (items, batch) = match parse_body(body, self.shared.max_batch_len) {
            Err(e) => {
                telemetry::count_call(
                    &self.network,
                    "",
                    if e.code == codes::PARSE_ERROR { "parse_error" } else { "invalid" },
                );
                return Reply::local_error(e);
            }
            Ok(Incoming::Single(item)) => {
                // One call (the common case): no vectors for it or its answer.
                let _admitted = match self.admit_and_charge(std::slice::from_ref(&item), edge).await {
                    Ok(admitted) => admitted,
                    Err(refusal) => return refusal,
                };
                let (response, served_by) = self.respond_one(item, edge).await;
                let body = response.map(|r| Payload(write_chunks(false, std::slice::from_ref(&r))));
                return Reply { body, served_by, refused: None };
            }
            Ok(Incoming::Batch(items)) => (items, true),
        };
        let _admitted = match self.admit_and_charge(&items, edge).await {
            Ok(admitted) => admitted,
            Err(refusal) => return refusal,
        };
        let (responses, served_by) = self.respond(items, edge).await;
        let body = (!responses.is_empty()).then(|| Payload(write_chunks(batch, &responses)));
        Reply { body, served_by, refused: None }
    }

    /// Steps 2 and 3 for parsed calls: a place among the bodies in flight, then the caller's
    /// quota. The refusal to send otherwise.
    pub async fn admit_and_charge(
        &self,
        items: &[Result<Request, Invalid>],
        edge: Edge<'_>,
    ) -> Result<Admitted, Reply> {
        let priority = self.priority(edge);
        let admitted = self.admit(priority, BodyKind::of(items)).ok_or_else(|| {
            metrics::counter!("sluice_requests_shed_total", "priority" => priority.to_string()).increment(1);
            let e = ErrorObject::new(codes::LIMIT_EXCEEDED, "server busy: too many requests in flight; retry shortly");
            Reply { refused: Some(Refused::Busy), ..Reply::local_error(e) }
        })?;
        if let (Some(control), Some(caller)) = (&self.shared.access, edge.caller) {
            if let Err(refusal) = control.access.admit_to(caller, &self.network) {
                metrics::counter!("sluice_access_refused_total", "tier" => caller.tier.clone(), "why" => "network")
                    .increment(1);
                let reply = Reply::local_error(ErrorObject::new(codes::INVALID_REQUEST, refusal.to_string()));
                return Err(Reply { refused: Some(Refused::Access(refusal)), ..reply });
            }
            let methods: Vec<&str> = items.iter().filter_map(|i| i.as_ref().ok().map(|r| r.method.as_str())).collect();
            if let Err(refusal) = control.access.charge(caller, &methods).await {
                let code = match refusal {
                    Refusal::OverQuota { .. } => codes::LIMIT_EXCEEDED,
                    Refusal::Unavailable => codes::RESOURCE_UNAVAILABLE,
                    Refusal::Unauthorized(_) | Refusal::Forbidden(_) => codes::INVALID_REQUEST,
                };
                let reply = Reply::local_error(ErrorObject::new(code, refusal.to_string()));
                return Err(Reply { refused: Some(Refused::Access(refusal)), ..reply });
            }
        }
        Ok(admitted)
    }

    fn priority(&self, edge: Edge<'_>) -> u8 {
        match (&self.shared.access, edge.caller) {
            (Some(control), Some(caller)) => control.access.tier(caller).map_or(0, |t| t.priority),
            _ => 0,
        }
    }

    fn admit(&self, priority: u8, kind: BodyKind) -> Option<Admitted> {
        let limit = admission_limit(self.shared.max_in_flight, priority, kind);
        let counter = &self.shared.in_flight;
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Admitted(counter.clone()))
    }

    /// The method policies in force (one atomic load; the body keeps what it started with).
    fn policies(&self) -> Arc<Policies> {
        self.shared.policies.load_full()
    }

    /// Steps 4 to 6 for calls already admitted and charged: answers in order; notifications
    /// are executed but not answered.
    pub async fn respond(&self, items: Vec<Result<Request, Invalid>>, edge: Edge<'_>) -> (Vec<Response>, ServedBy) {
        if items.len() == 1 {
            let Some(item) = items.into_iter().next() else { return (Vec::new(), ServedBy::LOCAL) };
            let (response, served_by) = self.respond_one(item, edge).await;
            return (response.into_iter().collect(), served_by);
        }
        let policies = self.policies();
        let context = self.context(edge, &policies);
        let mut slots: Vec<Option<Outcome>> = vec![None; items.len()];
        let mut ids: Vec<Option<Id>> = Vec::with_capacity(items.len());
        let mut calls: Vec<(usize, Call)> = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            match self.step(item, &context) {
                Step::Local(id, outcome) => {
                    slots[i] = Some(outcome);
                    ids.push(id);
                }
                Step::Call(id, call) => {
                    ids.push(id);
                    calls.push((i, call));
                }
            }
        }
        let mut served_by: Option<ServedBy> = None;
        if calls.len() < slots.len() {
            served_by = ServedBy::join(served_by, Source::Local);
        }
        if !calls.is_empty() {
            if let Some(head) = &self.head {
                // One view for the whole body: a batch is one moment of the chain.
                let resolves_head = calls.iter().any(|(_, c)| c.ctx.needs == BlockNeed::Head);
                let view = admitted_view(head, resolves_head, calls[0].1.ctx.deadline).await;
                for (_, call) in &mut calls {
                    call.ctx.view = view.clone();
                }
            }
            let refs: Vec<&Call> = calls.iter().map(|(_, c)| c).collect();
            let results = if refs.len() == 1 {
                vec![self.upstreams.call(refs[0]).await]
            } else {
                self.upstreams.call_batch(&refs).await
            };
            for ((i, call), result) in calls.iter().zip(results) {
                let (outcome, source) = self.settle(call, result);
                served_by = ServedBy::join(served_by, source);
                slots[*i] = Some(outcome);
            }
        }
        let responses: Vec<Response> = ids
            .into_iter()
            .zip(slots)
            .filter_map(|(id, outcome)| Some(Response { id: id?, outcome: outcome? }))
            .collect();
        (responses, served_by.unwrap_or(ServedBy::LOCAL))
    }

    /// What every call of a body from `edge` shares.
    fn context<'a>(&self, edge: Edge<'a>, policies: &'a Policies) -> CallContext<'a> {
        CallContext {
            policy: policies.for_tier(edge.caller.filter(|_| self.shared.access.is_some()).map(|c| c.tier.as_str())),
            tier: edge.caller.map(|c| Arc::from(c.tier.as_str())),
            priority: self.priority(edge),
            edge,
        }
    }

    /// Steps 4 to 6 for a body of one call: its answer (none for a notification).
    async fn respond_one(&self, item: Result<Request, Invalid>, edge: Edge<'_>) -> (Option<Response>, ServedBy) {
        let step = {
            // Read through a guard, not a clone: the policies' shared count is not touched,
            // and the guard is gone before the call goes down.
            let policies = self.shared.policies.load();
            self.step(item, &self.context(edge, &policies))
        };
        let (id, outcome, source) = match step {
            Step::Local(id, outcome) => (id, outcome, Source::Local),
            Step::Call(id, mut call) => {
                if let Some(head) = &self.head {
                    let resolves_head = call.ctx.needs == BlockNeed::Head;
                    call.ctx.view = admitted_view(head, resolves_head, call.ctx.deadline).await;
                }
                let result = self.upstreams.call(&call).await;
                let (outcome, source) = self.settle(&call, result);
                (id, outcome, source)
            }
        };
        (id.map(|id| Response { id, outcome }), ServedBy::Only(source))
    }

    /// Step 4 for one parsed item: answered here (invalid, refused by the method policy or the
    /// caller's scope, socket-only), or a [`Call`] with its context to send down the layers.
    fn step(&self, item: Result<Request, Invalid>, context: &CallContext<'_>) -> Step {
        let req = match item {
            Err((id, e)) => {
                telemetry::count_call(&self.network, "", "invalid");
                return Step::Local(Some(id), Outcome::error(&e));
            }
            Ok(req) => req,
        };
        // Why a parsed call is refused here: the method policy, then the key's or token's scope.
        let refusal = if !context.policy.permits(&req.method) {
            Some(ErrorObject::new(codes::METHOD_NOT_FOUND, format!("the method {} is not allowed here", req.method)))
        } else {
            context.edge.caller.and_then(|c| {
                crate::scope::admit(&c.scope, &req)
                    .err()
                    .map(|why| ErrorObject::new(codes::INVALID_REQUEST, format!("forbidden: {why}")))
            })
        };
        if let Some(e) = refusal {
            telemetry::count_call(&self.network, &req.method, "denied");
            return Step::Local(req.id, Outcome::error(&e));
        }
        let info = method_info(&req.method);
        match route(info) {
            Route::SocketOnly => {
                telemetry::count_call(&self.network, &req.method, "invalid");
                let e = ErrorObject::new(
                    codes::METHOD_NOT_FOUND,
                    format!("{} is only available on a WebSocket connection", req.method),
                );
                Step::Local(req.id, Outcome::error(&e))
            }
            Route::PassThrough => {
                let id = req.id.clone();
                let mut call = Call::on_row(req, info, self.network.clone());
                call.ctx.tier = context.tier.clone();
                call.ctx.priority = context.priority;
                Step::Call(id, call)
            }
        }
    }

    /// Step 6 for one call: its outcome and what produced it, counted.
    fn settle(&self, call: &Call, result: Result<Answer, UpstreamError>) -> (Outcome, Source) {
        if let (Some(head), Ok(answer)) = (&self.head, &result) {
            head.learn(call.method(), answer);
        }
        let source = result.as_ref().ok().map(|answer| answer.source.as_str());
        telemetry::count_settled(&self.network, call.method(), outcome_label(&result), source);
        match result {
            Ok(Answer { outcome, source }) => (outcome, source),
            Err(e) => (Outcome::error(&e.to_error_object()), Source::Upstream),
        }
    }
}

/// What every call of one body shares: the method policy in force for the caller's tier, the
/// tier and priority the calls carry, and the caller.
struct CallContext<'a> {
    /// The method policy in force for the caller's tier when the body arrived (a reload does
    /// not change it under the body).
    policy: &'a MethodPolicy,
    tier: Option<Arc<str>>,
    priority: u8,
    edge: Edge<'a>,
}

/// What step 4 makes of one item.
enum Step {
    /// Answered by sluice itself: the caller's id (`None` for a notification) and the answer.
    Local(Option<Id>, Outcome),
    /// Sent down the layers: the caller's id and the call.
    Call(Option<Id>, Call),
}

/// The view a call (or a body's calls) is admitted with: the head's view at once, or, when
/// the call resolves `latest` while an answer already showed a newer block, that view once it
/// has the block (bounded by the catch-up time and the call's own deadline).
async fn admitted_view(head: &HeadView, resolves_head: bool, deadline: Option<std::time::Instant>) -> CallView {
    match head.admit(resolves_head) {
        Admission::Now(view) => view,
        Admission::Wait(number, until) => head.catch_up(number, deadline.map_or(until, |d| d.min(until))).await,
    }
}

fn outcome_label(result: &Result<Answer, UpstreamError>) -> &'static str {
    match result {
        Ok(Answer { outcome: Outcome::Result(_), .. }) => "ok",
        Ok(Answer { outcome: Outcome::Error(_), .. }) => "rpc_error",
        Err(e) => e.kind(),
    }
}

mod reply;
mod steps;
pub use steps::{Layer, Stacked, Steps};
#[cfg(test)]
mod tests;
