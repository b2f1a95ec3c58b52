//! The benchmark's report: everything measured (`report.json`), the
//! tables and the goals met or missed with the reason (`report.md`).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::floors::{Fetches, Floors};
use crate::load::{Step, Summary};
use crate::scenario::{Cache, Scenario, Store};

/// The machine the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub cpu: String,
}

impl Machine {
    pub fn probe() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        Self {
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: memory_kib / (1024.0 * 1024.0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            cpu,
        }
    }
}

/// One system in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct SystemResult {
    pub system: String,
    /// One call at a time.
    pub lone: Summary,
    /// Closed loop at a fixed concurrency: the first estimate of the most
    /// the system answers, which the open-loop sweep starts from.
    pub closed: Summary,
    /// Open-loop steps at fractions of `closed.throughput`.
    pub sweep: Vec<Step>,
    /// Saturation: the highest offered rate of a sweep step the system
    /// kept up with (see [`sustained`]), calls per second.
    pub saturation: f64,
    /// An open-loop step at 70% of `saturation`.
    pub at_70: Option<Step>,
    /// Open-loop steps run to compare with another system (the product's
    /// HTTP front end at 5x the rate the FastAPI service sustains within
    /// its p99 at 70% load).
    pub extra: Vec<Step>,
    /// The product's CPU (worker + sidecar, user + system) per call at
    /// saturation, microseconds; `None` for the other systems.
    pub cpu_us_per_call: Option<f64>,
    /// The same per process: the worker's, the sidecar's.
    pub cpu_us_per_call_each: Option<Vec<f64>>,
}

/// Whether the system kept up with an open-loop step: no errors, and the
/// calls answered per second (from the first due time to the last answer)
/// at least 95% of the offered rate. A system that falls behind builds a
/// backlog and finishes late, which this catches.
pub fn sustained(step: &Step) -> bool {
    step.summary.errors == 0 && step.summary.throughput >= 0.95 * step.offered
}

/// The saturation of a sweep: the highest sustained offered rate; when no
/// step was sustained, the most calls per second any step achieved.
/// The CPU per call the watched processes spent at the sweep step that set
/// `saturation` (the highest sustained one), microseconds.
pub fn cpu_at_saturation(sweep: &[Step], saturation: f64) -> Option<f64> {
    step_at_saturation(sweep, saturation).and_then(|s| s.cpu_us_per_call)
}

/// The step whose CPU stands for the saturation: the sustained step at it,
/// or, when no step kept up, the busiest one.
pub fn step_at_saturation(sweep: &[Step], saturation: f64) -> Option<&Step> {
    sweep
        .iter()
        .find(|s| sustained(s) && s.offered == saturation && s.cpu_us_per_call.is_some())
        .or_else(|| {
            sweep
                .iter()
                .filter(|s| s.cpu_us_per_call.is_some())
                .max_by(|a, b| a.summary.throughput.total_cmp(&b.summary.throughput))
        })
}

pub fn saturation_of(sweep: &[Step]) -> f64 {
    let best = sweep
        .iter()
        .filter(|s| sustained(s))
        .map(|s| s.offered)
        .fold(0.0, f64::max);
    if best > 0.0 {
        best
    } else {
        sweep
            .iter()
            .map(|s| s.summary.throughput)
            .fold(0.0, f64::max)
    }
}

impl SystemResult {
    /// The most calls per second of a sustained open-loop step whose p99 is
    /// at most `p99_us`.
    pub fn throughput_within(&self, p99_us: f64) -> f64 {
        self.sweep
            .iter()
            .chain(&self.at_70)
            .chain(&self.extra)
            .filter(|s| sustained(s) && s.summary.p99_us <= p99_us)
            .map(|s| s.offered)
            .fold(0.0, f64::max)
    }

    fn errors(&self) -> u64 {
        self.lone.errors
            + self.closed.errors
            + self.sweep.iter().map(|s| s.summary.errors).sum::<u64>()
    }

    fn first_error(&self) -> Option<&str> {
        self.lone
            .first_error
            .as_deref()
            .or(self.closed.first_error.as_deref())
            .or_else(|| {
                self.sweep
                    .iter()
                    .find_map(|s| s.summary.first_error.as_deref())
            })
    }
}

/// Where a lone product call's time goes, from the worker's own histograms
/// (docs/metrics.md) read before and after a run of lone HTTP calls: means,
/// microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Breakdown {
    pub calls: f64,
    /// At the client: the whole call.
    pub client_us: f64,
    /// `gnn_worker_call_seconds`: from the front end handing the call to
    /// the batcher to its answer.
    pub worker_call_us: f64,
    /// `gnn_worker_queue_wait_seconds`.
    pub queue_wait_us: f64,
    /// `gnn_worker_ring_wait_seconds`: the ring round trip (the sidecar's
    /// sampling and fetch inside).
    pub ring_wait_us: f64,
    /// `gnn_worker_onnx_run_seconds`.
    pub onnx_run_us: f64,
    /// `sidecar_stage_seconds{stage="batch"}`: the sidecar's own part of
    /// the ring round trip (sampling, fetch, writing the response).
    pub sidecar_batch_us: f64,
    /// The share of the calls' batches that ran to completion on the
    /// thread that took the call (`gnn_worker_batches_run_to_completion`).
    pub run_to_completion: f64,
}

impl Breakdown {
    /// Where a lone HTTP call's mean time goes, stage by stage; `empty_us`:
    /// the mean of an HTTP round trip doing no work.
    pub fn stages(&self, empty_us: f64, floors: &Floors) -> String {
        let in_ring = (self.ring_wait_us - self.sidecar_batch_us).max(0.0);
        let worker_rest =
            (self.worker_call_us - self.queue_wait_us - self.ring_wait_us - self.onnx_run_us)
                .max(0.0);
        let outside = (self.client_us - self.worker_call_us - empty_us).max(0.0);
        format!(
            "Lone HTTP calls take {:.0} us on average at the client ({:.0}% of their batches \
             ran to completion on the thread that took the call): an HTTP round trip doing no \
             work {empty_us:.0} us; the worker's part {:.0} us, of it queue {:.0} us, ring \
             round trip {:.0} us (the sidecar's own sampling, fetch and writing {:.0} us, the \
             two wake-ups across the ring {in_ring:.0} us), ONNX in place {:.0} us (the same \
             run alone: {:.0} us mean), and {worker_rest:.0} us between them (the batcher's \
             hand-offs, the predictions' assembly); the other {outside:.0} us are the front \
             end's request parsing and JSON encoding and the client's",
            self.client_us,
            self.run_to_completion * 100.0,
            self.worker_call_us,
            self.queue_wait_us,
            self.ring_wait_us,
            self.sidecar_batch_us,
            self.onnx_run_us,
            floors.onnx.mean_us,
        )
    }

    /// The means between two scrapes of the worker's `/metrics`.
    pub fn between(before: &str, after: &str, client_us: f64) -> Self {
        let value = |text: &str, name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        // The mean of histogram `name` (with `labels`, e.g. `{stage="batch"}`).
        let mean_of = |name: &str, labels: &str| {
            let sum = value(after, &format!("{name}_sum{labels}"))
                - value(before, &format!("{name}_sum{labels}"));
            let count = value(after, &format!("{name}_count{labels}"))
                - value(before, &format!("{name}_count{labels}"));
            if count > 0.0 {
                sum / count * 1e6
            } else {
                0.0
            }
        };
        let mean = |name: &str| mean_of(name, "");
        Self {
            calls: value(after, "gnn_worker_call_seconds_count")
                - value(before, "gnn_worker_call_seconds_count"),
            client_us,
            worker_call_us: mean("gnn_worker_call_seconds"),
            queue_wait_us: mean("gnn_worker_queue_wait_seconds"),
            ring_wait_us: mean("gnn_worker_ring_wait_seconds"),
            onnx_run_us: mean("gnn_worker_onnx_run_seconds"),
            sidecar_batch_us: mean_of("sidecar_stage_seconds", "{stage=\"batch\"}"),
            run_to_completion: {
                let delta = |name: &str| value(after, name) - value(before, name);
                let batches = delta("gnn_worker_batches_total");
                if batches > 0.0 {
                    delta("gnn_worker_batches_run_to_completion_total") / batches
                } else {
                    0.0
                }
            },
        }
    }
}

/// One scenario: the floors and every system.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub scenario: Scenario,
    pub requests: usize,
    pub floors: Floors,
    /// GET /healthz on the worker, one at a time: the transport alone.
    pub http_round_trip: Summary,
    /// `grpc.health.v1.Health/Check` on the worker, one at a time: the
    /// gRPC transport alone.
    pub grpc_round_trip: Summary,
    /// Lone HTTP calls to the product, with the worker's view of them.
    pub breakdown: Breakdown,
    pub systems: Vec<SystemResult>,
    /// With `--baseline`: the other build's CPU per call (A) and this
    /// build's (B) at one rate, in alternating slices, door by door.
    pub paired: Vec<crate::load::Paired>,
}

impl ScenarioResult {
    pub fn system(&self, name: &str) -> Option<&SystemResult> {
        self.systems.iter().find(|s| s.system == name)
    }
}

/// The feature-fetch comparison of one dataset in Redis.
#[derive(Debug, Clone, Serialize)]
pub struct FetchResult {
    pub dataset: String,
    pub requests: usize,
    pub fetches: Fetches,
}

/// One goal in one scenario, met or not.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub goal: String,
    pub scenario: String,
    pub system: String,
    /// The ratio the goal is about.
    pub measured: f64,
    pub target: String,
    pub met: bool,
    /// The numbers behind the ratio and, for a miss, the reason.
    pub detail: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub commit: String,
    pub command: String,
    pub date: String,
    pub quick: bool,
    pub seconds: f64,
    pub scenarios: Vec<ScenarioResult>,
    pub fetches: Vec<FetchResult>,
    pub goals: Vec<Goal>,
}

const PRODUCT: [&str; 2] = ["product-grpc", "product-http"];

impl Report {
    /// Evaluates every goal of the issue on the measurements.
    pub fn with_goals(mut self) -> Self {
        let cores = self.machine.cores;
        let mut goals = Vec::new();
        for r in &self.scenarios {
            let f = &r.floors;
            let name = &r.scenario.name;
            let http_floor_us = f.onnx.p50_us + f.gather.p50_us + r.http_round_trip.p50_us;
            for product in PRODUCT.iter().filter_map(|p| r.system(p)) {
                // 1. A lone HTTP call against the floors under it (warm:
                // the gather floor is rows already in RAM, which only a
                // warm cache matches); a lone gRPC call against the HTTP
                // one.
                if r.scenario.cache == Cache::Warm && product.system == "product-http" {
                    let ratio = product.lone.p50_us / http_floor_us;
                    let mut detail = format!(
                        "lone p50 {:.0} us; floors: ONNX {:.0} us + gather {:.1} us of {:.0} \
                         rows + an HTTP round trip doing no work {:.0} us = {:.0} us",
                        product.lone.p50_us,
                        f.onnx.p50_us,
                        f.gather.p50_us,
                        f.mean_rows,
                        r.http_round_trip.p50_us,
                        http_floor_us
                    );
                    if ratio > 1.3 {
                        let _ = write!(
                            detail,
                            ". Miss: {:.0} us above the floors. {}",
                            product.lone.p50_us - http_floor_us,
                            r.breakdown.stages(r.http_round_trip.mean_us, f)
                        );
                    }
                    goals.push(Goal {
                        goal: "lone p50 (HTTP) <= 1.3x (ONNX floor + gather floor + empty HTTP \
                               round trip)"
                            .into(),
                        scenario: name.clone(),
                        system: product.system.clone(),
                        measured: ratio,
                        target: "<= 1.3".into(),
                        met: ratio <= 1.3,
                        detail,
                    });
                }
                if let (true, Some(http)) = (
                    r.scenario.cache == Cache::Warm && product.system == "product-grpc",
                    r.system("product-http"),
                ) {
                    let ratio = product.lone.p50_us / http.lone.p50_us.max(1e-9);
                    let mut detail = format!(
                        "lone p50: gRPC {:.0} us, HTTP {:.0} us; round trips doing no work: \
                         gRPC (grpc.health.v1 Check) {:.0} us, HTTP (GET /healthz) {:.0} us",
                        product.lone.p50_us,
                        http.lone.p50_us,
                        r.grpc_round_trip.p50_us,
                        r.http_round_trip.p50_us
                    );
                    if ratio > 1.1 {
                        let _ = write!(
                            detail,
                            ". Miss: {:.0} us more than HTTP, of which {:.0} us are already in \
                             the empty round trips: the gRPC transport's own cost (HTTP/2 \
                             frames; the server runs each call in a task of its own, apart from \
                             its connection's; the client's channel has a connection task of \
                             its own too); the rest is protobuf against JSON and the gRPC \
                             service's own path",
                            product.lone.p50_us - http.lone.p50_us,
                            r.grpc_round_trip.p50_us - r.http_round_trip.p50_us
                        );
                    }
                    goals.push(Goal {
                        goal: "gRPC lone p50 <= 1.1x HTTP's".into(),
                        scenario: name.clone(),
                        system: product.system.clone(),
                        measured: ratio,
                        target: "<= 1.1".into(),
                        met: ratio <= 1.1,
                        detail,
                    });
                }
                // 2. Throughput at saturation against the model alone.
                let saturation = product.saturation;
                let ratio = saturation / f.onnx_throughput;
                let mut detail = format!(
                    "{saturation:.0} calls/s end to end; ONNX alone {:.0} requests/s with {} \
                     sessions",
                    f.onnx_throughput, f.sessions
                );
                if ratio < 0.8 {
                    let _ = write!(
                        detail,
                        ". Miss: the floor runs {} sessions on all {} cores with nothing \
                         else; end to end the same cores also run the sidecar (sampling, \
                         fetching, writing the Arrow tensors), the front end (parsing, \
                         encoding) and the load generator itself",
                        f.sessions, cores
                    );
                }
                goals.push(Goal {
                    goal: "throughput at saturation >= 0.8x the ONNX floor's".into(),
                    scenario: name.clone(),
                    system: product.system.clone(),
                    measured: ratio,
                    target: ">= 0.8".into(),
                    met: ratio >= 0.8,
                    detail,
                });
                // 2b. CPU per prediction at saturation against the model
                // alone (one thread, the inputs materialised): a call of T
                // targets is T predictions on both sides.
                if let Some(cpu) = product.cpu_us_per_call {
                    let ratio = cpu / f.onnx_cpu_us.max(1e-9);
                    let targets = r.scenario.targets;
                    let mut detail = format!(
                        "{cpu:.0} us of CPU a call of {targets} targets ({:.0} us a prediction; \
                         worker + sidecar, user + system, at {saturation:.0} calls/s); ONNX \
                         alone {:.0} us a run ({:.0} us a prediction)",
                        cpu / targets as f64,
                        f.onnx_cpu_us,
                        f.onnx_cpu_us / targets as f64
                    );
                    if let Some([worker, sidecar]) = product.cpu_us_per_call_each.as_deref() {
                        let _ = write!(
                            detail,
                            ": the worker {worker:.0} us (the model run {:.0} us of it at the \
                             floor, the rest the front end, the batcher and the ring wait) and \
                             the sidecar {sidecar:.0} us (sampling, the feature fetch, writing \
                             the response)",
                            f.onnx_cpu_us
                        );
                    }
                    goals.push(Goal {
                        goal: "CPU per prediction at saturation <= 1.5x the ONNX floor's".into(),
                        scenario: name.clone(),
                        system: product.system.clone(),
                        measured: ratio,
                        target: "<= 1.5".into(),
                        met: ratio <= 1.5,
                        detail,
                    });
                }
                // 3. Tail at 70% of saturation.
                if let Some(step) = &product.at_70 {
                    let s = &step.summary;
                    let ratio = s.p99_us / s.p50_us.max(1.0);
                    let mut detail = format!(
                        "at {:.0} calls/s offered ({:.0}% of saturation): p50 {:.0} us, p99 \
                         {:.0} us",
                        step.offered,
                        step.fraction * 100.0,
                        s.p50_us,
                        s.p99_us
                    );
                    if ratio > 3.0 {
                        let _ = write!(
                            detail,
                            ". Miss: at this load calls queue behind one another on {} \
                             cores shared by the load generator, the worker, the sidecar and \
                             Redis; a call arriving behind a batch waits for the whole batch",
                            cores
                        );
                    }
                    goals.push(Goal {
                        goal: "p99 at 70% of saturation <= 3x p50".into(),
                        scenario: name.clone(),
                        system: product.system.clone(),
                        measured: ratio,
                        target: "<= 3".into(),
                        met: ratio <= 3.0,
                        detail,
                    });
                }
            }
            // Against (b) and (c): the product's HTTP front end, the same
            // protocol as theirs.
            let Some(ours) = r.system("product-http") else {
                continue;
            };
            if let Some(naive) = r.system("naive-json") {
                if r.scenario.store == Store::Redis {
                    let ratio = naive.lone.p50_us / ours.lone.p50_us;
                    let mut detail = format!(
                        "lone p50: key-by-key JSON {:.0} us, product {:.0} us",
                        naive.lone.p50_us, ours.lone.p50_us
                    );
                    if ratio < 20.0 {
                        let _ = write!(
                            detail,
                            ". Miss: {:.0} rows per call cost the key-by-key design {:.0} \
                             GETs on loopback Redis (tens of microseconds each here, not the \
                             network round trips of a remote store)",
                            f.mean_rows, f.mean_rows
                        );
                    }
                    goals.push(Goal {
                        goal: "(b) >= 20x lower p50 than the key-by-key JSON design".into(),
                        scenario: name.clone(),
                        system: "product-http".into(),
                        measured: ratio,
                        target: ">= 20".into(),
                        met: ratio >= 20.0,
                        detail,
                    });
                }
            }
            if let Some(fast) = r.system("fastapi") {
                let p50_ratio = fast.lone.p50_us / ours.lone.p50_us;
                let budget = fast
                    .at_70
                    .as_ref()
                    .map_or(fast.closed.p99_us, |s| s.summary.p99_us);
                let theirs = fast.throughput_within(budget);
                let ours_within = ours.throughput_within(budget);
                let ratio = if theirs > 0.0 {
                    ours_within / theirs
                } else {
                    0.0
                };
                let met = p50_ratio > 1.0 && ratio >= 5.0;
                let mut detail = format!(
                    "lone p50: FastAPI {:.0} us, product {:.0} us ({p50_ratio:.1}x); at p99 <= \
                     {budget:.0} us (FastAPI's p99 at 70% of its saturation): FastAPI {theirs:.0} \
                     calls/s, product {ours_within:.0} calls/s",
                    fast.lone.p50_us, ours.lone.p50_us
                );
                if !met {
                    let _ = write!(
                        detail,
                        ". Miss: {}",
                        if p50_ratio <= 1.0 {
                            "the FastAPI service's lone call is not slower".to_string()
                        } else {
                            format!(
                                "the model run dominates both systems here (ONNX alone \
                                 {:.0} requests/s), and both are bounded by it",
                                f.onnx_throughput
                            )
                        }
                    );
                }
                goals.push(Goal {
                    goal: "(c) lower p50 and >= 5x the throughput of FastAPI at equal p99".into(),
                    scenario: name.clone(),
                    system: "product-http".into(),
                    measured: ratio,
                    target: ">= 5 (and p50 lower)".into(),
                    met,
                    detail,
                });
            }
        }
        for fetch in &self.fetches {
            let Some(feast) = &fetch.fetches.feast else {
                continue;
            };
            let ours = &fetch.fetches.ours_cold;
            let ratio = feast.p50_us / ours.p50_us;
            goals.push(Goal {
                goal: "(d) our cold fetch >= 5x faster than Feast at p50".into(),
                scenario: format!("{} fetch", fetch.dataset),
                system: "feature tiers, cold".into(),
                measured: ratio,
                target: ">= 5".into(),
                met: ratio >= 5.0,
                detail: format!(
                    "p50 for {:.0} rows: Feast get_online_features {:.0} us, ours {:.0} us",
                    fetch.fetches.mean_rows, feast.p50_us, ours.p50_us
                ),
            });
        }
        self.goals = goals;
        self
    }
}

/// Writes `report.json` and `report.md` into `out`.
pub fn write(report: &Report, out: &Path) -> anyhow::Result<()> {
    write_files(out, report, &markdown(report))
}

/// Creates `out` and writes `json` as `report.json` and `md` as
/// `report.md` in it: the two files every benchmark binary leaves.
pub fn write_files(out: &Path, json: &impl serde::Serialize, md: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("report.json"), serde_json::to_vec_pretty(json)?)?;
    std::fs::write(out.join("report.md"), md)?;
    Ok(())
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} us")
    } else {
        format!("{v:.1} us")
    }
}

/// Two systems of every scenario side by side, door by door (`doors`:
/// transport, system A, system B): lone p50 and p99, saturation and CPU
/// per call, each with the cost of B against A (B over A for latency and
/// CPU, A over B for saturation: above 1, B costs more). `names` label A
/// and B in the table's header.
fn side_by_side(
    md: &mut String,
    r: &Report,
    heading: &str,
    intro: &str,
    [a_name, b_name]: [&str; 2],
    doors: [(&str, &str, &str); 2],
) {
    let rows: Vec<_> = r
        .scenarios
        .iter()
        .flat_map(|s| {
            doors
                .iter()
                .filter_map(move |(door, a, b)| Some((s, *door, s.system(a)?, s.system(b)?)))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## {heading}\n");
    let _ = writeln!(md, "{intro}\n");
    let _ = writeln!(
        md,
        "| scenario | door | lone p50 {a_name} / {b_name} | cost | lone p99 {a_name} / {b_name} | \
         saturation {a_name} / {b_name} (calls/s) | cost | CPU per call {a_name} / {b_name} | cost |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (s, door, a, b) in rows {
        let cpu = |x: &SystemResult| x.cpu_us_per_call.map_or("-".into(), us);
        let cpu_cost = match (a.cpu_us_per_call, b.cpu_us_per_call) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.3}x", b / a),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {door} | {} / {} | {:.3}x | {} / {} | {:.0} / {:.0} | {:.3}x | {} / {} | {cpu_cost} |",
            s.scenario.name,
            us(a.lone.p50_us),
            us(b.lone.p50_us),
            b.lone.p50_us / a.lone.p50_us.max(1e-9),
            us(a.lone.p99_us),
            us(b.lone.p99_us),
            a.saturation,
            b.saturation,
            a.saturation / b.saturation.max(1e-9),
            cpu(a),
            cpu(b)
        );
    }
}

/// "Beside another build", at one rate: each build's CPU per call in
/// alternating slices and the ratio of each pair, where `--baseline` ran.
fn paired(md: &mut String, r: &Report) {
    let rows: Vec<_> = r
        .scenarios
        .iter()
        .flat_map(|s| s.paired.iter().map(move |p| (s, p)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nCPU per call at one rate (70% of the lower of the two saturations), both builds in \
         alternating open-loop slices (other then this, this then other, ...), the worker's \
         and the sidecar's user + system time over the calls each slice answered (of it, the \
         medians of each: worker + sidecar). The cost is the median of the pairs' ratios \
         (this over other); min and max show the spread between pairs.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | door | rate (calls/s) | pairs x slice | CPU per call other / this \
         (medians) | of it: other / this | cost | min - max | errors other / this |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (s, p) in rows {
        let ratios = p.ratios();
        let fmt = |v: Option<f64>| v.map_or("-".into(), us);
        let cost = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}x"));
        let parts = |b: bool| {
            p.median_each(b)
                .iter()
                .map(|v| us(*v))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let lowest = ratios.iter().copied().reduce(f64::min);
        let highest = ratios.iter().copied().reduce(f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} x {:.0} s | {} / {} | {} / {} | {} | {} - {} | {} / {} |",
            s.scenario.name,
            p.door,
            p.offered,
            ratios.len(),
            p.slice_s,
            fmt(crate::load::median(&p.a_us)),
            fmt(crate::load::median(&p.b_us)),
            parts(false),
            parts(true),
            cost(crate::load::median(&ratios)),
            cost(lowest),
            cost(highest),
            p.errors[0],
            p.errors[1]
        );
    }
}

/// The human report.
pub fn markdown(r: &Report) -> String {
    let mut md = String::new();
    let m = &r.machine;
    let _ = writeln!(md, "# End-to-end benchmark, {}\n", r.date);
    let _ = writeln!(
        md,
        "- machine: {} cores ({}), {:.1} GiB memory, Linux {}",
        m.cores, m.cpu, m.memory_gib, m.kernel
    );
    let _ = writeln!(md, "- commit: `{}`", r.commit);
    let _ = writeln!(md, "- command: `{}`", r.command);
    let _ = writeln!(
        md,
        "- run: {}{:.0} s; latencies in microseconds (us) or milliseconds (ms), from \
         HdrHistogram; open-loop load timed from each call's due time (no coordinated \
         omission); every system of a scenario gets the same request sequence. Saturation: \
         the highest open-loop rate a system kept up with (no errors, answers per second at \
         least 95% of the offered rate), found by a sweep around a closed-loop estimate; \
         \"70%\" is a further open-loop step at 70% of that rate\n",
        if r.quick { "quick, " } else { "" },
        r.seconds
    );
    let _ = writeln!(
        md,
        "Systems: **product-grpc**, **product-http**: sidecar + worker end to end; \
         **product-v2-grpc**, **product-v2-http**: the same through the Open Inference \
         Protocol's doors (gRPC `ModelInfer` with raw input bytes, every output; HTTP \
         `/v2/models/bench/infer` JSON in and out); \
         **naive-json**: the caller samples, GETs every row from Redis key by key and posts \
         the features as JSON to an axum model server running the same ONNX model; \
         **fastapi**: FastAPI/uvicorn (2 workers) sampling with numpy from the same CSR, one \
         redis-py MGET, onnxruntime. The other systems always read Redis; the product reads \
         the store the scenario names.\n"
    );

    let met = r.goals.iter().filter(|g| g.met).count();
    let _ = writeln!(md, "## Goals: {met} of {} met\n", r.goals.len());
    let _ = writeln!(md, "| goal | scenario | system | measured | target | met | numbers (and the reason for a miss) |");
    let _ = writeln!(md, "|---|---|---|---:|---|---|---|");
    for g in &r.goals {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {} | {} | {} |",
            g.goal,
            g.scenario,
            g.system,
            g.measured,
            g.target,
            if g.met { "yes" } else { "**no**" },
            g.detail
        );
    }

    side_by_side(
        &mut md,
        r,
        "The Open Inference Protocol's door",
        "Each V2 door beside the native door of its transport (the same worker, model and \
         request sequence; lone calls interleaved call by call). Cost: of the V2 door.",
        ["native", "V2"],
        [
            ("gRPC", "product-grpc", "product-v2-grpc"),
            ("HTTP", "product-http", "product-v2-http"),
        ],
    );
    side_by_side(
        &mut md,
        r,
        "Beside another build",
        "This build's product beside another build's (`--baseline`: its own binaries and its \
         own imports of the same data, the same model and request sequence; lone calls \
         interleaved call by call; under load, door by door). Cost: of this build against \
         the other.",
        ["other", "this"],
        [
            ("gRPC", "baseline-grpc", "product-grpc"),
            ("HTTP", "baseline-http", "product-http"),
        ],
    );

    paired(&mut md, r);

    let _ = writeln!(md, "\n## Scenarios\n");
    for s in &r.scenarios {
        let sc = &s.scenario;
        let f = &s.floors;
        let _ = writeln!(md, "### {}\n", sc.name);
        let _ = writeln!(
            md,
            "{} targets per request, fanouts {:?}, {:.0} rows per request (mean), features in \
             {}, product cache {}{}; {} requests in the sequence.\n",
            sc.targets,
            sc.fanouts,
            f.mean_rows,
            match sc.store {
                Store::Embedded => "the embedded store (product) and Redis (others)",
                Store::Redis => "Redis",
            },
            match sc.cache {
                Cache::Warm => "warm (every row in L1)",
                Cache::Cold => "cold (no L1, no L2)",
            },
            if sc.super_mix {
                "; every tenth request's first target is the super node"
            } else {
                ""
            },
            s.requests
        );
        let _ = writeln!(
            md,
            "Floors: gather p50 {}, ONNX p50 {} (p99 {}; CPU {} a run, one thread), ONNX alone \
             {:.0} requests/s ({} sessions); round trips to the worker doing no work: HTTP p50 \
             {}, gRPC p50 {}. Lone calls come from a client on one thread. CPU per call is the \
             product's worker and sidecar together (user + system, /proc) over the sweep step \
             that set its saturation.\n",
            us(f.gather.p50_us),
            us(f.onnx.p50_us),
            us(f.onnx.p99_us),
            us(f.onnx_cpu_us),
            f.onnx_throughput,
            f.sessions,
            us(s.http_round_trip.p50_us),
            us(s.grpc_round_trip.p50_us)
        );
        let b = &s.breakdown;
        let _ = writeln!(
            md,
            "A lone HTTP call to the product, means of {:.0} calls: {}.\n",
            b.calls,
            b.stages(s.http_round_trip.mean_us, f)
        );
        let _ = writeln!(md, "| system | lone p50 | lone p99 | saturation (calls/s) | CPU per call at saturation | 70%: offered | 70%: p50 | 70%: p99 | errors |");
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for sys in &s.systems {
            let step = sys.at_70.as_ref();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                sys.system,
                us(sys.lone.p50_us),
                us(sys.lone.p99_us),
                sys.saturation,
                sys.cpu_us_per_call.map_or("-".into(), |c| format!(
                    "{} ({:.2}x the ONNX floor's {})",
                    us(c),
                    c / f.onnx_cpu_us.max(1e-9),
                    us(f.onnx_cpu_us)
                )),
                step.map_or("-".into(), |x| format!("{:.0}", x.offered)),
                step.map_or("-".into(), |x| us(x.summary.p50_us)),
                step.map_or("-".into(), |x| us(x.summary.p99_us)),
                sys.errors()
            );
        }
        for sys in &s.systems {
            if let Some(e) = sys.first_error() {
                let _ = writeln!(md, "\n{}'s first error: `{e}`", sys.system);
            }
        }
        let _ = writeln!(
            md,
            "\nPlots: `cdf-{0}.png` (lone-call latency CDF), `throughput-p99-{0}.png`.\n",
            sc.slug()
        );
    }

    if !r.fetches.is_empty() {
        let _ = writeln!(md, "## Feature fetch (features in Redis)\n");
        let _ = writeln!(
            md,
            "The unique rows of one-target [20, 10] neighbourhoods, one request at a time: \
             the product's feature tiers with no cache (one MGET), a bare MGET, naive GETs \
             key by key, and Feast's `get_online_features` on its own copy of the rows in the \
             same Redis.\n"
        );
        let _ = writeln!(md, "| dataset | requests | rows | ours cold p50 / p99 | bare MGET p50 / p99 | naive GETs p50 / p99 | Feast p50 / p99 | Feast / ours (p50) |");
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for x in &r.fetches {
            let f = &x.fetches;
            let pair = |s: &Summary| format!("{} / {}", us(s.p50_us), us(s.p99_us));
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                x.dataset,
                x.requests,
                f.mean_rows,
                pair(&f.ours_cold),
                pair(&f.bare_mget),
                pair(&f.naive_gets),
                f.feast.as_ref().map_or("-".into(), pair),
                f.feast.as_ref().map_or("-".into(), |s| format!(
                    "{:.1}x",
                    s.p50_us / f.ours_cold.p50_us
                ))
            );
        }
    }
    md
}
