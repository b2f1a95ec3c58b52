//! A reader of the OpenMetrics text the daemons serve on `/metrics`, for
//! the tests: the families a scrape declares and its samples. Only the text
//! `prometheus_client`'s encoder writes is read. The daemons themselves
//! never parse their own exposition: `sidecarctl stats` reads the
//! subsystems' snapshots (percentiles: `daemon_kit::metrics`).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_samples_read_back() {
        let text = "# HELP demo_calls calls.\n# TYPE demo_calls counter\ndemo_calls_total 3\n\
            # TYPE demo_seconds histogram\n\
            demo_seconds_bucket{stage=\"a\",le=\"+Inf\"} 4\n# EOF\n";
        let fams = families(text);
        assert_eq!(fams[0].sample_name(), "demo_calls_total");
        assert_eq!(fams[1].sample_name(), "demo_seconds");
        let samples = samples(text);
        assert_eq!(samples[0].value, 3.0);
        assert_eq!(samples[1].label("le"), Some("+Inf"));
        assert_eq!(samples[1].value, 4.0);
    }

    #[test]
    fn label_values_with_escapes_parse() {
        let s = samples("x_total{a=\"q\\\"uote\",b=\"c,d\"} 4\n");
        assert_eq!(s[0].label("a"), Some("q\"uote"));
        assert_eq!(s[0].label("b"), Some("c,d"));
        assert_eq!(s[0].value, 4.0);
    }
}
