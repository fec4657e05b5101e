//! sluice's QUIC transaction ingress.
//!
//! Clients send one raw transaction per unidirectional stream (ALPN `sluice-tx/1`, TLS 1.3); a
//! bidirectional stream gets the hash or the pool's error back. Each client is identified by the
//! key of its certificate; a weights table gives each identity its share of the ingress's
//! capacity (the analogue of stake), and each connection gets stream credit and a receive
//! window of its rate times its measured RTT, so far-away clients are not throttled by credit
//! and inflating the RTT buys nothing.
//!
//! The decisions are pure ([`qos`], [`limits`]); [`server`] and [`client`] are the async shell on
//! quinn; `netem` (with the `stand-ins` feature) emulates RTT in user space for tests and benchmarks.

pub mod client;
pub mod config;
pub mod identity;
pub mod limits;
#[cfg(feature = "stand-ins")]
pub mod netem;
#[cfg(feature = "stand-ins")]
pub mod null;
pub mod qos;
pub mod server;
pub mod stats;
pub mod tls;

pub use client::{Client, ClientError, ClientOptions};
pub use config::IngressConfig;
pub use identity::{Identity, KeyPair};
pub use server::{codes, Ingress, StartError};
pub use stats::{Stats, StatsSnapshot};
