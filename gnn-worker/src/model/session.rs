//! Loading a model: its ONNX Runtime session, checked against its
//! manifest, rewritten where the export needs it.

use super::checks::check_graph_session;
use super::*;
use std::path::Path;

use ort::session::Session;

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
            let graph = manifest
                .graph
                .as_ref()
                .expect("a graph-layout manifest has its graph");
            check_graph_session(&session, &manifest, graph).map_err(ModelError::Mismatch)?;
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
}
