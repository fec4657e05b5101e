//! The in-process tier: moka (TinyLFU admission, LRU eviction) bounded by bytes.
//!
//! Entries are kept under a 128-bit keyed hash of their cache key, not the key itself: a key
//! (method and canonical params, often longer than the answer) would be one more allocation
//! per entry, kept twice by moka. The hash is SipHash-1-3 (128-bit output) under this process's
//! random keys: a collision cannot be crafted without them, and by chance it takes about 2^64
//! entries.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;

use siphasher::sip128::{Hasher128, SipHasher13};

use moka::notification::RemovalCause;

/// One cached result.
#[derive(Debug)]
pub struct Entry {
    /// The `result` member, raw.
    pub result: sluice_jsonrpc::SharedRaw,
    /// The highest block the answer depends on, while it can still be reorganised; `None` when
    /// it can never change.
    pub max_block: Option<u64>,
}

/// Bytes an entry costs beyond its answer: moka's node, map slot and policy records, the
/// entry's own allocations. Measured: the process's growth per entry held, under the `sluice`
/// binary's allocator, filled with small answers (`tests/memory_bound.rs`).
const OVERHEAD: usize = 400;

/// The memory tier.
pub struct MemoryTier {
    cache: moka::sync::Cache<u128, Arc<Entry>>,
    /// The SipHash keys of this tier: random.
    keys: (u64, u64),
}

impl MemoryTier {
    /// A tier holding at most `max_bytes` of keys and results.
    pub fn new(max_bytes: u64) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_: &u128, entry: &Arc<Entry>| Self::weight(entry))
            .support_invalidation_closures()
            .eviction_listener(|_, _, cause| {
                let cause = match cause {
                    RemovalCause::Size => "size",
                    RemovalCause::Explicit => "reorg",
                    RemovalCause::Expired => "expired",
                    RemovalCause::Replaced => return,
                };
                metrics::counter!("sluice_cache_evictions_total", "cause" => cause).increment(1);
            })
            .build();
        // std's RandomState is seeded from the OS: two of its outputs are random keys.
        let seed = RandomState::new();
        Self { cache, keys: (seed.hash_one(0u8), seed.hash_one(1u8)) }
    }

    /// What an entry is counted as: what it costs in memory.
    pub fn weight(entry: &Entry) -> u32 {
        u32::try_from(entry.result.get().len() + OVERHEAD).unwrap_or(u32::MAX)
    }

    /// The 128-bit key an entry is kept under.
    fn id(&self, key: &str) -> u128 {
        let mut hasher = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        hasher.write(key.as_bytes());
        hasher.finish128().as_u128()
    }

    /// Looks a key up.
    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        self.cache.get(&self.id(key))
    }

    /// Stores an entry (moka may decline to admit it if it is colder than what it would evict).
    pub fn insert(&self, key: String, entry: Entry) {
        self.cache.insert(self.id(&key), Arc::new(entry));
    }

    /// Drops every entry that depends on a block at or above `fork_point`.
    pub fn evict_from(&self, fork_point: u64) {
        let dropped = self.cache.invalidate_entries_if(move |_, e| e.max_block.is_some_and(|b| b >= fork_point));
        if let Err(e) = dropped {
            tracing::error!(error = %e, "reorg eviction could not be scheduled");
        }
    }

    /// Bytes held now (after pending maintenance).
    pub fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: usize, max_block: Option<u64>) -> Entry {
        Entry {
            result: sluice_jsonrpc::RawValue::from_string(format!("\"{}\"", "x".repeat(bytes))).unwrap().into(),
            max_block,
        }
    }

    #[test]
    fn the_byte_bound_holds_with_large_entries() {
        let tier = MemoryTier::new(1 << 20);
        for i in 0..200 {
            tier.insert(format!("k{i}"), entry(50_000, None));
        }
        assert!(tier.weighted_size() <= 1 << 20, "{}", tier.weighted_size());
    }

    #[test]
    fn reorg_eviction_drops_only_entries_at_or_above_the_fork() {
        let tier = MemoryTier::new(1 << 20);
        tier.insert("final".into(), entry(1, None));
        tier.insert("b9".into(), entry(1, Some(9)));
        tier.insert("b10".into(), entry(1, Some(10)));
        tier.insert("b11".into(), entry(1, Some(11)));
        tier.evict_from(10);
        tier.weighted_size();
        assert!(tier.get("final").is_some() && tier.get("b9").is_some());
        assert!(tier.get("b10").is_none() && tier.get("b11").is_none());
    }
}
