//! The sidecar's metrics, in one `prometheus_client` registry, and its HTTP
//! endpoint (`metrics_addr`): `GET /metrics` (OpenMetrics text),
//! `GET /healthz` (liveness), `GET /readyz` (readiness).
//!
//! Two kinds of metric live in the registry:
//! - those the serving path updates ([`Metrics`]: counters and histograms
//!   of prometheus_client);
//! - those read from the daemon's state when scraped ([`StateCollector`]:
//!   tier counters, L1/L2 occupancy, the graph, the ring, the invalidation
//!   listener, readiness).
//!
//! Every name is listed in docs/metrics.md (a test compares the two).
//! Labels are few and fixed (`tier`, `cause`, `stage`, `state`, `source`),
//! never node ids.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use anyhow::Context;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::daemon::Daemon;

/// Bounds for rows per request (the neighbourhood fetched).
pub const ROWS_BUCKETS: [f64; 12] = [
    1.0, 10.0, 25.0, 50.0, 100.0, 221.0, 421.0, 1_000.0, 5_000.0, 20_000.0, 65_536.0, 262_144.0,
];

/// Bounds for requests per batch.
pub const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// The stage label of `sidecar_stage_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(daemon_kit::metrics::LATENCY_BUCKETS)
}

/// What the serving path counts and times.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub batches: Counter,
    pub requests: Counter,
    pub targets: Counter,
    pub rows_fetched: Counter,
    pub invalid_requests: Counter,
    /// Requests whose deadline had passed when they were taken.
    pub expired_requests: Counter,
    /// Requests carrying a node the graph does not have (`NEW_NODE`).
    pub new_node_requests: Counter,
    /// Targets of `FRESH_SINCE` requests answered `FRESH`, and all their
    /// targets.
    pub fresh_targets: Counter,
    pub fresh_checked: Counter,
    /// Hop-1 slots of `HUB_H1` requests whose node was a hub, and of those
    /// the ones sent without hop-2 neighbours (unchanged).
    pub hub_slots: Counter,
    pub hub_cached_slots: Counter,
    pub too_large: Counter,
    /// Requests whose batch served at least one row late.
    pub deadline_misses: Counter,
    /// Node ids invalidated through the admin socket.
    pub segments_replaced: Counter,
    pub admin_invalidated_ids: Counter,
    /// Time per batch in each stage: `sample`, `fetch`, `batch` (whole).
    pub stage_seconds: Family<StageLabel, Histogram, fn() -> Histogram>,
    /// Node-table rows per request.
    pub neighbor_fetch_count: Histogram,
    /// Requests per ring batch.
    pub batch_requests: Histogram,
}

impl Metrics {
    /// The registry, with the state collector reading `daemon` at scrape
    /// time (a weak reference: the daemon owns the registry).
    pub fn new(daemon: Weak<Daemon>) -> Self {
        let mut registry = Registry::default();
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let batches = counter(&mut registry, "sidecar_batches", "ring batches served");
        let requests = counter(&mut registry, "sidecar_requests", "ring requests served");
        let targets = counter(&mut registry, "sidecar_targets", "target nodes served");
        let rows_fetched = counter(
            &mut registry,
            "sidecar_rows_fetched",
            "unique feature rows asked of the tiers",
        );
        let invalid_requests = counter(
            &mut registry,
            "sidecar_invalid_requests",
            "requests refused as malformed",
        );
        let expired_requests = counter(
            &mut registry,
            "sidecar_expired_requests",
            "requests answered DEADLINE_EXCEEDED: their deadline had passed when taken",
        );
        let new_node_requests = counter(
            &mut registry,
            "sidecar_new_node_requests",
            "requests carrying a node the graph does not have (NEW_NODE), answered or refused",
        );
        let fresh_targets = counter(
            &mut registry,
            "sidecar_fresh_targets",
            "targets of FRESH_SINCE requests answered FRESH (nothing in their sample changed)",
        );
        let fresh_checked = counter(
            &mut registry,
            "sidecar_fresh_checked_targets",
            "targets of FRESH_SINCE requests checked for changes",
        );
        let hub_slots = counter(
            &mut registry,
            "sidecar_hub_slots",
            "hop-1 slots of HUB_H1 requests holding a hub (degree at least hub_min_degree)",
        );
        let hub_cached_slots = counter(
            &mut registry,
            "sidecar_hub_cached_slots",
            "of those, the slots sent without hop-2 neighbours (the hub's hop-1 sample unchanged)",
        );
        let too_large = counter(
            &mut registry,
            "sidecar_too_large",
            "requests refused because the response exceeds the slot",
        );
        let deadline_misses = counter(
            &mut registry,
            "sidecar_deadline_misses",
            "requests whose batch served at least one feature row late (as a default row)",
        );
        let segments_replaced = counter(
            &mut registry,
            "sidecar_ring_segments_replaced",
            "rings retired because another process truncated the segment file, and created again",
        );
        let admin_invalidated_ids = Counter::default();
        let stage_seconds =
            Family::<StageLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        // Every stage from the start (empty), so dashboards see the series.
        for stage in ["sample", "fetch", "batch"] {
            let _ = stage_seconds.get_or_create(&StageLabel { stage });
        }
        registry.register(
            "sidecar_stage_seconds",
            "time per batch in each stage (sample, fetch, batch)",
            stage_seconds.clone(),
        );
        let neighbor_fetch_count = Histogram::new(ROWS_BUCKETS);
        registry.register(
            "sidecar_neighbor_fetch_count",
            "node-table rows per request (the sampled neighbourhood whose features were fetched)",
            neighbor_fetch_count.clone(),
        );
        let batch_requests = Histogram::new(BATCH_BUCKETS);
        registry.register(
            "sidecar_batch_requests",
            "requests served together in one ring batch",
            batch_requests.clone(),
        );
        registry.register_collector(Box::new(StateCollector {
            daemon,
            admin_invalidated_ids: admin_invalidated_ids.clone(),
        }));
        Self {
            registry,
            batches,
            requests,
            targets,
            rows_fetched,
            invalid_requests,
            expired_requests,
            new_node_requests,
            fresh_targets,
            fresh_checked,
            hub_slots,
            hub_cached_slots,
            too_large,
            deadline_misses,
            segments_replaced,
            admin_invalidated_ids,
            stage_seconds,
            neighbor_fetch_count,
            batch_requests,
        }
    }

    /// A stage's histogram.
    pub fn stage(&self, stage: &'static str) -> Histogram {
        self.stage_seconds
            .get_or_create(&StageLabel { stage })
            .clone()
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        daemon_kit::metrics::encode(&self.registry)
    }
}

/// Reads the daemon's state at scrape time.
#[derive(Debug)]
struct StateCollector {
    daemon: Weak<Daemon>,
    admin_invalidated_ids: Counter,
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(e.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(e.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn labelled_counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for &(value_label, value) in values {
        ConstCounter::new(value).encode(family.encode_family(&[(label, value_label)])?)?;
    }
    Ok(())
}

fn labelled_gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, i64)],
) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for &(value_label, value) in values {
        ConstGauge::new(value).encode(family.encode_family(&[(label, value_label)])?)?;
    }
    Ok(())
}

impl Collector for StateCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(daemon) = self.daemon.upgrade() else {
            return Ok(());
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            &mut e,
            "sidecar_ready",
            "1 once the ring exists and the warm-up is done, 0 before and while draining",
            i64::from(daemon.is_ready()),
        )?;
        gauge(
            &mut e,
            "sidecar_draining",
            "1 while draining (no new requests taken)",
            i64::from(daemon.phase() == super::Phase::Draining),
        )?;
        gauge(
            &mut e,
            "sidecar_uptime_seconds",
            "seconds since the sidecar started",
            daemon.started.elapsed().as_secs_f64(),
        )?;
        let knobs = daemon.knobs.fanouts();
        labelled_gauges(
            &mut e,
            "sidecar_fanout",
            "fanout per hop of requests that leave it to the sidecar (runtime knob)",
            "hop",
            &[("1", i64::from(knobs[0])), ("2", i64::from(knobs[1]))],
        )?;
        gauge(
            &mut e,
            "sidecar_deadline_seconds",
            "longest a batch waits for feature rows from L2/L3 (runtime knob)",
            daemon.knobs.deadline().as_secs_f64(),
        )?;
        counter(
            &mut e,
            "sidecar_invalidated_ids_admin",
            "node ids invalidated through the admin socket",
            self.admin_invalidated_ids.get(),
        )?;
        if let Some(ring) = daemon.ring() {
            let o = ring.occupancy();
            labelled_gauges(
                &mut e,
                "sidecar_ring_slots",
                "ring slots per state",
                "state",
                &[
                    ("free", o.free.into()),
                    ("claimed", o.claimed.into()),
                    ("submitted", o.submitted.into()),
                    ("serving", o.serving.into()),
                    ("published", o.published.into()),
                    ("abandoned", o.abandoned.into()),
                ],
            )?;
            gauge(
                &mut e,
                "sidecar_ring_clients",
                "workers registered in the segment",
                ring.registered_clients(),
            )?;
            let c = ring.counters();
            counter(
                &mut e,
                "sidecar_ring_clients_reaped",
                "workers whose heartbeat stopped and whose slots were reclaimed",
                load(&c.clients_reaped),
            )?;
            counter(
                &mut e,
                "sidecar_ring_slots_reclaimed",
                "slots reclaimed from owners that are not live registered workers",
                load(&c.slots_reclaimed),
            )?;
            counter(
                &mut e,
                "sidecar_ring_clients_stalled",
                "times a worker's heartbeat stopped while its process still held its entry lock \
                 (kept, not reaped)",
                load(&c.clients_stalled),
            )?;
            counter(
                &mut e,
                "sidecar_ring_abandoned_freed",
                "abandoned slots freed by housekeeping (no serve thread held them)",
                load(&c.abandoned_freed),
            )?;
            counter(
                &mut e,
                "sidecar_ring_submissions_repaired",
                "submitted slots whose lost submission bit housekeeping set again",
                load(&c.submissions_repaired),
            )?;
            counter(
                &mut e,
                "sidecar_ring_requests_refused",
                "requests freed unanswered: their owner is not a live registered worker",
                load(&c.requests_refused),
            )?;
        }
        let Some(core) = daemon.core() else {
            return Ok(());
        };
        let t = core.tiers.stats();
        labelled_counters(
            &mut e,
            "sidecar_feature_rows",
            "feature rows served, per tier (a tier's hit ratio is its share)",
            "tier",
            &[
                ("l1", load(&t.l1_hits)),
                ("l2", load(&t.l2_hits)),
                ("l3", load(&t.l3_hits)),
            ],
        )?;
        labelled_counters(
            &mut e,
            "sidecar_feature_fallbacks",
            "default rows served, per cause",
            "cause",
            &[
                ("missing", load(&t.fallback_missing)),
                ("deadline", load(&t.fallback_deadline)),
                ("unavailable", load(&t.fallback_unavailable)),
            ],
        )?;
        labelled_counters(
            &mut e,
            "sidecar_feature_malformed",
            "stored values of the wrong length, served as misses, per tier",
            "tier",
            &[
                ("l2", core.store.as_ref().map_or(0, |s| load(&s.malformed))),
                ("l3", load(&t.malformed)),
            ],
        )?;
        counter(
            &mut e,
            "sidecar_feature_coalesced",
            "rows that joined another request's fetch",
            load(&t.coalesced),
        )?;
        counter(
            &mut e,
            "sidecar_redis_round_trips",
            "Redis MGET round trips (one per batch of misses)",
            load(&t.l3_round_trips),
        )?;
        counter(
            &mut e,
            "sidecar_l1_stale_refused",
            "fetched rows not cached because an invalidation ran during their fetch",
            core.tiers.stale_refused(),
        )?;
        counter(
            &mut e,
            "sidecar_l2_writes",
            "rows from Redis written back to the L2 cache",
            load(&t.l2_writes),
        )?;
        counter(
            &mut e,
            "sidecar_l2_rebuilds",
            "corrupt L2 caches moved aside and rebuilt empty at start",
            core.l2_rebuilds,
        )?;
        gauge(
            &mut e,
            "sidecar_store_directory_lost",
            "1 once the embedded store's directory was found deleted or replaced while open \
             (writes are refused; restore it and restart)",
            u64::from(core.store.as_ref().is_some_and(|s| {
                s.directory_problem();
                s.alarmed()
            })),
        )?;
        gauge(
            &mut e,
            "sidecar_store_disk_full",
            "1 once a write of the embedded store failed for want of space on its device \
             (writes fail until space is freed and the sidecar restarted; reads go on)",
            u64::from(core.store.as_ref().is_some_and(|s| s.disk_full())),
        )?;
        counter(
            &mut e,
            "sidecar_store_write_errors",
            "writes to the embedded store that failed (full disk, I/O error), never acknowledged",
            core.store.as_ref().map_or(0, |s| load(&s.write_errors)),
        )?;
        counter(
            &mut e,
            "sidecar_store_writes_refused",
            "writes to the embedded store refused because its directory was lost",
            core.store.as_ref().map_or(0, |s| load(&s.writes_refused)),
        )?;
        counter(
            &mut e,
            "sidecar_l2_read_errors",
            "L2 reads that failed and were served as misses",
            core.store.as_ref().map_or(0, |s| load(&s.read_errors)),
        )?;
        gauge(
            &mut e,
            "sidecar_l2_disk_bytes",
            "bytes of the L2 store's files on disk",
            core.store.as_ref().map_or(0, |s| s.disk_bytes()),
        )?;
        if let Some(store) = core.store.as_ref() {
            let parts = store
                .memory_bytes()
                .map(|(part, bytes)| (part, bytes as i64));
            labelled_gauges(
                &mut e,
                "sidecar_l2_memory_bytes",
                "memory the L2 store (RocksDB) holds, per part",
                "part",
                &parts,
            )?;
        }
        let (l1_rows, pinned_rows) = core.tiers.l1_rows();
        gauge(
            &mut e,
            "sidecar_l1_bytes",
            "bytes held by the L1 cache",
            core.tiers.l1_bytes(),
        )?;
        gauge(
            &mut e,
            "sidecar_l1_rows",
            "rows held by the L1 cache",
            l1_rows,
        )?;
        gauge(
            &mut e,
            "sidecar_l1_pinned_rows",
            "rows of the pinned hot set",
            pinned_rows,
        )?;
        gauge(
            &mut e,
            "sidecar_rows_in_flight",
            "rows being fetched from L2 or L3 now",
            core.tiers.rows_in_flight(),
        )?;
        let changes = core.graph.changes();
        let (feature_marks, edge_marks) = changes.marked();
        gauge(
            &mut e,
            "sidecar_change_tick",
            "changes (graph updates, feature invalidations) applied since the sidecar started",
            changes.tick(),
        )?;
        labelled_gauges(
            &mut e,
            "sidecar_change_marks",
            "nodes marked by the change clock (kept for the process's life), per kind",
            "kind",
            &[
                ("features", feature_marks as i64),
                ("edges", edge_marks as i64),
            ],
        )?;
        let graph = core.graph.snapshot();
        gauge(
            &mut e,
            "sidecar_graph_nodes",
            "nodes of the served graph",
            graph.n_nodes(),
        )?;
        gauge(
            &mut e,
            "sidecar_graph_edges",
            "edges of the served graph",
            graph.n_edges(),
        )?;
        gauge(
            &mut e,
            "sidecar_graph_generation",
            "updates applied to the graph since its import (kept by compaction)",
            graph.generation(),
        )?;
        gauge(
            &mut e,
            "sidecar_graph_delta_entries",
            "entries of the graph's in-memory delta (nodes with added edges, added nodes)",
            graph.delta_entries(),
        )?;
        counter(
            &mut e,
            "sidecar_graph_compactions",
            "graph compactions completed (asked for or automatic)",
            core.graph.compactions(),
        )?;
        if let Some(updates) = core.updates.as_deref() {
            gauge(
                &mut e,
                "sidecar_update_lag_seconds",
                "now minus the time of the last applied update-stream entry while entries are \
                 pending; 0 when caught up",
                updates.lag_seconds(),
            )?;
            gauge(
                &mut e,
                "sidecar_update_position_ms",
                "the millisecond part of the last applied update-stream entry's id",
                updates.position().ms,
            )?;
            let applied: Vec<(&str, u64)> = crate::updates::follower::OPS
                .iter()
                .zip(&updates.applied)
                .map(|(op, n)| (*op, load(n)))
                .collect();
            labelled_counters(
                &mut e,
                "sidecar_updates_applied",
                "update-stream entries applied, per op",
                "op",
                &applied,
            )?;
            counter(
                &mut e,
                "sidecar_updates_malformed",
                "update-stream entries skipped whole as malformed",
                load(&updates.malformed),
            )?;
            counter(
                &mut e,
                "sidecar_updates_read_errors",
                "failed reads of the update stream (retried)",
                load(&updates.read_errors),
            )?;
            gauge(
                &mut e,
                "sidecar_updates_stale",
                "1 once the stream was trimmed past this replica's position (it reports not \
                 ready and refuses requests; re-seed it)",
                u64::from(updates.stale().is_some()),
            )?;
            let family = e.encode_descriptor(
                "sidecar_update_apply_lag_seconds",
                "per applied entry, from its id's time to its change being visible",
                None,
                updates.apply_lag.metric_type(),
            )?;
            updates.apply_lag.encode(family)?;
        }
        let inv = &core.invalidation;
        counter(
            &mut e,
            "sidecar_invalidation_messages",
            "messages received on the invalidation channel",
            load(&inv.messages),
        )?;
        counter(
            &mut e,
            "sidecar_invalidation_ids",
            "node ids invalidated through the invalidation channel",
            load(&inv.ids),
        )?;
        counter(
            &mut e,
            "sidecar_invalidation_bad_tokens",
            "tokens of invalidation messages that are not node ids",
            load(&inv.bad_tokens),
        )?;
        counter(
            &mut e,
            "sidecar_invalidation_reconnects",
            "times the invalidation subscription was lost and made again",
            load(&inv.reconnects),
        )?;
        Ok(())
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` from the runtime
/// of `handle`. The address is bound before this returns, so a taken port
/// is a start-up error, not a log line. Started before the graph is loaded:
/// probes get answers (503 not ready) during the warm-up.
pub fn serve(
    addr: SocketAddr,
    daemon: Arc<Daemon>,
    handle: &tokio::runtime::Handle,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!("binding the metrics address {addr}: choose another metrics_addr")
    })?;
    listener.set_nonblocking(true)?;
    let _guard = handle.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (for_ready, for_live) = (daemon.clone(), daemon.clone());
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let daemon = daemon.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, daemon_kit::metrics::CONTENT_TYPE)],
                        daemon.metrics.encode(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || async move {
                match for_live.liveness() {
                    Ok(()) => (StatusCode::OK, "ok\n".to_string()),
                    Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
                }
            }),
        )
        .route(
            "/readyz",
            get(move || async move {
                match for_ready.readiness() {
                    Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                    Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
                }
            }),
        );
    tracing::info!(%addr, "metrics endpoint listening");
    Ok(handle.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    }))
}
