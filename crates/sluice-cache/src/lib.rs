//! The finality-aware response cache.
//!
//! * [`policy`]: which calls are cacheable, their keys and lifetimes (pure; the table is in its
//!   module docs and in `docs/cache.md`).
//! * [`Coalescer`]: concurrent identical misses share one upstream call.
//! * [`MemoryTier`]: moka, bounded by bytes; [`RedisTier`]: shared, fail-open.
//! * [`CacheLayer`]: all of it behind the `Upstreams` seam, wrapping the upstreams.
//! * [`CoalesceLayer`]: below the cache, every identical in-flight read joins one call.

mod coalesce;
mod inflight;
mod layer;
mod memory;
pub mod policy;
mod redis_tier;

pub use coalesce::Coalescer;
pub use inflight::CoalesceLayer;
pub use layer::CacheLayer;
pub use memory::{Entry, MemoryTier};
pub use redis_tier::{RedisConfig, RedisTier};
