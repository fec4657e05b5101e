//! sluice's mempool.
//!
//! Pure cores, no I/O, tested synchronously:
//! * [`decode()`]: EIP-2718 decoding, stateless checks and sender recovery;
//! * [`Pool`]: the nonce-ordered pool per sender with geth's rules (time passed in);
//! * [`relay::verdict`]: what a node's answer to a relayed transaction means.
//!
//! Around them, at the edges:
//! * [`Mempool`] (the [`TxIntake`] and [`PoolView`] seams): decoding and sender recovery on
//!   niced verifier threads ([`verify`]), an intake stage that attaches account state from the
//!   upstreams ([`state`]) a verifier turn at a time, one writer thread that batches inserts,
//!   journals ([`journal`]) and publishes a lock-free [`Snapshot`];
//! * [`MempoolLayer`]: the pool's JSON-RPC methods as a layer over the upstreams;
//! * relay and head maintenance tasks.

mod config;
mod core;
pub mod decode;
mod intake;
pub mod journal;
mod maintain;
mod pool;
pub mod relay;
pub mod rpc;
mod seams;
mod service;
pub mod state;
pub mod status;
pub mod verify;
pub mod view;
mod writer;

pub use config::MempoolConfig;
pub use decode::{decode, DecodeError, Rules};
pub use pool::{AsPoolTx, Config, InsertError, Inserted, Pool, PoolTx, Status};
pub use rpc::MempoolLayer;
pub use seams::{PoolView, SubmitError, TxIntake, TxSource, TxpoolMethod};
pub use service::Mempool;
pub use view::{Pooled, Snapshot};
