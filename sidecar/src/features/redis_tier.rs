//! L3: feature rows in Redis or Redis Cluster.
//!
//! One MGET round trip per batch: the keys of a batch go in one MGET (split
//! into chunks of `chunk_keys` for very large batches, sent concurrently on
//! the multiplexed connection). On a cluster the keys are grouped by hash
//! slot and each group's MGET goes to its node, concurrently. The single-node
//! connection is a multiplexed connection manager that reconnects with
//! exponential backoff; the cluster connection refreshes its slot map and
//! retries on its own. Deadlines are applied by the caller.
//!
//! URLs may carry a password (`redis://:secret@host:6379`); it is never
//! logged: see `daemon_kit::redact`. `rediss://` URLs use TLS (rustls): the server
//! certificate is checked against `ca_file` (PEM) when given, otherwise
//! against the system's trust store.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use futures_util::future::try_join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::RedisResult;

use crate::features::contract::{cluster_slot, redis_key};

/// Where the rows live in Redis.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// One URL for a single node; for a cluster, any reachable nodes.
    pub urls: Vec<String>,
    pub cluster: bool,
    /// Key prefix: keys are `<prefix><node id>`.
    pub prefix: String,
    /// Most keys in one MGET.
    pub chunk_keys: usize,
    pub connect_timeout: Duration,
    /// PEM file of the CA that signed the servers' TLS certificates, for
    /// `rediss://` URLs with a private CA; system roots otherwise.
    pub ca_file: Option<std::path::PathBuf>,
}

impl RedisConfig {
    /// The feature store's Redis as `sidecar serve` is configured (its URLs,
    /// cluster mode and CA), its keys under `prefix`.
    pub fn of_feature_store(config: &crate::config::ServeConfig, prefix: String) -> Self {
        RedisConfig {
            urls: config.redis.0.clone(),
            cluster: config.redis_cluster,
            prefix,
            ca_file: config.redis_ca.clone(),
            ..RedisConfig::single("")
        }
    }

    pub fn single(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            cluster: false,
            prefix: crate::features::contract::DEFAULT_PREFIX.to_string(),
            chunk_keys: 1_000,
            connect_timeout: Duration::from_secs(2),
            ca_file: None,
        }
    }
}

impl RedisConfig {
    /// The TLS roots for `rediss://` URLs: `ca_file` when given (the system
    /// roots otherwise: `None`).
    fn certificates(&self) -> anyhow::Result<Option<redis::TlsCertificates>> {
        // rustls needs a process-wide crypto provider; a second install is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(match &self.ca_file {
            Some(path) => Some(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(path).with_context(|| {
                    format!("reading the Redis CA certificate {}", path.display())
                })?),
            }),
            None => None,
        })
    }

    /// A client for one node `url`, with this configuration's TLS settings
    /// (every connection the sidecar makes goes through here: the fetch
    /// path, writes, the invalidation listener).
    pub fn client(&self, url: &str) -> anyhow::Result<redis::Client> {
        match self.certificates()? {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        }
        .with_context(|| format!("Redis {}: invalid URL", daemon_kit::redact::redact_url(url)))
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A connected L3 tier.
#[derive(Clone)]
pub struct RedisTier {
    connection: Connection,
    prefix: String,
    chunk_keys: usize,
    shown: String,
}

impl std::fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTier")
            .field("redis", &self.shown)
            .finish()
    }
}

/// Why Redis refused this client its password, if `error` says so: a
/// password the server rejects (WRONGPASS, `AuthenticationFailed`) or none
/// given to a server that requires one (NOAUTH).
pub fn auth_problem(error: &redis::RedisError, shown: &str) -> Option<String> {
    let code = error.code().unwrap_or_default();
    let text = error.to_string();
    if code == "NOAUTH" || text.contains("NOAUTH") {
        Some(format!(
            "Redis {shown} requires a password (NOAUTH) and the URL gives none: write it in the \
             URL, redis://:PASSWORD@host:port (or redis://USER:PASSWORD@host:port)"
        ))
    } else if code == "WRONGPASS"
        || text.contains("WRONGPASS")
        || error.kind() == redis::ErrorKind::AuthenticationFailed
    {
        Some(format!(
            "Redis {shown} refused the URL's password (or user): correct it in the URL"
        ))
    } else {
        None
    }
}

impl RedisTier {
    /// Connects (and for a cluster, loads the slot map).
    pub async fn connect(config: &RedisConfig) -> anyhow::Result<Self> {
        anyhow::ensure!(!config.urls.is_empty(), "no Redis URL given");
        let shown = config
            .urls
            .iter()
            .map(|u| daemon_kit::redact::redact_url(u))
            .collect::<Vec<_>>()
            .join(",");
        let certs = config.certificates()?;
        let connection = if config.cluster {
            let mut builder = ClusterClient::builder(config.urls.clone())
                .connection_timeout(config.connect_timeout);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            let client = builder
                .build()
                .with_context(|| format!("Redis Cluster {shown}: invalid URL"))?;
            Connection::Cluster(
                tokio::time::timeout(config.connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|_| anyhow::anyhow!("Redis Cluster {shown}: connect timed out"))?
                    .with_context(|| format!("connecting to Redis Cluster {shown}"))?,
            )
        } else {
            anyhow::ensure!(
                config.urls.len() == 1,
                "several Redis URLs given without --redis-cluster"
            );
            let client = config.client(&config.urls[0])?;
            // One plain connection first: a refused password is named now,
            // not retried by the manager until "connect timed out".
            if let Ok(Err(e)) = tokio::time::timeout(
                config.connect_timeout,
                client.get_multiplexed_async_connection(),
            )
            .await
            {
                if let Some(problem) = auth_problem(&e, &shown) {
                    anyhow::bail!(problem);
                }
            }
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_number_of_retries(6)
                .set_max_delay(Duration::from_secs(2));
            Connection::Single(
                tokio::time::timeout(
                    config.connect_timeout,
                    client.get_connection_manager_with_config(manager_config),
                )
                .await
                .map_err(|_| anyhow::anyhow!("Redis {shown}: connect timed out"))?
                .with_context(|| format!("connecting to Redis {shown}"))?,
            )
        };
        Ok(Self {
            connection,
            prefix: config.prefix.clone(),
            chunk_keys: config.chunk_keys.max(1),
            shown,
        })
    }

    /// The URLs, passwords redacted.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Runs one command (routed by its key on a cluster).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match &self.connection {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs a pipeline (its commands on one slot, on a cluster).
    pub async fn query_pipeline<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> RedisResult<T> {
        match &self.connection {
            Connection::Single(c) => pipe.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => pipe.query_async(&mut c.clone()).await,
        }
    }

    async fn mget_keys(&self, keys: Vec<String>) -> RedisResult<Vec<Option<Vec<u8>>>> {
        let mut cmd = redis::cmd("MGET");
        cmd.arg(keys);
        match &self.connection {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// The raw values of `ids`, in order (`None` = no such key).
    pub async fn get_many(&self, ids: &[u64]) -> RedisResult<Vec<Option<Vec<u8>>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Groups of (positions, keys): by slot on a cluster, by chunk otherwise.
        let mut groups: Vec<(Vec<usize>, Vec<String>)> = Vec::new();
        match self.connection {
            Connection::Single(_) => {
                for (chunk_idx, chunk) in ids.chunks(self.chunk_keys).enumerate() {
                    let base = chunk_idx * self.chunk_keys;
                    groups.push((
                        (base..base + chunk.len()).collect(),
                        chunk
                            .iter()
                            .map(|&id| redis_key(&self.prefix, id))
                            .collect(),
                    ));
                }
            }
            Connection::Cluster(_) => {
                let mut by_slot: BTreeMap<u16, (Vec<usize>, Vec<String>)> = BTreeMap::new();
                for (pos, &id) in ids.iter().enumerate() {
                    let key = redis_key(&self.prefix, id);
                    let group = by_slot.entry(cluster_slot(key.as_bytes())).or_default();
                    group.0.push(pos);
                    group.1.push(key);
                }
                for (_, (positions, keys)) in by_slot {
                    for (p, k) in positions
                        .chunks(self.chunk_keys)
                        .zip(keys.chunks(self.chunk_keys))
                    {
                        groups.push((p.to_vec(), k.to_vec()));
                    }
                }
            }
        }
        let (positions, keys): (Vec<_>, Vec<_>) = groups.into_iter().unzip();
        let answers = try_join_all(keys.into_iter().map(|k| self.mget_keys(k))).await?;
        let mut out = vec![None; ids.len()];
        for (positions, values) in positions.into_iter().zip(answers) {
            for (pos, value) in positions.into_iter().zip(values) {
                out[pos] = value;
            }
        }
        Ok(out)
    }

    /// Writes rows (raw little-endian bytes), pipelined, `chunk_keys` per
    /// round trip (grouped by slot on a cluster).
    pub async fn set_many(&self, rows: &[(u64, Vec<u8>)]) -> RedisResult<()> {
        let mut groups: BTreeMap<u16, Vec<&(u64, Vec<u8>)>> = BTreeMap::new();
        for row in rows {
            let slot = match self.connection {
                Connection::Cluster(_) => cluster_slot(redis_key(&self.prefix, row.0).as_bytes()),
                Connection::Single(_) => 0,
            };
            groups.entry(slot).or_default().push(row);
        }
        for group in groups.values() {
            for chunk in group.chunks(self.chunk_keys) {
                let mut pipe = redis::pipe();
                for (id, bytes) in chunk {
                    pipe.set(redis_key(&self.prefix, *id), bytes.as_slice())
                        .ignore();
                }
                match &self.connection {
                    Connection::Single(c) => pipe.query_async::<()>(&mut c.clone()).await?,
                    Connection::Cluster(c) => pipe.query_async::<()>(&mut c.clone()).await?,
                }
            }
        }
        Ok(())
    }
}

impl crate::features::store::RemoteStore for RedisTier {
    fn shown(&self) -> &str {
        RedisTier::shown(self)
    }

    fn get_many<'a>(
        &'a self,
        ids: &'a [u64],
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = crate::features::store::RemoteRows> + Send + 'a>,
    > {
        Box::pin(async move { Ok(RedisTier::get_many(self, ids).await?) })
    }
}
