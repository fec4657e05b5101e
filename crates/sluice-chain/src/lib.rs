//! Ethereum vocabulary shared by sluice's components. Pure code: no sockets, no tasks.
//!
//! * [`BlockTag`]: what a block parameter names (`latest`, a number, a hash, …).
//! * [`HeadTracker`]: fed block headers as they arrive, it keeps the recent canonical chain,
//!   detects reorgs and says when it needs a parent it has not seen.
//! * [`BlockNeed`]: which block a call needs, read once from its method and params.
//! * [`ChainView`]: an immutable snapshot of the tracker that resolves tags without locks.
//! * [`named_block`]: the block an answer names (a receipt's, a block's, the newest log's).

mod cadence;
mod named;
mod need;
mod tag;
mod tracker;

pub use cadence::{Cadence, FinalityClock, FINALITY_EVERY};
pub use named::{may_name_block, named_block, NamedBlock};
pub use need::{answers_null_when_unknown, block_position, reads_state, BlockNeed};

pub use tag::parse_quantity;
pub use tag::BlockTag;
pub use tracker::{ChainEvent, ChainView, Feed, HeadTracker, Header, Resolved};
