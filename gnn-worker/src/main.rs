//! `gnn-worker`: the model worker's command line.
#![forbid(unsafe_code)]

use clap::Parser;

/// The GNN model worker.
///
/// This build carries the shared-memory ring client only; `serve` and
/// `predict` are added with the model runtime.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    println!(
        "gnn-worker {} (ring layout v{}): no command is available in this build yet; see README.md",
        env!("CARGO_PKG_VERSION"),
        protocol::LAYOUT_VERSION
    );
}
