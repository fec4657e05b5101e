//! The head tracker: a state machine fed block headers, and the snapshots it publishes.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use crate::tag::{parse_quantity, BlockTag};

/// The part of a block header sluice reads: what the tracker links by, and what the head's
/// followers use without fetching the block again (a `newHeads` notification carries it all).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Header {
    /// Block number.
    #[serde(deserialize_with = "quantity")]
    pub number: u64,
    /// Block hash, lower-case.
    #[serde(deserialize_with = "lower")]
    pub hash: String,
    /// Parent block hash, lower-case.
    #[serde(rename = "parentHash", deserialize_with = "lower")]
    pub parent_hash: String,
    /// Seconds since the epoch, when the header carried it.
    #[serde(default, deserialize_with = "opt_quantity")]
    pub timestamp: Option<u64>,
    /// The block's gas limit, when the header carried it.
    #[serde(default, rename = "gasLimit", deserialize_with = "opt_quantity")]
    pub gas_limit: Option<u64>,
    /// The gas the block used, when the header carried it.
    #[serde(default, rename = "gasUsed", deserialize_with = "opt_quantity")]
    pub gas_used: Option<u64>,
    /// The block's base fee (London on), when the header carried it.
    #[serde(default, rename = "baseFeePerGas", deserialize_with = "opt_quantity")]
    pub base_fee: Option<u64>,
    /// Present from Prague on (EIP-7685).
    #[serde(default, rename = "requestsHash")]
    pub requests_hash: Option<String>,
}

impl Header {
    /// The header in the node's own JSON form (hex quantities), which [`Header`]'s
    /// deserialization reads back unchanged: how replicas pass headers to each other.
    pub fn to_json(&self) -> serde_json::Value {
        let hex = |n: Option<u64>| n.map(|n| format!("{n:#x}"));
        serde_json::json!({
            "number": format!("{:#x}", self.number),
            "hash": self.hash,
            "parentHash": self.parent_hash,
            "timestamp": hex(self.timestamp),
            "gasLimit": hex(self.gas_limit),
            "gasUsed": hex(self.gas_used),
            "baseFeePerGas": hex(self.base_fee),
            "requestsHash": self.requests_hash,
        })
    }

    /// A header with only what links it: number, hash and parent hash.
    pub fn new(number: u64, hash: String, parent_hash: String) -> Self {
        Self {
            number,
            hash,
            parent_hash,
            timestamp: None,
            gas_limit: None,
            gas_used: None,
            base_fee: None,
            requests_hash: None,
        }
    }
}

fn opt_quantity<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    // Lenient: a field sluice cannot read is as good as absent (the block is fetched then).
    Ok(Option::<String>::deserialize(d)?.as_deref().and_then(parse_quantity))
}

fn quantity<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    // Owned, not borrowed: headers are read from raw text and from `serde_json::Value`s alike.
    let s = String::deserialize(d)?;
    parse_quantity(&s).ok_or_else(|| serde::de::Error::custom("not a quantity"))
}

fn lower<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(String::deserialize(d)?.to_ascii_lowercase())
}

/// What feeding one header did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// A new block on top of (or filling in) the known chain.
    Extended,
    /// Blocks at `fork_point` and above were replaced.
    Reorg {
        /// The lowest height whose block changed.
        fork_point: u64,
    },
    /// Already known.
    Known,
    /// Older than the tracked window; ignored.
    Stale,
    /// The parent is unknown or differs from ours: feed the block with this hash first.
    NeedParent {
        /// The parent's height.
        number: u64,
        /// The parent's hash.
        hash: String,
    },
}

/// What consumers (cache, pool) are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainEvent {
    /// A new head at this height.
    NewHead(u64),
    /// Everything cached for blocks at `fork_point` and above may be wrong.
    Reorg {
        /// The lowest height whose block changed.
        fork_point: u64,
    },
}

/// Keeps the recent canonical chain (height → hash) within a window, and the safe and
/// finalized heights reported by the node.
#[derive(Debug)]
pub struct HeadTracker {
    blocks: BTreeMap<u64, String>,
    parents: BTreeMap<u64, String>,
    window: usize,
    safe: Option<u64>,
    finalized: Option<u64>,
    /// The head when safe and finalized were last read: the tags resolve only at that head.
    finality_at: Option<u64>,
    /// The newest header fed, whole.
    tip: Option<Arc<Header>>,
    epoch: u64,
    chain_id: Option<u64>,
}

impl HeadTracker {
    /// A tracker that remembers the last `window` blocks.
    pub fn new(window: usize) -> Self {
        Self {
            blocks: BTreeMap::new(),
            parents: BTreeMap::new(),
            window: window.max(2),
            safe: None,
            finalized: None,
            finality_at: None,
            tip: None,
            epoch: 0,
            chain_id: None,
        }
    }

    /// Records the node's chain id.
    pub fn set_chain_id(&mut self, chain_id: u64) {
        self.chain_id = Some(chain_id);
    }

    /// The newest height known.
    pub fn latest(&self) -> Option<u64> {
        self.blocks.last_key_value().map(|(n, _)| *n)
    }

    /// Feeds one header (from newHeads, a poll, or a parent fetched on request).
    pub fn feed(&mut self, header: Header) -> Feed {
        if self.blocks.get(&header.number) == Some(&header.hash) {
            return Feed::Known;
        }
        let lowest = self.blocks.first_key_value().map(|(n, _)| *n);
        if lowest.is_some_and(|lowest| header.number < lowest) {
            return Feed::Stale;
        }
        let links = match (header.number.checked_sub(1), lowest) {
            (_, None) | (None, _) => true,
            (Some(parent), Some(lowest)) if parent < lowest => {
                // The parent is below the window: a reorg deeper than we can check. Start over
                // from this block and report everything we knew as replaced.
                self.blocks.clear();
                self.parents.clear();
                self.insert(header);
                self.epoch += 1;
                return Feed::Reorg { fork_point: lowest };
            }
            (Some(parent), Some(_)) => self.blocks.get(&parent) == Some(&header.parent_hash),
        };
        if !links {
            return Feed::NeedParent { number: header.number - 1, hash: header.parent_hash };
        }
        let replaced = self.blocks.split_off(&header.number);
        self.parents.split_off(&header.number);
        self.insert(header.clone());
        if replaced.is_empty() {
            Feed::Extended
        } else {
            self.epoch += 1;
            Feed::Reorg { fork_point: header.number }
        }
    }

    fn insert(&mut self, header: Header) {
        if self.latest().is_none_or(|latest| header.number >= latest) {
            self.tip = Some(Arc::new(header.clone()));
        }
        self.blocks.insert(header.number, header.hash);
        self.parents.insert(header.number, header.parent_hash);
        while self.blocks.len() > self.window {
            self.blocks.pop_first();
            self.parents.pop_first();
        }
    }

    /// Room left below the lowest tracked block, within the window.
    pub fn room_below(&self) -> usize {
        let lowest = self.blocks.first_key_value().map_or(0, |(n, _)| *n);
        (self.window - self.blocks.len()).min(lowest as usize)
    }

    /// The lowest tracked block and the hash its parent must have.
    pub fn lowest(&self) -> Option<(u64, &str)> {
        let (n, _) = self.blocks.first_key_value()?;
        Some((*n, self.parents.get(n)?.as_str()))
    }

    /// Backfills one block just below the lowest tracked one (at start, so that recent blocks
    /// are cacheable at once). True when it links: its hash is the lowest block's parent hash
    /// and the window has room. Nothing else changes: no event, no new epoch.
    pub fn prepend(&mut self, header: Header) -> bool {
        let links = self.lowest().is_some_and(|(n, parent)| header.number + 1 == n && header.hash == parent);
        if !links || self.blocks.len() >= self.window {
            return false;
        }
        self.blocks.insert(header.number, header.hash);
        self.parents.insert(header.number, header.parent_hash);
        true
    }

    /// Records the node's finalized height (it only moves forward), read at the current head.
    pub fn set_finalized(&mut self, number: u64) {
        self.finalized = Some(self.finalized.map_or(number, |f| f.max(number)));
        self.finality_at = self.latest();
    }

    /// Records the node's safe height (it only moves forward), read at the current head.
    pub fn set_safe(&mut self, number: u64) {
        self.safe = Some(self.safe.map_or(number, |s| s.max(number)));
        self.finality_at = self.latest();
    }

    /// A snapshot for readers.
    pub fn view(&self) -> ChainView {
        ChainView {
            hashes: Arc::new(self.blocks.clone()),
            safe: self.safe,
            finalized: self.finalized,
            finality_at: self.finality_at,
            tip: self.tip.clone().filter(|tip| self.blocks.get(&tip.number) == Some(&tip.hash)),
            epoch: self.epoch,
            chain_id: self.chain_id,
        }
    }
}

/// An immutable snapshot of the tracker: resolves block parameters without locks.
#[derive(Debug, Clone, Default)]
pub struct ChainView {
    hashes: Arc<BTreeMap<u64, String>>,
    /// The node's safe height.
    pub safe: Option<u64>,
    /// The node's finalized height.
    pub finalized: Option<u64>,
    /// The head at which `safe` and `finalized` were read. They are always true lower bounds
    /// (finality only moves forward), but the `safe` and `finalized` tags resolve only while
    /// this is the head: after, the node may have moved them.
    pub finality_at: Option<u64>,
    /// The head's header as it was fed (a notification's carries the fees and gas).
    pub tip: Option<Arc<Header>>,
    /// Counts reorgs seen; an answer planned in one epoch must not be stored in another.
    pub epoch: u64,
    /// The node's chain id, once known.
    pub chain_id: Option<u64>,
}

/// A block parameter resolved against a [`ChainView`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A block of the canonical chain.
    Block {
        /// Its height.
        number: u64,
        /// Its hash when the view knows it.
        hash: Option<String>,
        /// At or below the finalized height: can never change.
        finalized: bool,
    },
    /// A block named by hash: its content can never change.
    Hash(String),
    /// `pending`, a height beyond the head, or one the view cannot vouch for.
    Unresolvable,
}

impl ChainView {
    /// The head: height and hash.
    pub fn latest(&self) -> Option<(u64, &str)> {
        self.hashes.last_key_value().map(|(n, h)| (*n, h.as_str()))
    }

    /// The oldest block the window holds: height and hash.
    pub fn oldest(&self) -> Option<(u64, &str)> {
        self.hashes.first_key_value().map(|(n, h)| (*n, h.as_str()))
    }

    /// The hash of a recent canonical block.
    pub fn hash_of(&self, number: u64) -> Option<&str> {
        self.hashes.get(&number).map(String::as_str)
    }

    /// Whether `safe` and `finalized` were read at the head this view shows.
    pub fn finality_is_current(&self) -> bool {
        self.finality_at.is_some() && self.finality_at == self.latest().map(|(n, _)| n)
    }

    /// True when `number` can never be reorganised.
    pub fn is_finalized(&self, number: u64) -> bool {
        self.finalized.is_some_and(|f| number <= f)
    }

    /// Resolves a block parameter. A height is resolvable when it is finalized, or when the
    /// view knows its hash (so a cache key can name the exact block).
    pub fn resolve(&self, tag: &BlockTag) -> Resolved {
        let number = match tag {
            BlockTag::Hash(hash) => return Resolved::Hash(hash.clone()),
            BlockTag::Pending => return Resolved::Unresolvable,
            BlockTag::Latest => self.latest().map(|(n, _)| n),
            BlockTag::Safe => self.safe.filter(|_| self.finality_is_current()),
            BlockTag::Finalized => self.finalized.filter(|_| self.finality_is_current()),
            BlockTag::Earliest => Some(0),
            BlockTag::Number(n) => Some(*n),
        };
        let (Some(number), Some((latest, _))) = (number, self.latest()) else {
            return Resolved::Unresolvable;
        };
        if number > latest {
            return Resolved::Unresolvable;
        }
        let hash = self.hash_of(number).map(str::to_owned);
        let finalized = self.is_finalized(number);
        if hash.is_none() && !finalized {
            return Resolved::Unresolvable;
        }
        Resolved::Block { number, hash, finalized }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(number: u64, fork: char) -> Header {
        let hash = |n: u64, f: char| format!("0x{f}{n:063x}");
        let parent_fork = if number == 0 { 'a' } else { fork };
        Header::new(number, hash(number, fork), if number == 0 { hash(0, 'z') } else { hash(number - 1, parent_fork) })
    }

    fn chain(t: &mut HeadTracker, range: std::ops::RangeInclusive<u64>, fork: char) {
        for n in range {
            assert_ne!(t.feed(h(n, fork)), Feed::Stale);
        }
    }

    #[test]
    fn headers_read_from_text_and_from_values() {
        let text = r#"{"number":"0x0","hash":"0xAB","parentHash":"0x00","miner":"0x1"}"#;
        let from_text: Header = serde_json::from_str(text).unwrap();
        let from_value: Header = serde_json::from_value(serde_json::from_str(text).unwrap()).unwrap();
        assert_eq!(from_text, from_value);
        assert_eq!((from_text.number, from_text.hash.as_str()), (0, "0xab"));
    }

    #[test]
    fn extends_and_ignores_duplicates() {
        let mut t = HeadTracker::new(16);
        assert_eq!(t.feed(h(5, 'a')), Feed::Extended);
        assert_eq!(t.feed(h(6, 'a')), Feed::Extended);
        assert_eq!(t.feed(h(6, 'a')), Feed::Known);
        assert_eq!(t.latest(), Some(6));
    }

    #[test]
    fn a_new_block_at_a_known_height_is_a_reorg() {
        let mut t = HeadTracker::new(16);
        chain(&mut t, 0..=5, 'a');
        // Block 5 on fork b has parent 4 on fork b, which we do not have.
        assert_eq!(t.feed(h(5, 'b')), Feed::NeedParent { number: 4, hash: h(4, 'b').hash });
        assert_eq!(t.feed(h(4, 'b')), Feed::NeedParent { number: 3, hash: h(3, 'b').hash });
        // Fork b's block 3 builds on fork a's block 2 in this test.
        let mut three = h(3, 'b');
        three.parent_hash = h(2, 'a').hash;
        let epoch = t.view().epoch;
        assert_eq!(t.feed(three), Feed::Reorg { fork_point: 3 });
        assert_eq!(t.feed(h(4, 'b')), Feed::Extended);
        assert_eq!(t.feed(h(5, 'b')), Feed::Extended);
        let view = t.view();
        assert_eq!(view.epoch, epoch + 1);
        assert_eq!(view.hash_of(2), Some(h(2, 'a').hash.as_str()));
        assert_eq!(view.hash_of(4), Some(h(4, 'b').hash.as_str()));
    }

    #[test]
    fn a_gap_asks_for_the_missing_parents() {
        let mut t = HeadTracker::new(16);
        chain(&mut t, 0..=3, 'a');
        assert_eq!(t.feed(h(6, 'a')), Feed::NeedParent { number: 5, hash: h(5, 'a').hash });
    }

    #[test]
    fn a_shorter_fork_drops_the_blocks_above_it() {
        let mut t = HeadTracker::new(16);
        chain(&mut t, 0..=6, 'a');
        let mut four = h(4, 'b');
        four.parent_hash = h(3, 'a').hash;
        assert_eq!(t.feed(four), Feed::Reorg { fork_point: 4 });
        assert_eq!(t.latest(), Some(4));
    }

    #[test]
    fn the_window_is_bounded_and_deeper_reorgs_reset() {
        let mut t = HeadTracker::new(4);
        chain(&mut t, 0..=9, 'a');
        assert_eq!(t.view().hash_of(5), None);
        assert_eq!(t.feed(h(3, 'a')), Feed::Stale);
        // A block at the lowest tracked height whose parent we cannot see.
        assert_eq!(t.feed(h(6, 'b')), Feed::Reorg { fork_point: 6 });
        assert_eq!(t.latest(), Some(6));
    }

    #[test]
    fn resolves_tags_against_the_view() {
        let mut t = HeadTracker::new(8);
        assert_eq!(t.view().resolve(&BlockTag::Latest), Resolved::Unresolvable, "no head yet");
        chain(&mut t, 0..=20, 'a');
        t.set_finalized(10);
        t.set_safe(15);
        t.set_finalized(9); // never moves back
        let v = t.view();
        let hash = |n| Some(h(n, 'a').hash);
        assert_eq!(v.resolve(&BlockTag::Latest), Resolved::Block { number: 20, hash: hash(20), finalized: false });
        assert_eq!(v.resolve(&BlockTag::Safe), Resolved::Block { number: 15, hash: hash(15), finalized: false });
        assert_eq!(v.resolve(&BlockTag::Finalized), Resolved::Block { number: 10, hash: None, finalized: true });
        assert_eq!(v.resolve(&BlockTag::Earliest), Resolved::Block { number: 0, hash: None, finalized: true });
        assert_eq!(v.resolve(&BlockTag::Number(21)), Resolved::Unresolvable, "beyond the head");
        assert_eq!(v.resolve(&BlockTag::Pending), Resolved::Unresolvable);
        let mut unfinalized = HeadTracker::new(4);
        chain(&mut unfinalized, 0..=20, 'a');
        assert_eq!(unfinalized.view().resolve(&BlockTag::Number(3)), Resolved::Unresolvable, "no hash, not final");
    }

    #[test]
    fn safe_and_finalized_resolve_only_at_the_head_they_were_read_at() {
        let mut t = HeadTracker::new(8);
        chain(&mut t, 0..=20, 'a');
        t.set_finalized(10);
        t.set_safe(15);
        assert!(t.view().finality_is_current());
        chain(&mut t, 21..=21, 'a');
        let v = t.view();
        assert!(!v.finality_is_current(), "the node may have moved them with block 21");
        assert_eq!(v.resolve(&BlockTag::Finalized), Resolved::Unresolvable, "goes to the node as sent");
        assert_eq!(v.resolve(&BlockTag::Safe), Resolved::Unresolvable);
        assert!(v.is_finalized(10), "still a true lower bound for what can never change");
    }

    #[test]
    fn the_view_carries_the_head_header_as_fed() {
        let mut t = HeadTracker::new(8);
        let text = r#"{"number":"0x5","hash":"0xa5","parentHash":"0xa4","timestamp":"0x10","gasLimit":"0x1c9c380",
            "gasUsed":"0x5208","baseFeePerGas":"0x7","stateRoot":"0x00"}"#;
        let header: Header = serde_json::from_str(text).expect("a header");
        t.feed(header.clone());
        let tip = t.view().tip.expect("the head's header");
        assert_eq!(
            (tip.base_fee, tip.gas_limit, tip.gas_used, tip.timestamp),
            (Some(7), Some(30_000_000), Some(21_000), Some(16))
        );
        // A header that only links (a parent fetched below the head) does not replace it.
        t.feed(Header::new(4, "0xa4".into(), "0xa3".into()));
        assert_eq!(t.view().tip.map(|h| h.number), Some(5));
        // A reorg at the head replaces it.
        t.feed(Header::new(5, "0xb5".into(), "0xa4".into()));
        assert_eq!(t.view().tip.map(|h| h.hash.clone()), Some("0xb5".to_owned()));
    }

    #[test]
    fn backfill_links_downwards_within_the_window() {
        let mut t = HeadTracker::new(4);
        t.feed(h(10, 'a'));
        assert_eq!(t.room_below(), 3);
        assert!(!t.prepend(h(8, 'a')), "not adjacent");
        assert!(!t.prepend(h(9, 'b')), "another branch");
        assert!(t.prepend(h(9, 'a')));
        assert!(t.prepend(h(8, 'a')));
        assert!(t.prepend(h(7, 'a')));
        assert_eq!(t.room_below(), 0);
        assert!(!t.prepend(h(6, 'a')), "window full");
        assert_eq!(t.view().hash_of(7), Some(h(7, 'a').hash.as_str()));
        assert_eq!(t.feed(h(11, 'a')), Feed::Extended, "the head still extends");
    }
}
