//! `sidecar`: the feature-prefetching daemon's command line.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use daemon_kit::config::{ConfigError, Layered};
use sidecar::config::{ServeConfig, ServeFlags, SPEC};
use sidecar::features::import;
use sidecar::features::redis_tier::RedisConfig;
use sidecar::graph::{dataset, generate, typed};
use sidecar::serve;

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
    /// tiers, answer in place. Stops cleanly (drained) on SIGTERM/SIGINT or
    /// `sidecarctl shutdown`; SIGHUP re-reads log_level.
    Serve(Box<ServeArgs>),
    /// Append operations to the update stream every replica follows
    /// (docs/updates.md): one given here, or one per line of --file.
    /// Rows go to the feature store first when the features live in Redis.
    ///
    /// Operations: `add-node ID [NEIGHBOR...] [row=V,V,...|row-file=PATH]
    /// [directed]`, `add-edges SRC DST [SRC DST...] [directed]`,
    /// `set-features ID row=V,V,...|row-file=PATH`, `invalidate ID [ID...]`.
    Publish {
        /// The stream's Redis (repeat for a cluster's nodes).
        #[arg(long, required = true)]
        redis: Vec<String>,
        /// The --redis URLs are nodes of a Redis Cluster.
        #[arg(long)]
        redis_cluster: bool,
        /// PEM CA certificate for rediss:// servers signed by a private CA.
        #[arg(long)]
        redis_ca: Option<PathBuf>,
        /// The stream's key.
        #[arg(long, default_value = sidecar::updates::DEFAULT_STREAM)]
        stream: String,
        /// A data directory `sidecar import` wrote: its features.json gives
        /// the row size and whether rows go to Redis first.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// A file of operations, one per line (`#` comments).
        #[arg(long)]
        file: Option<PathBuf>,
        /// One operation (see above), when no --file.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        op: Vec<String>,
    },
    /// Write a seeded synthetic power-law graph (R-MAT, optional super nodes)
    /// as a dataset directory that `sidecar import` reads.
    Generate {
        /// Output dataset directory (edges.u32, meta.json, and features.f32
        /// with --feature-dim).
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
        /// Also write seeded features (`features.f32`, uniform in [0, 1))
        /// of this many values per node.
        #[arg(long, default_value_t = 0)]
        feature_dim: u32,
        /// Also write labels of this many classes (`labels.i32`, learnable
        /// from the features) and a split (`split.u8`), for the model
        /// tooling to train on; needs --feature-dim.
        #[arg(long, default_value_t = 0)]
        classes: u32,
        /// Write a typed dataset instead: --nodes users and this many
        /// items, --edges user-item interactions and their reverse type
        /// (docs/graph-index.md).
        #[arg(long)]
        items: Option<u64>,
        /// Typed: user-user follows drawn (0: no follows edge type).
        #[arg(long, default_value_t = 0)]
        follows: u64,
        /// Typed: features per item (0: items have none; --feature-dim is
        /// the users').
        #[arg(long, default_value_t = 0)]
        item_feature_dim: u32,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// TOML file of settings (keys: docs/configuration.md); also
    /// $SIDECAR_CONFIG. Precedence: flags > SIDECAR_* variables > file >
    /// defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the effective configuration (passwords redacted, each key's
    /// source noted) and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    flags: ServeFlags,
}

fn main() -> ExitCode {
    let cli: Cli = daemon_kit::cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        daemon_kit::logging::init_for_command();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecar: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Loads the layered configuration of `sidecar serve`.
fn load_config(args: &ServeArgs) -> Result<Layered<ServeConfig>, ConfigError> {
    Layered::load_for_command(SPEC, args.config.as_deref(), &args.flags)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let events = serve::Events::default();
    let on_stop = {
        let poster = events.poster();
        move || poster.post(serve::Event::Stop)
    };
    let print_config = args.print_config;
    let Some(started) =
        daemon_kit::startup::start(move || load_config(&args), print_config, on_stop, || {})?
    else {
        return Ok(());
    };
    serve::run(started.config, Some(started.log), events)
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
            let typed = typed::is_typed_dataset(&input);
            if typed && undirected {
                anyhow::bail!(
                    "{} is a typed dataset: leave out --undirected (a relation's reverse is an \
                     edge type of its own)",
                    input.display()
                );
            }
            let typed_features = if typed {
                typed::feature_files(&input)?
            } else {
                Vec::new()
            };
            let redis_config = (!redis.is_empty()).then(|| RedisConfig {
                urls: redis,
                cluster: redis_cluster,
                prefix: redis_prefix,
                ca_file: redis_ca,
                ..RedisConfig::single("")
            });
            // Refused while a sidecar serves (or imports into) this directory.
            std::fs::create_dir_all(&data_dir)
                .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
            let _lock = sidecar::data_dir::DataDirLock::acquire(&data_dir)?;
            if typed {
                let done = typed::import_typed(&input, &data_dir, graph_version)?;
                for (edge_type, stats) in done.schema.edge_types.iter().zip(&done.edge_types) {
                    println!("edge type {}: {}", edge_type.key(), stats.edges_summary());
                }
                println!(
                    "typed graph index {}: {} node types, {} edge types in {:.2} s",
                    data_dir.join(typed::TYPED_DIR).display(),
                    done.schema.node_types.len(),
                    done.schema.edge_types.len(),
                    done.seconds
                );
                for features in &typed_features {
                    let dir = typed::feature_dir(&data_dir, &features.node_type);
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    let (n, dim) = (features.num_nodes, features.feature_dim);
                    let done = match &redis_config {
                        None => import::import_to_rocksdb(&features.file, n, dim, &dir)?,
                        Some(config) => {
                            let config = RedisConfig {
                                prefix: typed::redis_prefix(&config.prefix, &features.node_type),
                                ..config.clone()
                            };
                            tokio::runtime::Runtime::new()?.block_on(import::import_to_redis(
                                &features.file,
                                n,
                                dim,
                                &dir,
                                &config,
                            ))?
                        }
                    };
                    println!(
                        "features of {}: {} rows of {} f32 into {} in {:.2} s",
                        features.node_type,
                        done.rows,
                        done.feature_dim,
                        done.destination,
                        done.seconds
                    );
                }
                return Ok(());
            }
            let stats = dataset::import_graph(&input, &data_dir, undirected, graph_version)?;
            println!(
                "graph index {}: {} nodes, {} in {:.2} s ({:.1} M input edges/s)",
                data_dir.join(dataset::INDEX_FILE).display(),
                stats.n_nodes,
                stats.edges_summary(),
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
            let done = match &redis_config {
                None => import::import_to_rocksdb(&features, meta.num_nodes, dim, &data_dir)?,
                Some(config) => tokio::runtime::Runtime::new()?.block_on(
                    import::import_to_redis(&features, meta.num_nodes, dim, &data_dir, config),
                )?,
            };
            println!(
                "features: {} rows of {} f32 into {} in {:.2} s",
                done.rows, done.feature_dim, done.destination, done.seconds
            );
            if done.rows == 0 {
                println!(
                    "features: the dataset has no rows: the store is empty, and `sidecar serve` \
                     will answer every node with the default row (flagged fallback) until rows \
                     are added (`sidecarctl graph add-node`, an update stream)"
                );
            }
            Ok(())
        }
        Command::Serve(args) => serve(*args),
        Command::Publish {
            redis,
            redis_cluster,
            redis_ca,
            stream,
            data_dir,
            file,
            op,
        } => {
            use sidecar::updates::publish::{self, Entry};
            let config = RedisConfig {
                urls: redis,
                cluster: redis_cluster,
                ca_file: redis_ca,
                ..RedisConfig::single("")
            };
            let target = publish::PublishTarget::new(config, &stream, data_dir.as_deref())?;
            let ops = match (file, op.is_empty()) {
                (Some(file), true) => publish::read_ops(&file, &target)?,
                (None, false) => {
                    let words: Vec<&str> = op.iter().map(String::as_str).collect();
                    vec![Entry::from_words(&words, target.feature_dim())
                        .map_err(anyhow::Error::msg)?]
                }
                (Some(_), false) => anyhow::bail!("give --file or one operation, not both"),
                (None, true) => anyhow::bail!(
                    "nothing to publish: give one operation (e.g. `add-edges 1 2`) or --file"
                ),
            };
            let last = tokio::runtime::Runtime::new()?.block_on(publish::publish(&target, &ops))?;
            println!(
                "appended {} operation(s) to {stream}; last entry {}",
                ops.len(),
                last.unwrap_or_else(|| "none".into())
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
            feature_dim,
            classes,
            items,
            follows,
            item_feature_dim,
        } => {
            anyhow::ensure!(
                items.is_some() || (follows == 0 && item_feature_dim == 0),
                "--follows and --item-feature-dim are for a typed graph: give --items too"
            );
            let options = generate::GenerateOptions {
                nodes,
                edges,
                seed,
                super_nodes,
                super_degree,
                feature_dim,
                classes,
                items: items.map(|count| generate::Items {
                    count,
                    feature_dim: item_feature_dim,
                    follows,
                }),
            };
            let done = generate::generate(&options, &out)?;
            let nodes = match items {
                Some(items) => format!(
                    "typed dataset {}: {nodes} users, {items} items",
                    out.display()
                ),
                None => format!("dataset {}: {nodes} nodes", out.display()),
            };
            println!(
                "{nodes}, {} edges in {:.2} s",
                done.edges_written, done.seconds
            );
            Ok(())
        }
    }
}
