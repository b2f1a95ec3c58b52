//! A reader of the OpenMetrics text the daemons serve on `/metrics`, for
//! the tests: the families a scrape declares, its samples, and a
//! histogram's series with Prometheus' `histogram_quantile` estimate. Only
//! the text `prometheus_client`'s encoder writes is read. The daemons
//! themselves never parse their own exposition: `sidecarctl stats` reads
//! the subsystems' snapshots.

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

    #[test]
    fn families_samples_and_histograms_read_back() {
        let text = "# HELP demo_calls calls.\n# TYPE demo_calls counter\ndemo_calls_total 3\n\
            # TYPE demo_seconds histogram\n\
            demo_seconds_bucket{stage=\"a\",le=\"1.0\"} 1\n\
            demo_seconds_bucket{stage=\"a\",le=\"2.0\"} 3\n\
            demo_seconds_bucket{stage=\"a\",le=\"+Inf\"} 4\n\
            demo_seconds_sum{stage=\"a\"} 9.0\ndemo_seconds_count{stage=\"a\"} 4\n# EOF\n";
        let fams = families(text);
        assert_eq!(fams[0].sample_name(), "demo_calls_total");
        assert_eq!(fams[1].sample_name(), "demo_seconds");
        assert_eq!(samples(text)[0].value, 3.0);
        let h = &histograms(text, "demo_seconds")[0];
        assert_eq!(h.label("stage"), Some("a"));
        assert_eq!(h.count, 4);
        assert_eq!(h.quantile(0.5), Some(1.5));
        assert_eq!(h.quantile(0.99), Some(2.0));
        assert_eq!(h.mean(), Some(2.25));
    }

    #[test]
    fn label_values_with_escapes_parse() {
        let s = samples("x_total{a=\"q\\\"uote\",b=\"c,d\"} 4\n");
        assert_eq!(s[0].label("a"), Some("q\"uote"));
        assert_eq!(s[0].label("b"), Some("c,d"));
        assert_eq!(s[0].value, 4.0);
    }
}
