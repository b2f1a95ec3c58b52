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
//! Loading is [`load`]'s; each subsystem releases its readiness latch as it
//! comes up (`crate::daemon`).
//!
//! The ring is served by `serve_threads` dedicated threads (no async
//! runtime worker blocks on the ring): each takes every request submitted
//! at that moment, serves them as one batch ([`batch`]), and repeats, so a
//! batch that waits for its rows (L2, Redis) holds up only its own thread
//! while the others sample and answer. The tiers' Redis and RocksDB I/O
//! runs on a small tokio runtime beside them. The main thread runs the
//! control loop ([`control`]) over a closed set of events: a stop, a drain
//! and its reply, a damaged segment, and a tick for the store's directory.
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
mod control;
mod load;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use daemon_kit::logging::LogHandle;
use protocol::layout::FeatureSchema;
use protocol::segment::SegmentConfig;
use protocol::server::ServerOptions;

use crate::admin::server::AdminServer;
pub use crate::config::{DefaultRowKind, ServeConfig};
pub use crate::daemon::events::{Event, Events};
use crate::daemon::{Core, Daemon, Phase};

/// Runs the sidecar until it is stopped: a signal or `sidecarctl shutdown`
/// posts [`Event::Stop`] through `events` (made before the signal thread
/// starts). `log` is the installed logger, whose level the admin socket
/// can change.
pub fn run(config: ServeConfig, log: Option<Arc<LogHandle>>, events: Events) -> anyhow::Result<()> {
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
    let daemon = Daemon::new(config, log, events.poster());
    // The operator's surface first: probes answer "not ready" meanwhile.
    let (_metrics, admin) = start_surface(&daemon, &runtime)?;

    daemon.set_phase(Phase::Loading);
    let loaded = load::load(&daemon, &runtime)?;
    if daemon.stop_requested() {
        tracing::info!("stopped before the warm-up");
        return Ok(());
    }
    warm_up(&daemon, &runtime, &loaded.core);
    let dim = loaded.schema.feature_dim;
    daemon.install_core(loaded.core);
    if daemon.stop_requested() {
        tracing::info!("stopped before the ring was created");
        return Ok(());
    }
    let core = daemon.loaded()?;

    // The ring: created last, so attaching workers find a ready sidecar.
    let graph_schema = core.ring_schema.clone();
    let mut options = ring_options(&daemon.config, loaded.schema, graph_schema);
    if core.ring_schema.is_none() {
        // A one-type graph's edge data is in the segment header.
        let snapshot = core.graph.snapshot();
        options.segment.one_type_edge_data = snapshot.base().schema().edge_types[0].data();
    }
    let control =
        control::Control::new(&daemon, core, runtime.handle(), events.receiver(), options);
    let server = control.create_ring()?;
    daemon.set_phase(Phase::Ready);
    tracing::info!(
        segment = %daemon.config.shm_name,
        feature_dim = dim,
        graph_version = loaded.schema.graph_version,
        fanouts = ?daemon.config.fanouts(),
        "sidecar ready"
    );
    let server = control.run(server)?;

    // Stopped serving: remove the segment.
    daemon.set_phase(Phase::Stopping);
    server.shutdown();
    drop(admin);
    compact_before_stopping(core)?;
    for store in core.features.stores() {
        store.flush()?;
    }
    tracing::info!("sidecar stopped");
    Ok(())
}

/// The metrics endpoint and the admin socket, each if configured.
fn start_surface(
    daemon: &Arc<Daemon>,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(Option<tokio::task::JoinHandle<()>>, Option<AdminServer>)> {
    let config = &daemon.config;
    let metrics = match config.metrics_addr {
        Some(addr) => Some(daemon_kit::endpoint::serve(
            addr,
            "metrics_addr",
            daemon.clone(),
            runtime.handle(),
        )?),
        None => None,
    };
    let admin = match &config.admin_socket {
        Some(path) => Some(AdminServer::start(
            path,
            daemon.clone(),
            runtime.handle().clone(),
        )?),
        None => None,
    };
    Ok((metrics, admin))
}

/// Pins the `warm_up` nodes with the most edges (over every node type
/// with features) in L1, then releases the warm-up latch.
fn warm_up(daemon: &Daemon, runtime: &tokio::runtime::Runtime, core: &Core) {
    daemon.set_phase(Phase::WarmingUp);
    let warming = Instant::now();
    let hot = core
        .features
        .top_degree(&core.graph.snapshot(), daemon.config.warm_up);
    let pinned = runtime.block_on(core.features.pin(&hot, 1_000, |_, _| {}));
    daemon.latches.warm_up.release();
    tracing::info!(
        pinned,
        requested = hot.len(),
        seconds = warming.elapsed().as_secs_f64(),
        "L1 hot set warmed (the nodes with the most edges)"
    );
}

/// The segment's geometry and the ring server's options.
fn ring_options(
    config: &ServeConfig,
    schema: FeatureSchema,
    graph: Option<protocol::graph_schema::GraphSchema>,
) -> ServerOptions {
    let mut segment = SegmentConfig::new(config.shm_name.clone(), schema);
    segment.graph = graph;
    segment.mode = config.shm_mode.0;
    segment.slot_count = config.slots;
    segment.max_targets = config.max_targets;
    segment.max_fanouts = config.max_fanouts();
    segment.max_nodes = config.max_nodes;
    segment.max_new_node_edges = config.max_new_node_edges;
    segment.response_bytes = config.response_bytes();
    let mut options = ServerOptions::new(segment);
    options.segment.client_timeout = config.client_timeout();
    options.wait.spin = config.ring_spin_us.fixed().into();
    options
}

/// Writes the graph updates the index does not hold yet (those of the admin
/// socket, or of an update stream since the last compaction) into it, so
/// that a clean stop never drops an acknowledged update (docs/admin.md).
fn compact_before_stopping(core: &Core) -> anyhow::Result<()> {
    while core.graph.compacting() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let graph = core.graph.snapshot();
    let pending = graph.generation() - graph.base_generation();
    if pending == 0 {
        return Ok(());
    }
    let started = Instant::now();
    core.graph.compact().with_context(|| {
        format!(
            "compacting {pending} graph update(s) into {} before stopping: they are lost; \
             apply them again",
            graph.base().location()
        )
    })?;
    tracing::info!(
        updates = pending,
        seconds = started.elapsed().as_secs_f64(),
        "graph updates compacted into the index before stopping"
    );
    Ok(())
}
