//! Client addresses and CIDR rules. Pure: the decisions take addresses and header values, never
//! sockets.
//!
//! The client is the socket's peer, unless that peer is a trusted proxy: then the address its
//! `X-Forwarded-For` (or `Forwarded: for=`) names, read from the right, skipping trusted hops,
//! so a client cannot choose its own address by sending the header itself.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// A CIDR block (`10.0.0.0/8`, `::1/128`) or a single address (`127.0.0.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(pub IpNet);

impl Cidr {
    /// True when `ip` is inside this block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&canonical(ip))
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Cidr(net.trunc()));
        }
        s.parse::<IpAddr>()
            .map(|ip| Cidr(IpNet::from(canonical(ip))))
            .map_err(|_| format!("{s:?} is not an address or a CIDR block (like 10.0.0.0/8 or ::1/128)"))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An IPv4 address carried in IPv6 (`::ffff:1.2.3.4`, as dual-stack sockets report) as IPv4,
/// so that IPv4 rules apply to it.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Allow and deny lists: deny wins; a non-empty allow list admits only what it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRules {
    /// Addresses admitted (empty: all).
    pub allow: Vec<Cidr>,
    /// Addresses refused, whatever `allow` says.
    pub deny: Vec<Cidr>,
}

impl IpRules {
    /// Rules from the two lists.
    pub fn new(allow: &[Cidr], deny: &[Cidr]) -> Self {
        Self { allow: allow.to_vec(), deny: deny.to_vec() }
    }

    /// True when there are no rules.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// True when `ip` may pass. Without an address (an in-process caller), only rule-free
    /// lists pass.
    pub fn permits(&self, ip: Option<IpAddr>) -> bool {
        if self.is_empty() {
            return true;
        }
        let Some(ip) = ip.map(canonical) else { return false };
        let inside = |c: &Cidr| c.0.contains(&ip);
        !self.deny.iter().any(inside) && (self.allow.is_empty() || self.allow.iter().any(inside))
    }
}

/// The client's address: `peer`, or, when `peer` is a trusted proxy, the rightmost address in
/// `x_forwarded_for` (else in `forwarded`) that is not itself a trusted proxy. Malformed
/// entries stop the walk at the last trusted hop's word: the proxy that sent them.
pub fn client_ip(
    peer: IpAddr,
    x_forwarded_for: Option<&str>,
    forwarded: Option<&str>,
    trusted_proxies: &[Cidr],
) -> IpAddr {
    let peer = canonical(peer);
    let trusted = |ip: IpAddr| trusted_proxies.iter().any(|c| c.contains(ip));
    if !trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = match (x_forwarded_for, forwarded) {
        (Some(xff), _) => xff.split(',').collect(),
        (None, Some(fwd)) => fwd.split(',').filter_map(forwarded_for).collect(),
        (None, None) => return peer,
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        match parse_hop(hop) {
            Some(ip) => {
                client = ip;
                if !trusted(ip) {
                    break;
                }
            }
            None => break,
        }
    }
    client
}

/// The `for=` value of one `Forwarded` element (RFC 7239).
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value.trim())
    })
}

/// One hop's address: `1.2.3.4`, `1.2.3.4:5678`, `"[::1]:80"`, `[::1]`, `::1`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim().trim_matches('"');
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Some(rest) = hop.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok().map(canonical);
    }
    let (host, _port) = hop.rsplit_once(':')?;
    host.parse().ok().map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn cidrs_parse_blocks_and_single_addresses() {
        assert!("10.0.0.0/8".parse::<Cidr>().unwrap().contains(ip("10.1.2.3")));
        assert!("127.0.0.1".parse::<Cidr>().unwrap().contains(ip("127.0.0.1")));
        assert!(!"127.0.0.1".parse::<Cidr>().unwrap().contains(ip("127.0.0.2")));
        assert!("::1".parse::<Cidr>().unwrap().contains(ip("::1")));
        assert!("fd00::/8".parse::<Cidr>().unwrap().contains(ip("fd12::1")));
        assert_eq!("10.1.2.3/8".parse::<Cidr>().unwrap().to_string(), "10.0.0.0/8");
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nonsense".parse::<Cidr>().unwrap_err().contains("nonsense"));
        // A dual-stack socket's IPv4 peer matches IPv4 rules.
        assert!("127.0.0.0/8".parse::<Cidr>().unwrap().contains(ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn deny_wins_and_a_non_empty_allow_list_admits_only_its_blocks() {
        let rules = IpRules::new(&cidrs(&["127.0.0.0/8", "::1"]), &cidrs(&["127.0.0.2"]));
        assert!(rules.permits(Some(ip("127.0.0.1"))));
        assert!(!rules.permits(Some(ip("127.0.0.2"))));
        assert!(rules.permits(Some(ip("::1"))));
        assert!(!rules.permits(Some(ip("192.0.2.1"))));
        assert!(!rules.permits(None));
        assert!(IpRules::default().permits(None));
        let deny_only = IpRules::new(&[], &cidrs(&["::1/128"]));
        assert!(!deny_only.permits(Some(ip("::1"))));
        assert!(deny_only.permits(Some(ip("127.0.0.1"))));
    }

    #[test]
    fn forwarded_addresses_count_only_from_trusted_proxies() {
        let trusted = cidrs(&["127.0.0.1", "10.0.0.0/8"]);
        // Not a trusted peer: its header is ignored.
        assert_eq!(client_ip(ip("127.0.0.2"), Some("192.0.2.9"), None, &trusted), ip("127.0.0.2"));
        // A trusted peer: the rightmost untrusted hop, so a client's own forged entry is skipped.
        assert_eq!(client_ip(ip("127.0.0.1"), Some("6.6.6.6, 192.0.2.9, 10.1.1.1"), None, &trusted), ip("192.0.2.9"));
        assert_eq!(client_ip(ip("127.0.0.1"), None, None, &trusted), ip("127.0.0.1"));
        assert_eq!(
            client_ip(ip("127.0.0.1"), None, Some("for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\""), &trusted),
            ip("2001:db8::1")
        );
        assert_eq!(client_ip(ip("127.0.0.1"), Some("192.0.2.9:1234"), None, &trusted), ip("192.0.2.9"));
        // Garbage stops the walk at the proxy itself.
        assert_eq!(client_ip(ip("127.0.0.1"), Some("not-an-ip"), None, &trusted), ip("127.0.0.1"));
        assert_eq!(client_ip(ip("::ffff:127.0.0.1"), Some("::1"), None, &trusted), ip("::1"));
    }
}
