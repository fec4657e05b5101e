//! The mempool's JSON-RPC methods, as a layer over the upstreams: pool methods are answered
//! here from the published snapshot (or the intake), everything else goes to the inner layer.
//!
//! | method | answered |
//! |---|---|
//! | `eth_sendRawTransaction` | intake: after validation and journaling |
//! | `eth_sendRawTransactionSync` | intake as above, then the receipt once the pool saw it mined (or error 4 at the timeout) |
//! | `eth_sendRawTransactionConditional` | inner (broadcast with its conditions, which the pool cannot hold yet) |
//! | `eth_getTransactionByHash` | the pool when it holds the hash (block fields null), else inner |
//! | `eth_getTransactionCount(addr, "pending")` | the pool when it holds the sender's transactions, else inner |
//! | `txpool_status`, `txpool_content`, `txpool_contentFrom`, `txpool_inspect` | the pool (geth's formats) |
//! | `sluice_getTransactionStatus` | the pool: pending, queued, or why it left |
//! | `eth_fillTransaction` without a `nonce` | inner, with the pool's pending nonce when it holds the sender's transactions |

use std::sync::Arc;

use alloy_primitives::{Address, Bytes, B256};
use async_trait::async_trait;
use serde_json::value::RawValue;
use serde_json::Value;
use sluice_chain::methods::{Class, MethodInfo, Submit};
use sluice_jsonrpc::{codes, ErrorObject, Outcome, Request};
use sluice_upstream::{Answer, Call, CallCtx, CallFuture, Source, UpstreamError, Upstreams};

use crate::seams::{PoolView, SubmitError, TxIntake, TxSource, TxpoolMethod};
use crate::service::Mempool;
use crate::status::TxStatus;
use crate::view::quantity;

/// The JSON-RPC error code geth answers pool refusals with.
pub const POOL_ERROR: i64 = -32000;

/// Pool methods answered locally; the rest passed to `inner`.
pub struct MempoolLayer {
    inner: Arc<dyn Upstreams>,
    mempool: Arc<Mempool>,
}

impl MempoolLayer {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Upstreams>, mempool: Arc<Mempool>) -> Self {
        Self { inner, mempool }
    }

    /// Answers `call` locally when it is a pool call the pool can answer.
    async fn local(&self, call: &Call) -> Option<Outcome> {
        let req = &call.req;
        let method = req.method.as_str();
        if !answers(call.info) {
            return None;
        }
        let params: Vec<Value> = match req.params.as_deref().map(|p| serde_json::from_str(p.get())) {
            None => Vec::new(),
            Some(Ok(Value::Array(params))) => params,
            Some(_) => return Some(invalid_params("params must be an array")),
        };
        if let Some(submit) = call.info.submit {
            return self.submission(call, submit, &params).await;
        }
        let result = match method {
            "eth_getTransactionByHash" => {
                let hash: B256 = parse(params.first())?;
                return self.mempool.get(&hash)?.to_rpc_raw().map(Outcome::result);
            }
            "eth_getTransactionCount" => {
                if params.get(1).and_then(Value::as_str) != Some("pending") {
                    return None;
                }
                let sender: Address = parse(params.first())?;
                Value::String(quantity(self.mempool.pending_nonce(&sender)?))
            }
            "txpool_status" => self.mempool.txpool(TxpoolMethod::Status),
            "txpool_content" => self.mempool.txpool(TxpoolMethod::Content { summaries: false }),
            "txpool_inspect" => self.mempool.txpool(TxpoolMethod::Content { summaries: true }),
            "txpool_contentFrom" => match params.first().map(|v| serde_json::from_value::<Address>(v.clone())) {
                Some(Ok(sender)) => self.mempool.txpool(TxpoolMethod::ContentFrom(&sender)),
                _ => return Some(invalid_params("expected an address")),
            },
            "sluice_getTransactionStatus" => match params.first().map(|v| serde_json::from_value::<B256>(v.clone())) {
                Some(Ok(hash)) => self.mempool.status_of(&hash),
                _ => return Some(invalid_params("expected a transaction hash")),
            },
            _ => {
                return Some(Outcome::error(&ErrorObject::new(
                    codes::METHOD_NOT_FOUND,
                    format!("{method} is not supported"),
                )))
            }
        };
        Some(result_value(result))
    }
}

impl MempoolLayer {
    /// A signed transaction submitted: validated, pooled and journaled like any other, then
    /// answered as its method answers. `None`: the inner layer sends it as it is.
    async fn submission(&self, call: &Call, submit: Submit, params: &[Value]) -> Option<Outcome> {
        let timeout = match submit {
            Submit::Hash => None,
            Submit::Receipt => match sync_timeout(params.get(1)) {
                Ok(timeout) => Some(timeout),
                Err(detail) => return Some(invalid_params(detail)),
            },
            // Its conditions must reach the nodes with it; the pool relays plain submissions.
            Submit::Conditional => return None,
        };
        let raw = match params.first().and_then(Value::as_str).map(parse_hex) {
            Some(Ok(raw)) => raw,
            _ => return Some(invalid_params("expected a hex-encoded transaction")),
        };
        let hash = match self.mempool.submit(raw, TxSource::Rpc).await {
            Ok(hash) => hash,
            Err(e) => return Some(Outcome::error(&submit_error(&e))),
        };
        let Some(timeout) = timeout else { return Some(result(&Value::String(format!("{hash}")))) };
        Some(self.receipt(call, hash, timeout).await)
    }

    /// `eth_sendRawTransactionSync` after admission: the receipt once the pool saw `hash` mined
    /// (asked of the inner layer, which then does not believe a `null` from one lagging node);
    /// EIP-7966's error 4 with the hash when it was not mined within `timeout`; the pool's
    /// reason when it left otherwise.
    async fn receipt(&self, call: &Call, hash: B256, timeout: std::time::Duration) -> Outcome {
        let deadline = tokio::time::Instant::now() + timeout;
        match self.mempool.departure(&hash, deadline).await {
            Some(TxStatus::Mined { .. }) => {}
            Some(status) => {
                let why = status.to_json(&hash);
                return Outcome::error(
                    &ErrorObject::new(
                        POOL_ERROR,
                        format!("transaction {hash} left the pool unmined: {}", status.label()),
                    )
                    .with_data(why),
                );
            }
            None => {
                return Outcome::error(
                    &ErrorObject::new(
                        SYNC_TIMEOUT,
                        format!(
                            "the transaction was added to the transaction pool but wasn't processed in {timeout:?}"
                        ),
                    )
                    .with_data(Value::String(format!("{hash}"))),
                )
            }
        }
        let params = RawValue::from_string(format!("[\"{hash}\"]")).ok();
        let mut receipt =
            Call::on(Request::new(call.req.id.clone(), "eth_getTransactionReceipt", params), call.ctx.network.clone());
        receipt.ctx = CallCtx { needs: receipt.ctx.needs, expect_found: true, ..call.ctx.clone() };
        match self.inner.call(&receipt).await {
            Ok(answer) => answer.outcome,
            Err(e) => Outcome::error(&ErrorObject::new(codes::RESOURCE_UNAVAILABLE, e.to_string())),
        }
    }

    /// `call` as it goes to the inner layer: see [`MempoolLayer::with_expectation`] and
    /// [`MempoolLayer::with_pool_nonce`].
    fn forwarded<'a>(&self, call: &'a Call) -> std::borrow::Cow<'a, Call> {
        match call.method() {
            "eth_fillTransaction" => self.with_pool_nonce(call),
            _ => self.with_expectation(call),
        }
    }

    /// `eth_fillTransaction` without a nonce, for a sender whose transactions the pool holds:
    /// the node would fill in its own pending nonce, which does not count what sluice accepted
    /// and has not relayed yet (viem fills every transaction this way); the pool's pending
    /// nonce is the one `eth_getTransactionCount(…, "pending")` answers here.
    fn with_pool_nonce<'a>(&self, call: &'a Call) -> std::borrow::Cow<'a, Call> {
        let Ok(Value::Array(mut params)) = serde_json::from_str::<Value>(call.req.params_text()) else {
            return std::borrow::Cow::Borrowed(call);
        };
        let Some(Value::Object(tx)) = params.first_mut() else { return std::borrow::Cow::Borrowed(call) };
        let sender = tx.get("from").and_then(|from| serde_json::from_value::<Address>(from.clone()).ok());
        let nonce = match sender {
            Some(sender) if !tx.contains_key("nonce") => self.mempool.pending_nonce(&sender),
            _ => None,
        };
        let Some(nonce) = nonce else { return std::borrow::Cow::Borrowed(call) };
        tx.insert("nonce".into(), Value::String(quantity(nonce)));
        match RawValue::from_string(Value::Array(params).to_string()) {
            Ok(params) => std::borrow::Cow::Owned(call.with_params(params, call.ctx.needs.clone())),
            Err(_) => std::borrow::Cow::Borrowed(call),
        }
    }

    /// `call`, marked as asking for an object that exists when the pool saw the transaction
    /// mined: the pool below then does not believe a `null` from one node (integrity).
    fn with_expectation<'a>(&self, call: &'a Call) -> std::borrow::Cow<'a, Call> {
        let by_hash = matches!(call.method(), "eth_getTransactionReceipt" | "eth_getTransactionByHash");
        let mined = by_hash
            && serde_json::from_str::<(B256,)>(call.req.params_text())
                .is_ok_and(|(hash,)| self.mempool.saw_mined(&hash));
        if !mined {
            return std::borrow::Cow::Borrowed(call);
        }
        let mut call = call.clone();
        call.ctx.expect_found = true;
        std::borrow::Cow::Owned(call)
    }
}

/// Whether the pool answers `method` itself (or may: `eth_getTransactionCount` only for `pending`).
fn answers(method: &MethodInfo) -> bool {
    matches!(method.class, Class::Local | Class::Submission)
        || matches!(method.name, "eth_getTransactionByHash" | "eth_getTransactionCount")
}

/// EIP-7966's error code for a transaction not mined within the timeout.
pub const SYNC_TIMEOUT: i64 = 4;

/// How long `eth_sendRawTransactionSync` waits when the caller names no timeout (geth's default).
const SYNC_DEFAULT: std::time::Duration = std::time::Duration::from_secs(20);

/// The longest wait a caller may ask for: a waiting call holds a place in the gateway.
const SYNC_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// The timeout `params[1]` names, in milliseconds (a number or a hex quantity, as viem sends
/// it); 0 or absent: the default; capped at [`SYNC_MAX`].
fn sync_timeout(value: Option<&Value>) -> Result<std::time::Duration, &'static str> {
    let ms = match value {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n.as_u64().ok_or("the timeout must be a whole number of milliseconds")?,
        Some(Value::String(s)) => sluice_chain::parse_quantity(s).ok_or("the timeout must be a quantity")?,
        Some(_) => return Err("the timeout must be a number of milliseconds"),
    };
    Ok(match ms {
        0 => SYNC_DEFAULT,
        ms => std::time::Duration::from_millis(ms).min(SYNC_MAX),
    })
}

#[async_trait]
impl Upstreams for MempoolLayer {
    fn call<'a, 'b, 'f>(&'a self, call: &'b Call) -> CallFuture<'f>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        // Calls the pool neither answers nor adds an expectation to go down as the inner
        // layer's own future: most calls, and every one of them would otherwise pay a box.
        if !answers(call.info) && !matches!(call.method(), "eth_getTransactionReceipt" | "eth_fillTransaction") {
            return self.inner.call(call);
        }
        Box::pin(async move {
            match self.local(call).await {
                Some(outcome) => Ok(Answer { outcome, source: Source::Local }),
                None => self.inner.call(&self.forwarded(call)).await,
            }
        })
    }

    async fn call_batch(&self, reqs: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        let locals = futures_util::future::join_all(reqs.iter().map(|r| self.local(r))).await;
        let forward: Vec<std::borrow::Cow<'_, Call>> =
            reqs.iter().zip(&locals).filter(|(_, local)| local.is_none()).map(|(r, _)| self.forwarded(r)).collect();
        let forward: Vec<&Call> = forward.iter().map(|c| c.as_ref()).collect();
        let mut forwarded =
            if forward.is_empty() { Vec::new() } else { self.inner.call_batch(&forward).await }.into_iter();
        locals
            .into_iter()
            .map(|local| match local {
                Some(outcome) => Ok(Answer { outcome, source: Source::Local }),
                None => forwarded.next().unwrap_or(Err(UpstreamError::NoneAvailable)),
            })
            .collect()
    }
}

/// The JSON-RPC error for a refused submission: geth's code and wording for the pool's rules.
pub fn submit_error(e: &SubmitError) -> ErrorObject {
    match e {
        SubmitError::Invalid(_) | SubmitError::Refused(_) => ErrorObject::new(POOL_ERROR, e.to_string()),
        SubmitError::Unavailable(_) => ErrorObject::new(codes::RESOURCE_UNAVAILABLE, e.to_string()),
        SubmitError::Busy => ErrorObject::new(codes::LIMIT_EXCEEDED, e.to_string()),
    }
}

fn parse_hex(s: &str) -> Result<Bytes, ()> {
    alloy_primitives::hex::decode(s).map(Bytes::from).map_err(|_| ())
}

/// A parameter the pool understands, or `None` to let the inner layer answer (and word the error).
fn parse<T: serde::de::DeserializeOwned>(value: Option<&Value>) -> Option<T> {
    serde_json::from_value(value?.clone()).ok()
}

fn invalid_params(detail: &str) -> Outcome {
    Outcome::error(&ErrorObject::new(codes::INVALID_PARAMS, format!("invalid params: {detail}")))
}

fn result(value: &Value) -> Outcome {
    result_value(value.clone())
}

fn result_value(value: Value) -> Outcome {
    match RawValue::from_string(value.to_string()) {
        Ok(raw) => Outcome::result(raw),
        Err(e) => Outcome::error(&ErrorObject::new(codes::INTERNAL_ERROR, e.to_string())),
    }
}
