//! The sidecar's Prometheus endpoint: `GET /metrics` on `--metrics-addr`.
//!
//! Also `GET /healthz` (the process answers) and `GET /readyz` (200 once
//! ready, 503 before), for the pod's probes.
//!
//! Every metric is listed here, in [`render`]; names start with `sidecar_`.
//! Labels are few and fixed (`tier`, `cause`, `stage`), never node ids.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `sidecar_ready` | gauge | 1 once the graph is mapped, the stores are open and the warm-up is done |
//! | `sidecar_batches_total`, `sidecar_requests_total`, `sidecar_targets_total` | counter | work served |
//! | `sidecar_invalid_requests_total`, `sidecar_too_large_total` | counter | requests refused |
//! | `sidecar_rows_fetched_total` | counter | unique feature rows asked of the tiers |
//! | `sidecar_feature_rows_total{tier="l1"\|"l2"\|"l3"}` | counter | rows served per tier (hit ratio = a tier's share) |
//! | `sidecar_feature_fallbacks_total{cause="missing"\|"deadline"\|"unavailable"}` | counter | default rows served, per cause |
//! | `sidecar_feature_malformed_total` | counter | values of the wrong length (also counted as missing) |
//! | `sidecar_feature_coalesced_total` | counter | rows that joined another request's fetch |
//! | `sidecar_redis_round_trips_total` | counter | MGET round trips (one per batch of misses) |
//! | `sidecar_l1_stale_refused_total` | counter | fetched rows not cached because an invalidation ran during their fetch |
//! | `sidecar_l2_writes_total` | counter | rows from Redis written back to the L2 cache |
//! | `sidecar_l2_rebuilds_total` | counter | corrupt L2 caches wiped and rebuilt at start |
//! | `sidecar_l2_read_errors_total` | counter | L2 reads that failed and were served as misses |
//! | `sidecar_l1_bytes`, `sidecar_l1_rows`, `sidecar_l1_pinned_rows` | gauge | L1 occupancy |
//! | `sidecar_rows_in_flight` | gauge | rows being fetched from L2/L3 now |
//! | `sidecar_graph_nodes`, `sidecar_graph_edges`, `sidecar_graph_generation` | gauge | the served graph |
//! | `sidecar_stage_seconds{stage="sample"\|"fetch"\|"batch"}` | histogram | time per batch in each stage |
//! | `sidecar_request_rows` | histogram | node-table rows per request (the neighbourhood fetched) |

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::serve::Daemon;

/// A histogram with fixed bucket bounds, updated with relaxed atomics.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, then the overflow (+Inf) bucket.
    buckets: Box<[AtomicU64]>,
    /// Sum of the observations, in millionths of their unit.
    sum_micros: AtomicU64,
}

/// Bounds for stage latencies, seconds: 10 us to 1 s.
pub const SECONDS_BOUNDS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Bounds for rows per request.
pub const ROWS_BOUNDS: &[f64] = &[
    1.0, 10.0, 25.0, 50.0, 100.0, 221.0, 421.0, 1_000.0, 5_000.0, 20_000.0, 65_536.0,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
    }

    pub fn observe_duration(&self, elapsed: Duration) {
        self.observe(elapsed.as_secs_f64());
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines of `name{labels}`.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(bound) => bound.to_string(),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn single(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// One value of the daemon's state, as `sidecarctl status` shows it
/// (`key`) and as Prometheus scrapes it (`metric`, with an optional label).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub key: &'static str,
    pub metric: &'static str,
    pub label: Option<(&'static str, &'static str)>,
    pub kind: &'static str,
    pub help: &'static str,
    pub value: u64,
}

/// Every counter and gauge of the daemon besides readiness and the graph
/// (which the status report carries in fields of their own). Samples of
/// one metric are adjacent.
pub fn samples(daemon: &Daemon) -> Vec<Sample> {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let s = &daemon.stats;
    let t = daemon.tiers.stats();
    let (l1_rows, pinned_rows) = daemon.tiers.l1_rows();
    let counter = |key, metric, help, value| Sample {
        key,
        metric,
        label: None,
        kind: "counter",
        help,
        value,
    };
    let gauge = |key, metric, help, value| Sample {
        kind: "gauge",
        ..counter(key, metric, help, value)
    };
    let labelled = |key, metric, label, help, value| Sample {
        label: Some(label),
        ..counter(key, metric, help, value)
    };
    const ROWS: &str = "sidecar_feature_rows_total";
    const ROWS_HELP: &str = "feature rows served, per tier";
    const FALLBACKS: &str = "sidecar_feature_fallbacks_total";
    const FALLBACKS_HELP: &str = "default rows served, per cause";
    vec![
        counter(
            "batches",
            "sidecar_batches_total",
            "batches served",
            load(&s.batches),
        ),
        counter(
            "requests",
            "sidecar_requests_total",
            "requests served",
            load(&s.requests),
        ),
        counter(
            "targets",
            "sidecar_targets_total",
            "target nodes served",
            load(&s.targets),
        ),
        counter(
            "invalid_requests",
            "sidecar_invalid_requests_total",
            "requests refused as malformed",
            load(&s.invalid_requests),
        ),
        counter(
            "too_large",
            "sidecar_too_large_total",
            "requests refused for exceeding the slot",
            load(&s.too_large),
        ),
        counter(
            "rows_fetched",
            "sidecar_rows_fetched_total",
            "unique feature rows asked of the tiers",
            load(&s.rows_fetched),
        ),
        labelled("l1_hits", ROWS, ("tier", "l1"), ROWS_HELP, load(&t.l1_hits)),
        labelled("l2_hits", ROWS, ("tier", "l2"), ROWS_HELP, load(&t.l2_hits)),
        labelled("l3_hits", ROWS, ("tier", "l3"), ROWS_HELP, load(&t.l3_hits)),
        labelled(
            "fallback_missing",
            FALLBACKS,
            ("cause", "missing"),
            FALLBACKS_HELP,
            load(&t.fallback_missing),
        ),
        labelled(
            "fallback_deadline",
            FALLBACKS,
            ("cause", "deadline"),
            FALLBACKS_HELP,
            load(&t.fallback_deadline),
        ),
        labelled(
            "fallback_unavailable",
            FALLBACKS,
            ("cause", "unavailable"),
            FALLBACKS_HELP,
            load(&t.fallback_unavailable),
        ),
        counter(
            "malformed",
            "sidecar_feature_malformed_total",
            "feature values of the wrong length",
            load(&t.malformed),
        ),
        counter(
            "coalesced",
            "sidecar_feature_coalesced_total",
            "rows that joined another request's fetch",
            load(&t.coalesced),
        ),
        counter(
            "l3_round_trips",
            "sidecar_redis_round_trips_total",
            "Redis MGET round trips",
            load(&t.l3_round_trips),
        ),
        counter(
            "l1_stale_refused",
            "sidecar_l1_stale_refused_total",
            "fetched rows not cached because an invalidation ran during their fetch",
            daemon.tiers.stale_refused(),
        ),
        counter(
            "l2_writes",
            "sidecar_l2_writes_total",
            "rows from Redis written back to the L2 cache",
            load(&t.l2_writes),
        ),
        counter(
            "l2_rebuilds",
            "sidecar_l2_rebuilds_total",
            "corrupt L2 caches wiped and rebuilt at start",
            daemon.l2_rebuilds,
        ),
        counter(
            "l2_read_errors",
            "sidecar_l2_read_errors_total",
            "L2 reads that failed and were served as misses",
            daemon.store.as_ref().map_or(0, |s| load(&s.read_errors)),
        ),
        gauge(
            "l1_bytes",
            "sidecar_l1_bytes",
            "bytes held by the L1 cache",
            daemon.tiers.l1_bytes(),
        ),
        gauge(
            "l1_rows",
            "sidecar_l1_rows",
            "rows held by the L1 cache",
            l1_rows as u64,
        ),
        gauge(
            "l1_pinned_rows",
            "sidecar_l1_pinned_rows",
            "rows of the pinned hot set",
            pinned_rows as u64,
        ),
        gauge(
            "rows_in_flight",
            "sidecar_rows_in_flight",
            "rows being fetched from L2 or L3",
            daemon.tiers.rows_in_flight() as u64,
        ),
    ]
}

/// The Prometheus text exposition of the daemon's state.
pub fn render(daemon: &Daemon) -> String {
    let mut out = String::with_capacity(8 << 10);
    single(
        &mut out,
        "sidecar_ready",
        "gauge",
        "1 once the graph is mapped, the stores are open and the warm-up is done",
        u64::from(daemon.tiers.is_ready()),
    );
    let mut previous = "";
    for sample in samples(daemon) {
        if sample.metric != previous {
            header(&mut out, sample.metric, sample.kind, sample.help);
            previous = sample.metric;
        }
        let _ = match sample.label {
            Some((name, value)) => writeln!(
                out,
                "{}{{{name}=\"{value}\"}} {}",
                sample.metric, sample.value
            ),
            None => writeln!(out, "{} {}", sample.metric, sample.value),
        };
    }
    let graph = daemon.graph.snapshot();
    for (name, help, value) in [
        (
            "sidecar_graph_nodes",
            "nodes of the served graph",
            graph.n_nodes(),
        ),
        (
            "sidecar_graph_edges",
            "edges of the served graph",
            graph.n_edges(),
        ),
        (
            "sidecar_graph_generation",
            "updates applied to the graph since start",
            graph.generation(),
        ),
    ] {
        single(&mut out, name, "gauge", help, value);
    }
    let s = &daemon.stats;
    header(
        &mut out,
        "sidecar_stage_seconds",
        "histogram",
        "time per batch in each stage",
    );
    for (stage, histogram) in [
        ("sample", &s.sample_seconds),
        ("fetch", &s.fetch_seconds),
        ("batch", &s.batch_seconds),
    ] {
        histogram.render(
            &mut out,
            "sidecar_stage_seconds",
            &format!("stage=\"{stage}\""),
        );
    }
    header(
        &mut out,
        "sidecar_request_rows",
        "histogram",
        "node-table rows per request (the sampled neighbourhood fetched)",
    );
    s.request_rows.render(&mut out, "sidecar_request_rows", "");
    out
}

/// Serves `GET /metrics` on `addr` from the runtime of `handle`. The
/// address is bound before this returns, so a taken port is a start-up
/// error, not a log line.
pub fn serve(
    addr: SocketAddr,
    daemon: Arc<Daemon>,
    handle: &tokio::runtime::Handle,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!("binding the metrics address {addr}: choose another --metrics-addr")
    })?;
    listener.set_nonblocking(true)?;
    let _guard = handle.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let ready = daemon.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let daemon = daemon.clone();
                async move { render(&daemon) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if ready.tiers.is_ready() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "warming up\n")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_sum_the_observations() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 3.0, 50.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "stage=\"a\"");
        assert_eq!(
            out,
            "x_bucket{stage=\"a\",le=\"1\"} 2\nx_bucket{stage=\"a\",le=\"10\"} 3\n\
             x_bucket{stage=\"a\",le=\"+Inf\"} 4\nx_sum{stage=\"a\"} 54.5\nx_count{stage=\"a\"} 4\n"
        );
        assert_eq!(h.count(), 4);
    }
}
