//! Which headers sluice trusts, and why (pure: the fetching is the layer's, in `linking`).
//!
//! A header is trusted once its hash was recomputed from its fields and one of these holds:
//! * **agreed**: `agree` members named that hash at its height (with `agree = 1`, the head
//!   tracker's hash, checked by the member that sent the header);
//! * **linked**: it is an ancestor of a trusted header, reached by `parentHash` (a block
//!   below the head tracker's window), or, with a checkpoint pinned, its chain of parents
//!   reaches the checkpoint;
//! * **checkpoint**: its hash is the one pinned in the configuration.
//!
//! With a checkpoint, agreement alone is not enough: a header must also descend from it, so
//! that no set of members can rewrite the history before it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use alloy_primitives::{Bloom, B256};
use serde::{Deserialize, Serialize};

use crate::header::CheckedHeader;
use crate::Unverified;

/// A block pinned as trusted (`[verify] checkpoint = { number = …, hash = "0x…" }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Its height.
    pub number: u64,
    /// Its hash.
    pub hash: B256,
}

/// Why a header is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustSource {
    /// Named at its height by `agree` members.
    Agreed,
    /// Reached by `parentHash` from a trusted header, or linked to the checkpoint.
    Linked,
    /// Pinned in the configuration.
    Checkpoint,
}

impl TrustSource {
    /// Its label in metrics and `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustSource::Agreed => "agreed",
            TrustSource::Linked => "linked",
            TrustSource::Checkpoint => "checkpoint",
        }
    }
}

/// A trusted header: what reads at its block are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trusted {
    /// Its height.
    pub number: u64,
    /// Its hash.
    pub hash: B256,
    /// Its parent's hash.
    pub parent: B256,
    /// The state root reads at it are proven against.
    pub state_root: B256,
    /// The bloom of its logs (verified log queries skip the blocks it rules out).
    pub logs_bloom: Bloom,
    /// Why it is trusted.
    pub source: TrustSource,
}

impl Trusted {
    /// A checked header, trusted for `source`.
    pub fn from_checked(header: &CheckedHeader, source: TrustSource) -> Self {
        Self {
            number: header.number,
            hash: header.hash,
            parent: header.parent,
            state_root: header.state_root,
            logs_bloom: header.logs_bloom,
            source,
        }
    }
}

/// The trusted headers a network's verifying step keeps, shared with `/status`.
pub type SharedTrust = Arc<Mutex<TrustStore>>;

/// Trusted headers kept per network (the highest): about 1.7 MiB (a header's logs bloom is 256 bytes).
pub const TRUSTED_HEADERS: usize = 4096;

/// An empty store for one network.
pub fn shared_trust() -> SharedTrust {
    Arc::new(Mutex::new(TrustStore::new(TRUSTED_HEADERS)))
}

/// The trusted headers, the highest `cap` kept (a header evicted is checked again when a read
/// needs it). Bounded: about 150 bytes a header.
#[derive(Debug)]
pub struct TrustStore {
    by_hash: HashMap<B256, Trusted>,
    by_height: BTreeSet<(u64, B256)>,
    cap: usize,
    /// Headers trusted so far, by source (`[agreed, linked, checkpoint]`).
    counts: [u64; 3],
}

impl TrustStore {
    /// An empty store keeping at most `cap` headers.
    pub fn new(cap: usize) -> Self {
        Self { by_hash: HashMap::new(), by_height: BTreeSet::new(), cap: cap.max(1), counts: [0; 3] }
    }

    /// The trusted header `hash`, if it is one.
    pub fn get(&self, hash: &B256) -> Option<Trusted> {
        self.by_hash.get(hash).copied()
    }

    /// Trusts `header`; the lowest is forgotten past the cap.
    pub fn insert(&mut self, header: Trusted) {
        if self.by_hash.insert(header.hash, header).is_some() {
            return;
        }
        self.by_height.insert((header.number, header.hash));
        self.counts[header.source as usize] += 1;
        while self.by_hash.len() > self.cap {
            match self.by_height.pop_first() {
                Some((_, lowest)) => {
                    self.by_hash.remove(&lowest);
                }
                None => break,
            }
        }
    }

    /// How many headers it holds. A header a reorg left behind stays until evicted: reads
    /// by height take the head tracker's hash, and reads by hash are checked against the
    /// tracker's window first, so it is never asked for again.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether it holds no header.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The highest and lowest trusted heights.
    pub fn span(&self) -> Option<(u64, u64)> {
        Some((self.by_height.first()?.0, self.by_height.last()?.0))
    }

    /// Headers trusted so far by source: agreed, linked, checkpoint.
    pub fn counts(&self) -> [u64; 3] {
        self.counts
    }
}

/// Checks that `header`, fetched as the block at height `number` whose hash its child named
/// (`expected`), is that block: the same hash (recomputed) and height.
pub fn links(header: &CheckedHeader, number: u64, expected: B256) -> Result<(), Unverified> {
    if header.hash != expected || header.number != number {
        return Err(Unverified::Header(format!(
            "block {number} should be {expected} (its child's parent), the member sent {} at {}",
            header.hash, header.number
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(number: u64) -> Trusted {
        let hash = |n: u64| B256::with_last_byte(n as u8);
        Trusted {
            number,
            hash: hash(number),
            parent: hash(number.wrapping_sub(1)),
            state_root: B256::ZERO,
            logs_bloom: Bloom::ZERO,
            source: TrustSource::Agreed,
        }
    }

    #[test]
    fn the_lowest_headers_are_forgotten_past_the_cap() {
        let mut store = TrustStore::new(3);
        for n in [5, 9, 7, 8, 6] {
            store.insert(header(n));
        }
        assert_eq!(store.len(), 3);
        assert_eq!(store.span(), Some((7, 9)));
        assert!(store.get(&header(5).hash).is_none() && store.get(&header(9).hash).is_some());
        store.insert(header(9));
        assert_eq!(store.counts(), [5, 0, 0], "a header trusted again is not counted twice");
    }

    #[test]
    fn a_header_links_only_as_the_parent_its_child_named() {
        let checked = |n: u64| CheckedHeader {
            hash: B256::with_last_byte(n as u8),
            number: n,
            parent: B256::with_last_byte(n as u8 - 1),
            state_root: B256::ZERO,
            logs_bloom: Bloom::ZERO,
        };
        assert!(links(&checked(4), 4, B256::with_last_byte(4)).is_ok());
        assert!(matches!(links(&checked(4), 4, B256::with_last_byte(9)), Err(Unverified::Header(_))));
        assert!(links(&checked(4), 5, B256::with_last_byte(4)).is_err(), "the right hash at the wrong height");
    }
}
