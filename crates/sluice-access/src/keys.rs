//! The key book: every key sluice accepts, from the configuration file and managed ones, looked
//! up by the SHA-256 of the key presented. Readers never wait for writers: the whole book is
//! swapped in at once when keys change, and a generation counter tells open WebSocket
//! sessions to check their key again.
//!
//! Managed keys are kept by hash only; the key itself is shown once, when it is created.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::config::KeySpec;
use crate::ip::IpRules;
use crate::scope::Scope;

/// A key's SHA-256.
pub type KeyHash = [u8; 32];

/// The hash of a presented key.
pub fn hash_key(key: &str) -> KeyHash {
    Sha256::digest(key.as_bytes()).into()
}

/// A key's public id: the first 16 hex digits of its hash (safe to log and to show).
pub fn key_id(hash: &KeyHash) -> String {
    hex::encode(&hash[..8])
}

/// Where a key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The configuration file: read-only while running.
    Config,
    /// The admin API.
    Managed,
}

/// A managed key as stored (in Redis or the keys file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Its public id.
    pub id: String,
    /// Its SHA-256, hex.
    pub hash: String,
    /// What it is given.
    pub spec: KeySpec,
    /// When it was created, Unix milliseconds.
    pub created_ms: u64,
}

/// A key as requests see it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its public id.
    pub id: String,
    /// What it is given, as configured.
    pub spec: KeySpec,
    /// Its scope, checked.
    pub scope: Arc<Scope>,
    /// Its address rules.
    pub ips: IpRules,
    /// Where it comes from.
    pub source: Source,
    /// When it was created (managed keys), Unix milliseconds.
    pub created_ms: Option<u64>,
}

#[derive(Default)]
struct Directory {
    by_hash: HashMap<KeyHash, Arc<Entry>>,
    by_id: HashMap<String, Arc<Entry>>,
}

/// Every accepted key.
pub struct KeyBook {
    /// The keys of the configuration file (replaced on reload).
    configured: Mutex<Vec<(KeyHash, Arc<Entry>)>>,
    current: ArcSwap<Directory>,
    /// The managed keys last loaded, by id (what the store holds).
    managed: Mutex<HashMap<String, KeyRecord>>,
    generation: watch::Sender<u64>,
}

fn entry(id: String, spec: KeySpec, source: Source, created_ms: Option<u64>) -> Result<Entry, String> {
    let scope = Arc::new(spec.scope()?);
    let ips = IpRules::new(&spec.allow_ips, &spec.deny_ips);
    Ok(Entry { id, spec, scope, ips, source, created_ms })
}

/// The configuration file's keys as book entries (already validated).
pub fn configured(keys: impl IntoIterator<Item = (String, KeySpec)>) -> Result<Vec<(KeyHash, Arc<Entry>)>, String> {
    let mut list = Vec::new();
    for (key, spec) in keys {
        let hash = hash_key(&key);
        list.push((hash, Arc::new(entry(key_id(&hash), spec, Source::Config, None)?)));
    }
    Ok(list)
}

impl KeyBook {
    /// A book of the configured keys (already validated).
    pub fn new(configured: impl IntoIterator<Item = (String, KeySpec)>) -> Result<Self, String> {
        let book = Self {
            configured: Mutex::new(self::configured(configured)?),
            current: ArcSwap::default(),
            managed: Mutex::default(),
            generation: watch::Sender::new(0),
        };
        book.rebuild(&HashMap::new());
        Ok(book)
    }

    /// Replaces the configured keys (a reload); managed ones stay.
    pub fn replace_configured(&self, configured: Vec<(KeyHash, Arc<Entry>)>) {
        let managed = self.managed.lock().unwrap_or_else(|e| e.into_inner());
        *self.configured.lock().unwrap_or_else(|e| e.into_inner()) = configured;
        self.rebuild(&managed);
    }

    /// The entry of a presented key.
    pub fn lookup(&self, key: &str) -> Option<Arc<Entry>> {
        self.current.load().by_hash.get(&hash_key(key)).cloned()
    }

    /// The entry with this id.
    pub fn by_id(&self, id: &str) -> Option<Arc<Entry>> {
        self.current.load().by_id.get(id).cloned()
    }

    /// Every key, configured first, each group by id.
    pub fn list(&self) -> Vec<Arc<Entry>> {
        let mut all: Vec<Arc<Entry>> = self.current.load().by_id.values().cloned().collect();
        all.sort_by(|a, b| (a.source != Source::Config, &a.id).cmp(&(b.source != Source::Config, &b.id)));
        all
    }

    /// The managed record with this id.
    pub fn record(&self, id: &str) -> Option<KeyRecord> {
        self.managed.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    /// Replaces the managed keys with `records` (as the store holds them); true when that
    /// changed anything. Records that do not parse are logged and left out.
    pub fn replace_managed(&self, records: Vec<KeyRecord>) -> bool {
        let records: HashMap<String, KeyRecord> = records.into_iter().map(|r| (r.id.clone(), r)).collect();
        let mut managed = self.managed.lock().unwrap_or_else(|e| e.into_inner());
        if *managed == records {
            return false;
        }
        *managed = records;
        self.rebuild(&managed);
        true
    }

    /// Adds or replaces one managed key (after the store took it).
    pub fn put(&self, record: KeyRecord) {
        let mut managed = self.managed.lock().unwrap_or_else(|e| e.into_inner());
        managed.insert(record.id.clone(), record);
        self.rebuild(&managed);
    }

    /// Removes one managed key (after the store dropped it).
    pub fn remove(&self, id: &str) {
        let mut managed = self.managed.lock().unwrap_or_else(|e| e.into_inner());
        if managed.remove(id).is_some() {
            self.rebuild(&managed);
        }
    }

    /// The managed keys, as the store should hold them.
    pub fn managed(&self) -> Vec<KeyRecord> {
        let mut all: Vec<KeyRecord> =
            self.managed.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Ticks whenever the keys change.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn rebuild(&self, managed: &HashMap<String, KeyRecord>) {
        let mut directory = Directory::default();
        for (hash, e) in self.configured.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            directory.by_hash.insert(*hash, e.clone());
            directory.by_id.insert(e.id.clone(), e.clone());
        }
        for record in managed.values() {
            let Some(hash) = hex::decode(&record.hash).ok().and_then(|h| KeyHash::try_from(h).ok()) else {
                tracing::warn!(id = %record.id, "managed key with a malformed hash left out");
                continue;
            };
            match entry(record.id.clone(), record.spec.clone(), Source::Managed, Some(record.created_ms)) {
                // A configured key keeps its place: the file wins over the store.
                Ok(e) if !directory.by_hash.contains_key(&hash) => {
                    let e = Arc::new(e);
                    directory.by_hash.insert(hash, e.clone());
                    directory.by_id.insert(e.id.clone(), e);
                }
                Ok(_) => {}
                Err(why) => tracing::warn!(id = %record.id, %why, "managed key left out"),
            }
        }
        self.current.store(Arc::new(directory));
        self.generation.send_modify(|g| *g += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tier: &str) -> KeySpec {
        KeySpec { tier: tier.into(), ..KeySpec::default() }
    }

    fn record(key: &str, tier: &str) -> KeyRecord {
        let hash = hash_key(key);
        KeyRecord { id: key_id(&hash), hash: hex::encode(hash), spec: spec(tier), created_ms: 1 }
    }

    #[test]
    fn keys_are_found_by_hash_and_changes_swap_the_book() {
        let book = KeyBook::new([("k-config".to_owned(), spec("free"))]).unwrap();
        let changes = book.changes();
        assert_eq!(book.lookup("k-config").unwrap().spec.tier, "free");
        assert!(book.lookup("k-new").is_none());
        assert!(book.replace_managed(vec![record("k-new", "pro")]));
        assert!(!book.replace_managed(vec![record("k-new", "pro")]), "no change, no tick");
        assert!(changes.has_changed().unwrap());
        let new = book.lookup("k-new").unwrap();
        assert_eq!((new.spec.tier.as_str(), new.source), ("pro", Source::Managed));
        assert_eq!(book.by_id(&new.id).unwrap().id, new.id);
        assert_eq!(book.list().iter().map(|e| e.source).collect::<Vec<_>>(), vec![Source::Config, Source::Managed]);
        book.remove(&new.id);
        assert!(book.lookup("k-new").is_none());
        // A managed record cannot take over a configured key.
        book.put(record("k-config", "pro"));
        assert_eq!(book.lookup("k-config").unwrap().spec.tier, "free");
    }
}
