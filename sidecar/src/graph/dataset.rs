//! Inputs of `sidecar import`: a dataset directory in the shared layout
//! (`edges.u32`, `meta.json`, `features.f32`, ...) or a text edge list.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::graph::build::{self, BuildOptions, BuildStats, EdgeDataSpec, EdgeFile};

/// The fields of a dataset's `meta.json` the sidecar uses.
#[derive(Debug, Clone, Deserialize)]
pub struct DatasetMeta {
    pub name: Option<String>,
    pub num_nodes: u64,
    pub num_edges: u64,
    pub feature_dim: Option<u32>,
    /// What the edges carry, if anything ([`EdgeDataSpec`], read by
    /// [`EdgeDataSpec::from_json`] so that its errors say where).
    #[serde(default)]
    pub edge_data: Option<serde_json::Value>,
}

impl DatasetMeta {
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("meta.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: expected num_nodes and num_edges", path.display()))
    }
}

/// File name of the graph index inside a data directory.
pub const INDEX_FILE: &str = "graph.csr";

/// Builds `<data_dir>/graph.csr` from a dataset directory or a text edge
/// list. A dataset's edges already hold both directions; `undirected` adds
/// reverses to a text list.
pub fn import_graph(
    input: &Path,
    data_dir: &Path,
    undirected: bool,
    graph_version: u64,
) -> anyhow::Result<BuildStats> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating data directory {}", data_dir.display()))?;
    let out = data_dir.join(INDEX_FILE);
    let options = BuildOptions {
        undirected,
        graph_version,
        ..BuildOptions::default()
    };
    if input.is_dir() {
        let edges_path = input.join("edges.u32");
        if crate::graph::typed::is_typed_dataset(input) {
            bail!(
                "{} is a typed dataset (meta.json lists node_types and edge_types): \
                 graph::typed::import_typed imports it, not as a one-type graph",
                input.display()
            );
        }
        if !edges_path.is_file() {
            bail!(
                "{} is a directory without edges.u32: give a dataset directory \
                 (edges.u32, meta.json) or a text edge list",
                input.display()
            );
        }
        let meta = DatasetMeta::read(input)?;
        let options = BuildOptions {
            edge_data: EdgeDataSpec::from_json(meta.edge_data.as_ref())
                .and_then(|spec| spec.files(input))
                .with_context(|| format!("{}/meta.json", input.display()))?,
            ..options
        };
        let edges = EdgeFile {
            path: edges_path,
            n_nodes: Some(meta.num_nodes),
        };
        let stats = build::build(&edges, &out, &options)?;
        if !undirected && stats.input_edges != meta.num_edges {
            bail!(
                "{}: meta.json says {} edges, edges.u32 holds {}",
                input.display(),
                meta.num_edges,
                stats.input_edges
            );
        }
        Ok(stats)
    } else if input.is_file() {
        let binary: PathBuf = data_dir.join("edges.import.tmp");
        let parsed = build::text_to_binary(input, &binary);
        let result = parsed.and_then(|_| {
            build::build(
                &EdgeFile {
                    path: binary.clone(),
                    n_nodes: None,
                },
                &out,
                &options,
            )
        });
        let _ = std::fs::remove_file(&binary);
        result
    } else {
        bail!("{} does not exist", input.display())
    }
}
