//! The ingress client: one connection, reused; one stream per transaction. Callers pipeline by
//! sending from many tasks at once: opening a stream waits for the server's stream credit, so a
//! client never has more in flight than it was granted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint, VarInt};
use serde::Deserialize;

use crate::identity::{Identity, KeyPair};

/// Connection options.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Accept only the server with this identity (otherwise any server key is accepted).
    pub server_identity: Option<Identity>,
    /// Send through this socket instead of a fresh one (e.g. `netem::delayed_socket`, with the
    /// `stand-ins` feature).
    pub socket: Option<Arc<dyn quinn::AsyncUdpSocket>>,
}

/// Why a send failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection could not be made.
    #[error("cannot connect to the ingress: {0}")]
    Connect(String),
    /// The connection or stream failed.
    #[error("ingress stream failed: {0}")]
    Stream(String),
    /// The server stopped the stream (or, on a bidirectional stream, reset its answer) with this
    /// code (see [`crate::server::codes`]).
    #[error("the ingress stopped the stream with code {0:#x}")]
    Stopped(u64),
    /// The pool refused the transaction (bidirectional streams only).
    #[error("{message} ({code})")]
    Rejected {
        /// The JSON-RPC error code.
        code: i64,
        /// The pool's wording.
        message: String,
    },
}

/// A connection to an ingress.
#[derive(Debug)]
pub struct Client {
    endpoint: Endpoint,
    conn: Connection,
}

#[derive(Deserialize)]
struct Answer {
    hash: Option<String>,
    error: Option<RemoteError>,
}

#[derive(Deserialize)]
struct RemoteError {
    code: i64,
    message: String,
}

impl Client {
    /// Connects to `server` with `key` as the client's identity.
    pub async fn connect(server: SocketAddr, key: &KeyPair, options: ClientOptions) -> Result<Client, ClientError> {
        let connect = |e: &dyn std::fmt::Display| ClientError::Connect(e.to_string());
        let tls = crate::tls::client_config(key, options.server_identity).map_err(|e| connect(&e))?;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| connect(&e))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(Duration::from_secs(5)));
        config.transport_config(Arc::new(transport));
        let mut endpoint = match options.socket {
            Some(socket) => Endpoint::new_with_abstract_socket(
                quinn::EndpointConfig::default(),
                None,
                socket,
                Arc::new(quinn::TokioRuntime),
            ),
            None => {
                let any: SocketAddr =
                    if server.is_ipv6() { (std::net::Ipv6Addr::LOCALHOST, 0).into() } else { ([0, 0, 0, 0], 0).into() };
                Endpoint::client(any)
            }
        }
        .map_err(|e| connect(&e))?;
        endpoint.set_default_client_config(config);
        let conn = endpoint.connect(server, "sluice").map_err(|e| connect(&e))?.await.map_err(|e| connect(&e))?;
        Ok(Client { endpoint, conn })
    }

    /// Sends one transaction on its own unidirectional stream, waiting for stream credit first.
    /// Returns once the bytes are handed to QUIC; use [`Client::send_acknowledged`] to learn
    /// whether the server took the stream whole.
    pub async fn send(&self, tx: &[u8]) -> Result<(), ClientError> {
        let mut stream = self.conn.open_uni().await.map_err(|e| ClientError::Stream(e.to_string()))?;
        stream.write_all(tx).await.map_err(|e| ClientError::Stream(e.to_string()))?;
        stream.finish().map_err(|e| ClientError::Stream(e.to_string()))?;
        Ok(())
    }

    /// Like [`Client::send`], then waits until the server has received every byte, or stopped
    /// the stream (oversized, timed out).
    pub async fn send_acknowledged(&self, tx: &[u8]) -> Result<(), ClientError> {
        let mut stream = self.conn.open_uni().await.map_err(|e| ClientError::Stream(e.to_string()))?;
        if let Err(e) = stream.write_all(tx).await {
            return match e {
                quinn::WriteError::Stopped(code) => Err(ClientError::Stopped(code.into_inner())),
                e => Err(ClientError::Stream(e.to_string())),
            };
        }
        stream.finish().map_err(|e| ClientError::Stream(e.to_string()))?;
        match stream.stopped().await {
            Ok(None) => Ok(()),
            Ok(Some(code)) => Err(ClientError::Stopped(code.into_inner())),
            Err(e) => Err(ClientError::Stream(e.to_string())),
        }
    }

    /// Sends one transaction on a bidirectional stream and waits for the pool's answer: the
    /// transaction hash (0x-prefixed hex), or the pool's error.
    pub async fn submit(&self, tx: &[u8]) -> Result<String, ClientError> {
        let stream = |e: &dyn std::fmt::Display| ClientError::Stream(e.to_string());
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(|e| stream(&e))?;
        if let Err(e) = send.write_all(tx).await {
            return match e {
                quinn::WriteError::Stopped(code) => Err(ClientError::Stopped(code.into_inner())),
                e => Err(stream(&e)),
            };
        }
        // The server may stop the stream after every byte is buffered here (a transaction just
        // over the size cap fits in the send buffer): finishing then fails, or the answer comes
        // back empty. Either way the stop code is the server's answer.
        if send.finish().is_err() {
            return Err(stopped_or(&mut send, "the stream closed before it was finished").await);
        }
        let body = match recv.read_to_end(64 * 1024).await {
            Ok(body) => body,
            // A refused stream's answer is reset with the same code the stream was stopped with.
            Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code))) => {
                return Err(ClientError::Stopped(code.into_inner()));
            }
            Err(e) => return Err(stream(&e)),
        };
        if body.is_empty() {
            return Err(stopped_or(&mut send, "the ingress closed the stream without an answer").await);
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| stream(&e))?;
        match (answer.hash, answer.error) {
            (Some(hash), _) => Ok(hash),
            (None, Some(e)) => Err(ClientError::Rejected { code: e.code, message: e.message }),
            (None, None) => Err(ClientError::Stream("the ingress answered neither a hash nor an error".into())),
        }
    }

    /// The connection's smoothed RTT, as quinn measures it.
    pub fn rtt(&self) -> Duration {
        self.conn.rtt()
    }

    /// The underlying connection (for statistics).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Closes the connection. Streams sent with [`Client::send`] and not yet delivered are
    /// abandoned: use [`Client::send_acknowledged`] when delivery matters.
    pub async fn close(self) {
        self.conn.close(VarInt::from_u32(0), b"done");
        self.endpoint.wait_idle().await;
    }
}

/// The server's stop code for `send`, or a stream error saying `otherwise`.
async fn stopped_or(send: &mut quinn::SendStream, otherwise: &str) -> ClientError {
    match send.stopped().await {
        Ok(Some(code)) => ClientError::Stopped(code.into_inner()),
        Ok(None) => ClientError::Stream(otherwise.to_string()),
        Err(e) => ClientError::Stream(format!("{otherwise}: {e}")),
    }
}
