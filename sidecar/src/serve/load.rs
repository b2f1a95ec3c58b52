//! The start-up's loading: the data directory (locked, seeded if asked),
//! the graph, the feature stores, the tiers, the invalidation listener and
//! the update follower. Each subsystem registers its telemetry and releases
//! its readiness latch as it comes up.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use protocol::layout::{dtype, FeatureSchema};

use crate::config::{DefaultRowKind, ServeConfig};
use crate::daemon::{Core, Daemon};
use crate::data_dir::DataDirLock;
use crate::features::import::{self, FeatureManifest};
use crate::features::invalidation::{self, InvalidationStats};
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{Opened, RocksStore, Role, StoreTelemetry};
use crate::features::{DefaultRow, FeatureTiers, TierConfig};
use crate::graph::live::LiveGraph;
use crate::graph::{dataset, TypedGraph};
use crate::serve::typed;
use crate::updates::follower::{self, FollowerStats};

/// What the loading gives the start-up: the core, the nodes to warm, and
/// the schema the ring advertises.
pub(super) struct Loaded {
    pub core: Core,
    pub hot: Vec<u64>,
    pub schema: FeatureSchema,
}

/// Loads everything the sidecar serves from, in the readiness order.
pub(super) fn load(daemon: &Daemon, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Loaded> {
    let config = &daemon.config;
    crate::graph::typed::recover_interrupted_compaction(&config.data_dir)?;
    if typed::is_typed_data_dir(config) {
        let data_dir_lock = DataDirLock::acquire(&config.data_dir)?;
        return load_typed(daemon, runtime, data_dir_lock);
    }
    let data_dir_lock = lock_and_seed(config)?;
    let graph = open_graph(daemon)?;
    let manifest = FeatureManifest::read(&config.data_dir)?;
    ensure!(
        manifest.dtype == "f32",
        "features.json declares dtype {:?}; only f32 is served",
        manifest.dtype
    );
    let redis_config = RedisConfig::of_feature_store(
        config,
        manifest
            .redis_prefix
            .clone()
            .unwrap_or_else(|| crate::features::contract::DEFAULT_PREFIX.into()),
    );
    let stores = open_stores(daemon, runtime, &manifest, &redis_config)?;
    let (tiers, invalidation) = build_tiers(
        daemon,
        runtime,
        &graph.live,
        &stores,
        &manifest,
        &redis_config,
    )?;
    let dim = manifest.feature_dim as usize;
    let targets = follower::Targets {
        graph: graph.live.clone(),
        one_type_row_bytes: Some(4 * dim),
        features: vec![Some(follower::FeatureTarget {
            tiers: tiers.clone(),
            store: stores.store.clone(),
        })],
    };
    let updates = follow_updates(daemon, runtime, targets)?;
    let schema = FeatureSchema {
        feature_dim: manifest.feature_dim,
        dtype: dtype::F32,
        graph_version: graph.graph_version,
        default_fanouts: config.fanouts.0,
    };
    let core = Core {
        graph: graph.live,
        tiers,
        store: stores.store,
        redis: stores.redis,
        feature_dim: dim,
        store_telemetry: stores.telemetry,
        invalidation,
        updates,
        data_dir_lock,
        typed: None,
    };
    Ok(Loaded {
        core,
        hot: graph.hot,
        schema,
    })
}

/// A typed data directory: its graph and per-type tiers; the one-type
/// tiers of the core are empty (the admin commands that act on them are
/// refused).
fn load_typed(
    daemon: &Daemon,
    runtime: &tokio::runtime::Runtime,
    data_dir_lock: DataDirLock,
) -> anyhow::Result<Loaded> {
    let config = &daemon.config;
    let (graph, typed) = typed::load(daemon, runtime)?;
    let graph_version = graph.schema().graph_version;
    let live = serve_graph(daemon, graph);
    let targets = follower::Targets {
        graph: live.clone(),
        one_type_row_bytes: None,
        features: typed
            .tiers
            .iter()
            .zip(&typed.stores)
            .map(|(tiers, stores)| {
                Some(follower::FeatureTarget {
                    tiers: tiers.clone()?,
                    store: stores.as_ref()?.store.clone(),
                })
            })
            .collect(),
    };
    let updates = follow_updates(daemon, runtime, targets)?;
    let invalidation = Arc::new(InvalidationStats::default());
    daemon
        .metrics
        .register(Some("invalidation"), invalidation.clone());
    let schema = FeatureSchema {
        feature_dim: 0,
        dtype: dtype::F32,
        graph_version,
        default_fanouts: config.fanouts.0,
    };
    let core = Core {
        graph: live,
        tiers: FeatureTiers::new(&TierConfig::new(1), None, None),
        store: None,
        redis: None,
        feature_dim: 0,
        store_telemetry: Arc::new(StoreTelemetry {
            store: None,
            rebuilds: 0,
        }),
        invalidation,
        updates,
        data_dir_lock,
        typed: Some(typed),
    };
    Ok(Loaded {
        core,
        hot: Vec::new(),
        schema,
    })
}

/// One sidecar per data directory: locked before anything in it is
/// opened; then seeded from `seed_dataset` if asked.
fn lock_and_seed(config: &ServeConfig) -> anyhow::Result<DataDirLock> {
    if config.seed_dataset.is_some() {
        std::fs::create_dir_all(&config.data_dir).with_context(|| {
            format!("creating the data directory {}", config.data_dir.display())
        })?;
    }
    let lock = DataDirLock::acquire(&config.data_dir)?;
    if let Some(dataset_dir) = &config.seed_dataset {
        ensure!(
            config.redis.0.is_empty(),
            "seed_dataset imports into the embedded store; with redis, import the features \
             with `sidecar import --redis` instead"
        );
        seed(dataset_dir, &config.data_dir)?;
    }
    Ok(lock)
}

/// Imports `dataset` (graph and features, into the embedded store) into
/// `data_dir` unless it already holds an imported feature store.
fn seed(dataset_dir: &Path, data_dir: &Path) -> anyhow::Result<()> {
    if data_dir.join(FeatureManifest::FILE).is_file() {
        tracing::info!(data_dir = %data_dir.display(), "data directory already imported; not seeding");
        return Ok(());
    }
    tracing::info!(dataset = %dataset_dir.display(), data_dir = %data_dir.display(), "seeding the data directory");
    let stats = dataset::import_graph(dataset_dir, data_dir, false, 1).with_context(|| {
        format!(
            "seeding {} from {}",
            data_dir.display(),
            dataset_dir.display()
        )
    })?;
    let meta = dataset::DatasetMeta::read(dataset_dir)?;
    let dim = meta
        .feature_dim
        .ok_or_else(|| anyhow::anyhow!("{}/meta.json has no feature_dim", dataset_dir.display()))?;
    let done = import::import_to_rocksdb(
        &dataset_dir.join("features.f32"),
        meta.num_nodes,
        dim,
        data_dir,
    )?;
    tracing::info!(
        nodes = stats.n_nodes,
        edges = stats.n_edges,
        rows = done.rows,
        seconds = done.seconds,
        "data directory seeded"
    );
    Ok(())
}

struct OpenGraph {
    live: LiveGraph,
    /// The top-degree nodes, to warm.
    hot: Vec<u64>,
    graph_version: u64,
}

/// Serves `graph`: compacting by itself past `compact_after`, its
/// `sidecar_graph_*` metrics registered, the graph's latch released.
fn serve_graph(daemon: &Daemon, graph: TypedGraph) -> LiveGraph {
    let compact_after = daemon.config.compact_after;
    let live = LiveGraph::with_auto_compact(graph, (compact_after > 0).then_some(compact_after));
    daemon.metrics.register(None, live.clone());
    daemon.latches.graph.release();
    live
}

/// Maps the one-type graph index as the 1x1 graph.
fn open_graph(daemon: &Daemon) -> anyhow::Result<OpenGraph> {
    let config = &daemon.config;
    let index_path = config.data_dir.join(dataset::INDEX_FILE);
    let graph = TypedGraph::open_one_type(&index_path).with_context(|| {
        format!(
            "opening the graph index {}: run `sidecar import <dataset> --data-dir {}` first",
            index_path.display(),
            config.data_dir.display()
        )
    })?;
    let graph_version = graph.schema().graph_version;
    let live = serve_graph(daemon, graph);
    let hot = live
        .snapshot()
        .top_degree(config.warm_up, |_| true)
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    Ok(OpenGraph {
        live,
        hot,
        graph_version,
    })
}

struct Stores {
    /// The embedded store (of record, or the L2 cache in front of Redis).
    store: Option<Arc<RocksStore>>,
    redis: Option<RedisTier>,
    telemetry: Arc<StoreTelemetry>,
}

/// Opens the feature store the manifest names: the embedded store of
/// record, or Redis with its optional L2 cache.
fn open_stores(
    daemon: &Daemon,
    runtime: &tokio::runtime::Runtime,
    manifest: &FeatureManifest,
    redis_config: &RedisConfig,
) -> anyhow::Result<Stores> {
    let config = &daemon.config;
    let (store, redis, rebuilds) = match manifest.store.as_str() {
        "rocksdb" => (Some(open_store_of_record(config, manifest)?), None, 0),
        "redis" => {
            ensure!(
                !config.redis.0.is_empty(),
                "the features of {} were imported into Redis: set redis (--redis <url>)",
                config.data_dir.display()
            );
            let tier = runtime.block_on(RedisTier::connect(redis_config))?;
            runtime.block_on(crate::features::import::verify_redis(&tier, manifest))?;
            let (l2, rebuilds) = open_l2_cache(config)?;
            (l2, Some(tier), rebuilds)
        }
        other => bail!("features.json names an unknown store {other:?}"),
    };
    let telemetry = Arc::new(StoreTelemetry {
        store: store.clone(),
        rebuilds,
    });
    daemon.metrics.register(None, telemetry.clone());
    daemon.latches.store.release();
    Ok(Stores {
        store,
        redis,
        telemetry,
    })
}

fn open_store_of_record(
    config: &ServeConfig,
    manifest: &FeatureManifest,
) -> anyhow::Result<Arc<RocksStore>> {
    ensure!(
        config.redis.0.is_empty(),
        "the features of {} are in the embedded store; drop redis, or re-import them with --redis",
        config.data_dir.display()
    );
    let path = config.data_dir.join(FeatureManifest::STORE_DIR);
    let rebuild = || {
        format!(
            "re-run `sidecar import <dataset> --data-dir {}` to rebuild it",
            config.data_dir.display()
        )
    };
    // RocksDB would create an empty store in its place, and every answer
    // would be a default row.
    ensure!(
        path.join("CURRENT").is_file(),
        "the feature store {} is missing (features.json says {} rows were imported into it): {}",
        path.display(),
        manifest.num_nodes,
        rebuild()
    );
    let (store, _) = RocksStore::open(&path, Role::StoreOfRecord)?;
    ensure!(
        manifest.num_nodes == 0 || store.holds_rows(),
        "the feature store {} holds no rows, but features.json says {} were imported into it: {}",
        path.display(),
        manifest.num_nodes,
        rebuild()
    );
    manifest.check_store(&store, &path)?;
    Ok(Arc::new(store))
}

/// The L2 cache in front of Redis, unless `no_l2`; and whether it was
/// found corrupt and rebuilt (1) or not (0).
fn open_l2_cache(config: &ServeConfig) -> anyhow::Result<(Option<Arc<RocksStore>>, u64)> {
    let Some(l2) = config.l2_cache() else {
        return Ok((None, 0));
    };
    let role = Role::Cache {
        max_bytes: l2.max_bytes,
        ttl: l2.ttl,
    };
    let (store, opened) = RocksStore::open(&l2.path, role).with_context(|| {
        format!(
            "opening the L2 cache {} (choose another l2_dir, or set no_l2)",
            l2.path.display()
        )
    })?;
    Ok((Some(Arc::new(store)), u64::from(opened == Opened::Rebuilt)))
}

/// The tiers over the stores, and the invalidation listener feeding them.
fn build_tiers(
    daemon: &Daemon,
    runtime: &tokio::runtime::Runtime,
    graph: &LiveGraph,
    stores: &Stores,
    manifest: &FeatureManifest,
    redis_config: &RedisConfig,
) -> anyhow::Result<(FeatureTiers, Arc<InvalidationStats>)> {
    let config = &daemon.config;
    let mut tier_config = TierConfig::new(manifest.feature_dim as usize);
    tier_config.changes = Some(graph.changes().clone());
    tier_config.l1_bytes = config.l1_bytes();
    tier_config.default_deadline = config.deadline();
    tier_config.default_row = match config.default_row {
        DefaultRowKind::Zeros => DefaultRow::Zeros,
        DefaultRowKind::Mean => DefaultRow::Mean(manifest.read_mean(&config.data_dir)?.into()),
    };
    tier_config.latch = Some(daemon.latches.warm_up.clone());
    let tiers = FeatureTiers::new(&tier_config, stores.store.clone(), stores.redis.clone());
    daemon.metrics.register(None, tiers.clone());
    let invalidation = Arc::new(InvalidationStats::default());
    daemon
        .metrics
        .register(Some("invalidation"), invalidation.clone());
    if let Some(channel) = &config.invalidation_channel {
        let listener = runtime.block_on(invalidation::spawn_listener(
            tiers.clone(),
            redis_config,
            channel.clone(),
            invalidation.clone(),
        ))?;
        // Runs for the life of the runtime.
        drop(listener);
    }
    daemon.latches.invalidation.release();
    Ok((tiers, invalidation))
}

/// Replays the update stream to its end (a restarted replica never serves
/// the graph it had at its last compaction), then follows it.
fn follow_updates(
    daemon: &Daemon,
    runtime: &tokio::runtime::Runtime,
    targets: follower::Targets,
) -> anyhow::Result<Option<Arc<FollowerStats>>> {
    let config = &daemon.config;
    let Some(stream) = &config.updates_stream else {
        daemon.latches.updates.release();
        return Ok(None);
    };
    let stats = Arc::new(FollowerStats::new(stream, daemon.latches.updates.clone()));
    daemon.metrics.register(None, stats.clone());
    let stream_redis = RedisConfig {
        urls: config.updates_redis_urls().to_vec(),
        cluster: config.redis_cluster,
        ca_file: config.redis_ca.clone(),
        ..RedisConfig::single("")
    };
    let mut follower = runtime.block_on(follower::Follower::start(
        &stream_redis,
        stream,
        targets,
        stats.clone(),
    ))?;
    let replaying = Instant::now();
    let replayed = runtime.block_on(follower.catch_up())?;
    tracing::info!(
        stream = %stream,
        entries = replayed,
        position = %stats.position(),
        seconds = replaying.elapsed().as_secs_f64(),
        "update stream replayed to its end"
    );
    stats.caught_up_at_start();
    runtime.spawn(follower.run());
    Ok(Some(stats))
}
