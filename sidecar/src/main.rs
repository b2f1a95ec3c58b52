//! `sidecar`: the feature-prefetching daemon's command line.
#![forbid(unsafe_code)]

use clap::Parser;

/// The feature-prefetching sidecar for GNN serving.
///
/// This build carries the shared-memory ring protocol only; the `import` and
/// `serve` commands are added with the graph index and the feature tiers.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    println!(
        "sidecar {} (ring layout v{}): no command is available in this build yet; see README.md",
        env!("CARGO_PKG_VERSION"),
        protocol::LAYOUT_VERSION
    );
}
