//! What one key (or token) may reach: networks, methods and contracts. Pure.
//!
//! Each list is optional: empty means no limit. The contract list applies to the calls that
//! name a contract to act on (the method table's `acts_on`): `eth_call`, `eth_estimateGas` and
//! `eth_createAccessList` (their `to`), and every submission of a signed transaction (the
//! decoded transaction's `to`). A contract creation has no `to` and is outside any contract
//! list.

use serde::{Deserialize, Serialize};
use sluice_chain::methods::ActsOn;

/// True when `method` matches `pattern`: an exact name, or a `prefix*`.
pub fn method_matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => method.starts_with(prefix),
        None => pattern == method,
    }
}

/// Checks that every pattern is well formed: a method name, optionally ending in `*`.
pub fn validate_patterns(patterns: &[String]) -> Result<(), String> {
    for p in patterns {
        let name = p.strip_suffix('*').unwrap_or(p);
        if name.is_empty() && p != "*" || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{p:?} is not a method name or a prefix ending in *"));
        }
    }
    Ok(())
}

/// The contract a call acts on, as the gateway reads it from the call's params.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// The method does not name a contract.
    None,
    /// It names this address (`0x…`, any case).
    Contract(&'a str),
    /// It creates a contract, or its target could not be read.
    Unknown,
}

/// A scope: empty lists do not limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scope {
    /// Network ids.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Method patterns (`eth_call`, `eth_get*`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Contract addresses, lowercase `0x` + 40 hex digits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contracts: Vec<String>,
}

impl Scope {
    /// Checks the lists and lowercases the addresses; the error names the list.
    pub fn normalize(mut self) -> Result<Self, String> {
        validate_patterns(&self.methods).map_err(|e| format!("methods: {e}"))?;
        for c in &mut self.contracts {
            let hex = c.strip_prefix("0x").or_else(|| c.strip_prefix("0X")).unwrap_or("");
            if hex.len() != 40 || !hex.chars().all(|ch| ch.is_ascii_hexdigit()) {
                return Err(format!("contracts: {c:?} is not an address (0x and 40 hex digits)"));
            }
            *c = format!("0x{}", hex.to_ascii_lowercase());
        }
        for n in &self.networks {
            if n.is_empty() {
                return Err("networks: an empty network id".into());
            }
        }
        Ok(self)
    }

    /// True when no list limits anything.
    pub fn is_open(&self) -> bool {
        self.networks.is_empty() && self.methods.is_empty() && self.contracts.is_empty()
    }

    /// True when the contract list applies to `method` (so the gateway must read its target).
    pub fn needs_target(&self, method: &str) -> bool {
        !self.contracts.is_empty() && sluice_chain::method_info(method).acts_on != ActsOn::Nothing
    }

    /// Refuses a network outside the list, with the message to send.
    pub fn admit_network(&self, network: &str) -> Result<(), String> {
        if self.networks.is_empty() || self.networks.iter().any(|n| n == network) {
            return Ok(());
        }
        Err(format!("the network {network} is outside this key's scope (networks: {})", self.networks.join(", ")))
    }

    /// Refuses a call outside the method or contract lists, with the message to send.
    pub fn admit_call(&self, method: &str, target: Target<'_>) -> Result<(), String> {
        if !self.methods.is_empty() && !self.methods.iter().any(|p| method_matches(p, method)) {
            return Err(format!("{method} is outside this key's scope (methods: {})", self.methods.join(", ")));
        }
        if !self.needs_target(method) {
            return Ok(());
        }
        let list = || self.contracts.join(", ");
        match target {
            Target::Contract(to) if self.contracts.iter().any(|c| c.eq_ignore_ascii_case(to)) => Ok(()),
            Target::Contract(to) => Err(format!("contract {to} is outside this key's scope (contracts: {})", list())),
            Target::None | Target::Unknown => {
                Err(format!("{method} without a contract to call is outside this key's scope (contracts: {})", list()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0x00000000000000000000000000000000000000aa";
    const B: &str = "0x00000000000000000000000000000000000000bb";

    #[test]
    fn methods_and_contracts_limit_calls_and_name_the_scope() {
        let scope = Scope {
            methods: vec!["eth_call".into(), "eth_get*".into(), "eth_sendRawTransaction".into()],
            contracts: vec![A.to_uppercase().replace("0X", "0x")],
            ..Scope::default()
        }
        .normalize()
        .unwrap();
        assert_eq!(scope.contracts, vec![A.to_owned()]);
        assert!(scope.admit_call("eth_getBalance", Target::None).is_ok());
        assert!(scope.admit_call("eth_call", Target::Contract(&A.to_uppercase().replace("0X", "0x"))).is_ok());
        let e = scope.admit_call("eth_call", Target::Contract(B)).unwrap_err();
        assert!(e.contains(B) && e.contains("contracts: 0x…aa".replace("0x…aa", A).as_str()), "{e}");
        assert!(scope.admit_call("eth_sendRawTransaction", Target::Unknown).unwrap_err().contains("contracts"));
        let e = scope.admit_call("eth_blockNumber", Target::None).unwrap_err();
        assert!(e.contains("methods: eth_call, eth_get*"), "{e}");
        assert!(Scope::default().admit_call("anything", Target::Unknown).is_ok());
    }

    #[test]
    fn networks_limit_and_bad_lists_are_named() {
        let scope = Scope { networks: vec!["eth".into()], ..Scope::default() };
        assert!(scope.admit_network("eth").is_ok());
        assert!(scope.admit_network("base").unwrap_err().contains("networks: eth"));
        let bad = Scope { contracts: vec!["0x12".into()], ..Scope::default() }.normalize().unwrap_err();
        assert!(bad.starts_with("contracts:"), "{bad}");
        let bad = Scope { methods: vec!["eth*call".into()], ..Scope::default() }.normalize().unwrap_err();
        assert!(bad.starts_with("methods:"), "{bad}");
    }
}
