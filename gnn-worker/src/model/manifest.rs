//! A model directory's manifest: its layout, inputs and outputs, the
//! graph a graph-layout model reads, and the model's identity.

use std::path::{Path, PathBuf};

use protocol::layout::{MAX_HOPS, MAX_SUBGRAPH_HOPS};
use serde::Deserialize;

/// Input names, in the order of the response's columns.
pub const INPUTS: [&str; 6] = [
    "features",
    "target_row",
    "hop1_count",
    "hop1_rows",
    "hop2_count",
    "hop2_rows",
];

/// A GNN's optional seventh input (models exported by this release): the
/// stored layer-1 embedding of each hop-1 slot the sidecar sent without
/// hop-2 neighbours (`hop2_count` -1, request flag `HUB_H1`), f32
/// `[n_targets, f1, hidden]`, or `[1, 1, hidden]` when no slot is.
pub const HUB_INPUT: &str = "hop1_h1";

/// The inputs of an MLP student (`sage.py distill`): the node table's
/// features and the targets' rows in it.
pub const STUDENT_INPUTS: [&str; 2] = ["features", "target_row"];

/// The inputs of a subgraph-layout model, as PyG's `model(x, edge_index)`
/// takes them.
pub const SUBGRAPH_INPUTS: [&str; 2] = ["x", "edge_index"];

/// The edge data a one-type subgraph-layout model may take after
/// [`SUBGRAPH_INPUTS`], as PyG names them: `edge_attr` f32 `[e,
/// edge_dim]`, `edge_weight` f32 `[e]`, `edge_time` int64 `[e]`, each in
/// `edge_index`'s column order.
pub const EDGE_DATA_INPUTS: [&str; 3] = ["edge_attr", "edge_weight", "edge_time"];

/// The opsets a subgraph-layout model may be exported with: what ONNX
/// Runtime 1.31 runs, from the first with `ScatterElements` reductions.
pub const SUBGRAPH_OPSETS: std::ops::RangeInclusive<u32> = 16..=23;

/// Which response layout a model reads (docs/protocol.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelLayout {
    /// This project's GraphSAGE on the per-target hop arrays.
    #[default]
    Dense,
    /// A PyG model on `(x, edge_index)`, NeighborLoader-shaped.
    Subgraph,
}

/// What a model's output row means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// Class logits: answered as a label (the arg max) and the logits.
    #[default]
    Classes,
    /// A node embedding: answered as the vector itself.
    Embedding,
}

/// Which model answered a prediction (the `answered_by` of a response).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnsweredBy {
    /// The GNN, on the sampled neighbourhood.
    Gnn,
    /// The MLP student, on the target's own row (docs/serving.md, "The ladder").
    Student,
    /// The GNN's output stored by `gnn-worker precompute`, still fresh
    /// (docs/serving.md, "Precomputed answers").
    Precomputed,
    /// The GNN at the smaller `degrade_fanouts` (docs/serving.md, "The
    /// ladder").
    GnnReduced,
    /// A stored answer the sidecar could not vouch for: it was unavailable
    /// (docs/serving.md, "The ladder").
    PrecomputedUnchecked,
}

impl AnsweredBy {
    pub fn as_str(self) -> &'static str {
        match self {
            AnsweredBy::Gnn => "gnn",
            AnsweredBy::Student => "student",
            AnsweredBy::Precomputed => "precomputed",
            AnsweredBy::GnnReduced => "gnn_reduced",
            AnsweredBy::PrecomputedUnchecked => "precomputed_unchecked",
        }
    }

    /// Whether this rung answers less than the GNN on the full, current
    /// neighbourhood: the reduced fanouts, the student, or a stored answer
    /// nobody could check.
    pub fn is_step_down(self) -> bool {
        matches!(
            self,
            AnsweredBy::Student | AnsweredBy::GnnReduced | AnsweredBy::PrecomputedUnchecked
        )
    }
}

/// The name of a GNN's second output, the targets' layer-1 embedding.
pub const H1_OUTPUT: &str = "h1";

/// `manifest.json` beside `model.onnx`, written by gnn-worker/model/sage.py.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// The name the model is served under unless the worker's
    /// `model_name` says otherwise (absent: the directory's name).
    #[serde(default)]
    pub name: Option<String>,
    /// The model's version, as the Open Inference Protocol reports it
    /// (absent: the first 12 hex digits of model.onnx's sha256).
    #[serde(default)]
    pub version: Option<String>,
    pub architecture: String,
    /// The response layout it reads (absent: dense).
    #[serde(default)]
    pub layout: ModelLayout,
    pub feature_dim: u32,
    pub dtype: String,
    /// Width of the logits; 0 for an embedding model.
    #[serde(default)]
    pub num_classes: u32,
    /// What the output is (absent: classes).
    #[serde(default)]
    pub output: OutputKind,
    /// Width of the embedding (`output` embedding).
    #[serde(default)]
    pub embedding_dim: Option<u32>,
    /// A one-type subgraph-layout model's edge attribute width, where it
    /// takes `edge_attr` (absent: 0, none).
    #[serde(default)]
    pub edge_dim: u32,
    /// One fanout per hop: two for the dense layout, 1 to 3 for the
    /// subgraph layout (which the worker sends unless `--fanouts` says
    /// otherwise); -1 is every neighbour ([`Manifest::fanouts_at_caps`]).
    #[serde(deserialize_with = "daemon_kit::config::fanout_list")]
    pub fanouts: Vec<u32>,
    pub graph_version: u64,
    pub opset: u32,
    pub inputs: Vec<String>,
    /// `logits`, then (models exported by this release) `h1`.
    pub outputs: Vec<String>,
    /// Width of the layer-1 embedding (`h1`); absent on a student.
    #[serde(default)]
    pub hidden: Option<u32>,
    /// Present on a model `sage.py quantize` wrote (INT8 weights).
    #[serde(default)]
    pub quantization: Option<Quantization>,
    /// A graph-layout model's graph: the types, target type and fanouts
    /// per edge type a typed manifest declares, or a one-type manifest's
    /// `feature_dim` and `fanouts` as the 1x1 graph's
    /// ([`GraphManifest::one_type`]); `None` for the dense layout.
    #[serde(skip)]
    pub graph: Option<GraphManifest>,
}

/// The graph a graph-layout model reads (docs/model.md, "Serving a
/// heterogeneous model"): `manifest.json`'s `node_types`, `edge_types`,
/// `target_type` and `fanouts` (one list per edge type key); a one-type
/// model's is the 1x1 graph.
#[derive(Debug, Clone, Deserialize)]
pub struct GraphManifest {
    pub node_types: Vec<NodeTypeDecl>,
    pub edge_types: Vec<EdgeTypeDecl>,
    pub target_type: String,
    /// Per edge type, a fanout per hop; -1 is every neighbour.
    #[serde(deserialize_with = "fanouts_per_edge_type")]
    pub fanouts: std::collections::BTreeMap<String, Vec<u32>>,
    /// Read from a one-type manifest: its inputs `x` and `edge_index` are
    /// the 1x1 graph's node type and edge type.
    #[serde(skip)]
    pub one_type: bool,
}

/// A typed manifest's `fanouts`: per edge type key, a list as
/// [`daemon_kit::config::fanout_list`] reads it.
fn fanouts_per_edge_type<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, Vec<u32>>, D::Error> {
    #[derive(Deserialize)]
    struct List(#[serde(deserialize_with = "daemon_kit::config::fanout_list")] Vec<u32>);
    let lists = std::collections::BTreeMap::<String, List>::deserialize(d)?;
    Ok(lists.into_iter().map(|(key, List(f))| (key, f)).collect())
}

#[derive(Debug, Clone, Deserialize)]
pub struct NodeTypeDecl {
    pub name: String,
    /// 0 (absent): no features; the model takes the type's node ids.
    #[serde(default)]
    pub feature_dim: u32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EdgeTypeDecl {
    pub src: String,
    pub relation: String,
    pub dst: String,
    /// The width of the attributes the model takes as
    /// `edge_attr__<src>__<relation>__<dst>` (absent: 0, none).
    #[serde(default)]
    pub edge_dim: u32,
}

impl EdgeTypeDecl {
    /// `src__relation__dst`.
    pub fn key(&self) -> String {
        format!("{}__{}__{}", self.src, self.relation, self.dst)
    }
}

/// A typed model's input names: `x__<type>`, `n_id__<type>`,
/// `edge_index__<src>__<relation>__<dst>`, and the edge type's data
/// `edge_attr__`, `edge_weight__` and `edge_time__<src>__<relation>__<dst>`
/// (docs/model.md).
pub mod graph_inputs {
    pub const X: &str = "x__";
    pub const N_ID: &str = "n_id__";
    pub const EDGE_INDEX: &str = "edge_index__";
    pub const EDGE_ATTR: &str = "edge_attr__";
    pub const EDGE_WEIGHT: &str = "edge_weight__";
    pub const EDGE_TIME: &str = "edge_time__";
}

/// What a graph-layout model's input reads: a node type's feature rows or
/// node ids, or an edge type's `edge_index`, attributes, weights or
/// times, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputRole<'a> {
    Features(&'a str),
    NodeIds(&'a str),
    Edges(&'a str),
    EdgeAttr(&'a str),
    EdgeWeight(&'a str),
    EdgeTime(&'a str),
}

impl InputRole<'_> {
    /// The edge data column it reads, if it reads one.
    pub fn edge_columns(&self) -> protocol::request::EdgeColumns {
        protocol::request::EdgeColumns {
            attr: matches!(self, InputRole::EdgeAttr(_)),
            weight: matches!(self, InputRole::EdgeWeight(_)),
            time: matches!(self, InputRole::EdgeTime(_)),
        }
    }
}

/// The 1x1 graph's edge type key (`node__to__node`).
pub const ONE_EDGE_TYPE: &str = "node__to__node";

impl GraphManifest {
    /// A one-type graph's model as the 1x1 graph's: node type `node` of
    /// `feature_dim`, edge type `node__to__node` at `fanouts` (its
    /// attributes `edge_dim` wide, where the model takes them).
    pub fn one_type(feature_dim: u32, edge_dim: u32, fanouts: &[u32]) -> Self {
        Self {
            node_types: vec![NodeTypeDecl {
                name: super::ONE_TYPE.to_string(),
                feature_dim,
            }],
            edge_types: vec![EdgeTypeDecl {
                src: super::ONE_TYPE.to_string(),
                relation: super::ONE_RELATION.to_string(),
                dst: super::ONE_TYPE.to_string(),
                edge_dim,
            }],
            target_type: super::ONE_TYPE.to_string(),
            fanouts: [(ONE_EDGE_TYPE.to_string(), fanouts.to_vec())].into(),
            one_type: true,
        }
    }

    /// The hops of its fanouts (every edge type's list has as many).
    pub fn hops(&self) -> usize {
        self.fanouts.values().map(Vec::len).max().unwrap_or(0)
    }

    /// What input `name` reads: a one-type model's `x`, `edge_index`,
    /// `edge_attr`, `edge_weight` and `edge_time` are the 1x1 graph's; a
    /// typed model's `x__<type>`, `n_id__<type>` and
    /// `edge_index__<src>__<relation>__<dst>` (and `edge_attr__`,
    /// `edge_weight__`, `edge_time__` of an edge type) name theirs.
    /// `None`: the input is none of these.
    pub fn role<'a>(&self, name: &'a str) -> Option<InputRole<'a>> {
        if self.one_type {
            return match name {
                "x" => Some(InputRole::Features(super::ONE_TYPE)),
                "edge_index" => Some(InputRole::Edges(ONE_EDGE_TYPE)),
                "edge_attr" => Some(InputRole::EdgeAttr(ONE_EDGE_TYPE)),
                "edge_weight" => Some(InputRole::EdgeWeight(ONE_EDGE_TYPE)),
                "edge_time" => Some(InputRole::EdgeTime(ONE_EDGE_TYPE)),
                _ => None,
            };
        }
        type Role<'a> = fn(&'a str) -> InputRole<'a>;
        let roles: [(&str, Role<'a>); 6] = [
            (graph_inputs::X, InputRole::Features),
            (graph_inputs::N_ID, InputRole::NodeIds),
            (graph_inputs::EDGE_INDEX, InputRole::Edges),
            (graph_inputs::EDGE_ATTR, InputRole::EdgeAttr),
            (graph_inputs::EDGE_WEIGHT, InputRole::EdgeWeight),
            (graph_inputs::EDGE_TIME, InputRole::EdgeTime),
        ];
        roles
            .iter()
            .find_map(|(prefix, role)| name.strip_prefix(prefix).map(role))
    }

    /// The edge attribute width the model declares for edge type `key`
    /// (0: none, or no such type).
    pub fn edge_dim(&self, key: &str) -> u32 {
        self.edge_types
            .iter()
            .find(|e| e.key() == key)
            .map_or(0, |e| e.edge_dim)
    }

    /// The edge data columns the model's `inputs` read: what its calls
    /// ask the sidecar for ([`protocol::request::GraphAsk::edge_data`]).
    pub fn edge_columns(&self, inputs: &[String]) -> protocol::request::EdgeColumns {
        inputs
            .iter()
            .filter_map(|input| self.role(input))
            .fold(Default::default(), |all, role| {
                let one = role.edge_columns();
                protocol::request::EdgeColumns {
                    attr: all.attr || one.attr,
                    weight: all.weight || one.weight,
                    time: all.time || one.time,
                }
            })
    }

    /// The feature width the model declares for node type `name` (0: none
    /// or no such type).
    pub fn feature_dim(&self, name: &str) -> u32 {
        self.node_types
            .iter()
            .find(|n| n.name == name)
            .map_or(0, |n| n.feature_dim)
    }

    /// The edge types a new node of the target type can have (keys
    /// `src__relation__dst`).
    pub fn target_edge_types(&self) -> Vec<String> {
        self.edge_types
            .iter()
            .filter(|e| e.src == self.target_type || e.dst == self.target_type)
            .map(EdgeTypeDecl::key)
            .collect()
    }

    /// A typed manifest's types, target, fanouts and inputs agree.
    fn check(&self, inputs: &[String]) -> Result<(), String> {
        let hops = self.hops();
        if !(1..=MAX_SUBGRAPH_HOPS).contains(&hops)
            || self.fanouts.values().any(|f| f.len() != hops)
        {
            return Err(format!(
                "fanouts {:?}: every edge type has one fanout per hop, 1 to \
                 {MAX_SUBGRAPH_HOPS} hops, the same hops for all",
                self.fanouts
            ));
        }
        if !self.node_types.iter().any(|t| t.name == self.target_type) {
            return Err(format!(
                "target_type {:?} is not one of its node_types",
                self.target_type
            ));
        }
        for key in self.fanouts.keys() {
            if !self.edge_types.iter().any(|e| &e.key() == key) {
                return Err(format!("fanouts name {key:?}, not one of its edge_types"));
            }
        }
        for input in inputs {
            let known = match self.role(input) {
                Some(InputRole::Features(t)) => self.feature_dim(t) > 0,
                Some(InputRole::NodeIds(t)) => self.node_types.iter().any(|n| n.name == t),
                Some(InputRole::EdgeAttr(k)) => self.edge_dim(k) > 0,
                Some(InputRole::Edges(k) | InputRole::EdgeWeight(k) | InputRole::EdgeTime(k)) => {
                    self.edge_types.iter().any(|e| e.key() == k)
                }
                None => false,
            };
            if !known {
                return Err(format!(
                    "input {input:?} is none of x__<type with features>, n_id__<type>, \
                     edge_index__<src>__<relation>__<dst>, edge_attr__<edge type with \
                     edge_dim>, edge_weight__<edge type>, edge_time__<edge type> of its \
                     node_types and edge_types"
                ));
            }
        }
        for e in &self.edge_types {
            let key = e.key();
            let name = format!("{}{key}", graph_inputs::EDGE_ATTR);
            if e.edge_dim > 0 && !inputs.contains(&name) {
                return Err(format!(
                    "edge type {key} declares edge_dim {} but the inputs have no {name:?}: \
                     export the model and its manifest together (pyg_model.py)",
                    e.edge_dim
                ));
            }
        }
        Ok(())
    }
}

/// How a model was quantized (docs/model.md, "INT8").
#[derive(Debug, Clone, Deserialize)]
pub struct Quantization {
    /// The tool that quantized it.
    pub method: String,
    /// The weights' type (`int8`).
    pub weights: String,
}

/// Why a model cannot be used or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("reading the model manifest {path}: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error("{0}")]
    Mismatch(String),
    #[error("loading {path} into ONNX Runtime: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error(
        "the CUDA execution provider could not start ({reason}); the worker does not fall back \
         to the CPU: install the GPU build of ONNX Runtime (onnxruntime-gpu 1.31.1 with CUDA 13 \
         and cuDNN 9) and point --onnxruntime-lib at its libonnxruntime.so, or run with \
         --device cpu"
    )]
    Cuda { reason: String },
    #[error("running the model: {0}")]
    Run(String),
}

/// Which model answers: its directory's name (symlinks resolved, so a
/// `current` link names the version it points at) and the sha256 of its
/// model.onnx, in hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The name it is served under: `model_name`, else the manifest's
    /// `name`, else the model directory's name.
    pub name: String,
    /// The sha256 of model.onnx, in hex.
    pub sha256: String,
    /// Its version (the Open Inference Protocol's): the manifest's
    /// `version`, else the first 12 hex digits of `sha256`.
    pub version: String,
    /// The tensors a call gives and gets (the Open Inference Protocol's
    /// model metadata).
    pub tensors: ModelTensors,
}

/// What a model's calls give and get, in its own terms: the output kind
/// and width, the new node's row width, and (a typed graph's model) the
/// edge types a new node of the target type can have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensors {
    pub output: OutputKind,
    /// The logits' or the embedding's width.
    pub width: u32,
    /// A new node's row width (the target type's, on a typed graph).
    pub feature_dim: u32,
    /// A typed graph's edge types with the target type at an end (keys
    /// `src__relation__dst`); `None` for a one-type graph.
    pub typed_edges: Option<Vec<String>>,
}

impl ModelTensors {
    /// A manifest's tensors.
    pub fn of(manifest: &Manifest) -> Self {
        let (feature_dim, typed_edges) = match &manifest.graph {
            Some(graph) if !graph.one_type => (
                graph.feature_dim(&graph.target_type),
                Some(graph.target_edge_types()),
            ),
            _ => (manifest.feature_dim, None),
        };
        Self {
            output: manifest.output,
            width: manifest.output_width(),
            feature_dim,
            typed_edges,
        }
    }
}

impl std::fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (sha256 {})", self.name, self.sha256)
    }
}

/// A served model name's rule: 1 to 128 of ASCII letters, digits, '.',
/// '_' and '-', so that it is one URL path segment as it stands
/// (`/v2/models/{name}`).
pub fn check_model_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 128 || !name.chars().all(allowed) {
        return Err(format!(
            "{name:?} is not 1 to 128 of letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// A model directory's identity ([`ModelIdentity`]): named `name` when
/// given (the worker's `model_name`), else by its manifest's `name`, else
/// by the directory's name.
pub fn identity(
    dir: &std::path::Path,
    manifest: &Manifest,
    name: Option<&str>,
) -> anyhow::Result<ModelIdentity> {
    let resolved = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name = match name.or(manifest.name.as_deref()) {
        Some(name) => name.to_string(),
        None => resolved.file_name().map_or_else(
            || resolved.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
    };
    let sha256 = sha256_hex(&dir.join(Manifest::MODEL))?;
    let version = match &manifest.version {
        Some(version) => version.clone(),
        None => sha256[..12].to_string(),
    };
    Ok(ModelIdentity {
        name,
        version,
        tensors: ModelTensors::of(manifest),
        sha256,
    })
}

/// The sha256 of a file's bytes, in hex.
pub fn sha256_hex(path: &Path) -> anyhow::Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The manifest a model directory without one is told to write: a PyG
/// model of the subgraph layout, its values to fill in.
const MANIFEST_TEMPLATE: &str = r#"{"format_version": 1, "layout": "subgraph", "architecture": "pyg", "feature_dim": <width of x>, "dtype": "f32", "fanouts": [20, 10], "graph_version": <the graph's, sidecarctl status>, "opset": <the export's opset, 18>, "inputs": ["x", "edge_index"], "outputs": ["<the output's name>"], "output": "classes", "num_classes": <width of the output>}"#;

impl Manifest {
    pub const FILE: &'static str = "manifest.json";
    pub const MODEL: &'static str = "model.onnx";

    /// Makes each -1 fanout (every neighbour, PyG's `num_neighbors` -1)
    /// the sidecar's cap of its hop (a third hop capped as the second),
    /// the typed fanouts' too: what the model is served at.
    pub fn fanouts_at_caps(&mut self, caps: [u32; MAX_HOPS]) {
        let at_caps = |fanouts: &mut Vec<u32>| {
            for (hop, f) in fanouts.iter_mut().enumerate() {
                *f = daemon_kit::config::at_cap(*f, caps[hop.min(MAX_HOPS - 1)]);
            }
        };
        at_caps(&mut self.fanouts);
        if let Some(graph) = &mut self.graph {
            graph.fanouts.values_mut().for_each(at_caps);
        }
    }

    /// Parses `<dir>/manifest.json` and checks what every model shares:
    /// the format version and one output.
    fn parse(model_dir: &Path) -> Result<Self, ModelError> {
        let path = model_dir.join(Self::FILE);
        let error = |reason: String| ModelError::Manifest {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => error(format!(
                "there is none. Export the model with gnn-worker/model/pyg_model.py's `export` \
                 (it writes one), or write it beside {}; for a PyG model exported with \
                 torch.onnx.export reading `x` and `edge_index`: {MANIFEST_TEMPLATE} (docs/\
                 model.md, \"The manifest (subgraph layout)\")",
                Self::MODEL
            )),
            _ => error(e.to_string()),
        })?;
        let mut value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| error(e.to_string()))?;
        for key in ["name", "version"] {
            if let Some(field) = value.get(key) {
                field
                    .as_str()
                    .ok_or_else(|| "is not a string".to_string())
                    .and_then(check_model_name)
                    .map_err(|e| {
                        error(format!(
                            "{key} {e}: it names the model in URLs (/v2/models/{{name}}/versions/\
                             {{version}}); use letters, digits, '.', '_' and '-'"
                        ))
                    })?;
            }
        }
        // A typed manifest declares its types in place of one-type rows
        // and fanouts.
        let graph: Option<GraphManifest> = if value.get("node_types").is_some()
            || value.get("edge_types").is_some()
        {
            let graph = serde_json::from_value(value.clone()).map_err(|e| error(e.to_string()))?;
            for (key, fill) in [
                ("feature_dim", serde_json::json!(0)),
                ("dtype", serde_json::json!("f32")),
                ("fanouts", serde_json::json!([])),
            ] {
                value[key] = fill;
            }
            Some(graph)
        } else {
            None
        };
        let mut manifest: Manifest =
            serde_json::from_value(value).map_err(|e| error(e.to_string()))?;
        if manifest.format_version != 1 {
            return Err(error(format!(
                "format_version {} is not 1: export the model with this release's tooling",
                manifest.format_version
            )));
        }
        match (graph, manifest.layout) {
            (Some(graph), ModelLayout::Subgraph) => {
                graph.check(&manifest.inputs).map_err(error)?;
                manifest.check_output().map_err(error)?;
                manifest.graph = Some(graph);
                return Ok(manifest);
            }
            (Some(_), ModelLayout::Dense) => {
                return Err(error(
                    "layout \"dense\": a typed graph's model has layout \"subgraph\" (export \
                     it with pyg_model.py)"
                        .into(),
                ))
            }
            (None, ModelLayout::Subgraph) => {
                manifest.check_one_type_graph().map_err(error)?;
                manifest.check_output().map_err(error)?;
                manifest.graph = Some(GraphManifest::one_type(
                    manifest.feature_dim,
                    manifest.edge_dim,
                    &manifest.fanouts,
                ));
                return Ok(manifest);
            }
            (None, ModelLayout::Dense) => {}
        }
        if manifest.fanouts.len() != MAX_HOPS || manifest.output != OutputKind::Classes {
            return Err(error(format!(
                "a dense-layout model has two fanouts and class outputs (fanouts {:?}, output \
                 {:?}): export it with sage.py, or set \"layout\": \"subgraph\" for a PyG model",
                manifest.fanouts, manifest.output
            )));
        }
        match manifest
            .outputs
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()[..]
        {
            [_] => {}
            [_, H1_OUTPUT] if manifest.hidden.is_some() => {}
            _ => {
                return Err(error(format!(
                    "outputs {:?}: expected the logits, optionally followed by \"h1\" (with \
                     `hidden` set)",
                    manifest.outputs
                )))
            }
        }
        Ok(manifest)
    }

    /// What a one-type graph-layout manifest must say: PyG's two inputs,
    /// then any of its edge data inputs once each (`edge_attr` with
    /// `edge_dim`), and 1 to 3 fanouts of at least 1.
    fn check_one_type_graph(&self) -> Result<(), String> {
        let (head, data) = self.inputs.split_at(self.inputs.len().min(2));
        let mut seen = Vec::new();
        let data_known = data.iter().all(|input| {
            let fresh = EDGE_DATA_INPUTS.contains(&input.as_str()) && !seen.contains(&input);
            seen.push(input);
            fresh
        });
        if head != SUBGRAPH_INPUTS || !data_known {
            return Err(format!(
                "inputs {:?}: a subgraph-layout model takes {SUBGRAPH_INPUTS:?}, then any of \
                 {EDGE_DATA_INPUTS:?} once each; export it with input_names=[\"x\", \
                 \"edge_index\", ...] (gnn-worker/model/pyg_model.py export does)",
                self.inputs
            ));
        }
        let takes_attr = data.iter().any(|input| input == "edge_attr");
        if takes_attr != (self.edge_dim > 0) {
            return Err(format!(
                "edge_dim {} with inputs {:?}: a model that takes edge_attr declares its width \
                 as edge_dim (at least 1), and only such a model",
                self.edge_dim, self.inputs
            ));
        }
        if self.fanouts.is_empty()
            || self.fanouts.len() > MAX_SUBGRAPH_HOPS
            || self.fanouts.contains(&0)
        {
            return Err(format!(
                "fanouts {:?}: give one fanout of at least 1 per hop, 1 to {MAX_SUBGRAPH_HOPS} \
                 hops",
                self.fanouts
            ));
        }
        Ok(())
    }

    /// What every graph-layout manifest must say of its output and opset:
    /// one output, a supported opset, the output's width.
    fn check_output(&self) -> Result<(), String> {
        if self.outputs.len() != 1 {
            return Err(format!(
                "outputs {:?}: a subgraph-layout model has one output (a row per node)",
                self.outputs
            ));
        }
        if !SUBGRAPH_OPSETS.contains(&self.opset) {
            return Err(format!(
                "opset {} is outside {}..={}: export with opset_version={} (ScatterElements \
                 reductions need 16; ONNX Runtime 1.31 runs up to {})",
                self.opset,
                SUBGRAPH_OPSETS.start(),
                SUBGRAPH_OPSETS.end(),
                18,
                SUBGRAPH_OPSETS.end()
            ));
        }
        match (self.output, self.num_classes, self.embedding_dim) {
            (OutputKind::Classes, 1.., _) => Ok(()),
            (OutputKind::Embedding, _, Some(1..)) => Ok(()),
            (OutputKind::Classes, ..) => {
                Err("output classes needs num_classes (the logits' width) of at least 1".into())
            }
            (OutputKind::Embedding, ..) => Err(
                "output embedding needs embedding_dim (the vector's width) of at least 1".into(),
            ),
        }
    }

    /// Width of one answer row: the classes, or the embedding.
    pub fn output_width(&self) -> u32 {
        match self.output {
            OutputKind::Classes => self.num_classes,
            OutputKind::Embedding => self.embedding_dim.unwrap_or(0),
        }
    }

    /// The manifest of an MLP student (`sage.py distill`), checked against
    /// the GNN it stands in for: same features and classes.
    pub fn read_student(model_dir: &Path, gnn: &Manifest) -> Result<Self, ModelError> {
        let manifest = Self::parse(model_dir)?;
        let error = |reason: String| ModelError::Manifest {
            path: model_dir.join(Self::FILE),
            reason,
        };
        if manifest.architecture != "mlp-2layer" || manifest.inputs != STUDENT_INPUTS {
            return Err(error(format!(
                "architecture {:?} with inputs {:?} is not an MLP student: point --student at \
                 a directory `sage.py distill` wrote",
                manifest.architecture, manifest.inputs
            )));
        }
        if manifest.feature_dim != gnn.feature_dim || manifest.num_classes != gnn.num_classes {
            return Err(error(format!(
                "the student takes {} features and gives {} classes, the model {} and {}: \
                 distill the student from this model",
                manifest.feature_dim, manifest.num_classes, gnn.feature_dim, gnn.num_classes
            )));
        }
        Ok(manifest)
    }

    pub fn read(model_dir: &Path) -> Result<Self, ModelError> {
        let path = model_dir.join(Self::FILE);
        let error = |reason: String| ModelError::Manifest {
            path: path.clone(),
            reason,
        };
        let manifest = Self::parse(model_dir)?;
        if manifest.layout == ModelLayout::Subgraph {
            return Ok(manifest);
        }
        // The response columns, optionally followed by the hub input.
        let hub = manifest.has_hub_input();
        if manifest.inputs[..manifest.inputs.len() - usize::from(hub)] != INPUTS {
            let hint = if manifest.architecture == "mlp-2layer" {
                ": this is an MLP student (sage.py distill), not a GNN; point --model at the \
                 GNN's directory"
            } else {
                ""
            };
            return Err(error(format!(
                "inputs {:?}, expected {INPUTS:?} (the response columns), optionally followed \
                 by {HUB_INPUT:?}{hint}",
                manifest.inputs
            )));
        }
        if hub && manifest.hidden.is_none() {
            return Err(error(format!(
                "input {HUB_INPUT:?} without hidden: re-export the model with sage.py"
            )));
        }
        Ok(manifest)
    }

    /// Whether the GNN takes stored hub embeddings ([`HUB_INPUT`]).
    pub fn has_hub_input(&self) -> bool {
        self.layout == ModelLayout::Dense
            && self.inputs.last().map(String::as_str) == Some(HUB_INPUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest as `sage.py distill` writes it, in a fresh directory
    /// named after `test`.
    fn student_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gnn-worker-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(Manifest::FILE),
            r#"{"format_version": 1, "architecture": "mlp-2layer", "role": "student",
                "feature_dim": 1433, "dtype": "f32", "num_classes": 7, "fanouts": [0, 0],
                "graph_version": 1, "opset": 17, "inputs": ["features", "target_row"],
                "outputs": ["logits"]}"#,
        )
        .unwrap();
        dir
    }

    /// A model directory without a manifest is told the manifest to write
    /// (the outside probe got only "No such file or directory").
    #[test]
    fn a_missing_manifest_is_refused_showing_the_manifest_to_write() {
        let dir =
            std::env::temp_dir().join(format!("gnn-worker-no-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let refused = Manifest::parse(&dir).unwrap_err().to_string();
        assert!(refused.contains("there is none"), "{refused}");
        assert!(
            refused.contains(r#""inputs": ["x", "edge_index"]"#),
            "{refused}"
        );
        assert!(refused.contains(r#""layout": "subgraph""#), "{refused}");
        assert!(refused.contains("pyg_model.py"), "{refused}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_student_directory_is_refused_by_name() {
        let dir = student_dir("student");
        let err = Manifest::read(&dir).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("MLP student"), "{err}");
        assert!(err.contains("point --model at the GNN"), "{err}");
    }

    #[test]
    fn a_student_is_checked_against_its_model() {
        let student = student_dir("student-check");
        let gnn = student_dir("student-gnn");
        std::fs::write(
            gnn.join(Manifest::FILE),
            r#"{"format_version": 1, "architecture": "graphsage-mean-2layer",
                "feature_dim": 1433, "dtype": "f32", "num_classes": 6, "fanouts": [20, 10],
                "graph_version": 1, "opset": 17, "outputs": ["logits"],
                "inputs": ["features", "target_row", "hop1_count", "hop1_rows",
                           "hop2_count", "hop2_rows"]}"#,
        )
        .unwrap();
        let model = Manifest::read(&gnn).unwrap();
        let classes = Manifest::read_student(&student, &model)
            .unwrap_err()
            .to_string();
        let not_a_student = Manifest::read_student(&gnn, &model)
            .unwrap_err()
            .to_string();
        std::fs::remove_dir_all(&student).unwrap();
        std::fs::remove_dir_all(&gnn).unwrap();
        assert!(
            classes.contains("7 classes, the model 1433 and 6"),
            "{classes}"
        );
        assert!(
            classes.contains("distill the student from this model"),
            "{classes}"
        );
        assert!(
            not_a_student.contains("is not an MLP student"),
            "{not_a_student}"
        );
    }

    /// A one-type PyG manifest is read as the 1x1 graph's, a typed one as
    /// its own graph: one set of roles for the inputs of both.
    #[test]
    fn a_one_type_manifest_is_the_1x1_graph_s() {
        let dir = student_dir("one-type-graph");
        std::fs::write(
            dir.join(Manifest::FILE),
            r#"{"format_version": 1, "layout": "subgraph", "architecture": "pyg",
                "feature_dim": 1433, "dtype": "f32", "fanouts": [10, 5], "graph_version": 1,
                "opset": 18, "inputs": ["x", "edge_index"], "outputs": ["out"],
                "num_classes": 7}"#,
        )
        .unwrap();
        let one_type = Manifest::read(&dir).unwrap();
        std::fs::write(
            dir.join(Manifest::FILE),
            r#"{"format_version": 1, "layout": "subgraph", "architecture": "to_hetero",
                "graph_version": 1, "opset": 18, "outputs": ["out"], "num_classes": 4,
                "node_types": [{"name": "airport", "feature_dim": 11}, {"name": "city"}],
                "edge_types": [{"src": "city", "relation": "has", "dst": "airport"}],
                "target_type": "airport", "fanouts": {"city__has__airport": [3, -1]},
                "inputs": ["x__airport", "n_id__city", "edge_index__city__has__airport"]}"#,
        )
        .unwrap();
        let typed = Manifest::read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        let graph = one_type.graph.as_ref().unwrap();
        assert!(graph.one_type);
        assert_eq!(graph.target_type, "node");
        assert_eq!(graph.feature_dim("node"), 1433);
        assert_eq!(graph.fanouts[ONE_EDGE_TYPE], vec![10, 5]);
        assert_eq!(graph.role("x"), Some(InputRole::Features("node")));
        assert_eq!(
            graph.role("edge_index"),
            Some(InputRole::Edges(ONE_EDGE_TYPE))
        );
        assert_eq!(graph.role("x__node"), None);
        assert_eq!(ModelTensors::of(&one_type).typed_edges, None);
        assert_eq!(ModelTensors::of(&one_type).feature_dim, 1433);

        let graph = typed.graph.as_ref().unwrap();
        assert!(!graph.one_type);
        assert_eq!(graph.hops(), 2);
        assert_eq!(
            graph.role("x__airport"),
            Some(InputRole::Features("airport"))
        );
        assert_eq!(graph.role("n_id__city"), Some(InputRole::NodeIds("city")));
        assert_eq!(
            graph.role("edge_index__city__has__airport"),
            Some(InputRole::Edges("city__has__airport"))
        );
        assert_eq!(graph.role("x"), None);
        let tensors = ModelTensors::of(&typed);
        assert_eq!(tensors.feature_dim, 11);
        assert_eq!(
            tensors.typed_edges,
            Some(vec!["city__has__airport".to_string()])
        );
    }

    /// Edge data inputs: a one-type model's PyG names after `x` and
    /// `edge_index`, a typed model's per edge type; the columns its calls
    /// ask for; the manifests that contradict themselves, refused.
    #[test]
    fn edge_data_inputs_have_roles_and_ask_for_their_columns() {
        use protocol::request::EdgeColumns;
        let dir = student_dir("edge-data");
        let one_type = |inputs: &str, edge_dim: u32| {
            std::fs::write(
                dir.join(Manifest::FILE),
                format!(
                    r#"{{"format_version": 1, "layout": "subgraph", "architecture": "pyg",
                        "feature_dim": 8, "dtype": "f32", "fanouts": [10, 5],
                        "graph_version": 1, "opset": 18, "inputs": {inputs},
                        "outputs": ["out"], "num_classes": 2, "edge_dim": {edge_dim}}}"#
                ),
            )
            .unwrap();
            Manifest::read(&dir)
        };
        let gine = one_type(r#"["x", "edge_index", "edge_attr", "edge_time"]"#, 3).unwrap();
        let graph = gine.graph.as_ref().unwrap();
        assert_eq!(
            graph.role("edge_attr"),
            Some(InputRole::EdgeAttr(ONE_EDGE_TYPE))
        );
        assert_eq!(graph.edge_dim(ONE_EDGE_TYPE), 3);
        assert_eq!(
            graph.edge_columns(&gine.inputs),
            EdgeColumns {
                attr: true,
                weight: false,
                time: true
            }
        );
        let refused = |result: Result<Manifest, ModelError>| result.unwrap_err().to_string();
        assert!(refused(one_type(r#"["x", "edge_index", "edge_attr"]"#, 0))
            .contains("declares its width as edge_dim"));
        assert!(refused(one_type(r#"["x", "edge_index"]"#, 3))
            .contains("declares its width as edge_dim"));
        assert!(refused(one_type(
            r#"["x", "edge_index", "edge_weight", "edge_weight"]"#,
            0
        ))
        .contains("then any of [\"edge_attr\", \"edge_weight\", \"edge_time\"] once each"));
        let typed = |edge_dim: u32, inputs: &str| {
            std::fs::write(
                dir.join(Manifest::FILE),
                format!(
                    r#"{{"format_version": 1, "layout": "subgraph", "architecture": "to_hetero",
                        "graph_version": 1, "opset": 18, "outputs": ["out"], "num_classes": 2,
                        "node_types": [{{"name": "account", "feature_dim": 4}},
                                       {{"name": "merchant"}}],
                        "edge_types": [{{"src": "account", "relation": "pays",
                                         "dst": "merchant", "edge_dim": {edge_dim}}},
                                       {{"src": "merchant", "relation": "rev_pays",
                                         "dst": "account"}}],
                        "target_type": "account",
                        "fanouts": {{"account__pays__merchant": [5, 5],
                                     "merchant__rev_pays__account": [5, 5]}},
                        "inputs": {inputs}}}"#
                ),
            )
            .unwrap();
            Manifest::read(&dir)
        };
        let inputs = r#"["x__account", "n_id__merchant", "edge_index__account__pays__merchant",
            "edge_index__merchant__rev_pays__account", "edge_attr__account__pays__merchant",
            "edge_weight__account__pays__merchant"]"#;
        let hetero = typed(2, inputs).unwrap();
        let graph = hetero.graph.as_ref().unwrap();
        assert_eq!(
            graph.role("edge_weight__account__pays__merchant"),
            Some(InputRole::EdgeWeight("account__pays__merchant"))
        );
        assert_eq!(graph.edge_dim("account__pays__merchant"), 2);
        assert_eq!(
            graph.edge_columns(&hetero.inputs),
            EdgeColumns {
                attr: true,
                weight: true,
                time: false
            }
        );
        assert!(refused(typed(0, inputs)).contains("edge_attr__<edge type with edge_dim>"));
        let without = r#"["x__account", "n_id__merchant", "edge_index__account__pays__merchant"]"#;
        assert!(refused(typed(2, without)).contains(
            "declares edge_dim 2 but the inputs have no \"edge_attr__account__pays__merchant\""
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_quantized_manifest_says_so() {
        let dir = student_dir("int8");
        std::fs::write(
            dir.join(Manifest::FILE),
            r#"{"format_version": 1, "architecture": "graphsage-mean-2layer",
                "feature_dim": 1433, "dtype": "f32", "num_classes": 7, "fanouts": [20, 10],
                "graph_version": 1, "opset": 17, "outputs": ["logits"],
                "inputs": ["features", "target_row", "hop1_count", "hop1_rows",
                           "hop2_count", "hop2_rows"],
                "quantization": {"method": "onnxruntime.quantization.quantize_dynamic",
                                 "weights": "int8", "activations": "uint8"}}"#,
        )
        .unwrap();
        let manifest = Manifest::read(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let manifest = manifest.unwrap();
        assert_eq!(manifest.quantization.unwrap().weights, "int8");
    }
}
