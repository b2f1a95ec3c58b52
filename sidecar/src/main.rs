//! `sidecar`: the feature-prefetching daemon's command line.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;

use clap::{Parser, Subcommand};
use sidecar::features::import;
use sidecar::features::redis_tier::RedisConfig;
use sidecar::graph::{dataset, generate};
use sidecar::serve::{self, ServeConfig};

/// The feature-prefetching sidecar for GNN serving.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build the graph index from a dataset directory (the ../shared/data
    /// layout) or a text edge list (`src dst` per line, `#` comments).
    Import {
        /// Dataset directory or text edge list.
        input: PathBuf,
        /// Where the sidecar keeps its index (graph.csr).
        #[arg(long)]
        data_dir: PathBuf,
        /// Add the reverse of every edge of a text edge list.
        #[arg(long)]
        undirected: bool,
        /// Version stamped into the index; a model declares the version it
        /// was trained on.
        #[arg(long, default_value_t = 1)]
        graph_version: u64,
        /// Load the features into Redis (redis://[:password@]host:port)
        /// instead of the embedded RocksDB store in --data-dir.
        #[arg(long)]
        redis: Vec<String>,
        /// The --redis URLs are nodes of a Redis Cluster.
        #[arg(long)]
        redis_cluster: bool,
        /// Redis key prefix: keys are <prefix><node id>.
        #[arg(long, default_value = sidecar::features::contract::DEFAULT_PREFIX)]
        redis_prefix: String,
        /// PEM CA certificate for rediss:// servers signed by a private CA.
        #[arg(long)]
        redis_ca: Option<PathBuf>,
    },
    /// Serve the shared-memory ring: sample, fetch features through the
    /// tiers, answer in place. Stops cleanly on SIGTERM/SIGINT or
    /// `sidecarctl shutdown`.
    Serve(ServeArgs),
    /// Write a seeded synthetic power-law graph (R-MAT, optional super nodes)
    /// as a dataset directory that `sidecar import` reads.
    Generate {
        /// Output dataset directory (edges.u32, meta.json).
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        nodes: u64,
        /// R-MAT edges; super-node edges come on top.
        #[arg(long)]
        edges: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Super nodes (ids 0..K) with --super-degree distinct neighbours each.
        #[arg(long, default_value_t = 0)]
        super_nodes: u64,
        #[arg(long, default_value_t = 0)]
        super_degree: u64,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The directory `sidecar import` wrote (graph.csr, features).
    #[arg(long)]
    data_dir: PathBuf,
    /// Name of the shared-memory segment under /dev/shm.
    #[arg(long, default_value = "gnn-sidecar")]
    shm_name: String,
    /// Segment file mode, octal (0600; 0660 when the containers share a group).
    #[arg(long, default_value = "600", value_parser = parse_octal)]
    shm_mode: u32,
    /// Redis URL(s) of the feature store (when imported with --redis).
    #[arg(long)]
    redis: Vec<String>,
    #[arg(long)]
    redis_cluster: bool,
    #[arg(long)]
    redis_ca: Option<PathBuf>,
    /// Redis pub/sub channel of node ids to invalidate.
    #[arg(long)]
    invalidation_channel: Option<String>,
    /// Default fanouts per hop (used when a request leaves them at 0).
    #[arg(long, default_value = "20,10", value_parser = protocol::request::parse_fanouts)]
    fanouts: [u32; 2],
    /// Hard cap of each hop's fanout that a request may ask for.
    #[arg(long, default_value = "50,50", value_parser = protocol::request::parse_fanouts)]
    max_fanouts: [u32; 2],
    /// Ring slots (concurrent requests in flight).
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Most target ids per request.
    #[arg(long, default_value_t = 64)]
    max_targets: u32,
    /// Most node-table rows per response.
    #[arg(long, default_value_t = 65_536)]
    max_nodes: u32,
    /// Response area per slot, MiB (tmpfs pages are only allocated when used).
    #[arg(long, default_value_t = 8)]
    response_mib: u64,
    /// Feature fetch deadline when a request sets none, milliseconds.
    #[arg(long, default_value_t = 20)]
    deadline_ms: u64,
    /// L1 cache size, MiB of row data.
    #[arg(long, default_value_t = 256)]
    l1_mib: u64,
    /// Top-degree nodes pinned in L1 before the ring is created.
    #[arg(long, default_value_t = 10_000)]
    warm_up: usize,
    /// Row served for a missing or late feature row.
    #[arg(long, value_enum, default_value = "mean")]
    default_row: serve::DefaultRowKind,
    /// Admin Unix socket for sidecarctl.
    #[arg(long)]
    admin_socket: Option<PathBuf>,
    /// Seconds without a worker heartbeat before its slots are reclaimed.
    #[arg(long, default_value_t = 5.0)]
    client_timeout_s: f64,
    /// L2 RocksDB cache in front of Redis (default: <data-dir>/l2-cache);
    /// put it on local NVMe. Kept across restarts.
    #[arg(long)]
    l2_dir: Option<PathBuf>,
    /// Size bound of the L2 cache, MiB.
    #[arg(long, default_value_t = 4096)]
    l2_mib: u64,
    /// Seconds an L2 row is served before it is fetched from Redis again.
    #[arg(long, default_value_t = 3600)]
    l2_ttl_s: u64,
    /// No L2 cache: L1 misses go straight to Redis.
    #[arg(long, conflicts_with = "l2_dir")]
    no_l2: bool,
    /// Address of the Prometheus endpoint (GET /metrics, /healthz, /readyz),
    /// e.g. 0.0.0.0:9100.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Accepted for the documented command line; configuration comes from
    /// the flags for now.
    #[arg(long, hide = true)]
    config: Option<PathBuf>,
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal file mode such as 600"))
}

/// Blocks SIGTERM and SIGINT in every thread and turns them into a flag set
/// by one waiting thread (the serving loop polls it).
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block()?;
    let flag = Arc::new(AtomicBool::new(false));
    let for_thread = flag.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(signal) = set.wait() {
                tracing::info!(%signal, "stopping");
                for_thread.store(true, Ordering::Release);
            }
        })?;
    Ok(flag)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecar: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Import {
            input,
            data_dir,
            undirected,
            graph_version,
            redis,
            redis_cluster,
            redis_prefix,
            redis_ca,
        } => {
            let stats = dataset::import_graph(&input, &data_dir, undirected, graph_version)?;
            println!(
                "graph index {}: {} nodes, {} edges ({} duplicates and {} self loops dropped) \
                 in {:.2} s ({:.1} M input edges/s)",
                data_dir.join(dataset::INDEX_FILE).display(),
                stats.n_nodes,
                stats.n_edges,
                stats.duplicates_dropped,
                stats.self_loops_dropped,
                stats.seconds,
                stats.input_edges as f64 / stats.seconds / 1e6
            );
            let features = input.join("features.f32");
            if !input.is_dir() || !features.is_file() {
                println!("no features.f32 in {}: graph only", input.display());
                return Ok(());
            }
            let meta = dataset::DatasetMeta::read(&input)?;
            let dim = meta.feature_dim.ok_or_else(|| {
                anyhow::anyhow!("{}/meta.json has no feature_dim", input.display())
            })?;
            let done = if redis.is_empty() {
                import::import_to_rocksdb(&features, meta.num_nodes, dim, &data_dir)?
            } else {
                let config = RedisConfig {
                    urls: redis,
                    cluster: redis_cluster,
                    prefix: redis_prefix,
                    ca_file: redis_ca,
                    ..RedisConfig::single("")
                };
                tokio::runtime::Runtime::new()?.block_on(import::import_to_redis(
                    &features,
                    meta.num_nodes,
                    dim,
                    &data_dir,
                    &config,
                ))?
            };
            println!(
                "features: {} rows of {} f32 into {} in {:.2} s",
                done.rows, done.feature_dim, done.destination, done.seconds
            );
            Ok(())
        }
        Command::Serve(args) => {
            ensure!(
                args.config.is_none(),
                "--config is not supported yet: pass the settings as flags (sidecar serve --help)"
            );
            let stop = stop_on_signals()?;
            let l2_cache = (!args.no_l2).then(|| {
                let default = serve::L2CacheConfig::in_data_dir(&args.data_dir);
                serve::L2CacheConfig {
                    path: args.l2_dir.unwrap_or(default.path),
                    max_bytes: args.l2_mib << 20,
                    ttl: Duration::from_secs(args.l2_ttl_s.max(1)),
                }
            });
            let config = ServeConfig {
                l2_cache,
                metrics_addr: args.metrics_addr,
                shm_mode: args.shm_mode,
                redis: args.redis,
                redis_cluster: args.redis_cluster,
                redis_ca: args.redis_ca,
                invalidation_channel: args.invalidation_channel,
                fanouts: args.fanouts,
                max_fanouts: args.max_fanouts,
                slots: args.slots,
                max_targets: args.max_targets,
                max_nodes: args.max_nodes,
                response_bytes: args.response_mib << 20,
                deadline: Duration::from_millis(args.deadline_ms),
                l1_bytes: args.l1_mib << 20,
                warm_up: args.warm_up,
                default_row: args.default_row,
                admin_socket: args.admin_socket,
                client_timeout: Duration::from_secs_f64(args.client_timeout_s),
                ..ServeConfig::new(args.data_dir, args.shm_name)
            };
            serve::run(config, Some(stop))
        }
        Command::Generate {
            out,
            nodes,
            edges,
            seed,
            super_nodes,
            super_degree,
        } => {
            let options = generate::GenerateOptions {
                nodes,
                edges,
                seed,
                super_nodes,
                super_degree,
            };
            let done = generate::generate(&options, &out)?;
            println!(
                "dataset {}: {} nodes, {} edges in {:.2} s",
                out.display(),
                nodes,
                done.edges_written,
                done.seconds
            );
            Ok(())
        }
    }
}
