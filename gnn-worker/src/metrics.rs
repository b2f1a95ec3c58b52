//! The worker's metrics, in one `prometheus_client` registry, served at
//! `GET /metrics` (OpenMetrics text). Every name is listed in
//! docs/metrics.md (a test compares the two).
//!
//! Latency histograms follow a call through the worker: `call` (end to end,
//! from the client's request to its answer), `queue_wait` (waiting for an
//! executor), `ring_wait` (one ring round trip: sampling and features in the
//! sidecar), `onnx_run` (one model run on the response in place).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bounds for targets per batch.
pub const TARGET_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

/// The `by` label of answered calls: the model that answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnsweredByLabel {
    pub by: &'static str,
}

/// The labels of `gnn_worker_model_info`: the model directory's name
/// (symlinks resolved) and its model.onnx's sha256.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
    pub sha256: String,
}

/// The `outcome` label of model rollouts: `switched` or `refused`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutOutcome {
    pub outcome: &'static str,
}

/// The `kind` label of failed calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorKind {
    pub kind: &'static str,
}

/// The labels of connections a port closed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedConnection {
    pub port: &'static str,
    pub why: &'static str,
}

/// The `why` label of calls dropped before the ring.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedWhy {
    pub why: &'static str,
}

/// Whether the worker can serve, read at scrape time.
pub trait Health: Send + Sync + fmt::Debug {
    fn ready(&self) -> bool;
}

/// Every metric of the worker.
#[derive(Debug)]
pub struct WorkerMetrics {
    registry: Registry,
    pub calls: Counter,
    pub call_errors: Family<ErrorKind, Counter>,
    /// Calls dropped before the ring: their caller had gone, or their
    /// deadline had passed.
    pub dropped: Family<DroppedWhy, Counter>,
    /// Connections a port closed to stay within `max_connections`.
    pub connections: Family<ClosedConnection, Counter>,
    /// Predictions answered, per source (`gnn`, `student`, `precomputed`).
    pub answers: Family<AnsweredByLabel, Counter>,
    /// Nodes of the precomputed set in use (0: none).
    pub precomputed_nodes: Gauge,
    /// 1 for the model served (its name and sha256 as labels).
    pub model_info: Family<ModelLabel, Gauge>,
    /// Model rollouts without a restart, by outcome (docs/operations.md,
    /// "Rolling out a model").
    pub model_rollouts: Family<RolloutOutcome, Counter>,
    pub batches: Counter,
    /// Batches that waited for an executor (every one was busy when their
    /// first call came), and of those, the ones sent because `max_delay`
    /// passed.
    pub batches_waited: Counter,
    pub batches_run_to_completion: Counter,
    pub batches_delayed: Counter,
    pub ring_requests: Counter,
    /// Ring requests answered TOO_LARGE and split in two.
    pub ring_splits: Counter,
    pub targets: Counter,
    pub batch_errors: Counter,
    pub executor_panics: Counter,
    /// Executors running (set by the executors themselves).
    pub executors_alive: Arc<AtomicUsize>,
    pub call_seconds: Histogram,
    pub queue_wait_seconds: Histogram,
    pub ring_wait_seconds: Histogram,
    pub onnx_run_seconds: Histogram,
    pub batch_targets: Histogram,
    pub batch_calls: Histogram,
}

fn latency() -> Histogram {
    Histogram::new(daemon_kit::metrics::LATENCY_BUCKETS)
}

impl WorkerMetrics {
    /// A batch of `calls` calls and `targets` targets was formed.
    pub fn batch_formed(&self, targets: usize, calls: usize) {
        self.batches.inc();
        self.batch_targets.observe(targets as f64);
        self.batch_calls.observe(calls as f64);
    }

    /// The registry, reading readiness from `health` at scrape time.
    pub fn new(health: Weak<dyn Health>) -> Self {
        let mut r = Registry::default();
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let histogram = |r: &mut Registry, name: &str, help: &str, h: Histogram| {
            r.register(name, help, h.clone());
            h
        };
        let calls = counter(&mut r, "gnn_worker_calls", "client calls (gRPC and HTTP)");
        let call_errors = Family::<ErrorKind, Counter>::default();
        // Every kind from the start (at 0), so dashboards see the series.
        for kind in [
            "invalid_argument",
            "unavailable",
            "internal",
            "overloaded",
            "deadline_exceeded",
        ] {
            let _ = call_errors.get_or_create(&ErrorKind { kind });
        }
        let dropped = Family::<DroppedWhy, Counter>::default();
        for why in ["gone", "deadline"] {
            let _ = dropped.get_or_create(&DroppedWhy { why });
        }
        r.register(
            "gnn_worker_calls_dropped",
            "calls dropped when a thread took them, before the ring: their caller had gone \
             (gone) or they had waited past call_timeout_ms or their own later deadline \
             (deadline)",
            dropped.clone(),
        );
        let connections = Family::<ClosedConnection, Counter>::default();
        for (port, why) in [
            ("http", "evicted"),
            ("http", "refused"),
            ("grpc", "evicted"),
            ("grpc", "refused"),
            ("grpc", "timed_out"),
        ] {
            let _ = connections.get_or_create(&ClosedConnection { port, why });
        }
        r.register(
            "gnn_worker_connections_closed",
            "connections a port closed: on the HTTP port, at max_connections, the one waiting \
             longest for a request (evicted) or a new one while every one is busy (refused); on \
             the gRPC port, at max_connections, the one silent longest if silent for \
             http_read_timeout_s (evicted) or else the new one (refused), and one that sent no \
             HTTP/2 preface within http_read_timeout_s (timed_out)",
            connections.clone(),
        );
        r.register(
            "gnn_worker_call_errors",
            "client calls answered with an error, per kind (invalid_argument, unavailable, \
             internal, overloaded, deadline_exceeded)",
            call_errors.clone(),
        );
        let answers = Family::<AnsweredByLabel, Counter>::default();
        for by in [
            "gnn",
            "gnn_reduced",
            "student",
            "precomputed",
            "precomputed_unchecked",
        ] {
            let _ = answers.get_or_create(&AnsweredByLabel { by });
        }
        r.register(
            "gnn_worker_answers",
            "predictions answered, per rung of the ladder (gnn, gnn_reduced, student, \
             precomputed, precomputed_unchecked)",
            answers.clone(),
        );
        let precomputed_nodes = Gauge::default();
        r.register(
            "gnn_worker_precomputed_nodes",
            "nodes of the precomputed set in use (0: none)",
            precomputed_nodes.clone(),
        );
        let model_info = Family::<ModelLabel, Gauge>::default();
        r.register(
            "gnn_worker_model_info",
            "1 for the model served, labelled with its directory's name and model.onnx's sha256",
            model_info.clone(),
        );
        let model_rollouts = Family::<RolloutOutcome, Counter>::default();
        // Both outcomes exported from the start (at 0), so a rate or an
        // alert over them has a series before the first rollout.
        for outcome in ["switched", "refused"] {
            let _ = model_rollouts.get_or_create(&RolloutOutcome { outcome });
        }
        r.register(
            "gnn_worker_model_rollouts",
            "model rollouts without a restart, by outcome (switched, refused: the old model \
             kept)",
            model_rollouts.clone(),
        );
        let batches = counter(
            &mut r,
            "gnn_worker_batches",
            "batches formed by the batcher",
        );
        let batches_waited = counter(
            &mut r,
            "gnn_worker_batches_waited",
            "batches whose first call found every executor busy: they gathered calls until \
             one freed up, the batch was full or max_delay passed",
        );
        let batches_run_to_completion = counter(
            &mut r,
            "gnn_worker_batches_run_to_completion",
            "batches of one call that found the pipeline with room and a session idle: its \
             ring round trip and model run happened on the thread that took the call",
        );
        let batches_delayed = counter(
            &mut r,
            "gnn_worker_batches_delayed",
            "of the batches that waited, those sent because max_delay passed",
        );
        let ring_requests = counter(&mut r, "gnn_worker_ring_requests", "ring requests sent");
        let ring_splits = counter(
            &mut r,
            "gnn_worker_ring_splits",
            "ring requests whose answer did not fit one response area, sent again in two halves",
        );
        let targets = counter(&mut r, "gnn_worker_targets", "targets predicted");
        let batch_errors = counter(&mut r, "gnn_worker_batch_errors", "batches that failed");
        let executor_panics = counter(
            &mut r,
            "gnn_worker_executor_panics",
            "executors retired after a panic (their batch answered with an error)",
        );
        let call_seconds = histogram(
            &mut r,
            "gnn_worker_call_seconds",
            "one client call, end to end (batching, ring, model)",
            latency(),
        );
        let queue_wait_seconds = histogram(
            &mut r,
            "gnn_worker_queue_wait_seconds",
            "time a call waits before an executor takes its batch",
            latency(),
        );
        let ring_wait_seconds = histogram(
            &mut r,
            "gnn_worker_ring_wait_seconds",
            "one ring round trip (sampling and features in the sidecar)",
            latency(),
        );
        let onnx_run_seconds = histogram(
            &mut r,
            "gnn_worker_onnx_run_seconds",
            "one ONNX Runtime run on a response in place",
            latency(),
        );
        let batch_targets = histogram(
            &mut r,
            "gnn_worker_batch_targets",
            "targets per batch",
            Histogram::new(TARGET_BUCKETS),
        );
        let batch_calls = histogram(
            &mut r,
            "gnn_worker_batch_calls",
            "client calls per batch",
            Histogram::new(TARGET_BUCKETS),
        );
        let executors_alive = Arc::new(AtomicUsize::new(0));
        r.register_collector(Box::new(StateCollector {
            health,
            executors_alive: executors_alive.clone(),
        }));
        Self {
            registry: r,
            calls,
            dropped,
            connections,
            call_errors,
            answers,
            precomputed_nodes,
            model_info,
            model_rollouts,
            batches,
            batches_waited,
            batches_run_to_completion,
            batches_delayed,
            ring_requests,
            ring_splits,
            targets,
            batch_errors,
            executor_panics,
            executors_alive,
            call_seconds,
            queue_wait_seconds,
            ring_wait_seconds,
            onnx_run_seconds,
            batch_targets,
            batch_calls,
        }
    }

    /// Counts a connection a port closed (`port`: http, grpc; `why`:
    /// evicted, refused, timed_out).
    pub fn connections_closed(&self, port: &'static str, why: &'static str) {
        self.connections
            .get_or_create(&ClosedConnection { port, why })
            .inc();
    }

    /// Counts a call dropped before the ring (`why`: gone, deadline).
    pub fn calls_dropped(&self, why: &'static str) {
        self.dropped.get_or_create(&DroppedWhy { why }).inc();
    }

    /// Counts a failed call.
    pub fn call_failed(&self, kind: &'static str) {
        self.call_errors.get_or_create(&ErrorKind { kind }).inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        daemon_kit::metrics::encode(&self.registry)
    }
}

#[derive(Debug)]
struct StateCollector {
    health: Weak<dyn Health>,
    executors_alive: Arc<AtomicUsize>,
}

impl Collector for StateCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let ready = self.health.upgrade().is_some_and(|h| h.ready());
        let gauge = ConstGauge::new(i64::from(ready));
        gauge.encode(e.encode_descriptor(
            "gnn_worker_ready",
            "1 when the worker can serve (attached to a ready sidecar whose schema matches the \
             model, and an executor alive)",
            None,
            gauge.metric_type(),
        )?)?;
        let alive = ConstGauge::new(self.executors_alive.load(Ordering::Relaxed) as i64);
        alive.encode(e.encode_descriptor(
            "gnn_worker_executors_alive",
            "executor threads running",
            None,
            alive.metric_type(),
        )?)?;
        Ok(())
    }
}
