//! `[ingress]`: the operator's settings, with defaults.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::identity::Identity;
use crate::limits::ConnectionLimitsConfig;
use crate::qos::QosConfig;

/// The QUIC ingress's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressConfig {
    /// The UDP address to listen on.
    pub listen: SocketAddr,
    /// The server's key file (made on first start when missing).
    pub key: PathBuf,
    /// Client identity (64 hex digits, see `sluice keygen`) → weight, the analogue of stake.
    pub weights: BTreeMap<String, f64>,
    /// Transactions per second admitted in total when clients compete (the weights share it).
    pub capacity: f64,
    /// The share of `capacity` clients without a weight share between them.
    pub unknown_share: f64,
    /// Nobody is throttled while the load is below this fraction of `capacity`.
    pub throttle_above: f64,
    /// Refuse clients that present no certificate (otherwise they join the unknown class).
    pub require_client_key: bool,
    /// The largest transaction, bytes.
    pub max_tx_bytes: u32,
    /// Allow bidirectional streams, which answer with the hash or the pool's error.
    pub bidirectional: bool,
    /// Stream credit floor.
    pub min_streams: u32,
    /// Stream credit cap.
    pub max_streams: u32,
    /// RTTs above this count as this.
    #[serde(with = "humantime_serde")]
    pub max_rtt: Duration,
    /// Scale stream credit and receive window with each connection's RTT.
    pub rtt_scaling: bool,
    /// The RTT fixed credit is sized for when `rtt_scaling` is off.
    #[serde(with = "humantime_serde")]
    pub reference_rtt: Duration,
    /// The transaction size the receive window is sized for.
    pub typical_tx_bytes: u32,
    /// How far ahead of its rate a client may burst.
    #[serde(with = "humantime_serde")]
    pub burst: Duration,
    /// Connections open at once.
    pub max_connections: u32,
    /// Connections open at once per IP.
    pub max_connections_per_ip: u32,
    /// Connections open at once per identity.
    pub max_connections_per_identity: u32,
    /// New handshakes per second per IP.
    pub handshakes_per_ip_per_second: f64,
    /// Handshakes an IP may start back to back.
    pub handshake_burst: u32,
    /// Make unvalidated peers prove their address with a Retry before they are counted (costs a
    /// round trip; stops spoofed source addresses from using up another address's limits).
    pub validate_address: bool,
    /// A connection with no traffic is closed after this.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A stream must be complete within this after it is admitted.
    #[serde(with = "humantime_serde")]
    pub stream_timeout: Duration,
}

impl Default for IngressConfig {
    fn default() -> Self {
        let qos = QosConfig::default();
        let limits = ConnectionLimitsConfig::default();
        IngressConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8547)),
            key: PathBuf::from(".sluice/ingress.key"),
            weights: BTreeMap::new(),
            capacity: qos.capacity,
            unknown_share: qos.unknown_share,
            throttle_above: qos.throttle_above,
            require_client_key: false,
            max_tx_bytes: qos.max_tx_bytes,
            bidirectional: true,
            min_streams: qos.min_streams,
            max_streams: qos.max_streams,
            max_rtt: qos.max_rtt,
            rtt_scaling: qos.rtt_scaling,
            reference_rtt: qos.reference_rtt,
            typical_tx_bytes: qos.typical_tx_bytes,
            burst: qos.burst,
            max_connections: limits.max_connections,
            max_connections_per_ip: limits.max_connections_per_ip,
            max_connections_per_identity: limits.max_connections_per_identity,
            handshakes_per_ip_per_second: limits.handshakes_per_ip_per_second,
            handshake_burst: limits.handshake_burst,
            validate_address: false,
            idle_timeout: Duration::from_secs(30),
            stream_timeout: Duration::from_secs(5),
        }
    }
}

/// Why the settings were refused.
#[derive(Debug, thiserror::Error)]
#[error("[ingress] {0}")]
pub struct ConfigError(String);

impl IngressConfig {
    /// Checks the settings and parses the weights table.
    pub fn weights(&self) -> Result<std::collections::HashMap<Identity, f64>, ConfigError> {
        self.weights
            .iter()
            .map(|(id, w)| {
                let id = id.parse::<Identity>().map_err(|e| ConfigError(format!("weights: {e}")))?;
                if !(w.is_finite() && *w > 0.0) {
                    return Err(ConfigError(format!("weights: the weight of {id} must be a positive number")));
                }
                Ok((id, *w))
            })
            .collect()
    }

    /// Checks every setting; called before anything starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.weights()?;
        let fraction = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError(format!("{name} must be between 0 and 1, got {v}")))
            }
        };
        fraction("unknown_share", self.unknown_share)?;
        fraction("throttle_above", self.throttle_above)?;
        if !(self.capacity.is_finite() && self.capacity > 0.0) {
            return Err(ConfigError("capacity must be a positive number of transactions per second".into()));
        }
        if self.max_tx_bytes == 0 || self.max_tx_bytes > 16 * 1024 * 1024 {
            return Err(ConfigError("max_tx_bytes must be between 1 and 16 MiB".into()));
        }
        if self.min_streams == 0 || self.min_streams > self.max_streams {
            return Err(ConfigError("need 0 < min_streams <= max_streams".into()));
        }
        if self.max_connections == 0 || self.max_connections_per_ip == 0 || self.max_connections_per_identity == 0 {
            return Err(ConfigError("connection limits must be at least 1".into()));
        }
        if self.idle_timeout.is_zero() || self.stream_timeout.is_zero() {
            return Err(ConfigError("idle_timeout and stream_timeout must be more than zero".into()));
        }
        Ok(())
    }

    /// The QoS part.
    pub fn qos(&self) -> QosConfig {
        QosConfig {
            capacity: self.capacity,
            unknown_share: self.unknown_share,
            throttle_above: self.throttle_above,
            burst: self.burst,
            min_streams: self.min_streams,
            max_streams: self.max_streams,
            max_rtt: self.max_rtt,
            rtt_scaling: self.rtt_scaling,
            reference_rtt: self.reference_rtt,
            typical_tx_bytes: self.typical_tx_bytes,
            max_tx_bytes: self.max_tx_bytes,
        }
    }

    /// The connection-limits part.
    pub fn limits(&self) -> ConnectionLimitsConfig {
        ConnectionLimitsConfig {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_connections_per_identity: self.max_connections_per_identity,
            handshakes_per_ip_per_second: self.handshakes_per_ip_per_second,
            handshake_burst: self.handshake_burst,
        }
    }
}
