//! The shared tier: Redis, for many sluice replicas. Fail-open: when Redis is down or slow,
//! calls go on without it; each failure is counted, and logged once per outage.
//!
//! Keys are `sluice:{chain id}:{sha256 of the cache key}`, so one Redis serves many chains and
//! long `eth_call` payloads make short keys. Values are a one-byte format tag, the entry's
//! `max_block` (8 bytes, `u64::MAX` for immutable), then the result, LZ4-compressed when it is
//! over 1 KiB and compression pays.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sluice_jsonrpc::RawValue;
use tokio::sync::Semaphore;

/// Settings for the Redis tier.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://host:port/db`, `redis+sentinel://…` or `redis+cluster://…` (`sluice_redis::url`).
    pub url: String,
    /// Deadline for one Redis operation; slower counts as a failure.
    pub timeout: Duration,
    /// Time to live for answers that never change.
    pub ttl_immutable: Duration,
    /// Time to live for answers tied to a block that is not final yet.
    pub ttl_head: Duration,
}

const RAW: u8 = b'r';
const LZ4: u8 = b'z';
const COMPRESS_OVER: usize = 1024;
/// Writes in flight at once; beyond it writes are skipped (and counted), never queued.
const MAX_PENDING_WRITES: usize = 256;

/// The Redis tier.
pub struct RedisTier {
    redis: sluice_redis::Redis,
    /// Connected once: until then the tier is off, not waited for.
    ready: Arc<AtomicBool>,
    config: RedisConfig,
    healthy: Arc<AtomicBool>,
    writes: Arc<Semaphore>,
}

impl RedisTier {
    /// Validates the URL and starts connecting in the background (a Redis that is down at start
    /// is not an error: the tier stays off until it answers).
    pub fn new(config: RedisConfig) -> Result<Self, String> {
        let redis = sluice_redis::Redis::open(&config.url).map_err(|e| format!("redis url: {e}"))?;
        let ready = Arc::new(AtomicBool::new(false));
        let (first, flag) = (redis.clone(), ready.clone());
        metrics::gauge!("sluice_cache_redis_connected").set(0.0);
        tokio::spawn(async move {
            loop {
                match first.connection().await {
                    Ok(_) => {
                        tracing::info!("redis tier connected");
                        flag.store(true, Ordering::Relaxed);
                        metrics::gauge!("sluice_cache_redis_connected").set(1.0);
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "redis not reachable yet");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(Self {
            redis,
            ready,
            config,
            healthy: Arc::new(AtomicBool::new(true)),
            writes: Arc::new(Semaphore::new(MAX_PENDING_WRITES)),
        })
    }

    fn redis_key(chain_id: u64, key: &str) -> String {
        let digest = Sha256::digest(key.as_bytes());
        let mut out = format!("sluice:{chain_id}:");
        for byte in digest {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }

    /// Looks a key up; `None` on a miss or any failure.
    pub async fn get(&self, chain_id: u64, key: &str) -> Option<(Box<RawValue>, Option<u64>)> {
        if !self.ready.load(Ordering::Relaxed) {
            return None;
        }
        let redis_key = Self::redis_key(chain_id, key);
        let fetched = tokio::time::timeout(self.config.timeout, async {
            let mut connection = self.redis.connection().await?;
            redis::cmd("GET").arg(&redis_key).query_async::<Option<Vec<u8>>>(&mut connection).await
        })
        .await;
        let bytes = match fetched {
            Ok(Ok(bytes)) => {
                mark_healthy(&self.healthy);
                bytes?
            }
            Ok(Err(e)) => return failure(&self.healthy, &e.to_string()),
            Err(_) => return failure(&self.healthy, "timed out"),
        };
        decode(&bytes)
    }

    /// Stores an entry in the background; never waits, never fails the caller.
    pub fn put(&self, chain_id: u64, key: &str, result: &RawValue, max_block: Option<u64>) {
        if !self.ready.load(Ordering::Relaxed) {
            return;
        }
        let Ok(permit) = self.writes.clone().try_acquire_owned() else {
            metrics::counter!("sluice_cache_redis_skipped_writes_total").increment(1);
            return;
        };
        let redis = self.redis.clone();
        let redis_key = Self::redis_key(chain_id, key);
        let value = encode(result.get().as_bytes(), max_block);
        let ttl = if max_block.is_some() { self.config.ttl_head } else { self.config.ttl_immutable };
        let (timeout, healthy) = (self.config.timeout, self.healthy.clone());
        tokio::spawn(async move {
            let stored = tokio::time::timeout(timeout, async {
                let mut connection = redis.connection().await?;
                redis::cmd("SET")
                    .arg(&redis_key)
                    .arg(value)
                    .arg("EX")
                    .arg(ttl.as_secs().max(1))
                    .query_async::<()>(&mut connection)
                    .await
            })
            .await;
            match stored {
                Ok(Ok(())) => mark_healthy(&healthy),
                Ok(Err(e)) => _ = failure::<()>(&healthy, &e.to_string()),
                Err(_) => _ = failure::<()>(&healthy, "timed out"),
            }
            drop(permit);
        });
    }
}

fn mark_healthy(healthy: &AtomicBool) {
    if !healthy.swap(true, Ordering::Relaxed) {
        tracing::info!("redis tier answering again");
    }
}

fn failure<T>(healthy: &AtomicBool, why: &str) -> Option<T> {
    metrics::counter!("sluice_cache_redis_errors_total").increment(1);
    if healthy.swap(false, Ordering::Relaxed) {
        tracing::warn!(why, "redis tier failing; serving without it until it recovers");
    }
    None
}

fn encode(result: &[u8], max_block: Option<u64>) -> Vec<u8> {
    let block = max_block.unwrap_or(u64::MAX).to_be_bytes();
    if result.len() > COMPRESS_OVER {
        let compressed = lz4_flex::compress_prepend_size(result);
        if compressed.len() < result.len() {
            return [&[LZ4][..], &block, &compressed].concat();
        }
    }
    [&[RAW][..], &block, result].concat()
}

fn decode(bytes: &[u8]) -> Option<(Box<RawValue>, Option<u64>)> {
    let (&tag, rest) = bytes.split_first()?;
    let (block, payload) = rest.split_at_checked(8)?;
    let max_block = u64::from_be_bytes(block.try_into().ok()?);
    let text = match tag {
        RAW => String::from_utf8(payload.to_vec()).ok()?,
        LZ4 => String::from_utf8(lz4_flex::decompress_size_prepended(payload).ok()?).ok()?,
        _ => return None,
    };
    let raw = RawValue::from_string(text).ok()?;
    Some((raw, (max_block != u64::MAX).then_some(max_block)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_large_ones_shrink() {
        let small = br#"{"a":1}"#;
        let large = format!(r#"{{"data":"{}"}}"#, "ab".repeat(5000));
        let encoded = encode(large.as_bytes(), Some(7));
        assert!(encoded.len() < large.len() / 4, "{} vs {}", encoded.len(), large.len());
        let (raw, block) = decode(&encoded).unwrap();
        assert_eq!((raw.get(), block), (large.as_str(), Some(7)));
        let (raw, block) = decode(&encode(small, None)).unwrap();
        assert_eq!((raw.get().as_bytes(), block), (&small[..], None));
        assert!(decode(b"x12345678{}").is_none());
        assert!(decode(b"r123").is_none());
    }

    #[test]
    fn keys_name_the_chain_and_hide_the_payload() {
        let key = RedisTier::redis_key(31337, &format!("eth_call[{}]", "0".repeat(10_000)));
        assert!(key.starts_with("sluice:31337:"));
        assert_eq!(key.len(), "sluice:31337:".len() + 64);
    }
}
