//! A pool that can be replaced while it serves: a reload (SIGHUP) builds a new [`UpstreamPool`] from
//! the new upstream list and puts it in place. Calls already in flight finish on the pool they
//! started with, which is dropped (its prober with it) once the last of them is done; every
//! layer above (cache, coalescing, mempool relay, head watcher) keeps its place and its state.

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;

use super::{Node, UpstreamPool};
use crate::{Answer, Call, UpstreamError, Upstreams};

/// The pool in force for one network, replaceable at once.
pub struct LivePool<N: Node> {
    current: ArcSwap<UpstreamPool<N>>,
}

impl<N: Node> LivePool<N> {
    /// Serves through `pool` until [`LivePool::replace`].
    pub fn new(pool: Arc<UpstreamPool<N>>) -> Self {
        Self { current: ArcSwap::new(pool) }
    }

    /// Puts `pool` in force for the calls that start from now on.
    pub fn replace(&self, pool: Arc<UpstreamPool<N>>) {
        // The chain's pace is the chain's, not the pool's: the new pool knows it at once.
        if let Some(interval) = self.current().block_interval() {
            pool.set_block_interval(interval);
        }
        self.current.store(pool);
    }

    /// The pool in force.
    pub fn current(&self) -> Arc<UpstreamPool<N>> {
        self.current.load_full()
    }
}

#[async_trait]
impl<N: Node> Upstreams for LivePool<N> {
    async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
        // The pool's own method, not its `Upstreams::call`: one boxed future per call, not two.
        self.current().answer(call).await
    }

    async fn call_batch(&self, calls: &[&Call]) -> Vec<Result<Answer, UpstreamError>> {
        self.current().answer_batch(calls).await
    }

    fn member_head(&self, member: &str, number: u64, hash: &str) {
        self.current().member_head(member, number, hash);
    }

    fn block_interval(&self, interval: std::time::Duration) {
        self.current().set_block_interval(interval);
    }

    fn recently_alive(&self) -> bool {
        self.current().recently_alive()
    }
}
