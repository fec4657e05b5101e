//! Multicall3 aggregation: concurrent `eth_call` misses to the same block leave as one
//! `aggregate3` call to the canonical Multicall3 contract, and each caller gets exactly what a
//! direct call would have returned.
//!
//! * [`eligible`] (pure) says which calls an aggregate can carry exactly: only `to` and
//!   `data`, no sender, value, gas, fees or overrides.
//! * [`abi`] (pure) encodes `aggregate3` and reads its results.
//! * [`AggregateLayer`] is an [`Upstreams`](sluice_upstream::Upstreams) layer above the pool:
//!   it gathers eligible calls per block for a short window (or until `max_calls`), sends one
//!   aggregate, and answers each caller from it. A call that failed inside the aggregate (a
//!   revert, out of gas) is made again directly, so its error code, message and data are the
//!   node's own for that call alone; so is every call when the aggregate gives no usable answer.
//!   Multicall3's code is looked up once per network, and again after each reorg.

pub mod abi;
mod config;
mod eligible;
mod layer;
#[cfg(test)]
mod tests;

pub use config::AggregateConfig;
pub use eligible::{eligible, Eligible};
pub use layer::AggregateLayer;
