//! The model: its manifest, its check against the segment, and running it on
//! a response's Arrow buffers in place.
//!
//! A model reads one of the two response layouts (docs/protocol.md):
//!
//! - **subgraph** (a PyTorch Geometric model exported with
//!   `torch.onnx.export`, unchanged): inputs `x` (n_nodes x D, the node
//!   table's features) and `edge_index` (2 x n_edges int64, the edge
//!   table's list values), output one row per node, of which the targets'
//!   rows are the answers (classes or an embedding). Its aggregation is
//!   rewritten at load ([`crate::onnx_graph`]).
//! - **dense** (this project's GraphSAGE, `sage.py`): six inputs, below.
//!
//! The dense model's six inputs are the response tables' buffers as they are:
//! `features` (n_nodes x D), `target_row` (T), `hop1_count` (T), `hop1_rows`
//! (T x f1), `hop2_count` (T x f1), `hop2_rows` (T x f1 x f2, the same
//! buffer as the target table's T x (f1*f2) list with a 3-d shape). Each is
//! handed to ONNX Runtime as a tensor that borrows the shared-memory bytes
//! ([`bind_inputs`]); nothing is copied or reshaped in memory.

use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::{TensorElementType, TensorRef, ValueType};
use protocol::layout::{dtype, FeatureSchema, Geometry, MAX_HOPS, MAX_SUBGRAPH_HOPS};
use protocol::payload::schema::NO_ROW;
use protocol::payload::ResponseTables;
use protocol::request::SubgraphFanouts;
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
    /// One fanout per hop: two for the dense layout, 1 to 3 for the
    /// subgraph layout (which the worker sends unless `--fanouts` says
    /// otherwise).
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
    /// A model of a typed graph (`pyg_hetero.py` wrote it): its types,
    /// target type and fanouts per edge type.
    #[serde(skip)]
    pub typed: Option<TypedManifest>,
}

/// What a typed graph's model declares (docs/model.md, "Serving a
/// heterogeneous model"): `manifest.json`'s `node_types`, `edge_types`,
/// `target_type` and `fanouts` (one list per edge type key).
#[derive(Debug, Clone, Deserialize)]
pub struct TypedManifest {
    pub node_types: Vec<TypedNodeType>,
    pub edge_types: Vec<TypedEdgeType>,
    pub target_type: String,
    pub fanouts: std::collections::BTreeMap<String, Vec<u32>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TypedNodeType {
    pub name: String,
    /// 0 (absent): no features; the model takes the type's node ids.
    #[serde(default)]
    pub feature_dim: u32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TypedEdgeType {
    pub src: String,
    pub relation: String,
    pub dst: String,
}

impl TypedEdgeType {
    /// `src__relation__dst`.
    pub fn key(&self) -> String {
        format!("{}__{}__{}", self.src, self.relation, self.dst)
    }
}

/// A typed model's input names: `x__<type>`, `n_id__<type>`,
/// `edge_index__<src>__<relation>__<dst>` (docs/model.md).
pub mod typed_inputs {
    pub const X: &str = "x__";
    pub const N_ID: &str = "n_id__";
    pub const EDGE_INDEX: &str = "edge_index__";
}

impl TypedManifest {
    /// The hops of its fanouts (every edge type's list has as many).
    pub fn hops(&self) -> usize {
        self.fanouts.values().map(Vec::len).max().unwrap_or(0)
    }

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
            let known = if let Some(t) = input.strip_prefix(typed_inputs::X) {
                self.node_types
                    .iter()
                    .any(|n| n.name == t && n.feature_dim > 0)
            } else if let Some(t) = input.strip_prefix(typed_inputs::N_ID) {
                self.node_types.iter().any(|n| n.name == t)
            } else if let Some(k) = input.strip_prefix(typed_inputs::EDGE_INDEX) {
                self.edge_types.iter().any(|e| e.key() == k)
            } else {
                false
            };
            if !known {
                return Err(format!(
                    "input {input:?} is none of x__<type with features>, n_id__<type>, \
                     edge_index__<src>__<relation>__<dst> of its node_types and edge_types"
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
        let (feature_dim, typed_edges) = match &manifest.typed {
            None => (manifest.feature_dim, None),
            Some(typed) => (
                typed
                    .node_types
                    .iter()
                    .find(|t| t.name == typed.target_type)
                    .map_or(0, |t| t.feature_dim),
                Some(
                    typed
                        .edge_types
                        .iter()
                        .filter(|e| e.src == typed.target_type || e.dst == typed.target_type)
                        .map(TypedEdgeType::key)
                        .collect(),
                ),
            ),
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
        let value: serde_json::Value =
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
        if value.get("node_types").is_some() || value.get("edge_types").is_some() {
            return Self::parse_typed(value).map_err(error);
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| error(e.to_string()))?;
        if manifest.format_version != 1 {
            return Err(error(format!(
                "format_version {} is not 1: export the model with this release's tooling",
                manifest.format_version
            )));
        }
        if manifest.layout == ModelLayout::Subgraph {
            manifest.check_subgraph().map_err(error)?;
            return Ok(manifest);
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

    /// A typed graph's model: the common fields (no one-type feature width
    /// or fanouts), its types, and the subgraph layout's checks of output
    /// and opset.
    fn parse_typed(mut value: serde_json::Value) -> Result<Self, String> {
        let typed: TypedManifest =
            serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
        for (key, fill) in [
            ("feature_dim", serde_json::json!(0)),
            ("dtype", serde_json::json!("f32")),
            ("fanouts", serde_json::json!([])),
        ] {
            value[key] = fill;
        }
        let mut manifest: Manifest = serde_json::from_value(value).map_err(|e| e.to_string())?;
        if manifest.format_version != 1 || manifest.layout != ModelLayout::Subgraph {
            return Err(format!(
                "format_version {} and layout {:?}: a typed graph's model has 1 and \
                 \"subgraph\" (export it with pyg_hetero.py)",
                manifest.format_version, manifest.layout
            ));
        }
        typed.check(&manifest.inputs)?;
        manifest.fanouts = vec![1; typed.hops()];
        manifest.inputs_checked_as_typed()?;
        manifest.typed = Some(typed);
        Ok(manifest)
    }

    /// The subgraph layout's output, opset and output width checks, for a
    /// typed model (whose inputs are its own).
    fn inputs_checked_as_typed(&self) -> Result<(), String> {
        let one_type = Manifest {
            inputs: SUBGRAPH_INPUTS.iter().map(|s| s.to_string()).collect(),
            ..self.clone()
        };
        one_type.check_subgraph()
    }

    /// What a subgraph-layout manifest must say: PyG's two inputs, one
    /// output, 1 to 3 fanouts, a supported opset, the output's width.
    fn check_subgraph(&self) -> Result<(), String> {
        if self.inputs != SUBGRAPH_INPUTS {
            return Err(format!(
                "inputs {:?}: a subgraph-layout model takes {SUBGRAPH_INPUTS:?}; export it with \
                 input_names=[\"x\", \"edge_index\"] (gnn-worker/model/pyg_model.py export does)",
                self.inputs
            ));
        }
        if self.outputs.len() != 1 {
            return Err(format!(
                "outputs {:?}: a subgraph-layout model has one output (a row per node)",
                self.outputs
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

    /// The subgraph layout's fanouts (`None` for a dense model).
    pub fn subgraph_fanouts(&self) -> Option<SubgraphFanouts> {
        (self.layout == ModelLayout::Subgraph)
            .then(|| SubgraphFanouts::new(&self.fanouts))
            .flatten()
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

    /// A typed model against the sidecar's typed graph: every type and
    /// edge type whose input the model declares, with its width, and the
    /// target type, must be the graph's; the graph version must match;
    /// every fanout within its hop's cap. Returns the request the worker
    /// sends: the target type and a fanout per graph edge type and hop (0
    /// for an edge type the model does not sample).
    pub fn check_typed_segment(
        &self,
        schema: &FeatureSchema,
        geometry: &Geometry,
        graph: Option<&protocol::graph_schema::GraphSchema>,
    ) -> Result<protocol::request::TypedAsk, ModelError> {
        let mismatch = ModelError::Mismatch;
        let typed = self.typed.as_ref().expect("a typed model");
        let Some(graph) = graph else {
            return Err(mismatch(
                "the model is of a typed graph (pyg_hetero.py wrote it); the sidecar serves a \
                 one-type graph: serve it beside a sidecar of its typed graph"
                    .into(),
            ));
        };
        if self.graph_version != schema.graph_version {
            return Err(mismatch(format!(
                "graph_version {} in model manifest, {} in segment header: serve the model \
                 trained on this graph, or re-import the graph with --graph-version {}",
                self.graph_version, schema.graph_version, self.graph_version
            )));
        }
        let node_type = |name: &str| {
            graph.node_type(name).ok_or_else(|| {
                mismatch(format!(
                    "the model needs node type {name:?}; the sidecar's graph has {}: serve \
                     the model with the graph it was trained on",
                    graph.describe()
                ))
            })
        };
        let target_type = node_type(&typed.target_type)?;
        for input in &self.inputs {
            if let Some(name) = input.strip_prefix(typed_inputs::X) {
                let t = node_type(name)?;
                let want = typed
                    .node_types
                    .iter()
                    .find(|n| n.name == name)
                    .map_or(0, |n| n.feature_dim);
                let have = graph.node_types[t].feature_dim;
                if want != have {
                    return Err(mismatch(format!(
                        "input {input:?} takes {want} features of node type {name}; the \
                         sidecar's graph has {have}: re-export the model or re-import the \
                         data"
                    )));
                }
            } else if let Some(name) = input.strip_prefix(typed_inputs::N_ID) {
                node_type(name)?;
            } else if let Some(key) = input.strip_prefix(typed_inputs::EDGE_INDEX) {
                if graph.edge_type(key).is_none() {
                    return Err(mismatch(format!(
                        "input {input:?} needs edge type {key}; the sidecar's graph has {}: \
                         serve the model with the graph it was trained on",
                        graph.describe()
                    )));
                }
            }
        }
        let hops = typed.hops();
        let mut fanouts = vec![0u32; graph.edge_types.len() * hops];
        for (key, per_hop) in &typed.fanouts {
            let Some(e) = graph.edge_type(key) else {
                // An edge type the model samples but the graph lacks; the
                // model does not read it (else its input was refused).
                return Err(mismatch(format!(
                    "the model samples edge type {key}; the sidecar's graph has {}: serve \
                     the model with the graph it was trained on",
                    graph.describe()
                )));
            };
            for (hop, &fanout) in per_hop.iter().enumerate() {
                let cap = geometry.max_fanouts[hop.min(MAX_HOPS - 1)];
                if fanout > cap {
                    return Err(mismatch(format!(
                        "fanout {fanout} of edge type {key} at hop {} exceeds the sidecar's \
                         max_fanouts {cap}: raise the sidecar's --max-fanouts",
                        hop + 1
                    )));
                }
                fanouts[e * hops + hop] = fanout;
            }
        }
        Ok(protocol::request::TypedAsk {
            target_type: target_type as u32,
            hops: hops as u32,
            fanouts,
        })
    }

    /// Refuses a model trained for other data than the sidecar serves,
    /// naming the field and the fix.
    pub fn check_segment(
        &self,
        schema: &FeatureSchema,
        geometry: &Geometry,
        fanouts: &[u32],
    ) -> Result<(), ModelError> {
        if self.dtype != "f32" || schema.dtype != dtype::F32 {
            return Err(ModelError::Mismatch(format!(
                "dtype {} in model manifest, code {} in segment header: only f32 is served",
                self.dtype, schema.dtype
            )));
        }
        if schema.feature_dim == 0 {
            return Err(ModelError::Mismatch(format!(
                "the sidecar serves a typed graph (feature_dim 0 in segment header, its node \
                 and edge types in the graph schema); this model reads one-type rows of \
                 {} features: serve it beside a sidecar of a one-type graph",
                self.feature_dim
            )));
        }
        if self.feature_dim != schema.feature_dim {
            return Err(ModelError::Mismatch(format!(
                "feature_dim {} in model manifest, {} in segment header: re-export the model \
                 or re-import the data",
                self.feature_dim, schema.feature_dim
            )));
        }
        if self.graph_version != schema.graph_version {
            return Err(ModelError::Mismatch(format!(
                "graph_version {} in model manifest, {} in segment header: serve the model \
                 trained on this graph, or re-import the graph with --graph-version {}",
                self.graph_version, schema.graph_version, self.graph_version
            )));
        }
        for (hop, &fanout) in fanouts.iter().enumerate() {
            // A subgraph's third hop is capped as its second.
            let cap = geometry.max_fanouts[hop.min(MAX_HOPS - 1)];
            if fanout == 0 || fanout > cap {
                return Err(ModelError::Mismatch(format!(
                    "fanouts[{hop}] {} (model manifest or --fanouts) is outside 1..={} \
                     (max_fanouts in segment header): lower the fanouts or raise the \
                     sidecar's --max-fanouts",
                    fanout, cap
                )));
            }
        }
        Ok(())
    }
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

/// A loaded model (one ONNX Runtime session): the GNN, or an MLP student.
#[derive(Debug)]
pub struct Model {
    session: Session,
    manifest: Manifest,
    answered_by: AnsweredBy,
    /// `hidden` zeros: the `[1, 1, hidden]` hub input of a run without
    /// cached slots.
    no_hubs: Vec<f32>,
    scatters_rewritten: usize,
    /// Max/min scatters corrected at load ([`crate::onnx_graph::fix_scatter_extrema`]).
    extrema_fixed: usize,
}

/// How a model is loaded.
#[derive(Debug, Clone, Copy)]
struct LoadOptions {
    device: Device,
    intra_threads: usize,
    fast_scatter: bool,
}

/// A typed model's session takes exactly the manifest's inputs, each of its
/// kind (`x__<type>` f32 [n, D], `n_id__<type>` int64 [n],
/// `edge_index__<key>` int64 [2, e]), and gives one output.
fn check_typed_session(
    session: &Session,
    manifest: &Manifest,
    typed: &TypedManifest,
) -> Result<(), String> {
    let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
    if names != manifest.inputs {
        return Err(format!(
            "model.onnx takes inputs {names:?}, its manifest lists {:?}: export the model and \
             its manifest together (pyg_hetero.py)",
            manifest.inputs
        ));
    }
    for input in session.inputs() {
        let name = input.name();
        let ValueType::Tensor { ty, shape, .. } = input.dtype() else {
            return Err(format!("input {name:?} is not a tensor"));
        };
        let dims: &[i64] = shape;
        let ok = if let Some(t) = name.strip_prefix(typed_inputs::X) {
            let dim = typed
                .node_types
                .iter()
                .find(|n| n.name == t)
                .map_or(0, |n| i64::from(n.feature_dim));
            *ty == TensorElementType::Float32
                && dims.len() == 2
                && (dims[1] == dim || dims[1] == -1)
        } else if name.starts_with(typed_inputs::N_ID) {
            *ty == TensorElementType::Int64 && dims.len() == 1
        } else {
            *ty == TensorElementType::Int64 && dims.len() == 2 && (dims[0] == 2 || dims[0] == -1)
        };
        if !ok {
            return Err(format!(
                "input {name:?} is {ty:?} {dims:?}; a typed model takes x__<type> f32 [n, D], \
                 n_id__<type> int64 [n] and edge_index__<key> int64 [2, e]"
            ));
        }
    }
    if session.outputs().len() != 1 || session.outputs()[0].name() != manifest.outputs[0] {
        return Err(format!(
            "model.onnx has outputs {:?}; its manifest names {:?}",
            session
                .outputs()
                .iter()
                .map(|o| o.name().to_string())
                .collect::<Vec<_>>(),
            manifest.outputs
        ));
    }
    Ok(())
}

/// A subgraph-layout session must take exactly `x` (f32, [n, D]) and
/// `edge_index` (int64, [2, e]) with dynamic node and edge counts, and give
/// the manifest's output as f32 [n, width]. The message names the input,
/// the dtype, the width and the fix.
fn check_subgraph_session(session: &Session, manifest: &Manifest) -> Result<(), String> {
    let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
    if names != SUBGRAPH_INPUTS {
        return Err(format!(
            "model.onnx takes inputs {names:?}; a subgraph-layout model takes exactly \
             {SUBGRAPH_INPUTS:?}: export model(x, edge_index) with input_names=[\"x\", \
             \"edge_index\"] (an input the model never reads is dropped by the exporter: it \
             must use edge_index)"
        ));
    }
    let describe = |ty: &ValueType| -> Option<(TensorElementType, Vec<i64>)> {
        Some((ty.tensor_type()?, ty.tensor_shape()?.to_vec()))
    };
    let dynamic = "export with dynamic_axes={\"x\": {0: \"n\"}, \"edge_index\": {1: \"e\"}, \
                   <output>: {0: \"n\"}}";
    for input in session.inputs() {
        let Some((ty, shape)) = describe(input.dtype()) else {
            return Err(format!("input {:?} is not a tensor", input.name()));
        };
        let name = input.name();
        let (want_ty, want) = if name == "x" {
            (
                TensorElementType::Float32,
                [-1, i64::from(manifest.feature_dim)],
            )
        } else {
            (TensorElementType::Int64, [2, -1])
        };
        if ty != want_ty {
            return Err(format!(
                "input {name:?} is {ty:?}; the sidecar sends {want_ty:?} ({}): export with {}",
                if name == "x" {
                    "f32 feature rows"
                } else {
                    "PyG's int64 edge_index"
                },
                if name == "x" {
                    "float32 x"
                } else {
                    "an int64 (torch.long) edge_index"
                }
            ));
        }
        // -1 is a dynamic dimension: the node and edge counts must be.
        let fits = match (name, shape.as_slice()) {
            ("x", &[-1, d]) => d == -1 || d == want[1],
            ("edge_index", &[two, -1]) => two == 2 || two == -1,
            _ => false,
        };
        if !fits {
            let hint = match shape.as_slice() {
                &[_, d] if name == "x" && d != -1 && d != want[1] => format!(
                    "its width {d} is not the segment's feature_dim {}: train on these \
                     features, or re-import the data",
                    manifest.feature_dim
                ),
                _ => dynamic.to_string(),
            };
            return Err(format!(
                "input {name:?} has shape {shape:?}; expected {want:?} with -1 a dynamic \
                 dimension: {hint}"
            ));
        }
    }
    let output = &manifest.outputs[0];
    let Some(outlet) = session.outputs().iter().find(|o| o.name() == output) else {
        let names: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        return Err(format!(
            "model.onnx has no output {output:?} (the manifest's; it has {names:?}): export with \
             output_names=[{output:?}]"
        ));
    };
    let width = i64::from(manifest.output_width());
    match describe(outlet.dtype()) {
        Some((TensorElementType::Float32, shape))
            if shape.len() == 2 && shape[0] == -1 && (shape[1] == -1 || shape[1] == width) =>
        {
            Ok(())
        }
        other => Err(format!(
            "output {output:?} is {other:?}; expected Float32 [-1, {width}] (a row of {width} per \
             node, the manifest's {}): {dynamic}",
            match manifest.output {
                OutputKind::Classes => "num_classes",
                OutputKind::Embedding => "embedding_dim",
            }
        )),
    }
}

impl Model {
    /// Loads `<dir>/model.onnx`. `--device cuda` registers the CUDA
    /// execution provider and fails if it cannot start.
    pub fn load(
        env: &ort::environment::Environment,
        dir: &Path,
        device: Device,
        intra_threads: usize,
    ) -> Result<Self, ModelError> {
        Self::load_with(env, dir, device, intra_threads, true)
    }

    /// As [`Model::load`]; `fast_scatter` false keeps a subgraph-layout
    /// model's aggregation as exported (no rewrite, [`crate::onnx_graph`]).
    pub fn load_with(
        env: &ort::environment::Environment,
        dir: &Path,
        device: Device,
        intra_threads: usize,
        fast_scatter: bool,
    ) -> Result<Self, ModelError> {
        let manifest = Manifest::read(dir)?;
        let answered_by = AnsweredBy::Gnn;
        let options = LoadOptions {
            device,
            intra_threads,
            fast_scatter,
        };
        Self::load_checked(env, dir, manifest, options, answered_by)
    }

    /// Loads the MLP student of `<dir>` (on the CPU), checked against the
    /// GNN's manifest.
    pub fn load_student(
        env: &ort::environment::Environment,
        dir: &Path,
        gnn: &Manifest,
        intra_threads: usize,
    ) -> Result<Self, ModelError> {
        let manifest = Manifest::read_student(dir, gnn)?;
        let options = LoadOptions {
            device: Device::Cpu,
            intra_threads,
            fast_scatter: false,
        };
        Self::load_checked(env, dir, manifest, options, AnsweredBy::Student)
    }

    fn load_checked(
        env: &ort::environment::Environment,
        dir: &Path,
        manifest: Manifest,
        options: LoadOptions,
        answered_by: AnsweredBy,
    ) -> Result<Self, ModelError> {
        let path = dir.join(Manifest::MODEL);
        let load = |reason: String| ModelError::Load {
            path: path.clone(),
            reason,
        };
        let mut builder = Session::builder(env)
            .map_err(|e| load(e.to_string()))?
            .with_intra_threads(options.intra_threads)
            .map_err(|e| load(e.to_string()))?;
        if options.device == Device::Cuda {
            // TF32 off: ONNX Runtime's CUDA provider turns it on by default,
            // and on an H100 that moved cora's logits by 1.2e-3 from the
            // CPU's; f32 math keeps the GPU's answers the CPU's within float
            // rounding (docs/serving.md, the CUDA rule).
            builder = builder
                .with_execution_providers([ort::ep::CUDA::default()
                    .with_tf32(false)
                    .build()
                    .error_on_failure()])
                .map_err(|e| ModelError::Cuda {
                    reason: e.to_string(),
                })?;
        }
        if manifest.layout == ModelLayout::Subgraph {
            let bytes = std::fs::read(&path).map_err(|e| load(e.to_string()))?;
            // The TorchScript exporter's max/min aggregation, corrected
            // whatever `fast_scatter` says: it is a wrong answer, not a
            // slow one.
            let extrema = crate::onnx_graph::fix_scatter_extrema(&bytes)
                .map_err(|e| ModelError::Mismatch(e.to_string()))?;
            if !extrema.fixed.is_empty() {
                tracing::warn!(
                    model = %path.display(),
                    scatters = extrema.fixed.len(),
                    nodes = ?extrema.fixed,
                    "model.onnx computes max(0, .) (or min(0, .)) where PyG computes the max (min) \
                     of the messages, as the TorchScript exporter writes scatter_reduce on zeros; \
                     corrected at load. Export with gnn-worker/model/pyg_model.py export to \
                     store the correction in the file"
                );
            }
            let extrema_fixed = extrema.fixed.len();
            let bytes = extrema.bytes;
            let rewritten =
                crate::onnx_graph::rewrite_scatter_adds(&bytes).map_err(|e| load(e.to_string()))?;
            if rewritten.opset != Some(i64::from(manifest.opset)) {
                return Err(ModelError::Mismatch(format!(
                    "opset {} in model manifest, {} imported by {}: export the model and its \
                     manifest together",
                    manifest.opset,
                    rewritten
                        .opset
                        .map_or("none".to_string(), |o| o.to_string()),
                    path.display()
                )));
            }
            let (bytes, scatters) = if options.fast_scatter {
                (rewritten.bytes, rewritten.scatters)
            } else {
                (bytes, 0)
            };
            let session = builder
                .commit_from_memory(&bytes)
                .map_err(|e| load(e.to_string()))?;
            match &manifest.typed {
                None => check_subgraph_session(&session, &manifest),
                Some(typed) => check_typed_session(&session, &manifest, typed),
            }
            .map_err(ModelError::Mismatch)?;
            return Ok(Self {
                session,
                manifest,
                answered_by,
                no_hubs: Vec::new(),
                scatters_rewritten: scatters,
                extrema_fixed,
            });
        }
        let session = builder
            .commit_from_file(&path)
            .map_err(|e| load(e.to_string()))?;
        let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        let mut wanted: Vec<&str> = match answered_by {
            AnsweredBy::Student => STUDENT_INPUTS.to_vec(),
            _ => INPUTS.to_vec(),
        };
        if answered_by != AnsweredBy::Student && manifest.has_hub_input() {
            wanted.push(HUB_INPUT);
        }
        for name in wanted {
            if !names.contains(&name) {
                return Err(load(format!(
                    "the graph has no input {name:?} (it has {names:?})"
                )));
            }
        }
        for wanted in &manifest.outputs {
            if !session.outputs().iter().any(|o| o.name() == wanted) {
                return Err(load(format!("the graph has no output {wanted:?}")));
            }
        }
        let no_hubs = vec![0f32; manifest.hidden.unwrap_or(0) as usize];
        Ok(Self {
            session,
            manifest,
            answered_by,
            no_hubs,
            scatters_rewritten: 0,
            extrema_fixed: 0,
        })
    }

    /// Scatter-adds of a subgraph-layout model rewritten at load
    /// ([`crate::onnx_graph`]).
    pub fn scatters_rewritten(&self) -> usize {
        self.scatters_rewritten
    }

    /// Max/min aggregations of a hand export corrected at load.
    pub fn extrema_fixed(&self) -> usize {
        self.extrema_fixed
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Which model this is, as responses name it.
    pub fn answered_by(&self) -> AnsweredBy {
        self.answered_by
    }

    /// Runs the model on a response; returns `n_targets x num_classes`
    /// logits, row-major. The inputs borrow the response's buffers.
    pub fn run(&mut self, tables: &ResponseTables) -> Result<Vec<f32>, ModelError> {
        self.run_with_hubs(tables, &[])
    }

    /// As [`Model::run`], with `hop1_h1` (`n_targets x f1 x hidden`, or
    /// empty when no slot is cached) the stored layer-1 embedding of each
    /// hop-1 slot whose `hop2_count` is -1, for a GNN that takes them
    /// ([`Manifest::has_hub_input`]).
    pub fn run_with_hubs(
        &mut self,
        tables: &ResponseTables,
        hop1_h1: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        if tables.n_targets() == 0 {
            return Ok(Vec::new());
        }
        if self.manifest.layout == ModelLayout::Subgraph {
            if !hop1_h1.is_empty() {
                return Err(ModelError::Run(
                    "stored hub embeddings are a dense-layout feature".into(),
                ));
            }
            return self.run_subgraph(tables);
        }
        let inputs = bind_inputs(tables).map_err(|e| ModelError::Run(e.to_string()))?;
        if self.answered_by == AnsweredBy::Student {
            // The student reads the node table and the targets' rows in it.
            let [features, target_row, ..] = inputs;
            let outputs = self
                .session
                .run(ort::inputs!["features" => features, "target_row" => target_row])
                .map_err(|e| ModelError::Run(e.to_string()))?;
            return logits_of(&self.manifest, &outputs, tables.n_targets());
        }
        let f1 = tables.fanouts()[0] as usize;
        self.run_inputs(inputs, (tables.n_targets(), f1), hop1_h1, false)
            .map(|(logits, _)| logits)
    }

    /// Runs a subgraph-layout model on a subgraph response: `x` and
    /// `edge_index` borrow the node table's features and the edge table's
    /// values in place; returns each target's output row (`n_targets x
    /// width`; zeros for a `FRESH` target, which has no row). The model
    /// does not run when no target has a row.
    fn run_subgraph(&mut self, tables: &ResponseTables) -> Result<Vec<f32>, ModelError> {
        if tables.hops() == 0 {
            return Err(ModelError::Run(
                "a dense-layout response for a subgraph-layout model".into(),
            ));
        }
        let width = self.manifest.output_width() as usize;
        let mut rows = vec![0f32; tables.n_targets() * width];
        if tables.target_rows().iter().all(|&row| row == NO_ROW) {
            return Ok(rows);
        }
        let values = if tables.n_edges() == 0 {
            // Padded (run_subgraph_slices): no target has a neighbour.
            self.run_subgraph_slices(tables.features(), &[])?
        } else {
            let inputs =
                bind_subgraph_inputs(tables).map_err(|e| ModelError::Run(e.to_string()))?;
            self.run_subgraph_inputs(inputs, tables.n_nodes())?
        };
        for (t, &row) in tables.target_rows().iter().enumerate() {
            let Ok(row) = usize::try_from(row) else {
                continue;
            };
            rows[t * width..(t + 1) * width]
                .copy_from_slice(&values[row * width..(row + 1) * width]);
        }
        Ok(rows)
    }

    /// Runs a subgraph-layout model on `x` (`n x feature_dim`) and
    /// `edge_index` (`2 x e`, row-major) held anywhere (the tooling's
    /// reference subgraph, for instance); returns every node's output row.
    ///
    /// A subgraph without edges is run with one more row (zeros) and one
    /// edge from it to itself: some exports cannot run on an empty
    /// `edge_index` (TransformerConv's, PyG #9808), and the extra row
    /// reaches no other, so every real row's output is the edgeless one.
    pub fn run_subgraph_slices(
        &mut self,
        x: &[f32],
        edge_index: &[i64],
    ) -> Result<Vec<f32>, ModelError> {
        let run = |e: ort::Error| ModelError::Run(e.to_string());
        let dim = self.manifest.feature_dim as usize;
        let (n, e) = (x.len() / dim.max(1), edge_index.len() / 2);
        if e == 0 && n > 0 {
            let mut padded = Vec::with_capacity(x.len() + dim);
            padded.extend_from_slice(x);
            padded.resize(x.len() + dim, 0.0);
            let edge = [n as i64, n as i64];
            let inputs = [
                Input::F32(TensorRef::from_array_view(([n + 1, dim], &padded[..])).map_err(run)?),
                Input::I64(TensorRef::from_array_view(([2, 1], &edge[..])).map_err(run)?),
            ];
            let width = self.manifest.output_width() as usize;
            let mut values = self.run_subgraph_inputs(inputs, n + 1)?;
            values.truncate(n * width);
            return Ok(values);
        }
        let inputs = [
            Input::F32(TensorRef::from_array_view(([n, dim], x)).map_err(run)?),
            Input::I64(TensorRef::from_array_view(([2, e], edge_index)).map_err(run)?),
        ];
        self.run_subgraph_inputs(inputs, n)
    }

    /// Every node's output row, checked to be `n x width`.
    fn run_subgraph_inputs(
        &mut self,
        [x, edge_index]: [Input<'_>; 2],
        n: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let outputs = self
            .session
            .run(ort::inputs!["x" => x, "edge_index" => edge_index])
            .map_err(|e| ModelError::Run(e.to_string()))?;
        let width = self.manifest.output_width() as usize;
        let (shape, values) = outputs[self.manifest.outputs[0].as_str()]
            .try_extract_tensor::<f32>()
            .map_err(|e| ModelError::Run(e.to_string()))?;
        if shape.len() != 2 || shape[0] as usize != n || shape[1] as usize != width {
            return Err(ModelError::Run(format!(
                "output shape {shape:?}, expected [{n}, {width}] (a row per node)"
            )));
        }
        Ok(values.to_vec())
    }

    /// Runs a typed model on a typed response: each input it declares
    /// borrows its table in place (`x__<type>` the type's features,
    /// `n_id__<type>` its node ids, `edge_index__<key>` the edge type's
    /// values); returns each target's output row (`n_targets x width`).
    /// `graph` is the segment's schema.
    ///
    /// A declared node type with no rows, or edge type with no edges, is
    /// padded ([`TypedPadding`]): some exports cannot run on an empty
    /// input (an attention model's reduction over zero rows inside
    /// onnxruntime), and a padded node reaches no target, so the targets'
    /// answers are those of the subgraph as sampled, whatever else shares
    /// the batch.
    pub fn run_typed(
        &mut self,
        tables: &protocol::payload::TypedTables,
        graph: &protocol::graph_schema::GraphSchema,
        target_type: usize,
    ) -> Result<Vec<f32>, ModelError> {
        use ort::session::SessionInputValue;
        let run = |e: ort::Error| ModelError::Run(e.to_string());
        let width = self.manifest.output_width() as usize;
        let padding = TypedPadding::plan(&self.manifest.inputs, tables, graph);
        let mut bound: Vec<(String, SessionInputValue<'_>)> = Vec::new();
        for input in &self.manifest.inputs {
            let value: SessionInputValue<'_> =
                if let Some(name) = input.strip_prefix(typed_inputs::X) {
                    let t = graph.node_type(name).expect("checked at start");
                    let dim = graph.node_types[t].feature_dim as usize;
                    let x = padding.features(t, tables);
                    TensorRef::from_array_view(([x.len() / dim.max(1), dim], x))
                        .map_err(run)?
                        .into()
                } else if let Some(name) = input.strip_prefix(typed_inputs::N_ID) {
                    let t = graph.node_type(name).expect("checked at start");
                    let ids = padding.node_ids(t, tables);
                    TensorRef::from_array_view(([ids.len()], ids))
                        .map_err(run)?
                        .into()
                } else {
                    let key = &input[typed_inputs::EDGE_INDEX.len()..];
                    let e = graph.edge_type(key).expect("checked at start");
                    let index = padding.edge_index(e, tables);
                    TensorRef::from_array_view(([2, index.len() / 2], index))
                        .map_err(run)?
                        .into()
                };
            bound.push((input.clone(), value));
        }
        let outputs = self.session.run(bound).map_err(|e| {
            let hint = if padding.padded.is_empty() {
                String::new()
            } else {
                format!(
                    " (this subgraph had no rows in {}, run with one unconnected row or edge \
                     in each)",
                    padding.padded.join(", ")
                )
            };
            ModelError::Run(format!("{e}{hint}"))
        })?;
        let n = tables.n_rows(target_type) + usize::from(padding.dummy[target_type]);
        let (shape, values) = outputs[self.manifest.outputs[0].as_str()]
            .try_extract_tensor::<f32>()
            .map_err(|e| ModelError::Run(e.to_string()))?;
        if shape.len() != 2 || shape[0] as usize != n || shape[1] as usize != width {
            return Err(ModelError::Run(format!(
                "output shape {shape:?}, expected [{n}, {width}] (a row per node of the target \
                 type)"
            )));
        }
        let mut rows = vec![0f32; tables.n_targets() * width];
        for (t, &row) in tables.target_rows().iter().enumerate() {
            let row = row as usize;
            rows[t * width..(t + 1) * width]
                .copy_from_slice(&values[row * width..(row + 1) * width]);
        }
        Ok(rows)
    }

    /// Whether the model exports the targets' layer-1 embedding (`h1`).
    pub fn has_h1(&self) -> bool {
        self.manifest.layout == ModelLayout::Dense && self.manifest.outputs.len() == 2
    }

    /// Runs the GNN on a response; returns the logits and the targets'
    /// layer-1 embeddings (`n_targets x hidden`), for a model that has them
    /// ([`Model::has_h1`]).
    pub fn run_with_h1(
        &mut self,
        tables: &ResponseTables,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        if !self.has_h1()
            || self.answered_by != AnsweredBy::Gnn
            || self.manifest.layout != ModelLayout::Dense
        {
            return Err(ModelError::Run(
                "the model has no h1 output: export it with this release's sage.py".into(),
            ));
        }
        if tables.n_targets() == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let inputs = bind_inputs(tables).map_err(|e| ModelError::Run(e.to_string()))?;
        let shape = (tables.n_targets(), tables.fanouts()[0] as usize);
        let (logits, h1) = self.run_inputs(inputs, shape, &[], true)?;
        Ok((logits, h1.unwrap_or_default()))
    }

    /// Runs the model on inputs in the response layout held anywhere (the
    /// reference batches of the model tooling, for instance).
    pub fn run_slices(&mut self, inputs: &InputSlices<'_>) -> Result<Vec<f32>, ModelError> {
        let bound = inputs.bind().map_err(|e| ModelError::Run(e.to_string()))?;
        let shape = (inputs.target_row.len(), inputs.fanouts[0]);
        self.run_inputs(bound, shape, inputs.hop1_h1, false)
            .map(|(logits, _)| logits)
    }

    /// Logits, and with `h1` the targets' layer-1 embeddings; `shape` is
    /// `(n_targets, f1)`.
    fn run_inputs(
        &mut self,
        inputs: [Input<'_>; 6],
        shape: (usize, usize),
        hop1_h1: &[f32],
        h1: bool,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), ModelError> {
        let (n_targets, f1) = shape;
        let hidden = self.manifest.hidden.unwrap_or(0) as usize;
        let [features, target_row, hop1_count, hop1_rows, hop2_count, hop2_rows] = inputs;
        let mut named = ort::inputs![
            "features" => features,
            "target_row" => target_row,
            "hop1_count" => hop1_count,
            "hop1_rows" => hop1_rows,
            "hop2_count" => hop2_count,
            "hop2_rows" => hop2_rows,
        ];
        if self.manifest.has_hub_input() {
            let hubs = if hop1_h1.is_empty() {
                TensorRef::from_array_view(([1, 1, hidden], &self.no_hubs[..]))
            } else if hop1_h1.len() == n_targets * f1 * hidden {
                TensorRef::from_array_view(([n_targets, f1, hidden], hop1_h1))
            } else {
                return Err(ModelError::Run(format!(
                    "{} stored hub embedding values for {n_targets} targets at hop-1 fanout \
                     {f1} and {hidden} hidden units",
                    hop1_h1.len()
                )));
            }
            .map_err(|e| ModelError::Run(e.to_string()))?;
            named.push((HUB_INPUT.into(), hubs.into()));
        } else if !hop1_h1.is_empty() {
            return Err(ModelError::Run(
                "stored hub embeddings given to a model that takes none: re-export it with \
                 this release's sage.py"
                    .into(),
            ));
        }
        let outputs = self
            .session
            .run(named)
            .map_err(|e| ModelError::Run(e.to_string()))?;
        let logits = logits_of(&self.manifest, &outputs, n_targets)?;
        if !h1 {
            return Ok((logits, None));
        }
        let (shape, values) = outputs[H1_OUTPUT]
            .try_extract_tensor::<f32>()
            .map_err(|e| ModelError::Run(e.to_string()))?;
        if shape.len() != 2 || shape[0] as usize != n_targets || shape[1] as usize != hidden {
            return Err(ModelError::Run(format!(
                "h1 shape {shape:?}, expected [{n_targets}, {hidden}]"
            )));
        }
        Ok((logits, Some(values.to_vec())))
    }
}

/// The logits output of a run, checked to be `n_targets x num_classes`.
fn logits_of(
    manifest: &Manifest,
    outputs: &ort::session::SessionOutputs<'_>,
    n_targets: usize,
) -> Result<Vec<f32>, ModelError> {
    let classes = manifest.output_width() as usize;
    let (shape, logits) = outputs[manifest.outputs[0].as_str()]
        .try_extract_tensor::<f32>()
        .map_err(|e| ModelError::Run(e.to_string()))?;
    if shape.len() != 2 || shape[0] as usize != n_targets || shape[1] as usize != classes {
        return Err(ModelError::Run(format!(
            "output shape {shape:?}, expected [{n_targets}, {classes}]"
        )));
    }
    Ok(logits.to_vec())
}

/// The six inputs as plain slices in the response layout.
#[derive(Debug, Clone, Copy)]
pub struct InputSlices<'a> {
    /// `n_nodes x feature_dim`.
    pub features: &'a [f32],
    pub feature_dim: usize,
    pub target_row: &'a [i32],
    pub hop1_count: &'a [i32],
    pub hop1_rows: &'a [i32],
    pub hop2_count: &'a [i32],
    pub hop2_rows: &'a [i32],
    pub fanouts: [usize; MAX_HOPS],
    /// `n_targets x f1 x hidden` stored hub embeddings ([`HUB_INPUT`]), or
    /// empty.
    pub hop1_h1: &'a [f32],
}

impl<'a> InputSlices<'a> {
    /// Tensors borrowing these slices.
    pub fn bind(&self) -> ort::Result<[Input<'a>; 6]> {
        let n = self
            .features
            .len()
            .checked_div(self.feature_dim)
            .unwrap_or(0);
        let t = self.target_row.len();
        let [f1, f2] = self.fanouts;
        Ok([
            Input::F32(TensorRef::from_array_view((
                [n, self.feature_dim],
                self.features,
            ))?),
            Input::I32(TensorRef::from_array_view(([t], self.target_row))?),
            Input::I32(TensorRef::from_array_view(([t], self.hop1_count))?),
            Input::I32(TensorRef::from_array_view(([t, f1], self.hop1_rows))?),
            Input::I32(TensorRef::from_array_view(([t, f1], self.hop2_count))?),
            Input::I32(TensorRef::from_array_view(([t, f1, f2], self.hop2_rows))?),
        ])
    }
}

/// A model input: an f32, i32 or i64 tensor borrowing a response buffer.
#[derive(Debug)]
pub enum Input<'a> {
    F32(TensorRef<'a, f32>),
    I32(TensorRef<'a, i32>),
    I64(TensorRef<'a, i64>),
}

impl Input<'_> {
    /// Address of the tensor's data as ONNX Runtime sees it.
    pub fn data_address(&self) -> usize {
        match self {
            Input::F32(t) => t.data_ptr() as usize,
            Input::I32(t) => t.data_ptr() as usize,
            Input::I64(t) => t.data_ptr() as usize,
        }
    }
}

impl<'a> From<Input<'a>> for ort::session::SessionInputValue<'a> {
    fn from(input: Input<'a>) -> Self {
        match input {
            Input::F32(t) => t.into(),
            Input::I32(t) => t.into(),
            Input::I64(t) => t.into(),
        }
    }
}

/// How [`Model::run_typed`] pads a typed subgraph with an empty input: a
/// node type the model reads with no rows, or that an edge type the model
/// reads with no edges ends at, gets one more row (zeros, node id 0) that
/// no edge of the subgraph reaches; each such edge type gets one edge
/// between its ends' extra rows. Message passing carries nothing from
/// those rows to any other, so every real row's output is the one of the
/// subgraph as sampled: the padding changes which inputs are empty, not
/// an answer.
struct TypedPadding {
    /// Per node type: it has an extra row.
    dummy: Vec<bool>,
    /// Per node type with an extra row: its features, then zeros.
    features: Vec<Option<Vec<f32>>>,
    /// Per node type with an extra row: its node ids, then 0.
    node_ids: Vec<Option<Vec<i64>>>,
    /// Per empty edge type the model reads: the one edge.
    edges: Vec<Option<[i64; 2]>>,
    /// The inputs that were empty, for an error's message.
    padded: Vec<String>,
}

impl TypedPadding {
    fn plan(
        inputs: &[String],
        tables: &protocol::payload::TypedTables,
        graph: &protocol::graph_schema::GraphSchema,
    ) -> Self {
        let n_types = graph.node_types.len();
        let mut dummy = vec![false; n_types];
        let mut empty_edges = vec![false; graph.edge_types.len()];
        let mut padded = Vec::new();
        for input in inputs {
            if let Some(name) = input
                .strip_prefix(typed_inputs::X)
                .or_else(|| input.strip_prefix(typed_inputs::N_ID))
            {
                let t = graph.node_type(name).expect("checked at start");
                if tables.n_rows(t) == 0 {
                    dummy[t] = true;
                    padded.push(input.clone());
                }
            } else if let Some(key) = input.strip_prefix(typed_inputs::EDGE_INDEX) {
                let e = graph.edge_type(key).expect("checked at start");
                if tables.edge_index(e).is_empty() {
                    empty_edges[e] = true;
                    let ends = &graph.edge_types[e];
                    dummy[ends.src as usize] = true;
                    dummy[ends.dst as usize] = true;
                    padded.push(input.clone());
                }
            }
        }
        let features = (0..n_types)
            .map(|t| {
                dummy[t].then(|| {
                    let dim = graph.node_types[t].feature_dim as usize;
                    let mut x = tables.features(t).to_vec();
                    x.resize(x.len() + dim, 0.0);
                    x
                })
            })
            .collect();
        let node_ids = (0..n_types)
            .map(|t| {
                dummy[t].then(|| {
                    let ids: &[i64] = bytemuck::cast_slice(tables.node_ids(t));
                    let mut ids = ids.to_vec();
                    ids.push(0);
                    ids
                })
            })
            .collect();
        let edges = (0..graph.edge_types.len())
            .map(|e| {
                empty_edges[e].then(|| {
                    let ends = &graph.edge_types[e];
                    let extra = |t: u32| tables.n_rows(t as usize) as i64;
                    [extra(ends.src), extra(ends.dst)]
                })
            })
            .collect();
        Self {
            dummy,
            features,
            node_ids,
            edges,
            padded,
        }
    }

    fn features<'a>(&'a self, t: usize, tables: &'a protocol::payload::TypedTables) -> &'a [f32] {
        self.features[t]
            .as_deref()
            .unwrap_or_else(|| tables.features(t))
    }

    fn node_ids<'a>(&'a self, t: usize, tables: &'a protocol::payload::TypedTables) -> &'a [i64] {
        self.node_ids[t]
            .as_deref()
            .unwrap_or_else(|| bytemuck::cast_slice(tables.node_ids(t)))
    }

    fn edge_index<'a>(&'a self, e: usize, tables: &'a protocol::payload::TypedTables) -> &'a [i64] {
        match &self.edges[e] {
            Some(edge) => edge,
            None => tables.edge_index(e),
        }
    }
}

/// A subgraph-layout model's two inputs as tensors that borrow the
/// response's buffers in shared memory: `x` the node table's features
/// (`n_nodes x D`), `edge_index` the edge table's `2 x n_edges` values.
pub fn bind_subgraph_inputs(tables: &ResponseTables) -> ort::Result<[Input<'_>; 2]> {
    let n = tables.n_nodes();
    let dim = tables.features().len().checked_div(n).unwrap_or(0);
    Ok([
        Input::F32(TensorRef::from_array_view(([n, dim], tables.features()))?),
        Input::I64(TensorRef::from_array_view((
            [2, tables.n_edges()],
            tables.edge_index(),
        ))?),
    ])
}

/// The six model inputs as tensors that borrow the response's buffers (in
/// shared memory): no copy, no reshape in memory.
pub fn bind_inputs(tables: &ResponseTables) -> ort::Result<[Input<'_>; 6]> {
    let n = tables.n_nodes();
    InputSlices {
        features: tables.features(),
        feature_dim: tables.features().len().checked_div(n).unwrap_or(0),
        target_row: tables.target_rows(),
        hop1_count: tables.hop1_counts(),
        hop1_rows: tables.hop1_rows(),
        hop2_count: tables.hop2_counts(),
        hop2_rows: tables.hop2_rows(),
        fanouts: tables.fanouts().map(|f| f as usize),
        hop1_h1: &[],
    }
    .bind()
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
