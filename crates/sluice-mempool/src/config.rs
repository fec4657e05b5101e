//! The mempool's settings.

use std::path::PathBuf;
use std::time::Duration;

use crate::journal::Sync;
use crate::Config;

/// Mempool settings.
#[derive(Debug, Clone)]
pub struct MempoolConfig {
    /// Pool rules (limits, price bump, minimum tip, priority senders).
    pub pool: Config,
    /// Largest raw transaction accepted, in bytes.
    pub max_tx_bytes: usize,
    /// Journal file; `None` keeps the pool in memory only (lost on a crash).
    pub journal: Option<PathBuf>,
    /// When journal writes reach the disk.
    pub sync: Sync,
    /// Forward accepted transactions to the upstreams.
    pub relay: bool,
    /// Send still-pending transactions again after this long.
    pub rebroadcast_interval: Duration,
    /// How often queued transactions are checked against their lifetime.
    pub expire_interval: Duration,
    /// Deadline for reading account state from the upstreams.
    pub state_timeout: Duration,
    /// Most submissions in flight at once; more are refused as busy.
    pub max_inflight: usize,
    /// Threads decoding and recovering senders (at a lower CPU priority than the readers).
    pub verify_threads: usize,
    /// Transactions waiting for a verifier at most; more are refused as busy.
    pub verify_queue: usize,
    /// Niceness of the verifier threads: above 0 the kernel serves the readers first when the
    /// CPU is short (reads stay fast under overload; ingest peaks lower).
    pub verify_nice: i32,
    /// How many departed transactions' statuses are remembered.
    pub status_capacity: u64,
    /// The id of the network this pool is for: the `network` label of its metrics.
    pub network: String,
}

impl Default for MempoolConfig {
    fn default() -> Self {
        Self {
            pool: Config::default(),
            max_tx_bytes: 128 * 1024,
            journal: None,
            sync: Sync::Os,
            relay: true,
            rebroadcast_interval: Duration::from_secs(12),
            expire_interval: Duration::from_secs(60),
            state_timeout: Duration::from_secs(5),
            max_inflight: 100_000,
            verify_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            verify_queue: 8_192,
            verify_nice: 10,
            status_capacity: 1 << 20,
            network: sluice_upstream::DEFAULT_NETWORK.into(),
        }
    }
}
