//! A stand-in pool for tests and benchmarks of the mesh alone: it takes any transaction once
//! (by keccak hash), refuses those starting with `0xff` as invalid, remembers when each arrived,
//! and reports each new one on a channel, as the real mempool's pending feed does, so a node
//! forwards what it takes. It is named as such wherever it is used; end-to-end tests use the
//! real mempool.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use alloy_primitives::{keccak256, Bytes, B256};
use async_trait::async_trait;
use sluice_mempool::{DecodeError, SubmitError, TxIntake, TxSource};
use tokio::sync::mpsc;

/// The stand-in pool.
#[derive(Debug)]
pub struct MemoryPool {
    seen: Mutex<HashMap<B256, (Instant, Bytes)>>,
    duplicates: std::sync::atomic::AtomicU64,
    new: mpsc::UnboundedSender<Vec<u8>>,
}

impl MemoryPool {
    /// A pool, and the receiver of the transactions it takes for the first time.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Vec<u8>>) {
        let (new, rx) = mpsc::unbounded_channel();
        (MemoryPool { seen: Mutex::new(HashMap::new()), duplicates: Default::default(), new }, rx)
    }

    /// Transactions held.
    pub fn len(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When `hash` arrived, if it did.
    pub fn arrived(&self, hash: &B256) -> Option<Instant> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(hash).map(|(at, _)| *at)
    }

    /// Submissions of a transaction already held.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[async_trait]
impl TxIntake for MemoryPool {
    async fn submit(&self, raw: Bytes, _origin: TxSource) -> Result<B256, SubmitError> {
        if raw.first() == Some(&0xff) {
            return Err(SubmitError::Invalid(DecodeError::Malformed("the memory pool refuses 0xff…".into())));
        }
        let hash = keccak256(&raw);
        let fresh = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            match seen.entry(hash) {
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert((Instant::now(), raw.clone()));
                    true
                }
            }
        };
        if fresh {
            let _ = self.new.send(raw.to_vec());
        } else {
            self.duplicates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(hash)
    }
}

impl crate::PoolContents for MemoryPool {
    fn transactions(&self) -> Vec<(B256, Bytes)> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(Instant, B256, Bytes)> = seen.iter().map(|(h, (at, raw))| (*at, *h, raw.clone())).collect();
        all.sort_by_key(|(at, _, _)| *at);
        all.into_iter().map(|(_, h, raw)| (h, raw)).collect()
    }
}
