//! Where decoding and sender recovery run: a few dedicated threads at a lower CPU priority,
//! fed through a bounded queue.
//!
//! Recovery is the costliest step of ingest (tens of µs of secp256k1 per transaction). Run on
//! the async workers, a burst of submissions would queue every read behind it; here it runs
//! beside them, and the kernel gives the readers' threads the CPU first (the verifiers are
//! niced). The queue is bounded: when it is full, an outside caller is refused at once (`Busy`)
//! and internal work (journal replay, reorg re-injection, peers) waits for room, so nothing the
//! pool already holds or owes is ever dropped for being busy.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use alloy_consensus::TxEnvelope;
use alloy_primitives::Bytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::{decode, DecodeError, PoolTx, Rules};

/// A transaction to verify, with its place in the queue (released once it is verified).
type Verify = (Bytes, Arc<Rules>, oneshot::Sender<Result<Verified, DecodeError>>, OwnedSemaphorePermit);

/// What a verifier thread is given.
enum Job {
    Verify(Verify),
    /// End the thread.
    Stop,
}

/// A verified transaction: the pool's view of it and its decoded envelope.
pub type Verified = (PoolTx, TxEnvelope);

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
pub struct Verifier {
    jobs: SyncSender<Job>,
    /// One permit per queue place: waiting happens here, in async, not on the channel.
    room: Arc<Semaphore>,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// Jobs a verifier takes per turn at most.
const TAKE: usize = 8;

impl Verifier {
    /// Starts `threads` verifiers with a queue of `capacity` transactions, at niceness `nice`
    /// (0 is normal; higher yields the CPU to the readers' threads first).
    pub fn start(threads: usize, capacity: usize, nice: i32) -> std::io::Result<Self> {
        let capacity = capacity.max(1);
        let (jobs, rx) = sync_channel::<Job>(capacity);
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let rx = rx.clone();
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
                                let mut stop = false;
                                while jobs.len() < TAKE {
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
                    for (raw, rules, reply, _place) in jobs.drain(..) {
                        let _ = reply.send(decode(&raw, &rules, Instant::now()));
                    }
                    if stop {
                        return;
                    }
                }
            })?);
        }
        Ok(Self { jobs, room: Arc::new(Semaphore::new(capacity)), threads: std::sync::Mutex::new(handles) })
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
        let place = match admission {
            Admission::Refuse => self.room.clone().try_acquire_owned().map_err(|e| match e {
                tokio::sync::TryAcquireError::NoPermits => VerifyError::Busy,
                tokio::sync::TryAcquireError::Closed => VerifyError::Stopped,
            })?,
            Admission::Wait => self.room.clone().acquire_owned().await.map_err(|_| VerifyError::Stopped)?,
        };
        let (reply, answer) = oneshot::channel();
        // Never full: a job holds one of `capacity` places.
        match self.jobs.try_send(Job::Verify((raw, rules, reply, place))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(VerifyError::Busy),
            Err(TrySendError::Disconnected(_)) => return Err(VerifyError::Stopped),
        }
        match answer.await {
            Ok(result) => result.map_err(VerifyError::Invalid),
            Err(_) => Err(VerifyError::Stopped),
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
