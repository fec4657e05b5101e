//! Connection admission, as pure bookkeeping: connections in total, per IP and per identity, and
//! handshakes per IP per second (GCRA). The server asks before it spends a handshake on a peer
//! and releases when the connection ends.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::identity::Identity;

/// The limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionLimitsConfig {
    /// Connections open at once, in total.
    pub max_connections: u32,
    /// Connections open at once from one IP address.
    pub max_connections_per_ip: u32,
    /// Connections open at once with one client identity.
    pub max_connections_per_identity: u32,
    /// New handshakes per second from one IP address.
    pub handshakes_per_ip_per_second: f64,
    /// Handshakes one IP may start back to back before the rate applies.
    pub handshake_burst: u32,
}

impl Default for ConnectionLimitsConfig {
    fn default() -> Self {
        ConnectionLimitsConfig {
            max_connections: 4_096,
            max_connections_per_ip: 64,
            max_connections_per_identity: 8,
            handshakes_per_ip_per_second: 20.0,
            handshake_burst: 20,
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The ingress has `max_connections` open.
    Full,
    /// This IP has `max_connections_per_ip` open.
    PerIp,
    /// This IP starts handshakes faster than allowed.
    HandshakeRate,
    /// This identity has `max_connections_per_identity` open.
    PerIdentity,
}

impl Refusal {
    /// A label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "full",
            Refusal::PerIp => "per_ip",
            Refusal::HandshakeRate => "handshake_rate",
            Refusal::PerIdentity => "per_identity",
        }
    }
}

/// Open connections and recent handshakes.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    config: ConnectionLimitsConfig,
    total: u32,
    per_ip: HashMap<IpAddr, u32>,
    per_identity: HashMap<Identity, u32>,
    /// GCRA theoretical arrival time per IP, nanoseconds.
    handshakes: HashMap<IpAddr, u64>,
}

impl ConnectionLimits {
    /// No connections yet.
    pub fn new(config: ConnectionLimitsConfig) -> Self {
        ConnectionLimits {
            config,
            total: 0,
            per_ip: HashMap::new(),
            per_identity: HashMap::new(),
            handshakes: HashMap::new(),
        }
    }

    /// A peer at `ip` starts a handshake at `now`: on `Ok` a connection slot is held for it
    /// until [`ConnectionLimits::close`].
    pub fn open(&mut self, now: u64, ip: IpAddr) -> Result<(), Refusal> {
        if self.total >= self.config.max_connections {
            return Err(Refusal::Full);
        }
        if self.per_ip.get(&ip).copied().unwrap_or(0) >= self.config.max_connections_per_ip {
            return Err(Refusal::PerIp);
        }
        self.charge_handshake(now, ip)?;
        self.total += 1;
        *self.per_ip.entry(ip).or_default() += 1;
        Ok(())
    }

    /// The handshake finished and the peer is `identity`: on `Err` the caller closes the
    /// connection (and still calls `close` with `None`).
    pub fn identify(&mut self, identity: Identity) -> Result<(), Refusal> {
        let open = self.per_identity.entry(identity).or_default();
        if *open >= self.config.max_connections_per_identity {
            return Err(Refusal::PerIdentity);
        }
        *open += 1;
        Ok(())
    }

    /// A connection from `ip` (identified as `identity`, if `identify` succeeded) ended.
    pub fn close(&mut self, ip: IpAddr, identity: Option<Identity>) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
        if let Some(id) = identity {
            if let Some(n) = self.per_identity.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.per_identity.remove(&id);
                }
            }
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u32 {
        self.total
    }

    fn charge_handshake(&mut self, now: u64, ip: IpAddr) -> Result<(), Refusal> {
        let rate = self.config.handshakes_per_ip_per_second;
        if rate <= 0.0 || !rate.is_finite() {
            return Ok(());
        }
        let interval = (1e9 / rate) as u64;
        let tolerance = interval.saturating_mul(self.config.handshake_burst.saturating_sub(1) as u64);
        if self.handshakes.len() > 65_536 {
            // Bounded memory under a spray of source addresses: forget the ones already paid up.
            self.handshakes.retain(|_, tat| *tat > now);
        }
        let tat = self.handshakes.get(&ip).copied().unwrap_or(now).max(now);
        if tat > now + tolerance {
            return Err(Refusal::HandshakeRate);
        }
        self.handshakes.insert(ip, tat + interval);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[test]
    fn per_ip_and_total_caps_hold_and_release() {
        let config = ConnectionLimitsConfig {
            max_connections: 3,
            max_connections_per_ip: 2,
            handshakes_per_ip_per_second: 0.0,
            ..Default::default()
        };
        let mut limits = ConnectionLimits::new(config);
        assert_eq!(limits.open(S, ip(1)), Ok(()));
        assert_eq!(limits.open(S, ip(1)), Ok(()));
        assert_eq!(limits.open(S, ip(1)), Err(Refusal::PerIp));
        assert_eq!(limits.open(S, ip(2)), Ok(()));
        assert_eq!(limits.open(S, ip(3)), Err(Refusal::Full));
        limits.close(ip(1), None);
        assert_eq!(limits.open(S, ip(3)), Ok(()));
        assert_eq!(limits.open_connections(), 3);
    }

    #[test]
    fn handshakes_per_ip_are_rate_limited_with_a_burst() {
        let config =
            ConnectionLimitsConfig { handshakes_per_ip_per_second: 10.0, handshake_burst: 5, ..Default::default() };
        let mut limits = ConnectionLimits::new(config);
        let opened = (0..50).filter(|_| limits.open(S, ip(1)).is_ok()).count();
        assert_eq!(opened, 5);
        // Another address is not affected.
        assert_eq!(limits.open(S, ip(2)), Ok(()));
        // 300 ms later, three more have been earned (the rate).
        let later = (0..50).filter(|_| limits.open(S + 300_000_000, ip(1)).is_ok()).count();
        assert_eq!(later, 3);
        // After a long pause, the burst again, never more.
        let rested = (0..50).filter(|_| limits.open(10 * S, ip(1)).is_ok()).count();
        assert_eq!(rested, 5);
    }

    #[test]
    fn identities_are_capped() {
        let config = ConnectionLimitsConfig { max_connections_per_identity: 1, ..Default::default() };
        let mut limits = ConnectionLimits::new(config);
        let id = Identity::from_bytes([7; 32]);
        assert_eq!(limits.identify(id), Ok(()));
        assert_eq!(limits.identify(id), Err(Refusal::PerIdentity));
        limits.open(S, ip(1)).expect("open");
        limits.close(ip(1), Some(id));
        assert_eq!(limits.identify(id), Ok(()));
    }
}
