//! A call and its context: what every layer of the request path reads and extends.

use std::sync::Arc;
use std::time::Instant;

use sluice_chain::{method_info, BlockNeed, ChainView, MethodInfo};
use sluice_jsonrpc::{Id, RawValue, Request};
use tokio::sync::watch;

/// One JSON-RPC call on its way through the pipeline: exactly what the caller sent, plus what
/// the edge and the layers above learned about it. Layers read the context and add to it
/// (the cache narrows `needs` when it pins a block); nobody re-parses params to guess.
#[derive(Debug, Clone)]
pub struct Call {
    /// The call. Only a block position the caller sent may be pinned, by the cache.
    pub req: Request,
    /// Its method's row of the method table, looked up once.
    pub info: &'static MethodInfo,
    /// What is known about it.
    pub ctx: CallCtx,
}

/// The context of a [`Call`].
#[derive(Debug, Clone)]
pub struct CallCtx {
    /// The id of the network it is for (its pipeline sets it).
    pub network: Arc<str>,
    /// The caller's tier, with access control on.
    pub tier: Option<Arc<str>>,
    /// 0 is the highest; internal work (mempool, head watcher) runs at 0.
    pub priority: u8,
    /// When the caller stops waiting; `None`: the pool's own deadline.
    pub deadline: Option<Instant>,
    /// The block the call needs a node to have, resolved once from the params.
    pub needs: BlockNeed,
    /// Where it comes from: a client, or sluice itself.
    pub origin: Origin,
    /// A layer above knows the object asked for exists (the mempool saw the transaction
    /// mined): a `null` answer is not believed until every member has said so.
    pub expect_found: bool,
    /// The view of the chain every layer resolves this call's block tags against.
    pub view: CallView,
    /// A check a layer above puts on each member's result (a proof against a trusted header):
    /// a result that fails it is a member's lie, and another member is asked.
    pub check: Option<AnswerCheck>,
    /// Distinct members that must each give a result passing `check` (a header's hash at its
    /// height, agreed by `k` members); 0 or 1: the first result that passes is the answer.
    pub attest: u8,
}

/// A check of a member's result text: `Err` with why it cannot be right.
pub type CheckFn = dyn Fn(&str) -> Result<(), String> + Send + Sync;

/// A [`CheckFn`] a call carries to the pool.
#[derive(Clone)]
pub struct AnswerCheck(pub Arc<CheckFn>);

impl std::fmt::Debug for AnswerCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerCheck")
    }
}

/// Which view of the chain a call's layers resolve `latest` (and the other tags) against.
///
/// A client's call takes one view when the pipeline admits it, so that the cache's pinning,
/// the logs splitter and routing all see the same head, and so that a client that was shown
/// block N is never answered from a view before N (`crate::consistency`).
#[derive(Debug, Clone, Default)]
pub enum CallView {
    /// The head feed's view as it is when a layer looks (sluice's own calls, tests).
    #[default]
    Live,
    /// One view for the whole call, taken when it was admitted.
    Taken(Arc<ChainView>),
    /// sluice's view stayed behind a block a client was shown for longer than the call may
    /// wait: no layer resolves a tag; the call goes as sent, and the pool asks the members at
    /// the best head.
    Behind,
}

impl CallView {
    /// The view to resolve against (`live`: the head feed's), or `None` to resolve nothing.
    pub fn resolve(&self, live: &watch::Receiver<Arc<ChainView>>) -> Option<Arc<ChainView>> {
        match self {
            CallView::Live => Some(live.borrow().clone()),
            CallView::Taken(view) => Some(view.clone()),
            CallView::Behind => None,
        }
    }
}

/// Who makes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A client of the gateway.
    Client = 0,
    /// sluice itself: the head watcher, the mempool's state reads and relay, probes.
    Internal = 1,
}

impl Origin {
    /// Its label in metrics: `client` or `internal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Internal => "internal",
        }
    }
}

/// The network of a single-network sluice.
pub const DEFAULT_NETWORK: &str = "default";

impl Call {
    /// A client's call, its block need read from its params.
    pub fn new(req: Request) -> Self {
        Self::on(req, default_network())
    }

    /// A client's call on `network`. (Naming the network here, not after [`Call::new`], spares
    /// a count up and down on the default network's id, which every thread shares.)
    pub fn on(req: Request, network: Arc<str>) -> Self {
        let info = method_info(&req.method);
        Self::on_row(req, info, network)
    }

    /// [`Call::on`] for a request whose method's row the caller looked up already.
    pub fn on_row(req: Request, info: &'static MethodInfo, network: Arc<str>) -> Self {
        let needs = BlockNeed::of_row(info, req.params_text());
        Self::needing(req, info, network, needs, Origin::Client)
    }

    fn needing(req: Request, info: &'static MethodInfo, network: Arc<str>, needs: BlockNeed, origin: Origin) -> Self {
        Self {
            req,
            info,
            ctx: CallCtx {
                network,
                tier: None,
                priority: 0,
                deadline: None,
                needs,
                origin,
                expect_found: false,
                view: CallView::Live,
                check: None,
                attest: 0,
            },
        }
    }

    /// A call sluice makes itself (`params` as JSON text, `None` for none).
    pub fn internal(method: &str, params: Option<&str>) -> Self {
        let params = params.and_then(|p| RawValue::from_string(p.to_owned()).ok());
        let mut call = Self::new(Request::new(Some(Id::number(1)), method, params));
        call.ctx.origin = Origin::Internal;
        call
    }

    /// An internal call from a request already built.
    pub fn internal_request(req: Request) -> Self {
        let mut call = Self::new(req);
        call.ctx.origin = Origin::Internal;
        call
    }

    /// An internal call whose block need the caller knows already, so that its params are not
    /// read again (the mempool's state reads build two calls per new sender, on one head).
    pub fn internal_needing(req: Request, needs: BlockNeed) -> Self {
        let info = method_info(&req.method);
        Self::needing(req, info, default_network(), needs, Origin::Internal)
    }

    /// The same call with other params and need (a pinned block), same context otherwise.
    pub fn with_params(&self, params: Box<RawValue>, needs: BlockNeed) -> Self {
        let req = Request::new(self.req.id.clone(), self.req.method.clone(), Some(params));
        Self { req, info: self.info, ctx: CallCtx { needs, ..self.ctx.clone() } }
    }

    /// The method name.
    pub fn method(&self) -> &str {
        &self.req.method
    }
}

/// The default network's id, shared rather than allocated per call.
fn default_network() -> Arc<str> {
    static NETWORK: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    NETWORK.get_or_init(|| Arc::from(DEFAULT_NETWORK)).clone()
}

impl From<Request> for Call {
    fn from(req: Request) -> Self {
        Call::new(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_is_read_once_and_narrowed_by_layers() {
        let call = Call::internal("eth_getBalance", Some(r#"["0x0000000000000000000000000000000000000001"]"#));
        assert_eq!(call.ctx.needs, BlockNeed::Head);
        assert_eq!(call.ctx.origin, Origin::Internal);
        let pinned = call.with_params(
            RawValue::from_string(r#"["0x0000000000000000000000000000000000000001","0x5"]"#.into()).unwrap(),
            BlockNeed::Number(5),
        );
        assert_eq!((pinned.ctx.needs, pinned.ctx.origin), (BlockNeed::Number(5), Origin::Internal));
        assert_eq!(pinned.req.method, "eth_getBalance");
    }
}
