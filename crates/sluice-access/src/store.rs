//! Where managed keys live: Redis when configured (every replica reads them; a version counter
//! tells replicas to reload, checked every 200 ms), else a JSON file written atomically
//! (temporary file and rename), read at start.
//!
//! Redis layout: hash `sluice:keys` (field: key id, value: the record as JSON, which holds the
//! key's hash, never the key), counter `sluice:keys:version`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::keys::{KeyBook, KeyRecord};

const KEYS: &str = "sluice:keys";
const VERSION: &str = "sluice:keys:version";
/// [`KEYS`] and [`VERSION`] in a Redis Cluster.
const CLUSTER_KEYS: (&str, &str) = ("sluice:{keys}", "sluice:{keys}:version");
/// How often replicas look for changes made through another replica.
pub const SYNC_EVERY: Duration = Duration::from_millis(200);
const TIMEOUT: Duration = Duration::from_secs(2);

/// The store of managed keys.
pub enum KeyStore {
    /// Kept only in this process (no admin API configured).
    Memory,
    /// A JSON file.
    File(PathBuf),
    /// Redis, shared by every replica.
    Redis(RedisKeys),
}

/// Managed keys in Redis.
pub struct RedisKeys {
    redis: sluice_redis::Redis,
    /// The hash of records and its version counter, changed together.
    keys: &'static str,
    version: &'static str,
}

impl RedisKeys {
    /// Keys at `url`; connects on first use.
    pub fn new(url: &str) -> Result<Self, String> {
        let redis = sluice_redis::Redis::open(url).map_err(|e| format!("access.redis_url: {e}"))?;
        // A Redis Cluster takes the two in one transaction only when they share a slot (a
        // hash tag); a single server or Sentinel keeps the names earlier versions wrote.
        let (keys, version) = if redis.is_cluster() { CLUSTER_KEYS } else { (KEYS, VERSION) };
        Ok(Self { redis, keys, version })
    }

    async fn connection(&self) -> Result<sluice_redis::Connection, String> {
        tokio::time::timeout(TIMEOUT, self.redis.connection())
            .await
            .map_err(|_| "redis: connection timed out".to_owned())?
            .map_err(|e| format!("redis: {e}"))
    }

    async fn run<T: redis::FromRedisValue>(&self, cmd: &redis::Pipeline) -> Result<T, String> {
        let mut c = self.connection().await?;
        tokio::time::timeout(TIMEOUT, cmd.query_async(&mut c))
            .await
            .map_err(|_| "redis: timed out".to_owned())?
            .map_err(|e| format!("redis: {e}"))
    }

    async fn version(&self) -> Result<u64, String> {
        let (v,): (Option<u64>,) = self.run(redis::pipe().get(self.version)).await?;
        Ok(v.unwrap_or(0))
    }

    async fn load(&self) -> Result<Vec<KeyRecord>, String> {
        let (all,): (std::collections::HashMap<String, String>,) = self.run(redis::pipe().hgetall(self.keys)).await?;
        Ok(all
            .into_iter()
            .filter_map(|(id, json)| match serde_json::from_str(&json) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::warn!(%id, error = %e, "unreadable key record in Redis left out");
                    None
                }
            })
            .collect())
    }
}

impl KeyStore {
    /// The keys stored now.
    pub async fn load(&self) -> Result<Vec<KeyRecord>, String> {
        match self {
            KeyStore::Memory => Ok(Vec::new()),
            KeyStore::File(path) => match tokio::fs::read(path).await {
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(format!("{}: {e}", path.display())),
            },
            KeyStore::Redis(redis) => redis.load().await,
        }
    }

    /// Stores `record` (new or changed); `all` is the book's whole managed set with it, which
    /// the file store writes whole.
    pub async fn put(&self, record: &KeyRecord, all: &[KeyRecord]) -> Result<(), String> {
        match self {
            KeyStore::Memory => Ok(()),
            KeyStore::File(path) => write_file(path, all).await,
            KeyStore::Redis(redis) => {
                let json = serde_json::to_string(record).map_err(|e| e.to_string())?;
                let mut pipe = redis::pipe();
                pipe.atomic().hset(redis.keys, &record.id, json).ignore().incr(redis.version, 1).ignore();
                redis.run::<()>(&pipe).await
            }
        }
    }

    /// Removes the key `id`; `all` is the managed set without it.
    pub async fn remove(&self, id: &str, all: &[KeyRecord]) -> Result<(), String> {
        match self {
            KeyStore::Memory => Ok(()),
            KeyStore::File(path) => write_file(path, all).await,
            KeyStore::Redis(redis) => {
                let mut pipe = redis::pipe();
                pipe.atomic().hdel(redis.keys, id).ignore().incr(redis.version, 1).ignore();
                redis.run::<()>(&pipe).await
            }
        }
    }

    /// Keeps `book` in step with a Redis store: reloads whenever the version counter moves
    /// (checked every [`SYNC_EVERY`]). Runs until the book is dropped. Other stores have one
    /// writer, this process, and need no sync.
    pub fn spawn_sync(self: Arc<Self>, book: std::sync::Weak<KeyBook>) {
        let KeyStore::Redis(_) = &*self else { return };
        tokio::spawn(async move {
            let KeyStore::Redis(redis) = &*self else { return };
            let mut seen: Option<u64> = None;
            let mut warned = false;
            loop {
                let Some(book) = book.upgrade() else { return };
                let result = match redis.version().await {
                    Ok(v) if Some(v) == seen => Ok(()),
                    Ok(v) => redis.load().await.map(|records| {
                        book.replace_managed(records);
                        seen = Some(v);
                    }),
                    Err(e) => Err(e),
                };
                drop(book);
                match result {
                    Ok(()) => warned = false,
                    Err(e) => {
                        metrics::counter!("sluice_access_store_errors_total").increment(1);
                        if !std::mem::replace(&mut warned, true) {
                            tracing::warn!(error = %e, "managed keys could not be read from Redis; keeping the last ones");
                        }
                    }
                }
                tokio::time::sleep(SYNC_EVERY).await;
            }
        });
    }
}

async fn write_file(path: &PathBuf, all: &[KeyRecord]) -> Result<(), String> {
    let json = serde_json::to_vec_pretty(all).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("json.tmp");
    let write = async {
        tokio::fs::write(&tmp, &json).await?;
        let file = tokio::fs::File::open(&tmp).await?;
        file.sync_all().await?;
        tokio::fs::rename(&tmp, path).await
    };
    write.await.map_err(|e| format!("{}: {e}", path.display()))
}
