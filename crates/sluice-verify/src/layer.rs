//! The verifying step: state reads answered from checked proofs, everything else passed down.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use alloy_primitives::{Bytes, B256};
use alloy_rpc_types_eth::EIP1186AccountProofResponse;
use async_trait::async_trait;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sluice_chain::{BlockNeed, BlockTag, ChainView, Resolved};
use sluice_jsonrpc::{codes, ErrorObject, Outcome, Request};
use sluice_upstream::{Answer, AnswerCheck, Call, Source, UpstreamError, Upstreams};
use tokio::sync::{watch, OnceCell};

use crate::proof::{check_account, check_code};
use crate::read::{Asked, Read, StateRead};
use crate::trust::{Checkpoint, SharedTrust, TrustStore, Trusted};
use crate::{Unverified, VerifyConfig};

/// Header checks remembered while they run: a burst of reads at the head waits for one.
pub(crate) const HEADERS: usize = 64;

/// The longest a verified read waits for the head tracker's first head after start.
const FIRST_HEAD: std::time::Duration = std::time::Duration::from_secs(5);

/// State reads answered from proofs checked against trusted headers; the rest passed to `inner`.
pub struct VerifyLayer {
    pub(crate) inner: Arc<dyn Upstreams>,
    view: watch::Receiver<Arc<ChainView>>,
    pub(crate) network: Arc<str>,
    attempts: u32,
    /// Members that must each name a header's hash at its height.
    pub(crate) agree: u8,
    /// The block every trusted header must descend from, when one is pinned.
    pub(crate) checkpoint: Option<Checkpoint>,
    /// The most headers one read fetches to link a block to a trusted one.
    pub(crate) link_limit: u64,
    /// The headers sluice trusts (shared with `/status`).
    trust: SharedTrust,
    /// Header checks under way or done lately, by hash: the first read that needs a header
    /// checks it, and reads of the same block meanwhile wait for that check.
    pub(crate) checking: Mutex<VecDeque<(B256, Arc<OnceCell<Trusted>>)>>,
}

impl VerifyLayer {
    /// Verifies reads of `network` over `inner`, at the blocks `view` (the head tracker's)
    /// names, against the headers in `trust`.
    pub fn new(
        network: &str,
        inner: Arc<dyn Upstreams>,
        view: watch::Receiver<Arc<ChainView>>,
        config: &VerifyConfig,
        trust: SharedTrust,
    ) -> Self {
        for reason in ["header", "proof", "no_trusted_header", "no_proof"] {
            metrics::counter!("sluice_verify_refused_total", "network" => network.to_owned(), "reason" => reason)
                .increment(0);
        }
        Self {
            inner,
            view,
            network: network.into(),
            attempts: config.attempts.max(1),
            agree: config.agree.max(1),
            checkpoint: config.checkpoint,
            link_limit: config.link_limit.max(1),
            trust,
            checking: Mutex::new(VecDeque::with_capacity(HEADERS)),
        }
    }

    /// The trusted headers.
    pub(crate) fn trust(&self) -> MutexGuard<'_, TrustStore> {
        self.trust.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether trust takes more than the head tracker's hash, recomputed: agreement of
    /// several members, or descent from a checkpoint (chain reads then check the header
    /// apart from the block they fetch).
    pub(crate) fn strict(&self) -> bool {
        self.agree > 1 || self.checkpoint.is_some()
    }

    /// The read `call` makes, when it is one this layer answers.
    fn read_of(call: &Call) -> Option<Result<Read, String>> {
        call.info.verify?;
        let params: Vec<Value> = match call.req.params.as_deref().map(|p| serde_json::from_str(p.get())) {
            None => Vec::new(),
            Some(Ok(Value::Array(params))) => params,
            Some(_) => return Some(Err("params must be an array".into())),
        };
        Read::of(call.info, &params).transpose()
    }

    async fn answer(&self, call: &Call, read: Result<Read, String>) -> Outcome {
        let read = match read {
            Ok(read) => read,
            Err(detail) => return Outcome::error(&ErrorObject::new(codes::INVALID_PARAMS, detail)),
        };
        let mut last = Unverified::NoProof("not asked".into());
        for _ in 0..self.attempts {
            match self.attempt(call, &read).await {
                Ok(value) => {
                    metrics::counter!("sluice_verified_total", "network" => self.network.to_string(), "method" => call.info.name)
                        .increment(1);
                    return Outcome::result(raw(&value));
                }
                Err(e) => {
                    let fatal = matches!(e, Unverified::NoTrustedHeader(_));
                    if matches!(e, Unverified::Header(_) | Unverified::Proof(_)) {
                        // A member answered something the chain's commitments contradict.
                        tracing::warn!(method = %call.req.method, error = %e, "an answer failed verification");
                    } else {
                        tracing::debug!(method = %call.req.method, error = %e, "no verified answer yet");
                    }
                    last = e;
                    if fatal {
                        break;
                    }
                }
            }
        }
        metrics::counter!("sluice_verify_refused_total", "network" => self.network.to_string(), "reason" => last.reason())
            .increment(1);
        let error = ErrorObject::new(codes::RESOURCE_UNAVAILABLE, format!("no verified answer: {last}"))
            .with_data(json!({ "reason": "unverified", "why": last.reason() }));
        Outcome::error(&error)
    }

    /// One try at a verified answer.
    async fn attempt(&self, call: &Call, read: &Read) -> Result<Value, Unverified> {
        match read {
            Read::State(read) => self.state(call, read).await,
            Read::Block { at, full } => self.block(call, at, *full).await,
            Read::BlockReceipts(at) => self.block_receipts(call, at).await,
            Read::Receipt(hash) => self.receipt(call, *hash).await,
            Read::Transaction(hash) => self.transaction(call, *hash).await,
            Read::Logs(filter) => self.logs(call, filter).await,
        }
    }

    /// A state read: the trusted header's state root, the proof (and code) at it, checked.
    async fn state(&self, call: &Call, read: &StateRead) -> Result<Value, Unverified> {
        let (number, hash) = self.trusted_block(call, &read.block).await?;
        let state_root = self.trusted(call, number, hash).await?.state_root;
        let at = json!({ "blockHash": hash });
        let slots: Vec<String> = read.slots().iter().map(|s| format!("{s:#x}")).collect();
        let mut proof_call = self.internal(call, "eth_getProof", json!([read.address, slots, at]), number, hash);
        // The pool checks each member's proof as it comes: a member whose proof fails is
        // counted and scored down, and the next member asked.
        let (address, slots) = (read.address, read.slots());
        proof_call.ctx.check = Some(AnswerCheck(Arc::new(move |text: &str| {
            let proof: EIP1186AccountProofResponse =
                serde_json::from_str(text).map_err(|e| format!("unreadable proof: {e}"))?;
            check_account(&proof, state_root, address, &slots).map_err(|e| e.to_string())
        })));
        let (proof_answer, code_answer) = if read.asked == Asked::Code {
            let code_call = self.internal(call, "eth_getCode", json!([read.address, at]), number, hash);
            let (proof, code) = tokio::join!(self.inner.call(&proof_call), self.inner.call(&code_call));
            (proof, Some(code))
        } else {
            (self.inner.call(&proof_call).await, None)
        };
        let proof_json = result_of(Some(proof_answer))?;
        let proof: EIP1186AccountProofResponse = serde_json::from_value(proof_json.clone())
            .map_err(|e| Unverified::NoProof(format!("unreadable proof: {e}")))?;
        check_account(&proof, state_root, read.address, &read.slots())?;
        let code = match read.asked {
            Asked::Code => {
                let code: Bytes = serde_json::from_value(result_of(code_answer)?)
                    .map_err(|e| Unverified::NoProof(format!("unreadable code: {e}")))?;
                check_code(&code, proof.code_hash)?;
                Some(code)
            }
            _ => None,
        };
        Ok(read.answer(&proof, code.as_ref(), &proof_json))
    }

    /// The block `tag` names, as a height and the hash the head tracker holds for it.
    /// In the first moments after start, before the head tracker's first head, it waits for
    /// that head (at most [`FIRST_HEAD`]) rather than refuse.
    pub(crate) async fn trusted_block(&self, call: &Call, tag: &BlockTag) -> Result<(u64, B256), Unverified> {
        let mut view = call.ctx.view.resolve(&self.view).unwrap_or_else(|| self.view.borrow().clone());
        if view.latest().is_none() {
            let mut live = self.view.clone();
            let first = tokio::time::timeout(FIRST_HEAD, live.wait_for(|v| v.latest().is_some())).await;
            if let Ok(Ok(first)) = first {
                view = first.clone();
            }
        }
        if view.latest().is_none() {
            return Err(Unverified::NoTrustedHeader("no head yet".into()));
        }
        let oldest = view.oldest().map_or(0, |(n, _)| n);
        let (number, hash) = match tag {
            BlockTag::Pending => return Err(Unverified::NoTrustedHeader("the pending state has no commitment".into())),
            BlockTag::Hash(named) => {
                let hash: B256 =
                    named.parse().map_err(|_| Unverified::NoTrustedHeader(format!("unreadable hash {named}")))?;
                let latest = view.latest().map_or(0, |(n, _)| n);
                let held =
                    (oldest..=latest).rev().find(|n| view.hash_of(*n).and_then(|h| h.parse().ok()) == Some(hash));
                match held {
                    Some(number) => return Ok((number, hash)),
                    None => return Ok((self.outside_window(call, hash, &view).await?, hash)),
                }
            }
            tag => match (tag, view.resolve(tag)) {
                (_, Resolved::Block { number, hash: Some(hash), .. }) => (number, hash),
                // Older than the window: linked down from the window's oldest block.
                (_, Resolved::Block { number, hash: None, .. }) | (&BlockTag::Number(number), _) if number < oldest => {
                    return Ok((number, self.below_window(call, number, &view).await?));
                }
                (BlockTag::Earliest, _) => return Ok((0, self.below_window(call, 0, &view).await?)),
                _ => {
                    let held = match (view.oldest(), view.latest()) {
                        (Some((oldest, _)), Some((latest, _))) => format!("blocks {oldest} to {latest}"),
                        _ => "no block yet".into(),
                    };
                    return Err(Unverified::NoTrustedHeader(format!("{tag:?} is not in sluice's window ({held})")));
                }
            },
        };
        let hash = hash.parse().map_err(|_| Unverified::NoTrustedHeader(format!("unreadable hash {hash}")))?;
        Ok((number, hash))
    }

    /// A call of sluice's own on behalf of `call`, at block `hash`.
    pub(crate) fn internal(&self, call: &Call, method: &str, params: Value, number: u64, hash: B256) -> Call {
        let needs = BlockNeed::Hash { hash: format!("{hash:#x}"), number: Some(number) };
        self.internal_needing(call, method, params, needs)
    }

    /// A call of sluice's own on behalf of `call`, needing a node to have `needs`.
    pub(crate) fn internal_needing(&self, call: &Call, method: &str, params: Value, needs: BlockNeed) -> Call {
        let params = RawValue::from_string(params.to_string()).ok();
        let req = Request::new(Some(sluice_jsonrpc::Id::number(1)), method, params);
        let mut made = Call::internal_needing(req, needs);
        made.ctx.network = call.ctx.network.clone();
        made.ctx.tier = call.ctx.tier.clone();
        made.ctx.deadline = call.ctx.deadline;
        made.ctx.origin = call.ctx.origin;
        made
    }
}

/// The result of an answer. A node's error ends the attempt as a failure to prove: the read
/// is asked again, then refused (a member that cannot prove, a pruned one say, is no answer).
pub(crate) fn result_of(answer: Option<Result<Answer, UpstreamError>>) -> Result<Value, Unverified> {
    match answer {
        Some(Ok(Answer { outcome: Outcome::Result(raw), .. })) => {
            serde_json::from_str(raw.get()).map_err(|e| Unverified::NoProof(format!("unreadable answer: {e}")))
        }
        Some(Ok(Answer { outcome: Outcome::Error(raw), .. })) => {
            Err(Unverified::NoProof(format!("the node answered {}", raw.get())))
        }
        Some(Err(e)) => Err(Unverified::NoProof(e.to_string())),
        None => Err(Unverified::NoProof("no answer".into())),
    }
}

fn raw(value: &Value) -> Box<RawValue> {
    RawValue::from_string(value.to_string())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap_or_default())
}

#[async_trait]
impl Upstreams for VerifyLayer {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        match Self::read_of(call) {
            Some(read) => Ok(Answer { outcome: self.answer(call, read).await, source: Source::Upstream }),
            None => self.inner.call(call).await,
        }
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let reads: Vec<Option<Result<Read, String>>> = calls.iter().map(|c| Self::read_of(c)).collect();
        if reads.iter().all(Option::is_none) {
            return self.inner.call_batch(calls).await;
        }
        // The others go down as one batch; each verified read makes its own calls.
        let others: Vec<&Call> = calls.iter().zip(&reads).filter(|(_, r)| r.is_none()).map(|(c, _)| *c).collect();
        let verified = calls.iter().zip(reads).filter_map(|(call, read)| read.map(|read| self.answer(call, read)));
        let (mut passed, mut verified) = {
            let passed = async {
                if others.is_empty() {
                    Vec::new()
                } else {
                    self.inner.call_batch(&others).await
                }
            };
            let (passed, verified) = tokio::join!(passed, futures_util::future::join_all(verified));
            (passed.into_iter(), verified.into_iter())
        };
        calls
            .iter()
            .map(|call| match call.info.verify {
                Some(_) => match verified.next() {
                    Some(outcome) => Ok(Answer { outcome, source: Source::Upstream }),
                    None => Err(UpstreamError::InvalidResponse("a verified answer went missing")),
                },
                None => passed.next().unwrap_or(Err(UpstreamError::InvalidResponse("an answer went missing"))),
            })
            .collect()
    }
}
