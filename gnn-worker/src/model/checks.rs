//! A model's manifest checked against the sidecar's segment (the graph it
//! serves) and against its ONNX session (what the export declares).

use super::*;
use ort::session::Session;
use ort::value::{TensorElementType, ValueType};
use protocol::graph_schema::GraphSchema;
use protocol::layout::{dtype, FeatureSchema, Geometry, MAX_HOPS};
use protocol::request::GraphAsk;

impl Manifest {
    /// What every model is checked for against the segment: f32 rows, a
    /// graph of its kind (a typed graph's model beside a typed graph, a
    /// one-type graph's beside a one-type graph), a one-type model's
    /// feature width, and the graph version.
    fn check_rows(&self, schema: &FeatureSchema) -> Result<(), ModelError> {
        let mismatch = ModelError::Mismatch;
        if self.dtype != "f32" || schema.dtype != dtype::F32 {
            return Err(mismatch(format!(
                "dtype {} in model manifest, code {} in segment header: only f32 is served",
                self.dtype, schema.dtype
            )));
        }
        let typed_model = self.graph.as_ref().is_some_and(|g| !g.one_type);
        let typed_sidecar = schema.feature_dim == 0;
        if typed_sidecar && !typed_model {
            return Err(mismatch(format!(
                "the sidecar serves a typed graph (feature_dim 0 in segment header, its node \
                 and edge types in the graph schema); this model reads one-type rows of \
                 {} features: serve it beside a sidecar of a one-type graph",
                self.feature_dim
            )));
        }
        if typed_model && !typed_sidecar {
            return Err(mismatch(
                "the model is of a typed graph (pyg_model.py wrote it from a typed dataset); the \
                 sidecar serves a one-type graph: serve it beside a sidecar of its typed graph"
                    .into(),
            ));
        }
        if !typed_model && self.feature_dim != schema.feature_dim {
            return Err(mismatch(format!(
                "feature_dim {} in model manifest, {} in segment header: re-export the model \
                 or re-import the data",
                self.feature_dim, schema.feature_dim
            )));
        }
        if self.graph_version != schema.graph_version {
            return Err(mismatch(format!(
                "graph_version {} in model manifest, {} in segment header: serve the model \
                 trained on this graph, or re-import the graph with --graph-version {}",
                self.graph_version, schema.graph_version, self.graph_version
            )));
        }
        Ok(())
    }

    /// A dense-layout model against the sidecar's segment: its rows
    /// ([`Manifest::check_rows`]) and each of `fanouts` within its hop's
    /// cap.
    pub fn check_dense_segment(
        &self,
        schema: &FeatureSchema,
        geometry: &Geometry,
        fanouts: &[u32],
    ) -> Result<(), ModelError> {
        self.check_rows(schema)?;
        for (hop, &fanout) in fanouts.iter().enumerate() {
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

    /// A graph-layout model (a typed graph's, or a one-type graph's as the
    /// 1x1 graph) against the sidecar's `graph`: its rows
    /// ([`Manifest::check_rows`]); every node type and edge type whose
    /// input the model declares, with its width, and the target type, must
    /// be the graph's; every fanout within its hop's cap. `fanouts`, when
    /// given (named by where it came from: `--fanouts`,
    /// `degrade_fanouts`), replaces the manifest's for every edge type the
    /// model samples, as PyG's `num_neighbors` list does on a HeteroData.
    /// Returns the request the worker sends: the target type and a fanout
    /// per graph edge type and hop (0 for an edge type the model does not
    /// sample).
    pub fn check_graph_segment(
        &self,
        schema: &FeatureSchema,
        geometry: &Geometry,
        graph: &GraphSchema,
        fanouts: Option<(&str, &[u32])>,
    ) -> Result<GraphAsk, ModelError> {
        let mismatch = ModelError::Mismatch;
        let Some(model) = self.graph.as_ref() else {
            return Err(mismatch(
                "a dense-layout model reads no graph-layout response".into(),
            ));
        };
        self.check_rows(schema)?;
        let node_type = |name: &str| {
            graph.node_type(name).ok_or_else(|| {
                mismatch(format!(
                    "the model needs node type {name:?}; the sidecar's graph has {}: serve \
                     the model with the graph it was trained on",
                    graph.describe()
                ))
            })
        };
        let target_type = node_type(&model.target_type)?;
        for input in &self.inputs {
            match model.role(input) {
                Some(InputRole::Features(name)) => {
                    let t = node_type(name)?;
                    let want = model.feature_dim(name);
                    let have = graph.node_types[t].feature_dim;
                    if want != have {
                        return Err(mismatch(format!(
                            "input {input:?} takes {want} features of node type {name}; the \
                             sidecar's graph has {have}: re-export the model or re-import the \
                             data"
                        )));
                    }
                }
                Some(InputRole::NodeIds(name)) => {
                    node_type(name)?;
                }
                Some(InputRole::Edges(key)) if graph.edge_type(key).is_none() => {
                    return Err(mismatch(format!(
                        "input {input:?} needs edge type {key}; the sidecar's graph has {}: \
                         serve the model with the graph it was trained on",
                        graph.describe()
                    )));
                }
                Some(
                    role @ (InputRole::EdgeAttr(key)
                    | InputRole::EdgeWeight(key)
                    | InputRole::EdgeTime(key)),
                ) => {
                    let Some(e) = graph.edge_type(key) else {
                        return Err(mismatch(format!(
                            "input {input:?} needs edge type {key}; the sidecar's graph has {}: \
                             serve the model with the graph it was trained on",
                            graph.describe()
                        )));
                    };
                    let data = graph.edge_types[e].data;
                    let lacking = match role {
                        InputRole::EdgeAttr(_) if data.attr_dim != model.edge_dim(key) => {
                            Some(format!("{} attributes per edge", model.edge_dim(key)))
                        }
                        InputRole::EdgeWeight(_) if !data.weight => {
                            Some("a weight per edge".into())
                        }
                        InputRole::EdgeTime(_) if !data.time => Some("a time per edge".into()),
                        _ => None,
                    };
                    if let Some(lacking) = lacking {
                        return Err(mismatch(format!(
                            "input {input:?} takes {lacking} of edge type {key}; the sidecar's \
                             graph carries {data} there: import the dataset with the edge \
                             data the model was trained on (docs/graph-index.md, \"Edge \
                             data\"), or re-export the model"
                        )));
                    }
                }
                Some(InputRole::Edges(_)) | None => {}
            }
        }
        let (source, replaced) = match fanouts {
            Some((source, f)) => {
                if !(1..=protocol::layout::MAX_SUBGRAPH_HOPS).contains(&f.len()) || f.contains(&0) {
                    return Err(mismatch(format!(
                        "{source} {f:?}: give 1 to {} fanouts of at least 1, one per hop",
                        protocol::layout::MAX_SUBGRAPH_HOPS
                    )));
                }
                (source, Some(f))
            }
            None => ("the model manifest's fanouts", None),
        };
        let hops = replaced.map_or_else(|| model.hops(), <[u32]>::len);
        let mut asked = vec![0u32; graph.edge_types.len() * hops];
        for (key, per_hop) in &model.fanouts {
            let Some(e) = graph.edge_type(key) else {
                // An edge type the model samples but the graph lacks; the
                // model does not read it (else its input was refused).
                return Err(mismatch(format!(
                    "the model samples edge type {key}; the sidecar's graph has {}: serve \
                     the model with the graph it was trained on",
                    graph.describe()
                )));
            };
            for (hop, &fanout) in replaced.unwrap_or(per_hop).iter().enumerate() {
                let cap = geometry.max_fanouts[hop.min(MAX_HOPS - 1)];
                if fanout > cap {
                    return Err(mismatch(format!(
                        "fanout {fanout} of edge type {key} at hop {} ({source}) exceeds the \
                         sidecar's max_fanouts {cap}: lower it, or raise the sidecar's \
                         --max-fanouts",
                        hop + 1
                    )));
                }
                asked[e * hops + hop] = fanout;
            }
        }
        Ok(GraphAsk {
            target_type: target_type as u32,
            hops: hops as u32,
            fanouts: asked,
            edge_data: model.edge_columns(&self.inputs),
        })
    }
}

/// A graph-layout session takes exactly the manifest's inputs, each of
/// its role ([`GraphManifest::role`]): a node type's features f32
/// `[n, D]`, its node ids int64 `[n]`, an edge type's `edge_index` int64
/// `[2, e]`, the node and edge counts dynamic; and gives the manifest's
/// output as f32 `[n, width]`. The message names the input, the dtype, the
/// width and the fix.
pub(super) fn check_graph_session(
    session: &Session,
    manifest: &Manifest,
    graph: &GraphManifest,
) -> Result<(), String> {
    let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
    if names != manifest.inputs {
        return Err(if graph.one_type {
            format!(
                "model.onnx takes inputs {names:?}; a subgraph-layout model takes exactly \
                 {SUBGRAPH_INPUTS:?} and the edge data its manifest lists ({:?}): export \
                 model(x, edge_index, ...) with input_names=[\"x\", \"edge_index\", ...] (an \
                 input the model never reads is dropped by the exporter: it must use each)",
                manifest.inputs
            )
        } else {
            format!(
                "model.onnx takes inputs {names:?}, its manifest lists {:?}: export the model \
                 and its manifest together (pyg_model.py)",
                manifest.inputs
            )
        });
    }
    let describe = |ty: &ValueType| -> Option<(TensorElementType, Vec<i64>)> {
        Some((ty.tensor_type()?, ty.tensor_shape()?.to_vec()))
    };
    let dynamic = if graph.one_type {
        "export with dynamic_axes={\"x\": {0: \"n\"}, \"edge_index\": {1: \"e\"}, \
         <output>: {0: \"n\"}} and {0: \"e\"} for each of edge_attr, edge_weight and \
         edge_time it takes"
    } else {
        "export with dynamic_axes making every node count and edge count dynamic \
         (pyg_model.py export does)"
    };
    for input in session.inputs() {
        let name = input.name();
        let Some((ty, shape)) = describe(input.dtype()) else {
            return Err(format!("input {name:?} is not a tensor"));
        };
        let role = graph
            .role(name)
            .ok_or_else(|| format!("input {name:?} is none the manifest declares"))?;
        let (want_ty, sent, export) = match role {
            InputRole::Features(_) => (
                TensorElementType::Float32,
                "f32 feature rows",
                "float32 features",
            ),
            InputRole::NodeIds(_) => (TensorElementType::Int64, "int64 node ids", "int64 ids"),
            InputRole::Edges(_) => (
                TensorElementType::Int64,
                "PyG's int64 edge_index",
                "an int64 (torch.long) edge_index",
            ),
            InputRole::EdgeAttr(_) => (
                TensorElementType::Float32,
                "f32 edge attributes",
                "a float32 edge_attr",
            ),
            InputRole::EdgeWeight(_) => (
                TensorElementType::Float32,
                "f32 edge weights",
                "a float32 edge_weight",
            ),
            InputRole::EdgeTime(_) => (
                TensorElementType::Int64,
                "int64 edge times",
                "an int64 (torch.long) edge_time",
            ),
        };
        if ty != want_ty {
            return Err(format!(
                "input {name:?} is {ty:?}; the sidecar sends {want_ty:?} ({sent}): export with \
                 {export}"
            ));
        }
        // -1 is a dynamic dimension: the node and edge counts must be.
        let (fits, want) = match (role, shape.as_slice()) {
            (InputRole::Features(t), dims) => {
                let dim = i64::from(graph.feature_dim(t));
                (
                    matches!(dims, &[-1, d] if d == -1 || d == dim),
                    format!("[-1, {dim}]"),
                )
            }
            (InputRole::NodeIds(_), dims) => (dims == [-1], "[-1]".to_string()),
            (InputRole::Edges(_), dims) => (
                matches!(dims, &[two, -1] if two == 2 || two == -1),
                "[2, -1]".to_string(),
            ),
            (InputRole::EdgeAttr(key), dims) => {
                let dim = i64::from(graph.edge_dim(key));
                (
                    matches!(dims, &[-1, d] if d == -1 || d == dim),
                    format!("[-1, {dim}]"),
                )
            }
            (InputRole::EdgeWeight(_) | InputRole::EdgeTime(_), dims) => {
                (dims == [-1], "[-1]".to_string())
            }
        };
        if !fits {
            let hint = match (role, shape.as_slice()) {
                (InputRole::Features(t), &[_, d])
                    if d != -1 && d != i64::from(graph.feature_dim(t)) =>
                {
                    format!(
                        "its width {d} is not the segment's feature_dim {} (node type {t}): \
                         train on these features, or re-import the data",
                        graph.feature_dim(t)
                    )
                }
                (InputRole::EdgeAttr(key), &[_, d])
                    if d != -1 && d != i64::from(graph.edge_dim(key)) =>
                {
                    format!(
                        "its width {d} is not the manifest's edge_dim {} (edge type {key}): \
                         export the model and its manifest together",
                        graph.edge_dim(key)
                    )
                }
                _ => dynamic.to_string(),
            };
            return Err(format!(
                "input {name:?} has shape {shape:?}; expected {want} with -1 a dynamic \
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
