//! Keys managed while running: create, list, change, revoke, and read usage. The admin API (in
//! the gateway) is a thin HTTP shell over these.
//!
//! A change is written to the store first, then applied to this replica's book at once; other
//! replicas see it when they next look at the store (Redis: within [`crate::store::SYNC_EVERY`]).
//! Keys from the configuration file are listed but read-only.

use serde::{Deserialize, Serialize};

use crate::config::KeySpec;
use crate::ip::Cidr;
use crate::keys::{hash_key, key_id, Entry, KeyRecord, Source};
use crate::usage::DayUsage;
use crate::{day_of, jwt, now_ms, Access};

/// Why a change is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManageError {
    /// A bad body: names the field (HTTP 400).
    Invalid(String),
    /// No key with this id (404).
    NotFound(String),
    /// A key from the configuration file (409).
    ReadOnly(String),
    /// The store did not take the change (503); nothing changed.
    Store(String),
}

impl std::fmt::Display for ManageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ManageError::Invalid(m) | ManageError::NotFound(m) | ManageError::ReadOnly(m) | ManageError::Store(m) => {
                f.write_str(m)
            }
        }
    }
}

/// A change to a key: only the fields given change.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyPatch {
    /// A new tier.
    pub tier: Option<String>,
    /// New network list (empty: no limit).
    pub networks: Option<Vec<String>>,
    /// New method patterns.
    pub methods: Option<Vec<String>>,
    /// New contract list.
    pub contracts: Option<Vec<String>>,
    /// New allowed addresses.
    pub allow_ips: Option<Vec<Cidr>>,
    /// New refused addresses.
    pub deny_ips: Option<Vec<Cidr>>,
    /// A new label.
    pub label: Option<String>,
}

/// A key as the admin API shows it (never the key itself, except once on creation).
#[derive(Debug, Clone, Serialize)]
pub struct KeyView {
    /// Its id.
    pub id: String,
    /// The key, only in the answer that created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `config` or `managed`.
    pub source: Source,
    /// When it was created (managed keys), Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// What it is given.
    #[serde(flatten)]
    pub spec: KeySpec,
}

impl From<&Entry> for KeyView {
    fn from(e: &Entry) -> Self {
        KeyView { id: e.id.clone(), key: None, source: e.source, created_ms: e.created_ms, spec: e.spec.clone() }
    }
}

/// A generated key: `sk_` and 48 hex digits (192 random bits).
fn generate_key() -> String {
    format!("sk_{}", hex::encode(rand::random::<[u8; 24]>()))
}

impl Access {
    /// Checks a spec against this configuration and the `networks` served.
    fn check_spec(&self, spec: &KeySpec, networks: &[String]) -> Result<(), ManageError> {
        if spec.tier.is_empty() {
            return Err(ManageError::Invalid("tier: missing".into()));
        }
        if !self.has_tier(&spec.tier) {
            let known = self.tier_names();
            return Err(ManageError::Invalid(format!(
                "tier: {:?} is not defined (tiers: {})",
                spec.tier,
                known.join(", ")
            )));
        }
        if let Some(n) = spec.networks.iter().find(|n| !networks.contains(n)) {
            return Err(ManageError::Invalid(format!("networks: {n:?} is not served here ({})", networks.join(", "))));
        }
        spec.scope().map(|_| ()).map_err(ManageError::Invalid)
    }

    /// Every key, configured ones first.
    pub fn list_keys(&self) -> Vec<KeyView> {
        self.book.list().iter().map(|e| KeyView::from(&**e)).collect()
    }

    /// The key with this id.
    pub fn key(&self, id: &str) -> Result<KeyView, ManageError> {
        self.book.by_id(id).map(|e| KeyView::from(&*e)).ok_or_else(|| not_found(id))
    }

    /// Creates a key (generated unless `key` is given); the answer holds the key, once.
    pub async fn create_key(
        &self,
        spec: KeySpec,
        key: Option<String>,
        networks: &[String],
    ) -> Result<KeyView, ManageError> {
        self.check_spec(&spec, networks)?;
        let key = match key {
            Some(k) if k.len() < 16 || k.len() > 128 => {
                return Err(ManageError::Invalid("key: must be 16 to 128 characters".into()))
            }
            Some(k)
                if !k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) || jwt::looks_like_jwt(&k) =>
            {
                return Err(ManageError::Invalid(
                    "key: only letters, digits, '-', '_' and '.' (and not a token's shape)".into(),
                ))
            }
            Some(k) => k,
            None => generate_key(),
        };
        let hash = hash_key(&key);
        let id = key_id(&hash);
        let _write = self.writes.lock().await;
        if self.book.by_id(&id).is_some() {
            return Err(ManageError::Invalid("key: this key exists already".into()));
        }
        let record = KeyRecord { id: id.clone(), hash: hex::encode(hash), spec, created_ms: now_ms() };
        let mut all = self.book.managed();
        all.push(record.clone());
        self.keys.put(&record, &all).await.map_err(ManageError::Store)?;
        self.book.put(record);
        let mut view = self.key(&id)?;
        view.key = Some(key);
        tracing::info!(%id, tier = %view.spec.tier, "key created");
        Ok(view)
    }

    /// Changes a managed key's tier, scope, address rules or label.
    pub async fn update_key(&self, id: &str, patch: KeyPatch, networks: &[String]) -> Result<KeyView, ManageError> {
        let _write = self.writes.lock().await;
        let mut record = self.managed_record(id)?;
        let spec = &mut record.spec;
        let KeyPatch { tier, networks: nets, methods, contracts, allow_ips, deny_ips, label } = patch;
        spec.tier = tier.unwrap_or_else(|| spec.tier.clone());
        spec.networks = nets.unwrap_or_else(|| spec.networks.clone());
        spec.methods = methods.unwrap_or_else(|| spec.methods.clone());
        spec.contracts = contracts.unwrap_or_else(|| spec.contracts.clone());
        spec.allow_ips = allow_ips.unwrap_or_else(|| spec.allow_ips.clone());
        spec.deny_ips = deny_ips.unwrap_or_else(|| spec.deny_ips.clone());
        spec.label = label.or_else(|| spec.label.clone());
        self.check_spec(&record.spec, networks)?;
        let mut all: Vec<KeyRecord> = self.book.managed().into_iter().filter(|r| r.id != id).collect();
        all.push(record.clone());
        self.keys.put(&record, &all).await.map_err(ManageError::Store)?;
        self.book.put(record);
        tracing::info!(%id, "key changed");
        self.key(id)
    }

    /// Revokes a managed key: refused from now on, and open WebSockets on it are closed.
    pub async fn revoke_key(&self, id: &str) -> Result<(), ManageError> {
        let _write = self.writes.lock().await;
        self.managed_record(id)?;
        let all: Vec<KeyRecord> = self.book.managed().into_iter().filter(|r| r.id != id).collect();
        self.keys.remove(id, &all).await.map_err(ManageError::Store)?;
        self.book.remove(id);
        tracing::info!(%id, "key revoked");
        Ok(())
    }

    /// A key's usage over the last `days` UTC days (today last).
    pub async fn key_usage(&self, id: &str, days: u64) -> Result<Vec<DayUsage>, ManageError> {
        self.book.by_id(id).ok_or_else(|| not_found(id))?;
        let today = day_of(now_ms()).0;
        let first = today.saturating_sub(days.clamp(1, crate::usage::KEEP_DAYS) - 1);
        self.usage.read(id, first..=today).await.map_err(ManageError::Store)
    }

    /// Any caller's usage (a token's subject `jwt:…`, or `anonymous`) over the last `days`.
    pub async fn caller_usage(&self, caller: &str, days: u64) -> Result<Vec<DayUsage>, ManageError> {
        let today = day_of(now_ms()).0;
        let first = today.saturating_sub(days.clamp(1, crate::usage::KEEP_DAYS) - 1);
        self.usage.read(caller, first..=today).await.map_err(ManageError::Store)
    }

    fn managed_record(&self, id: &str) -> Result<KeyRecord, ManageError> {
        match self.book.by_id(id) {
            None => Err(not_found(id)),
            Some(e) if e.source == Source::Config => {
                Err(ManageError::ReadOnly(format!("key {id} is defined in the configuration file; change it there")))
            }
            Some(_) => self.book.record(id).ok_or_else(|| not_found(id)),
        }
    }
}

fn not_found(id: &str) -> ManageError {
    ManageError::NotFound(format!("no key with id {id:?}"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{AccessConfig, Credentials, KeyEntry, Refusal, Tier};

    fn access() -> Access {
        let tiers: HashMap<String, Tier> =
            [("free".to_owned(), Tier::default()), ("pro".to_owned(), Tier::default())].into();
        let keys = [("k-config-000000001".to_owned(), KeyEntry::Tier("free".into()))].into();
        Access::new(AccessConfig { tiers, keys, ..AccessConfig::default() }).unwrap()
    }

    fn with(key: &str) -> Credentials<'_> {
        Credentials { key: Some(key), client_ip: None }
    }

    #[tokio::test]
    async fn keys_created_changed_and_revoked_take_effect_at_once() {
        let access = access();
        let nets = vec!["eth".to_owned()];
        let spec = KeySpec { tier: "free".into(), ..KeySpec::default() };
        let created = access.create_key(spec, None, &nets).await.unwrap();
        let key = created.key.clone().unwrap();
        assert!(key.starts_with("sk_") && key.len() == 51);
        let caller = access.identify(with(&key)).unwrap();
        assert_eq!((caller.tier.as_str(), caller.key_id.as_deref()), ("free", Some(created.id.as_str())));

        let patch = KeyPatch { tier: Some("pro".into()), networks: Some(nets.clone()), ..KeyPatch::default() };
        access.update_key(&created.id, patch, &nets).await.unwrap();
        let refreshed = access.refresh(&caller).unwrap();
        assert_eq!(refreshed.tier, "pro");
        assert_eq!(refreshed.scope.networks, nets);

        access.revoke_key(&created.id).await.unwrap();
        assert_eq!(access.identify(with(&key)).unwrap_err(), Refusal::Unauthorized("unknown API key".into()));
        assert_eq!(access.refresh(&caller).unwrap_err(), Refusal::Unauthorized("API key revoked".into()));
        assert!(matches!(access.revoke_key(&created.id).await, Err(ManageError::NotFound(_))));
    }

    #[tokio::test]
    async fn bad_changes_name_the_field_and_configured_keys_are_read_only() {
        let access = access();
        let nets = vec!["eth".to_owned()];
        let bad = |tier: &str| KeySpec { tier: tier.into(), ..KeySpec::default() };
        let e = access.create_key(bad("gold"), None, &nets).await.unwrap_err();
        assert!(e.to_string().starts_with("tier:"), "{e}");
        let spec = KeySpec { networks: vec!["base".into()], ..bad("free") };
        assert!(access.create_key(spec, None, &nets).await.unwrap_err().to_string().starts_with("networks:"));
        let spec = KeySpec { contracts: vec!["0x1".into()], ..bad("free") };
        assert!(access.create_key(spec, None, &nets).await.unwrap_err().to_string().starts_with("contracts:"));
        assert!(access
            .create_key(bad("free"), Some("short".into()), &nets)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("key:"));
        let config_id = access.list_keys()[0].id.clone();
        assert!(matches!(access.revoke_key(&config_id).await, Err(ManageError::ReadOnly(_))));
        let own = access.create_key(bad("free"), Some("my-own-key-0000001".into()), &nets).await.unwrap();
        assert_eq!(own.key.as_deref(), Some("my-own-key-0000001"));
        assert!(access.create_key(bad("free"), Some("my-own-key-0000001".into()), &nets).await.is_err());
        assert_eq!(access.list_keys().len(), 2);
    }
}
