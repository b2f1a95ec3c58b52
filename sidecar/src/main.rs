//! `sidecar`: the feature-prefetching daemon's command line.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sidecar::features::import;
use sidecar::features::redis_tier::RedisConfig;
use sidecar::graph::{dataset, generate};

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
