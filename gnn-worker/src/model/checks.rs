//! A model's manifest checked against the sidecar's segment (the graph it
//! serves) and against its ONNX session (what the export declares).

use super::*;
use ort::session::Session;
use ort::value::{TensorElementType, ValueType};
use protocol::layout::{dtype, FeatureSchema, Geometry, MAX_HOPS};

impl Manifest {
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
    ) -> Result<protocol::request::GraphAsk, ModelError> {
        let mismatch = ModelError::Mismatch;
        let typed = self.typed.as_ref().expect("a typed model");
        let Some(graph) = graph else {
            return Err(mismatch(
                "the model is of a typed graph (pyg_model.py wrote it from a typed dataset); the sidecar serves a \
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
        Ok(protocol::request::GraphAsk {
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

/// A typed model's session takes exactly the manifest's inputs, each of its
/// kind (`x__<type>` f32 [n, D], `n_id__<type>` int64 [n],
/// `edge_index__<key>` int64 [2, e]), and gives one output.
pub(super) fn check_typed_session(
    session: &Session,
    manifest: &Manifest,
    typed: &TypedManifest,
) -> Result<(), String> {
    let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
    if names != manifest.inputs {
        return Err(format!(
            "model.onnx takes inputs {names:?}, its manifest lists {:?}: export the model and \
             its manifest together (pyg_model.py)",
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
pub(super) fn check_subgraph_session(session: &Session, manifest: &Manifest) -> Result<(), String> {
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
