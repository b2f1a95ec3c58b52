//! `sidecar serve`: the ring server wired to the graph, the sampler and the
//! feature tiers.
//!
//! Start-up order is the readiness order: map the graph index, open the
//! feature store (and connect to Redis), warm the L1 hot set (the
//! top-degree nodes), and only then create the shared-memory segment, so a
//! worker that attaches finds a sidecar that can answer. The serving loop is
//! one dedicated thread (no async runtime worker blocks on the ring): take
//! every submitted request, serve them as one batch ([`batch`]), repeat. The
//! tiers' Redis I/O runs on a small tokio runtime beside it.
//!
//! SIGTERM or SIGINT drains: the segment is marked DRAINING, requests
//! already submitted are answered, the segment is removed, the process exits.

pub mod admin;
pub mod batch;
pub mod metrics;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use protocol::layout::{dtype, FeatureSchema, MAX_HOPS};
use protocol::segment::SegmentConfig;
use protocol::server::{RingServer, ServerOptions};

use crate::features::import::FeatureManifest;
use crate::features::invalidation::{self, InvalidationStats};
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{Opened, RocksStore, Role};
use crate::features::{DefaultRow, FeatureTiers, TierConfig};
use crate::graph::live::LiveGraph;
use crate::graph::{dataset, CsrIndex};

pub use batch::ServeStats;

/// Which default row a fallback gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultRowKind {
    Zeros,
    Mean,
}

/// Everything `sidecar serve` is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub shm_name: String,
    /// File mode of the segment (0o600; 0o660 when the containers share a group).
    pub shm_mode: u32,
    pub redis: Vec<String>,
    pub redis_cluster: bool,
    pub redis_ca: Option<PathBuf>,
    /// Redis pub/sub channel carrying node ids to invalidate.
    pub invalidation_channel: Option<String>,
    pub fanouts: [u32; MAX_HOPS],
    pub max_fanouts: [u32; MAX_HOPS],
    pub slots: u32,
    pub max_targets: u32,
    pub max_nodes: u32,
    pub response_bytes: u64,
    pub deadline: Duration,
    pub l1_bytes: u64,
    /// Top-degree nodes pinned in L1 before the sidecar reports ready.
    pub warm_up: usize,
    pub default_row: DefaultRowKind,
    /// Admin Unix socket (mode 0600, peer uid checked).
    pub admin_socket: Option<PathBuf>,
    pub client_timeout: Duration,
    /// The L2 RocksDB cache in front of Redis (unused with the embedded
    /// store, which is L2 and store of record at once). `None`: no L2.
    pub l2_cache: Option<L2CacheConfig>,
    /// Address of the Prometheus endpoint (`GET /metrics`).
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Where and how big the L2 cache is.
#[derive(Debug, Clone)]
pub struct L2CacheConfig {
    /// Directory of the RocksDB cache (local NVMe in production).
    pub path: PathBuf,
    /// Size bound of its files, bytes.
    pub max_bytes: u64,
    /// How long a cached row is served before it is fetched again (bounds
    /// its staleness when an invalidation message is lost).
    pub ttl: Duration,
}

impl L2CacheConfig {
    /// `<data dir>/l2-cache`, 4 GiB, rows kept one hour.
    pub fn in_data_dir(data_dir: &std::path::Path) -> Self {
        Self {
            path: data_dir.join("l2-cache"),
            max_bytes: 4 << 30,
            ttl: Duration::from_secs(3600),
        }
    }
}

impl ServeConfig {
    /// Defaults for everything but the data directory and segment name.
    pub fn new(data_dir: impl Into<PathBuf>, shm_name: impl Into<String>) -> Self {
        let data_dir = data_dir.into();
        Self {
            l2_cache: Some(L2CacheConfig::in_data_dir(&data_dir)),
            metrics_addr: None,
            data_dir,
            shm_name: shm_name.into(),
            shm_mode: 0o600,
            redis: Vec::new(),
            redis_cluster: false,
            redis_ca: None,
            invalidation_channel: None,
            fanouts: [20, 10],
            max_fanouts: [50, 50],
            slots: 64,
            max_targets: 64,
            max_nodes: 65_536,
            response_bytes: 8 << 20,
            deadline: Duration::from_millis(20),
            l1_bytes: 256 << 20,
            warm_up: 10_000,
            default_row: DefaultRowKind::Mean,
            admin_socket: None,
            client_timeout: Duration::from_secs(5),
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        for hop in 0..MAX_HOPS {
            ensure!(
                (1..=self.max_fanouts[hop]).contains(&self.fanouts[hop]),
                "fanout {} of hop {} must be between 1 and the max fanout {}: lower --fanouts \
                 or raise --max-fanouts",
                self.fanouts[hop],
                hop + 1,
                self.max_fanouts[hop]
            );
        }
        Ok(())
    }
}

/// The state the serving loop and the admin socket share.
#[derive(Debug)]
pub struct Daemon {
    pub graph: LiveGraph,
    pub tiers: FeatureTiers,
    /// The embedded store (store of record, or L2 cache in front of Redis).
    pub store: Option<Arc<RocksStore>>,
    pub redis: Option<RedisTier>,
    pub stats: ServeStats,
    pub feature_dim: usize,
    pub stop: AtomicBool,
    pub started: Instant,
    pub shm_name: String,
    /// Times the L2 cache was found corrupt at start and rebuilt empty.
    pub l2_rebuilds: u64,
}

/// Runs the sidecar until `stop` is set (by a signal or the admin socket).
pub fn run(config: ServeConfig, stop_signal: Option<Arc<AtomicBool>>) -> anyhow::Result<()> {
    config.check()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sidecar-io")
        .enable_all()
        .build()
        .context("starting the I/O runtime")?;

    // 1. The graph.
    let index_path = config.data_dir.join(dataset::INDEX_FILE);
    let index = CsrIndex::open(&index_path).with_context(|| {
        format!(
            "opening the graph index {}: run `sidecar import <dataset> --data-dir {}` first",
            index_path.display(),
            config.data_dir.display()
        )
    })?;
    let hot: Vec<u64> = index
        .top_degree(config.warm_up)
        .into_iter()
        .map(u64::from)
        .collect();
    let graph_version = index.graph_version();
    let graph = LiveGraph::new(index);

    // 2. The feature store(s).
    let manifest = FeatureManifest::read(&config.data_dir)?;
    ensure!(
        manifest.dtype == "f32",
        "features.json declares dtype {:?}; only f32 is served",
        manifest.dtype
    );
    let dim = manifest.feature_dim as usize;
    let mut l2_rebuilds = 0;
    let (store, redis) = match manifest.store.as_str() {
        "rocksdb" => {
            ensure!(
                config.redis.is_empty(),
                "the features of {} are in the embedded store; drop --redis, or re-import \
                 them with --redis",
                config.data_dir.display()
            );
            let path = config.data_dir.join(FeatureManifest::STORE_DIR);
            let (store, _) = RocksStore::open(&path, Role::StoreOfRecord)?;
            (Some(Arc::new(store)), None)
        }
        "redis" => {
            ensure!(
                !config.redis.is_empty(),
                "the features of {} were imported into Redis: pass --redis <url>",
                config.data_dir.display()
            );
            let redis_config = RedisConfig {
                urls: config.redis.clone(),
                cluster: config.redis_cluster,
                prefix: manifest
                    .redis_prefix
                    .clone()
                    .unwrap_or_else(|| crate::features::contract::DEFAULT_PREFIX.into()),
                ca_file: config.redis_ca.clone(),
                ..RedisConfig::single("")
            };
            let tier = runtime.block_on(RedisTier::connect(&redis_config))?;
            let l2 = match &config.l2_cache {
                Some(l2) => {
                    let (store, opened) = RocksStore::open(
                        &l2.path,
                        Role::Cache {
                            max_bytes: l2.max_bytes,
                            ttl: l2.ttl,
                        },
                    )
                    .with_context(|| {
                        format!(
                            "opening the L2 cache {} (choose another --l2-dir, or --no-l2)",
                            l2.path.display()
                        )
                    })?;
                    if opened == Opened::Rebuilt {
                        l2_rebuilds += 1;
                    }
                    Some(Arc::new(store))
                }
                None => None,
            };
            (l2, Some(tier))
        }
        other => bail!("features.json names an unknown store {other:?}"),
    };
    let mut tier_config = TierConfig::new(dim);
    tier_config.l1_bytes = config.l1_bytes;
    tier_config.default_deadline = config.deadline;
    tier_config.default_row = match config.default_row {
        DefaultRowKind::Zeros => DefaultRow::Zeros,
        DefaultRowKind::Mean => DefaultRow::Mean(manifest.read_mean(&config.data_dir)?.into()),
    };
    let tiers = FeatureTiers::new(&tier_config, store.clone(), redis.clone());
    let _invalidation = match (&config.invalidation_channel, config.redis.first()) {
        (Some(channel), Some(url)) => Some(runtime.block_on(invalidation::spawn_listener(
            tiers.clone(),
            url.clone(),
            channel.clone(),
            Arc::new(InvalidationStats::default()),
        ))?),
        (Some(_), None) => bail!("--invalidation-channel needs --redis"),
        _ => None,
    };

    // 3. Warm-up: readiness waits for it.
    let started = Instant::now();
    let pinned = runtime.block_on(tiers.warm_up(&hot));
    tracing::info!(
        pinned,
        seconds = started.elapsed().as_secs_f64(),
        "L1 hot set warmed"
    );

    let daemon = Arc::new(Daemon {
        graph,
        tiers,
        store,
        redis,
        stats: ServeStats::default(),
        feature_dim: dim,
        stop: AtomicBool::new(false),
        started: Instant::now(),
        shm_name: config.shm_name.clone(),
        l2_rebuilds,
    });
    let _metrics = match config.metrics_addr {
        Some(addr) => Some(metrics::serve(addr, daemon.clone(), runtime.handle())?),
        None => None,
    };
    let admin = match &config.admin_socket {
        Some(path) => Some(admin::AdminServer::start(
            path,
            daemon.clone(),
            runtime.handle().clone(),
        )?),
        None => None,
    };

    // 4. The ring: created last, so attaching workers find a ready sidecar.
    let schema = FeatureSchema {
        feature_dim: manifest.feature_dim,
        dtype: dtype::F32,
        graph_version,
        default_fanouts: config.fanouts,
    };
    let mut segment = SegmentConfig::new(config.shm_name.clone(), schema);
    segment.mode = config.shm_mode;
    segment.slot_count = config.slots;
    segment.max_targets = config.max_targets;
    segment.max_fanouts = config.max_fanouts;
    segment.max_nodes = config.max_nodes;
    segment.response_bytes = config.response_bytes;
    let mut options = ServerOptions::new(segment);
    options.client_timeout = config.client_timeout;
    let server = RingServer::create(options)
        .with_context(|| format!("creating the shared-memory ring {}", config.shm_name))?;
    tracing::info!(
        segment = %config.shm_name,
        feature_dim = dim,
        graph_version,
        fanouts = ?config.fanouts,
        "sidecar ready"
    );

    let mut batch_server = batch::BatchServer::default();
    let mut tickets = Vec::new();
    let stopping = || {
        daemon.stop.load(Ordering::Acquire)
            || stop_signal
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Acquire))
    };
    // Takes what is submitted (waiting up to `wait`) and answers it as one
    // batch, against the graph snapshot of that moment.
    let mut serve_next = |wait: Duration| -> bool {
        tickets.clear();
        if server.next_batch(&mut tickets, wait) == 0 {
            return false;
        }
        let snapshot = daemon.graph.snapshot();
        let ctx = batch::BatchContext {
            graph: &snapshot,
            tiers: &daemon.tiers,
            runtime: runtime.handle(),
            default_deadline: config.deadline,
            max_nodes: config.max_nodes,
            stats: &daemon.stats,
        };
        batch_server.serve(&ctx, std::mem::take(&mut tickets));
        true
    };
    while !stopping() {
        serve_next(Duration::from_millis(100));
    }

    // Drain: answer what was already submitted, then remove the segment.
    tracing::info!("draining");
    server.set_draining();
    while serve_next(Duration::from_millis(10)) {}
    server.shutdown();
    drop(admin);
    if let Some(store) = &daemon.store {
        store.flush()?;
    }
    tracing::info!("sidecar stopped");
    Ok(())
}
