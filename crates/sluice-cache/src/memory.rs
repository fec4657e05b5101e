//! The in-process tier: moka (TinyLFU admission, LRU eviction) bounded by bytes.

use std::sync::Arc;

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

/// Bytes counted per entry beyond its key and result (moka's node, the Arc, the Box).
const OVERHEAD: usize = 128;

/// The memory tier.
pub struct MemoryTier {
    cache: moka::sync::Cache<String, Arc<Entry>>,
}

impl MemoryTier {
    /// A tier holding at most `max_bytes` of keys and results.
    pub fn new(max_bytes: u64) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|key: &String, entry: &Arc<Entry>| {
                u32::try_from(key.len() + entry.result.get().len() + OVERHEAD).unwrap_or(u32::MAX)
            })
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
        Self { cache }
    }

    /// Looks a key up.
    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        self.cache.get(key)
    }

    /// Stores an entry (moka may decline to admit it if it is colder than what it would evict).
    pub fn insert(&self, key: String, entry: Entry) {
        self.cache.insert(key, Arc::new(entry));
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
