//! The header-read deadline of one client connection, on one timer for the connection's life.
//!
//! hyper asks its [`Timer`] for a new sleep each time a connection starts reading a request's
//! head, and drops it once the head is in: with `TokioTimer`, one timer-wheel insert and
//! removal (each under the wheel's lock) and one allocation per request. Here each
//! connection keeps one tokio [`tokio::time::Sleep`]. A later deadline (the next request's)
//! leaves it where it is: when it goes off, the wait sees its own deadline is not reached and
//! sets the timer to it. So a busy connection touches the timer about once per client timeout,
//! not once per request; a wait already registered with its task costs a lock nobody else
//! takes and one atomic load when polled again. Only an earlier deadline than the timer's moves the timer back at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};

/// A [`Timer`] for one connection: every sleep it gives shares the connection's one timer.
pub struct HeaderTimer {
    shared: Arc<Mutex<Armed>>,
}

/// The connection's one timer, and the task it will wake when it goes off.
struct Armed {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Set once the timer has been polled by a task and not gone off since.
    polled_by: Option<Waker>,
}

impl HeaderTimer {
    /// A timer for a new connection (not armed until hyper first waits for a head).
    pub fn new() -> Self {
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        let armed = Armed { sleep: Box::pin(tokio::time::sleep_until(far)), polled_by: None };
        Self { shared: Arc::new(Mutex::new(armed)) }
    }
}

impl Default for HeaderTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl Timer for HeaderTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    /// tokio's clock, the one the deadlines are kept on.
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(Deadline { shared: self.shared.clone(), at: tokio::time::Instant::from_std(deadline) })
    }
}

/// One wait on the connection's timer, until `at`.
struct Deadline {
    shared: Arc<Mutex<Armed>>,
    at: tokio::time::Instant,
}

impl Sleep for Deadline {}

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Only this connection's task polls it: the lock is never contended.
        let mut armed = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let Armed { sleep, polled_by } = &mut *armed;
        if sleep.deadline() > self.at {
            sleep.as_mut().reset(self.at);
            *polled_by = None;
        }
        // The timer goes off at `at` or before, and will wake this task: nothing to do.
        if !sleep.is_elapsed() && polled_by.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        // The clock is read only once the timer goes off.
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) if tokio::time::Instant::now() >= self.at => {
                *polled_by = None;
                Poll::Ready(())
            }
            Poll::Ready(()) => {
                // It went off for an earlier deadline: on to this one.
                sleep.as_mut().reset(self.at);
                let _ = sleep.as_mut().poll(cx);
                *polled_by = Some(cx.waker().clone());
                Poll::Pending
            }
            Poll::Pending => {
                *polled_by = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_wait_ends_at_its_own_deadline_on_the_one_timer() {
        let timer = HeaderTimer::new();
        let start = tokio::time::Instant::now();
        timer.sleep(Duration::from_secs(2)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // A later wait moves the timer forward; one dropped half-way leaves it armed, harmlessly.
        let dropped = timer.sleep(Duration::from_secs(5));
        let _ = tokio::time::timeout(Duration::from_secs(1), dropped).await;
        timer.sleep(Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(13));
        // An earlier deadline than the one set takes the timer back.
        let _ = tokio::time::timeout(Duration::from_secs(1), timer.sleep(Duration::from_secs(60))).await;
        timer.sleep(Duration::from_secs(3)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(17));
    }
}
