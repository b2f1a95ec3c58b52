//! `sidecar serve`: the ring server wired to the graph, the sampler and the
//! feature tiers, with the operator's surface (admin socket, metrics,
//! probes) around it.
//!
//! Start-up is the readiness order, one [`Phase`] after another:
//! `starting` (the admin socket and the metrics endpoint are bound first,
//! so probes and `sidecarctl` answer from the start), `loading` (seed the
//! data directory if asked, map the graph index, open the feature store,
//! connect to Redis), `warming-up` (pin the top-degree nodes in L1), then
//! `ready` once the shared-memory segment exists. A worker therefore never
//! attaches to a sidecar that is not ready, and readiness (`/readyz`,
//! `sidecarctl ready`) is false until then.
//!
//! The ring is served by `serve_threads` dedicated threads (no async
//! runtime worker blocks on the ring): each takes every request submitted
//! at that moment, serves them as one batch ([`batch`]), and repeats, so a
//! batch that waits for its rows (L2, Redis) holds up only its own thread
//! while the others sample and answer. The tiers' Redis and RocksDB I/O
//! runs on a small tokio runtime beside them.
//!
//! Draining (`sidecarctl drain`, and every stop): the segment goes
//! DRAINING, so workers accept no new call; what was submitted, and what
//! the workers had accepted (counted in their registry entries), is
//! answered; the drain ends when neither is left (or after
//! `drain_timeout_s`).
//! A drained sidecar is not ready and stays up until it is stopped. A stop
//! (SIGTERM, SIGINT, `sidecarctl shutdown`) drains, removes the segment,
//! flushes the store and exits 0.

pub mod batch;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use daemon_kit::logging::LogHandle;
use protocol::layout::{dtype, FeatureSchema};
use protocol::segment::SegmentConfig;
use protocol::server::{RingServer, ServerOptions};

pub use crate::config::{DefaultRowKind, ServeConfig};
use crate::daemon::{Core, Daemon, DrainOutcome, Phase};
use crate::features::import::{self, FeatureManifest};
use crate::features::invalidation::{self, InvalidationStats};
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{Opened, RocksStore, Role};
use crate::features::{DefaultRow, FeatureTiers, TierConfig};
use crate::graph::live::{AutoCompact, LiveGraph};
use crate::graph::{dataset, CsrIndex};
use crate::updates::follower::{self, FollowerStats};

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

/// Opens the stores, connects to Redis and builds the tiers.
fn load(
    config: &ServeConfig,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(Core, Vec<u64>, FeatureSchema)> {
    // Before anything in the directory is opened: one sidecar per directory.
    if config.seed_dataset.is_some() {
        std::fs::create_dir_all(&config.data_dir).with_context(|| {
            format!("creating the data directory {}", config.data_dir.display())
        })?;
    }
    let data_dir_lock = crate::data_dir::DataDirLock::acquire(&config.data_dir)?;
    if let Some(dataset_dir) = &config.seed_dataset {
        ensure!(
            config.redis.0.is_empty(),
            "seed_dataset imports into the embedded store; with redis, import the features \
             with `sidecar import --redis` instead"
        );
        seed(dataset_dir, &config.data_dir)?;
    }
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
    let auto_compact = (config.compact_after > 0).then(|| AutoCompact {
        index_path: index_path.clone(),
        after: config.compact_after,
    });
    let graph = LiveGraph::with_auto_compact(index, auto_compact);

    // 2. The feature store(s).
    let manifest = FeatureManifest::read(&config.data_dir)?;
    ensure!(
        manifest.dtype == "f32",
        "features.json declares dtype {:?}; only f32 is served",
        manifest.dtype
    );
    let dim = manifest.feature_dim as usize;
    let mut l2_rebuilds = 0;
    let redis_config = RedisConfig {
        urls: config.redis.0.clone(),
        cluster: config.redis_cluster,
        prefix: manifest
            .redis_prefix
            .clone()
            .unwrap_or_else(|| crate::features::contract::DEFAULT_PREFIX.into()),
        ca_file: config.redis_ca.clone(),
        ..RedisConfig::single("")
    };
    let (store, redis) = match manifest.store.as_str() {
        "rocksdb" => {
            ensure!(
                config.redis.0.is_empty(),
                "the features of {} are in the embedded store; drop redis, or re-import \
                 them with --redis",
                config.data_dir.display()
            );
            let path = config.data_dir.join(FeatureManifest::STORE_DIR);
            let rebuild = || {
                format!(
                    "re-run `sidecar import <dataset> --data-dir {}` to rebuild it",
                    config.data_dir.display()
                )
            };
            // RocksDB would create an empty store in its place, and every
            // answer would be a default row.
            ensure!(
                path.join("CURRENT").is_file(),
                "the feature store {} is missing (features.json says {} rows were imported \
                 into it): {}",
                path.display(),
                manifest.num_nodes,
                rebuild()
            );
            let (store, _) = RocksStore::open(&path, Role::StoreOfRecord)?;
            ensure!(
                manifest.num_nodes == 0 || store.holds_rows(),
                "the feature store {} holds no rows, but features.json says {} were imported \
                 into it: {}",
                path.display(),
                manifest.num_nodes,
                rebuild()
            );
            (Some(Arc::new(store)), None)
        }
        "redis" => {
            ensure!(
                !config.redis.0.is_empty(),
                "the features of {} were imported into Redis: set redis (--redis <url>)",
                config.data_dir.display()
            );
            let tier = runtime.block_on(RedisTier::connect(&redis_config))?;
            let l2 = match config.l2_cache() {
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
                            "opening the L2 cache {} (choose another l2_dir, or set no_l2)",
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
    tier_config.changes = Some(graph.changes().clone());
    tier_config.l1_bytes = config.l1_bytes();
    tier_config.default_deadline = config.deadline();
    tier_config.default_row = match config.default_row {
        DefaultRowKind::Zeros => DefaultRow::Zeros,
        DefaultRowKind::Mean => DefaultRow::Mean(manifest.read_mean(&config.data_dir)?.into()),
    };
    let tiers = FeatureTiers::new(&tier_config, store.clone(), redis.clone());
    let invalidation = Arc::new(InvalidationStats::default());
    if let Some(channel) = &config.invalidation_channel {
        let listener = runtime.block_on(invalidation::spawn_listener(
            tiers.clone(),
            &redis_config,
            channel.clone(),
            invalidation.clone(),
        ))?;
        // Runs for the life of the runtime.
        drop(listener);
    }
    let updates = match &config.updates_stream {
        Some(stream) => {
            let stats = Arc::new(FollowerStats::new(stream));
            let stream_redis = RedisConfig {
                urls: config.updates_redis_urls().to_vec(),
                cluster: config.redis_cluster,
                ca_file: config.redis_ca.clone(),
                ..RedisConfig::single("")
            };
            let targets = follower::Targets {
                graph: graph.clone(),
                tiers: tiers.clone(),
                store: store.clone(),
                row_bytes: 4 * dim,
            };
            let mut follower = runtime.block_on(follower::Follower::start(
                &stream_redis,
                stream,
                targets,
                stats.clone(),
            ))?;
            // Caught up before ready: a restarted replica never serves the
            // graph it had at its last compaction.
            let replaying = Instant::now();
            let replayed = runtime.block_on(follower.catch_up())?;
            tracing::info!(
                stream = %stream,
                entries = replayed,
                position = %stats.position(),
                seconds = replaying.elapsed().as_secs_f64(),
                "update stream replayed to its end"
            );
            runtime.spawn(follower.run());
            Some(stats)
        }
        None => None,
    };
    let schema = FeatureSchema {
        feature_dim: manifest.feature_dim,
        dtype: dtype::F32,
        graph_version,
        default_fanouts: config.fanouts.0,
    };
    Ok((
        Core {
            graph,
            index_path,
            tiers,
            store,
            redis,
            feature_dim: dim,
            l2_rebuilds,
            invalidation,
            updates,
            data_dir_lock,
        },
        hot,
        schema,
    ))
}

/// Runs the sidecar until it is stopped (a signal sets `stop_signal`;
/// `sidecarctl shutdown` sets the daemon's own flag). `log` is the
/// installed logger, whose level the admin socket can change.
/// Writes the graph updates the index does not hold yet (those of the admin
/// socket, or of an update stream since the last compaction) into it, so
/// that a clean stop never drops an acknowledged update (docs/admin.md).
fn compact_before_stopping(core: &Core) -> anyhow::Result<()> {
    while core.graph.compacting() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let graph = core.graph.snapshot();
    let pending = graph.generation() - graph.base().header().generation;
    if pending == 0 {
        return Ok(());
    }
    let started = Instant::now();
    core.graph.compact(&core.index_path).with_context(|| {
        format!(
            "compacting {pending} graph update(s) into {} before stopping: they are lost; \
             apply them again",
            core.index_path.display()
        )
    })?;
    tracing::info!(
        updates = pending,
        seconds = started.elapsed().as_secs_f64(),
        "graph updates compacted into the index before stopping"
    );
    Ok(())
}

pub fn run(
    config: ServeConfig,
    log: Option<Arc<LogHandle>>,
    stop_signal: Option<Arc<AtomicBool>>,
) -> anyhow::Result<()> {
    use daemon_kit::config::Validate;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("`{}`: {}; {}", e.key, e.problem, e.fix))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sidecar-io")
        .enable_all()
        .build()
        .context("starting the I/O runtime")?;
    let daemon = Daemon::new(config, log);
    let config = &daemon.config;
    let stopping = || {
        daemon.stop_requested()
            || stop_signal
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Acquire))
    };

    // The operator's surface first: probes answer "not ready" meanwhile.
    let _metrics = match config.metrics_addr {
        Some(addr) => Some(crate::daemon::metrics::serve(
            addr,
            daemon.clone(),
            runtime.handle(),
        )?),
        None => None,
    };
    let admin = match &config.admin_socket {
        Some(path) => Some(crate::admin::server::AdminServer::start(
            path,
            daemon.clone(),
            runtime.handle().clone(),
        )?),
        None => None,
    };

    daemon.set_phase(Phase::Loading);
    let (core, hot, schema) = load(config, &runtime)?;
    if stopping() {
        tracing::info!("stopped before the warm-up");
        return Ok(());
    }
    daemon.set_phase(Phase::WarmingUp);
    let warming = Instant::now();
    let pinned = runtime.block_on(core.tiers.warm_up(&hot));
    tracing::info!(
        pinned,
        seconds = warming.elapsed().as_secs_f64(),
        "L1 hot set warmed"
    );
    let dim = core.feature_dim;
    daemon.install_core(core);
    if stopping() {
        tracing::info!("stopped before the ring was created");
        return Ok(());
    }

    // The ring: created last, so attaching workers find a ready sidecar.
    let mut segment = SegmentConfig::new(config.shm_name.clone(), schema);
    segment.mode = config.shm_mode.0;
    segment.slot_count = config.slots;
    segment.max_targets = config.max_targets;
    segment.max_fanouts = config.max_fanouts.0;
    segment.max_nodes = config.max_nodes;
    segment.max_new_node_edges = config.max_new_node_edges;
    segment.response_bytes = config.response_bytes();
    let mut options = ServerOptions::new(segment);
    options.segment.client_timeout = config.client_timeout();
    let create_ring = || -> anyhow::Result<RingServer> {
        let server = RingServer::create(options.clone())
            .with_context(|| format!("creating the shared-memory ring {}", config.shm_name))?;
        daemon.install_ring(server.monitor());
        Ok(server)
    };
    let mut server = create_ring()?;
    daemon.set_phase(Phase::Ready);
    tracing::info!(
        segment = %config.shm_name,
        feature_dim = dim,
        graph_version = schema.graph_version,
        fanouts = ?config.fanouts.0,
        "sidecar ready"
    );

    let core = daemon.loaded()?;
    // Takes what is submitted (waiting up to `wait`) and answers it as one
    // batch, against the graph snapshot of that moment. Each serving thread
    // has its own batch server (sampler buffers); a batch waiting for its
    // rows blocks only its own thread.
    let serve_next = |server: &RingServer,
                      batch_server: &mut batch::BatchServer,
                      tickets: &mut Vec<protocol::ServeTicket>,
                      wait: Duration|
     -> usize {
        daemon.loop_turned();
        tickets.clear();
        let n = server.next_batch(tickets, wait);
        if n == 0 {
            return 0;
        }
        if let Some(why) = core.updates.as_ref().and_then(|u| u.stale()) {
            for ticket in tickets.drain(..) {
                let id = ticket.request_id();
                ticket.respond_error(protocol::layout::status::UNAVAILABLE, id, &why);
            }
            return n;
        }
        // The change tick is read before the snapshot is loaded: a change
        // the snapshot holds may be newer than the tick, never older.
        let changes = core.graph.changes();
        let change_tick = changes.tick();
        let snapshot = core.graph.snapshot();
        let ctx = batch::BatchContext {
            graph: &snapshot,
            changes,
            change_tick,
            tiers: &core.tiers,
            runtime: runtime.handle(),
            knobs: &daemon.knobs,
            max_nodes: config.max_nodes,
            response_bytes: server.segment().geometry().response_bytes,
            metrics: &daemon.metrics,
        };
        batch_server.serve(&ctx, std::mem::take(tickets));
        n
    };
    // The drain: the serving threads go on answering; this waits until no
    // request is pending and the workers have finished every call they
    // accepted before it began (or the drain timeout).
    let drain = |server: &RingServer| {
        let began = Instant::now();
        let answered_before = daemon.metrics.requests.get();
        server.set_draining();
        daemon.set_phase(Phase::Draining);
        let timeout = config.drain_timeout();
        let ring = server.monitor();
        while ring.unfinished() > 0 && began.elapsed() < timeout && !server.damaged() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let pending = ring.unfinished();
        let outcome = DrainOutcome {
            answered: daemon.metrics.requests.get() - answered_before,
            pending,
            seconds: began.elapsed().as_secs_f64(),
            complete: pending == 0,
        };
        tracing::info!(
            answered = outcome.answered,
            pending = outcome.pending,
            seconds = outcome.seconds,
            "drained"
        );
        daemon.finish_drain(outcome);
    };
    // Serves `server` until the stop (true) or until its segment file is
    // found truncated by another process (false).
    let mut drained = false;
    let serve_ring = |server: &RingServer, drained: &mut bool| -> anyhow::Result<bool> {
        let serving = AtomicBool::new(true);
        std::thread::scope(|scope| -> anyhow::Result<bool> {
            for i in 0..config.serve_threads {
                let serving = &serving;
                std::thread::Builder::new()
                    .name(format!("serve-{i}"))
                    .spawn_scoped(scope, move || {
                        let mut batch_server = batch::BatchServer::default();
                        let mut tickets = Vec::new();
                        while serving.load(Ordering::Acquire) {
                            serve_next(
                                server,
                                &mut batch_server,
                                &mut tickets,
                                Duration::from_millis(100),
                            );
                        }
                    })
                    .context("starting a serving thread")?;
            }
            // This thread watches for a drain, for the stop, for a damaged
            // segment, and every second that the embedded store's directory
            // is still there.
            let mut store_checked = Instant::now();
            let mut stopped = true;
            while !stopping() {
                if server.damaged() {
                    stopped = false;
                    break;
                }
                if !*drained && daemon.drain_requested() {
                    drain(server);
                    *drained = true;
                }
                if store_checked.elapsed() >= Duration::from_secs(1) {
                    store_checked = Instant::now();
                    if let Some(store) = daemon.core().and_then(|core| core.store.as_ref()) {
                        store.directory_problem();
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if stopped && !*drained {
                drain(server);
                *drained = true;
            }
            serving.store(false, Ordering::Release);
            Ok(stopped)
        })
    };
    while !serve_ring(&server, &mut drained)? {
        // Another process truncated the segment file: every worker detaches
        // from it (docs/protocol.md, section 1, Truncation). Retire it and create a new
        // one under the same name; the workers attach to that by themselves.
        daemon.metrics.segments_replaced.inc();
        server.shutdown();
        let mut backoff = Duration::from_millis(50);
        server = loop {
            match create_ring() {
                Ok(server) => break server,
                Err(e) if !stopping() => {
                    tracing::error!(error = %format!("{e:#}"), "cannot create a new ring; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        };
        if drained {
            server.set_draining();
        }
        tracing::warn!(
            segment = %config.shm_name,
            epoch = format_args!("{:#x}", server.segment().epoch()),
            "a new shared-memory ring replaces the truncated one"
        );
    }

    // Stopped serving: remove the segment.
    daemon.set_phase(Phase::Stopping);
    server.shutdown();
    drop(admin);
    compact_before_stopping(core)?;
    if let Some(store) = &core.store {
        store.flush()?;
    }
    tracing::info!("sidecar stopped");
    Ok(())
}
