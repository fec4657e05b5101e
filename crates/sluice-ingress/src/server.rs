//! The QUIC server: the async shell around [`Qos`] and [`ConnectionLimits`].
//!
//! Per connection: read the client's identity, hold its slot, then accept streams. Each stream
//! waits for its client's reserved slot *before* it is read, so an over-rate client's streams
//! stay open and its stream credit does not come back: backpressure, with no unbounded queue.
//! Every ~100 ms the connection's credit is recomputed from the class rate and quinn's RTT.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use sluice_mempool::{TxIntake, TxSource};

use crate::config::{ConfigError, IngressConfig};
use crate::identity::{Identity, KeyPair};
use crate::limits::ConnectionLimits;
use crate::qos::{Admission, Class, Qos};
use crate::stats::{ClassStats, Stats, StatsSnapshot};

/// Application error codes: on STOP_SENDING for streams, on CONNECTION_CLOSE for connections.
pub mod codes {
    /// The stream was longer than `max_tx_bytes`.
    pub const TOO_LARGE: u32 = 0x10;
    /// The stream was not finished within `stream_timeout`.
    pub const TIMED_OUT: u32 = 0x11;
    /// The ingress is shutting down.
    pub const SHUTTING_DOWN: u32 = 0x20;
    /// The identity has too many connections open.
    pub const TOO_MANY_CONNECTIONS: u32 = 0x21;
    /// The client presented no usable certificate while one is required.
    pub const NO_IDENTITY: u32 = 0x22;
}

/// Why the ingress could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// TLS could not be set up.
    #[error("ingress TLS: {0}")]
    Tls(String),
    /// The UDP port could not be bound.
    #[error("ingress cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

struct Shared {
    config: IngressConfig,
    qos: Mutex<Qos>,
    limits: Mutex<ConnectionLimits>,
    intake: Arc<dyn TxIntake>,
    stats: Arc<Stats>,
    origin: Instant,
}

impl Shared {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn qos(&self) -> std::sync::MutexGuard<'_, Qos> {
        self.qos.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limits(&self) -> std::sync::MutexGuard<'_, ConnectionLimits> {
        self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn instant_of(&self, nanos: u64) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.origin + Duration::from_nanos(nanos))
    }
}

/// A running QUIC ingress.
pub struct Ingress {
    endpoint: Endpoint,
    shared: Arc<Shared>,
    identity: Identity,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Ingress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingress").field("local_addr", &self.local_addr()).field("identity", &self.identity).finish()
    }
}

impl Ingress {
    /// Binds `config.listen` and starts accepting; transactions go to `intake`. Must be called
    /// within a tokio runtime.
    pub fn start(config: IngressConfig, key: &KeyPair, intake: Arc<dyn TxIntake>) -> Result<Ingress, StartError> {
        config.validate()?;
        let weights = config.weights()?;
        let qos = Qos::new(config.qos(), weights);
        let tls =
            crate::tls::server_config(key, config.require_client_key).map_err(|e| StartError::Tls(e.to_string()))?;
        let crypto =
            quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| StartError::Tls(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        server.transport_config(Arc::new(transport(&config, &qos)));
        // Handshakes waiting for the accept loop; beyond this quinn refuses them itself.
        server.max_incoming(config.max_connections.max(64) as usize);
        let endpoint = Endpoint::server(server, config.listen)
            .map_err(|source| StartError::Bind { addr: config.listen, source })?;
        let limits = ConnectionLimits::new(config.limits());
        let shared = Arc::new(Shared {
            config,
            qos: Mutex::new(qos),
            limits: Mutex::new(limits),
            intake,
            stats: Arc::new(Stats::default()),
            origin: Instant::now(),
        });
        let accept = tokio::spawn(accept_loop(endpoint.clone(), shared.clone()));
        Ok(Ingress { endpoint, shared, identity: key.identity(), accept })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint.local_addr().unwrap_or(self.shared.config.listen)
    }

    /// The server's identity, which clients may pin.
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u32 {
        self.shared.limits().open_connections()
    }

    /// Closes every connection and stops listening.
    pub async fn shutdown(self) {
        self.accept.abort();
        self.endpoint.close(VarInt::from_u32(codes::SHUTTING_DOWN), b"shutting down");
        self.endpoint.wait_idle().await;
    }
}

/// Transport limits: stream and window credit start at the floor and are raised per connection.
fn transport(config: &IngressConfig, qos: &Qos) -> quinn::TransportConfig {
    let floor = crate::qos::credit_for(qos.config(), 0.0, Duration::ZERO);
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_uni_streams(VarInt::from_u32(floor.streams));
    t.max_concurrent_bidi_streams(VarInt::from_u32(if config.bidirectional { floor.streams } else { 0 }));
    t.stream_receive_window(VarInt::from_u32(config.max_tx_bytes));
    t.receive_window(VarInt::from_u64(floor.window).unwrap_or(VarInt::MAX));
    // No datagrams: a client that sends one breaks the protocol and is closed by quinn.
    t.datagram_receive_buffer_size(None);
    t.max_idle_timeout(quinn::IdleTimeout::try_from(config.idle_timeout).ok());
    t
}

async fn accept_loop(endpoint: Endpoint, shared: Arc<Shared>) {
    while let Some(incoming) = endpoint.accept().await {
        let ip = incoming.remote_address().ip();
        if shared.config.validate_address && !incoming.remote_address_validated() {
            // Costs the client a round trip and proves it owns the address it is counted under.
            let _ = incoming.retry();
            continue;
        }
        if let Err(refusal) = shared.limits().open(shared.now(), ip) {
            shared.stats.refuse(refusal.label());
            incoming.refuse();
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            let identity = serve_connection(incoming, &shared, ip).await;
            shared.limits().close(ip, identity);
        });
    }
}

/// Runs one connection; answers the identity whose slot it held, for release.
async fn serve_connection(incoming: quinn::Incoming, shared: &Arc<Shared>, ip: IpAddr) -> Option<Identity> {
    let conn = match incoming.accept() {
        Ok(connecting) => match connecting.await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(%ip, error = %e, "ingress handshake failed");
                shared.stats.refuse("handshake_failed");
                return None;
            }
        },
        Err(e) => {
            tracing::debug!(%ip, error = %e, "ingress handshake refused");
            return None;
        }
    };
    let identity = peer_identity(&conn);
    if identity.is_none() && shared.config.require_client_key {
        shared.stats.refuse("no_identity");
        conn.close(VarInt::from_u32(codes::NO_IDENTITY), b"a client certificate is required");
        return None;
    }
    if let Some(id) = identity {
        if let Err(refusal) = shared.limits().identify(id) {
            shared.stats.refuse(refusal.label());
            conn.close(VarInt::from_u32(codes::TOO_MANY_CONNECTIONS), b"too many connections for this identity");
            return None;
        }
    }
    let class = shared.qos().classify(identity);
    let stats = shared.stats.class(class);
    stats.connections.fetch_add(1, Relaxed);
    metrics::gauge!("sluice_ingress_connections").increment(1.0);
    tracing::debug!(%ip, class = %class.label(), "ingress connection");
    run_streams(&conn, shared, class, &stats).await;
    stats.connections.fetch_sub(1, Relaxed);
    metrics::gauge!("sluice_ingress_connections").decrement(1.0);
    identity
}

fn peer_identity(conn: &Connection) -> Option<Identity> {
    let certs = conn.peer_identity()?.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>().ok()?;
    Identity::of_certificate(certs.first()?)
}

async fn run_streams(conn: &Connection, shared: &Arc<Shared>, class: Class, stats: &Arc<ClassStats>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut granted = 0;
    loop {
        tokio::select! {
            stream = conn.accept_uni() => match stream {
                Ok(recv) => {
                    tokio::spawn(serve_stream(shared.clone(), class, stats.clone(), recv, None));
                }
                Err(_) => break,
            },
            stream = conn.accept_bi(), if shared.config.bidirectional => match stream {
                Ok((send, recv)) => {
                    tokio::spawn(serve_stream(shared.clone(), class, stats.clone(), recv, Some(send)));
                }
                Err(_) => break,
            },
            _ = tick.tick() => {
                let rtt = conn.rtt();
                let credit = shared.qos().credit(class, rtt);
                if credit.streams != granted {
                    granted = credit.streams;
                    conn.set_max_concurrent_uni_streams(VarInt::from_u32(credit.streams));
                    if shared.config.bidirectional {
                        conn.set_max_concurrent_bi_streams(VarInt::from_u32(credit.streams));
                    }
                    conn.set_receive_window(VarInt::from_u64(credit.window).unwrap_or(VarInt::MAX));
                }
                stats.credit.store(credit.streams as u64, Relaxed);
                stats.rtt_us.store(rtt.as_micros() as u64, Relaxed);
                stats.metrics.credit.set(credit.streams as f64);
                stats.metrics.rtt.set(rtt.as_secs_f64());
            }
        }
    }
}

/// Waits for the stream's slot, reads it whole, hands it to the pool, and answers on `reply`
/// for bidirectional streams.
async fn serve_stream(
    shared: Arc<Shared>,
    class: Class,
    stats: Arc<ClassStats>,
    mut recv: RecvStream,
    reply: Option<SendStream>,
) {
    let m = &stats.metrics;
    let admission = shared.qos().admit(shared.now(), class);
    if let Admission::At(at) = admission {
        stats.throttled.fetch_add(1, Relaxed);
        m.throttled.increment(1);
        tokio::time::sleep_until(shared.instant_of(at)).await;
    }
    let started = Instant::now();
    let max = shared.config.max_tx_bytes as usize;
    match tokio::time::timeout(shared.config.stream_timeout, recv.read_to_end(max)).await {
        Err(_) => {
            refuse(&mut recv, reply, codes::TIMED_OUT);
            stats.timed_out.fetch_add(1, Relaxed);
            m.abuse[3].increment(1);
        }
        Ok(Err(quinn::ReadToEndError::TooLong)) => {
            refuse(&mut recv, reply, codes::TOO_LARGE);
            stats.oversized.fetch_add(1, Relaxed);
            m.abuse[0].increment(1);
        }
        Ok(Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(_)))) => {
            stats.truncated.fetch_add(1, Relaxed);
            m.abuse[1].increment(1);
        }
        // The connection went away: not the stream's fault, nothing to count against it.
        Ok(Err(_)) => {}
        Ok(Ok(data)) if data.is_empty() => {
            stats.empty.fetch_add(1, Relaxed);
            m.abuse[2].increment(1);
            if let Some(send) = reply {
                answer(send, &serde_json::json!({ "error": { "code": -32602, "message": "empty stream" } })).await;
            }
        }
        Ok(Ok(data)) => {
            stats.bytes.fetch_add(data.len() as u64, Relaxed);
            m.bytes.increment(data.len() as u64);
            let result = shared.intake.submit(data.into(), TxSource::Quic).await;
            match &result {
                Ok(_) => {
                    shared.stats.latency.record(started.elapsed());
                    stats.accepted.fetch_add(1, Relaxed);
                    m.accepted.increment(1);
                }
                Err(_) => {
                    stats.rejected.fetch_add(1, Relaxed);
                    m.rejected.increment(1);
                }
            }
            if let Some(send) = reply {
                let body = match result {
                    Ok(hash) => serde_json::json!({ "hash": hash }),
                    Err(e) => serde_json::json!({ "error": sluice_mempool::rpc::submit_error(&e) }),
                };
                answer(send, &body).await;
            }
        }
    }
}

/// Stops reading with `code` and, on a bidirectional stream, resets the answer with the same code:
/// the stop alone is lost when every byte was already acknowledged (a stream just over the cap).
fn refuse(recv: &mut RecvStream, reply: Option<SendStream>, code: u32) {
    let _ = recv.stop(VarInt::from_u32(code));
    if let Some(mut send) = reply {
        let _ = send.reset(VarInt::from_u32(code));
    }
}

async fn answer(mut send: SendStream, body: &serde_json::Value) {
    let _ = send.write_all(body.to_string().as_bytes()).await;
    let _ = send.finish();
}
