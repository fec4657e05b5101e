//! Ethereum vocabulary shared by sluice's components. Pure code: no sockets, no tasks.
//!
//! * [`BlockTag`]: what a block parameter names (`latest`, a number, a hash, …).
//! * [`HeadTracker`]: fed block headers as they arrive, it keeps the recent canonical chain,
//!   detects reorgs and says when it needs a parent it has not seen.
//! * [`ChainView`]: an immutable snapshot of the tracker that resolves tags without locks.

mod tag;
mod tracker;

pub use tag::parse_quantity;
pub use tag::BlockTag;
pub use tracker::{ChainEvent, ChainView, Feed, HeadTracker, Header, Resolved};
