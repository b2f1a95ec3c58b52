//! Prometheus plumbing both daemons share: the encoder of a registry, a
//! histogram whose buckets can be read back ([`Histogram`]), and the
//! [`Telemetry`] seam through which a subsystem registers what it reports.
//!
//! A subsystem keeps its own counters and exposes a typed snapshot of them;
//! its [`Telemetry`] encodes that snapshot at scrape time into the
//! sub-registry it was given. `/metrics` and the admin reports read the
//! same snapshots: nothing encodes the registry to text to read it back.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// The `Content-Type` of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds for latencies, seconds: 5 us to 2.5 s.
pub const LATENCY_BUCKETS: [f64; 19] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Encodes `registry` as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 << 10);
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "encoding the metrics failed");
    }
    out
}

/// A histogram with fixed bucket bounds, lock-free to observe, whose
/// buckets can be read back ([`Histogram::snapshot`]) for the admin
/// reports' percentiles. Clones share their counts.
#[derive(Debug, Clone)]
pub struct Histogram {
    inner: Arc<HistogramInner>,
}

#[derive(Debug)]
struct HistogramInner {
    /// Finite upper bounds, ascending; the +Inf bucket is implicit.
    bounds: Box<[f64]>,
    /// Observations per bucket (not cumulative), `bounds.len() + 1` of them.
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as `f64` bits.
    sum_bits: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds (non-finite ones are dropped:
    /// the +Inf bucket is always there).
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let mut bounds: Vec<f64> = bounds.into_iter().filter(|b| b.is_finite()).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self {
            inner: Arc::new(HistogramInner {
                bounds: bounds.into(),
                counts,
                sum_bits: AtomicU64::new(0f64.to_bits()),
            }),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, v: f64) {
        let inner = &*self.inner;
        let bucket = inner.bounds.partition_point(|&b| b < v);
        inner.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = inner
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// The buckets (cumulative), count and sum now. Taken while others
    /// observe, the count is the buckets' total and the sum may hold an
    /// observation or two more or less.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let inner = &*self.inner;
        let mut cumulative = 0;
        let buckets = inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(inner.counts.iter())
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (bound, cumulative)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            count: cumulative,
            sum: f64::from_bits(inner.sum_bits.load(Ordering::Relaxed)),
        }
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let snapshot = self.snapshot();
        // The encoder takes each bucket's own count and sums them itself.
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = snapshot
            .buckets
            .iter()
            .map(|&(bound, cumulative)| {
                let own = cumulative - below;
                below = cumulative;
                (bound, own)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(snapshot.sum, snapshot.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A histogram read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound, cumulative count), ascending, ending with +Inf.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

impl HistogramSnapshot {
    /// The `q` quantile (0..=1) estimated from the buckets, or `None` with no
    /// observations: linear interpolation inside the bucket that holds the
    /// rank, as Prometheus' `histogram_quantile` does. A rank in the +Inf
    /// bucket answers the highest finite bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut lower_bound = 0.0;
        let mut lower_count = 0u64;
        for &(bound, count) in &self.buckets {
            if count as f64 >= rank {
                if bound.is_infinite() {
                    return Some(lower_bound);
                }
                let in_bucket = (count - lower_count) as f64;
                if in_bucket == 0.0 {
                    return Some(bound);
                }
                let fraction = (rank - lower_count as f64) / in_bucket;
                return Some(lower_bound + (bound - lower_bound) * fraction);
            }
            lower_bound = bound;
            lower_count = count;
        }
        Some(lower_bound)
    }

    /// The mean observation.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// What a subsystem reports at scrape time: it encodes a snapshot of its
/// own state through [`Out`]. Registered with [`register`] into the
/// sub-registry the daemon gives the subsystem, whose prefix the names
/// written here get.
pub trait Telemetry: fmt::Debug + Send + Sync + 'static {
    fn encode(&self, out: &mut Out<'_>) -> fmt::Result;
}

impl<T: Telemetry> Telemetry for Arc<T> {
    fn encode(&self, out: &mut Out<'_>) -> fmt::Result {
        self.as_ref().encode(out)
    }
}

/// Registers `telemetry` in `registry` (a sub-registry: its prefix is
/// prepended to every name the telemetry writes).
pub fn register(registry: &mut Registry, telemetry: impl Telemetry) {
    registry.register_collector(Box::new(Collected(telemetry)));
}

#[derive(Debug)]
struct Collected<T>(T);

impl<T: Telemetry> Collector for Collected<T> {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        self.0.encode(&mut Out(encoder))
    }
}

/// Writes a snapshot's values as metric families.
pub struct Out<'a>(DescriptorEncoder<'a>);

impl Out<'_> {
    /// A counter (`<name>_total` in the exposition).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let metric = ConstCounter::new(value);
        metric.encode(
            self.0
                .encode_descriptor(name, help, None, metric.metric_type())?,
        )
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl EncodeGaugeValue) -> fmt::Result {
        let metric = ConstGauge::new(value);
        metric.encode(
            self.0
                .encode_descriptor(name, help, None, metric.metric_type())?,
        )
    }

    /// A counter per value of one label.
    pub fn counters(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &[(&str, u64)],
    ) -> fmt::Result {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for &(value_label, value) in values {
            ConstCounter::new(value).encode(family.encode_family(&[(label, value_label)])?)?;
        }
        Ok(())
    }

    /// A gauge per value of one label.
    pub fn gauges(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &[(&str, i64)],
    ) -> fmt::Result {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for &(value_label, value) in values {
            ConstGauge::new(value).encode(family.encode_family(&[(label, value_label)])?)?;
        }
        Ok(())
    }

    /// Any metric the subsystem keeps itself (a histogram).
    pub fn metric(&mut self, name: &str, help: &str, metric: &impl EncodeMetric) -> fmt::Result {
        metric.encode(
            self.0
                .encode_descriptor(name, help, None, metric.metric_type())?,
        )
    }
}

impl fmt::Debug for Out<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Out")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::family::Family;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Stage {
        stage: &'static str,
    }

    fn stages() -> Family<Stage, Histogram, fn() -> Histogram> {
        Family::new_with_constructor(|| Histogram::new([1.0, 2.0, 4.0, 8.0]))
    }

    #[test]
    fn a_snapshot_gives_the_quantiles_histogram_quantile_would() {
        let h = Histogram::new([8.0, 1.0, 4.0, 2.0, f64::INFINITY]);
        for v in [0.5, 1.5, 1.5, 3.0, 3.0, 3.0, 3.0, 6.0, 6.0, 100.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(
            s.buckets,
            [(1.0, 1), (2.0, 3), (4.0, 7), (8.0, 9), (f64::INFINITY, 10)]
        );
        assert_eq!(s.count, 10);
        // p50 = 5th of 10 -> bucket (2, 4] holding the 4th..7th:
        // 2 + 2 * (5 - 3) / 4 = 3.
        assert_eq!(s.quantile(0.5), Some(3.0));
        // p99 lands in +Inf: the highest finite bound.
        assert_eq!(s.quantile(0.99), Some(8.0));
        assert!((s.mean().unwrap() - 12.75).abs() < 1e-9);
        // An observation on a bound belongs to that bound's bucket (le).
        let edge = Histogram::new([1.0, 2.0]);
        edge.observe(1.0);
        assert_eq!(edge.snapshot().buckets[0], (1.0, 1));
        assert_eq!(Histogram::new([1.0]).snapshot().quantile(0.5), None);
    }

    #[test]
    fn the_exposition_holds_cumulative_buckets_and_the_subsystems_prefix() {
        #[derive(Debug)]
        struct Ring {
            slots: u64,
        }
        impl Telemetry for Ring {
            fn encode(&self, out: &mut Out<'_>) -> fmt::Result {
                out.counter("reaped", "workers reaped", 3)?;
                out.gauges(
                    "slots",
                    "slots per state",
                    "state",
                    &[("free", self.slots as i64)],
                )
            }
        }
        let mut registry = Registry::with_prefix("demo");
        let family = stages();
        registry.register("stage_seconds", "time per stage", family.clone());
        register(registry.sub_registry_with_prefix("ring"), Ring { slots: 7 });
        for v in [0.5, 1.5, 3.0] {
            family.get_or_create(&Stage { stage: "sample" }).observe(v);
        }
        let text = encode(&registry);
        for line in [
            "# TYPE demo_stage_seconds histogram",
            "demo_stage_seconds_bucket{le=\"1.0\",stage=\"sample\"} 1",
            "demo_stage_seconds_bucket{le=\"4.0\",stage=\"sample\"} 3",
            "demo_stage_seconds_bucket{le=\"+Inf\",stage=\"sample\"} 3",
            "demo_stage_seconds_count{stage=\"sample\"} 3",
            "demo_stage_seconds_sum{stage=\"sample\"} 5.0",
            "demo_ring_reaped_total 3",
            "demo_ring_slots{state=\"free\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }
}
