//! sluice's transaction pool.
//!
//! [`Pool`] is the pure core: a nonce-ordered pool per sender with geth's rules, as plain
//! methods on a struct, no I/O, no locks, time passed in. The validating intake, relay,
//! journal and the RPC methods wrap it (issue 5; not wired yet).

pub mod decode;
pub mod journal;
mod pool;

pub use decode::{decode, DecodeError, Rules};
pub use pool::{Config, InsertError, Inserted, Pool, PoolTx, Status};
