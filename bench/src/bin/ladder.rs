//! `ladder`: the worker under twice the load it can carry, with and
//! without its degrade ladder (docs/strategies.md, "The ladder under
//! overload").
//!
//! One sidecar serving a dataset, two workers on its ring, measured one
//! after the other: `plain` (the GNN only) and `ladder` (with the MLP
//! student and `degrade_fanouts`). The plain worker's saturation is
//! measured first (closed loop); then each worker gets open-loop gRPC load
//! of one test node per call at twice that rate for `--seconds`, calls
//! carrying the deadline `--deadline-ms` as `grpc-timeout` (the ladder's
//! input; the plain worker has no other rung than the GNN, and the server
//! ends a call that passes its deadline as DEADLINE_EXCEEDED). Reported per worker: latency from each call's due time
//! (p50, p99), errors, the accuracy of the answers, and which rung answered
//! them. Run through `scripts/bench-ladder.sh`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bench::load::{self, Caller, Summary};
use clap::Parser;
use gnn_worker::api::grpc::{pb, PredictorClient};
use serde::Serialize;
use tests::stack::{dataset, Stack, StackOptions};

#[derive(Debug, Parser)]
#[command(about = "Twice the sustainable load, with and without the ladder")]
struct Args {
    #[arg(long, default_value = "cora")]
    dataset: String,
    /// The calls' deadline, milliseconds.
    #[arg(long, default_value_t = 20.0)]
    deadline_ms: f64,
    /// Load as a multiple of the plain worker's saturation.
    #[arg(long, default_value_t = 2.0)]
    overload: f64,
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// The reduced rung's fanouts.
    #[arg(long, default_value = "5,3")]
    degrade_fanouts: String,
    #[arg(long, default_value = "bench/results/ladder")]
    out: PathBuf,
}

/// One-node gRPC calls over the test nodes (one HTTP/2 connection, the
/// deadline as `grpc-timeout`), each answer checked against its label and
/// its rung counted.
struct Checked {
    client: PredictorClient<tonic::transport::Channel>,
    test: Vec<u64>,
    labels: Arc<Vec<i32>>,
    deadline_ms: f64,
    correct: AtomicU64,
    answered: AtomicU64,
    /// Answered within the deadline, from when the call was sent (the
    /// open loop sends each at its due time).
    in_time: AtomicU64,
    by: Mutex<BTreeMap<String, u64>>,
}

impl Caller for Checked {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let sent = Instant::now();
            let id = self.test[k % self.test.len()];
            let mut request = tonic::Request::new(pb::PredictRequest {
                node_ids: vec![id],
                request_id: k as u64,
                new_node: None,
            });
            request.set_timeout(Duration::from_secs_f64(self.deadline_ms / 1000.0));
            let mut client = self.client.clone();
            let answer = client
                .predict(request)
                .await
                .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
                .into_inner();
            let p = answer.predictions.first().context("a prediction")?;
            let label = p.label;
            self.answered.fetch_add(1, Ordering::Relaxed);
            if sent.elapsed().as_secs_f64() * 1000.0 <= self.deadline_ms {
                self.in_time.fetch_add(1, Ordering::Relaxed);
            }
            if label == self.labels[id as usize] {
                self.correct.fetch_add(1, Ordering::Relaxed);
            }
            let by = p.answered_by.clone();
            *self.by.lock().unwrap().entry(by).or_default() += 1;
            Ok(())
        })
    }
}

#[derive(Debug, Serialize)]
struct Run {
    worker: String,
    offered_per_s: f64,
    load: Summary,
    answered: u64,
    accuracy: f64,
    /// Answers per rung.
    answered_by: BTreeMap<String, u64>,
    /// Share of the calls answered within the deadline (sent to answer),
    /// errors counted as missed.
    within_deadline: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cores: usize,
    dataset: String,
    deadline_ms: f64,
    saturation_per_s: f64,
    runs: Vec<Run>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let name = args.dataset.as_str();
    let split = std::fs::read(dataset(name).join("split.u8"))?;
    let labels: Vec<i32> = std::fs::read(dataset(name).join("labels.i32"))?
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let test: Vec<u64> = (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .collect();
    let labels = Arc::new(labels);
    let student = tests::stack::derived_model_for(&dataset(name), "distill");
    let stack = Stack::start(&StackOptions::new(name))?;
    let workers = [
        ("plain", Vec::new()),
        (
            "ladder",
            vec![
                "--student".to_string(),
                student.display().to_string(),
                "--degrade-fanouts".into(),
                args.degrade_fanouts.clone(),
            ],
        ),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let checked = |client: &PredictorClient<tonic::transport::Channel>| Checked {
        client: client.clone(),
        test: test.clone(),
        labels: labels.clone(),
        deadline_ms: args.deadline_ms,
        correct: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        in_time: AtomicU64::new(0),
        by: Mutex::new(BTreeMap::new()),
    };
    let mut saturation = 0.0;
    let mut runs = Vec::new();
    for (worker, extra) in workers {
        let beside = bench::beside::Beside::start(&stack, &extra)?;
        let run = runtime.block_on(async {
            let client = PredictorClient::connect(beside.grpc.clone()).await?;
            // Warm up every rung's estimate, then (plain worker) find the
            // saturation the overload is a multiple of.
            let warm: Arc<dyn Caller> = Arc::new(checked(&client));
            let closed = load::closed(warm, 32, Duration::from_secs(5)).await;
            if worker == "plain" {
                saturation = closed.throughput;
            }
            let rate = saturation * args.overload;
            let caller = Arc::new(checked(&client));
            let summary = load::open(
                caller.clone(),
                rate,
                Duration::from_secs(args.seconds),
                Duration::from_secs(5),
            )
            .await;
            let answered = caller.answered.load(Ordering::Relaxed);
            let within = caller.in_time.load(Ordering::Relaxed) as f64
                / (summary.calls + summary.errors).max(1) as f64;
            let answered_by = caller.by.lock().unwrap().clone();
            anyhow::Ok(Run {
                worker: worker.into(),
                offered_per_s: rate,
                answered,
                accuracy: caller.correct.load(Ordering::Relaxed) as f64 / answered.max(1) as f64,
                answered_by,
                within_deadline: within,
                load: summary,
            })
        });
        drop(beside);
        runs.push(run?);
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        dataset: name.into(),
        deadline_ms: args.deadline_ms,
        saturation_per_s: saturation,
        runs,
    };
    let mut md = format!(
        "# The ladder under overload\n\n`{}` ({} cores), {}: the plain worker saturates at \
         {:.0} calls/s; each worker then gets {:.0} calls/s (one test node each, deadline {} \
         ms) for the run. Latency from each call's due time.\n\n| worker | p50 ms | p99 ms | \
         errors | within deadline | accuracy | answered by |\n|---|---|---|---|---|---|---|\n",
        report.command,
        report.cores,
        report.dataset,
        report.saturation_per_s,
        report.saturation_per_s * args.overload,
        report.deadline_ms
    );
    for r in &report.runs {
        md.push_str(&format!(
            "| {} | {:.2} | {:.2} | {} of {} | {:.1}% | {:.1}% | {} |\n",
            r.worker,
            r.load.p50_us / 1000.0,
            r.load.p99_us / 1000.0,
            r.load.errors,
            r.load.calls + r.load.errors,
            100.0 * r.within_deadline,
            100.0 * r.accuracy,
            r.answered_by
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    print!("{md}");
    drop(stack);
    bench::report::write_files(&args.out, &report, &md)
}
