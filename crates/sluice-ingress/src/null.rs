//! A stand-in pool that takes every transaction at once and only counts: for tests and
//! benchmarks that isolate the ingress's own speed and fairness from validation. It is named
//! as such wherever it is used; end-to-end tests use the real mempool.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use alloy_primitives::{Bytes, B256};
use async_trait::async_trait;
use sluice_mempool::{SubmitError, TxIntake, TxSource};

/// Counts what it is given; answers with the SHA-256 of the bytes as the "hash". A transaction
/// that is exactly `b"reject"` is refused, so error paths can be exercised.
#[derive(Debug, Default)]
pub struct CountingIntake {
    /// Transactions taken.
    pub taken: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
}

#[async_trait]
impl TxIntake for CountingIntake {
    async fn submit(&self, raw: Bytes, _origin: TxSource) -> Result<B256, SubmitError> {
        if raw.as_ref() == b"reject" {
            return Err(SubmitError::Unavailable("the counting intake refuses \"reject\"".into()));
        }
        self.taken.fetch_add(1, Relaxed);
        self.bytes.fetch_add(raw.len() as u64, Relaxed);
        let digest = ring::digest::digest(&ring::digest::SHA256, &raw);
        Ok(B256::from_slice(digest.as_ref()))
    }
}
