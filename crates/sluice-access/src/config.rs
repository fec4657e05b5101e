//! The `[access]` section: keys, tiers, tokens, address rules and the admin API.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::gcra;
use crate::ip::Cidr;
use crate::jwt::JwtConfig;
use crate::scope::{method_matches, Scope};

/// One tier's limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tier {
    /// Compute units per second (a call costs 1 unless `costs` says otherwise); none: unlimited.
    pub per_second: Option<f64>,
    /// Units that may arrive at once (default: one second's worth).
    pub burst: Option<u32>,
    /// Compute units per UTC day; none: unlimited.
    pub per_day: Option<u64>,
    /// Cost of a method (`prefix*` patterns allowed), e.g. { "eth_getLogs" = 10 }.
    pub costs: HashMap<String, u32>,
    /// Methods this tier may not call (added to the global policy's deny list).
    pub deny: Vec<String>,
    /// Methods this tier may call even when denied (globally or here).
    pub allow: Vec<String>,
    /// Load-shedding priority, 0 (highest, the default) to 9: under overload, a tier of
    /// priority p is refused once the gateway holds (10 − p)/10 of its in-flight capacity.
    pub priority: u8,
    /// WebSocket connections one key may hold open at once (per replica); none: unlimited.
    pub max_connections: Option<u32>,
    /// Subscriptions one key may hold across its connections (per replica); none: unlimited.
    pub max_subscriptions: Option<u32>,
    /// Networks (by id) this tier may use; empty: every network.
    pub networks: Vec<String>,
    /// Client addresses this tier may be used from (empty: any).
    pub allow_ips: Vec<Cidr>,
    /// Client addresses this tier may not be used from.
    pub deny_ips: Vec<Cidr>,
}

impl Tier {
    /// True when this tier may use the network with this id.
    pub fn serves(&self, network: &str) -> bool {
        self.networks.is_empty() || self.networks.iter().any(|n| n == network)
    }

    /// What one call of `method` costs.
    pub fn cost_of(&self, method: &str) -> u32 {
        let exact = self.costs.get(method).copied();
        let prefix =
            || self.costs.iter().filter(|(p, _)| p.ends_with('*') && method_matches(p, method)).map(|(_, c)| *c).max();
        exact.or_else(prefix).unwrap_or(1)
    }

    /// What a request of these methods costs.
    pub fn cost<'a>(&self, methods: impl IntoIterator<Item = &'a str>) -> u32 {
        methods.into_iter().map(|m| self.cost_of(m)).fold(0u32, u32::saturating_add)
    }

    pub(crate) fn rate(&self) -> Option<gcra::Rate> {
        let per_second = self.per_second?;
        let burst = self.burst.unwrap_or_else(|| per_second.ceil().max(1.0) as u32);
        Some(gcra::Rate { per_second, burst })
    }
}

/// What a key is given: its tier, and optionally a scope and address rules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeySpec {
    /// The tier's name.
    pub tier: String,
    /// Networks the key may use (empty: its tier's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Method patterns the key may call (empty: all its tier allows).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Contracts the key may call (empty: all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contracts: Vec<String>,
    /// Client addresses the key may be used from (empty: any).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_ips: Vec<Cidr>,
    /// Client addresses the key may not be used from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_ips: Vec<Cidr>,
    /// A note for operators (who holds the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl KeySpec {
    /// The key's scope, checked (the error names the field).
    pub fn scope(&self) -> Result<Scope, String> {
        Scope { networks: self.networks.clone(), methods: self.methods.clone(), contracts: self.contracts.clone() }
            .normalize()
    }
}

/// A key in the configuration file: `"KEY" = "tier"`, or `"KEY" = { tier = "…", … }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum KeyEntry {
    /// Only a tier.
    Tier(String),
    /// A tier with a scope or address rules.
    Spec(KeySpec),
}

impl KeyEntry {
    /// As a full spec.
    pub fn spec(&self) -> KeySpec {
        match self {
            KeyEntry::Tier(tier) => KeySpec { tier: tier.clone(), ..KeySpec::default() },
            KeyEntry::Spec(spec) => spec.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for KeyEntry {
    // By hand rather than `untagged`, so that a bad table says which field is wrong.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = KeyEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a tier name, or a table with tier and optional networks, methods, contracts, allow_ips, deny_ips, label")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<KeyEntry, E> {
                Ok(KeyEntry::Tier(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<KeyEntry, A::Error> {
                KeySpec::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(KeyEntry::Spec)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `[access.admin]`: the API that manages keys while sluice runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Its own listen address (keep it private: loopback or an operators' network).
    pub listen: SocketAddr,
    /// The bearer token it requires (16 characters or more); set it from the environment
    /// (`SLUICE_ACCESS__ADMIN__TOKEN`) rather than in the file.
    pub token: String,
    /// Where managed keys are kept without Redis (default `sluice-keys.json`).
    #[serde(default)]
    pub keys_file: Option<PathBuf>,
}

/// What the access section of the configuration holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// API key → tier name, or a table with the tier and the key's scope.
    pub keys: HashMap<String, KeyEntry>,
    /// Tier name → limits.
    pub tiers: HashMap<String, Tier>,
    /// The tier of callers without a key; none: they are refused (401).
    pub anonymous: Option<String>,
    /// Share quotas, managed keys and usage through Redis (`redis://…`); none: in memory, per replica.
    pub redis_url: Option<String>,
    /// With Redis unreachable, let requests through (true) or refuse them (false).
    pub fail_open: bool,
    /// JSON Web Tokens accepted as `Authorization: Bearer`.
    pub jwt: Option<JwtConfig>,
    /// Client addresses that may call at all (empty: any).
    pub allow_ips: Vec<Cidr>,
    /// Client addresses that may not call, whatever the allow lists say.
    pub deny_ips: Vec<Cidr>,
    /// Proxies whose `X-Forwarded-For` / `Forwarded` header names the client.
    pub trusted_proxies: Vec<Cidr>,
    /// The key-management API.
    pub admin: Option<AdminConfig>,
}

impl AccessConfig {
    /// Every key, token default and the anonymous tier name an existing tier; scopes and
    /// tokens' keys are well formed.
    pub fn validate(&self) -> Result<(), String> {
        for (key, entry) in &self.keys {
            let spec = entry.spec();
            if !self.tiers.contains_key(&spec.tier) {
                return Err(format!(
                    "access.keys: key {}… names tier {:?}, which is not defined",
                    prefix(key),
                    spec.tier
                ));
            }
            spec.scope().map_err(|e| format!("access.keys: key {}…: {e}", prefix(key)))?;
        }
        if let Some(tier) = &self.anonymous {
            if !self.tiers.contains_key(tier) {
                return Err(format!("access.anonymous: tier {tier:?} is not defined"));
            }
        }
        for (name, tier) in &self.tiers {
            if tier.per_second.is_some_and(|r| r <= 0.0 || !r.is_finite()) {
                return Err(format!("access.tiers.{name}.per_second: must be more than zero"));
            }
        }
        if let Some(jwt) = &self.jwt {
            if let Some(tier) = jwt.default_tier.as_ref().filter(|t| !self.tiers.contains_key(*t)) {
                return Err(format!("access.jwt.default_tier: tier {tier:?} is not defined"));
            }
            crate::jwt::Jwt::new(jwt)?;
        }
        if let Some(admin) = &self.admin {
            if admin.token.len() < 16 {
                return Err("access.admin.token: must be 16 characters or more".into());
            }
        }
        Ok(())
    }
}

/// The first characters of a key, enough to recognise it in a message.
pub(crate) fn prefix(key: &str) -> &str {
    key.get(..4).unwrap_or(key)
}
