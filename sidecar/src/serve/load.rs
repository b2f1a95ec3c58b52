//! The start-up's loading: the data directory (locked, seeded if asked),
//! the graph (typed, or one-type as the 1x1 typed graph), each node type's
//! feature stores and tiers, the invalidation listener and the update
//! follower. Each subsystem registers its telemetry and releases its
//! readiness latch as it comes up.
//!
//! A typed data directory keeps each node type's features in
//! `typed-features/<type>/` (RocksDB, or Redis under `<prefix><type>:`,
//! with an L2 cache per type in `<l2_dir>/<type>`); a one-type one keeps
//! its one type's at its top (RocksDB, or Redis under `<prefix>`, with the
//! L2 cache in `<l2_dir>`). Both open through [`open_type`]. A seed
//! dataset is for one-type graphs in this release, and a typed data
//! directory that asks for one is refused at start, by name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use daemon_kit::metrics::Telemetry;
use protocol::layout::{dtype, FeatureSchema};

use crate::config::{DefaultRowKind, ServeConfig};
use crate::daemon::{Core, Daemon, GraphFeatures, TypeFeatures};
use crate::data_dir::DataDirLock;
use crate::features::import::{self, FeatureManifest};
use crate::features::invalidation::{self, InvalidationStats};
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{Opened, RocksStore, Role, StoreTelemetry};
use crate::features::{DefaultRow, FeatureTiers, TierConfig};
use crate::graph::live::LiveGraph;
use crate::graph::typed::{self, TypedGraph};
use crate::graph::{dataset, CsrIndex, GraphSource};
use crate::updates::follower::{self, FollowerStats};

/// What the loading gives the start-up: the core and the schema the ring
/// advertises.
pub(super) struct Loaded {
    pub core: Core,
    pub schema: FeatureSchema,
}

/// Whether `config.data_dir` holds a typed graph and no one-type index.
fn is_typed_data_dir(config: &ServeConfig) -> bool {
    !config.data_dir.join(dataset::INDEX_FILE).exists()
        && config.data_dir.join(typed::TYPED_DIR).is_dir()
}

/// Loads everything the sidecar serves from, in the readiness order.
pub(super) fn load(daemon: &Daemon, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Loaded> {
    let config = &daemon.config;
    typed::recover_interrupted_compaction(&config.data_dir)?;
    let is_typed = is_typed_data_dir(config);
    let data_dir_lock = if is_typed {
        if config.seed_dataset.is_some() {
            bail!(
                "{} holds a typed graph; seed_dataset is for one-type graphs in this release: \
                 leave it unset (docs/graph-index.md, \"Serving a typed graph\")",
                config.data_dir.display()
            );
        }
        DataDirLock::acquire(&config.data_dir)?
    } else {
        lock_and_seed(config)?
    };
    let graph = if is_typed {
        TypedGraph::open(&config.data_dir)?
    } else {
        let index_path = config.data_dir.join(dataset::INDEX_FILE);
        let index = CsrIndex::open(&index_path).with_context(|| {
            format!(
                "opening the graph index {}: run `sidecar import <dataset> --data-dir {}` first",
                index_path.display(),
                config.data_dir.display()
            )
        })?;
        // The one type's width, as its feature store says (checked again
        // when the store opens).
        let manifest = FeatureManifest::read(&config.data_dir)?;
        TypedGraph::one_type(index, &index_path, manifest.feature_dim)
    };
    let graph_version = graph.schema().graph_version;
    let ring_schema = is_typed.then(|| graph.schema().to_ring());
    let compact_after = (config.compact_after > 0).then_some(config.compact_after);
    let live = LiveGraph::with_auto_compact(graph, compact_after);
    daemon.metrics.register(None, live.clone());
    daemon.latches.graph.release();

    // Each node type's features: a one-type graph's one type at the data
    // directory's top, a typed graph's types with features in their
    // folders.
    let snapshot = live.snapshot();
    let mut types = Vec::with_capacity(snapshot.n_node_types());
    for (t, node_type) in snapshot.schema().node_types.iter().enumerate() {
        let place = if is_typed {
            if node_type.feature_dim == 0 {
                types.push(None);
                continue;
            }
            TypePlace {
                name: Some(&node_type.name),
                dir: typed::feature_dir(&config.data_dir, &node_type.name),
                feature_dim: Some(node_type.feature_dim),
                default_prefix: typed::redis_prefix("feat:", &node_type.name),
                l2: config.l2_cache().map(|l2| l2.path.join(&node_type.name)),
            }
        } else {
            TypePlace {
                name: None,
                dir: config.data_dir.clone(),
                feature_dim: None,
                default_prefix: crate::features::contract::DEFAULT_PREFIX.into(),
                l2: config.l2_cache().map(|l2| l2.path),
            }
        };
        types.push(Some(open_type(daemon, runtime, &live, t, &place)?));
    }
    daemon.latches.store.release();
    let features = GraphFeatures { types };

    let invalidation = Arc::new(InvalidationStats::default());
    daemon
        .metrics
        .register(Some("invalidation"), invalidation.clone());
    if let Some(channel) = &config.invalidation_channel {
        let types = invalidation::NodeTypes(
            snapshot
                .schema()
                .node_types
                .iter()
                .zip(&features.types)
                .map(|(t, f)| (t.name.clone(), f.as_ref().map(|f| f.tiers.clone())))
                .collect(),
        );
        // Pub/sub: the feature store's Redis, its keys' prefix aside.
        let redis_config = RedisConfig::of_feature_store(config, String::new());
        let listener = runtime.block_on(invalidation::spawn_listener(
            types,
            &redis_config,
            channel.clone(),
            invalidation.clone(),
        ))?;
        // Runs for the life of the runtime.
        drop(listener);
    }
    daemon.latches.invalidation.release();

    let one_type_dim = (!is_typed).then(|| features.of(0).map_or(0, |f| f.feature_dim()));
    let targets = follower::Targets {
        graph: live.clone(),
        one_type_row_bytes: one_type_dim.map(|dim| 4 * dim),
        features: features
            .types
            .iter()
            .map(|f| {
                f.as_ref().map(|f| follower::FeatureTarget {
                    tiers: f.tiers.clone(),
                    store: f.store.clone(),
                })
            })
            .collect(),
    };
    let updates = follow_updates(daemon, runtime, targets)?;
    let schema = FeatureSchema {
        feature_dim: one_type_dim.unwrap_or(0) as u32,
        dtype: dtype::F32,
        graph_version,
        default_fanouts: config.fanouts(),
    };
    let core = Core {
        graph: live,
        features,
        ring_schema,
        invalidation,
        updates,
        data_dir_lock,
    };
    Ok(Loaded { core, schema })
}

/// Where a node type's features are.
struct TypePlace<'a> {
    /// A typed graph's node type (labels its metrics, named by its
    /// errors); `None` for a one-type graph's one type.
    name: Option<&'a str>,
    /// The folder of its `features.json`.
    dir: PathBuf,
    /// The width the typed index says, checked against the manifest's.
    feature_dim: Option<u32>,
    /// Its rows' Redis key prefix when the manifest records none.
    default_prefix: String,
    /// Its L2 cache's folder, unless `no_l2`.
    l2: Option<PathBuf>,
}

impl TypePlace<'_> {
    /// How an error names the rows: the node type's, or the data
    /// directory's.
    fn whose(&self) -> String {
        match self.name {
            Some(name) => format!("node type {name}"),
            None => self.dir.display().to_string(),
        }
    }

    /// The fix for a store that is missing or empty.
    fn reimport(&self) -> String {
        match self.name {
            Some(_) => "re-run sidecar import".into(),
            None => format!(
                "re-run `sidecar import <dataset> --data-dir {}` to rebuild it",
                self.dir.display()
            ),
        }
    }
}

/// Opens node type `t`'s feature store (of record, or Redis with its
/// optional L2 cache) and the tiers over it, each registering its
/// telemetry (labelled `node_type` for a typed graph).
fn open_type(
    daemon: &Daemon,
    runtime: &tokio::runtime::Runtime,
    graph: &LiveGraph,
    t: usize,
    place: &TypePlace<'_>,
) -> anyhow::Result<TypeFeatures> {
    let config = &daemon.config;
    let manifest = FeatureManifest::read(&place.dir).with_context(|| match place.name {
        Some(name) => format!(
            "node type {name} has {} features: import its rows (sidecar import)",
            place.feature_dim.unwrap_or(0)
        ),
        None => format!("reading the feature manifest of {}", place.dir.display()),
    })?;
    ensure!(
        manifest.dtype == "f32",
        "{}: features.json declares dtype {:?}; only f32 is served",
        place.whose(),
        manifest.dtype
    );
    if let (Some(dim), Some(name)) = (place.feature_dim, place.name) {
        ensure!(
            manifest.feature_dim == dim,
            "{}: {} values per row; the typed index says {dim} for node type {name}: re-run \
             sidecar import",
            place.dir.join(FeatureManifest::FILE).display(),
            manifest.feature_dim,
        );
    }
    let redis_config = RedisConfig::of_feature_store(
        config,
        manifest
            .redis_prefix
            .clone()
            .unwrap_or_else(|| place.default_prefix.clone()),
    );
    let (store, redis, rebuilds) = match manifest.store.as_str() {
        "rocksdb" => (
            Some(open_store_of_record(config, place, &manifest)?),
            None,
            0,
        ),
        "redis" => {
            ensure!(
                !config.redis.0.is_empty(),
                "the features of {} were imported into Redis: set redis (--redis <url>)",
                place.whose()
            );
            let tier = runtime.block_on(RedisTier::connect(&redis_config))?;
            runtime
                .block_on(import::verify_redis(&tier, &manifest))
                .with_context(|| place.whose())?;
            let (l2, rebuilds) = open_l2_cache(config, place)?;
            (l2, Some(tier), rebuilds)
        }
        other => bail!(
            "{}: unknown store {other:?}",
            place.dir.join(FeatureManifest::FILE).display()
        ),
    };
    fn register(daemon: &Daemon, name: Option<&str>, telemetry: impl Telemetry) {
        match name {
            Some(name) => daemon
                .metrics
                .register_labelled("node_type", name, telemetry),
            None => daemon.metrics.register(None, telemetry),
        }
    }
    register(
        daemon,
        place.name,
        Arc::new(StoreTelemetry {
            store: store.clone(),
            rebuilds,
        }),
    );
    let mut tier_config = TierConfig::new(manifest.feature_dim as usize);
    tier_config.changes = Some(graph.changes().clone());
    tier_config.node_type = t;
    tier_config.l1_bytes = config.l1_bytes();
    tier_config.default_deadline = config.deadline();
    tier_config.default_row = match config.default_row {
        DefaultRowKind::Zeros => DefaultRow::Zeros,
        DefaultRowKind::Mean => DefaultRow::Mean(manifest.read_mean(&place.dir)?.into()),
    };
    let tiers = FeatureTiers::new(&tier_config, store.clone(), redis.clone());
    register(daemon, place.name, tiers.clone());
    Ok(TypeFeatures {
        tiers,
        store,
        redis,
    })
}

fn open_store_of_record(
    config: &ServeConfig,
    place: &TypePlace<'_>,
    manifest: &FeatureManifest,
) -> anyhow::Result<Arc<RocksStore>> {
    ensure!(
        config.redis.0.is_empty(),
        "the features of {} are in the embedded store; drop redis, or re-import them with --redis",
        place.whose()
    );
    let path = place.dir.join(FeatureManifest::STORE_DIR);
    // RocksDB would create an empty store in its place, and every answer
    // would be a default row.
    ensure!(
        path.join("CURRENT").is_file(),
        "the feature store {} is missing (features.json says {} rows were imported into it): {}",
        path.display(),
        manifest.num_nodes,
        place.reimport()
    );
    let (store, _) = RocksStore::open(&path, Role::StoreOfRecord)?;
    ensure!(
        manifest.num_nodes == 0 || store.holds_rows(),
        "the feature store {} holds no rows, but features.json says {} were imported into it: {}",
        path.display(),
        manifest.num_nodes,
        place.reimport()
    );
    manifest
        .check_store(&store, &path)
        .with_context(|| place.whose())?;
    Ok(Arc::new(store))
}

/// The L2 cache in front of Redis, unless `no_l2`; and whether it was
/// found corrupt and rebuilt (1) or not (0).
fn open_l2_cache(
    config: &ServeConfig,
    place: &TypePlace<'_>,
) -> anyhow::Result<(Option<Arc<RocksStore>>, u64)> {
    let (Some(path), Some(l2)) = (&place.l2, config.l2_cache()) else {
        return Ok((None, 0));
    };
    let role = Role::Cache {
        max_bytes: l2.max_bytes,
        ttl: l2.ttl,
    };
    let (store, opened) = RocksStore::open(path, role).with_context(|| {
        format!(
            "opening the L2 cache {} of {} (choose another l2_dir, or set no_l2)",
            path.display(),
            place.whose()
        )
    })?;
    Ok((Some(Arc::new(store)), u64::from(opened == Opened::Rebuilt)))
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
