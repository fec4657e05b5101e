//! Lanes: the threads that serve client connections, each driving its own connections from
//! the first byte to the last.
//!
//! On tokio's shared work-stealing runtime, a call hops threads: the worker that reads the
//! caller's request is often not the one that drives the node connection, or the one woken when
//! the node answers. Each hop is a futex wake-up and a cold cache on the other core: on two
//! cores, about 20 µs per call at one caller, more than the gateway's own work adds
//! (docs/benchmarks-wrk.md, "Lanes"). A lane is one thread with a
//! single-threaded runtime; a connection accepted on the shared runtime is handed to the lane
//! with the fewest open connections and stays there, and the lane keeps its own keep-alive
//! connections to the nodes ([`sluice_upstream::lane`]), so that a call is read, forwarded,
//! answered and written by one thread. This is how Envoy's workers and nginx's worker
//! processes serve connections.
//!
//! What a lane gives up is work stealing: a connection's calls run on its lane even when
//! another lane is idle. Calls are I/O waits and short bursts of work, so lanes stay even by
//! connection count; everything long-running (head tracking, probes, the mempool, the mesh)
//! stays on the shared runtime. `[limits] lanes = 0` serves on the shared runtime instead.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The lane threads, and how many connections each has open. Dropping it stops them; the
/// tasks still on them (whatever outlived the shutdown grace) are dropped with their runtimes.
pub struct Lanes {
    lanes: Vec<Lane>,
}

struct Lane {
    runtime: Handle,
    open: Arc<AtomicUsize>,
    /// Dropped to end the lane's thread.
    _stop: oneshot::Sender<()>,
}

/// One open connection's place on its lane; dropping it frees the place.
struct Seat {
    open: Arc<AtomicUsize>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Lanes {
    /// Starts `n` lanes (threads `sluice-lane-1`…), none for 0.
    pub fn start(n: usize) -> io::Result<Self> {
        let mut lanes = Vec::with_capacity(n);
        for number in 1..=n {
            // Before the lane sleeps in the driver, it yields its core once. Where it shares cores
            // with other busy threads (the other lane, the node, a load generator), whatever runs
            // in that moment usually sends this lane's next requests, and the lane then finds
            // them ready instead of sleeping and being woken: on two cores, about a tenth less CPU
            // per cached call and a seventh more calls answered (docs/benchmarks-wrk.md, "A lane
            // yields before it sleeps").
            // With nothing else runnable the yield returns at once and the lane sleeps as before:
            // one system call per sleep, no spinning (`an_idle_lane_sleeps` below).
            let runtime = Builder::new_current_thread().enable_all().on_thread_park(std::thread::yield_now).build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new().name(format!("sluice-lane-{number}")).spawn(move || {
                sluice_upstream::lane::enter(number);
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                // Whatever is left (connections past the grace period) is dropped, not waited on.
                runtime.shutdown_background();
            })?;
            lanes.push(Lane { runtime: handle, open: Arc::default(), _stop: stop });
        }
        Ok(Self { lanes })
    }

    /// No lanes: connections are served on the shared runtime.
    pub fn none() -> Self {
        Self { lanes: Vec::new() }
    }

    /// Runs `serve` (one connection's whole life) on the lane with the fewest open connections,
    /// or on the shared runtime when there are no lanes. `serve` is called on the lane, so that
    /// the sockets it registers belong to the lane's own driver.
    pub fn spawn<F, Fut>(&self, serve: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let open: Vec<usize> = self.lanes.iter().map(|lane| lane.open.load(Ordering::Relaxed)).collect();
        match least_busy(&open).and_then(|i| self.lanes.get(i)) {
            Some(lane) => {
                lane.open.fetch_add(1, Ordering::Relaxed);
                let seat = Seat { open: lane.open.clone() };
                lane.runtime.spawn(async move {
                    let _seat = seat;
                    serve().await;
                });
            }
            None => {
                tokio::spawn(async move { serve().await });
            }
        }
    }
}

/// The lane a new connection goes to: the one with the fewest open, the first of equals (a
/// pure decision, tested below).
pub fn least_busy(open: &[usize]) -> Option<usize> {
    open.iter().enumerate().min_by_key(|&(i, n)| (*n, i)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn a_new_connection_goes_to_the_lane_with_fewest_open() {
        assert_eq!(least_busy(&[]), None);
        assert_eq!(least_busy(&[0]), Some(0));
        assert_eq!(least_busy(&[3, 1, 2]), Some(1));
        assert_eq!(least_busy(&[2, 2, 2]), Some(0));
        assert_eq!(least_busy(&[5, 4, 4]), Some(1));
    }

    /// Connections spread over the lanes as they open, and each runs on its lane's one thread,
    /// marked as that lane for the upstream keep-alive stacks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_spread_over_lanes_and_stay_on_their_thread() {
        let lanes = Lanes::start(2).unwrap();
        assert_eq!(lanes.lanes.len(), 2);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (release, released) = tokio::sync::watch::channel(false);
        let (done_tx, mut done) = tokio::sync::mpsc::channel(4);
        for _ in 0..4 {
            let (seen, mut released, done_tx) = (seen.clone(), released.clone(), done_tx.clone());
            lanes.spawn(move || async move {
                let first = (std::thread::current().name().map(str::to_owned), sluice_upstream::lane::current());
                // Held open until all four have started, so the counts say 2 and 2.
                let _ = released.wait_for(|r| *r).await;
                tokio::task::yield_now().await;
                let after = (std::thread::current().name().map(str::to_owned), sluice_upstream::lane::current());
                seen.lock().unwrap().push((first, after));
                let _ = done_tx.send(()).await;
            });
        }
        let open: Vec<usize> = lanes.lanes.iter().map(|l| l.open.load(Ordering::Relaxed)).collect();
        assert_eq!(open, [2, 2]);
        release.send(true).unwrap();
        for _ in 0..4 {
            done.recv().await.unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        for (first, after) in &seen {
            assert_eq!(first, after, "a connection's task stayed on its lane");
            let (name, lane) = first;
            assert_eq!(name.as_deref(), Some(format!("sluice-lane-{lane}").as_str()));
        }
        let mut lanes_used: Vec<usize> = seen.iter().map(|(first, _)| first.1).collect();
        lanes_used.sort_unstable();
        assert_eq!(lanes_used, [1, 1, 2, 2]);
        // Seats are freed as connections end.
        for _ in 0..100 {
            if lanes.lanes.iter().all(|l| l.open.load(Ordering::Relaxed) == 0) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("seats were not freed");
    }

    /// A lane with nothing to do sleeps: yielding before each sleep never turns into spinning.
    #[tokio::test]
    async fn an_idle_lane_sleeps() {
        /// This thread's user + system CPU time, in clock ticks (USER_HZ, 100 per second).
        fn cpu_ticks() -> u64 {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
            // utime and stime are fields 14 and 15; the text after the name starts at field 3.
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
        }
        let lanes = Lanes::start(1).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        lanes.spawn(move || async move {
            let (before, started) = (cpu_ticks(), std::time::Instant::now());
            // Forty sleeps: the lane parks (and yields first) forty times.
            for _ in 0..40 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let _ = tx.send((cpu_ticks() - before, started.elapsed()));
        });
        let (ticks, elapsed) = rx.await.unwrap();
        assert!(elapsed >= std::time::Duration::from_millis(400));
        // A lane that spun would have used about as much CPU as time went by (40 ticks or more).
        assert!(ticks <= 10, "an idle lane used {ticks} ticks of CPU in {elapsed:?}");
    }

    #[tokio::test]
    async fn without_lanes_connections_run_on_the_shared_runtime() {
        let lanes = Lanes::start(0).unwrap();
        assert!(lanes.lanes.is_empty());
        let (tx, rx) = tokio::sync::oneshot::channel();
        lanes.spawn(move || async move {
            let _ = tx.send(sluice_upstream::lane::current());
        });
        assert_eq!(rx.await.unwrap(), 0);
    }
}
