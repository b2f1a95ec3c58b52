//! `pyg`: PyTorch Geometric models served in the subgraph layout against
//! the same weights in the dense layout, side by side on one sidecar
//! (docs/model.md, "Speed").
//!
//! On cora at fanouts [20, 10]: a PyG SAGEConv model trained and exported
//! by `pyg_model.py train` (`torch.onnx.export`, served as exported with
//! its scatter-adds rewritten at load), the same weights imported into the
//! dense layout (`sage.py import-pyg`), the PyG model without the rewrite
//! (`--fast-scatter false`), and PyG GCN, GAT and GIN models. One sidecar,
//! one worker per model (two executors each), measured one at a time: lone
//! gRPC calls of one node (latency), a closed loop of one-node calls
//! (throughput at saturation), and the labels of every test node
//! (accuracy). The SAGE pair is measured in alternating rounds and the
//! median of the rounds reported. Run through `scripts/bench-pyg.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use bench::beside::{predict_all, Beside};
use bench::load::{self, Caller, Summary};
use bench::systems::ProductGrpc;
use clap::Parser;
use gnn_worker::api::grpc::PredictorClient;
use serde::Serialize;
use tests::stack::{python, repo_root, shipped_cora, Stack, StackOptions};

#[derive(Debug, Parser)]
#[command(about = "PyG models in the subgraph layout against the dense layout")]
struct Args {
    /// PyG architectures timed beside SAGE.
    #[arg(long, value_delimiter = ',', default_value = "gcn,gat,gin")]
    archs: Vec<String>,
    /// Lone calls per model and round.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Seconds of closed-loop load per model and round.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent callers of the closed loop.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Rounds of the SAGE pair (dense, PyG), alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Training epochs of each model.
    #[arg(long, default_value_t = 200)]
    epochs: u32,
    /// Where the models are kept between runs.
    #[arg(long, default_value = "/tmp/gnn-bench-pyg")]
    work: PathBuf,
    #[arg(long, default_value = "bench/results/pyg")]
    out: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    lone: Summary,
    closed: Summary,
}

#[derive(Debug, Serialize)]
struct ModelResult {
    name: String,
    layout: &'static str,
    /// Median over rounds of the lone p50 and p99 (µs) and the closed-loop
    /// throughput (calls/s).
    lone_p50_us: f64,
    lone_p99_us: f64,
    throughput: f64,
    accuracy: f64,
    rounds: Vec<Measured>,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cores: usize,
    fanouts: [u32; 2],
    results: Vec<ModelResult>,
    /// PyG SAGE ÷ dense SAGE: lone p50 and p99, and dense ÷ PyG throughput
    /// (above 1: the PyG model is slower).
    lone_p50_ratio: f64,
    lone_p99_ratio: f64,
    saturation_ratio: f64,
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {what}"))?;
    ensure!(status.success(), "{what} failed");
    Ok(())
}

/// A PyG model of `arch`, trained once into the work directory.
fn pyg_model(args: &Args, arch: &str) -> anyhow::Result<PathBuf> {
    let out = args.work.join(format!("pyg-{arch}"));
    if !out.join("manifest.json").is_file() {
        eprintln!("training the PyG {arch} model");
        run(
            Command::new(python())
                .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
                .args(["train", "--dataset"])
                .arg(shipped_cora())
                .args(["--arch", arch, "--fanouts", "20,10", "--loader-runs", "0"])
                .args(["--epochs", &args.epochs.to_string(), "--out"])
                .arg(&out),
            "pyg_model.py train",
        )?;
    }
    Ok(out)
}

/// The PyG SAGE model's weights in the dense layout (`sage.py import-pyg`).
fn dense_twin(args: &Args, sage: &Path) -> anyhow::Result<PathBuf> {
    let out = args.work.join("dense-sage");
    if out.join("manifest.json").is_file() {
        return Ok(out);
    }
    // pyg_model.py names the layers convs.0 and convs.1; import-pyg reads
    // a two-layer model's conv1 and conv2.
    let renamed = args.work.join("sage-weights-conv12.safetensors");
    let script = "import sys\nfrom safetensors.torch import load_file, save_file\n\
                  w = load_file(sys.argv[1])\n\
                  save_file({k.replace('convs.0.', 'conv1.').replace('convs.1.', 'conv2.'): v \
                  for k, v in w.items()}, sys.argv[2])";
    run(
        Command::new(python())
            .args(["-c", script])
            .arg(sage.join("weights.safetensors"))
            .arg(&renamed),
        "renaming the SAGE weights",
    )?;
    run(
        Command::new(python())
            .arg(repo_root().join("gnn-worker/model/sage.py"))
            .args(["import-pyg", "--weights"])
            .arg(&renamed)
            .arg("--dataset")
            .arg(shipped_cora())
            .args(["--fanouts", "20,10", "--out"])
            .arg(&out),
        "sage.py import-pyg",
    )?;
    Ok(out)
}

/// The median of one figure over the rounds (at least one round runs).
fn median(values: Vec<f64>) -> f64 {
    load::median(&values).unwrap_or(0.0)
}

async fn measure(
    client: &PredictorClient<tonic::transport::Channel>,
    requests: &Arc<Vec<Vec<u64>>>,
    args: &Args,
) -> Measured {
    let caller = ProductGrpc {
        client: client.clone(),
        requests: requests.clone(),
    };
    let lone = load::lone(&caller, args.calls, 50, Duration::from_secs(300)).await;
    let caller: Arc<dyn Caller> = Arc::new(caller);
    let closed = load::closed(caller, args.concurrency, Duration::from_secs(args.seconds)).await;
    Measured { lone, closed }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.work)?;
    let sage = pyg_model(&args, "sage")?;
    let dense = dense_twin(&args, &sage)?;
    let others: Vec<(String, PathBuf)> = args
        .archs
        .iter()
        .map(|arch| Ok((arch.clone(), pyg_model(&args, arch)?)))
        .collect::<anyhow::Result<_>>()?;
    let cora = shipped_cora();
    let (test, labels) = bench::beside::test_split(&cora)?;

    let mut options = StackOptions::new("cora");
    options.dataset_dir = Some(cora.clone());
    options.model = Some(sage.clone());
    options.worker_fanouts = Some("20,10".into());
    options.response_mib = 16;
    let stack = Stack::start(&options)?;
    // Beside workers serve at fanouts [20, 10].
    let dense_worker = Beside::start_model(&stack, &dense, &[])?;
    let plain_worker =
        Beside::start_model(&stack, &sage, &["--fast-scatter".into(), "false".into()])?;
    let mut other_workers = Vec::new();
    for (arch, model) in &others {
        other_workers.push((arch.clone(), Beside::start_model(&stack, model, &[])?));
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let results = runtime.block_on(async {
        let requests: Arc<Vec<Vec<u64>>> = Arc::new(test.iter().map(|&id| vec![id]).collect());
        let connect = |addr: String| async move { PredictorClient::connect(addr).await };
        let pyg = connect(stack.grpc.clone()).await?;
        let dense = connect(dense_worker.grpc.clone()).await?;
        let mut named: Vec<(String, &'static str, PredictorClient<_>)> = vec![
            (
                "SAGE (dense layout, sage.py import-pyg)".into(),
                "dense",
                dense,
            ),
            ("SAGE (PyG export)".into(), "subgraph", pyg),
        ];
        // The pair alternates for `rounds`; the others are measured once.
        let mut rounds: Vec<Vec<Measured>> = vec![Vec::new(), Vec::new()];
        for round in 0..args.rounds {
            for (i, (name, _, client)) in named.iter().enumerate() {
                eprintln!("round {}: {name}", round + 1);
                rounds[i].push(measure(client, &requests, &args).await);
            }
        }
        named.push((
            "SAGE (PyG export, no scatter rewrite)".into(),
            "subgraph",
            connect(plain_worker.grpc.clone()).await?,
        ));
        for (arch, worker) in &other_workers {
            named.push((
                format!("{} (PyG export)", arch.to_uppercase()),
                "subgraph",
                connect(worker.grpc.clone()).await?,
            ));
        }
        for (name, _, client) in named.iter().skip(2) {
            eprintln!("{name}");
            rounds.push(vec![measure(client, &requests, &args).await]);
        }
        let mut results = Vec::new();
        for ((name, layout, client), rounds) in named.iter().zip(rounds) {
            let predictions = predict_all(client, &test).await?;
            let accuracy = predictions
                .iter()
                .filter(|p| labels[p.node_id as usize] == p.label)
                .count() as f64
                / predictions.len() as f64;
            results.push(ModelResult {
                name: name.clone(),
                layout,
                lone_p50_us: median(rounds.iter().map(|r| r.lone.p50_us).collect()),
                lone_p99_us: median(rounds.iter().map(|r| r.lone.p99_us).collect()),
                throughput: median(rounds.iter().map(|r| r.closed.throughput).collect()),
                accuracy,
                rounds,
            });
        }
        anyhow::Ok(results)
    })?;
    drop(other_workers);
    drop(plain_worker);
    drop(dense_worker);
    ensure!(stack.stop(), "the stack did not stop cleanly");
    let (d, p) = (&results[0], &results[1]);
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        fanouts: [20, 10],
        lone_p50_ratio: p.lone_p50_us / d.lone_p50_us,
        lone_p99_ratio: p.lone_p99_us / d.lone_p99_us,
        saturation_ratio: d.throughput / p.throughput,
        results,
    };
    let md = markdown(&report);
    print!("{md}");
    bench::report::write_files(Path::new(&args.out), &report, &md)
}

fn markdown(report: &Report) -> String {
    let mut md = format!(
        "# PyG models in the subgraph layout against the dense layout\n\n`{}` ({} cores), \
         cora, fanouts [20, 10], one sidecar, one worker per model (two executors), measured \
         one at a time. Lone: gRPC calls of one test node, one at a time; saturation: a \
         closed loop of one-node calls. Medians over the rounds (the SAGE pair alternates).\n\n\
         | model | layout | lone p50 (µs) | lone p99 (µs) | saturation (calls/s) | test accuracy \
         |\n|---|---|---:|---:|---:|---:|\n",
        report.command, report.cores
    );
    for r in &report.results {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1}% |\n",
            r.name,
            r.layout,
            r.lone_p50_us,
            r.lone_p99_us,
            r.throughput,
            100.0 * r.accuracy
        ));
    }
    md.push_str(&format!(
        "\nPyG SAGE against the same weights in the dense layout: lone p50 {:.2}x, lone p99 \
         {:.2}x, saturation throughput {:.2}x lower (goal: within 1.5x).\n",
        report.lone_p50_ratio, report.lone_p99_ratio, report.saturation_ratio
    ));
    md
}
