//! Inputs of `sidecar import`: a dataset directory in the shared layout
//! (`edges.u32`, `meta.json`, `features.f32`, ...) or a text edge list.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context};
use serde::Deserialize;

use crate::graph::build::{self, BuildOptions, BuildStats, EdgeDataFiles, EdgeFile};
use crate::graph::format::MAX_EDGE_ATTRS;

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

/// A dataset's `edge_data` (docs/graph-index.md, "Edge data"): the files
/// of what each edge carries, one row per edge in the edge file's order,
/// relative to the dataset directory. The same object in the one-type
/// layout's meta.json and in each edge type of a typed one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeDataSpec {
    /// `num_edges x attr_dim` little-endian f32, row-major.
    pub attrs: Option<PathBuf>,
    #[serde(default)]
    pub attr_dim: u32,
    /// The attributes' names, `attr_dim` of them (informational).
    pub attr_names: Option<Vec<String>>,
    /// `num_edges` little-endian f32.
    pub weight: Option<PathBuf>,
    /// `num_edges` little-endian i64 (the dataset's own unit; its meta.json
    /// says which).
    pub time: Option<PathBuf>,
    /// The unit of `time` (informational).
    pub time_unit: Option<String>,
}

impl EdgeDataSpec {
    /// Reads an `edge_data` object (absent: the edges carry nothing).
    pub fn from_json(value: Option<&serde_json::Value>) -> anyhow::Result<Self> {
        match value {
            None => Ok(Self::default()),
            Some(value) => Self::deserialize(value).context(
                "edge_data: an object of attrs, attr_dim, attr_names, weight, time and time_unit \
                 (docs/graph-index.md, \"Edge data\")",
            ),
        }
    }

    /// The files under `dir`, after the width agrees with the file's
    /// presence and the names with the width.
    pub fn files(&self, dir: &Path) -> anyhow::Result<EdgeDataFiles> {
        let attrs = match (&self.attrs, self.attr_dim) {
            (None, 0) => None,
            (Some(file), 1..=MAX_EDGE_ATTRS) => Some((dir.join(file), self.attr_dim)),
            (file, dim) => bail!(
                "edge_data has attr_dim {dim} and attrs {file:?}: attributes name their file \
                 and a width of 1 to {MAX_EDGE_ATTRS}; edges without attributes have neither"
            ),
        };
        if let Some(names) = &self.attr_names {
            ensure!(
                names.len() == self.attr_dim as usize,
                "edge_data lists {} attr_names for attr_dim {}: one name per attribute",
                names.len(),
                self.attr_dim
            );
        }
        ensure!(
            self.time.is_some() || self.time_unit.is_none(),
            "edge_data has a time_unit but no time file"
        );
        Ok(EdgeDataFiles {
            attrs,
            weight: self.weight.as_ref().map(|file| dir.join(file)),
            time: self.time.as_ref().map(|file| dir.join(file)),
        })
    }
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
