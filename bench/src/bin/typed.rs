//! `typed`: typed (heterogeneous) graphs served end to end, each beside a
//! homogeneous graph of the same node and edge counts (docs/model.md,
//! "Serving a heterogeneous model"; issue 31).
//!
//! Two pairs: the shipped OpenFlights (4 node types, 9 edge types) and a
//! generated users/items graph (`sidecar generate --items`, 3 edge types),
//! each beside a one-type graph that `sidecar generate` draws with the
//! same node count and about the same edge count. Each graph gets a 2-layer
//! PyG SAGE model trained by the tooling at fanouts [10, 5] (`pyg_model.py
//! train`, `to_hetero`; `pyg_model.py train`), one sidecar and one worker
//! per graph, measured one at a time and in alternating rounds: lone gRPC
//! calls of one target (latency), a closed loop of one-target calls
//! (throughput at saturation), and over the closed loop the CPU time of
//! both processes per prediction beside the ONNX Runtime run per prediction
//! (the floor: the model alone). Run through `scripts/bench-typed.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use bench::load::{self, Caller, Summary};
use bench::systems::ProductGrpc;
use clap::Parser;
use gnn_worker::api::grpc::PredictorClient;
use serde::Serialize;
use sidecar::graph::CsrIndex;
use tests::stack::{dataset, http_request, python, repo_root, workspace_bin};
use tests::typed::{import, TypedSidecar, Worker};

#[derive(Debug, Parser)]
#[command(about = "Typed graphs served beside one-type graphs of the same counts")]
struct Args {
    /// Lone calls per graph and round.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Seconds of closed-loop load per graph and round.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent callers of the closed loop.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Rounds, the graphs of a pair alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Training epochs of each model.
    #[arg(long, default_value_t = 10)]
    epochs: u32,
    /// Users of the generated typed graph.
    #[arg(long, default_value_t = 100_000)]
    users: u64,
    /// Items of the generated typed graph.
    #[arg(long, default_value_t = 20_000)]
    items: u64,
    /// User-item interactions drawn (each way an edge type).
    #[arg(long, default_value_t = 1_000_000)]
    interactions: u64,
    /// User-user follows drawn.
    #[arg(long, default_value_t = 200_000)]
    follows: u64,
    /// Where the graphs, imports and models are kept between runs.
    #[arg(long, default_value = "/tmp/gnn-bench-typed")]
    work: PathBuf,
    #[arg(long, default_value = "bench/results/typed")]
    out: PathBuf,
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {what}"))?;
    ensure!(status.success(), "{what} failed");
    Ok(())
}

/// One graph to serve: its dataset, its import, its model, its targets.
#[derive(Debug, Clone)]
struct Graph {
    name: String,
    typed: bool,
    dataset: PathBuf,
    data: PathBuf,
    model: PathBuf,
    /// Targets of the calls (ids of the target type).
    n_targets: u64,
}

/// `meta.json` of a dataset.
fn meta(dataset: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(dataset.join("meta.json"))?;
    Ok(serde_json::from_str(&text)?)
}

/// A typed dataset's nodes and edges over every type, and its labelled
/// type's node count.
fn typed_counts(dataset: &Path) -> anyhow::Result<(u64, u64, u64)> {
    let meta = meta(dataset)?;
    let count = |list: &str, field: &str| -> u64 {
        meta[list].as_array().map_or(0, |l| {
            l.iter().map(|t| t[field].as_u64().unwrap_or(0)).sum()
        })
    };
    let labelled = meta["labels"]["node_type"].as_str().unwrap_or_default();
    let targets = meta["node_types"]
        .as_array()
        .and_then(|l| l.iter().find(|t| t["name"] == labelled))
        .and_then(|t| t["num_nodes"].as_u64())
        .context("the labelled node type's count")?;
    Ok((
        count("node_types", "num_nodes"),
        count("edge_types", "num_edges"),
        targets,
    ))
}

impl Graph {
    /// A typed graph with a `to_hetero` SAGE model at [10, 5].
    fn typed(args: &Args, name: &str, dataset: PathBuf) -> anyhow::Result<Self> {
        let data = args.work.join(format!("{name}-data"));
        if !data.join("typed-graph").is_dir() {
            import(&dataset, &data, &[]);
        }
        let model = args.work.join(format!("{name}-model"));
        if !model.join("manifest.json").is_file() {
            eprintln!("training the to_hetero model of {name}");
            run(
                Command::new(python())
                    .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
                    .args(["train", "--dataset"])
                    .arg(&dataset)
                    .args(["--fanouts", "10,5", "--loader-runs", "0"])
                    .args(["--epochs", &args.epochs.to_string(), "--out"])
                    .arg(&model),
                "pyg_model.py train",
            )?;
        }
        let (_, _, n_targets) = typed_counts(&dataset)?;
        Ok(Self {
            name: name.into(),
            typed: true,
            dataset,
            data,
            model,
            n_targets,
        })
    }

    /// A one-type graph of `nodes` nodes and `edges` edges within 2%
    /// (R-MAT, drawn again with more edges until the import's count, after
    /// repeats are dropped, is that close), `dim` features and 4 classes,
    /// with a PyG SAGE model at [10, 5].
    fn homogeneous(
        args: &Args,
        name: &str,
        nodes: u64,
        edges: u64,
        dim: u32,
    ) -> anyhow::Result<Self> {
        let dataset = args.work.join(name);
        let data = args.work.join(format!("{name}-data"));
        let index = data.join(sidecar::graph::dataset::INDEX_FILE);
        let imported = || -> u64 { CsrIndex::open(&index).map_or(0, |i| i.n_edges()) };
        let mut drawn = edges;
        for _ in 0..6 {
            let got = imported();
            if got.abs_diff(edges) * 50 <= edges {
                break;
            }
            if let Some(scaled) = (drawn * edges).checked_div(got) {
                drawn = scaled;
            }
            // A model trained on another draw is trained again.
            for dir in [&dataset, &data, &args.work.join(format!("{name}-model"))] {
                if dir.exists() {
                    std::fs::remove_dir_all(dir)?;
                }
            }
            run(
                Command::new(workspace_bin("sidecar"))
                    .args(["generate", "--out"])
                    .arg(&dataset)
                    .args(["--nodes", &nodes.to_string()])
                    .args(["--edges", &drawn.to_string()])
                    .args([
                        "--feature-dim",
                        &dim.to_string(),
                        "--classes",
                        "4",
                        "--seed",
                        "1",
                    ]),
                "sidecar generate",
            )?;
            import(&dataset, &data, &[]);
        }
        let got = imported();
        ensure!(
            got.abs_diff(edges) * 50 <= edges,
            "{name}: {got} edges after drawing {drawn}; wanted {edges} within 2%"
        );
        let model = args.work.join(format!("{name}-model"));
        if !model.join("manifest.json").is_file() {
            eprintln!("training the SAGE model of {name}");
            run(
                Command::new(python())
                    .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
                    .args(["train", "--dataset"])
                    .arg(&dataset)
                    .args(["--arch", "sage", "--fanouts", "10,5", "--loader-runs", "0"])
                    .args(["--epochs", &args.epochs.to_string(), "--out"])
                    .arg(&model),
                "pyg_model.py train",
            )?;
        }
        Ok(Self {
            name: name.into(),
            typed: false,
            dataset,
            data,
            model,
            n_targets: nodes,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    lone: Summary,
    closed: Summary,
    /// CPU seconds of the sidecar and the worker per prediction over the
    /// closed loop, microseconds.
    cpu_us_per_prediction: f64,
    /// ONNX Runtime run time per prediction over the closed loop (the
    /// model alone), microseconds.
    onnx_us_per_prediction: f64,
}

#[derive(Debug, Serialize)]
struct GraphResult {
    name: String,
    typed: bool,
    node_types: usize,
    edge_types: usize,
    nodes: u64,
    edges: u64,
    /// Medians over rounds.
    lone_p50_us: f64,
    lone_p99_us: f64,
    throughput: f64,
    cpu_us_per_prediction: f64,
    onnx_us_per_prediction: f64,
    rounds: Vec<Measured>,
}

#[derive(Debug, Serialize)]
struct Pair {
    typed: String,
    homogeneous: String,
    /// typed ÷ homogeneous: lone p50 and p99, CPU per prediction; and
    /// homogeneous ÷ typed throughput (above 1: the typed graph costs more).
    lone_p50_ratio: f64,
    lone_p99_ratio: f64,
    saturation_ratio: f64,
    cpu_ratio: f64,
    /// typed ÷ homogeneous CPU per prediction beyond the ONNX run: the
    /// serving path's cost of the types (sampling, fetch, response,
    /// hand-offs), the models' own difference taken out.
    beyond_onnx_ratio: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cores: usize,
    results: Vec<GraphResult>,
    pairs: Vec<Pair>,
}

/// utime + stime of process `pid`, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: state is field 3,
    // utime 14 and stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let hz = 100.0; // sysconf(_SC_CLK_TCK) on Linux
    (ticks(14) + ticks(15)) / hz
}

/// A Prometheus sample's value from the worker's `/metrics`.
fn metric(http: &str, name: &str) -> f64 {
    let body = http_request(http, "GET", "/metrics", None)
        .map(|(_, b)| b)
        .unwrap_or_default();
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// One served graph: its sidecar and worker.
struct Served {
    graph: Graph,
    sidecar: TypedSidecar,
    worker: Worker,
    nodes: u64,
    edges: u64,
    node_types: usize,
    edge_types: usize,
}

impl Served {
    fn start(graph: &Graph) -> anyhow::Result<Self> {
        let sidecar = TypedSidecar::serve(&graph.data, &[]);
        let worker = Worker::start(&sidecar.shm_name, &graph.model, &[]);
        let status = sidecar.sidecarctl_json(&["status"]);
        let (node_types, edge_types) = if graph.typed {
            let meta = meta(&graph.dataset)?;
            let len = |k: &str| meta[k].as_array().map_or(0, Vec::len);
            (len("node_types"), len("edge_types"))
        } else {
            (1, 1)
        };
        Ok(Self {
            graph: graph.clone(),
            nodes: status["n_nodes"].as_u64().unwrap_or(0),
            edges: status["n_edges"].as_u64().unwrap_or(0),
            sidecar,
            worker,
            node_types,
            edge_types,
        })
    }

    fn pids(&self) -> [u32; 2] {
        [self.sidecar.pid(), self.worker.daemon.child.id()]
    }

    async fn measure(&self, args: &Args) -> anyhow::Result<Measured> {
        let client = PredictorClient::connect(format!("http://{}", self.worker.grpc)).await?;
        // Targets spread over the target type's ids, the same sequence for
        // every graph of a size.
        let requests: Arc<Vec<Vec<u64>>> = Arc::new(
            (0..4096u64)
                .map(|i| vec![(i * 7919 + 13) % self.graph.n_targets])
                .collect(),
        );
        let caller = ProductGrpc { client, requests };
        let lone = load::lone(&caller, args.calls, 50, Duration::from_secs(300)).await;
        let cpu = |pids: [u32; 2]| pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>();
        let http = &self.worker.http;
        let before = (
            cpu(self.pids()),
            metric(http, "gnn_worker_onnx_run_seconds_sum"),
            metric(http, "gnn_worker_targets_total"),
        );
        let caller: Arc<dyn Caller> = Arc::new(caller);
        let closed =
            load::closed(caller, args.concurrency, Duration::from_secs(args.seconds)).await;
        let predictions = metric(http, "gnn_worker_targets_total") - before.2;
        ensure!(
            predictions > 0.0,
            "{}: no prediction in the closed loop",
            self.graph.name
        );
        Ok(Measured {
            lone,
            closed,
            cpu_us_per_prediction: 1e6 * (cpu(self.pids()) - before.0) / predictions,
            onnx_us_per_prediction: 1e6
                * (metric(http, "gnn_worker_onnx_run_seconds_sum") - before.1)
                / predictions,
        })
    }
}

/// The median of one figure over the rounds (at least one round runs).
fn median(values: Vec<f64>) -> f64 {
    load::median(&values).unwrap_or(0.0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.work)?;
    let flights = Graph::typed(&args, "openflights", dataset("openflights"))?;
    let (nodes, edges, _) = typed_counts(&flights.dataset)?;
    let flights_twin = Graph::homogeneous(&args, "openflights-twin", nodes, edges, 11)?;
    let users_items = args.work.join("users-items");
    if !users_items.join("meta.json").is_file() {
        run(
            Command::new(workspace_bin("sidecar"))
                .args(["generate", "--out"])
                .arg(&users_items)
                .args(["--nodes", &args.users.to_string()])
                .args(["--items", &args.items.to_string()])
                .args(["--edges", &args.interactions.to_string()])
                .args(["--follows", &args.follows.to_string()])
                .args(["--feature-dim", "16", "--item-feature-dim", "8"])
                .args(["--classes", "4", "--seed", "1"]),
            "sidecar generate --items",
        )?;
    }
    let generated = Graph::typed(&args, "users-items", users_items)?;
    let (nodes, edges, _) = typed_counts(&generated.dataset)?;
    let generated_twin = Graph::homogeneous(&args, "users-items-twin", nodes, edges, 16)?;
    let pairs = [(flights, flights_twin), (generated, generated_twin)];

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut results = Vec::new();
    let mut ratios = Vec::new();
    for (typed, homogeneous) in &pairs {
        // Both served at once (each idle while the other is measured), the
        // pair alternating round by round.
        let served = [Served::start(typed)?, Served::start(homogeneous)?];
        let mut rounds: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
        for round in 0..args.rounds {
            for (i, s) in served.iter().enumerate() {
                eprintln!("round {}: {}", round + 1, s.graph.name);
                rounds[i].push(runtime.block_on(s.measure(&args))?);
            }
        }
        let mut pair = Vec::new();
        for (s, rounds) in served.iter().zip(rounds) {
            pair.push(GraphResult {
                name: s.graph.name.clone(),
                typed: s.graph.typed,
                node_types: s.node_types,
                edge_types: s.edge_types,
                nodes: s.nodes,
                edges: s.edges,
                lone_p50_us: median(rounds.iter().map(|r| r.lone.p50_us).collect()),
                lone_p99_us: median(rounds.iter().map(|r| r.lone.p99_us).collect()),
                throughput: median(rounds.iter().map(|r| r.closed.throughput).collect()),
                cpu_us_per_prediction: median(
                    rounds.iter().map(|r| r.cpu_us_per_prediction).collect(),
                ),
                onnx_us_per_prediction: median(
                    rounds.iter().map(|r| r.onnx_us_per_prediction).collect(),
                ),
                rounds,
            });
        }
        for s in served {
            let Served {
                sidecar, worker, ..
            } = s;
            drop(worker);
            ensure!(sidecar.stop(), "a sidecar did not stop cleanly");
        }
        let (t, h) = (&pair[0], &pair[1]);
        ratios.push(Pair {
            typed: t.name.clone(),
            homogeneous: h.name.clone(),
            lone_p50_ratio: t.lone_p50_us / h.lone_p50_us,
            lone_p99_ratio: t.lone_p99_us / h.lone_p99_us,
            saturation_ratio: h.throughput / t.throughput,
            cpu_ratio: t.cpu_us_per_prediction / h.cpu_us_per_prediction,
            beyond_onnx_ratio: (t.cpu_us_per_prediction - t.onnx_us_per_prediction)
                / (h.cpu_us_per_prediction - h.onnx_us_per_prediction),
        });
        results.extend(pair);
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        results,
        pairs: ratios,
    };
    let md = markdown(&report);
    print!("{md}");
    bench::report::write_files(Path::new(&args.out), &report, &md)
}

fn markdown(report: &Report) -> String {
    let mut md = format!(
        "# Typed graphs beside one-type graphs of the same counts\n\n`{}` ({} cores). Each \
         graph: one sidecar, one worker (a 2-layer PyG SAGE at fanouts [10, 5]: `to_hetero` on \
         a typed graph), measured one at a time, the two graphs of a pair alternating. Lone: \
         gRPC calls of one target, one at a time; saturation: a closed loop of one-target \
         calls; CPU: the sidecar's and the worker's CPU time per prediction over the closed \
         loop, beside the ONNX Runtime run per prediction (the model alone, the floor). \
         Medians over the rounds.\n\n\
         | graph | types (node, edge) | nodes | edges | lone p50 (µs) | lone p99 (µs) | \
         saturation (calls/s) | CPU / prediction (µs) | ONNX run / prediction (µs) | CPU \
         beyond the ONNX run (µs) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        report.command, report.cores
    );
    for r in &report.results {
        md.push_str(&format!(
            "| {} | {}, {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            r.name,
            r.node_types,
            r.edge_types,
            r.nodes,
            r.edges,
            r.lone_p50_us,
            r.lone_p99_us,
            r.throughput,
            r.cpu_us_per_prediction,
            r.onnx_us_per_prediction,
            r.cpu_us_per_prediction - r.onnx_us_per_prediction
        ));
    }
    md.push_str(
        "\n| typed graph | beside | lone p50 | lone p99 | saturation | CPU / prediction | CPU \
         beyond the ONNX run |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for p in &report.pairs {
        md.push_str(&format!(
            "| {} | {} | {:.2}x | {:.2}x | {:.2}x lower | {:.2}x | {:.2}x |\n",
            p.typed,
            p.homogeneous,
            p.lone_p50_ratio,
            p.lone_p99_ratio,
            p.saturation_ratio,
            p.cpu_ratio,
            p.beyond_onnx_ratio
        ));
    }
    md
}
