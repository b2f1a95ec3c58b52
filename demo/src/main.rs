//! The README demo: the whole product on cora, end to end.
//!
//! Uses the cora dataset the repository ships (`demo/data/cora.tar.gz`;
//! `--dataset citeseer|cora_ml`, shipped beside it, instead). Imports the
//! dataset into the embedded store, trains and exports the model
//! with the tooling, starts `sidecar serve` and `gnn-worker serve`, sends
//! every test node through gRPC (one node per call, one call at a time, for
//! latency; then 16 calls in flight, for throughput), prints the test
//! accuracy and the latency percentiles, and shuts both down cleanly.
#![forbid(unsafe_code)]

use std::time::Instant;

use anyhow::{ensure, Context};
use clap::Parser;
use gnn_worker::api::grpc::{pb, PredictorClient};
use tests::stack::{dataset, read_i32, Stack, StackOptions};
use tests::Latency;

#[derive(Debug, Parser)]
struct Args {
    /// `cora`, `citeseer` or `cora_ml` (shipped with the repository in
    /// demo/data).
    #[arg(long, default_value = "cora")]
    dataset: String,
    /// Calls in flight in the throughput pass.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!("demo: importing {0} into the embedded store, training the model, starting sidecar + worker", args.dataset);
    let dataset_dir = dataset(&args.dataset);
    let options = StackOptions {
        dataset_dir: Some(dataset_dir.clone()),
        ..StackOptions::new(&args.dataset)
    };
    let stack = Stack::start(&options)?;
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(stack.model.join("manifest.json"))?)?;
    let split = std::fs::read(dataset_dir.join("split.u8"))?;
    let labels = read_i32(&dataset_dir.join("labels.i32"));
    let test: Vec<u64> = (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (right, latency, throughput) = runtime.block_on(async {
        let mut client = PredictorClient::connect(stack.grpc.clone())
            .await
            .context("connecting to the worker")?;
        // Warm-up: a few calls so the first-call costs are not timed.
        for &id in test.iter().take(20) {
            client
                .predict(pb::PredictRequest {
                    node_ids: vec![id],
                    request_id: 0,
                    new_node: None,
                })
                .await?;
        }
        let mut latency = Latency::new("gRPC Predict, one node per call, one call at a time");
        let mut right = 0usize;
        for &id in &test {
            let started = Instant::now();
            let response = client
                .predict(pb::PredictRequest {
                    node_ids: vec![id],
                    request_id: id,
                    new_node: None,
                })
                .await?
                .into_inner();
            latency.record(started.elapsed());
            let p = &response.predictions[0];
            ensure!(
                p.node_id == id && p.known,
                "bad answer for node {id}: {p:?}"
            );
            right += usize::from(labels[id as usize] == p.label);
        }
        // Throughput: the same nodes, `concurrency` calls in flight.
        let started = Instant::now();
        let mut in_flight = tokio::task::JoinSet::new();
        for &id in &test {
            if in_flight.len() >= args.concurrency {
                in_flight.join_next().await.expect("a task")??;
            }
            let mut client = client.clone();
            in_flight.spawn(async move {
                client
                    .predict(pb::PredictRequest {
                        node_ids: vec![id],
                        request_id: id,
                        new_node: None,
                    })
                    .await
                    .map(|_| ())
            });
        }
        while let Some(done) = in_flight.join_next().await {
            done??;
        }
        let throughput = test.len() as f64 / started.elapsed().as_secs_f64();
        anyhow::Ok((right, latency, throughput))
    })?;
    let accuracy = right as f64 / test.len() as f64 * 100.0;
    println!();
    println!("dataset            {}", args.dataset);
    println!("test nodes         {}", test.len());
    println!(
        "served accuracy    {accuracy:.1}%  (offline model: {:.1}%, fanouts {})",
        manifest["offline"]["test_accuracy"].as_f64().unwrap_or(0.0) * 100.0,
        manifest["fanouts"]
    );
    println!(
        "latency            p50 {:.0} us, p99 {:.0} us  (gRPC Predict, one node per call, sequential)",
        latency.p50_us(),
        latency.p99_us()
    );
    println!(
        "throughput         {throughput:.0} predictions/s with {} calls in flight",
        args.concurrency
    );
    let clean = stack.stop();
    ensure!(clean, "sidecar or worker did not exit cleanly");
    println!("sidecar and worker stopped cleanly");
    Ok(())
}
