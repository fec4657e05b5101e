//! The method table: everything sluice decides by a method's name, in one place. Pure.
//!
//! Every component asks [`info`] (or reads the row a [`crate`] user keeps with the call)
//! instead of matching method names itself, so that a method is classified once: the three
//! ways of submitting a signed transaction, for example, are one [`Class::Submission`], and
//! whatever the mempool, the broadcast, consensus, coalescing and key scopes do for one, they
//! do for all.
//!
//! A name not in the table is looked up by prefix (`debug_trace…`, `trace_…`, `eth_get…`,
//! `txpool_…`, node administration namespaces); anything else gets [`UNKNOWN`]: forwarded to
//! one member as it is, not cached, not joined, not put to a vote, counted as `other`.

use std::sync::LazyLock;

use rustc_hash::FxHashMap;

/// What kind of work a method is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Reads the chain's data: headers, bodies, receipts, logs, fees.
    ChainRead,
    /// Reads the state at a block: balances, code, storage, calls, traces.
    StateRead,
    /// About the node itself: its network id, client version, peers.
    NodeInfo,
    /// Answered by sluice (its mempool) when it runs one.
    Local,
    /// Submits a signed transaction.
    Submission,
    /// Needs a connection that outlives the call.
    Subscription,
    /// A filter whose state lives on one node.
    NodeFilter,
    /// Node administration and node-held keys (denied by default).
    Admin,
    /// Not in the table.
    Unknown,
}

/// Where a method's block parameter is, and what it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockParam {
    /// None: the call needs no particular block.
    None,
    /// None, but the answer is about the head (gas prices, the block number).
    Head,
    /// A block tag or number at `index`; `by_hash`: an EIP-1898 `{blockHash}` object is
    /// accepted there. Omitted, it means `latest`.
    At {
        /// Its position in the params.
        index: usize,
        /// Whether EIP-1898 objects are accepted.
        by_hash: bool,
    },
    /// A block hash at this position.
    Hash(usize),
    /// A log filter object in `params[0]` (`fromBlock`/`toBlock` or `blockHash`).
    Filter,
}

/// What the cache may do with a method's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheRule {
    /// Never stored.
    Never,
    /// Answered from the head tracker: the head's number.
    HeadNumber,
    /// Answered from the head tracker: the chain id.
    ChainId,
    /// The same params always get the same answer.
    Immutable,
    /// Stored by the block the params name, bound to its hash until it is final.
    ByBlock,
    /// `eth_getLogs`: stored by the range the filter names.
    Logs,
    /// Stored once the block the answer names is final.
    WhenFinalized,
}

/// Which block an answer names, so that the head view learns of blocks clients were shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// None.
    Nothing,
    /// An object with `blockNumber`/`blockHash` (transaction, receipt).
    Object,
    /// A block with `number`/`hash`.
    Block,
    /// A list of objects naming their blocks (logs, receipts): the newest counts.
    List,
    /// A block number.
    Number,
}

/// The contract a call acts on, for key scopes limited to contracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActsOn {
    /// None.
    Nothing,
    /// `params[0]` is a call object; its `to`.
    CallObject,
    /// `params[0]` is a signed transaction; its decoded `to`.
    RawTransaction,
}

/// The ways of submitting a signed transaction (`params[0]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submit {
    /// `eth_sendRawTransaction`: answered with the transaction's hash.
    Hash,
    /// `eth_sendRawTransactionSync` (EIP-7966): answered with its receipt once mined, within a
    /// timeout (`params[1]`, milliseconds).
    Receipt,
    /// `eth_sendRawTransactionConditional`: only if the conditions in `params[1]` hold when
    /// it is included; answered with the hash.
    Conditional,
}

/// What a filter method does with the filter, which lives on the node that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterRole {
    /// Makes a filter and answers with its id.
    Creates,
    /// Acts on the filter whose id is `params[0]`.
    Uses,
}

/// One row of the table.
#[derive(Debug, PartialEq, Eq)]
pub struct MethodInfo {
    /// The method's name (for a prefix row, the prefix).
    pub name: &'static str,
    /// What kind of work it is.
    pub class: Class,
    /// Its block parameter.
    pub block: BlockParam,
    /// What the cache may do.
    pub cache: CacheRule,
    /// The block its answer names.
    pub names: Names,
    /// A `null` result means "no such object", which a node lacking the object says as
    /// readily as one that knows there is none (so another member may be asked).
    pub null_when_unknown: bool,
    /// Identical concurrent calls may share one answer.
    pub join: bool,
    /// It changes something (never put to a vote, never retried blindly).
    pub writes: bool,
    /// The contract it acts on, for key scopes.
    pub acts_on: ActsOn,
    /// How it submits a transaction, for [`Class::Submission`].
    pub submit: Option<Submit>,
    /// Its part in a node-side filter, for [`Class::NodeFilter`].
    pub filter: Option<FilterRole>,
    /// How its answer is checked against a trusted header's commitments, for the reads sluice
    /// can verify (docs/verify.md).
    pub verify: Option<VerifyBy>,
    /// An exact row (reported under its own name in metrics), not a prefix row.
    pub exact: bool,
}

/// How a read is verified: state reads from an account's EIP-1186 proof against the header's
/// `stateRoot`; chain data against the header's hash and roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyBy {
    /// An account's balance (`params[0]` the address).
    Balance,
    /// Its nonce.
    Nonce,
    /// Its code, checked against the proven code hash.
    Code,
    /// One storage slot (`params[1]`).
    Slot,
    /// The proof itself, of the slots in `params[1]`.
    Proof,
    /// A block: its header's hash, and with full transactions its `transactionsRoot`.
    Block,
    /// A block's receipts: their trie's root is the header's `receiptsRoot`.
    BlockReceipts,
    /// One receipt: found among its block's receipts, verified as those are.
    Receipt,
    /// One transaction by hash: found among its block's checked transactions; one not mined
    /// yet checked by itself (its hash and signer recomputed).
    Transaction,
    /// Logs: each block of the range ruled out by its header's bloom, or its checked
    /// receipts searched.
    Logs,
}

impl MethodInfo {
    /// True for the methods that submit a signed transaction.
    pub fn is_submission(&self) -> bool {
        self.class == Class::Submission
    }

    /// True when it reads the state at its block (which pruned nodes drop first), not the
    /// chain's data (which they keep longer): routing by a member's lowest block asks for the
    /// one the call reads.
    pub fn reads_state(&self) -> bool {
        self.class == Class::StateRead
    }

    /// True when several members' answers may be compared (consensus): not for methods that
    /// change something, nor for filters, which live on one node.
    pub fn may_vote(&self) -> bool {
        !self.writes && self.filter.is_none()
    }

    /// Where its block parameter sits and whether EIP-1898 objects are accepted there.
    pub fn block_position(&self) -> Option<(usize, bool)> {
        match self.block {
            BlockParam::At { index, by_hash } => Some((index, by_hash)),
            _ => None,
        }
    }
}

/// A row's defaults; the table below sets what differs.
const fn row(name: &'static str, class: Class) -> MethodInfo {
    MethodInfo {
        name,
        class,
        block: BlockParam::None,
        cache: CacheRule::Never,
        names: Names::Nothing,
        null_when_unknown: false,
        join: false,
        writes: false,
        acts_on: ActsOn::Nothing,
        submit: None,
        filter: None,
        verify: None,
        exact: true,
    }
}

/// A read: joined with identical reads in flight.
const fn read(name: &'static str, class: Class) -> MethodInfo {
    MethodInfo { join: true, ..row(name, class) }
}

/// A read of a block's data by height at `params[index]`.
const fn by_number(name: &'static str, index: usize, by_hash: bool) -> MethodInfo {
    MethodInfo {
        block: BlockParam::At { index, by_hash },
        cache: CacheRule::ByBlock,
        null_when_unknown: true,
        ..read(name, Class::ChainRead)
    }
}

/// A read of a block's data by hash at `params[0]`.
const fn by_hash(name: &'static str) -> MethodInfo {
    MethodInfo {
        block: BlockParam::Hash(0),
        cache: CacheRule::Immutable,
        null_when_unknown: true,
        ..read(name, Class::ChainRead)
    }
}

/// A read of the state at `params[index]`.
const fn state(name: &'static str, index: usize) -> MethodInfo {
    MethodInfo {
        block: BlockParam::At { index, by_hash: true },
        cache: CacheRule::ByBlock,
        ..read(name, Class::StateRead)
    }
}

/// A submission of a signed transaction.
const fn submission(name: &'static str, submit: Submit) -> MethodInfo {
    MethodInfo {
        writes: true,
        // The same params are the same transaction: one answer for all.
        join: true,
        acts_on: ActsOn::RawTransaction,
        submit: Some(submit),
        ..row(name, Class::Submission)
    }
}

/// A filter method: never joined (each call makes or consumes node-side state).
const fn filter(name: &'static str, role: FilterRole) -> MethodInfo {
    MethodInfo { filter: Some(role), ..row(name, Class::NodeFilter) }
}

use Class::*;

/// Every method sluice knows by name.
static TABLE: &[MethodInfo] = &[
    // The head and fees.
    MethodInfo {
        block: BlockParam::Head,
        cache: CacheRule::HeadNumber,
        names: Names::Number,
        ..read("eth_blockNumber", ChainRead)
    },
    MethodInfo { cache: CacheRule::ChainId, ..read("eth_chainId", ChainRead) },
    MethodInfo { block: BlockParam::Head, ..read("eth_gasPrice", ChainRead) },
    MethodInfo { block: BlockParam::Head, ..read("eth_maxPriorityFeePerGas", ChainRead) },
    MethodInfo { block: BlockParam::Head, ..read("eth_blobBaseFee", ChainRead) },
    MethodInfo { block: BlockParam::Head, ..read("eth_syncing", NodeInfo) },
    MethodInfo {
        block: BlockParam::At { index: 1, by_hash: false },
        cache: CacheRule::ByBlock,
        ..read("eth_feeHistory", ChainRead)
    },
    // Blocks, transactions and receipts.
    MethodInfo { names: Names::Block, verify: Some(VerifyBy::Block), ..by_number("eth_getBlockByNumber", 0, false) },
    MethodInfo { names: Names::Block, verify: Some(VerifyBy::Block), ..by_hash("eth_getBlockByHash") },
    MethodInfo {
        names: Names::List,
        verify: Some(VerifyBy::BlockReceipts),
        ..by_number("eth_getBlockReceipts", 0, true)
    },
    MethodInfo { names: Names::Object, ..by_number("eth_getTransactionByBlockNumberAndIndex", 0, false) },
    MethodInfo { names: Names::Object, ..by_hash("eth_getTransactionByBlockHashAndIndex") },
    by_number("eth_getBlockTransactionCountByNumber", 0, false),
    by_hash("eth_getBlockTransactionCountByHash"),
    by_number("eth_getUncleCountByBlockNumber", 0, false),
    by_hash("eth_getUncleCountByBlockHash"),
    MethodInfo {
        block: BlockParam::At { index: 0, by_hash: false },
        ..read("eth_getUncleByBlockNumberAndIndex", ChainRead)
    },
    MethodInfo { block: BlockParam::Hash(0), ..read("eth_getUncleByBlockHashAndIndex", ChainRead) },
    MethodInfo {
        cache: CacheRule::WhenFinalized,
        names: Names::Object,
        null_when_unknown: true,
        verify: Some(VerifyBy::Transaction),
        ..read("eth_getTransactionByHash", ChainRead)
    },
    MethodInfo {
        cache: CacheRule::WhenFinalized,
        names: Names::Object,
        null_when_unknown: true,
        verify: Some(VerifyBy::Receipt),
        ..read("eth_getTransactionReceipt", ChainRead)
    },
    MethodInfo {
        block: BlockParam::Filter,
        cache: CacheRule::Logs,
        names: Names::List,
        verify: Some(VerifyBy::Logs),
        ..read("eth_getLogs", ChainRead)
    },
    // State.
    MethodInfo { verify: Some(VerifyBy::Balance), ..state("eth_getBalance", 1) },
    MethodInfo { verify: Some(VerifyBy::Code), ..state("eth_getCode", 1) },
    MethodInfo { verify: Some(VerifyBy::Nonce), ..state("eth_getTransactionCount", 1) },
    MethodInfo { verify: Some(VerifyBy::Slot), ..state("eth_getStorageAt", 2) },
    MethodInfo { verify: Some(VerifyBy::Proof), ..state("eth_getProof", 2) },
    MethodInfo { acts_on: ActsOn::CallObject, ..state("eth_call", 1) },
    MethodInfo { cache: CacheRule::Never, acts_on: ActsOn::CallObject, ..state("eth_estimateGas", 1) },
    MethodInfo { cache: CacheRule::Never, acts_on: ActsOn::CallObject, ..state("eth_createAccessList", 1) },
    row("eth_simulateV1", StateRead),
    row("eth_fillTransaction", StateRead),
    read("debug_traceCall", StateRead),
    read("debug_traceTransaction", StateRead),
    read("debug_traceBlockByNumber", StateRead),
    read("debug_traceBlockByHash", StateRead),
    read("trace_block", StateRead),
    read("trace_transaction", StateRead),
    read("trace_filter", StateRead),
    // The node.
    MethodInfo { cache: CacheRule::Immutable, ..read("net_version", NodeInfo) },
    read("net_listening", NodeInfo),
    read("net_peerCount", NodeInfo),
    read("web3_clientVersion", NodeInfo),
    read("eth_protocolVersion", NodeInfo),
    row("web3_sha3", NodeInfo),
    row("eth_accounts", NodeInfo),
    // Submissions.
    submission("eth_sendRawTransaction", Submit::Hash),
    MethodInfo { names: Names::Object, ..submission("eth_sendRawTransactionSync", Submit::Receipt) },
    submission("eth_sendRawTransactionConditional", Submit::Conditional),
    // Subscriptions and filters.
    row("eth_subscribe", Subscription),
    row("eth_unsubscribe", Subscription),
    filter("eth_newFilter", FilterRole::Creates),
    filter("eth_newBlockFilter", FilterRole::Creates),
    filter("eth_newPendingTransactionFilter", FilterRole::Creates),
    filter("eth_uninstallFilter", FilterRole::Uses),
    // Consumes the filter's changes on the node: never shared.
    filter("eth_getFilterChanges", FilterRole::Uses),
    MethodInfo { join: true, ..filter("eth_getFilterLogs", FilterRole::Uses) },
    // The mempool's own.
    row("txpool_status", Local),
    row("txpool_content", Local),
    row("txpool_contentFrom", Local),
    row("txpool_inspect", Local),
    row("sluice_getTransactionStatus", Local),
    // Node-held keys and mining.
    MethodInfo { writes: true, ..row("eth_sendTransaction", Admin) },
    row("eth_sign", Admin),
    row("eth_signTransaction", Admin),
    // Hands out work on the node: never shared.
    row("eth_getWork", Admin),
];

/// Families known by prefix, looked up in order when the name is not in [`TABLE`].
static PREFIXES: &[MethodInfo] = &[
    MethodInfo { exact: false, ..read("debug_trace", StateRead) },
    MethodInfo { exact: false, ..read("trace_", StateRead) },
    MethodInfo { exact: false, ..read("eth_get", ChainRead) },
    MethodInfo { exact: false, ..row("txpool_", Local) },
    MethodInfo { exact: false, ..row("admin_", Admin) },
    MethodInfo { exact: false, ..row("debug_", Admin) },
    MethodInfo { exact: false, ..row("personal_", Admin) },
    MethodInfo { exact: false, ..row("miner_", Admin) },
    MethodInfo { exact: false, ..row("engine_", Admin) },
    MethodInfo { exact: false, ..row("clique_", Admin) },
];

/// The row of every name the table does not know: forwarded as it is, nothing else.
pub static UNKNOWN: MethodInfo = MethodInfo { exact: false, ..row("", Unknown) };

/// The exact rows by name, built once: one hash per look-up (a fast hash: the keys are the
/// table's own names, and a caller's method name only ever looks one up).
static BY_NAME: LazyLock<FxHashMap<&'static str, &'static MethodInfo>> =
    LazyLock::new(|| TABLE.iter().map(|m| (m.name, m)).collect());

/// What sluice knows about `method`.
pub fn info(method: &str) -> &'static MethodInfo {
    if let Some(row) = BY_NAME.get(method) {
        return row;
    }
    PREFIXES.iter().find(|p| method.starts_with(p.name)).unwrap_or(&UNKNOWN)
}

/// Every method known by its exact name.
pub fn known() -> impl Iterator<Item = &'static MethodInfo> {
    TABLE.iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method a component handles, with the class it must have: a row changed by
    /// mistake, or a method added without a class, fails here.
    #[test]
    fn every_known_method_has_its_expected_class() {
        let expected: &[(Class, &[&str])] = &[
            (
                ChainRead,
                &[
                    "eth_blockNumber",
                    "eth_chainId",
                    "eth_gasPrice",
                    "eth_maxPriorityFeePerGas",
                    "eth_blobBaseFee",
                    "eth_feeHistory",
                    "eth_getBlockByNumber",
                    "eth_getBlockByHash",
                    "eth_getBlockReceipts",
                    "eth_getTransactionByBlockNumberAndIndex",
                    "eth_getTransactionByBlockHashAndIndex",
                    "eth_getBlockTransactionCountByNumber",
                    "eth_getBlockTransactionCountByHash",
                    "eth_getUncleCountByBlockNumber",
                    "eth_getUncleCountByBlockHash",
                    "eth_getUncleByBlockNumberAndIndex",
                    "eth_getUncleByBlockHashAndIndex",
                    "eth_getTransactionByHash",
                    "eth_getTransactionReceipt",
                    "eth_getLogs",
                ],
            ),
            (
                StateRead,
                &[
                    "eth_getBalance",
                    "eth_getCode",
                    "eth_getTransactionCount",
                    "eth_getStorageAt",
                    "eth_getProof",
                    "eth_call",
                    "eth_estimateGas",
                    "eth_createAccessList",
                    "eth_simulateV1",
                    "eth_fillTransaction",
                    "debug_traceCall",
                    "debug_traceTransaction",
                    "debug_traceBlockByNumber",
                    "debug_traceBlockByHash",
                    "trace_block",
                    "trace_transaction",
                    "trace_filter",
                ],
            ),
            (
                NodeInfo,
                &[
                    "eth_syncing",
                    "net_version",
                    "net_listening",
                    "net_peerCount",
                    "web3_clientVersion",
                    "eth_protocolVersion",
                    "web3_sha3",
                    "eth_accounts",
                ],
            ),
            (
                Submission,
                &["eth_sendRawTransaction", "eth_sendRawTransactionSync", "eth_sendRawTransactionConditional"],
            ),
            (Subscription, &["eth_subscribe", "eth_unsubscribe"]),
            (
                NodeFilter,
                &[
                    "eth_newFilter",
                    "eth_newBlockFilter",
                    "eth_newPendingTransactionFilter",
                    "eth_uninstallFilter",
                    "eth_getFilterChanges",
                    "eth_getFilterLogs",
                ],
            ),
            (
                Local,
                &[
                    "txpool_status",
                    "txpool_content",
                    "txpool_contentFrom",
                    "txpool_inspect",
                    "sluice_getTransactionStatus",
                ],
            ),
            (Admin, &["eth_sendTransaction", "eth_sign", "eth_signTransaction", "eth_getWork"]),
        ];
        let mut listed = 0;
        for (class, names) in expected {
            for name in *names {
                let row = info(name);
                assert!(row.exact, "{name} is not in the table");
                assert_eq!(row.class, *class, "{name}");
                listed += 1;
            }
        }
        assert_eq!(listed, TABLE.len(), "a row of the table is missing from this list");
    }

    #[test]
    fn names_are_unique() {
        assert_eq!(BY_NAME.len(), TABLE.len());
    }

    #[test]
    fn the_three_submissions_are_one_class() {
        for name in ["eth_sendRawTransaction", "eth_sendRawTransactionSync", "eth_sendRawTransactionConditional"] {
            let m = info(name);
            assert!(m.is_submission() && m.writes && !m.may_vote() && m.join, "{name}");
            assert_eq!(m.acts_on, ActsOn::RawTransaction, "{name}");
        }
        assert!(!info("eth_sendTransaction").is_submission() && !info("eth_sendTransaction").may_vote());
    }

    #[test]
    fn families_are_known_by_prefix_and_the_rest_is_unknown() {
        assert_eq!(info("debug_traceBlock").class, StateRead);
        assert!(info("debug_traceBlock").join && !info("debug_traceBlock").exact);
        assert_eq!(info("debug_setHead").class, Admin);
        assert_eq!(info("eth_getRawTransactionByHash").class, ChainRead);
        assert!(!info("eth_getFilterChanges").join && !info("eth_getWork").join);
        let unknown = info("eth_doSomethingNew");
        assert_eq!(unknown, &UNKNOWN);
        assert!(!unknown.join && unknown.may_vote() && unknown.cache == CacheRule::Never);
    }
}
