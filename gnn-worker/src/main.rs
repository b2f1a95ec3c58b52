//! `gnn-worker`: the model worker's command line.
//!
//! ```text
//! gnn-worker serve [--config <file.toml>] [--print-config] --model <dir> [--shm-name <name>]
//!                  [--grpc <addr>] [--http <addr>] [--device cpu|cuda] [...]
//! gnn-worker predict --addr <addr> <node ids...> [--json]
//! ```
//!
//! Every setting of `serve` is a flag, a `GNN_WORKER_*` variable and a key
//! of the TOML file (docs/configuration.md). SIGTERM/SIGINT stop it;
//! SIGHUP re-reads `log_level`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use daemon_kit::config::{ConfigError, Layered};
use gnn_worker::batcher::{BatchConfig, Predictor};
use gnn_worker::config::{WorkerConfig, WorkerFlags, SPEC};
use gnn_worker::grpc::{pb, PredictService, PredictorClient, PredictorServer};
use gnn_worker::model::{Manifest, Model, ModelLayout};
use gnn_worker::precomputed::Precomputed;
use gnn_worker::service::Service;
use protocol::client::{ClientOptions, RingClient};
use protocol::layout::MAX_HOPS;
use protocol::request::SubgraphFanouts;

/// The GNN model worker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the model, attach to the sidecar's ring, serve gRPC and HTTP.
    Serve(Box<ServeArgs>),
    /// Score every node of the sidecar's graph and store the outputs in
    /// Redis, for `serve --precomputed-redis` (docs/serving.md,
    /// "Precomputed answers").
    Precompute {
        /// Model directory (exported by this release's sage.py: with h1).
        #[arg(long)]
        model: PathBuf,
        /// The sidecar's shared-memory segment name.
        #[arg(long, default_value = "gnn-sidecar")]
        shm_name: String,
        /// Redis URL to store the outputs in, e.g. redis://127.0.0.1:6379.
        #[arg(long)]
        redis: String,
        /// Fanouts to compute with, e.g. 20,10 [default: a dense-layout
        /// model's the sidecar's, a subgraph-layout (PyG) model's its
        /// manifest's; one per hop, 1 to 3, for such a model].
        #[arg(long)]
        fanouts: Option<daemon_kit::config::HopFanouts>,
        /// Targets per ring request (at most the sidecar's max_targets); a
        /// subgraph-layout model's nodes are computed one per request.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// ONNX Runtime's libonnxruntime.so [default: as `serve`].
        #[arg(long)]
        onnxruntime_lib: Option<PathBuf>,
        /// ONNX Runtime threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// Ask a serving worker (gRPC) for predictions.
    Predict {
        /// The worker's gRPC address, e.g. http://127.0.0.1:50051.
        #[arg(long)]
        addr: String,
        /// Node ids.
        #[arg(required_unless_present = "new_node", conflicts_with = "new_node")]
        ids: Vec<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        new_node: NewNodeArgs,
    },
}

/// A node the graph does not have, predicted without adding it
/// (docs/serving.md, "A new node in one call").
#[derive(Debug, clap::Args)]
struct NewNodeArgs {
    /// The new node's id (instead of node ids).
    #[arg(long)]
    new_node: Option<u64>,
    /// Its feature row, comma separated.
    #[arg(long, requires = "new_node", conflicts_with = "features_file")]
    features: Option<String>,
    /// Its feature row as raw little-endian f32.
    #[arg(long, requires = "new_node")]
    features_file: Option<PathBuf>,
    /// A known neighbour (repeat for several).
    #[arg(long = "edge", requires = "new_node")]
    edges: Vec<u64>,
    /// The edges go from the new node only.
    #[arg(long, requires = "new_node")]
    directed: bool,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// TOML file of settings (keys: docs/configuration.md); also
    /// $GNN_WORKER_CONFIG. Precedence: flags > GNN_WORKER_* variables >
    /// file > defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the effective configuration (each key's source noted) and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    flags: WorkerFlags,
}

fn main() -> ExitCode {
    let cli: Cli = daemon_kit::cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        daemon_kit::logging::init_for_command();
    }
    let new_runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    };
    let result = match cli.command {
        // The start-up blocks the signals before any thread starts.
        Command::Serve(args) => start_and_serve(*args, new_runtime),
        Command::Precompute {
            model,
            shm_name,
            redis,
            fanouts,
            batch,
            onnxruntime_lib,
            threads,
        } => {
            let job = gnn_worker::precomputed::PrecomputeJob {
                model_dir: model,
                shm_name,
                redis_url: redis,
                fanouts: fanouts.map(|f| f.0),
                batch,
                onnxruntime_lib,
                threads,
            };
            gnn_worker::precomputed::precompute(&job).map(|meta| {
                println!(
                    "precomputed {} nodes (ids below {}) at fanouts {:?} in {:.1} s: set {} of \
                     sidecar start {:016x}, tick {}",
                    meta.nodes,
                    meta.id_bound,
                    meta.computed_at(),
                    meta.seconds,
                    meta.model,
                    meta.clock,
                    meta.tick
                )
            })
        }
        Command::Predict {
            addr,
            ids,
            json,
            new_node,
        } => new_runtime()
            .context("starting the runtime")
            .and_then(|runtime| runtime.block_on(predict(addr, ids, json, new_node))),
    };
    exit(result)
}

/// The exit status of a command, its error (if any) on stderr.
fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gnn-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Loads the layered configuration of `gnn-worker serve`.
fn load_config(args: &ServeArgs) -> Result<Layered<WorkerConfig>, ConfigError> {
    Layered::load_for_command(SPEC, args.config.as_deref(), &args.flags)
}

/// Attaches to the sidecar's segment, retrying until `attach_timeout_s`
/// (for ever when 0); the service's readiness says what it waits for.
async fn attach(config: &WorkerConfig, service: &Service) -> anyhow::Result<RingClient> {
    let started = Instant::now();
    loop {
        let name = config.shm_name.clone();
        match tokio::task::spawn_blocking(move || {
            RingClient::attach(&name, ClientOptions::default())
        })
        .await?
        {
            Ok(client) => return Ok(client),
            Err(e) => {
                if config
                    .attach_timeout()
                    .is_some_and(|limit| started.elapsed() >= limit)
                {
                    bail!(
                        "no sidecar on /dev/shm/{} after {:.0} s: {e}",
                        config.shm_name,
                        config.attach_timeout_s
                    );
                }
                service.set_waiting(e.to_string());
                tracing::debug!(error = %e, "waiting for the sidecar");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Loads the model, attaches, checks the model against the segment and
/// installs the predictor.
async fn start(config: &WorkerConfig, service: &Service) -> anyhow::Result<()> {
    let manifest = Manifest::read(&config.model)?;
    let (model_name, sha256) = gnn_worker::model::identity(&config.model)?;
    let env = gnn_worker::onnxruntime::init(config.onnxruntime_lib.as_deref())?;
    let mut models = Vec::with_capacity(config.executors);
    for _ in 0..config.executors {
        models.push(Model::load_with(
            &env,
            &config.model,
            config.device,
            config.intra_threads,
            config.fast_scatter,
        )?);
    }
    tracing::info!(
        model = %config.model.display(),
        architecture = %manifest.architecture,
        layout = ?manifest.layout,
        output = ?manifest.output,
        scatters_rewritten = models.first().map_or(0, Model::scatters_rewritten),
        weights = manifest.quantization.as_ref().map_or("f32", |q| q.weights.as_str()),
        device = ?config.device,
        executors = config.executors,
        name = %model_name,
        sha256 = %sha256,
        "model loaded"
    );
    service.set_model(model_name, sha256);
    let student = match &config.student {
        Some(dir) => {
            let student = Model::load_student(&env, dir, &manifest, config.intra_threads)?;
            tracing::info!(
                student = %dir.display(),
                degrade_queue_calls = config.degrade_queue_calls,
                "student loaded: it answers calls that arrive while this many wait"
            );
            Some(student)
        }
        None => None,
    };
    service.set_waiting(format!("no sidecar on /dev/shm/{} yet", config.shm_name));
    let client = attach(config, service).await?;
    let (Some(schema), Some(geometry)) = (client.schema(), client.geometry()) else {
        bail!("the sidecar went away while attaching");
    };
    let fanouts = worker_fanouts(config, &manifest, &schema)?;
    manifest.check_segment(&schema, &geometry, &fanouts)?;
    if let Some(reduced) = &config.degrade_fanouts {
        if manifest.layout == ModelLayout::Dense && reduced.0.len() != MAX_HOPS {
            bail!(
                "degrade_fanouts {reduced} has {} hops; the model {} reads the dense layout, \
                 which has two: give two fanouts such as 5,3",
                reduced.0.len(),
                config.model.display()
            );
        }
        for (hop, f) in reduced.0.iter().enumerate() {
            let cap = geometry.max_fanouts[hop.min(MAX_HOPS - 1)];
            if *f > cap {
                bail!(
                    "degrade_fanouts {reduced}: hop {} is {f}, above the sidecar's max fanout \
                     {cap}; lower degrade_fanouts (it should be smaller than the worker's fanouts)",
                    hop + 1
                );
            }
        }
    }
    let mut batching = BatchConfig::from_config(config);
    if manifest.layout == ModelLayout::Subgraph {
        batching.subgraph = SubgraphFanouts::new(&fanouts);
        batching.degrade_subgraph = config
            .degrade_fanouts
            .as_ref()
            .and_then(|f| SubgraphFanouts::new(&f.0));
        anyhow::ensure!(
            config.hub_min_degree == 0,
            "hub embeddings are a dense-layout feature (docs/strategies.md, \"PyTorch Geometric \
             models\"); the model {} reads the subgraph layout: set hub_min_degree 0",
            config.model.display()
        );
    }
    if batching.ring_concurrency > geometry.slot_count as usize {
        tracing::warn!(
            ring_concurrency = batching.ring_concurrency,
            slots = geometry.slot_count,
            "ring_concurrency exceeds the ring's slots; using the slot count"
        );
        batching.ring_concurrency = geometry.slot_count as usize;
    }
    let precomputed = match &config.precomputed_redis {
        None => None,
        Some(url) => {
            if manifest.layout == ModelLayout::Dense && manifest.outputs.len() < 2 {
                tracing::warn!(
                    "the model has no h1 output; precomputed answers need a model exported by \
                     this release's sage.py (gnn-worker precompute refuses older ones)"
                );
            }
            redis::Client::open(url.as_str()).map_err(|e| {
                anyhow::anyhow!(
                    "precomputed_redis {:?} is not a Redis URL ({e}): give one such as \
                     redis://host:6379",
                    daemon_kit::redact::redact_url(url)
                )
            })?;
            anyhow::ensure!(
                config.hub_min_degree == 0 || manifest.has_hub_input(),
                "hub_min_degree is {} but the model {} takes no stored hub embeddings (its \
                 inputs have no {:?}): re-export it with this release's sage.py, or set \
                 hub_min_degree 0",
                config.hub_min_degree,
                config.model.display(),
                gnn_worker::model::HUB_INPUT
            );
            let precomputed = Arc::new(Precomputed::default());
            let model_id = gnn_worker::precomputed::model_id(&config.model)?;
            let metrics = service.metrics().clone();
            tokio::spawn(precomputed.clone().follow(
                url.clone(),
                model_id,
                manifest.output_width(),
                config.hub_min_degree > 0,
                Duration::from_secs_f64(config.precomputed_check_s),
                move |set| {
                    metrics
                        .precomputed_nodes
                        .set(set.map_or(0, |s| s.len() as i64));
                },
            ));
            Some(precomputed)
        }
    };
    let predictor = Predictor::start(
        Arc::new(client),
        models,
        student,
        precomputed,
        schema,
        batching,
        service.metrics().clone(),
    )
    .context("starting the executor threads")?;
    service.set_predictor(predictor);
    service.spawn_reattacher(Duration::from_millis(200));
    tracing::info!(
        fanouts = ?config.fanouts.as_ref().map(|f| &f.0),
        "worker serving (fanouts: the sidecar's unless set, a subgraph-layout model's manifest's)"
    );
    Ok(())
}

/// The fanouts the worker asks for: a dense-layout model's are the
/// configured two, or the sidecar's default; a subgraph-layout model's the
/// configured ones, or its manifest's, one per hop of the model.
fn worker_fanouts(
    config: &WorkerConfig,
    manifest: &Manifest,
    schema: &protocol::FeatureSchema,
) -> anyhow::Result<Vec<u32>> {
    let configured = config.fanouts.as_ref().map(|f| f.0.clone());
    match manifest.layout {
        ModelLayout::Dense => match configured {
            None => Ok(schema.default_fanouts.to_vec()),
            Some(f) if f.len() == MAX_HOPS => Ok(f),
            Some(f) => bail!(
                "fanouts {f:?} has {} hops; the model {} reads the dense layout, which has two: \
                 give two fanouts such as 20,10",
                f.len(),
                config.model.display()
            ),
        },
        // Any number of hops the layout carries: a GCN, say, is exact with
        // one hop more than its layers (docs/model.md).
        ModelLayout::Subgraph => Ok(configured.unwrap_or_else(|| manifest.fanouts.clone())),
    }
}

/// `gnn-worker serve`'s start-up (daemon_kit::startup), on the main thread
/// before the runtime starts; then the worker on the runtime until the
/// first SIGTERM or SIGINT.
fn start_and_serve(
    args: ServeArgs,
    runtime: impl FnOnce() -> std::io::Result<tokio::runtime::Runtime>,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let print_config = args.print_config;
    let Some(started) = daemon_kit::startup::start(
        move || load_config(&args),
        print_config,
        move || {
            let _ = stop_tx.send(true);
        },
    )?
    else {
        return Ok(());
    };
    let runtime = runtime().context("starting the runtime")?;
    runtime.block_on(serve(started.config, stop_rx))
}

/// gRPC server reflection (v1, and v1alpha for older grpcurl) over the
/// worker's API and `grpc.health.v1`.
fn reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(gnn_worker::grpc::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((
        builder().build_v1().context("building gRPC reflection")?,
        builder()
            .build_v1alpha()
            .context("building gRPC reflection")?,
    ))
}

async fn serve(
    config: WorkerConfig,
    mut signalled: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    #[cfg(not(feature = "failpoints"))]
    if std::env::var_os("FAILPOINTS").is_some() {
        bail!(
            "FAILPOINTS is set but this gnn-worker was built without failpoints (they exist in \
             the test suite's builds only): unset it"
        );
    }

    // The front ends first: probes answer (not ready, and why) meanwhile.
    let service = Service::new();
    service.set_waiting("loading the model");
    let grpc = tokio::net::TcpListener::bind(config.grpc)
        .await
        .with_context(|| {
            format!(
                "binding gRPC on {}: choose another grpc address",
                config.grpc
            )
        })?;
    let http = tokio::net::TcpListener::bind(config.http)
        .await
        .with_context(|| {
            format!(
                "binding HTTP on {}: choose another http address",
                config.http
            )
        })?;
    tracing::info!(
        grpc = %grpc.local_addr()?,
        http = %http.local_addr()?,
        tls = config.tls_cert.is_some(),
        client_certificates = config.tls_client_ca.is_some(),
        "listening"
    );
    // Plaintext probes and scrapes beside TLS front ends.
    let _health = match config.health_addr {
        Some(addr) => Some(daemon_kit::endpoint::serve(
            addr,
            "health_addr",
            std::sync::Arc::new(service.clone()),
            &tokio::runtime::Handle::current(),
        )?),
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut grpc_stop = stop_rx.clone();
    let http_stop = stop_rx;
    // Both ports bound their connections (docs/serving.md, "Connections").
    let grpc_incoming = gnn_worker::grpc_connections::guarded_incoming(
        grpc,
        config.max_connections,
        Duration::from_secs_f64(config.http_read_timeout_s),
        gnn_worker::tls::acceptor(&config, gnn_worker::tls::Alpn::H2)?,
        service.metrics().clone(),
    );
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    let grpc_server = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            gnn_worker::grpc::invalid_argument_for_undecodable,
        ))
        .add_service(PredictorServer::new(PredictService::new(service.clone())))
        .add_service(gnn_worker::health::HealthService::server(service.clone()))
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(grpc_incoming, async move {
            let _ = grpc_stop.wait_for(|s| *s).await;
        });
    let http_server = gnn_worker::http_server::serve(
        http,
        gnn_worker::http::router(service.clone()),
        gnn_worker::http_server::HttpLimits {
            read_timeout: Duration::from_secs_f64(config.http_read_timeout_s),
            max_connections: config.max_connections,
        },
        gnn_worker::tls::acceptor(&config, gnn_worker::tls::Alpn::Http11)?,
        service.metrics().clone(),
        http_stop,
    );
    let grpc_task = tokio::spawn(grpc_server);
    let http_task = tokio::spawn(http_server);

    let signalled = async move {
        let _ = signalled.wait_for(|s| *s).await;
        anyhow::Ok(())
    };
    tokio::pin!(signalled);
    let outcome = tokio::select! {
        s = &mut signalled => s,
        started = start(&config, &service) => match started {
            Ok(()) => (&mut signalled).await,
            Err(e) => Err(e),
        },
    };
    if outcome.is_ok() && !config.shutdown_delay().is_zero() {
        service.set_stopping();
        tracing::info!(
            seconds = config.shutdown_delay_s,
            "not ready; serving until the shutdown delay ends"
        );
        tokio::time::sleep(config.shutdown_delay()).await;
    }
    let _ = stop_tx.send(true);
    grpc_task.await?.context("gRPC server")?;
    http_task.await?.context("HTTP server")?;
    outcome
}

async fn predict(
    addr: String,
    ids: Vec<u64>,
    json: bool,
    new_node: NewNodeArgs,
) -> anyhow::Result<()> {
    let new_node = match new_node.new_node {
        None => None,
        Some(id) => Some(pb::NewNode {
            id,
            features: daemon_kit::row::feature_row(
                new_node.features.as_deref(),
                new_node.features_file.as_deref(),
            )
            .map_err(anyhow::Error::msg)?,
            neighbors: new_node.edges,
            directed: new_node.directed,
        }),
    };
    let mut client = PredictorClient::connect(addr.clone())
        .await
        .with_context(|| format!("connecting to {addr}: is `gnn-worker serve` running there?"))?;
    let response = client
        .predict(pb::PredictRequest {
            node_ids: ids,
            request_id: 0,
            new_node,
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?
        .into_inner();
    for p in &response.predictions {
        if json {
            println!(
                "{}",
                serde_json::json!({"node_id": p.node_id, "label": p.label, "logits": p.logits,
                    "embedding": p.embedding, "known": p.known,
                    "fallback_rows": p.fallback_rows, "answered_by": p.answered_by})
            );
        } else {
            let answer = if p.embedding.is_empty() {
                format!("label {:>3}", p.label)
            } else {
                format!("embedding of {} values", p.embedding.len())
            };
            println!(
                "node {:>8}  {answer}{}{}{}",
                p.node_id,
                match p.answered_by.as_str() {
                    "student" => "  (by the student)",
                    "precomputed" => "  (precomputed)",
                    _ => "",
                },
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
