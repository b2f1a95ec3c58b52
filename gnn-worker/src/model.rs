//! The model: its manifest, its check against the segment, and running it on
//! a response's Arrow buffers in place.
//!
//! The model's six inputs are the response tables' buffers as they are:
//! `features` (n_nodes x D), `target_row` (T), `hop1_count` (T), `hop1_rows`
//! (T x f1), `hop2_count` (T x f1), `hop2_rows` (T x f1 x f2, the same
//! buffer as the target table's T x (f1*f2) list with a 3-d shape). Each is
//! handed to ONNX Runtime as a tensor that borrows the shared-memory bytes
//! ([`bind_inputs`]); nothing is copied or reshaped in memory.

use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::TensorRef;
use protocol::layout::{dtype, FeatureSchema, Geometry, MAX_HOPS};
use protocol::payload::ResponseTables;
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
}

/// The name of a GNN's second output, the targets' layer-1 embedding.
pub const H1_OUTPUT: &str = "h1";

/// `manifest.json` beside `model.onnx`, written by gnn-worker/model/sage.py.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub architecture: String,
    pub feature_dim: u32,
    pub dtype: String,
    pub num_classes: u32,
    pub fanouts: [u32; MAX_HOPS],
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
         to the CPU: install the GPU build of ONNX Runtime (onnxruntime-gpu 1.31.1 with CUDA 12 \
         and cuDNN 9) and point --onnxruntime-lib at its libonnxruntime.so, or run with \
         --device cpu"
    )]
    Cuda { reason: String },
    #[error("running the model: {0}")]
    Run(String),
}

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
        let text = std::fs::read_to_string(&path).map_err(|e| error(e.to_string()))?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| error(e.to_string()))?;
        if manifest.format_version != 1 {
            return Err(error(format!(
                "format_version {} is not 1: export the model with this release's tooling",
                manifest.format_version
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
        self.inputs.last().map(String::as_str) == Some(HUB_INPUT)
    }

    /// Refuses a model trained for other data than the sidecar serves,
    /// naming the field and the fix.
    pub fn check_segment(
        &self,
        schema: &FeatureSchema,
        geometry: &Geometry,
        fanouts: [u32; MAX_HOPS],
    ) -> Result<(), ModelError> {
        if self.dtype != "f32" || schema.dtype != dtype::F32 {
            return Err(ModelError::Mismatch(format!(
                "dtype {} in model manifest, code {} in segment header: only f32 is served",
                self.dtype, schema.dtype
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
        for (hop, (&fanout, &cap)) in fanouts.iter().zip(&geometry.max_fanouts).enumerate() {
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
        let manifest = Manifest::read(dir)?;
        Self::load_checked(env, dir, manifest, device, intra_threads, AnsweredBy::Gnn)
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
        Self::load_checked(
            env,
            dir,
            manifest,
            Device::Cpu,
            intra_threads,
            AnsweredBy::Student,
        )
    }

    fn load_checked(
        env: &ort::environment::Environment,
        dir: &Path,
        manifest: Manifest,
        device: Device,
        intra_threads: usize,
        answered_by: AnsweredBy,
    ) -> Result<Self, ModelError> {
        let path = dir.join(Manifest::MODEL);
        let load = |reason: String| ModelError::Load {
            path: path.clone(),
            reason,
        };
        let mut builder = Session::builder(env)
            .map_err(|e| load(e.to_string()))?
            .with_intra_threads(intra_threads)
            .map_err(|e| load(e.to_string()))?;
        if device == Device::Cuda {
            builder = builder
                .with_execution_providers([ort::ep::CUDA::default().build().error_on_failure()])
                .map_err(|e| ModelError::Cuda {
                    reason: e.to_string(),
                })?;
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
        })
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

    /// Whether the model exports the targets' layer-1 embedding (`h1`).
    pub fn has_h1(&self) -> bool {
        self.manifest.outputs.len() == 2
    }

    /// Runs the GNN on a response; returns the logits and the targets'
    /// layer-1 embeddings (`n_targets x hidden`), for a model that has them
    /// ([`Model::has_h1`]).
    pub fn run_with_h1(
        &mut self,
        tables: &ResponseTables,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        if !self.has_h1() || self.answered_by != AnsweredBy::Gnn {
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
    let classes = manifest.num_classes as usize;
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

/// A model input: an f32 or i32 tensor borrowing a response buffer.
#[derive(Debug)]
pub enum Input<'a> {
    F32(TensorRef<'a, f32>),
    I32(TensorRef<'a, i32>),
}

impl Input<'_> {
    /// Address of the tensor's data as ONNX Runtime sees it.
    pub fn data_address(&self) -> usize {
        match self {
            Input::F32(t) => t.data_ptr() as usize,
            Input::I32(t) => t.data_ptr() as usize,
        }
    }
}

impl<'a> From<Input<'a>> for ort::session::SessionInputValue<'a> {
    fn from(input: Input<'a>) -> Self {
        match input {
            Input::F32(t) => t.into(),
            Input::I32(t) => t.into(),
        }
    }
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
