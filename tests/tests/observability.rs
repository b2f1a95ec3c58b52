//! Dashboards and alerts as code (k8s/observability): every expression of
//! the Grafana dashboard and of the PrometheusRule queries only names in
//! docs/metrics.md and parses; `promtool check rules` and `promtool test
//! rules` (a unit test of every alert) pass; every alert has a runbook in
//! docs/operations.md; the directory renders with `kubectl kustomize`; and
//! a real `prometheus` server scrapes both daemons and answers the
//! not-ready alert's query, before and during a drain.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tests::eventually;
use tests::stack::{free_port, http_request, repo_root, Stack, StackOptions};

fn observability() -> PathBuf {
    repo_root().join("k8s/observability")
}

/// The documented names: every `| \`name\` | type |` row of
/// docs/metrics.md, and a histogram's `_bucket`, `_sum` and `_count`.
fn documented() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut cells = line.split('|').map(str::trim).skip(1);
        let (Some(name), Some(kind)) = (cells.next(), cells.next()) else {
            continue;
        };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            continue;
        };
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
        names.insert(name.to_string());
    }
    assert!(names.len() > 80, "docs/metrics.md's table was not read");
    names
}

/// The metric names an expression uses (the daemons' prefixes).
fn metric_names(expr: &str) -> Vec<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for prefix in ["sidecar_", "gnn_worker_"] {
        for (at, _) in expr.match_indices(prefix) {
            if expr[..at].ends_with(is_name) {
                continue;
            }
            let name: String = expr[at..].chars().take_while(|&c| is_name(c)).collect();
            found.push(name);
        }
    }
    found
}

/// The PrometheusRule's `spec`: a plain rule file.
fn rule_file() -> String {
    let text = std::fs::read_to_string(observability().join("prometheus-rule.yaml")).unwrap();
    let spec = text
        .split_once("\nspec:\n")
        .expect("prometheus-rule.yaml has a spec")
        .1;
    spec.lines()
        .map(|line| line.strip_prefix("  ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// (alert name, expression) of every rule.
fn alerts(rules: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut name = None;
    for line in rules.lines().map(str::trim) {
        if let Some(alert) = line.strip_prefix("- alert: ") {
            name = Some(alert.to_string());
        } else if let (Some(expr), Some(alert)) = (line.strip_prefix("expr: "), name.take()) {
            out.push((alert, expr.to_string()));
        }
    }
    out
}

/// Every target expression of the dashboard, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(observability().join("dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap().to_string();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title:?} queries nothing");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            out.push((title.clone(), expr.to_string()));
        }
    }
    out
}

fn promtool(dir: &Path, args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool is not installed: run scripts/setup.sh (Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_query_of_the_dashboard_and_the_rules_uses_documented_names_and_parses() {
    let documented = documented();
    let rules = rule_file();
    let alerts = alerts(&rules);
    let queries = dashboard_queries();
    let mut used = BTreeSet::new();
    for (whose, expr) in queries.iter().chain(&alerts) {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{whose}: {expr} names no metric");
        for name in names {
            assert!(
                documented.contains(&name),
                "{whose}: {name} is not in docs/metrics.md ({expr})"
            );
            used.insert(name);
        }
    }
    // The panels the dashboard promises (docs/operations.md).
    for name in [
        "gnn_worker_call_seconds_bucket",
        "sidecar_stage_seconds_bucket",
        "gnn_worker_onnx_run_seconds_bucket",
        "sidecar_feature_rows_total",
        "sidecar_feature_fallbacks_total",
        "sidecar_deadline_misses_total",
        "sidecar_ring_slots",
        "sidecar_update_lag_seconds",
        "gnn_worker_answers_total",
        "gnn_worker_call_errors_total",
        "gnn_worker_model_info",
        "gnn_worker_model_rollouts_total",
    ] {
        assert!(used.contains(name), "no panel shows {name}");
    }
    // Every dashboard expression parses: promtool checks them as
    // recording rules (Grafana's $__rate_interval as 5m).
    let dir = tempfile::tempdir().unwrap();
    let mut recording = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in queries.iter().enumerate() {
        let expr = expr.replace("$__rate_interval", "5m").replace('\'', "''");
        recording.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: '{expr}'\n"
        ));
    }
    std::fs::write(dir.path().join("dashboard-rules.yaml"), recording).unwrap();
    promtool(dir.path(), &["check", "rules", "dashboard-rules.yaml"]);
}

#[test]
fn promtool_checks_the_rules_and_every_alert_has_a_unit_test_and_a_runbook() {
    let rules = rule_file();
    let alerts = alerts(&rules);
    assert_eq!(alerts.len(), 7, "{alerts:?}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), &rules).unwrap();
    let tests_file = observability().join("alerts-test.yaml");
    std::fs::copy(&tests_file, dir.path().join("alerts-test.yaml")).unwrap();
    promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    promtool(dir.path(), &["test", "rules", "alerts-test.yaml"]);

    let unit_tests = std::fs::read_to_string(&tests_file).unwrap();
    let operations = std::fs::read_to_string(repo_root().join("docs/operations.md")).unwrap();
    for (alert, _) in &alerts {
        assert!(
            unit_tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - "
            )),
            "no unit test where {alert} fires"
        );
        assert!(
            unit_tests.contains(&format!("alertname: {alert}\n        exp_alerts: []")),
            "no unit test where {alert} stays silent"
        );
        assert!(
            operations.contains(&format!("\n### {alert}\n")),
            "docs/operations.md has no runbook section for {alert}"
        );
        let anchor = format!("docs/operations.md#{}", alert.to_lowercase());
        assert!(
            rules.contains(&anchor),
            "{alert}'s runbook_url is not {anchor}"
        );
    }
}

#[test]
fn the_observability_directory_renders_with_kubectl_kustomize() {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(observability())
        .output()
        .expect("kubectl is not installed: run scripts/setup.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    for wanted in [
        "kind: PrometheusRule",
        "kind: ConfigMap",
        "name: gnn-serving-dashboard",
        "grafana_dashboard: \"1\"",
        "alert: GnnServingNotReady",
        "\"uid\": \"gnn-serving\"",
    ] {
        assert!(
            rendered.contains(wanted),
            "{wanted} not rendered:\n{rendered}"
        );
    }
}

/// A child killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The result vector of an instant query.
fn query(prometheus: &str, promql: &str) -> Vec<serde_json::Value> {
    let path = format!("/api/v1/query?query={}", percent_encoded(promql));
    let (code, body) = http_request(prometheus, "GET", &path, None).unwrap();
    assert_eq!(code, 200, "{promql}: {body}");
    let json = &body[body.find('{').unwrap()..=body.rfind('}').unwrap()];
    let answer: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(answer["status"], "success", "{promql}: {body}");
    answer["data"]["result"].as_array().unwrap().clone()
}

fn label<'a>(series: &'a serde_json::Value, name: &str) -> &'a str {
    series["metric"][name].as_str().unwrap_or("")
}

#[test]
fn a_prometheus_server_scrapes_both_daemons_and_answers_the_not_ready_alerts_query() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut options = StackOptions::new("cora");
    options.sidecar_args = vec!["--metrics-addr".into(), metrics_addr.clone()];
    let stack = Stack::start(&options).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let rules = rule_file();
    std::fs::write(dir.path().join("rules.yaml"), &rules).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - rules.yaml\n\
         scrape_configs:\n\
         \x20 - job_name: sidecar\n    static_configs:\n      - targets: ['{metrics_addr}']\n\
         \x20 - job_name: worker\n    static_configs:\n      - targets: ['{}']\n",
        stack.http
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let prometheus = format!("127.0.0.1:{}", free_port());
    let _server = Proc(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prometheus}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is not installed: run scripts/setup.sh"),
    );

    // Both daemons scraped.
    let mut last = Vec::new();
    let up = eventually(Duration::from_secs(60), || {
        last = http_request(&prometheus, "GET", "/-/ready", None)
            .ok()
            .filter(|(code, _)| *code == 200)
            .map(|_| query(&prometheus, "up == 1"))
            .unwrap_or_default();
        let jobs: BTreeSet<&str> = last.iter().map(|s| label(s, "job")).collect();
        jobs.contains("sidecar") && jobs.contains("worker")
    });
    assert!(up, "both daemons were not scraped: {last:?}");

    // The alert's own expression: nothing while both are ready (a scrape
    // or two after the stack became ready).
    let (_, not_ready) = alerts(&rules)
        .into_iter()
        .find(|(name, _)| name == "GnnServingNotReady")
        .unwrap();
    let quiet = eventually(Duration::from_secs(30), || {
        query(&prometheus, &not_ready).is_empty()
    });
    assert!(quiet, "{not_ready} answers while both daemons are ready");

    // The sidecar drains: the expression finds it (and the worker, whose
    // sidecar no longer takes requests), and the alert is pending.
    stack.sidecarctl(&["drain"]).unwrap();
    let mut found = Vec::new();
    let seen = eventually(Duration::from_secs(30), || {
        found = query(&prometheus, &not_ready);
        found.iter().any(|s| label(s, "job") == "sidecar")
    });
    assert!(
        seen,
        "{not_ready} did not find the draining sidecar: {found:?}"
    );
    let pending = eventually(Duration::from_secs(30), || {
        query(
            &prometheus,
            "ALERTS{alertname=\"GnnServingNotReady\",alertstate=\"pending\",job=\"sidecar\"}",
        )
        .len()
            == 1
    });
    assert!(pending, "the alert did not go pending");
}
