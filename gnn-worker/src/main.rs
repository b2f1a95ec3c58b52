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
//! SIGHUP re-reads `log_level` and rolls out the model directory's model
//! (docs/operations.md, "Rolling out a model").
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use daemon_kit::config::{ConfigError, Layered};
use gnn_worker::api::grpc::{pb, PredictService, PredictorClient, PredictorServer};
use gnn_worker::config::{WorkerConfig, WorkerFlags, SPEC};
use gnn_worker::rollout::Loader;
use gnn_worker::service::Service;
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
        #[arg(long, allow_hyphen_values = true)]
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
    /// A typed graph's new node: edges of one edge type as
    /// `EDGE_TYPE=SRC,DST,...` (repeat for several edge types).
    #[arg(long = "typed-edges", requires = "new_node", conflicts_with_all = ["edges", "directed"])]
    typed_edges: Vec<String>,
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
        let mut options = ClientOptions::default();
        options.wait.spin = config.ring_spin_us.fixed().into();
        match tokio::task::spawn_blocking(move || RingClient::attach(&name, options)).await? {
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
/// installs the predictor; then watches for a new model
/// (`gnn_worker::rollout`).
async fn start(
    config: &WorkerConfig,
    service: &Service,
    reloads: tokio::sync::watch::Receiver<u64>,
) -> anyhow::Result<()> {
    let loader = {
        let config = config.clone();
        Arc::new(tokio::task::spawn_blocking(move || Loader::new(config)).await??)
    };
    let loaded = {
        let loader = loader.clone();
        tokio::task::spawn_blocking(move || loader.load()).await??
    };
    service.set_model(loaded.identity().clone());
    let serving = gnn_worker::rollout::serving_key(&loaded);
    service.set_waiting(format!("no sidecar on /dev/shm/{} yet", config.shm_name));
    let client = Arc::new(attach(config, service).await?);
    let predictor = loader.install(loaded, client, service)?;
    service.set_predictor(predictor);
    service.spawn_reattacher(Duration::from_millis(200));
    tokio::spawn(gnn_worker::rollout::watch(
        loader,
        service.clone(),
        serving,
        config.model_watch(),
        reloads,
    ));
    tracing::info!("worker serving");
    Ok(())
}

/// `gnn-worker serve`'s start-up (daemon_kit::startup), on the main thread
/// before the runtime starts; then the worker on the runtime until the
/// first SIGTERM or SIGINT.
fn start_and_serve(
    args: ServeArgs,
    runtime: impl FnOnce() -> std::io::Result<tokio::runtime::Runtime>,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // SIGHUP also rolls out the model directory's model (docs/operations.md).
    let (reload_tx, reload_rx) = tokio::sync::watch::channel(0u64);
    let print_config = args.print_config;
    let Some(started) = daemon_kit::startup::start(
        move || load_config(&args),
        print_config,
        move || {
            let _ = stop_tx.send(true);
        },
        move || reload_tx.send_modify(|n| *n += 1),
    )?
    else {
        return Ok(());
    };
    let runtime = runtime().context("starting the runtime")?;
    runtime.block_on(serve(started.config, stop_rx, reload_rx))
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
            .register_encoded_file_descriptor_set(gnn_worker::api::grpc::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(gnn_worker::api::v2::grpc::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((
        builder().build_v1().context("building gRPC reflection")?,
        builder()
            .build_v1alpha()
            .context("building gRPC reflection")?,
    ))
}

/// Client-reset streams not yet taken by the server that a gRPC connection
/// may hold before h2 closes it (h2's default: 20).
const GRPC_MAX_PENDING_ACCEPT_RESETS: usize = 4096;
/// The gRPC connection's flow-control window (hyper's default: 1 MiB).
const GRPC_CONNECTION_WINDOW: u32 = 4 << 20;
/// A gRPC stream's flow-control window (hyper's default: 1 MiB). With the
/// connection's, it keeps a stream's unread burst within HTTP/2's budget
/// of small frames (half the connection window, 2 MiB): 64 KiB of frames
/// of 8 bytes or more (a gRPC message with at least one id) cost under
/// 2 MiB of framing, so such a burst is never cut however it is written.
const GRPC_STREAM_WINDOW: u32 = 64 << 10;

async fn serve(
    config: WorkerConfig,
    mut signalled: tokio::sync::watch::Receiver<bool>,
    reloads: tokio::sync::watch::Receiver<u64>,
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
    let grpc_incoming = gnn_worker::api::grpc_connections::guarded_incoming(
        grpc,
        config.max_connections,
        Duration::from_secs_f64(config.http_read_timeout_s),
        gnn_worker::api::tls::acceptor(&config, gnn_worker::api::tls::Alpn::H2)?,
        service.metrics().clone(),
    );
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    let grpc_server = tonic::transport::Server::builder()
        // Streams reset by their client before the server took them (calls
        // whose client gave up while the worker was busy) end only those
        // calls: h2's default of 20 closes the whole connection with
        // GOAWAY "too_many_resets", failing the client's other calls.
        .http2_max_pending_accept_reset_streams(Some(GRPC_MAX_PENDING_ACCEPT_RESETS))
        // A window of this size per connection gives HTTP/2's budget of
        // unread small DATA frames (half the window) room for a stream's
        // burst written one message per frame (docs/serving.md, "Streams").
        .initial_connection_window_size(GRPC_CONNECTION_WINDOW)
        .initial_stream_window_size(GRPC_STREAM_WINDOW)
        .layer(gnn_worker::api::grpc_connections::ActivityLayer)
        .layer(tower::util::MapResponseLayer::new(
            gnn_worker::api::grpc::invalid_argument_for_undecodable,
        ))
        .add_service(PredictorServer::new(PredictService::new(service.clone())))
        .add_service(gnn_worker::api::v2::grpc::InferenceService::server(
            service.clone(),
        ))
        .add_service(gnn_worker::api::health::HealthService::server(
            service.clone(),
        ))
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(grpc_incoming, async move {
            let _ = grpc_stop.wait_for(|s| *s).await;
        });
    let http_server = gnn_worker::api::http_server::serve(
        http,
        gnn_worker::api::http::router(service.clone()),
        gnn_worker::api::http_server::HttpLimits {
            read_timeout: Duration::from_secs_f64(config.http_read_timeout_s),
            max_connections: config.max_connections,
        },
        gnn_worker::api::tls::acceptor(&config, gnn_worker::api::tls::Alpn::Http11)?,
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
        started = start(&config, &service, reloads) => match started {
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

/// `EDGE_TYPE=SRC,DST,...`: the new node's edges of one edge type.
fn edge_list(spec: &str) -> anyhow::Result<pb::EdgeList> {
    let (edge_type, list) = spec
        .split_once('=')
        .with_context(|| format!("--typed-edges {spec:?}: write EDGE_TYPE=SRC,DST,..."))?;
    let ids: Vec<u64> = list
        .split(',')
        .map(|t| {
            t.trim()
                .parse()
                .with_context(|| format!("--typed-edges {edge_type}: {t:?} is not a node id"))
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        !ids.is_empty() && ids.len().is_multiple_of(2),
        "--typed-edges {edge_type}: give SRC,DST pairs"
    );
    Ok(pb::EdgeList {
        edge_type: edge_type.to_string(),
        src: ids.iter().step_by(2).copied().collect(),
        dst: ids.iter().skip(1).step_by(2).copied().collect(),
    })
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
            edges: new_node
                .typed_edges
                .iter()
                .map(|spec| edge_list(spec))
                .collect::<anyhow::Result<_>>()?,
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
                    "fallback_rows": p.fallback_rows, "answered_by": p.answered_by,
                    "degraded": p.degraded})
            );
        } else {
            let answer = if p.embedding.is_empty() {
                format!("label {:>3}", p.label)
            } else {
                format!("embedding of {} values", p.embedding.len())
            };
            println!(
                "node {:>8}  {answer}{}{}{}{}",
                p.node_id,
                if p.degraded { "  DEGRADED" } else { "" },
                match p.answered_by.as_str() {
                    "gnn" => "",
                    "precomputed" => "  (precomputed)",
                    other => match other {
                        "student" => "  (by the student)",
                        "gnn_reduced" => "  (by the GNN at reduced fanouts)",
                        _ => "  (a stored answer, unchecked)",
                    },
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
