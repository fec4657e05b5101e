//! What readers see: an immutable snapshot of the pool, published by the writer after every
//! batch and read without locks, plus the JSON renderings of geth's `txpool_*` formats.
//!
//! The senders' map is persistent ([`SenderMap`]): publishing a batch copies only the paths it
//! changed, so a snapshot costs O(changes), not O(pool), and a reader holding an old one never
//! blocks the writer or sees a half-applied batch.
//!
//! The hash index is not copied at all. It is one concurrent map (`papaya`, lock-free reads)
//! shared by every snapshot, from a hash to where the transaction sits (its sender and nonce,
//! which the hash fixes), and a lookup counts only when the snapshot's own view of that sender
//! has the transaction there. The writer adds an entry before publishing the snapshot that
//! lists it, and deletes one only once every snapshot that listed it is gone (see
//! `Retired`), so each snapshot still answers by hash exactly as of its batch. Kept as a
//! persistent map like the senders', the index took 45 % of the writer's CPU samples under
//! load (`perf record` during `cargo bench -p sluice-mempool --bench mempool`): every insert copies
//! a path of nodes of 32 entries each.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use alloy_consensus::transaction::Recovered;
use alloy_consensus::{Transaction, TxEnvelope};
use alloy_eips::eip2718::Decodable2718;
use alloy_primitives::{Address, Bytes, B256};
use serde_json::{json, Map, Value};

use crate::{PoolTx, Status};

/// A pooled transaction with everything readers need.
#[derive(Debug)]
pub struct Pooled {
    /// The pool's view of it (hash, sender, nonce, fees).
    pub tx: PoolTx,
    /// The raw EIP-2718 bytes, as received (what is journaled and relayed, and what the RPC
    /// renderings decode).
    pub raw: Bytes,
}

impl crate::AsPoolTx for Pooled {
    fn pool_tx(&self) -> &PoolTx {
        &self.tx
    }
}

impl Pooled {
    /// The decoded envelope. Decoded again from the raw bytes, which decoded and checked once
    /// already (the sender is not recovered again: it is known); `None` cannot happen for a
    /// pooled transaction.
    pub fn envelope(&self) -> Option<TxEnvelope> {
        TxEnvelope::decode_2718(&mut self.raw.as_ref()).ok()
    }

    /// The transaction as `eth_getTransactionByHash` shows a pending one: block fields null.
    pub fn to_rpc(&self) -> Value {
        self.rpc_form().and_then(|form| serde_json::to_value(form).ok()).unwrap_or(Value::Null)
    }

    /// The same, serialized straight to JSON text (the `eth_getTransactionByHash` answer).
    pub fn to_rpc_raw(&self) -> Option<Box<serde_json::value::RawValue>> {
        serde_json::value::to_raw_value(&self.rpc_form()?).ok()
    }

    fn rpc_form(&self) -> Option<alloy_rpc_types_eth::Transaction> {
        Some(alloy_rpc_types_eth::Transaction {
            inner: Recovered::new_unchecked(self.envelope()?, self.tx.sender),
            block_hash: None,
            block_number: None,
            transaction_index: None,
            effective_gas_price: None,
        })
    }

    /// geth's `txpool_inspect` line: `to: value wei + gas gas × price wei`.
    pub fn summary(&self) -> String {
        let to = match self.envelope().and_then(|e| e.to()) {
            Some(to) => format!("{to}"),
            None => "contract creation".to_owned(),
        };
        format!("{to}: {} wei + {} gas × {} wei", self.tx.value, self.tx.gas_limit, self.tx.max_fee)
    }
}

/// One sender's pooled transactions, by nonce.
#[derive(Debug, Default)]
pub struct SenderView {
    /// The next nonce counting the executable transactions (`eth_getTransactionCount(pending)`).
    pub pending_nonce: u64,
    /// Executable now, consecutive from the account nonce.
    pub pending: Vec<Arc<Pooled>>,
    /// Waiting for a nonce gap to fill or for the base fee to fall.
    pub queued: Vec<Arc<Pooled>>,
}

impl SenderView {
    /// Its transaction at `nonce` (both lists are in nonce order).
    pub fn at(&self, nonce: u64) -> Option<&Arc<Pooled>> {
        [&self.pending, &self.queued]
            .into_iter()
            .find_map(|list| list.binary_search_by_key(&nonce, |p| p.tx.nonce).ok().map(|i| &list[i]))
    }
}

/// The hash index's entries of transactions that left the pool, each kept until no snapshot
/// that lists the transaction is alive: a snapshot answers by hash as of its own batch.
///
/// One record per published snapshot, in order: the snapshot before it, and the hashes it no
/// longer lists. Once that snapshot and every older one are gone (a snapshot is only ever read
/// through an `Arc`, and `ArcSwap` turns its readers' loads into counted references when it
/// is replaced), no live snapshot lists those hashes.
#[derive(Default)]
pub(crate) struct Retired {
    records: VecDeque<(Weak<Snapshot>, Vec<B256>)>,
}

impl Retired {
    /// Snapshots waited for at most: past this many, the oldest record's hashes are deleted
    /// anyway, so one reader holding an old snapshot forever cannot grow the index without
    /// bound (that reader no longer finds by hash what left since; its views still list it).
    const MAX_RECORDS: usize = 4096;

    /// Records a publication: `before` was replaced by a snapshot no longer listing `left`.
    pub(crate) fn push(&mut self, before: &Arc<Snapshot>, left: Vec<B256>) {
        self.records.push_back((Arc::downgrade(before), left));
    }

    /// The hashes whose entries may go now: those of the oldest records whose snapshots (and
    /// every older one) are gone.
    pub(crate) fn due(&mut self) -> Vec<B256> {
        let mut due = Vec::new();
        while let Some((snapshot, _)) = self.records.front() {
            if snapshot.strong_count() > 0 && self.records.len() <= Self::MAX_RECORDS {
                break;
            }
            if let Some((_, left)) = self.records.pop_front() {
                due.extend(left);
            }
        }
        due
    }
}

/// Every sender's view, as of one snapshot: a persistent (copy-on-write) hash trie, so that
/// publishing a batch copies only the paths it changed and a reader holding an old snapshot
/// never blocks the writer or sees a half-applied batch.
///
/// `rpds`'s trie, branching [`SenderMap::DEGREE`] ways and indexed by all 64 bits of each
/// address's hash. `imbl`'s trie, used before, indexes by as many hash bits as it branches
/// ways: with its 8-way nodes, 8 bits, so past 3 levels every sender sat in one of 256
/// collision lists, scanned on each read and copied whole on each write, each list ~80 senders
/// long at 20,000 (docs/mempool.md, "At 20,000 senders").
#[derive(Clone)]
pub struct SenderMap(rpds::HashTrieMapSync<Address, Arc<SenderView>, alloy_primitives::map::FbBuildHasher<20>>);

impl Default for SenderMap {
    fn default() -> Self {
        Self(rpds::HashTrieMap::new_with_hasher_and_degree_and_ptr_kind(Default::default(), Self::DEGREE))
    }
}

impl std::fmt::Debug for SenderMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderMap").field("senders", &self.len()).finish_non_exhaustive()
    }
}

impl SenderMap {
    /// Branches per node: under load each transaction of a batch touches another sender, and
    /// each touch copies one path of nodes, each as many entries as it has children.
    pub const DEGREE: u8 = 16;

    /// A sender's view.
    pub fn get(&self, sender: &Address) -> Option<&Arc<SenderView>> {
        self.0.get(sender)
    }

    /// Whether the sender has pooled transactions.
    pub fn contains_key(&self, sender: &Address) -> bool {
        self.0.contains_key(sender)
    }

    /// A sender's view, to replace (the path to it is copied first where it is shared with
    /// another snapshot).
    pub(crate) fn get_mut(&mut self, sender: &Address) -> Option<&mut Arc<SenderView>> {
        self.0.get_mut(sender)
    }

    /// Sets a sender's view.
    pub(crate) fn insert(&mut self, sender: Address, view: Arc<SenderView>) {
        self.0.insert_mut(sender, view);
    }

    /// Removes a sender.
    pub(crate) fn remove(&mut self, sender: &Address) {
        self.0.remove_mut(sender);
    }

    /// How many senders have pooled transactions.
    pub fn len(&self) -> usize {
        self.0.size()
    }

    /// Whether no sender has.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every sender and its view, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Address, &Arc<SenderView>)> {
        self.0.iter()
    }

    /// Every sender.
    pub fn keys(&self) -> impl Iterator<Item = &Address> {
        self.0.keys()
    }

    /// Every view.
    pub fn values(&self) -> impl Iterator<Item = &Arc<SenderView>> {
        self.0.values()
    }
}

/// Where a pooled transaction sits: its sender's view, at its nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub sender: Address,
    pub nonce: u64,
}

/// Hash → place of every transaction some live snapshot lists (and of some about to be
/// listed), shared by all snapshots.
pub(crate) type TxIndex = papaya::HashMap<B256, Place, alloy_primitives::map::FbBuildHasher<32>>;

/// The pool as of one published batch.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// The shared hash index (see [`Snapshot::get`]).
    pub(crate) index: Arc<TxIndex>,
    /// Every sender with pooled transactions.
    pub senders: SenderMap,
    /// Pending and queued counts.
    pub status: Status,
    /// The base fee executability was judged by.
    pub base_fee: u128,
}

impl Snapshot {
    /// An empty snapshot whose hash index is sized for `capacity` transactions.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let index = Arc::new(TxIndex::with_capacity_and_hasher(capacity, Default::default()));
        Self { index, senders: SenderMap::default(), status: Status::default(), base_fee: 0 }
    }

    /// A transaction pooled as of this snapshot, by hash.
    pub fn get(&self, hash: &B256) -> Option<&Arc<Pooled>> {
        let place = *self.index.pin().get(hash)?;
        self.senders.get(&place.sender)?.at(place.nonce).filter(|p| p.tx.hash == *hash)
    }

    /// Whether a transaction is pooled as of this snapshot.
    pub fn contains(&self, hash: &B256) -> bool {
        self.get(hash).is_some()
    }

    /// How many transactions are pooled.
    pub fn len(&self) -> usize {
        self.status.pending + self.status.queued
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `txpool_status`.
    pub fn status_json(&self) -> Value {
        json!({ "pending": quantity(self.status.pending as u64), "queued": quantity(self.status.queued as u64) })
    }

    /// `txpool_content` (full transactions) or `txpool_inspect` (one-line summaries).
    pub fn content_json(&self, summaries: bool) -> Value {
        let mut pending = Map::new();
        let mut queued = Map::new();
        for (sender, view) in self.senders.iter() {
            let key = format!("{sender}");
            if !view.pending.is_empty() {
                pending.insert(key.clone(), by_nonce(&view.pending, summaries));
            }
            if !view.queued.is_empty() {
                queued.insert(key, by_nonce(&view.queued, summaries));
            }
        }
        json!({ "pending": pending, "queued": queued })
    }

    /// `txpool_contentFrom`: one sender's transactions.
    pub fn content_from_json(&self, sender: &Address) -> Value {
        let empty = SenderView::default();
        let view = self.senders.get(sender).map_or(&empty, |v| v.as_ref());
        json!({ "pending": by_nonce(&view.pending, false), "queued": by_nonce(&view.queued, false) })
    }
}

fn by_nonce(txs: &[Arc<Pooled>], summaries: bool) -> Value {
    let map: Map<String, Value> = txs
        .iter()
        .map(|t| {
            let value = if summaries { Value::String(t.summary()) } else { t.to_rpc() };
            (t.tx.nonce.to_string(), value)
        })
        .collect();
    Value::Object(map)
}

/// A JSON-RPC quantity.
pub fn quantity(n: u64) -> String {
    format!("{n:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(pending_nonce: u64) -> Arc<SenderView> {
        Arc::new(SenderView { pending_nonce, ..SenderView::default() })
    }

    // At the scale of a busy public mempool (20,000 senders), a batch's changes to a copy of the
    // map (views replaced, senders added and removed) leave the snapshot it was copied from
    // exactly as it was, and the copy holds every change and every untouched sender.
    #[test]
    fn a_copy_changed_by_a_batch_leaves_the_published_map_as_it_was() {
        let senders: Vec<Address> = (0..20_000u32).map(|i| Address::left_padding_from(&i.to_be_bytes())).collect();
        let mut published = SenderMap::default();
        for (i, s) in senders.iter().enumerate() {
            published.insert(*s, view(i as u64));
        }
        let mut next = published.clone();
        for s in senders.iter().step_by(157) {
            let slot = next.get_mut(s).expect("a pooled sender");
            *slot = view(slot.pending_nonce + 1_000_000);
        }
        for s in senders.iter().skip(1).step_by(313) {
            next.remove(s);
        }
        let newcomer = Address::repeat_byte(0xee);
        next.insert(newcomer, view(7));

        assert_eq!(published.len(), 20_000);
        assert!(!published.contains_key(&newcomer));
        for (i, s) in senders.iter().enumerate() {
            assert_eq!(published.get(s).map(|v| v.pending_nonce), Some(i as u64), "published sender {i}");
            let expected = if i % 313 == 1 {
                None
            } else if i % 157 == 0 {
                Some(i as u64 + 1_000_000)
            } else {
                Some(i as u64)
            };
            assert_eq!(next.get(s).map(|v| v.pending_nonce), expected, "copied sender {i}");
        }
        let removed = senders.iter().skip(1).step_by(313).count();
        assert_eq!(next.len(), 20_000 - removed + 1);
        assert_eq!(next.iter().count(), next.len());
        assert_eq!(next.get(&newcomer).map(|v| v.pending_nonce), Some(7));
    }
}
