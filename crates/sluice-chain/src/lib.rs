//! Ethereum vocabulary shared by sluice's components. Pure code: no sockets, no tasks.
//!
//! * [`BlockTag`]: what a block parameter names (`latest`, a number, a hash, …).
//! * [`HeadTracker`]: fed block headers as they arrive, it keeps the recent canonical chain,
//!   detects reorgs and says when it needs a parent it has not seen.
//! * [`BlockNeed`]: which block a call needs, read once from its method and params.
//! * [`ChainView`]: an immutable snapshot of the tracker that resolves tags without locks.
//! * [`named_block`]: the block an answer names (a receipt's, a block's, the newest log's).
//! * [`methods`]: the method table, everything sluice decides by a method's name.

mod cadence;
pub mod methods;
mod named;
mod need;
mod tag;
mod tracker;

pub use cadence::{Cadence, FinalityClock, FINALITY_EVERY};
pub use methods::{info as method_info, MethodInfo};
pub use named::{may_name_block, named_block, NamedBlock};
pub use need::BlockNeed;

pub use tag::parse_quantity;
pub use tag::BlockTag;
pub use tracker::{ChainEvent, ChainView, Feed, HeadTracker, Header, Resolved};
