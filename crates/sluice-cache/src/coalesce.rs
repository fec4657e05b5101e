//! Coalescing: concurrent identical misses make one upstream call.
//!
//! The first caller for a key (the leader) starts the work in a task of its own, so a leader
//! whose client goes away does not cancel it for the others. Everyone, leader included, waits
//! on a watch channel for the result. If the task dies without a result, every waiter gets
//! `None` and reports an error instead of hanging.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tracing::Instrument;

/// Shares in-flight work by key.
pub struct Coalescer<K, V> {
    in_flight: Arc<Mutex<HashMap<K, watch::Receiver<Option<V>>>>>,
}

impl<K, V> Default for Coalescer<K, V> {
    fn default() -> Self {
        Self { in_flight: Arc::default() }
    }
}

impl<K, V> Coalescer<K, V>
where
    K: Hash + Eq + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Runs `work` for `key` unless the same key is in flight, and returns its result and
    /// whether this caller started it. `None` if the work panicked or was aborted.
    pub async fn run<F>(&self, key: K, work: impl FnOnce() -> F) -> (Option<V>, bool)
    where
        F: Future<Output = V> + Send + 'static,
    {
        let (mut rx, leader) = {
            let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&key) {
                Some(rx) => (rx.clone(), false),
                None => {
                    let (tx, rx) = watch::channel(None);
                    map.insert(key.clone(), rx.clone());
                    let in_flight = self.in_flight.clone();
                    let future = work();
                    // In the leader's span: its trace goes on in the task.
                    tokio::spawn(
                        async move {
                            // Removes the key even if `future` panics (the guard drops `tx` too).
                            let _guard = Remove { map: in_flight, key };
                            let value = future.await;
                            let _ = tx.send(Some(value));
                        }
                        .in_current_span(),
                    );
                    (rx, true)
                }
            }
        };
        let value = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone(),
            Err(_) => None,
        };
        (value, leader)
    }

    /// Keys in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().map(|m| m.len()).unwrap_or(0)
    }
}

struct Remove<K: Hash + Eq, V> {
    map: Arc<Mutex<HashMap<K, watch::Receiver<Option<V>>>>>,
    key: K,
}

impl<K: Hash + Eq, V> Drop for Remove<K, V> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_callers_share_one_run() {
        let coalescer = Arc::new(Coalescer::<u8, u32>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let (coalescer, runs) = (coalescer.clone(), runs.clone());
            tasks.push(tokio::spawn(async move {
                coalescer
                    .run(1, || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        7
                    })
                    .await
            }));
        }
        let mut leaders = 0;
        for t in tasks {
            let (value, leader) = t.await.unwrap();
            assert_eq!(value, Some(7));
            leaders += leader as usize;
        }
        assert_eq!((runs.load(Ordering::SeqCst), leaders), (1, 1));
        assert_eq!(coalescer.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_leader_does_not_cancel_the_work() {
        let coalescer = Arc::new(Coalescer::<u8, u32>::default());
        let leader = {
            let coalescer = coalescer.clone();
            tokio::spawn(async move {
                coalescer
                    .run(1, || async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        9
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let follower = {
            let coalescer = coalescer.clone();
            tokio::spawn(async move { coalescer.run(1, || async { unreachable!("coalesced") }).await })
        };
        leader.abort();
        assert_eq!(follower.await.unwrap(), (Some(9), false));
    }

    #[tokio::test]
    async fn a_panicking_run_releases_its_waiters() {
        let coalescer = Coalescer::<u8, u32>::default();
        let (value, _) = coalescer.run(1, || async { panic!("boom") }).await;
        assert_eq!(value, None);
        assert_eq!(coalescer.run(1, || async { 3 }).await, (Some(3), true), "the key is free again");
    }
}
