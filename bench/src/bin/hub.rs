//! `hub`: hub layer-1 embeddings against the plain inductive path, side by
//! side on one sidecar (docs/strategies.md, "Hub layer-1 embeddings").
//!
//! Per dataset: a sidecar serving it, a worker with stored hub embeddings
//! (`--precomputed-redis --precomputed-answers false --hub-min-degree D`,
//! D the degree of the top `--hub-top` share of nodes) and a plain one
//! beside it on the same ring, both at fanouts [20, 10]. `gnn-worker
//! precompute` stores every node's layer-1 embedding, computed with
//! covering fanouts where the graph's largest degree allows it (every
//! neighbour: the exact embedding), else at [20, 10]. Then, for each
//! worker in turn: rows fetched per request (the sidecar's
//! `sidecar_neighbor_fetch_count`) and lone-call latency over the same
//! one-node calls, closed-loop throughput, and the labels of both workers
//! on the same nodes (accuracy on a labelled dataset). The synthetic
//! power-law graph (`rmat-1m`: `sidecar generate`, 1M nodes, 50M edges,
//! one super node, D = 128, with a `sage.py init` model) is generated into
//! `--work` once. Run through `scripts/bench-hub.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use bench::beside::predict_all;
use bench::load::{self, Caller, Summary};
use bench::systems::ProductGrpc;
use clap::Parser;
use gnn_worker::api::grpc::{pb, PredictorClient};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sidecar::graph::dataset::INDEX_FILE;
use sidecar::graph::CsrIndex;
use tests::stack::{dataset, metric_value, onnxruntime_lib, python, repo_root, workspace_bin};
use tests::stack::{free_port, Stack, StackOptions};

#[derive(Debug, Parser)]
#[command(about = "Hub layer-1 embeddings against the plain inductive path")]
struct Args {
    /// Datasets of ../shared/data, and `rmat-1m` (or `rmat-100k`) for the
    /// synthetic power-law graph.
    #[arg(long, value_delimiter = ',', default_value = "cora,rmat-1m")]
    datasets: Vec<String>,
    /// Hubs are the nodes of at least the degree of this top share of the
    /// nodes.
    #[arg(long, default_value_t = 0.1)]
    hub_top: f64,
    /// Nodes asked (lone calls cycle through them); a labelled dataset's
    /// test nodes are used whole.
    #[arg(long, default_value_t = 2000)]
    nodes: usize,
    /// Lone calls per worker.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Seconds of closed-loop load per worker.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent callers of the closed loop.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Where the synthetic graph and its model are kept between runs.
    #[arg(long, default_value = "/tmp/gnn-bench-hub")]
    work: PathBuf,
    #[arg(long, default_value = "bench/results/hub")]
    out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Path1 {
    /// Node-table rows per lone request (mean) and the lone calls' latency.
    rows_per_request: f64,
    lone: Summary,
    closed: Summary,
}

#[derive(Debug, Serialize)]
struct DatasetResult {
    dataset: String,
    nodes: u64,
    edges: u64,
    hub_min_degree: u32,
    hub_share_of_nodes: f64,
    precompute_fanouts: [u32; 2],
    precompute_seconds: f64,
    /// Hop-1 slots sent without their neighbours per lone request of the
    /// hub worker.
    cached_slots_per_request: f64,
    plain: Path1,
    hub: Path1,
    /// Labels of both workers on the asked nodes: accuracy (labelled
    /// datasets), agreement, and the largest logit difference.
    accuracy_plain: Option<f64>,
    accuracy_hub: Option<f64>,
    agreement: f64,
    max_abs_logit_diff: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cores: usize,
    results: Vec<DatasetResult>,
}

/// A dataset to serve: its directory, a model, and the nodes asked.
struct Served {
    dir: PathBuf,
    model: Option<PathBuf>,
    asked: Vec<u64>,
    labels: Option<Vec<i32>>,
}

fn served(name: &str, args: &Args) -> anyhow::Result<Served> {
    let synthetic = match name {
        "rmat-1m" => Some((1_000_000u64, 50_000_000u64)),
        "rmat-100k" => Some((100_000, 5_000_000)),
        _ => None,
    };
    let Some((nodes, edges)) = synthetic else {
        let dir = dataset(name);
        let (asked, labels) = bench::beside::test_split(&dir)?;
        return Ok(Served {
            dir,
            model: None,
            asked,
            labels: Some(labels),
        });
    };
    let dir = args.work.join(name);
    if !dir.join("features.f32").is_file() {
        eprintln!("generating {name}: {nodes} nodes, {edges} edges, D = 128");
        let status = Command::new(workspace_bin("sidecar"))
            .arg("generate")
            .arg("--out")
            .arg(&dir)
            .args(["--nodes", &nodes.to_string(), "--edges", &edges.to_string()])
            .args(["--seed", "1", "--super-nodes", "1"])
            .args(["--super-degree", &(nodes - 1).to_string()])
            .args(["--feature-dim", "128"])
            .status()?;
        ensure!(status.success(), "sidecar generate failed");
    }
    let model = args.work.join(format!("{name}-model"));
    if !model.join("manifest.json").is_file() {
        let status = Command::new(python())
            .arg(repo_root().join("gnn-worker/model/sage.py"))
            .args(["init", "--feature-dim", "128", "--classes", "16", "--out"])
            .arg(&model)
            .status()?;
        ensure!(status.success(), "sage.py init failed");
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let asked = (0..args.nodes)
        .map(|_| rng.random_range(0..nodes))
        .collect();
    Ok(Served {
        dir,
        model: Some(model),
        asked,
        labels: None,
    })
}

/// The smallest degree of the top `share` of the nodes by degree, and the
/// share of nodes at least that degree.
fn hub_degree(index: &CsrIndex, share: f64) -> (u32, f64) {
    let n = index.n_nodes();
    let mut degrees: Vec<u32> = (0..n).map(|v| index.degree(v)).collect();
    degrees.sort_unstable_by(|a, b| b.cmp(a));
    let k = ((n as f64 * share) as usize).clamp(1, degrees.len());
    let d = degrees[k - 1].max(1);
    let hubs = degrees.iter().filter(|&&x| x >= d).count();
    (d, hubs as f64 / n as f64)
}

fn run_dataset(name: &str, args: &Args) -> anyhow::Result<DatasetResult> {
    let served = served(name, args)?;
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(served.dir.join("meta.json"))?)?;
    // Covering fanouts where the sidecar's cap allows them: the stored
    // embeddings are then the exact ones. A generated graph's meta.json
    // has no degree summary (and its super node is past the cap).
    let precompute_fanouts = match meta["degree"]["max"].as_u64() {
        Some(max) if max <= 1024 => [max.max(20) as u32, max.max(10) as u32],
        _ => [20, 10],
    };
    let redis = tests::redis::RedisServer::start();
    let mut options = StackOptions::new(name);
    options.dataset_dir = Some(served.dir.clone());
    options.model = served.model.clone();
    options.max_fanouts = Some(precompute_fanouts.map(|f| f.max(50)));
    options.response_mib = 64;
    let metrics = format!("127.0.0.1:{}", free_port());
    options.sidecar_args = vec!["--metrics-addr".into(), metrics.clone()];
    // The stack's own worker is the plain one; the hub degree is read from
    // the index the stack imported, and the hub worker started beside it.
    let stack = Stack::start(&options)?;
    let index = CsrIndex::open(&stack.dir.path().join("data").join(INDEX_FILE))?;
    let (hub_min_degree, hub_share) = hub_degree(&index, args.hub_top);
    let edges = index.n_edges();
    drop(index);
    eprintln!(
        "{name}: hubs have degree >= {hub_min_degree} ({:.1}% of nodes)",
        100.0 * hub_share
    );
    let hub_worker = bench::beside::Beside::start(
        &stack,
        &[
            "--precomputed-redis".into(),
            redis.url(),
            "--precomputed-check-s".into(),
            "0.5".into(),
            "--precomputed-answers".into(),
            "false".into(),
            "--hub-min-degree".into(),
            hub_min_degree.to_string(),
        ],
    )?;
    let started = Instant::now();
    let out = Command::new(workspace_bin("gnn-worker"))
        .args(["precompute", "--model"])
        .arg(&stack.model)
        .args(["--shm-name", &stack.shm_name, "--redis", &redis.url()])
        .args([
            "--fanouts",
            &format!("{},{}", precompute_fanouts[0], precompute_fanouts[1]),
        ])
        .args(["--batch", "16", "--onnxruntime-lib"])
        .arg(onnxruntime_lib())
        .stdout(std::process::Stdio::piped())
        .output()?;
    ensure!(
        out.status.success(),
        "precompute: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let precompute_seconds = started.elapsed().as_secs_f64();
    eprintln!("{name}: {}", String::from_utf8_lossy(&out.stdout).trim());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let plain = PredictorClient::connect(stack.grpc.clone()).await?;
        let hub = PredictorClient::connect(hub_worker.grpc.clone()).await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        while metric_value(&hub_worker.http, "gnn_worker_precomputed_nodes") == 0.0 {
            predict_all(&hub, &served.asked[..1]).await?;
            ensure!(
                Instant::now() < deadline,
                "the hub worker did not load the set"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let requests: Arc<Vec<Vec<u64>>> =
            Arc::new(served.asked.iter().map(|&id| vec![id]).collect());
        let caller = |client: &PredictorClient<tonic::transport::Channel>| ProductGrpc {
            client: client.clone(),
            requests: requests.clone(),
        };
        let sidecar = |m: &str| metric_value(&metrics, m);
        let budget = Duration::from_secs(300);
        // Per worker: lone calls (the rows and cached slots per request are
        // the sidecar's counts over them), then the closed loop.
        let measure = |client: PredictorClient<tonic::transport::Channel>| {
            let caller = caller(&client);
            async move {
                let counts = || {
                    [
                        "sidecar_neighbor_fetch_count_sum",
                        "sidecar_neighbor_fetch_count_count",
                        "sidecar_hub_cached_slots_total",
                    ]
                    .map(sidecar)
                };
                let before = counts();
                let lone = load::lone(&caller, args.calls, 50, budget).await;
                let after = counts();
                let requests = (after[1] - before[1]).max(1.0);
                let closed: Arc<dyn Caller> = Arc::new(caller);
                let closed =
                    load::closed(closed, args.concurrency, Duration::from_secs(args.seconds)).await;
                let path = Path1 {
                    rows_per_request: (after[0] - before[0]) / requests,
                    lone,
                    closed,
                };
                (path, (after[2] - before[2]) / requests)
            }
        };
        let (plain_path, _) = measure(plain.clone()).await;
        let (hub_path, cached_slots_per_request) = measure(hub.clone()).await;
        let p = predict_all(&plain, &served.asked).await?;
        let h = predict_all(&hub, &served.asked).await?;
        let accuracy = |preds: &[pb::Prediction]| {
            served.labels.as_ref().map(|labels| {
                preds
                    .iter()
                    .filter(|p| p.label == labels[p.node_id as usize])
                    .count() as f64
                    / preds.len() as f64
            })
        };
        let agreement =
            p.iter().zip(&h).filter(|(a, b)| a.label == b.label).count() as f64 / p.len() as f64;
        let max_abs_logit_diff = p
            .iter()
            .zip(&h)
            .flat_map(|(a, b)| a.logits.iter().zip(&b.logits).map(|(x, y)| (x - y).abs()))
            .fold(0f32, f32::max) as f64;
        Ok(DatasetResult {
            dataset: name.into(),
            nodes: meta["num_nodes"].as_u64().unwrap_or(0),
            edges,
            hub_min_degree,
            hub_share_of_nodes: hub_share,
            precompute_fanouts,
            precompute_seconds,
            cached_slots_per_request,
            accuracy_plain: accuracy(&p),
            accuracy_hub: accuracy(&h),
            agreement,
            max_abs_logit_diff,
            plain: plain_path,
            hub: hub_path,
        })
    })
}

fn markdown(report: &Report) -> String {
    let mut md = format!(
        "# Hub layer-1 embeddings against the plain inductive path\n\n`{}` ({} cores). Both \
         workers serve at fanouts [20, 10] from one sidecar; the hub worker's stored \
         embeddings were computed at the precompute fanouts. Rows: node-table rows per lone \
         request; latency: lone gRPC calls of one node, microseconds; throughput: closed loop \
         of one-node calls.\n\n",
        report.command, report.cores
    );
    md.push_str(
        "| dataset | hubs | precompute | cached slots / request | rows plain / hub | p50 / p99 \
         plain | p50 / p99 hub | throughput plain / hub (calls/s) | accuracy plain / hub | \
         agreement | max logit diff |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &report.results {
        let accuracy = match (r.accuracy_plain, r.accuracy_hub) {
            (Some(a), Some(b)) => format!("{:.1} / {:.1}%", 100.0 * a, 100.0 * b),
            _ => "(no labels)".into(),
        };
        md.push_str(&format!(
            "| {} | degree >= {} ({:.1}% of nodes) | {:?} in {:.0} s | {:.1} | {:.1} / {:.1} \
             ({:.2}x) | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} ({:.2}x) | {} | {:.2}% | \
             {:.2e} |\n",
            r.dataset,
            r.hub_min_degree,
            100.0 * r.hub_share_of_nodes,
            r.precompute_fanouts,
            r.precompute_seconds,
            r.cached_slots_per_request,
            r.plain.rows_per_request,
            r.hub.rows_per_request,
            r.hub.rows_per_request / r.plain.rows_per_request.max(1e-9),
            r.plain.lone.p50_us,
            r.plain.lone.p99_us,
            r.hub.lone.p50_us,
            r.hub.lone.p99_us,
            r.plain.closed.throughput,
            r.hub.closed.throughput,
            r.hub.closed.throughput / r.plain.closed.throughput.max(1e-9),
            accuracy,
            100.0 * r.agreement,
            r.max_abs_logit_diff,
        ));
    }
    md
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.work)?;
    let mut results = Vec::new();
    for name in &args.datasets {
        results.push(run_dataset(name, &args).with_context(|| format!("dataset {name}"))?);
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        results,
    };
    let md = markdown(&report);
    print!("{md}");
    bench::report::write_files(Path::new(&args.out), &report, &md)
}
