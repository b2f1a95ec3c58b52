//! Running a model on a response's buffers in place: binding the
//! tables as tensors, padding empty typed inputs, reading the outputs.

use super::*;
use ort::value::TensorRef;
use protocol::graph_schema::GraphSchema;
use protocol::layout::MAX_HOPS;
use protocol::payload::schema::NO_ROW;
use protocol::payload::{GraphTables, ResponseTables};

impl Model {
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
            return Err(ModelError::Run(
                "a dense-layout response for a subgraph-layout model: run it on the graph \
                 layout's tables (Model::run_subgraph)"
                    .into(),
            ));
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
        if self.manifest.inputs != SUBGRAPH_INPUTS {
            return Err(ModelError::Run(format!(
                "the model takes {:?}, not x and edge_index alone: run it on a response \
                 (Model::run_subgraph)",
                self.manifest.inputs
            )));
        }
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

    /// What input `input` reads of a graph-layout response over `graph`
    /// ([`GraphManifest::role`], checked against the segment's graph at
    /// attach).
    fn binding(&self, input: &str, graph: &GraphSchema) -> Binding {
        let role = self
            .manifest
            .graph
            .as_ref()
            .and_then(|model| model.role(input))
            .expect("a graph-layout model's inputs are checked at load");
        match role {
            InputRole::Features(name) => {
                Binding::Features(graph.node_type(name).expect("checked at start"))
            }
            InputRole::NodeIds(name) => {
                Binding::NodeIds(graph.node_type(name).expect("checked at start"))
            }
            InputRole::Edges(key) => {
                Binding::Edges(graph.edge_type(key).expect("checked at start"))
            }
            InputRole::EdgeAttr(key) => {
                let e = graph.edge_type(key).expect("checked at start");
                Binding::EdgeAttr(e, graph.edge_types[e].data.attr_dim as usize)
            }
            InputRole::EdgeWeight(key) => {
                Binding::EdgeWeight(graph.edge_type(key).expect("checked at start"))
            }
            InputRole::EdgeTime(key) => {
                Binding::EdgeTime(graph.edge_type(key).expect("checked at start"))
            }
        }
    }

    /// Runs a graph-layout model on a graph-layout response over `graph`
    /// (the segment's: a typed graph's, or a one-type graph's as the 1x1
    /// graph, [`protocol::payload::decode_graph`]): each input the model
    /// declares borrows its table in place ([`Model::binding`]); returns
    /// each target's output row (`n_targets x width`; zeros for a target
    /// answered `FRESH`, which has no row). The model does not run when no
    /// target has a row.
    ///
    /// A declared node type with no rows, or edge type with no edges, is
    /// padded ([`Padding`]): some exports cannot run on an empty input (a
    /// TransformerConv on an empty `edge_index`, PyG #9808; an attention
    /// model's reduction over zero rows inside onnxruntime), and a padded
    /// node reaches no target, so the targets' answers are those of the
    /// subgraph as sampled, whatever else shares the batch.
    pub fn run_subgraph(
        &mut self,
        tables: &GraphTables,
        graph: &GraphSchema,
        target_type: usize,
    ) -> Result<Vec<f32>, ModelError> {
        use ort::session::SessionInputValue;
        let run = |e: ort::Error| ModelError::Run(e.to_string());
        let width = self.manifest.output_width() as usize;
        let mut rows = vec![0f32; tables.n_targets() * width];
        if tables.target_rows().iter().all(|&row| row == NO_ROW) {
            return Ok(rows);
        }
        let bindings: Vec<(String, Binding)> = self
            .manifest
            .inputs
            .iter()
            .map(|input| (input.clone(), self.binding(input, graph)))
            .collect();
        let padding = Padding::plan(&bindings, tables, graph);
        let mut bound: Vec<(String, SessionInputValue<'_>)> = Vec::with_capacity(bindings.len());
        for (input, binding) in bindings {
            let value: SessionInputValue<'_> = match binding {
                Binding::Features(t) => {
                    let dim = graph.node_types[t].feature_dim as usize;
                    let x = padding.features(t, tables);
                    TensorRef::from_array_view(([x.len() / dim.max(1), dim], x))
                        .map_err(run)?
                        .into()
                }
                Binding::NodeIds(t) => {
                    let ids = padding.node_ids(t, tables);
                    TensorRef::from_array_view(([ids.len()], ids))
                        .map_err(run)?
                        .into()
                }
                Binding::Edges(e) => {
                    let index = padding.edge_index(e, tables);
                    TensorRef::from_array_view(([2, index.len() / 2], index))
                        .map_err(run)?
                        .into()
                }
                Binding::EdgeAttr(e, dim) => {
                    let attr = padding.edge_attr(e, dim, tables);
                    TensorRef::from_array_view(([attr.len() / dim.max(1), dim], attr))
                        .map_err(run)?
                        .into()
                }
                Binding::EdgeWeight(e) => {
                    let weight = padding.edge_weight(e, tables);
                    TensorRef::from_array_view(([weight.len()], weight))
                        .map_err(run)?
                        .into()
                }
                Binding::EdgeTime(e) => {
                    let time = padding.edge_time(e, tables);
                    TensorRef::from_array_view(([time.len()], time))
                        .map_err(run)?
                        .into()
                }
            };
            bound.push((input, value));
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
        for (t, &row) in tables.target_rows().iter().enumerate() {
            let Ok(row) = usize::try_from(row) else {
                continue;
            };
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

/// What one input of a subgraph-layout model reads (of a response's
/// tables, by type index).
#[derive(Debug, Clone, Copy)]
enum Binding {
    /// A node type's feature rows.
    Features(usize),
    /// A node type's node ids (a type without features).
    NodeIds(usize),
    /// An edge type's `edge_index`.
    Edges(usize),
    /// An edge type's `edge_attr`, of its width.
    EdgeAttr(usize, usize),
    /// An edge type's `edge_weight`.
    EdgeWeight(usize),
    /// An edge type's `edge_time`.
    EdgeTime(usize),
}

/// How [`Model::run_subgraph`] pads a subgraph with an empty input: a
/// node type the model reads with no rows, or that an edge type the model
/// reads with no edges ends at, gets one more row (zeros, node id 0) that
/// no edge of the subgraph reaches; each such edge type gets one edge
/// between its ends' extra rows, with zero attributes, weight 1 and time
/// 0 where the model reads them. Message passing carries nothing from
/// those rows to any other, so every real row's output is the one of the
/// subgraph as sampled: the padding changes which inputs are empty, not
/// an answer.
struct Padding {
    /// Per node type: it has an extra row.
    dummy: Vec<bool>,
    /// Per node type with an extra row: its features, then zeros.
    features: Vec<Option<Vec<f32>>>,
    /// Per node type with an extra row: its node ids, then 0.
    node_ids: Vec<Option<Vec<i64>>>,
    /// Per empty edge type the model reads: the one edge.
    edges: Vec<Option<[i64; 2]>>,
    /// The padded edge's attributes: zeros, as wide as the widest.
    attr_zeros: Vec<f32>,
    /// The inputs that were empty, for an error's message.
    padded: Vec<String>,
}

impl Padding {
    fn plan(bindings: &[(String, Binding)], tables: &GraphTables, graph: &GraphSchema) -> Self {
        let n_types = graph.node_types.len();
        let mut dummy = vec![false; n_types];
        let mut empty_edges = vec![false; graph.edge_types.len()];
        let mut padded = Vec::new();
        for (input, binding) in bindings {
            match *binding {
                Binding::Features(t) | Binding::NodeIds(t) => {
                    if tables.n_rows(t) == 0 {
                        dummy[t] = true;
                        padded.push(input.clone());
                    }
                }
                Binding::EdgeAttr(..) | Binding::EdgeWeight(_) | Binding::EdgeTime(_) => {}
                Binding::Edges(e) => {
                    if tables.edge_index(e).is_empty() {
                        empty_edges[e] = true;
                        let ends = &graph.edge_types[e];
                        dummy[ends.src as usize] = true;
                        dummy[ends.dst as usize] = true;
                        padded.push(input.clone());
                    }
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
        let widest = graph.edge_types.iter().map(|e| e.data.attr_dim);
        Self {
            dummy,
            features,
            node_ids,
            edges,
            attr_zeros: vec![0.0; widest.max().unwrap_or(0) as usize],
            padded,
        }
    }

    fn features<'a>(&'a self, t: usize, tables: &'a GraphTables) -> &'a [f32] {
        self.features[t]
            .as_deref()
            .unwrap_or_else(|| tables.features(t))
    }

    fn node_ids<'a>(&'a self, t: usize, tables: &'a GraphTables) -> &'a [i64] {
        self.node_ids[t]
            .as_deref()
            .unwrap_or_else(|| bytemuck::cast_slice(tables.node_ids(t)))
    }

    fn edge_index<'a>(&'a self, e: usize, tables: &'a GraphTables) -> &'a [i64] {
        match &self.edges[e] {
            Some(edge) => edge,
            None => tables.edge_index(e),
        }
    }

    fn edge_attr<'a>(&'a self, e: usize, dim: usize, tables: &'a GraphTables) -> &'a [f32] {
        match &self.edges[e] {
            Some(_) => &self.attr_zeros[..dim],
            None => tables.edge_attr(e),
        }
    }

    fn edge_weight<'a>(&self, e: usize, tables: &'a GraphTables) -> &'a [f32] {
        match &self.edges[e] {
            Some(_) => &[1.0],
            None => tables.edge_weight(e),
        }
    }

    fn edge_time<'a>(&self, e: usize, tables: &'a GraphTables) -> &'a [i64] {
        match &self.edges[e] {
            Some(_) => &[0],
            None => tables.edge_time(e),
        }
    }
}

/// A one-type subgraph-layout model's two inputs as tensors that borrow
/// the response's buffers in shared memory: `x` the node table's features
/// (`n_nodes x D`), `edge_index` the edge table's `2 x n_edges` values.
pub fn bind_subgraph_inputs(tables: &GraphTables) -> ort::Result<[Input<'_>; 2]> {
    let n = tables.n_rows(0);
    let dim = tables.features(0).len().checked_div(n).unwrap_or(0);
    let edge_index = tables.edge_index(0);
    Ok([
        Input::F32(TensorRef::from_array_view(([n, dim], tables.features(0)))?),
        Input::I64(TensorRef::from_array_view((
            [2, edge_index.len() / 2],
            edge_index,
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
