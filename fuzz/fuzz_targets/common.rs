//! Shared by the fuzz targets: a scratch directory of this process.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

/// A directory of this fuzzing process (under the system temp directory),
/// for decoders that read files.
pub fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gnn-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

/// The typed graph of docs/protocol.md's appendix (users with 2 features,
/// items without; bought), for the decoders of typed requests and
/// responses.
pub fn typed_graph() -> protocol::graph_schema::GraphSchema {
    protocol::graph_schema::GraphSchema::of(
        &[("user", 2), ("item", 0)],
        &[(0, "buys", 1), (1, "rev_buys", 0)],
    )
}
