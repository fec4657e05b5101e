//! What sluice replicas share through Redis besides the cache tier and the quotas: one head
//! follower per deployment ([`RedisHeads`], the Redis side of [`sluice_upstream::SharedHeads`]).
//!
//! Per network, three keys under `sluice:heads:{network}` (the braces are a hash tag: in a
//! Redis Cluster they share a slot, so one pipeline or script can touch them together):
//! * `…:lease`: the follower's lease, `SET NX PX` by whoever takes it, renewed by its holder
//!   only (a script compares the holder before extending), deleted by its holder on shutdown;
//! * `…:window`: the newest headers, a sorted set by height, in the node's JSON form;
//!   `…:finality`: the latest `safe`/`finalized` read;
//! * the channel `…:news`: every header the follower feeds and every finality read.
//!
//! Every operation has a deadline of its own: a store that hangs is a store that is down, and
//! the replica then follows by itself.

use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sluice_chain::Header;
use sluice_redis::{Connection, Redis};
use sluice_upstream::{HeadNews, SharedHeads, StoreError};
use tokio::sync::mpsc;

/// The `[cluster]` section: what replicas share beyond the cache and the quotas.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The Redis replicas share (`redis://host:port/db`, `redis+sentinel://…`,
    /// `redis+cluster://…`); absent: `[cache.redis] url`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// One head follower per network for the replicas sharing that Redis (default on).
    pub share_heads: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self { redis_url: None, share_heads: true }
    }
}

/// Deadline of one store operation.
const DEADLINE: Duration = Duration::from_secs(1);
/// Most news queued for the watcher; beyond it the oldest news is not worth the wait (the
/// watcher fetches parents it lacks).
const BACKLOG: usize = 1024;

/// Takes the lease when free or held by `ARGV[1]`, for `ARGV[2]` ms; 1 when held by it now.
const HOLD: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";

/// Deletes the lease when `ARGV[1]` holds it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// One network's shared head following in Redis.
pub struct RedisHeads {
    redis: Redis,
    /// This replica, as the lease names it.
    id: String,
    lease: String,
    window: String,
    finality: String,
    news: String,
    hold: redis::Script,
    release: redis::Script,
}

impl RedisHeads {
    /// The shared following of network `network` in the Redis at `url`. Connects on first use
    /// (a Redis down at start is a store down: this replica follows by itself meanwhile).
    pub fn new(url: &str, network: &str) -> Result<Self, String> {
        let redis = Redis::open(url).map_err(|e| format!("cluster.redis_url: {e}"))?;
        let prefix = format!("sluice:heads:{{{network}}}");
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        Ok(Self {
            redis,
            id: format!("{}-{nanos:x}", std::process::id()),
            lease: format!("{prefix}:lease"),
            window: format!("{prefix}:window"),
            finality: format!("{prefix}:finality"),
            news: format!("{prefix}:news"),
            hold: redis::Script::new(HOLD),
            release: redis::Script::new(RELEASE),
        })
    }

    async fn connection(&self) -> Result<Connection, StoreError> {
        let made = tokio::time::timeout(DEADLINE, self.redis.connection()).await;
        made.map_err(|_| StoreError("connect: timed out".into()))?.map_err(fail)
    }

    /// Runs `work` on a connection within the deadline.
    async fn with<T, F, Fut>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let connection = self.connection().await?;
        match tokio::time::timeout(DEADLINE, work(connection)).await {
            Ok(result) => result.map_err(fail),
            Err(_) => Err(StoreError("timed out".into())),
        }
    }
}

fn fail(e: redis::RedisError) -> StoreError {
    StoreError(e.to_string())
}

/// The window's trim: keep the newest `window` entries.
fn trim(pipe: &mut redis::Pipeline, key: &str, window: usize) {
    pipe.cmd("ZREMRANGEBYRANK").arg(key).arg(0).arg(-(window as i64) - 1).ignore();
    // Left behind by a deployment that stopped: gone after a day.
    pipe.cmd("EXPIRE").arg(key).arg(86_400).ignore();
}

#[async_trait]
impl SharedHeads for RedisHeads {
    async fn hold(&self, ttl: Duration) -> Result<bool, StoreError> {
        let ms = ttl.as_millis() as u64;
        let held: i64 = self
            .with(|mut c| async move { self.hold.key(&self.lease).arg(&self.id).arg(ms).invoke_async(&mut c).await })
            .await?;
        Ok(held == 1)
    }

    async fn release(&self) -> Result<(), StoreError> {
        let _: i64 = self
            .with(|mut c| async move { self.release.key(&self.lease).arg(&self.id).invoke_async(&mut c).await })
            .await?;
        Ok(())
    }

    async fn publish(&self, news: &HeadNews, window: usize) -> Result<(), StoreError> {
        let text = news.to_json();
        let mut pipe = redis::pipe();
        match news {
            HeadNews::Header { header, .. } => {
                let entry = header.to_json().to_string();
                // An abandoned branch's headers at and above this one leave the window.
                pipe.cmd("ZREMRANGEBYSCORE").arg(&self.window).arg(header.number).arg("+inf").ignore();
                pipe.cmd("ZADD").arg(&self.window).arg(header.number).arg(entry).ignore();
                trim(&mut pipe, &self.window, window);
            }
            HeadNews::Finality { .. } => {
                pipe.cmd("SET").arg(&self.finality).arg(&text).arg("EX").arg(86_400).ignore();
            }
        }
        pipe.cmd("PUBLISH").arg(&self.news).arg(&text).ignore();
        self.with(|mut c| async move { pipe.query_async::<()>(&mut c).await }).await
    }

    async fn store(&self, headers: &[Header], window: usize) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for header in headers {
            pipe.cmd("ZADD").arg(&self.window).arg(header.number).arg(header.to_json().to_string()).ignore();
        }
        trim(&mut pipe, &self.window, window);
        self.with(|mut c| async move { pipe.query_async::<()>(&mut c).await }).await
    }

    async fn subscribe(&self) -> Result<mpsc::Receiver<HeadNews>, StoreError> {
        let subscribe = async {
            let mut pubsub = self.redis.pubsub().await?;
            pubsub.subscribe(&self.news).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = match tokio::time::timeout(DEADLINE, subscribe).await {
            Ok(made) => made.map_err(fail)?,
            Err(_) => return Err(StoreError("subscribe: timed out".into())),
        };
        let (tx, rx) = mpsc::channel(BACKLOG);
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Ok(text) = message.get_payload::<String>() else { continue };
                if let Some(news) = HeadNews::from_json(&text) {
                    if tx.send(news).await.is_err() {
                        return; // the watcher stopped reading
                    }
                }
            }
        });
        Ok(rx)
    }

    async fn window(&self) -> Result<(Vec<Header>, Option<HeadNews>), StoreError> {
        let (entries, finality): (Vec<String>, Option<String>) = self
            .with(|mut c| async move {
                redis::pipe()
                    .cmd("ZREVRANGE")
                    .arg(&self.window)
                    .arg(0)
                    .arg(-1)
                    .cmd("GET")
                    .arg(&self.finality)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let headers = entries.iter().filter_map(|e| serde_json::from_str::<Header>(e).ok()).collect();
        Ok((headers, finality.as_deref().and_then(HeadNews::from_json)))
    }
}
