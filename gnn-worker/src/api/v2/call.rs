//! The Open Inference Protocol's tensors in the worker's terms, shared by
//! its gRPC and HTTP doors: which model a call names, the inputs it gives
//! (turned into the call the native API makes), the outputs it asks for
//! (built from the native answer), and the errors, each naming the problem
//! and the fix (docs/serving.md, "The Open Inference Protocol").

use std::sync::Arc;
use std::time::Duration;

use crate::batcher::{PredictError, Prediction};
use crate::model::{ModelIdentity, ModelTensors, OutputKind};
pub use crate::service::Call;
use crate::service::{Answer, NewNodeCall, Service};

/// Input: the targets' node ids, INT64 `[T]`.
pub const NODE_IDS: &str = "node_ids";
/// Input: a new node's id, INT64 `[1]`.
pub const NEW_NODE_ID: &str = "new_node_id";
/// Input: a new node's feature row, FP32 `[D]`.
pub const NEW_NODE_FEATURES: &str = "new_node_features";
/// Input: a one-type graph's new node's neighbours, INT64 `[K]`.
pub const NEW_NODE_NEIGHBORS: &str = "new_node_neighbors";
/// Input: whether those edges only point from the neighbours to the new
/// node, BOOL `[1]`.
pub const NEW_NODE_DIRECTED: &str = "new_node_directed";
/// Input prefix: a typed graph's new node's edges of one edge type,
/// `new_node_edges:<src>__<relation>__<dst>`, INT64 `[K, 2]` (src, dst).
pub const NEW_NODE_EDGES: &str = "new_node_edges:";

/// The platform the model metadata names.
pub const PLATFORM: &str = "onnxruntime_onnx";
/// The server metadata's name.
pub const SERVER_NAME: &str = "gnn-worker";
/// The protocol extensions the worker implements.
pub const EXTENSIONS: [&str; 1] = ["binary_tensor_data"];
/// The request parameter that bounds a call's time, microseconds
/// (tritonclient's `timeout`).
pub const TIMEOUT_PARAMETER: &str = "timeout";

/// What a gRPC method of `inference.GRPCInferenceService` is to this
/// server: the protocol's core, or a method it does not implement (what
/// tritonclient's other calls reach), with the Triton extension it belongs
/// to when it is one (`None`: no known extension).
pub fn grpc_method(method: &str) -> Result<(), Option<&'static str>> {
    Err(Some(match method {
        "ServerLive" | "ServerReady" | "ModelReady" | "ServerMetadata" | "ModelMetadata"
        | "ModelInfer" => return Ok(()),
        "ModelConfig" => "model configuration",
        "ModelStatistics" => "statistics",
        m if m.starts_with("Repository") => "model repository",
        m if m.starts_with("SystemSharedMemory") => "system shared memory",
        m if m.starts_with("CudaSharedMemory") => "CUDA shared memory",
        "TraceSetting" => "trace",
        "LogSettings" => "logging",
        "ModelStreamInfer" => "streaming inference",
        _ => return Err(None),
    }))
}

/// The Triton extension an HTTP path under `/v2` that this server does
/// not serve belongs to (`None`: no known extension).
pub fn http_extension(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    Some(match segments.as_slice() {
        ["v2", "repository", ..] => "model repository",
        ["v2", "systemsharedmemory", ..] => "system shared memory",
        ["v2", "cudasharedmemory", ..] => "CUDA shared memory",
        ["v2", "logging", ..] => "logging",
        ["v2", .., "trace", "setting"] => "trace",
        ["v2", "models", "stats"] | ["v2", "models", .., "stats"] => "statistics",
        ["v2", "models", .., "config"] => "model configuration",
        ["v2", "models", .., "generate" | "generate_stream"] => "generate",
        _ => return None,
    })
}

/// What a call this server does not implement is answered: the call, the
/// extension it belongs to (if known), and what is served instead.
pub fn not_served(call: &str, extension: Option<&str>) -> String {
    let extension = extension.map_or("an unknown extension".to_string(), |e| {
        format!("the {e} extension")
    });
    format!(
        "{call} belongs to {extension} of the Open Inference Protocol (Triton's), which this \
         server does not implement: it serves the protocol's core, server and model liveness, \
         readiness and metadata, and inference (docs/serving.md, \"The Open Inference \
         Protocol\")"
    )
}

/// A failed protocol call, mapped by each door to its status.
#[derive(Debug, Clone)]
pub enum V2Error {
    /// No such model or version: HTTP 404, gRPC NOT_FOUND.
    NotFound(String),
    /// A malformed call: HTTP 400, gRPC INVALID_ARGUMENT.
    Invalid(String),
    /// What the native call answered.
    Predict(PredictError),
}

impl std::fmt::Display for V2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            V2Error::NotFound(m) | V2Error::Invalid(m) => f.write_str(m),
            V2Error::Predict(e) => write!(f, "{e}"),
        }
    }
}

/// One input tensor as a door received it.
#[derive(Debug, Clone)]
pub struct Input {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    pub data: Data,
}

/// An input's values: raw little-endian bytes (gRPC's
/// `raw_input_contents`, HTTP's binary tensor data), typed contents
/// (gRPC's `contents`), or JSON values (HTTP's `data`, flattened).
#[derive(Debug, Clone)]
pub enum Data {
    Raw(Vec<u8>),
    Int64(Vec<i64>),
    Fp32(Vec<f32>),
    Bool(Vec<bool>),
    Json(Vec<serde_json::Value>),
}

impl Input {
    fn problem(&self, what: impl std::fmt::Display) -> V2Error {
        V2Error::Invalid(format!("input {}: {what}", self.name))
    }

    /// Checks the datatype and the shape's rank (and fixed dimensions:
    /// `Some(n)`), and returns the element count the shape says.
    fn check(&self, datatype: &str, dims: &[Option<i64>], shape: &str) -> Result<usize, V2Error> {
        if self.datatype != datatype {
            return Err(self.problem(format_args!(
                "datatype {}, expected {datatype}: send it as {datatype} {shape}",
                self.datatype
            )));
        }
        let fits = self.shape.len() == dims.len()
            && self
                .shape
                .iter()
                .zip(dims)
                .all(|(&d, want)| d >= 0 && want.is_none_or(|w| w == d));
        if !fits {
            return Err(self.problem(format_args!("shape {:?}, expected {shape}", self.shape)));
        }
        let count = self
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d as usize));
        count.ok_or_else(|| self.problem(format_args!("shape {:?} is too large", self.shape)))
    }

    fn count_mismatch(&self, count: usize, given: usize) -> V2Error {
        self.problem(format_args!(
            "shape {:?} holds {count} values, the data {given}: send as many as the shape says",
            self.shape
        ))
    }

    /// The raw bytes as `count` elements of `size` bytes.
    fn raw<'a>(&self, raw: &'a [u8], count: usize, size: usize) -> Result<&'a [u8], V2Error> {
        match count.checked_mul(size) {
            Some(bytes) if bytes == raw.len() => Ok(raw),
            bytes => Err(self.problem(format_args!(
                "shape {:?} holds {count} values ({} bytes), the raw data has {} bytes",
                self.shape,
                bytes.map_or_else(|| "too many".to_string(), |b| b.to_string()),
                raw.len()
            ))),
        }
    }

    /// The values of a `datatype` input of `dims`: its raw bytes (`size`
    /// bytes each, read by `raw`), its JSON values (`json`), or the
    /// typed contents `contents` finds.
    #[allow(clippy::too_many_arguments)]
    fn values<T: Copy>(
        &self,
        datatype: &str,
        dims: &[Option<i64>],
        shape: &str,
        size: usize,
        raw: fn(&[u8]) -> T,
        json: fn(&serde_json::Value) -> Option<T>,
        contents: fn(&Data) -> Option<&Vec<T>>,
    ) -> Result<Vec<T>, V2Error> {
        let count = self.check(datatype, dims, shape)?;
        let values: Vec<T> = match &self.data {
            Data::Raw(bytes) => self
                .raw(bytes, count, size)?
                .chunks_exact(size)
                .map(raw)
                .collect(),
            Data::Json(values) => values
                .iter()
                .map(|v| {
                    json(v).ok_or_else(|| self.problem(format_args!("{v} is not a {datatype}")))
                })
                .collect::<Result<_, _>>()?,
            typed => contents(typed).cloned().ok_or_else(|| {
                self.problem(format_args!(
                    "its values are not in the contents of a {datatype} tensor"
                ))
            })?,
        };
        if values.len() != count {
            return Err(self.count_mismatch(count, values.len()));
        }
        Ok(values)
    }

    fn int64s(&self, dims: &[Option<i64>], shape: &str) -> Result<Vec<i64>, V2Error> {
        self.values(
            "INT64",
            dims,
            shape,
            8,
            |b| i64::from_le_bytes(b.try_into().expect("8 bytes")),
            serde_json::Value::as_i64,
            |d| match d {
                Data::Int64(v) => Some(v),
                _ => None,
            },
        )
    }

    fn fp32s(&self, dims: &[Option<i64>], shape: &str) -> Result<Vec<f32>, V2Error> {
        self.values(
            "FP32",
            dims,
            shape,
            4,
            |b| f32::from_le_bytes(b.try_into().expect("4 bytes")),
            |v| v.as_f64().map(|f| f as f32),
            |d| match d {
                Data::Fp32(v) => Some(v),
                _ => None,
            },
        )
    }

    fn bools(&self, dims: &[Option<i64>], shape: &str) -> Result<Vec<bool>, V2Error> {
        self.values(
            "BOOL",
            dims,
            shape,
            1,
            |b| b[0] != 0,
            serde_json::Value::as_bool,
            |d| match d {
                Data::Bool(v) => Some(v),
                _ => None,
            },
        )
    }

    /// INT64 values that are node ids (0 or more).
    fn ids(&self, dims: &[Option<i64>], shape: &str) -> Result<Vec<u64>, V2Error> {
        self.int64s(dims, shape)?
            .into_iter()
            .enumerate()
            .map(|(i, id)| {
                u64::try_from(id).map_err(|_| {
                    self.problem(format_args!("value {i} is {id}: node ids are 0 or more"))
                })
            })
            .collect()
    }
}

/// The inputs a model takes, for errors.
fn input_names(tensors: &ModelTensors) -> String {
    match &tensors.typed_edges {
        None => format!(
            "{NODE_IDS}, or {NEW_NODE_ID} and {NEW_NODE_FEATURES} with {NEW_NODE_NEIGHBORS} \
             and {NEW_NODE_DIRECTED}"
        ),
        Some(_) => format!(
            "{NODE_IDS}, or {NEW_NODE_ID} and {NEW_NODE_FEATURES} with \
             {NEW_NODE_EDGES}<edge type>"
        ),
    }
}

/// The call a request's inputs make: `node_ids`, or a new node.
pub fn call_of(inputs: &[Input], tensors: &ModelTensors) -> Result<Call, V2Error> {
    for (i, input) in inputs.iter().enumerate() {
        if inputs[..i].iter().any(|other| other.name == input.name) {
            return Err(V2Error::Invalid(format!(
                "input {} is given twice: give each input once",
                input.name
            )));
        }
        let known = matches!(
            input.name.as_str(),
            NODE_IDS | NEW_NODE_ID | NEW_NODE_FEATURES
        ) || match &tensors.typed_edges {
            None => matches!(input.name.as_str(), NEW_NODE_NEIGHBORS | NEW_NODE_DIRECTED),
            Some(_) => input.name.starts_with(NEW_NODE_EDGES),
        };
        if !known {
            return Err(V2Error::Invalid(format!(
                "unknown input {:?}: this model takes {} (GET /v2/models/<name> lists them)",
                input.name,
                input_names(tensors)
            )));
        }
    }
    let find = |name: &str| inputs.iter().find(|i| i.name == name);
    let new_node = inputs.iter().any(|i| i.name.starts_with("new_node"));
    let node_ids = match find(NODE_IDS) {
        Some(ids) => ids.ids(&[None], "[T], one id per target")?,
        None if !new_node => {
            return Err(V2Error::Invalid(format!(
                "no input: give {}",
                input_names(tensors)
            )))
        }
        None => Vec::new(),
    };
    let new_node = if new_node {
        let (Some(id), Some(features)) = (find(NEW_NODE_ID), find(NEW_NODE_FEATURES)) else {
            return Err(V2Error::Invalid(format!(
                "a new node needs {NEW_NODE_ID} (INT64 [1]) and {NEW_NODE_FEATURES} (FP32 [{}])",
                tensors.feature_dim
            )));
        };
        let row_shape = format!("[{}]", tensors.feature_dim);
        let mut node = NewNodeCall {
            id: id.ids(&[Some(1)], "[1]")?[0],
            features: features.fp32s(&[None], &row_shape)?,
            ..NewNodeCall::default()
        };
        if let Some(n) = find(NEW_NODE_NEIGHBORS) {
            node.neighbors = n.ids(&[None], "[K], one id per neighbour")?;
        }
        if let Some(d) = find(NEW_NODE_DIRECTED) {
            node.directed = d.bools(&[Some(1)], "[1]")?[0];
        }
        if tensors.typed_edges.is_some() {
            let mut edges = Vec::new();
            for input in inputs.iter().filter(|i| i.name.starts_with(NEW_NODE_EDGES)) {
                let ids = input.ids(&[None, Some(2)], "[K, 2], (src, dst) pairs")?;
                let pairs = ids.chunks_exact(2).map(|p| (p[0], p[1])).collect();
                edges.push((input.name[NEW_NODE_EDGES.len()..].to_string(), pairs));
            }
            node.edges = Some(edges);
        }
        Some(node)
    } else {
        None
    };
    // The one rule of every door (`Call::of`): node ids or a new node.
    Call::of(node_ids, new_node).map_err(|e| V2Error::Invalid(e.to_string()))
}

/// An output tensor a model answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputName {
    Label,
    Logits,
    Embedding,
    Known,
    FallbackRows,
    AnsweredBy,
    Degraded,
}

impl OutputName {
    pub fn name(self) -> &'static str {
        match self {
            OutputName::Label => "label",
            OutputName::Logits => "logits",
            OutputName::Embedding => "embedding",
            OutputName::Known => "known",
            OutputName::FallbackRows => "fallback_rows",
            OutputName::AnsweredBy => "answered_by",
            OutputName::Degraded => "degraded",
        }
    }

    pub fn datatype(self) -> &'static str {
        match self {
            OutputName::Label => "INT32",
            OutputName::Logits | OutputName::Embedding => "FP32",
            OutputName::Known | OutputName::Degraded => "BOOL",
            OutputName::FallbackRows => "UINT32",
            OutputName::AnsweredBy => "BYTES",
        }
    }
}

/// A model's outputs, in metadata order: the label and logits of a
/// classifier or an embedding model's vector, then the flags.
pub fn outputs(tensors: &ModelTensors) -> Vec<OutputName> {
    let main: &[OutputName] = match tensors.output {
        OutputKind::Classes => &[OutputName::Label, OutputName::Logits],
        OutputKind::Embedding => &[OutputName::Embedding],
    };
    main.iter()
        .copied()
        .chain([
            OutputName::Known,
            OutputName::FallbackRows,
            OutputName::AnsweredBy,
            OutputName::Degraded,
        ])
        .collect()
}

/// The outputs a call asks for by name (none: every output), checked
/// against the model's.
pub fn requested(names: &[String], tensors: &ModelTensors) -> Result<Vec<OutputName>, V2Error> {
    let available = outputs(tensors);
    if names.is_empty() {
        return Ok(available);
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(V2Error::Invalid(format!(
                "output {name} is asked for twice: ask for each output once"
            )));
        }
        let found = available.iter().find(|o| o.name() == name).ok_or_else(|| {
            let names: Vec<&str> = available.iter().map(|o| o.name()).collect();
            V2Error::Invalid(format!(
                "unknown output {name:?}: this model answers {}",
                names.join(", ")
            ))
        })?;
        out.push(*found);
    }
    Ok(out)
}

/// One tensor's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
}

/// The inputs' metadata: `node_ids`, then a new node's.
pub fn inputs_meta(tensors: &ModelTensors) -> Vec<TensorMeta> {
    let meta = |name: &str, datatype, shape: Vec<i64>| TensorMeta {
        name: name.to_string(),
        datatype,
        shape,
    };
    let mut inputs = vec![
        meta(NODE_IDS, "INT64", vec![-1]),
        meta(NEW_NODE_ID, "INT64", vec![1]),
        meta(
            NEW_NODE_FEATURES,
            "FP32",
            vec![i64::from(tensors.feature_dim)],
        ),
    ];
    match &tensors.typed_edges {
        None => {
            inputs.push(meta(NEW_NODE_NEIGHBORS, "INT64", vec![-1]));
            inputs.push(meta(NEW_NODE_DIRECTED, "BOOL", vec![1]));
        }
        Some(edge_types) => {
            for key in edge_types {
                inputs.push(meta(
                    &format!("{NEW_NODE_EDGES}{key}"),
                    "INT64",
                    vec![-1, 2],
                ));
            }
        }
    }
    inputs
}

/// The outputs' metadata.
pub fn outputs_meta(tensors: &ModelTensors) -> Vec<TensorMeta> {
    outputs(tensors)
        .into_iter()
        .map(|o| TensorMeta {
            name: o.name().to_string(),
            datatype: o.datatype(),
            shape: match o {
                OutputName::Logits | OutputName::Embedding => {
                    vec![-1, i64::from(tensors.width)]
                }
                _ => vec![-1],
            },
        })
        .collect()
}

/// An output tensor's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Int32(Vec<i32>),
    Uint32(Vec<u32>),
    Fp32(Vec<f32>),
    Bool(Vec<bool>),
    Bytes(Vec<Vec<u8>>),
}

impl Values {
    /// The protocol's raw form: little-endian elements, one byte per BOOL,
    /// and each BYTES element as a little-endian u32 length and its bytes.
    pub fn raw(&self) -> Vec<u8> {
        match self {
            Values::Int32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::Uint32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::Fp32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
            Values::Bytes(v) => v
                .iter()
                .flat_map(|b| {
                    let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
                    len.to_le_bytes().into_iter().chain(b.iter().copied())
                })
                .collect(),
        }
    }

    /// The JSON form: a flat array (BYTES as strings).
    pub fn json(&self) -> serde_json::Value {
        match self {
            Values::Int32(v) => serde_json::json!(v),
            Values::Uint32(v) => serde_json::json!(v),
            Values::Fp32(v) => serde_json::json!(v),
            Values::Bool(v) => serde_json::json!(v),
            Values::Bytes(v) => serde_json::Value::Array(
                v.iter()
                    .map(|b| serde_json::Value::String(String::from_utf8_lossy(b).into_owned()))
                    .collect(),
            ),
        }
    }
}

/// One output tensor of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub name: OutputName,
    pub shape: Vec<i64>,
    pub values: Values,
}

/// The output `name` of an answer's predictions.
pub fn output(
    name: OutputName,
    predictions: &[Prediction],
    tensors: &ModelTensors,
) -> Result<Output, V2Error> {
    let rows = predictions.len() as i64;
    let matrix = |row: fn(&Prediction) -> &Vec<f32>| -> Result<Output, V2Error> {
        let width = tensors.width as usize;
        let mut values = Vec::with_capacity(predictions.len() * width);
        for p in predictions {
            let r = row(p);
            if r.len() != width {
                return Err(V2Error::Predict(PredictError::Internal(format!(
                    "node {}'s {} has {} values, the model's width is {width}",
                    p.node_id,
                    name.name(),
                    r.len()
                ))));
            }
            values.extend_from_slice(r);
        }
        Ok(Output {
            name,
            shape: vec![rows, width as i64],
            values: Values::Fp32(values),
        })
    };
    let vector = |values| Output {
        name,
        shape: vec![rows],
        values,
    };
    Ok(match name {
        OutputName::Logits => matrix(|p| &p.logits)?,
        OutputName::Embedding => matrix(|p| &p.embedding)?,
        OutputName::Label => vector(Values::Int32(predictions.iter().map(|p| p.label).collect())),
        OutputName::Known => vector(Values::Bool(predictions.iter().map(|p| p.known).collect())),
        OutputName::FallbackRows => vector(Values::Uint32(
            predictions.iter().map(|p| p.fallback_rows).collect(),
        )),
        OutputName::Degraded => vector(Values::Bool(
            predictions.iter().map(Prediction::degraded).collect(),
        )),
        OutputName::AnsweredBy => vector(Values::Bytes(
            predictions
                .iter()
                .map(|p| p.answered_by.as_str().as_bytes().to_vec())
                .collect(),
        )),
    })
}

/// The model a call names: the one served, under its name and (when the
/// call names one) its version.
pub fn model_for(
    service: &Service,
    name: &str,
    version: Option<&str>,
) -> Result<Arc<ModelIdentity>, V2Error> {
    let Some(model) = service.model() else {
        return Err(V2Error::Predict(PredictError::Unavailable(format!(
            "no model is loaded yet ({}): retry once /v2/health/ready answers 200",
            service.readiness().err().unwrap_or_default()
        ))));
    };
    if name != model.name {
        return Err(V2Error::NotFound(format!(
            "no model {name:?}: this worker serves {:?} (version {})",
            model.name, model.version
        )));
    }
    match version {
        Some(v) if !v.is_empty() && v != model.version => Err(V2Error::NotFound(format!(
            "model {name:?} has no version {v:?}: it serves version {} (or leave the version out)",
            model.version
        ))),
        _ => Ok(model),
    }
}

/// A request parameter `timeout` (microseconds) as a deadline.
pub fn timeout_of(micros: Option<i64>) -> Result<Option<Duration>, V2Error> {
    match micros {
        None => Ok(None),
        Some(us) if (1..=3_600_000_000).contains(&us) => Ok(Some(Duration::from_micros(us as u64))),
        Some(us) => Err(V2Error::Invalid(format!(
            "parameter {TIMEOUT_PARAMETER} is {us}: give microseconds in 1..=3600000000"
        ))),
    }
}

/// The earlier of two deadlines.
pub fn earlier(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A protocol inference through the native service: the model named, its
/// inputs as a call, the outputs asked for built from the answer. The
/// answer's model (a rollout may switch between the lookup and the call)
/// names the response.
pub async fn infer(
    service: &Service,
    name: &str,
    version: Option<&str>,
    inputs: &[Input],
    output_names: &[String],
    left: Option<Duration>,
) -> Result<Inferred, V2Error> {
    let model = model_for(service, name, version)?;
    requested(output_names, &model.tensors)?;
    let call = call_of(inputs, &model.tensors)?;
    let answer: Answer = service.call(call, left).await.map_err(V2Error::Predict)?;
    let tensors = &answer.model.tensors;
    let outputs = requested(output_names, tensors)?
        .into_iter()
        .map(|o| output(o, &answer.predictions, tensors))
        .collect::<Result<_, _>>()?;
    Ok(Inferred {
        degraded: answer.predictions.iter().any(Prediction::degraded),
        model: answer.model,
        outputs,
    })
}

/// A call's answer in the protocol's terms.
#[derive(Debug)]
pub struct Inferred {
    pub model: Arc<ModelIdentity>,
    pub outputs: Vec<Output>,
    /// Some prediction of the call is degraded: the response's parameter
    /// `degraded` (docs/serving.md, "Degraded answers").
    pub degraded: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::NewEdges;
    use crate::model::AnsweredBy;

    fn tensors(output: OutputKind, typed: bool) -> ModelTensors {
        ModelTensors {
            output,
            width: 3,
            feature_dim: 2,
            typed_edges: typed.then(|| vec!["paper__cites__paper".to_string()]),
        }
    }

    fn input(name: &str, datatype: &str, shape: &[i64], data: Data) -> Input {
        Input {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            data,
        }
    }

    fn invalid(result: Result<Call, V2Error>) -> String {
        match result {
            Err(V2Error::Invalid(m)) => m,
            other => panic!("expected an invalid call, got {other:?}"),
        }
    }

    #[test]
    fn node_ids_come_raw_typed_or_as_json() {
        let t = tensors(OutputKind::Classes, false);
        let raw: Vec<u8> = [7i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        for data in [
            Data::Raw(raw),
            Data::Int64(vec![7, 9]),
            Data::Json(vec![7.into(), 9.into()]),
        ] {
            let call = call_of(&[input(NODE_IDS, "INT64", &[2], data)], &t).unwrap();
            assert_eq!(call, Call::Known(vec![7, 9]));
        }
    }

    #[test]
    fn malformed_inputs_are_named() {
        let t = tensors(OutputKind::Classes, false);
        let m = invalid(call_of(
            &[input(NODE_IDS, "FP32", &[1], Data::Fp32(vec![1.0]))],
            &t,
        ));
        assert!(m.contains("datatype FP32, expected INT64"), "{m}");
        let m = invalid(call_of(
            &[input(NODE_IDS, "INT64", &[1, 2], Data::Int64(vec![1, 2]))],
            &t,
        ));
        assert!(m.contains("shape [1, 2], expected [T]"), "{m}");
        let m = invalid(call_of(
            &[input(NODE_IDS, "INT64", &[3], Data::Int64(vec![1, 2]))],
            &t,
        ));
        assert!(m.contains("holds 3 values, the data 2"), "{m}");
        let m = invalid(call_of(
            &[input(NODE_IDS, "INT64", &[2], Data::Raw(vec![0; 12]))],
            &t,
        ));
        assert!(m.contains("raw data has 12 bytes"), "{m}");
        // A shape whose byte count overflows: refused, no panic.
        let m = invalid(call_of(
            &[input(NODE_IDS, "INT64", &[1 << 62], Data::Raw(vec![0; 8]))],
            &t,
        ));
        assert!(m.contains("too many bytes"), "{m}");
        let m = invalid(call_of(
            &[input(NODE_IDS, "INT64", &[1], Data::Int64(vec![-4]))],
            &t,
        ));
        assert!(m.contains("-4: node ids are 0 or more"), "{m}");
        let m = invalid(call_of(
            &[input("ids", "INT64", &[1], Data::Int64(vec![1]))],
            &t,
        ));
        assert!(m.contains("unknown input \"ids\""), "{m}");
        let m = invalid(call_of(
            &[
                input(NODE_IDS, "INT64", &[1], Data::Int64(vec![1])),
                input(NODE_IDS, "INT64", &[1], Data::Int64(vec![1])),
            ],
            &t,
        ));
        assert!(m.contains("given twice"), "{m}");
        let m = invalid(call_of(&[], &t));
        assert!(m.starts_with("no input"), "{m}");
    }

    #[test]
    fn a_new_node_is_its_inputs() {
        let t = tensors(OutputKind::Classes, false);
        let call = call_of(
            &[
                input(NEW_NODE_ID, "INT64", &[1], Data::Int64(vec![100])),
                input(NEW_NODE_FEATURES, "FP32", &[2], Data::Fp32(vec![0.5, 1.5])),
                input(NEW_NODE_NEIGHBORS, "INT64", &[2], Data::Int64(vec![3, 4])),
                input(NEW_NODE_DIRECTED, "BOOL", &[1], Data::Bool(vec![true])),
            ],
            &t,
        )
        .unwrap();
        assert_eq!(
            call,
            Call::New {
                id: 100,
                features: vec![0.5, 1.5],
                edges: NewEdges::Neighbors {
                    neighbors: vec![3, 4],
                    directed: true
                }
            }
        );
        let typed = tensors(OutputKind::Classes, true);
        let call = call_of(
            &[
                input(NEW_NODE_ID, "INT64", &[1], Data::Int64(vec![5])),
                input(NEW_NODE_FEATURES, "FP32", &[2], Data::Fp32(vec![1.0, 2.0])),
                input(
                    "new_node_edges:paper__cites__paper",
                    "INT64",
                    &[2, 2],
                    Data::Int64(vec![5, 1, 2, 5]),
                ),
            ],
            &typed,
        )
        .unwrap();
        assert_eq!(
            call,
            Call::New {
                id: 5,
                features: vec![1.0, 2.0],
                edges: NewEdges::Named(vec![("paper__cites__paper".into(), vec![(5, 1), (2, 5)])])
            }
        );
        // A typed model's new node has no `neighbors`.
        let m = invalid(call_of(
            &[input(
                NEW_NODE_NEIGHBORS,
                "INT64",
                &[1],
                Data::Int64(vec![1]),
            )],
            &typed,
        ));
        assert!(m.contains("unknown input"), "{m}");
        let m = invalid(call_of(
            &[
                input(NODE_IDS, "INT64", &[1], Data::Int64(vec![1])),
                input(NEW_NODE_ID, "INT64", &[1], Data::Int64(vec![100])),
                input(NEW_NODE_FEATURES, "FP32", &[2], Data::Fp32(vec![1.0, 2.0])),
            ],
            &t,
        ));
        assert!(m.contains("not both"), "{m}");
    }

    #[test]
    fn the_extensions_not_served_are_named() {
        assert_eq!(grpc_method("ModelInfer"), Ok(()));
        assert_eq!(grpc_method("ModelConfig"), Err(Some("model configuration")));
        assert_eq!(
            grpc_method("RepositoryModelLoad"),
            Err(Some("model repository"))
        );
        assert_eq!(
            grpc_method("CudaSharedMemoryStatus"),
            Err(Some("CUDA shared memory"))
        );
        assert_eq!(grpc_method("Whatever"), Err(None));
        let http = |path| http_extension(path).unwrap_or("none");
        assert_eq!(http("/v2/models/m/config"), "model configuration");
        assert_eq!(
            http("/v2/models/m/versions/1/config"),
            "model configuration"
        );
        assert_eq!(http("/v2/models/stats"), "statistics");
        assert_eq!(http("/v2/models/m/stats"), "statistics");
        assert_eq!(http("/v2/repository/index"), "model repository");
        assert_eq!(http("/v2/repository/models/m/load"), "model repository");
        assert_eq!(
            http("/v2/systemsharedmemory/status"),
            "system shared memory"
        );
        assert_eq!(http("/v2/trace/setting"), "trace");
        assert_eq!(http("/v2/models/m/trace/setting"), "trace");
        assert_eq!(http("/v2/logging"), "logging");
        assert_eq!(http("/v2/models/m/generate"), "generate");
        assert_eq!(http("/v2/nothing"), "none");
        let m = not_served("ModelConfig", Some("model configuration"));
        assert!(m.contains("the model configuration extension"), "{m}");
        assert!(not_served("X", None).contains("an unknown extension"));
    }

    #[test]
    fn outputs_are_checked_and_built() {
        let classes = tensors(OutputKind::Classes, false);
        let embedding = tensors(OutputKind::Embedding, false);
        let names =
            |t: &ModelTensors| -> Vec<&str> { outputs(t).iter().map(|o| o.name()).collect() };
        assert_eq!(
            names(&classes),
            [
                "label",
                "logits",
                "known",
                "fallback_rows",
                "answered_by",
                "degraded"
            ]
        );
        assert_eq!(
            names(&embedding),
            [
                "embedding",
                "known",
                "fallback_rows",
                "answered_by",
                "degraded"
            ]
        );
        match requested(&["logits".into()], &embedding) {
            Err(V2Error::Invalid(m)) => assert!(m.contains("unknown output \"logits\""), "{m}"),
            other => panic!("{other:?}"),
        }
        let p = |id, label, logits: Vec<f32>| Prediction {
            node_id: id,
            label,
            logits,
            embedding: Vec::new(),
            known: id != 9,
            fallback_rows: 2,
            answered_by: AnsweredBy::Gnn,
        };
        let predictions = [p(1, 2, vec![0.1, 0.2, 0.7]), p(9, 0, vec![0.5, 0.25, 0.25])];
        let logits = output(OutputName::Logits, &predictions, &classes).unwrap();
        assert_eq!(logits.shape, [2, 3]);
        assert_eq!(logits.values.raw().len(), 24);
        let known = output(OutputName::Known, &predictions, &classes).unwrap();
        assert_eq!(known.values.raw(), [1, 0]);
        let by = output(OutputName::AnsweredBy, &predictions, &classes).unwrap();
        assert_eq!(&by.values.raw()[..7], [3, 0, 0, 0, b'g', b'n', b'n']);
        assert_eq!(by.values.json(), serde_json::json!(["gnn", "gnn"]));
        // Two default rows each: both answers are degraded.
        let degraded = output(OutputName::Degraded, &predictions, &classes).unwrap();
        assert_eq!(degraded.values.raw(), [1, 1]);
    }

    #[test]
    fn timeouts_are_microseconds() {
        assert_eq!(
            timeout_of(Some(1500)).unwrap(),
            Some(Duration::from_micros(1500))
        );
        assert!(matches!(timeout_of(Some(0)), Err(V2Error::Invalid(_))));
        assert_eq!(
            earlier(
                Some(Duration::from_millis(5)),
                Some(Duration::from_millis(2))
            ),
            Some(Duration::from_millis(2))
        );
    }
}
