//! `sidecarctl`: the operator's command line for a running sidecar, over its
//! admin Unix socket (see `protocol::admin` for the frames).
//!
//! ```text
//! sidecarctl --socket <path> status [--json]
//! sidecarctl --socket <path> add-node <id> --features 0.1,0.2,... | --features-file row.f32
//!            [--edge <neighbour>]... [--directed]
//! sidecarctl --socket <path> invalidate <id>...
//! sidecarctl --socket <path> shutdown
//! ```
#![forbid(unsafe_code)]

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use protocol::admin::{
    read_frame, write_frame, AdminRequest, AdminResponse, NewNode, ADMIN_VERSION,
};

/// Operate a running sidecar over its admin socket.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The sidecar's --admin-socket.
    #[arg(long)]
    socket: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Readiness, graph and counters.
    Status,
    /// Add a node with its feature row and edges, while serving.
    AddNode {
        id: u64,
        /// The feature row, comma separated.
        #[arg(long, conflicts_with = "features_file")]
        features: Option<String>,
        /// The feature row as raw little-endian f32.
        #[arg(long)]
        features_file: Option<PathBuf>,
        /// A neighbour (repeat for several).
        #[arg(long = "edge")]
        edges: Vec<u64>,
        /// Add only id -> neighbour, not the reverse edges.
        #[arg(long)]
        directed: bool,
    },
    /// Evict rows from the sidecar's caches.
    Invalidate { ids: Vec<u64> },
    /// Drain and stop the sidecar.
    Shutdown,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecarctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let request = match cli.command {
        Command::Status => AdminRequest::Status,
        Command::AddNode {
            id,
            features,
            features_file,
            edges,
            directed,
        } => {
            let features = match (features, features_file) {
                (Some(text), None) => text
                    .split(',')
                    .map(|v| {
                        v.trim()
                            .parse::<f32>()
                            .with_context(|| format!("{v:?} in --features is not a number"))
                    })
                    .collect::<anyhow::Result<Vec<f32>>>()?,
                (None, Some(path)) => {
                    let bytes = std::fs::read(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    if bytes.len() % 4 != 0 {
                        bail!("{} is not a whole number of f32 values", path.display());
                    }
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect()
                }
                _ => bail!("give the feature row with --features or --features-file"),
            };
            AdminRequest::AddNodes {
                nodes: vec![NewNode { id, features }],
                edges: edges.into_iter().map(|n| (id, n)).collect(),
                undirected: !directed,
            }
        }
        Command::Invalidate { ids } => AdminRequest::Invalidate { ids },
        Command::Shutdown => AdminRequest::Shutdown,
    };
    let stream = UnixStream::connect(&cli.socket).with_context(|| {
        format!(
            "connecting to {}: is the sidecar running with --admin-socket {}?",
            cli.socket.display(),
            cli.socket.display()
        )
    })?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    write_frame(
        &mut writer,
        &AdminRequest::Hello {
            version: ADMIN_VERSION,
        },
    )?;
    match read_frame::<AdminResponse>(&mut reader)? {
        AdminResponse::Hello { .. } => {}
        AdminResponse::Error { message } => bail!("{message}"),
        other => bail!("unexpected handshake answer {other:?}"),
    }
    write_frame(&mut writer, &request)?;
    let response: AdminResponse = read_frame(&mut reader)?;
    print(&response, cli.json)
}

fn print(response: &AdminResponse, json: bool) -> anyhow::Result<()> {
    match response {
        AdminResponse::Error { message } => bail!("{message}"),
        AdminResponse::Status(s) if !json => {
            println!("segment           {}", s.shm_name);
            println!("ready             {}", s.ready);
            println!("uptime            {:.1} s", s.uptime_s);
            println!("feature dim       {}", s.feature_dim);
            println!("graph version     {}", s.graph_version);
            println!("nodes / edges     {} / {}", s.n_nodes, s.n_edges);
            println!("graph generation  {}", s.graph_generation);
            for (name, value) in &s.counters {
                println!("{name:<17} {value}");
            }
        }
        AdminResponse::Status(s) => {
            let counters: serde_json::Map<String, serde_json::Value> = s
                .counters
                .iter()
                .map(|(k, v)| (k.clone(), (*v).into()))
                .collect();
            println!(
                "{}",
                serde_json::json!({
                    "shm_name": s.shm_name, "ready": s.ready, "uptime_s": s.uptime_s,
                    "feature_dim": s.feature_dim, "graph_version": s.graph_version,
                    "n_nodes": s.n_nodes, "n_edges": s.n_edges,
                    "graph_generation": s.graph_generation, "counters": counters,
                })
            );
        }
        AdminResponse::Updated {
            nodes_added,
            edges_added,
            n_nodes,
            generation,
        } => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"nodes_added": nodes_added, "edges_added": edges_added,
                        "n_nodes": n_nodes, "generation": generation})
                );
            } else {
                println!(
                    "added {nodes_added} node(s), {edges_added} edge(s); {n_nodes} nodes, \
                     generation {generation}"
                );
            }
        }
        AdminResponse::Invalidated { ids } => println!("invalidated {ids} id(s)"),
        AdminResponse::ShuttingDown => println!("sidecar is draining and stopping"),
        AdminResponse::Hello { .. } => bail!("unexpected Hello"),
    }
    Ok(())
}
