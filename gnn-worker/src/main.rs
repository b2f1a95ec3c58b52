//! `gnn-worker`: the model worker's command line.
//!
//! ```text
//! gnn-worker serve --model <dir> --shm-name <name> [--grpc <addr>] [--http <addr>] [--device cpu|cuda]
//! gnn-worker predict --addr <addr> <node ids...> [--json]
//! ```
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use gnn_worker::batcher::{BatchConfig, Predictor};
use gnn_worker::grpc::{pb, PredictService, PredictorClient, PredictorServer};
use gnn_worker::model::{Device, Manifest, Model};
use protocol::client::{ClientOptions, RingClient};

/// The GNN model worker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Attach to the sidecar's ring, load the model, serve gRPC and HTTP.
    Serve(ServeArgs),
    /// Ask a serving worker (gRPC) for predictions.
    Predict {
        /// The worker's gRPC address, e.g. http://127.0.0.1:50051.
        #[arg(long)]
        addr: String,
        /// Node ids.
        #[arg(required = true)]
        ids: Vec<u64>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Model directory: model.onnx and manifest.json (gnn-worker/model/sage.py).
    #[arg(long)]
    model: PathBuf,
    /// The sidecar's shared-memory segment name.
    #[arg(long, default_value = "gnn-sidecar")]
    shm_name: String,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    grpc: SocketAddr,
    /// HTTP/JSON listen address (predict, healthz, readyz, metrics).
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// libonnxruntime.so to load (default: $ORT_DYLIB_PATH, then the
    /// onnxruntime wheel in the project's .venv).
    #[arg(long)]
    onnxruntime_lib: Option<PathBuf>,
    /// Override the manifest's fanouts (e.g. to cover every neighbour).
    #[arg(long, value_parser = protocol::request::parse_fanouts)]
    fanouts: Option<[u32; 2]>,
    /// Most targets gathered into one batch.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// Longest a call waits for others to batch with, milliseconds.
    #[arg(long, default_value_t = 2.0)]
    max_delay_ms: f64,
    /// Executor threads (each runs ring calls and its own ONNX session).
    #[arg(long, default_value_t = 2)]
    executors: usize,
    /// ONNX Runtime intra-op threads per session.
    #[arg(long, default_value_t = 1)]
    intra_threads: usize,
    /// Deadline of one ring call, milliseconds.
    #[arg(long, default_value_t = 500)]
    ring_timeout_ms: u64,
    /// How long to wait for the sidecar's segment at start, seconds.
    #[arg(long, default_value_t = 60.0)]
    attach_timeout_s: f64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("gnn-worker: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match Cli::parse().command {
        Command::Serve(args) => runtime.block_on(serve(args)),
        Command::Predict { addr, ids, json } => runtime.block_on(predict(addr, ids, json)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gnn-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let manifest = Manifest::read(&args.model)?;
    let env = gnn_worker::onnxruntime::init(args.onnxruntime_lib.as_deref())?;
    let executors = args.executors.max(1);
    let mut models = Vec::with_capacity(executors);
    for _ in 0..executors {
        models.push(Model::load(
            &env,
            &args.model,
            args.device,
            args.intra_threads,
        )?);
    }
    tracing::info!(model = %args.model.display(), device = ?args.device, executors, "model loaded");

    // Attach, waiting for the sidecar for a while (pods start in any order).
    let started = Instant::now();
    let client = loop {
        let name = args.shm_name.clone();
        match tokio::task::spawn_blocking(move || {
            RingClient::attach(&name, ClientOptions::default())
        })
        .await?
        {
            Ok(client) => break client,
            Err(e) if started.elapsed().as_secs_f64() < args.attach_timeout_s => {
                tracing::info!(error = %e, "waiting for the sidecar");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!(
                "no sidecar on /dev/shm/{} after {:.0} s: {e}",
                args.shm_name,
                args.attach_timeout_s
            ),
        }
    };
    let (Some(schema), Some(geometry)) = (client.schema(), client.geometry()) else {
        bail!("the sidecar went away while attaching");
    };
    let fanouts = args.fanouts.unwrap_or(manifest.fanouts);
    manifest.check_segment(&schema, &geometry, fanouts)?;
    let config = BatchConfig {
        max_batch: args.max_batch.max(1),
        max_delay: Duration::from_secs_f64(args.max_delay_ms.max(0.0) / 1e3),
        fanouts,
        ring_timeout: Duration::from_millis(args.ring_timeout_ms),
        ..BatchConfig::default()
    };
    let predictor = Predictor::start(Arc::new(client), models, schema, config);

    let grpc = tokio::net::TcpListener::bind(args.grpc)
        .await
        .with_context(|| format!("binding gRPC on {}", args.grpc))?;
    let http = tokio::net::TcpListener::bind(args.http)
        .await
        .with_context(|| format!("binding HTTP on {}", args.http))?;
    tracing::info!(grpc = %grpc.local_addr()?, http = %http.local_addr()?, ?fanouts, "worker serving");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("stopping");
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut grpc_stop = stop_rx.clone();
    let mut http_stop = stop_rx;
    let grpc_server = tonic::transport::Server::builder()
        .add_service(PredictorServer::new(PredictService::new(predictor.clone())))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(grpc),
            async move {
                let _ = grpc_stop.wait_for(|s| *s).await;
            },
        );
    let http_server = axum::serve(http, gnn_worker::http::router(predictor))
        .with_graceful_shutdown(async move {
            let _ = http_stop.wait_for(|s| *s).await;
        });
    let grpc_task = tokio::spawn(grpc_server);
    let http_task = tokio::spawn(async move { http_server.await });
    shutdown.await;
    let _ = stop_tx.send(true);
    grpc_task.await?.context("gRPC server")?;
    http_task.await?.context("HTTP server")?;
    Ok(())
}

async fn predict(addr: String, ids: Vec<u64>, json: bool) -> anyhow::Result<()> {
    let mut client = PredictorClient::connect(addr.clone())
        .await
        .with_context(|| format!("connecting to {addr}: is `gnn-worker serve` running there?"))?;
    let response = client
        .predict(pb::PredictRequest {
            node_ids: ids,
            request_id: 0,
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?
        .into_inner();
    for p in &response.predictions {
        if json {
            println!(
                "{}",
                serde_json::json!({"node_id": p.node_id, "label": p.label, "logits": p.logits,
                    "known": p.known, "fallback_rows": p.fallback_rows})
            );
        } else {
            println!(
                "node {:>8}  label {:>3}{}{}",
                p.node_id,
                p.label,
                if p.known { "" } else { "  (unknown node)" },
                if p.fallback_rows > 0 {
                    format!("  ({} default feature rows)", p.fallback_rows)
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
