//! Cache policy: which calls are cacheable, under which key, for how long. Pure code.
//!
//! | class | methods | key names | lifetime |
//! |---|---|---|---|
//! | local | `eth_blockNumber`, `eth_chainId` | — | answered from the head tracker |
//! | immutable | `net_version`, by-hash block lookups | method + params | forever |
//! | block-scoped | `eth_getBlockByNumber`, `eth_getBalance`, `eth_getCode`, `eth_getStorageAt`, `eth_getTransactionCount`, `eth_call`, `eth_getProof`, `eth_getTransactionByBlockNumberAndIndex`, `eth_getBlockTransactionCountByNumber`, `eth_getUncleCountByBlockNumber`, `eth_getBlockReceipts`, `eth_feeHistory` | method + params with the block resolved to its number, plus its hash until finalized | forever once finalized; before that until a reorg at or below it |
//! | logs | `eth_getLogs` with a range inside the chain, or a `blockHash` | the range resolved, plus the hash of its last block until finalized | as block-scoped, by its last block |
//! | finalized-only | `eth_getTransactionByHash`, `eth_getTransactionReceipt` | method + params | stored only once the answer's block is finalized |
//!
//! Never cached: `pending`, heights beyond the head or unknown to the tracker, `null` results,
//! errors, and every other method (sends, filters, subscriptions, accounts, admin, debug,
//! `eth_estimateGas`, `eth_call` with state overrides).
//!
//! Before finality a block-scoped call is sent upstream pinned to the resolved block, by hash
//! (EIP-1898) where the method takes one, by number elsewhere. The answer is stored only if no
//! reorg happened while it was in flight (the view's epoch is unchanged).

use serde_json::Value;
use sluice_chain::methods::{ActsOn, CacheRule, Names};
use sluice_chain::{method_info, BlockNeed, BlockTag, ChainView, MethodInfo, Resolved};

/// What to do with one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Forward unchanged, store nothing.
    Pass,
    /// Answer from the head tracker: this quantity (the head's number, the chain id).
    Local(u64),
    /// Cacheable.
    Cache(Cacheable),
}

/// A cacheable call.
#[derive(Debug, Clone, PartialEq)]
pub struct Cacheable {
    /// The cache key: the method and canonical params naming exact blocks.
    pub key: String,
    /// Params to send upstream (blocks pinned), or `None` to send the caller's.
    pub forward: Option<String>,
    /// How long an answer stays valid.
    pub lifetime: Lifetime,
    /// When the answer must name a block with this hash (`eth_getBlockByNumber`).
    pub expect_hash: Option<String>,
    /// The view's epoch when planned.
    pub epoch: u64,
    /// What the forwarded call needs, when the plan pinned a block (`None`: as the caller's).
    pub needs: Option<BlockNeed>,
}

/// How long a cached answer stays valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Forever.
    Immutable,
    /// Until a reorg at or below this height.
    UntilReorgAt(u64),
    /// Only once the answer's own `blockNumber` is finalized (then forever).
    WhenFinalized,
}

/// Plans one call against a snapshot of the chain.
pub fn plan(method: &str, params: &str, view: &ChainView) -> Plan {
    plan_row(method_info(method), params, view)
}

/// [`plan`] for a method whose table row the caller holds: the row's `cache` says what may be
/// stored.
pub fn plan_row(row: &MethodInfo, params: &str, view: &ChainView) -> Plan {
    match row.cache {
        CacheRule::Never => return Plan::Pass,
        CacheRule::HeadNumber => return view.latest().map_or(Plan::Pass, |(n, _)| Plan::Local(n)),
        CacheRule::ChainId => return view.chain_id.map_or(Plan::Pass, Plan::Local),
        _ => {}
    }
    let method = row.name;
    let Ok(Value::Array(mut params)) = serde_json::from_str::<Value>(params) else {
        return Plan::Pass;
    };
    let immutable = |params: &[Value]| {
        Plan::Cache(Cacheable {
            key: key(method, params),
            forward: None,
            lifetime: Lifetime::Immutable,
            expect_hash: None,
            epoch: view.epoch,
            needs: None,
        })
    };
    match row.cache {
        CacheRule::Immutable => return immutable(&params),
        CacheRule::WhenFinalized => {
            let Plan::Cache(mut c) = immutable(&params) else { unreachable!() };
            c.lifetime = Lifetime::WhenFinalized;
            return Plan::Cache(c);
        }
        CacheRule::Logs => return plan_logs(params, view),
        // Params past the block of a call object are state overrides.
        CacheRule::ByBlock if row.acts_on == ActsOn::CallObject && params.len() > 2 => return Plan::Pass,
        _ => {}
    }
    let Some((index, takes_hash)) = row.block_position() else { return Plan::Pass };
    let tag = match params.get(index) {
        Some(value) => match BlockTag::parse(value) {
            Some(tag) => tag,
            None => return Plan::Pass, // let the node explain what is wrong
        },
        // An omitted block parameter is not added: a gateway never changes what the caller
        // sent except to pin a block position the caller did send.
        None => return Plan::Pass,
    };
    match view.resolve(&tag) {
        Resolved::Unresolvable => Plan::Pass,
        Resolved::Hash(hash) => {
            params[index] = Value::String(hash);
            immutable(&params)
        }
        Resolved::Block { number, hash, finalized } => {
            let (pinned, needs) = match (&hash, finalized, takes_hash) {
                (Some(hash), false, true) => (
                    serde_json::json!({ "blockHash": hash }),
                    BlockNeed::Hash { hash: hash.clone(), number: Some(number) },
                ),
                _ => (Value::String(format!("0x{number:x}")), BlockNeed::Number(number)),
            };
            params[index] = pinned;
            let forward = Value::Array(params.clone()).to_string();
            // The key names the block exactly: its hash until it is final.
            let named = match (&hash, finalized) {
                (Some(hash), false) => format!("0x{number:x}@{hash}"),
                _ => format!("0x{number:x}"),
            };
            params[index] = Value::String(named);
            Plan::Cache(Cacheable {
                key: key(method, &params),
                forward: Some(forward),
                lifetime: if finalized { Lifetime::Immutable } else { Lifetime::UntilReorgAt(number) },
                expect_hash: if row.names == Names::Block && !finalized { hash } else { None },
                epoch: view.epoch,
                needs: Some(needs),
            })
        }
    }
}

fn plan_logs(mut params: Vec<Value>, view: &ChainView) -> Plan {
    let Some(Value::Object(filter)) = params.get_mut(0) else { return Plan::Pass };
    if filter.contains_key("blockHash") {
        return Plan::Cache(Cacheable {
            key: key("eth_getLogs", &params),
            forward: None,
            lifetime: Lifetime::Immutable,
            expect_hash: None,
            epoch: view.epoch,
            needs: None,
        });
    }
    let resolve = |field: &str| {
        let tag = match filter.get(field) {
            None => BlockTag::Latest,
            Some(v) => BlockTag::parse(v)?,
        };
        match view.resolve(&tag) {
            Resolved::Block { number, hash, finalized } => Some((number, hash, finalized)),
            _ => None,
        }
    };
    let (Some((from, _, _)), Some((to, to_hash, to_final))) = (resolve("fromBlock"), resolve("toBlock")) else {
        return Plan::Pass;
    };
    if from > to {
        return Plan::Pass;
    }
    filter.insert("fromBlock".into(), Value::String(format!("0x{from:x}")));
    filter.insert("toBlock".into(), Value::String(format!("0x{to:x}")));
    let forward = Value::Array(params.clone()).to_string();
    if let (Some(hash), false, Some(Value::Object(filter))) = (to_hash, to_final, params.get_mut(0)) {
        // A reorg anywhere in the range changes the hash of its last block.
        filter.insert("toBlock".into(), Value::String(format!("0x{to:x}@{hash}")));
    }
    Plan::Cache(Cacheable {
        key: key("eth_getLogs", &params),
        forward: Some(forward),
        lifetime: if to_final { Lifetime::Immutable } else { Lifetime::UntilReorgAt(to) },
        expect_hash: None,
        epoch: view.epoch,
        needs: Some(BlockNeed::Range { from, to }),
    })
}

/// `method` + canonical params: sorted object keys (serde_json's map), no spaces, and hex
/// strings in lower case (addresses and data mean the same in either case).
fn key(method: &str, params: &[Value]) -> String {
    fn canonical(v: &Value) -> Value {
        match v {
            Value::String(s) if s.starts_with("0x") || s.starts_with("0X") => Value::String(s.to_ascii_lowercase()),
            Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
            Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), canonical(v))).collect()),
            other => other.clone(),
        }
    }
    let params: Vec<Value> = params.iter().map(canonical).collect();
    format!("{method}{}", Value::Array(params))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_chain::{HeadTracker, Header};

    fn hash(n: u64) -> String {
        format!("0x{n:064x}")
    }

    /// Blocks 0..=100, the last 32 tracked, finalized at 40.
    fn view() -> ChainView {
        let mut t = HeadTracker::new(32);
        for n in 0..=100 {
            t.feed(Header::new(n, hash(n), hash(n.saturating_sub(1))));
        }
        t.set_finalized(40);
        t.set_chain_id(31337);
        t.view()
    }

    fn cache(method: &str, params: &str) -> Cacheable {
        match plan(method, params, &view()) {
            Plan::Cache(c) => c,
            other => panic!("{method} {params}: {other:?}"),
        }
    }

    #[test]
    fn head_methods_are_local() {
        assert_eq!(plan("eth_blockNumber", "[]", &view()), Plan::Local(0x64));
        assert_eq!(plan("eth_chainId", "[]", &view()), Plan::Local(0x7a69));
        assert_eq!(plan("eth_blockNumber", "[]", &ChainView::default()), Plan::Pass, "no head yet");
    }

    #[test]
    fn latest_resolves_to_the_head_by_hash() {
        let c = cache("eth_getBalance", r#"["0xABC","latest"]"#);
        assert_eq!(c.lifetime, Lifetime::UntilReorgAt(100));
        assert_eq!(c.key, format!(r#"eth_getBalance["0xabc","0x64@{}"]"#, hash(100)));
        assert_eq!(c.forward.unwrap(), format!(r#"["0xABC",{{"blockHash":"{}"}}]"#, hash(100)));
        // The same block named two ways shares one key.
        assert_eq!(cache("eth_getBalance", r#"["0xabc","0x64"]"#).key, c.key);
        assert_eq!(c.needs, Some(BlockNeed::Hash { hash: hash(100), number: Some(100) }));
    }

    #[test]
    fn finalized_blocks_are_immutable_and_keyed_by_number() {
        let c = cache("eth_getBlockByNumber", r#"["0x10",true]"#);
        assert_eq!((c.lifetime, c.key.as_str()), (Lifetime::Immutable, r#"eth_getBlockByNumber["0x10",true]"#));
        assert_eq!(cache("eth_getBlockByNumber", r#"["finalized",false]"#).lifetime, Lifetime::Immutable);
        assert_eq!(cache("eth_getBlockByNumber", r#"["earliest",false]"#).forward.unwrap(), r#"["0x0",false]"#);
    }

    #[test]
    fn unfinalized_blocks_by_number_expect_their_hash() {
        let c = cache("eth_getBlockByNumber", r#"["0x50",false]"#);
        assert_eq!(c.expect_hash, Some(hash(0x50)));
        assert_eq!(c.forward.unwrap(), r#"["0x50",false]"#, "getBlockByNumber takes no hash");
    }

    #[test]
    fn never_cached() {
        for (method, params) in [
            ("eth_getBalance", r#"["0xabc","pending"]"#),
            ("eth_getBalance", r#"["0xabc","0x65"]"#), // beyond the head
            ("eth_getBalance", r#"["0xabc","0x30"]"#), // not final and older than the window
            ("eth_getBalance", r#"["0xabc","nonsense"]"#),
            ("eth_call", r#"[{"to":"0x1"},"latest",{"0x1":{"balance":"0x1"}}]"#),
            ("eth_sendRawTransaction", r#"["0x00"]"#),
            ("eth_estimateGas", r#"[{"to":"0x1"}]"#),
            ("eth_newFilter", r#"[{}]"#),
            ("eth_getLogs", r#"[{"fromBlock":"0x10","toBlock":"pending"}]"#),
            ("eth_getLogs", r#"[{"fromBlock":"0x60","toBlock":"0x50"}]"#),
            ("eth_feeHistory", r#"["0x4"]"#),
            // Omitted block parameters are not added (the call would change meaning).
            ("eth_getBalance", r#"["0xabc"]"#),
            ("eth_getBlockByNumber", r#"[]"#),
        ] {
            assert_eq!(plan(method, params, &view()), Plan::Pass, "{method} {params}");
        }
    }

    #[test]
    fn logs_are_keyed_by_the_last_blocks_hash() {
        let c = cache("eth_getLogs", r#"[{"fromBlock":"0x10","address":"0xAB"}]"#);
        assert_eq!(c.lifetime, Lifetime::UntilReorgAt(100));
        assert_eq!(
            c.key,
            format!(r#"eth_getLogs[{{"address":"0xab","fromBlock":"0x10","toBlock":"0x64@{}"}}]"#, hash(100))
        );
        assert_eq!(cache("eth_getLogs", r#"[{"fromBlock":"0x1","toBlock":"0x20"}]"#).lifetime, Lifetime::Immutable);
        assert_eq!(cache("eth_getLogs", &format!(r#"[{{"blockHash":"{}"}}]"#, hash(1))).lifetime, Lifetime::Immutable);
    }

    #[test]
    fn transactions_wait_for_finality_and_hashes_are_forever() {
        assert_eq!(cache("eth_getTransactionReceipt", r#"["0x01"]"#).lifetime, Lifetime::WhenFinalized);
        assert_eq!(cache("eth_getBlockByHash", r#"["0x01",true]"#).lifetime, Lifetime::Immutable);
        let by_hash = cache("eth_getBalance", &format!(r#"["0x1",{{"blockHash":"{}"}}]"#, hash(99)));
        assert_eq!(by_hash.lifetime, Lifetime::Immutable);
    }
}

/// Decides whether an answer may be stored, given the chain as it is now. Returns the entry's
/// `max_block` (`None`: never changes), or `None` to store nothing.
pub fn admit(plan: &Cacheable, result: &str, now: &ChainView) -> Option<Option<u64>> {
    if result == "null" {
        return None; // unknown now, may exist later
    }
    if let Some(expected) = &plan.expect_hash {
        let hash = serde_json::from_str::<Value>(result).ok()?.get("hash")?.as_str()?.to_ascii_lowercase();
        if &hash != expected {
            return None; // the node answered for another block at that height
        }
    }
    match plan.lifetime {
        Lifetime::Immutable => Some(None),
        Lifetime::UntilReorgAt(number) => (now.epoch == plan.epoch).then_some(Some(number)),
        Lifetime::WhenFinalized => {
            let value: Value = serde_json::from_str(result).ok()?;
            let number = sluice_chain::parse_quantity(value.get("blockNumber")?.as_str()?)?;
            now.is_finalized(number).then_some(None)
        }
    }
}

#[cfg(test)]
mod admit_tests {
    use super::*;
    use sluice_chain::{HeadTracker, Header};

    fn view(finalized: u64, reorgs: bool) -> ChainView {
        let mut t = HeadTracker::new(8);
        for n in 0..=20 {
            t.feed(Header::new(n, format!("0x{n:064x}"), format!("0x{:064x}", n.saturating_sub(1))));
        }
        if reorgs {
            t.feed(Header::new(20, format!("0x{:064x}", 999), format!("0x{:064x}", 19)));
        }
        t.set_finalized(finalized);
        t.view()
    }

    fn cacheable(lifetime: Lifetime, expect_hash: Option<&str>) -> Cacheable {
        Cacheable {
            key: String::new(),
            forward: None,
            lifetime,
            expect_hash: expect_hash.map(str::to_owned),
            epoch: 0,
            needs: None,
        }
    }

    #[test]
    fn nulls_are_never_stored() {
        assert_eq!(admit(&cacheable(Lifetime::Immutable, None), "null", &view(10, false)), None);
    }

    #[test]
    fn a_reorg_in_flight_stops_the_store() {
        let plan = cacheable(Lifetime::UntilReorgAt(20), None);
        assert_eq!(admit(&plan, "\"0x1\"", &view(10, false)), Some(Some(20)));
        assert_eq!(admit(&plan, "\"0x1\"", &view(10, true)), None);
    }

    #[test]
    fn blocks_must_have_the_expected_hash() {
        let plan = cacheable(Lifetime::UntilReorgAt(5), Some("0xabc"));
        assert_eq!(admit(&plan, r#"{"hash":"0xABC"}"#, &view(1, false)), Some(Some(5)));
        assert_eq!(admit(&plan, r#"{"hash":"0xdef"}"#, &view(1, false)), None);
    }

    #[test]
    fn transactions_are_stored_once_final() {
        let plan = cacheable(Lifetime::WhenFinalized, None);
        assert_eq!(admit(&plan, r#"{"blockNumber":"0x5"}"#, &view(10, false)), Some(None));
        assert_eq!(admit(&plan, r#"{"blockNumber":"0xb"}"#, &view(10, false)), None);
        assert_eq!(admit(&plan, r#"{"blockNumber":null}"#, &view(10, false)), None, "pending");
    }
}
