//! Typed (heterogeneous) graphs: node types, each its own id space, and
//! edge types `(src, relation, dst)`, one CSR file per edge type whose row
//! `v` lists the sources of destination node `v` (the format's typed flag;
//! docs/graph-index.md, "Typed datasets" and "Typed index").
//!
//! In a data directory the typed index is the folder `typed-graph/`:
//! `schema.json` (the types, their counts and widths, the graph version)
//! and `<src>__<relation>__<dst>.csr` per edge type. `sidecar import` of a
//! typed dataset writes the folder under a temporary name and renames it
//! into place, so a reader never sees half of one. Each node type with
//! features has a feature store of its own, in the one-type layout, in
//! `typed-features/<type>/` (`features.json`, the mean row, and the
//! embedded `features.db` or Redis keys `<prefix><type>:<id>`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use serde::{Deserialize, Serialize};

use crate::graph::build::{self, BuildOptions, BuildStats, EdgeDataSpec, EdgeFile, TypedEdges};
use crate::graph::format::EdgeDataShape;
use crate::graph::sampler::GraphSource;
use crate::graph::CsrIndex;

/// The typed index's folder inside a data directory.
pub const TYPED_DIR: &str = "typed-graph";
/// The schema's file inside [`TYPED_DIR`].
pub const SCHEMA_FILE: &str = "schema.json";
/// The folder of the per-type feature stores inside a data directory.
pub const TYPED_FEATURES_DIR: &str = "typed-features";

/// The folder of `node_type`'s feature store inside `data_dir`.
pub fn feature_dir(data_dir: &Path, node_type: &str) -> PathBuf {
    data_dir.join(TYPED_FEATURES_DIR).join(node_type)
}

/// The Redis key prefix of a node type's rows: `<prefix><type>:`, so a
/// row's key is `<prefix><type>:<id>` (`feat:airport:17`).
pub fn redis_prefix(prefix: &str, node_type: &str) -> String {
    format!("{prefix}{node_type}:")
}

/// A node type: its name, node count and feature width (0: no features;
/// a model takes its nodes' ids).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeType {
    pub name: String,
    pub num_nodes: u64,
    #[serde(default)]
    pub feature_dim: u32,
    /// `"f32"` with features, absent without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// An edge type, by the names of its node types, and what its edges
/// carry (docs/graph-index.md, "Edge data"; absent in schema.json: nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeType {
    pub src: String,
    pub relation: String,
    pub dst: String,
    /// Attributes per edge (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attr_dim: u32,
    /// A weight per edge.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub weight: bool,
    /// A time per edge.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl EdgeType {
    /// `(src, relation, dst)` whose edges carry nothing.
    pub fn new(src: &str, relation: &str, dst: &str) -> Self {
        Self {
            src: src.into(),
            relation: relation.into(),
            dst: dst.into(),
            ..Self::default()
        }
    }

    /// What its edges carry.
    pub fn data(&self) -> EdgeDataShape {
        EdgeDataShape {
            attr_dim: self.attr_dim,
            weight: self.weight,
            time: self.time,
        }
    }

    /// `src__relation__dst`: its file's stem and its part of a model's
    /// input name.
    pub fn key(&self) -> String {
        format!("{}__{}__{}", self.src, self.relation, self.dst)
    }
}

/// The types of a typed graph, in the graph's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypedSchema {
    pub node_types: Vec<NodeType>,
    pub edge_types: Vec<EdgeType>,
    pub graph_version: u64,
}

/// Whether `name` can name a type or a relation: 1 to 32 letters, digits
/// and single underscores, starting with a letter (the ring's rule,
/// docs/protocol.md, section 2.7).
pub use protocol::graph_schema::valid_name;

impl TypedSchema {
    /// The 1x1 graph's types a one-type graph has: node type [`ONE_TYPE`]
    /// (`num_nodes` nodes, rows of `feature_dim` f32; 0: none) and edge
    /// type [`ONE_EDGE_TYPE`].
    pub fn one_type(num_nodes: u64, feature_dim: u32, graph_version: u64) -> Self {
        TypedSchema {
            node_types: vec![NodeType {
                name: ONE_TYPE.into(),
                num_nodes,
                feature_dim,
                dtype: (feature_dim > 0).then(|| "f32".to_string()),
            }],
            edge_types: vec![EdgeType::new(ONE_TYPE, ONE_RELATION, ONE_TYPE)],
            graph_version,
        }
    }

    /// Checks names, uniqueness, that every edge type's ends are node
    /// types, and that counts fit the index's u32 ids. The error names the
    /// type and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_types.is_empty() || self.edge_types.is_empty() {
            return Err("a typed graph needs at least one node type and one edge type".into());
        }
        for (i, t) in self.node_types.iter().enumerate() {
            if !valid_name(&t.name) {
                return Err(format!(
                    "node type {:?}: use 1 to 32 letters, digits and single underscores, starting \
                     with a letter ('__' separates the parts of a model's input names)",
                    t.name
                ));
            }
            if self.node_types[..i].iter().any(|o| o.name == t.name) {
                return Err(format!("node type {:?} is listed twice", t.name));
            }
            if t.num_nodes >= u64::from(u32::MAX) {
                return Err(format!(
                    "node type {}: {} nodes; ids must be below 2^32 - 1",
                    t.name, t.num_nodes
                ));
            }
            match (t.feature_dim, t.dtype.as_deref()) {
                (0, None) | (1.., Some("f32")) => {}
                (dim, dtype) => {
                    return Err(format!(
                        "node type {}: feature_dim {dim} with dtype {dtype:?}; a type with \
                         features has dtype \"f32\", one without has none",
                        t.name
                    ))
                }
            }
        }
        for (i, e) in self.edge_types.iter().enumerate() {
            if !valid_name(&e.relation) {
                return Err(format!(
                    "relation {:?} of ({}, {}): use 1 to 32 letters, digits and single \
                     underscores, starting with a letter",
                    e.relation, e.src, e.dst
                ));
            }
            for end in [&e.src, &e.dst] {
                if self.node_type(end).is_none() {
                    return Err(format!(
                        "edge type {}: {end:?} is not one of the node types ({})",
                        e.key(),
                        self.node_type_names()
                    ));
                }
            }
            if e.attr_dim > crate::graph::format::MAX_EDGE_ATTRS {
                return Err(format!(
                    "edge type {}: {} attributes per edge; at most {}",
                    e.key(),
                    e.attr_dim,
                    crate::graph::format::MAX_EDGE_ATTRS
                ));
            }
            if self.edge_types[..i].iter().any(|o| o.key() == e.key()) {
                return Err(format!("edge type {} is listed twice", e.key()));
            }
        }
        Ok(())
    }

    /// The index of the node type named `name`.
    pub fn node_type(&self, name: &str) -> Option<usize> {
        self.node_types.iter().position(|t| t.name == name)
    }

    /// The index of the edge type `src__relation__dst` (or of the one edge
    /// type with relation `key`, where only one has it).
    pub fn edge_type(&self, key: &str) -> Option<usize> {
        let by_key = self.edge_types.iter().position(|e| e.key() == key);
        let mut by_relation = self
            .edge_types
            .iter()
            .enumerate()
            .filter(|(_, e)| e.relation == key);
        by_key.or_else(|| match (by_relation.next(), by_relation.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        })
    }

    fn node_type_names(&self) -> String {
        let names: Vec<&str> = self.node_types.iter().map(|t| t.name.as_str()).collect();
        names.join(", ")
    }

    /// Reads and validates `<data_dir>/typed-graph/schema.json`.
    pub fn read(data_dir: &Path) -> anyhow::Result<Self> {
        let schema_path = data_dir.join(TYPED_DIR).join(SCHEMA_FILE);
        let text = std::fs::read_to_string(&schema_path).with_context(|| {
            format!(
                "reading {}: import a typed dataset into {} first",
                schema_path.display(),
                data_dir.display()
            )
        })?;
        let schema: TypedSchema = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a typed schema", schema_path.display()))?;
        if let Err(reason) = schema.validate() {
            bail!("{}: {reason}", schema_path.display());
        }
        Ok(schema)
    }

    /// The types as the ring carries them (docs/protocol.md, section 2.7).
    /// Call on a validated schema.
    pub fn to_ring(&self) -> protocol::graph_schema::GraphSchema {
        use protocol::graph_schema::{EdgeTypeDesc, GraphSchema, NodeTypeDesc};
        GraphSchema {
            node_types: self
                .node_types
                .iter()
                .map(|t| NodeTypeDesc {
                    name: t.name.clone(),
                    feature_dim: t.feature_dim,
                })
                .collect(),
            edge_types: self
                .edge_types
                .iter()
                .zip(self.ends())
                .map(|(e, (src, dst))| EdgeTypeDesc {
                    src: src as u32,
                    relation: e.relation.clone(),
                    dst: dst as u32,
                    data: e.data(),
                })
                .collect(),
        }
    }

    /// Each edge type's (source type, destination type) indices. Call on a
    /// validated schema.
    pub fn ends(&self) -> Vec<(usize, usize)> {
        self.edge_types
            .iter()
            .map(|e| {
                (
                    self.node_type(&e.src).expect("validated"),
                    self.node_type(&e.dst).expect("validated"),
                )
            })
            .collect()
    }
}

/// A typed dataset's `meta.json`: the fields the import reads.
#[derive(Debug, Clone, Deserialize)]
struct DatasetMeta {
    node_types: Vec<DatasetNodeType>,
    edge_types: Vec<DatasetEdgeType>,
}

#[derive(Debug, Clone, Deserialize)]
struct DatasetNodeType {
    name: String,
    num_nodes: u64,
    #[serde(default)]
    feature_dim: u32,
    dtype: Option<String>,
    /// The feature file, relative to the dataset directory.
    features: Option<PathBuf>,
}

/// A node type's feature rows in a typed dataset.
#[derive(Debug, Clone)]
pub struct TypedFeatures {
    pub node_type: String,
    pub num_nodes: u64,
    pub feature_dim: u32,
    /// The `num_nodes x feature_dim` f32 file.
    pub file: PathBuf,
}

/// The feature files of `input`'s node types that have features, in the
/// schema's order. A type with a width but no file, or a file but width
/// 0, is refused by name.
pub fn feature_files(input: &Path) -> anyhow::Result<Vec<TypedFeatures>> {
    let meta = read_meta(input)?;
    let mut files = Vec::new();
    for t in meta.node_types {
        match (&t.features, t.feature_dim) {
            (None, 0) => {}
            (Some(file), 1..) => files.push(TypedFeatures {
                node_type: t.name,
                num_nodes: t.num_nodes,
                feature_dim: t.feature_dim,
                file: input.join(file),
            }),
            (file, dim) => bail!(
                "{}/meta.json: node type {} has feature_dim {dim} and features {file:?}: a type \
                 with features names its file and its width, one without has neither",
                input.display(),
                t.name
            ),
        }
    }
    Ok(files)
}

fn read_meta(input: &Path) -> anyhow::Result<DatasetMeta> {
    let meta_path = input.join("meta.json");
    let text = std::fs::read_to_string(&meta_path)
        .with_context(|| format!("reading {}", meta_path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: a typed dataset's node_types and edge_types (docs/graph-index.md, \"Typed \
             datasets\")",
            meta_path.display()
        )
    })
}

#[derive(Debug, Clone, Deserialize)]
struct DatasetEdgeType {
    src: String,
    relation: String,
    dst: String,
    num_edges: u64,
    /// The edge file, relative to the dataset directory.
    edges: PathBuf,
    /// What the edges carry, if anything ([`EdgeDataSpec`]).
    #[serde(default)]
    edge_data: Option<serde_json::Value>,
}

/// Whether `dir` holds a typed dataset: its meta.json lists node types and
/// edge types.
pub fn is_typed_dataset(dir: &Path) -> bool {
    #[derive(Deserialize)]
    struct Lists {
        #[allow(dead_code)]
        node_types: Vec<serde_json::Value>,
        #[allow(dead_code)]
        edge_types: Vec<serde_json::Value>,
    }
    std::fs::read_to_string(dir.join("meta.json"))
        .ok()
        .is_some_and(|text| serde_json::from_str::<Lists>(&text).is_ok())
}

/// What a typed import built.
#[derive(Debug, Clone)]
pub struct TypedImport {
    pub schema: TypedSchema,
    /// Per edge type, in the schema's order.
    pub edge_types: Vec<BuildStats>,
    pub seconds: f64,
}

/// Builds `<data_dir>/typed-graph/` from the typed dataset `input`: one CSR
/// per edge type (rows the destinations), each edge count checked against
/// meta.json, and `schema.json`. Written as `typed-graph.tmp` and renamed
/// into place; an earlier typed index is replaced.
pub fn import_typed(
    input: &Path,
    data_dir: &Path,
    graph_version: u64,
) -> anyhow::Result<TypedImport> {
    let started = Instant::now();
    let meta_path = input.join("meta.json");
    let meta = read_meta(input)?;
    let mut data_files = Vec::with_capacity(meta.edge_types.len());
    for e in &meta.edge_types {
        let key = format!("{}__{}__{}", e.src, e.relation, e.dst);
        data_files.push(
            EdgeDataSpec::from_json(e.edge_data.as_ref())
                .and_then(|spec| spec.files(input))
                .with_context(|| format!("{}: edge type {key}", meta_path.display()))?,
        );
    }
    let schema = TypedSchema {
        node_types: meta
            .node_types
            .iter()
            .map(|t| NodeType {
                name: t.name.clone(),
                num_nodes: t.num_nodes,
                feature_dim: t.feature_dim,
                dtype: if t.feature_dim > 0 {
                    Some(t.dtype.clone().unwrap_or_else(|| "f32".into()))
                } else {
                    t.dtype.clone()
                },
            })
            .collect(),
        edge_types: meta
            .edge_types
            .iter()
            .zip(&data_files)
            .map(|(e, files)| {
                let data = files.shape();
                EdgeType {
                    attr_dim: data.attr_dim,
                    weight: data.weight,
                    time: data.time,
                    ..EdgeType::new(&e.src, &e.relation, &e.dst)
                }
            })
            .collect(),
        graph_version,
    };
    if let Err(reason) = schema.validate() {
        bail!("{}: {reason}", meta_path.display());
    }
    let ends = schema.ends();
    let tmp = data_dir.join(format!("{TYPED_DIR}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing the leftover {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut stats = Vec::with_capacity(ends.len());
    for (e, (entry, &(src, dst))) in meta.edge_types.iter().zip(&ends).enumerate() {
        let key = schema.edge_types[e].key();
        let edges = EdgeFile {
            path: input.join(&entry.edges),
            n_nodes: Some(schema.node_types[dst].num_nodes),
        };
        let options = BuildOptions {
            graph_version,
            typed: Some(TypedEdges {
                n_src: schema.node_types[src].num_nodes,
                same_type: src == dst,
            }),
            edge_data: data_files[e].clone(),
            ..BuildOptions::default()
        };
        let built = build::build(&edges, &tmp.join(format!("{key}.csr")), &options)
            .with_context(|| format!("edge type {key} ({})", edges.path.display()))?;
        ensure!(
            built.input_edges == entry.num_edges,
            "edge type {key}: meta.json says {} edges, {} holds {}",
            entry.num_edges,
            edges.path.display(),
            built.input_edges
        );
        stats.push(built);
    }
    let schema_path = tmp.join(SCHEMA_FILE);
    std::fs::write(&schema_path, serde_json::to_string_pretty(&schema)? + "\n")
        .with_context(|| format!("writing {}", schema_path.display()))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    let dir = data_dir.join(TYPED_DIR);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("replacing the earlier {}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    Ok(TypedImport {
        schema,
        edge_types: stats,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Puts back `typed-graph` from `typed-graph.old` when a compaction was
/// interrupted between its two renames (the old index is whole; the
/// updates it lacks replay from an update stream, as after any crash
/// before a compaction). Returns whether it did.
pub fn recover_interrupted_compaction(data_dir: &Path) -> anyhow::Result<bool> {
    let dir = data_dir.join(TYPED_DIR);
    let old = data_dir.join(format!("{TYPED_DIR}.old"));
    if dir.exists() || !old.is_dir() {
        return Ok(false);
    }
    std::fs::rename(&old, &dir).with_context(|| {
        format!(
            "putting back {} from an interrupted compaction's {}",
            dir.display(),
            old.display()
        )
    })?;
    tracing::warn!(
        dir = %dir.display(),
        "a typed graph compaction was interrupted: the index before it is back in place"
    );
    Ok(true)
}

/// A graph index, mapped and verified: the schema and one CSR per edge
/// type, each checked against the schema's counts and graph version. A
/// typed data directory's `typed-graph/` opens as one ([`TypedGraph::open`]),
/// and a one-type `graph.csr` as its 1x1 case ([`TypedGraph::one_type`]):
/// node type [`ONE_TYPE`], edge type `node__to__node`, whose sources of a
/// node are its neighbours.
#[derive(Debug)]
pub struct TypedGraph {
    schema: TypedSchema,
    ends: Vec<(usize, usize)>,
    indexes: Vec<CsrIndex>,
    /// Per node type: the edge type whose index carries a known-node bitmap
    /// for it (a one-type index a compaction left gaps in), if any.
    bitmap_of: Vec<Option<usize>>,
    location: Location,
}

/// The one node type of a one-type graph, as the model tooling names it.
pub const ONE_TYPE: &str = "node";
/// The relation of a one-type graph's one edge type.
pub const ONE_RELATION: &str = "to";
/// A one-type graph's one edge type, by its key (`src__relation__dst`).
pub const ONE_EDGE_TYPE: &str = "node__to__node";

/// Where an index lives on disk: what a compaction rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A one-type index file (`<data_dir>/graph.csr`).
    OneType(PathBuf),
    /// A data directory holding `typed-graph/`.
    Typed(PathBuf),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::OneType(path) => write!(f, "{}", path.display()),
            Location::Typed(data_dir) => write!(f, "{}", data_dir.join(TYPED_DIR).display()),
        }
    }
}

impl TypedGraph {
    /// Opens `<data_dir>/typed-graph/`.
    pub fn open(data_dir: &Path) -> anyhow::Result<Self> {
        let dir = data_dir.join(TYPED_DIR);
        let schema = TypedSchema::read(data_dir)?;
        let ends = schema.ends();
        let mut indexes = Vec::with_capacity(ends.len());
        for (edge_type, &(src, dst)) in schema.edge_types.iter().zip(&ends) {
            let path = dir.join(format!("{}.csr", edge_type.key()));
            let index = CsrIndex::open(&path)?;
            let header = index.header();
            ensure!(
                header.edge_data == edge_type.data(),
                "{}: its edges carry {}; the schema says {}: re-run sidecar import",
                path.display(),
                header.edge_data,
                edge_type.data()
            );
            ensure!(
                header.is_typed()
                    && header.n_nodes == schema.node_types[dst].num_nodes
                    && header.n_src == schema.node_types[src].num_nodes
                    && header.graph_version == schema.graph_version,
                "{}: {} destinations, {} sources, graph version {} (typed: {}); the schema says \
                 {}, {} and {}: re-run sidecar import",
                path.display(),
                header.n_nodes,
                header.n_src,
                header.graph_version,
                header.is_typed(),
                schema.node_types[dst].num_nodes,
                schema.node_types[src].num_nodes,
                schema.graph_version
            );
            indexes.push(index);
        }
        Ok(Self::from_parts(
            schema,
            ends,
            indexes,
            Location::Typed(data_dir.to_path_buf()),
        ))
    }

    /// A one-type index as the 1x1 graph: node type [`ONE_TYPE`] (as many
    /// nodes as the index spans, rows of `feature_dim` f32 as its feature
    /// store says; 0: none), one edge type [`ONE_EDGE_TYPE`] whose row of a
    /// node lists its neighbours. `path` is where it lives: what a
    /// compaction rewrites.
    pub fn one_type(index: CsrIndex, path: impl Into<PathBuf>, feature_dim: u32) -> Self {
        let mut schema = TypedSchema::one_type(
            u64::from(index.n_nodes()),
            feature_dim,
            index.graph_version(),
        );
        let data = index.edge_data();
        let edge_type = &mut schema.edge_types[0];
        (edge_type.attr_dim, edge_type.weight, edge_type.time) =
            (data.attr_dim, data.weight, data.time);
        Self::from_parts(
            schema,
            vec![(0, 0)],
            vec![index],
            Location::OneType(path.into()),
        )
    }

    /// Maps the one-type index at `path` as the 1x1 graph whose rows have
    /// `feature_dim` values.
    pub fn open_one_type(path: &Path, feature_dim: u32) -> anyhow::Result<Self> {
        Ok(Self::one_type(CsrIndex::open(path)?, path, feature_dim))
    }

    fn from_parts(
        schema: TypedSchema,
        ends: Vec<(usize, usize)>,
        indexes: Vec<CsrIndex>,
        location: Location,
    ) -> Self {
        let bitmap_of = (0..schema.node_types.len())
            .map(|t| {
                ends.iter()
                    .zip(&indexes)
                    .position(|(&(_, dst), index)| dst == t && index.header().has_known_bitmap())
            })
            .collect();
        Self {
            schema,
            ends,
            indexes,
            bitmap_of,
            location,
        }
    }

    pub fn schema(&self) -> &TypedSchema {
        &self.schema
    }

    /// Where the index lives.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Whether this is a one-type index (the 1x1 graph of a `graph.csr`).
    pub fn is_one_type(&self) -> bool {
        matches!(self.location, Location::OneType(_))
    }

    /// Node type `t`'s id bound in the index: every id below is a node,
    /// unless the index carries a known-node bitmap for the type.
    pub fn id_bound(&self, t: usize) -> u64 {
        self.schema.node_types[t].num_nodes
    }

    /// Node type `t`'s nodes in the index.
    pub fn known_nodes(&self, t: usize) -> u64 {
        match self.bitmap_of[t] {
            Some(e) => self.indexes[e].known_nodes(),
            None => self.id_bound(t),
        }
    }

    /// Edge type `edge_type`'s index (rows: destinations).
    pub fn csr(&self, edge_type: usize) -> &CsrIndex {
        &self.indexes[edge_type]
    }
}

impl GraphSource for TypedGraph {
    fn n_node_types(&self) -> usize {
        self.schema.node_types.len()
    }

    fn edge_types(&self) -> &[(usize, usize)] {
        &self.ends
    }

    fn is_node(&self, node_type: usize, node: u64) -> bool {
        node < self.schema.node_types[node_type].num_nodes
            && self.bitmap_of[node_type].is_none_or(|e| self.indexes[e].is_known(node as u32))
    }

    fn degree(&self, edge_type: usize, node: u64) -> Option<u32> {
        let (_, dst) = self.ends[edge_type];
        self.is_node(dst, node)
            .then(|| self.indexes[edge_type].degree(node as u32))
    }

    fn neighbor(&self, edge_type: usize, node: u64, i: u32) -> u64 {
        u64::from(self.indexes[edge_type].neighbors(node as u32)[i as usize])
    }

    /// A row with times is sorted by time: a binary search.
    fn valid_degree(&self, edge_type: usize, node: u64, degree: u32, limit: i64) -> u32 {
        let index = &self.indexes[edge_type];
        if !index.edge_data().time {
            return degree;
        }
        let times = index.edge_row(node as u32).times;
        times.partition_point(|&t| t <= limit) as u32
    }
}
