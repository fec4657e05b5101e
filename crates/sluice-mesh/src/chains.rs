//! Which chains' pools a node serves. Every transaction a node sends names its chain; the
//! receiver takes it into that chain's pool only, and refuses (and counts) one of a chain it
//! does not serve, without holding it against the sender.

use std::sync::Arc;

use sluice_mempool::TxIntake;

use crate::PoolContents;

/// The chain id of a node started with [`crate::Mesh::start`] (one pool, no chain named): its
/// messages carry 0, and it takes only messages that carry 0.
pub const UNNAMED_CHAIN: u64 = 0;

/// One chain's pool as the mesh sees it.
pub struct ChainPool {
    /// The chain id its transactions are signed for.
    pub chain_id: u64,
    /// Where received transactions of this chain go.
    pub intake: Arc<dyn TxIntake>,
    /// What the pool holds, handed to peers that connect.
    pub contents: Option<Arc<dyn PoolContents>>,
}

/// The pool for a received transaction: the one of the chain it names; the first pool when the
/// sender named none (a node of a version without chain ids). Pure.
pub fn pool_for(pools: &[ChainPool], named: Option<u64>) -> Option<&ChainPool> {
    match named {
        Some(chain) => pools.iter().find(|p| p.chain_id == chain),
        None => pools.first(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryPool;

    fn pool(chain_id: u64) -> ChainPool {
        let pool = Arc::new(MemoryPool::new().0);
        ChainPool { chain_id, intake: pool.clone(), contents: Some(pool) }
    }

    #[test]
    fn a_transaction_goes_to_its_chains_pool_or_nowhere() {
        let pools = [pool(1), pool(8453)];
        assert_eq!(pool_for(&pools, Some(8453)).map(|p| p.chain_id), Some(8453));
        assert_eq!(pool_for(&pools, Some(1)).map(|p| p.chain_id), Some(1));
        assert!(pool_for(&pools, Some(10)).is_none(), "a chain not served here");
        assert_eq!(pool_for(&pools, None).map(|p| p.chain_id), Some(1), "unnamed: the first");
        assert!(pool_for(&[], None).is_none());
    }
}
