//! `hybrid`: precomputed answers against the plain inductive path, on the
//! same data side by side (docs/strategies.md, "Precomputed answers").
//!
//! Per dataset: a sidecar serving it, a worker with `--precomputed-redis`
//! (hybrid) and one without (inductive) on the same ring, both at fanouts
//! [20, 10]. `gnn-worker precompute` stores every node's output, computed
//! with covering fanouts (every neighbour: the offline model's answers).
//! Then, before and after a round of changes (new edges between random
//! nodes and invalidated feature rows, each touching `--change-share` of
//! the nodes): the share of test nodes answered from the store and the test
//! accuracy of both workers; lone-call latency of each path (a fresh node
//! through the hybrid worker, a stale one through it, any node through the
//! inductive one) and closed-loop throughput of both workers over all test
//! nodes. `--model` serves another model, a PyG model in the subgraph
//! layout for instance (whose answers are precomputed one node a
//! subgraph). Run through `scripts/bench-hybrid.sh`.

use std::path::PathBuf;
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
use tests::stack::{dataset, metric_value, onnxruntime_lib, workspace_bin, Stack};

#[derive(Debug, Parser)]
#[command(about = "Precomputed answers against the inductive path")]
struct Args {
    #[arg(long, value_delimiter = ',', default_value = "cora,citeseer,cora_ml")]
    datasets: Vec<String>,
    /// Share of the nodes each kind of change touches (edges, rows).
    #[arg(long, default_value_t = 0.01)]
    change_share: f64,
    /// Lone calls per path.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Seconds of closed-loop load per worker.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Fanouts the answers are precomputed with: `covering` (every
    /// neighbour: the dataset's largest degree) or `f1,f2`.
    #[arg(long, default_value = "covering")]
    precompute_fanouts: String,
    /// Concurrent callers of the closed loop.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// A model directory to serve instead of the one trained for each
    /// dataset (a PyG model in the subgraph layout, for instance:
    /// `pyg_model.py train` or `scripts/bench-pyg.sh`'s); give the one
    /// dataset it was trained on.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "bench/results/hybrid")]
    out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Phase {
    /// Test nodes answered from the store, of all test nodes.
    share_precomputed: f64,
    accuracy_hybrid: f64,
    accuracy_inductive: f64,
    /// Test nodes whose label differs between the two workers.
    disagreements: usize,
}

#[derive(Debug, Serialize)]
struct DatasetResult {
    dataset: String,
    nodes: u64,
    test_nodes: usize,
    precompute_fanouts: [u32; 2],
    precompute_seconds: f64,
    precompute_nodes_per_s: f64,
    edges_added: usize,
    rows_invalidated: usize,
    before_changes: Phase,
    after_changes: Phase,
    lone_fresh_hybrid: Summary,
    lone_stale_hybrid: Summary,
    lone_inductive: Summary,
    closed_hybrid: Summary,
    closed_inductive: Summary,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cores: usize,
    /// The model served when not each dataset's trained one.
    model: Option<String>,
    precompute_fanouts: String,
    results: Vec<DatasetResult>,
}

fn meta(name: &str) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(dataset(name).join("meta.json"))?;
    Ok(serde_json::from_str(&text)?)
}

async fn phase(
    hybrid: &PredictorClient<tonic::transport::Channel>,
    inductive: &PredictorClient<tonic::transport::Channel>,
    test: &[u64],
    labels: &[i32],
) -> anyhow::Result<(Phase, Vec<u64>, Vec<u64>)> {
    let h = predict_all(hybrid, test).await?;
    let i = predict_all(inductive, test).await?;
    let accuracy = |p: &[pb::Prediction]| {
        p.iter()
            .filter(|p| p.label == labels[p.node_id as usize])
            .count() as f64
            / p.len() as f64
    };
    let (fresh, stale): (Vec<&pb::Prediction>, Vec<&pb::Prediction>) =
        h.iter().partition(|p| p.answered_by == "precomputed");
    Ok((
        Phase {
            share_precomputed: fresh.len() as f64 / h.len() as f64,
            accuracy_hybrid: accuracy(&h),
            accuracy_inductive: accuracy(&i),
            disagreements: h.iter().zip(&i).filter(|(a, b)| a.label != b.label).count(),
        },
        fresh.iter().map(|p| p.node_id).collect(),
        stale.iter().map(|p| p.node_id).collect(),
    ))
}

fn one_node_requests(ids: &[u64]) -> Arc<Vec<Vec<u64>>> {
    Arc::new(ids.iter().map(|&id| vec![id]).collect())
}

fn run_dataset(name: &str, args: &Args) -> anyhow::Result<DatasetResult> {
    let meta = meta(name)?;
    let n = meta["num_nodes"].as_u64().context("num_nodes")?;
    let max_degree = meta["degree"]["max"].as_u64().context("degree.max")? as u32;
    let (test, labels) = bench::beside::test_split(&dataset(name))?;
    let redis = tests::redis::RedisServer::start();
    let mut options = tests::stack::StackOptions::new(name);
    options.max_fanouts = Some([max_degree.max(50), max_degree.max(50)]);
    options.response_mib = 64;
    if let Some(model) = &args.model {
        options.model = Some(model.clone());
        options.worker_fanouts = Some("20,10".into());
    }
    options.worker_args = vec![
        "--precomputed-redis".into(),
        redis.url(),
        "--precomputed-check-s".into(),
        "0.5".into(),
    ];
    let stack = Stack::start(&options)?;
    // The inductive worker beside it, on the same ring.
    let inductive_worker = bench::beside::Beside::start(&stack, &[])?;
    let grpc = inductive_worker.grpc.clone();
    let result = (|| -> anyhow::Result<DatasetResult> {
        let fanouts = match args.precompute_fanouts.as_str() {
            "covering" => [max_degree, max_degree],
            text => {
                text.parse::<daemon_kit::config::Fanouts>()
                    .map_err(anyhow::Error::msg)?
                    .0
            }
        };
        let out = Command::new(workspace_bin("gnn-worker"))
            .args(["precompute", "--model"])
            .arg(&stack.model)
            .args(["--shm-name", &stack.shm_name, "--redis", &redis.url()])
            .args(["--fanouts", &format!("{},{}", fanouts[0], fanouts[1])])
            .args(["--batch", "4", "--onnxruntime-lib"])
            .arg(onnxruntime_lib())
            .output()?;
        ensure!(
            out.status.success(),
            "precompute: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        eprintln!("{name}: {}", said.trim());
        let seconds: f64 = said
            .split(" in ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .context("the precompute's time")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let hybrid = PredictorClient::connect(stack.grpc.clone()).await?;
            let inductive = PredictorClient::connect(grpc.clone()).await?;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                predict_all(&hybrid, &[test[0]]).await?;
                if metric_value(&stack.http, "gnn_worker_precomputed_nodes") > 0.0 {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "the hybrid worker did not load the set"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (before, _, _) = phase(&hybrid, &inductive, &test, &labels).await?;

            // Changes: new edges between random nodes, invalidated rows.
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
            let k = ((n as f64 * args.change_share).ceil() as usize).max(1);
            let edges: String = (0..k)
                .map(|_| format!("{} {}\n", rng.random_range(0..n), rng.random_range(0..n)))
                .collect();
            let file = stack.dir.path().join("changes.txt");
            std::fs::write(&file, edges)?;
            stack.sidecarctl(&["graph", "add-edges", "--file", &file.to_string_lossy()])?;
            let rows: Vec<String> = (0..k).map(|_| rng.random_range(0..n).to_string()).collect();
            let mut invalidate = vec!["invalidate"];
            invalidate.extend(rows.iter().map(String::as_str));
            stack.sidecarctl(&invalidate)?;
            let (after, fresh, stale) = phase(&hybrid, &inductive, &test, &labels).await?;
            ensure!(
                !fresh.is_empty() && !stale.is_empty(),
                "no fresh or no stale node"
            );

            let budget = Duration::from_secs(60);
            let caller =
                |client: &PredictorClient<tonic::transport::Channel>, ids: &[u64]| ProductGrpc {
                    client: client.clone(),
                    requests: one_node_requests(ids),
                };
            let lone_fresh_hybrid =
                load::lone(&caller(&hybrid, &fresh), args.calls, 50, budget).await;
            let lone_stale_hybrid =
                load::lone(&caller(&hybrid, &stale), args.calls, 50, budget).await;
            let lone_inductive =
                load::lone(&caller(&inductive, &test), args.calls, 50, budget).await;
            let seconds_each = Duration::from_secs(args.seconds);
            let closed_hybrid: Arc<dyn Caller> = Arc::new(caller(&hybrid, &test));
            let closed_hybrid = load::closed(closed_hybrid, args.concurrency, seconds_each).await;
            let closed_inductive: Arc<dyn Caller> = Arc::new(caller(&inductive, &test));
            let closed_inductive =
                load::closed(closed_inductive, args.concurrency, seconds_each).await;
            Ok(DatasetResult {
                dataset: name.into(),
                nodes: n,
                test_nodes: test.len(),
                precompute_fanouts: fanouts,
                precompute_seconds: seconds,
                precompute_nodes_per_s: n as f64 / seconds,
                edges_added: k,
                rows_invalidated: k,
                before_changes: before,
                after_changes: after,
                lone_fresh_hybrid,
                lone_stale_hybrid,
                lone_inductive,
                closed_hybrid,
                closed_inductive,
            })
        })
    })();
    drop(inductive_worker);
    drop(stack);
    result
}

fn markdown(report: &Report) -> String {
    let mut md = format!(
        "# Precomputed answers against the inductive path\n\n`{}` ({} cores). Both workers \
         serve at fanouts [20, 10] from one sidecar; the stored answers were computed with \
         fanouts `{}` (the table's precompute column). Latency: lone gRPC calls of one node, microseconds; throughput: \
         closed loop of one-node calls over every test node.\n\n",
        report.command, report.cores, report.precompute_fanouts
    );
    md.push_str(
        "| dataset | precompute | share from store (before / after changes) | accuracy \
         hybrid / inductive (before) | after | p50 / p99 fresh (hybrid) | stale (hybrid) | \
         inductive | throughput hybrid / inductive (calls/s) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &report.results {
        md.push_str(&format!(
            "| {} | {} nodes at {:?} in {:.1} s | {:.1}% / {:.1}% | {:.1} / {:.1}% | {:.1} / {:.1}% | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} ({:.2}x) |\n",
            r.dataset,
            r.nodes,
            r.precompute_fanouts,
            r.precompute_seconds,
            100.0 * r.before_changes.share_precomputed,
            100.0 * r.after_changes.share_precomputed,
            100.0 * r.before_changes.accuracy_hybrid,
            100.0 * r.before_changes.accuracy_inductive,
            100.0 * r.after_changes.accuracy_hybrid,
            100.0 * r.after_changes.accuracy_inductive,
            r.lone_fresh_hybrid.p50_us,
            r.lone_fresh_hybrid.p99_us,
            r.lone_stale_hybrid.p50_us,
            r.lone_stale_hybrid.p99_us,
            r.lone_inductive.p50_us,
            r.lone_inductive.p99_us,
            r.closed_hybrid.throughput,
            r.closed_inductive.throughput,
            r.closed_hybrid.throughput / r.closed_inductive.throughput.max(1e-9),
        ));
    }
    md.push_str(
        "\nChanges: new edges between random node pairs and invalidated feature rows, each \
         as many as the change share of the nodes (`edges_added`, `rows_invalidated` in \
         report.json).\n",
    );
    md
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.model.is_none() || args.datasets.len() == 1,
        "--model serves one model: give the one dataset it was trained on (--datasets cora)"
    );
    let mut results = Vec::new();
    for name in &args.datasets {
        results.push(run_dataset(name, &args).with_context(|| format!("dataset {name}"))?);
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        model: args.model.as_ref().map(|m| m.display().to_string()),
        precompute_fanouts: args.precompute_fanouts.clone(),
        results,
    };
    let md = markdown(&report);
    print!("{md}");
    bench::report::write_files(&args.out, &report, &md)
}
