//! Where decoding and sender recovery run: a few dedicated threads at a lower CPU priority,
//! fed through a bounded queue.
//!
//! Recovery is the costliest step of ingest (tens of µs of secp256k1 per transaction). Run on
//! the async workers, a burst of submissions would queue every read behind it; here it runs
//! beside them, and the kernel gives the readers' threads the CPU first (the verifiers are
//! niced). The queue is bounded: when it is full, an outside caller is refused at once (`Busy`)
//! and internal work (journal replay, reorg re-injection, peers) waits for room, so nothing the
//! pool already holds or owes is ever dropped for being busy.
//!
//! A job's result goes either to its own waiter ([`Verifier::verify`]) or, with the results of
//! the other jobs of the same turn, as one group to the intake stage ([`Verifier::verify_then`]):
//! under load a turn holds several jobs, and one message per turn instead of one wake-up per
//! transaction is most of what keeps the intake close to the cost of recovery alone.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use alloy_primitives::{Bytes, B256};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::decode::{decode_new, Decoded};
use crate::{DecodeError, Rules};

/// What a verifier found: a new transaction (the pool's view of it, without its decoded
/// envelope, which was 400 of a pooled transaction's 592 bytes, moved through every stage and
/// held for its whole life while only the RPC renderings read it), or the hash of one the pool
/// already holds.
pub type Verified = Decoded;

/// Whether the pool already holds a transaction, by hash (read from its published snapshot).
pub type Known = Arc<dyn Fn(&B256) -> bool + Send + Sync>;

/// Where a job's result goes.
enum Deliver<T> {
    /// To its own waiter.
    Reply(oneshot::Sender<Result<Verified, DecodeError>>),
    /// With the turn's other results, to the intake stage, carrying `T` along.
    Group(T),
}

/// A transaction to verify, with its place in the queue (released once it is verified).
struct Verify<T> {
    raw: Bytes,
    rules: Arc<Rules>,
    deliver: Deliver<T>,
    _place: OwnedSemaphorePermit,
}

/// What a verifier thread is given.
enum Job<T> {
    Verify(Verify<T>),
    /// End the thread.
    Stop,
}

/// The results of one turn of one verifier for the intake stage, each with its ticket.
pub type Group<T> = Vec<(Result<Verified, DecodeError>, T)>;

/// Whether a caller waits for room in a full queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Refused at once (`Busy`): outside callers, who can retry.
    Refuse,
    /// Waits: internal work the pool must not drop.
    Wait,
}

/// Why a transaction could not be verified.
#[derive(Debug)]
pub enum VerifyError {
    /// It failed decoding or a stateless rule.
    Invalid(DecodeError),
    /// The queue is full.
    Busy,
    /// The verifier threads are gone.
    Stopped,
}

/// A handle to the verifier threads.
pub struct Verifier<T> {
    jobs: SyncSender<Job<T>>,
    /// One permit per queue place: waiting happens here, in async, not on the channel.
    room: Arc<Semaphore>,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// Jobs a verifier takes per turn at most (about 5 ms of recoveries). Each turn's results go
/// on as one group: one writer batch, one snapshot published, one journal write, one round of
/// wake-ups for the whole turn. Under a full queue, longer turns cost less per transaction
/// beyond recovery (16 to 64 took about a third off: docs/mempool.md, "Turns of 64, then
/// 128"; 256 gained nothing over 128). A turn is never more than the thread's share of the
/// queue, so the longer delay before a turn's first answer comes only with a long queue.
const TAKE: usize = 128;

/// A verifier's share of the jobs in the queue and in verification: what one turn takes, so
/// that a burst is split between the threads rather than taken whole by the first one awake.
fn share(in_queue: usize, threads: usize) -> usize {
    in_queue.div_ceil(threads.max(1)).clamp(1, TAKE)
}

impl<T: Send + 'static> Verifier<T> {
    /// Starts `threads` verifiers with a queue of `capacity` transactions, at niceness `nice`
    /// (0 is normal; higher yields the CPU to the readers' threads first); grouped results go
    /// to `groups`. Unbounded, it holds no more than the jobs admitted to the queue, each of
    /// which its submitter waits for. A transaction `known` already holds is answered as
    /// [`Verified::Known`] before its checks and recovery.
    pub fn start(
        threads: usize,
        capacity: usize,
        nice: i32,
        groups: mpsc::UnboundedSender<Group<T>>,
        known: Known,
    ) -> std::io::Result<Self> {
        let capacity = capacity.max(1);
        let threads = threads.max(1);
        let (jobs, rx) = sync_channel::<Job<T>>(capacity);
        let rx = Arc::new(Mutex::new(rx));
        let room = Arc::new(Semaphore::new(capacity));
        let mut handles = Vec::new();
        for i in 0..threads {
            let (rx, groups, room, known) = (rx.clone(), groups.clone(), room.clone(), known.clone());
            handles.push(std::thread::Builder::new().name(format!("mempool-verify-{i}")).spawn(move || {
                lower_priority(nice);
                let mut jobs = Vec::with_capacity(TAKE);
                loop {
                    // The lock is held only to take jobs, never while verifying. Taking a few at
                    // once saves a wake-up per transaction when the queue is long.
                    let stop = match rx.lock() {
                        Ok(rx) => match rx.recv() {
                            Ok(Job::Verify(job)) => {
                                jobs.push(job);
                                // Places taken are jobs queued or being verified.
                                let take = share(capacity.saturating_sub(room.available_permits()), threads);
                                let mut stop = false;
                                while jobs.len() < take {
                                    match rx.try_recv() {
                                        Ok(Job::Verify(job)) => jobs.push(job),
                                        Ok(Job::Stop) => {
                                            stop = true;
                                            break;
                                        }
                                        Err(_) => break,
                                    }
                                }
                                stop
                            }
                            Ok(Job::Stop) | Err(_) => true,
                        },
                        Err(_) => true,
                    };
                    let mut group = Vec::with_capacity(jobs.len());
                    // The turn's places go back together, at its end: each release takes the
                    // semaphore's lock, which the submitters' tasks take places from.
                    let mut places: Option<OwnedSemaphorePermit> = None;
                    for Verify { raw, rules, deliver, _place: place } in jobs.drain(..) {
                        let verified = decode_new(&raw, &rules, Instant::now(), &*known);
                        match &mut places {
                            Some(places) => places.merge(place),
                            None => places = Some(place),
                        }
                        match deliver {
                            Deliver::Reply(reply) => {
                                let _ = reply.send(verified);
                            }
                            Deliver::Group(ticket) => group.push((verified, ticket)),
                        }
                    }
                    if !group.is_empty() {
                        // The intake stage gone means the mempool is stopping: the tickets'
                        // submitters see it.
                        let _ = groups.send(group);
                    }
                    drop(places);
                    if stop {
                        return;
                    }
                }
            })?);
        }
        Ok(Self { jobs, room, threads: std::sync::Mutex::new(handles) })
    }

    /// Refuses new work at once; the returned function (which blocks: run it off the async
    /// workers) lets the threads finish what is queued and joins them.
    pub fn stop(&self) -> impl FnOnce() + Send + 'static {
        self.room.close();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let jobs = self.jobs.clone();
        move || {
            for _ in &threads {
                let _ = jobs.send(Job::Stop);
            }
            for thread in threads {
                let _ = thread.join();
            }
        }
    }

    /// Decodes, checks and recovers `raw` on a verifier thread; when the queue is full,
    /// refuses or waits as `admission` says.
    pub async fn verify(&self, raw: Bytes, rules: Arc<Rules>, admission: Admission) -> Result<Verified, VerifyError> {
        let (reply, answer) = oneshot::channel();
        self.queue(raw, rules, admission, Deliver::Reply(reply)).await?;
        match answer.await {
            Ok(result) => result.map_err(VerifyError::Invalid),
            Err(_) => Err(VerifyError::Stopped),
        }
    }

    /// Queues `raw` for verification, its result to go with `ticket` to the intake stage;
    /// when the queue is full, refuses or waits as `admission` says.
    pub async fn verify_then(
        &self,
        raw: Bytes,
        rules: Arc<Rules>,
        admission: Admission,
        ticket: T,
    ) -> Result<(), VerifyError> {
        self.queue(raw, rules, admission, Deliver::Group(ticket)).await
    }

    async fn queue(
        &self,
        raw: Bytes,
        rules: Arc<Rules>,
        admission: Admission,
        deliver: Deliver<T>,
    ) -> Result<(), VerifyError> {
        let place = match admission {
            Admission::Refuse => self.room.clone().try_acquire_owned().map_err(|e| match e {
                tokio::sync::TryAcquireError::NoPermits => VerifyError::Busy,
                tokio::sync::TryAcquireError::Closed => VerifyError::Stopped,
            })?,
            Admission::Wait => self.room.clone().acquire_owned().await.map_err(|_| VerifyError::Stopped)?,
        };
        // Never full: a job holds one of `capacity` places.
        match self.jobs.try_send(Job::Verify(Verify { raw, rules, deliver, _place: place })) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(VerifyError::Busy),
            Err(TrySendError::Disconnected(_)) => Err(VerifyError::Stopped),
        }
    }
}

/// Lowers the calling thread's CPU priority (Linux: per thread).
fn lower_priority(nice: i32) {
    // SAFETY: setpriority with PRIO_PROCESS and who = 0 changes only the calling thread on Linux;
    // it reads no memory of ours.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_bench::txgen::{Fees, Wallet};

    // A burst is split between the threads; a long queue is taken a full turn at a time; a
    // lone job is taken alone.
    #[test]
    fn each_thread_takes_its_share_of_the_queue() {
        assert_eq!(share(100, 2), 50);
        assert_eq!(share(101, 2), 51);
        assert_eq!(share(5_000, 2), TAKE);
        assert_eq!(share(1, 2), 1);
        assert_eq!(share(0, 2), 1, "the job in hand");
        assert_eq!(share(10, 0), 10, "no threads is taken as one");
    }

    // Every ticket comes back exactly once, with its own transaction's result, whether the
    // results travel grouped or to their own waiters, and a queue of many yields groups of
    // several (the point of grouping).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_results_carry_their_tickets() {
        let (groups, mut rx) = mpsc::unbounded_channel();
        let verifier = Verifier::<usize>::start(1, 256, 0, groups, Arc::new(|_| false)).expect("verifier threads");
        let rules = Arc::new(Rules { chain_id: 1, ..Rules::default() });
        let wallet = Wallet::numbered(3, 1);
        let mut expected = Vec::new();
        for i in 0..100usize {
            // Every third one is not a transaction at all.
            let raw = if i % 3 == 0 {
                Bytes::from(vec![0xff; 12])
            } else {
                Bytes::from(wallet.transfer(i as u64, alloy_primitives::Address::ZERO, 1, Fees::default()).raw)
            };
            expected.push(i % 3 != 0);
            verifier.verify_then(raw, rules.clone(), Admission::Wait, i).await.expect("queued");
        }
        let alone = Bytes::from(wallet.transfer(500, alloy_primitives::Address::ZERO, 1, Fees::default()).raw);
        let verified = verifier.verify(alone, rules, Admission::Wait).await.expect("valid");
        assert!(matches!(verified, Verified::New(tx) if tx.nonce == 500));
        let mut seen = vec![0; 100];
        let mut largest = 0;
        while seen.contains(&0) {
            let group = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
                .await
                .expect("all groups within 10 s")
                .expect("verifier running");
            largest = largest.max(group.len());
            for (result, ticket) in group {
                seen[ticket] += 1;
                assert_eq!(result.is_ok(), expected[ticket], "ticket {ticket}");
                if let Ok(Verified::New(tx)) = result {
                    assert_eq!(tx.nonce, ticket as u64, "ticket {ticket} carries its own transaction");
                }
            }
        }
        assert!(seen.iter().all(|n| *n == 1), "each ticket once: {seen:?}");
        assert!(largest > 1, "a long queue is verified in groups");
        let stop = verifier.stop();
        tokio::task::spawn_blocking(stop).await.expect("stopped");
    }
}
