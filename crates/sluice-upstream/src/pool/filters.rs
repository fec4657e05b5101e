//! Node-side filters (`eth_newFilter`, `eth_newBlockFilter`, `eth_newPendingTransactionFilter`)
//! live on the node that made them. The id a client gets names that member: `0x`, the member's
//! index in two hex digits, then the node's own id's digits. Every later call on the filter
//! (`eth_getFilterChanges`, `eth_getFilterLogs`, `eth_uninstallFilter`) goes to that member
//! with the node's id, whichever member the pool would prefer at the time. Nothing is kept in
//! sluice: the id is enough, for any replica with the same members and across restarts.
//!
//! Made without hedging (a hedge would leave a second filter on another node) and failed over
//! only when the member gave no answer. An id sluice did not make is passed on as any call is.

use std::time::Instant;

use sluice_jsonrpc::{ErrorObject, Outcome, RawValue, Request};

use super::{Node, UpstreamPool};
use crate::{Answer, Call, UpstreamError};

/// geth's code for "filter not found".
const FILTER_NOT_FOUND: i64 = -32000;

/// Members an id can name (two hex digits).
const MAX_MEMBERS: usize = 256;

/// The id handed out for filter `id` made by member `member`, or `None` when `id` is not a
/// `0x` hex string (passed on as the node gave it).
pub(super) fn tag(member: usize, id: &RawValue) -> Option<Box<RawValue>> {
    let id: &str = serde_json::from_str(id.get()).ok()?;
    let digits = id.strip_prefix("0x")?;
    if member >= MAX_MEMBERS || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    RawValue::from_string(format!("\"0x{member:02x}{digits}\"")).ok()
}

/// The member and the node's own id named by an id [`tag`] made.
pub(super) fn untag(id: &str) -> Option<(usize, String)> {
    let digits = id.strip_prefix("0x")?;
    if digits.len() < 3 || !digits.is_ascii() {
        return None;
    }
    let member = usize::from_str_radix(&digits[..2], 16).ok()?;
    Some((member, format!("0x{}", &digits[2..])))
}

/// `req` with the node's own id in place of the one the client sent, and the member to ask.
fn for_member(req: &Request) -> Option<(usize, Request)> {
    let mut params: Vec<Box<RawValue>> = serde_json::from_str(req.params_text()).ok()?;
    let first = params.first_mut()?;
    let (member, id) = untag(serde_json::from_str::<&str>(first.get()).ok()?)?;
    *first = RawValue::from_string(serde_json::to_string(&id).ok()?).ok()?;
    let params = RawValue::from_string(serde_json::to_string(&params).ok()?).ok()?;
    Some((member, Request::new(req.id.clone(), req.method.clone(), Some(params))))
}

impl<N: Node> UpstreamPool<N> {
    /// Makes a filter on the first member that answers (in the pool's order), and hands out
    /// an id naming that member.
    pub(super) async fn create_filter(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let mut attempts = self.attempts_for(call).await;
        let deadline = self.deadline(call);
        let mut last = UpstreamError::NoneAvailable;
        while let Some(i) = attempts.next() {
            if !self.members[i].state().breaker.allow(Instant::now()) {
                continue;
            }
            let outcome = self.exchange_by(i, &[&call.req], Some(deadline), call.ctx.origin).await.remove(0);
            match outcome {
                Ok(Outcome::Result(id)) => {
                    let id = tag(i, &id).map_or(id, std::sync::Arc::from);
                    return Ok(Answer::upstream(Outcome::Result(id)));
                }
                // The node's refusal (bad filter params, filters not supported) is its answer.
                Ok(refused) => return Ok(Answer::upstream(refused)),
                Err(e) => last = e,
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        Err(self.unavailable(last))
    }

    /// A call on a filter: to the member that made it, with the node's own id.
    pub(super) async fn use_filter(&self, call: &Call) -> Result<Answer, UpstreamError> {
        let Some((member, req)) = for_member(&call.req) else { return self.call_one(call).await };
        if member >= self.members.len() {
            // Named a member this pool does not have (the members changed): as geth says it.
            let gone = ErrorObject::new(FILTER_NOT_FOUND, "filter not found");
            return Ok(Answer::upstream(Outcome::error(&gone)));
        }
        let deadline = self.deadline(call);
        match self.exchange_by(member, &[&req], Some(deadline), call.ctx.origin).await.remove(0) {
            Ok(outcome) => Ok(Answer::upstream(outcome)),
            Err(e) => Err(self.unavailable(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn an_id_names_its_member_and_gives_the_nodes_id_back() {
        for (member, id) in [(0, "0x1"), (1, "0x0"), (7, "0xabcdef0123456789abcdef0123456789"), (255, "0xff")] {
            let tagged = tag(member, &raw(&format!("\"{id}\""))).unwrap();
            let text: String = serde_json::from_str(tagged.get()).unwrap();
            assert_eq!(untag(&text), Some((member, id.to_owned())), "{text}");
        }
        assert!(tag(256, &raw("\"0x1\"")).is_none(), "two hex digits");
        assert!(tag(0, &raw("\"filter-1\"")).is_none() && tag(0, &raw("12")).is_none(), "not hex: passed on");
        assert_eq!(untag("0x1"), None, "too short to be one of ours");
    }

    #[test]
    fn the_request_carries_the_nodes_id_and_the_rest_as_sent() {
        let req = Request::new(None, "eth_getFilterChanges", Some(raw(r#"["0x02abc"]"#)));
        let (member, req) = for_member(&req).unwrap();
        assert_eq!((member, req.params_text()), (2, r#"["0xabc"]"#));
        let bad = Request::new(None, "eth_getFilterChanges", Some(raw("[1]")));
        assert!(for_member(&bad).is_none());
    }
}
