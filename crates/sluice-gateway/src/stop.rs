//! The signal that tells open connections and WebSocket sessions to finish and close.
//!
//! Every connection checks it each time its task wakes, that is at least once per request.
//! With a `tokio::sync::watch` that check locks the waiters' list every time (a few hundred
//! instructions per request, on a lock shared by all connections). Here a connection registers
//! its task's waker once, in its own slot, and a later check is one atomic load: it locks again
//! only if its task's waker changes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// The sending side: [`Stop::stop`] once, and every [`Stopped`] resolves.
#[derive(Default)]
pub struct Stop {
    signal: Arc<Signal>,
}

#[derive(Default)]
struct Signal {
    stopped: AtomicBool,
    /// The wakers of the tasks waiting, one slot each; emptied by `stop`.
    waiting: Mutex<slab::Slab<Waker>>,
}

impl Signal {
    fn waiting(&self) -> MutexGuard<'_, slab::Slab<Waker>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Stop {
    /// A signal not given yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle for a listener: cheap to clone, each clone makes its own waits.
    pub fn stopping(&self) -> Stopping {
        Stopping { signal: self.signal.clone() }
    }

    /// Gives the signal: every wait ends, now and later.
    pub fn stop(&self) {
        self.signal.stopped.store(true, Ordering::Release);
        // Taken after the flag is set: a wait that registers after this sees the flag under
        // the lock, so none is missed.
        let waiting = std::mem::take(&mut *self.signal.waiting());
        for (_, waker) in waiting {
            waker.wake();
        }
    }
}

/// The listening side, as held by the accept loop and the router.
#[derive(Clone)]
pub struct Stopping {
    signal: Arc<Signal>,
}

impl Stopping {
    /// True once the signal has been given.
    pub fn is_stopped(&self) -> bool {
        self.signal.stopped.load(Ordering::Acquire)
    }

    /// A wait that ends when the signal is given (at once if it has been).
    pub fn stopped(&self) -> Stopped {
        Stopped { signal: self.signal.clone(), slot: None }
    }
}

/// A wait for the signal. Polling it again with the same task costs one atomic load.
pub struct Stopped {
    signal: Arc<Signal>,
    /// Its slot among the waiting, with the waker it holds.
    slot: Option<(usize, Waker)>,
}

impl Future for Stopped {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.signal.stopped.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if this.slot.as_ref().is_some_and(|(_, waker)| waker.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        let mut waiting = this.signal.waiting();
        if this.signal.stopped.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        match &mut this.slot {
            Some((key, waker)) => {
                *waker = cx.waker().clone();
                if let Some(held) = waiting.get_mut(*key) {
                    *held = cx.waker().clone();
                }
            }
            None => {
                let key = waiting.insert(cx.waker().clone());
                this.slot = Some((key, cx.waker().clone()));
            }
        }
        Poll::Pending
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some((key, _)) = self.slot.take() {
            // After `stop` the slab is empty and takes no new slots, so the key is this
            // wait's or gone.
            self.signal.waiting().try_remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_wait_ends_when_the_signal_is_given_and_slots_are_freed() {
        let stop = Stop::new();
        let stopping = stop.stopping();
        let waits: Vec<_> = (0..100).map(|_| tokio::spawn(stopping.stopped())).collect();
        // A wait dropped before the signal gives its slot back.
        let dropped = tokio::spawn(stopping.stopped());
        tokio::task::yield_now().await;
        while stopping.signal.waiting().len() < 101 {
            tokio::task::yield_now().await;
        }
        dropped.abort();
        let _ = dropped.await;
        assert_eq!(stopping.signal.waiting().len(), 100);
        assert!(!stopping.is_stopped());
        stop.stop();
        for wait in waits {
            tokio::time::timeout(std::time::Duration::from_secs(5), wait).await.expect("woken").expect("ends");
        }
        assert!(stopping.signal.waiting().is_empty());
        // After the signal, a new wait ends at once.
        tokio::time::timeout(std::time::Duration::from_secs(5), stopping.stopped()).await.expect("ends at once");
        assert!(stopping.is_stopped());
    }

    #[tokio::test]
    async fn a_wait_polled_again_by_another_task_wakes_that_task() {
        let stop = Stop::new();
        let mut wait = Box::pin(stop.stopping().stopped());
        // Polled once by this task, then moved to another, which must be the one woken.
        assert!(futures_util::poll!(wait.as_mut()).is_pending());
        let mine = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        let other = tokio::spawn(wait);
        // Until the other task has polled it: the slot then holds that task's waker.
        let holds_mine = || stop.signal.waiting().get(0).is_some_and(|held| held.will_wake(&mine));
        for _ in 0..10_000 {
            if !holds_mine() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(!holds_mine(), "the slot still holds the first task's waker");
        assert!(!other.is_finished());
        stop.stop();
        tokio::time::timeout(std::time::Duration::from_secs(5), other).await.expect("woken").expect("ends");
    }
}
