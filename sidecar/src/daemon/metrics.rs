//! The sidecar's metrics: one `prometheus_client` registry (prefix
//! `sidecar`) in which every subsystem registers its own
//! [`Telemetry`], each in its own sub-registry: the ring (`ring_*`), the
//! feature tiers, the embedded store, the graph, the update follower and
//! the invalidation listener (`invalidation_*`), and the daemon itself
//! (readiness, phase, knobs). Each encodes a typed snapshot of its own state
//! at scrape time; `sidecarctl status` and `stats` read the same snapshots.
//! [`Metrics`] holds what the serving path counts and times.
//!
//! Every name is listed in docs/metrics.md (a test compares the two).
//! Labels are few and fixed (`tier`, `cause`, `stage`, `state`, `source`),
//! never node ids. The HTTP endpoint is `daemon_kit::endpoint`'s.

use std::fmt;
use std::sync::{PoisonError, RwLock, Weak};

use daemon_kit::metrics::{Histogram, Out, Telemetry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::daemon::{Daemon, Phase};

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
    registry: RwLock<Registry>,
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
    /// Ring batches whose serving faulted (a panic): their unanswered
    /// requests were answered INTERNAL and serving went on.
    pub serve_faults: Counter,
    /// Requests whose batch served at least one row late.
    pub deadline_misses: Counter,
    /// Node ids invalidated through the admin socket.
    pub admin_invalidated_ids: Counter,
    /// Time per batch in each stage: `sample`, `fetch`, `batch` (whole).
    pub stage_seconds: Family<StageLabel, Histogram, fn() -> Histogram>,
    /// Node-table rows per request.
    pub neighbor_fetch_count: Histogram,
    /// Requests per ring batch.
    pub batch_requests: Histogram,
}

impl Metrics {
    /// The registry, holding the serving path's metrics; the subsystems
    /// register theirs as they are made ([`Metrics::register`]).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sidecar");
        let mut counter = |name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let batches = counter("batches", "ring batches served");
        let requests = counter("requests", "ring requests served");
        let targets = counter("targets", "target nodes served");
        let rows_fetched = counter("rows_fetched", "unique feature rows asked of the tiers");
        let invalid_requests = counter("invalid_requests", "requests refused as malformed");
        let expired_requests = counter(
            "expired_requests",
            "requests answered DEADLINE_EXCEEDED: their deadline had passed when taken",
        );
        let new_node_requests = counter(
            "new_node_requests",
            "requests carrying a node the graph does not have (NEW_NODE), answered or refused",
        );
        let fresh_targets = counter(
            "fresh_targets",
            "targets of FRESH_SINCE requests answered FRESH (nothing in their sample changed)",
        );
        let fresh_checked = counter(
            "fresh_checked_targets",
            "targets of FRESH_SINCE requests checked for changes",
        );
        let hub_slots = counter(
            "hub_slots",
            "hop-1 slots of HUB_H1 requests holding a hub (degree at least hub_min_degree)",
        );
        let hub_cached_slots = counter(
            "hub_cached_slots",
            "of those, the slots sent without hop-2 neighbours (the hub's hop-1 sample unchanged)",
        );
        let too_large = counter(
            "too_large",
            "requests refused because the response exceeds the slot",
        );
        let serve_faults = counter(
            "serve_faults",
            "ring batches whose serving faulted: their unanswered requests were answered INTERNAL",
        );
        let deadline_misses = counter(
            "deadline_misses",
            "requests whose batch served at least one feature row late (as a default row)",
        );
        let admin_invalidated_ids = counter(
            "invalidated_ids_admin",
            "node ids invalidated through the admin socket",
        );
        let stage_seconds =
            Family::<StageLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        // Every stage from the start (empty), so dashboards see the series.
        for stage in STAGES {
            let _ = stage_seconds.get_or_create(&StageLabel { stage });
        }
        registry.register(
            "stage_seconds",
            "time per batch in each stage (sample, fetch, batch)",
            stage_seconds.clone(),
        );
        let neighbor_fetch_count = Histogram::new(ROWS_BUCKETS);
        registry.register(
            "neighbor_fetch_count",
            "node-table rows per request (the sampled neighbourhood whose features were fetched)",
            neighbor_fetch_count.clone(),
        );
        let batch_requests = Histogram::new(BATCH_BUCKETS);
        registry.register(
            "batch_requests",
            "requests served together in one ring batch",
            batch_requests.clone(),
        );
        Self {
            registry: RwLock::new(registry),
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
            serve_faults,
            deadline_misses,
            admin_invalidated_ids,
            stage_seconds,
            neighbor_fetch_count,
            batch_requests,
        }
    }

    /// Registers a subsystem's telemetry, under `sidecar_<prefix>_` or, with
    /// no prefix, at the top level (names that predate the sub-registries).
    pub fn register(&self, prefix: Option<&str>, telemetry: impl Telemetry) {
        let mut registry = self
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let sub = match prefix {
            Some(prefix) => registry.sub_registry_with_prefix(prefix),
            None => registry.sub_registry_with_labels(std::iter::empty()),
        };
        daemon_kit::metrics::register(sub, telemetry);
    }

    /// Registers one of several telemetries of a kind (a typed graph's
    /// tiers, one per node type) at the top level, each series labelled
    /// `label="value"`.
    pub fn register_labelled(&self, label: &str, value: &str, telemetry: impl Telemetry) {
        let mut registry = self
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let labels = [(
            std::borrow::Cow::Owned(label.to_string()),
            std::borrow::Cow::Owned(value.to_string()),
        )];
        let sub = registry.sub_registry_with_labels(labels.into_iter());
        daemon_kit::metrics::register(sub, telemetry);
    }

    /// A stage's histogram.
    pub fn stage(&self, stage: &'static str) -> Histogram {
        self.stage_seconds
            .get_or_create(&StageLabel { stage })
            .clone()
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        daemon_kit::metrics::encode(&self.registry.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The stages of `sidecar_stage_seconds`.
pub const STAGES: [&str; 3] = ["sample", "fetch", "batch"];

/// The daemon's own state at scrape time: readiness, phase, uptime and the
/// run-time knobs (a weak reference: the daemon owns the registry).
#[derive(Debug)]
pub(crate) struct DaemonTelemetry(pub Weak<Daemon>);

impl Telemetry for DaemonTelemetry {
    fn encode(&self, out: &mut Out<'_>) -> fmt::Result {
        let Some(daemon) = self.0.upgrade() else {
            return Ok(());
        };
        out.gauge(
            "ready",
            "1 once every subsystem's readiness latch is released (stores open, stream replayed, \
             warm-up done, ring created); 0 before, while draining or replacing the ring",
            i64::from(daemon.is_ready()),
        )?;
        out.gauge(
            "draining",
            "1 while draining (no new requests taken)",
            i64::from(daemon.phase() == Phase::Draining),
        )?;
        out.gauge(
            "uptime_seconds",
            "seconds since the sidecar started",
            daemon.started.elapsed().as_secs_f64(),
        )?;
        let knobs = daemon.knobs.fanouts();
        out.gauges(
            "fanout",
            "fanout per hop of requests that leave it to the sidecar (runtime knob)",
            "hop",
            &[("1", i64::from(knobs[0])), ("2", i64::from(knobs[1]))],
        )?;
        out.gauge(
            "deadline_seconds",
            "longest a batch waits for feature rows from L2/L3 (runtime knob)",
            daemon.knobs.deadline().as_secs_f64(),
        )
    }
}
