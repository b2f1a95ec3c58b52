//! Reading back what a daemon's `prometheus_client` registry encodes.
//!
//! The registry is the one place a daemon keeps its metrics; `/metrics`
//! serves its OpenMetrics text. `sidecarctl stats` reports percentiles from
//! the same histograms, so this module parses that text (only the text this
//! crate's encoder writes) and estimates quantiles the way Prometheus'
//! `histogram_quantile` does: linear interpolation inside the bucket that
//! holds the rank.

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

/// A metric family: its name (as in `# TYPE`) and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    pub kind: String,
}

/// The families declared in an exposition (`# TYPE name kind` lines).
/// Counters are declared without their `_total` suffix, as OpenMetrics
/// writes them; [`Family::sample_name`] gives the name of their samples.
pub fn families(text: &str) -> Vec<Family> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.strip_prefix("# TYPE ")?.split_whitespace();
            Some(Family {
                name: parts.next()?.to_string(),
                kind: parts.next()?.to_string(),
            })
        })
        .collect()
}

impl Family {
    /// The name a dashboard queries: `<name>_total` for a counter, the
    /// family name otherwise.
    pub fn sample_name(&self) -> String {
        if self.kind == "counter" {
            format!("{}_total", self.name)
        } else {
            self.name.clone()
        }
    }
}

/// One sample line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    value.push(match escaped {
                        'n' => '\n',
                        other => other,
                    });
                }
                '"' => break i,
                other => value.push(other),
            }
        };
        labels.push((key.trim_start_matches(',').to_string(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// Every sample of an exposition.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (head, value) = line.rsplit_once(' ')?;
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().ok()?,
            };
            let (name, labels) = match head.split_once('{') {
                Some((name, labels)) => (name, parse_labels(labels.strip_suffix('}')?)?),
                None => (head, Vec::new()),
            };
            Some(Sample {
                name: name.to_string(),
                labels,
                value,
            })
        })
        .collect()
}

/// One histogram series: its labels (without `le`), cumulative buckets,
/// count and sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub labels: Vec<(String, String)>,
    /// (upper bound, cumulative count), ascending, ending with +Inf.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `q` quantile (0..=1) estimated from the buckets, or `None` with no
    /// observations. A rank in the +Inf bucket answers the highest finite
    /// bound, as `histogram_quantile` does.
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

/// Every series of histogram `name` in an exposition.
pub fn histograms(text: &str, name: &str) -> Vec<Histogram> {
    let bucket_name = format!("{name}_bucket");
    let count_name = format!("{name}_count");
    let sum_name = format!("{name}_sum");
    let mut out: Vec<Histogram> = Vec::new();
    let series = |out: &mut Vec<Histogram>, labels: Vec<(String, String)>| -> usize {
        match out.iter().position(|h| h.labels == labels) {
            Some(i) => i,
            None => {
                out.push(Histogram {
                    labels,
                    buckets: Vec::new(),
                    count: 0,
                    sum: 0.0,
                });
                out.len() - 1
            }
        }
    };
    for sample in samples(text) {
        if sample.name == bucket_name {
            let le = sample.label("le").and_then(|le| match le {
                "+Inf" => Some(f64::INFINITY),
                v => v.parse().ok(),
            });
            let Some(le) = le else { continue };
            let labels: Vec<_> = sample
                .labels
                .into_iter()
                .filter(|(k, _)| k != "le")
                .collect();
            let i = series(&mut out, labels);
            out[i].buckets.push((le, sample.value as u64));
        } else if sample.name == count_name {
            let i = series(&mut out, sample.labels);
            out[i].count = sample.value as u64;
        } else if sample.name == sum_name {
            let i = series(&mut out, sample.labels);
            out[i].sum = sample.value;
        }
    }
    for h in &mut out {
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family as MetricFamily;
    use prometheus_client::metrics::histogram::Histogram as PromHistogram;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Stage {
        stage: &'static str,
    }

    #[test]
    fn histograms_read_back_from_the_registry_text_give_quantiles() {
        let mut registry = Registry::default();
        let stages = MetricFamily::<Stage, PromHistogram>::new_with_constructor(|| {
            PromHistogram::new([1.0, 2.0, 4.0, 8.0])
        });
        registry.register("demo_stage_seconds", "time per stage", stages.clone());
        let calls = Counter::<u64>::default();
        registry.register("demo_calls", "calls", calls.clone());
        calls.inc_by(3);
        for v in [0.5, 1.5, 1.5, 3.0, 3.0, 3.0, 3.0, 6.0, 6.0, 100.0] {
            stages.get_or_create(&Stage { stage: "sample" }).observe(v);
        }
        stages.get_or_create(&Stage { stage: "fetch" }).observe(0.5);
        let text = encode(&registry);

        let fams = families(&text);
        assert!(fams.contains(&Family {
            name: "demo_calls".into(),
            kind: "counter".into()
        }));
        assert_eq!(
            fams.iter()
                .find(|f| f.name == "demo_calls")
                .unwrap()
                .sample_name(),
            "demo_calls_total"
        );
        let hs = histograms(&text, "demo_stage_seconds");
        assert_eq!(hs.len(), 2);
        let sample = hs
            .iter()
            .find(|h| h.label("stage") == Some("sample"))
            .unwrap();
        assert_eq!(sample.count, 10);
        assert_eq!(sample.buckets.last().unwrap().1, 10);
        // Ranks: p50 = 5th of 10 -> bucket (2, 4] holding 4 (3rd..7th):
        // 2 + 2 * (5 - 3) / 4 = 3.
        assert_eq!(sample.quantile(0.5), Some(3.0));
        // p99 lands in +Inf: the highest finite bound.
        assert_eq!(sample.quantile(0.99), Some(8.0));
        assert!((sample.mean().unwrap() - 12.75).abs() < 1e-9);
        let fetch = hs
            .iter()
            .find(|h| h.label("stage") == Some("fetch"))
            .unwrap();
        assert_eq!(fetch.quantile(0.5), Some(0.5));
        let none = Histogram {
            labels: vec![],
            buckets: vec![(1.0, 0), (f64::INFINITY, 0)],
            count: 0,
            sum: 0.0,
        };
        assert_eq!(none.quantile(0.5), None);
    }

    #[test]
    fn label_values_with_escapes_parse() {
        let s = samples("x_total{a=\"q\\\"uote\",b=\"c,d\"} 4\n");
        assert_eq!(s[0].label("a"), Some("q\"uote"));
        assert_eq!(s[0].label("b"), Some("c,d"));
        assert_eq!(s[0].value, 4.0);
    }
}
