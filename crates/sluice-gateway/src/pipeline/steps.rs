//! The steps a call takes below the gateway's own checks (admission, access, method policy,
//! key scope), in the one order every call takes them: over HTTP or a WebSocket, alone or in
//! a batch. The binary builds each step it configured and hands the set over; the order is
//! written here, once:
//!
//! ```text
//! mempool methods → eth_getLogs splitting → cache → coalescing → Multicall3 aggregation
//!   → verified reads → upstream pool
//! ```
//!
//! * the mempool answers pool methods and takes submissions before anything could answer them
//!   from elsewhere (sluice-mempool);
//! * logs splitting sits above the cache, so that each finalized chunk of a long range is
//!   cached by itself (sluice-upstream);
//! * the cache answers what it holds and pins what it can to a block (sluice-cache);
//! * coalescing joins identical calls in flight, cacheable or not (sluice-cache);
//! * aggregation folds `eth_call`s of one block into one Multicall3 call (sluice-multicall);
//! * verified reads answer state reads from proofs checked against trusted headers, just above
//!   the pool, so that what they answer is cached and joined as any answer (sluice-verify);
//! * the upstream pool routes, hedges, fails over, broadcasts (sluice-upstream).

use std::sync::Arc;

use sluice_upstream::Upstreams;

/// One step's layer, made over the steps below it.
pub type Layer = Box<dyn FnOnce(Arc<dyn Upstreams>) -> Arc<dyn Upstreams> + Send>;

/// The steps a network was configured with; `None` is a step left out.
#[derive(Default)]
pub struct Steps {
    /// Pool methods and submissions, answered by sluice's mempool.
    pub mempool: Option<Layer>,
    /// `eth_getLogs` over long ranges, cut into chunks the nodes accept.
    pub logs: Option<Layer>,
    /// The finality-aware cache.
    pub cache: Option<Layer>,
    /// Identical calls in flight joined.
    pub coalesce: Option<Layer>,
    /// `eth_call`s of one block folded into a Multicall3 call.
    pub aggregate: Option<Layer>,
    /// State reads answered from checked proofs.
    pub verify: Option<Layer>,
}

/// The steps stacked over the upstream pool.
pub struct Stacked {
    /// Where clients' calls go: every step.
    pub calls: Arc<dyn Upstreams>,
    /// Every step below the mempool's, for sluice's own reads (the subscription hub fetches
    /// blocks and logs cached and coalesced, and has no use for the pool's methods).
    pub reads: Arc<dyn Upstreams>,
}

impl Steps {
    /// Stacks the steps over `pool` in the order above.
    pub fn stack(self, pool: Arc<dyn Upstreams>) -> Stacked {
        // Bottom up: each step wraps the ones below it.
        let mut below = pool;
        for step in [self.verify, self.aggregate, self.coalesce, self.cache, self.logs].into_iter().flatten() {
            below = step(below);
        }
        let reads = below.clone();
        let calls = match self.mempool {
            Some(step) => step(below),
            None => below,
        };
        Stacked { calls, reads }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use sluice_upstream::{Answer, Call, UpstreamError};

    use super::*;

    type Trail = Arc<Mutex<Vec<&'static str>>>;

    /// A layer that writes its name on the call's trail and passes the call down.
    struct Named(&'static str, Trail, Option<Arc<dyn Upstreams>>);

    #[async_trait]
    impl Upstreams for Named {
        async fn call(&self, call: &Call) -> Result<Answer, UpstreamError> {
            self.1.lock().unwrap().push(self.0);
            match &self.2 {
                Some(below) => below.call(call).await,
                None => Err(UpstreamError::NoneAvailable),
            }
        }
    }

    fn step(name: &'static str, trail: &Trail) -> Option<Layer> {
        let trail = trail.clone();
        Some(Box::new(move |below| Arc::new(Named(name, trail, Some(below))) as Arc<dyn Upstreams>))
    }

    async fn trail_of(layer: &Arc<dyn Upstreams>, trail: &Trail) -> Vec<&'static str> {
        trail.lock().unwrap().clear();
        let _ = layer.call(&Call::internal("eth_chainId", None)).await;
        trail.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn a_call_takes_the_steps_in_the_one_order() {
        let trail = Trail::default();
        let pool = || Arc::new(Named("pool", trail.clone(), None)) as Arc<dyn Upstreams>;
        let steps = Steps {
            aggregate: step("aggregate", &trail),
            cache: step("cache", &trail),
            mempool: step("mempool", &trail),
            coalesce: step("coalesce", &trail),
            logs: step("logs", &trail),
            verify: step("verify", &trail),
        };
        let stacked = steps.stack(pool());
        let all = ["mempool", "logs", "cache", "coalesce", "aggregate", "verify", "pool"];
        assert_eq!(trail_of(&stacked.calls, &trail).await, all);
        assert_eq!(trail_of(&stacked.reads, &trail).await, all[1..]);
        let some = Steps { cache: step("cache", &trail), ..Steps::default() }.stack(pool());
        assert_eq!(trail_of(&some.calls, &trail).await, ["cache", "pool"]);
    }
}
