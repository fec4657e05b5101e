//! One way to reach the Redis that sluice replicas share, for every part that shares state
//! there (the cache tier, keys, quotas and usage, upstream budgets, head following).
//!
//! A URL names one server, a Sentinel-managed master or a Redis Cluster ([`url`]). The
//! connection a part gets speaks plain Redis commands alike ([`redis::aio::ConnectionLike`]):
//! * one server: the `redis` crate's connection manager, which reconnects by itself;
//! * Sentinel: a manager to the master the Sentinels name. A connection failure or a
//!   `READONLY` answer (the old master came back as a replica) forgets it, and the next
//!   operation asks the Sentinels again: a failover costs the operations in flight, not a
//!   restart. Nothing is retried here: a write that may have been applied is not sent twice
//!   (each part decides, as it does when Redis is down);
//! * Cluster: the crate's cluster connection, which follows slot moves by itself. Keys an
//!   operation touches together must share a slot (`{…}` hash tags): [`Redis::is_cluster`]
//!   tells the parts that split their pipelines.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

pub mod url;

/// How long a connection (or the Sentinels' answer) may take to be made.
const CONNECT: Duration = Duration::from_secs(1);

/// A shared Redis: cheap to clone, connects on first use.
#[derive(Clone)]
pub struct Redis {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    /// The URL without its password.
    shown: String,
    current: ArcSwapOption<Held>,
    /// One connection made at a time.
    making: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

enum Target {
    Single(redis::Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
    Cluster { client: ClusterClient, nodes: Vec<String> },
}

struct Held {
    inner: Inner,
    generation: u64,
}

#[derive(Clone)]
enum Inner {
    Manager(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Redis {
    /// The Redis at `url` ([`url`] lists the forms); nothing is connected yet.
    pub fn open(url: &str) -> Result<Self, String> {
        let shown = url::redacted(url);
        let bad = |e: RedisError| format!("{shown}: {e}");
        let target = match url::parse(url).map_err(|e| format!("{shown}: {e}"))? {
            url::Spec::Single(url) => Target::Single(redis::Client::open(url.as_str()).map_err(bad)?),
            url::Spec::Sentinel { sentinels, service, db, username, password } => {
                let master = redis::RedisConnectionInfo { db, username, password, ..Default::default() };
                let node = SentinelNodeConnectionInfo { tls_mode: None, redis_connection_info: Some(master) };
                let sentinels: Vec<String> = sentinels.iter().map(|s| format!("redis://{s}")).collect();
                let client = SentinelClient::build(sentinels, service, Some(node), SentinelServerType::Master);
                Target::Sentinel(tokio::sync::Mutex::new(client.map_err(bad)?))
            }
            url::Spec::Cluster { nodes } => {
                let client = ClusterClient::builder(nodes.clone()).connection_timeout(CONNECT).build().map_err(bad)?;
                Target::Cluster { client, nodes }
            }
        };
        let shared = Shared {
            target,
            shown,
            current: ArcSwapOption::empty(),
            making: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        };
        Ok(Self { shared: Arc::new(shared) })
    }

    /// Whether it is a Redis Cluster (keys used together must share a slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self.shared.target, Target::Cluster { .. })
    }

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        &self.shared.shown
    }

    /// A connection: the one made already, or a new one (to the master the Sentinels name now).
    pub async fn connection(&self) -> RedisResult<Connection> {
        if let Some(held) = self.shared.current.load_full() {
            return Ok(self.wrap(&held));
        }
        let _making = self.shared.making.lock().await;
        if let Some(held) = self.shared.current.load_full() {
            return Ok(self.wrap(&held));
        }
        let inner = match &self.shared.target {
            Target::Single(client) => Inner::Manager(manager(client.clone()).await?),
            Target::Sentinel(sentinel) => {
                let master = within(sentinel.lock().await.async_get_client()).await?;
                tracing::info!(redis = %self.shared.shown, master = %master.get_connection_info().addr, "redis: the Sentinels name this master");
                Inner::Manager(manager(master).await?)
            }
            Target::Cluster { client, .. } => Inner::Cluster(within(client.get_async_connection()).await?),
        };
        let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let held = Arc::new(Held { inner, generation });
        self.shared.current.store(Some(held.clone()));
        Ok(self.wrap(&held))
    }

    fn wrap(&self, held: &Held) -> Connection {
        let watch = matches!(self.shared.target, Target::Sentinel(_)).then(|| (self.shared.clone(), held.generation));
        Connection { inner: held.inner.clone(), watch }
    }

    /// A connection for `SUBSCRIBE`: to the server, the master the Sentinels name now, or the
    /// first cluster node that answers (a cluster delivers `PUBLISH` to every node).
    pub async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        match &self.shared.target {
            Target::Single(client) => within(client.get_async_pubsub()).await,
            Target::Sentinel(sentinel) => {
                let master = within(sentinel.lock().await.async_get_client()).await?;
                within(master.get_async_pubsub()).await
            }
            Target::Cluster { nodes, .. } => {
                let mut last = RedisError::from((ErrorKind::IoError, "no cluster node given"));
                for node in nodes {
                    match redis::Client::open(node.as_str()) {
                        Ok(client) => match within(client.get_async_pubsub()).await {
                            Ok(pubsub) => return Ok(pubsub),
                            Err(e) => last = e,
                        },
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }
}

async fn manager(client: redis::Client) -> RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new().set_connection_timeout(CONNECT).set_number_of_retries(1);
    within(ConnectionManager::new_with_config(client, config)).await
}

async fn within<T>(work: impl std::future::Future<Output = RedisResult<T>>) -> RedisResult<T> {
    tokio::time::timeout(CONNECT, work)
        .await
        .unwrap_or_else(|_| Err(RedisError::from((ErrorKind::IoError, "redis: connecting timed out"))))
}

/// A connection from [`Redis::connection`]: plain Redis commands, pipelines and scripts.
#[derive(Clone)]
pub struct Connection {
    inner: Inner,
    /// Behind Sentinels: whom to tell that this master is gone, and which connection it was.
    watch: Option<(Arc<Shared>, u64)>,
}

impl Connection {
    /// A failure that says the master is not this server any more: forget the connection, so
    /// the next operation asks the Sentinels. Only the connection that failed is forgotten.
    fn check<T>(&self, result: &RedisResult<T>) {
        let (Some((shared, generation)), Err(e)) = (&self.watch, result) else { return };
        let gone = e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.kind() == ErrorKind::ReadOnly;
        if !gone {
            return;
        }
        let current = shared.current.load();
        if current.as_ref().is_some_and(|held| held.generation == *generation) {
            shared.current.store(None);
            tracing::warn!(redis = %shared.shown, error = %e, "redis: the master is gone; asking the Sentinels again");
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = match &mut self.inner {
                Inner::Manager(c) => c.req_packed_command(cmd).await,
                Inner::Cluster(c) => c.req_packed_command(cmd).await,
            };
            self.check(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = match &mut self.inner {
                Inner::Manager(c) => c.req_packed_commands(pipeline, offset, count).await,
                Inner::Cluster(c) => c.req_packed_commands(pipeline, offset, count).await,
            };
            self.check(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Manager(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}
