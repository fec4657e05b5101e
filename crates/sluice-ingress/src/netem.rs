//! RTT emulation in user space, for tests and benchmarks (these machines have no kernel netem).
//!
//! [`delayed_socket`] wraps a client's UDP socket for quinn: every datagram the client sends is
//! held until its due time (the configured RTT, plus jitter), or dropped with the configured
//! loss probability. Delaying only the client's outgoing packets adds the whole RTT to both
//! sides' measurements: the client's packets reach the server late, and so do the client's
//! ACKs of the server's packets. The server is unmodified, and several clients with different
//! RTTs can run at once. Accuracy: tokio timers fire on millisecond ticks, so each packet is
//! late by 0–1 ms more than asked (measured in docs/ingress.md); packets are never reordered.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime, UdpPoller};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The path to emulate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Netem {
    /// Added round-trip time.
    pub rtt: Duration,
    /// Up to this much more, uniformly at random, per packet (order is kept).
    pub jitter: Duration,
    /// Probability that a packet is dropped (0..1).
    pub loss: f64,
}

/// Datagrams held at once; beyond this they are dropped, as a full router queue would.
const QUEUE_LIMIT: usize = 65_536;

struct Held {
    due: Instant,
    destination: SocketAddr,
    contents: Vec<u8>,
}

struct Queue {
    held: VecDeque<Held>,
    last_due: Instant,
}

/// A UDP socket that delays what it sends.
pub struct DelayedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    netem: Netem,
    queue: Mutex<Queue>,
    wake: Arc<Notify>,
}

impl fmt::Debug for DelayedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayedSocket").field("netem", &self.netem).finish()
    }
}

/// Binds `addr` and returns a socket for [`crate::client::ClientOptions::socket`] whose
/// outgoing datagrams follow `netem`. Must be called within a tokio runtime.
pub fn delayed_socket(addr: SocketAddr, netem: Netem) -> io::Result<Arc<DelayedSocket>> {
    let inner = quinn::TokioRuntime.wrap_udp_socket(std::net::UdpSocket::bind(addr)?)?;
    let socket = Arc::new(DelayedSocket {
        inner,
        netem,
        queue: Mutex::new(Queue { held: VecDeque::new(), last_due: Instant::now() }),
        wake: Arc::new(Notify::new()),
    });
    tokio::spawn(pump(Arc::downgrade(&socket)));
    Ok(socket)
}

/// Sends held datagrams when they are due; ends when the socket is dropped.
async fn pump(socket: std::sync::Weak<DelayedSocket>) {
    let mut poller: Option<Pin<Box<dyn UdpPoller>>> = None;
    loop {
        let Some(s) = socket.upgrade() else { return };
        let next = s.queue.lock().unwrap_or_else(|e| e.into_inner()).held.front().map(|h| h.due);
        match next {
            None => {
                let wake = s.wake.clone();
                drop(s);
                // Re-check periodically so a dropped socket ends the task.
                let _ = tokio::time::timeout(Duration::from_millis(200), wake.notified()).await;
                continue;
            }
            Some(due) if due > Instant::now() => {
                drop(s);
                tokio::time::sleep_until(due).await;
                continue;
            }
            Some(_) => {}
        }
        let now = Instant::now();
        loop {
            let held = {
                let mut q = s.queue.lock().unwrap_or_else(|e| e.into_inner());
                match q.held.front() {
                    Some(h) if h.due <= now => q.held.pop_front(),
                    _ => None,
                }
            };
            let Some(held) = held else { break };
            let transmit = Transmit {
                destination: held.destination,
                ecn: None,
                contents: &held.contents,
                segment_size: None,
                src_ip: None,
            };
            loop {
                match s.inner.try_send(&transmit) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let p = poller.get_or_insert_with(|| s.inner.clone().create_io_poller());
                        let _ = std::future::poll_fn(|cx| p.as_mut().poll_writable(cx)).await;
                    }
                    // Other send errors lose the datagram, as the network would.
                    _ => break,
                }
            }
        }
    }
}

impl AsyncUdpSocket for DelayedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        if self.netem.loss > 0.0 && rand::random::<f64>() < self.netem.loss {
            return Ok(());
        }
        let jitter =
            if self.netem.jitter.is_zero() { Duration::ZERO } else { self.netem.jitter.mul_f64(rand::random::<f64>()) };
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.held.len() >= QUEUE_LIMIT {
            return Ok(());
        }
        // Never before an earlier packet: a path delays, it does not reorder.
        let due = (Instant::now() + self.netem.rtt + jitter).max(q.last_due);
        q.last_due = due;
        let segment = transmit.segment_size.unwrap_or(transmit.contents.len()).max(1);
        for chunk in transmit.contents.chunks(segment) {
            q.held.push_back(Held { due, destination: transmit.destination, contents: chunk.to_vec() });
        }
        let was_empty = q.held.len() == transmit.contents.len().div_ceil(segment);
        drop(q);
        if was_empty {
            self.wake.notify_one();
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
