//! Rewriting an exported PyTorch Geometric model's slow aggregation at load
//! (docs/model.md, "Speed: the scatter rewrite").
//!
//! PyG's sum and mean aggregation exports (TorchScript exporter) as
//!
//! ```text
//! R = Reshape(index, [-1, 1])          # [E, 1]
//! X = Expand(R, Shape(src))            # [E, D], the index repeated per column
//! O = ScatterElements(zeros, X, Slice(src, ...), axis=0, reduction=add)
//! ```
//!
//! and ONNX Runtime's CPU kernel for `ScatterElements` walks the [E, D]
//! tensors element by element: on cora (D = 1,433) it is most of a
//! SAGEConv model's time. `ScatterND(zeros, R, updates, reduction=add)` adds
//! the same rows in the same order (so the sums are bit-identical) with a
//! kernel that copies whole rows, and without materialising `X`. This
//! module finds exactly that pattern in a model's top-level graph and
//! replaces it; anything else (attention models put `If`, `NonZero` and
//! `Range` around their scatters, max/min reductions, other axes) is left
//! alone. A shape that broke the pattern's assumption (an index of another
//! length than `src`) fails inside ONNX Runtime rather than answering
//! differently: `ScatterND` checks that its updates have the index's rows.
//!
//! The model file is read as protobuf wire data: fields are kept
//! byte-for-byte except the nodes rewritten, so nothing the worker does not
//! understand is lost. No ONNX library is linked.

use std::collections::{HashMap, HashSet};

/// Why a model file could not be read for the rewrite.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("model.onnx is not a valid ONNX protobuf ({0}): export it again")]
    Malformed(&'static str),
}

/// A model after the rewrite.
#[derive(Debug)]
pub struct Rewritten {
    /// The model, rewritten or not.
    pub bytes: Vec<u8>,
    /// Scatter-adds replaced.
    pub scatters: usize,
    /// The model's opset of the default ONNX domain.
    pub opset: Option<i64>,
}

/// The smallest opset whose `ScatterND` takes `reduction` (ONNX 16).
const SCATTER_ND_REDUCTION_OPSET: i64 = 16;

/// Rewrites every row scatter-add of the pattern above, where the model's
/// opset allows `ScatterND` with a reduction.
pub fn rewrite_scatter_adds(model: &[u8]) -> Result<Rewritten, GraphError> {
    let fields = parse(model)?;
    let mut opset = None;
    let mut graph = None;
    for field in &fields {
        match (field.number, &field.value) {
            (8, Value::Bytes(bytes)) => {
                let (domain, version) = opset_import(bytes)?;
                if domain.is_empty() || domain == "ai.onnx" {
                    opset = Some(version);
                }
            }
            (7, Value::Bytes(bytes)) => graph = Some(*bytes),
            _ => {}
        }
    }
    let unchanged = |opset| Rewritten {
        bytes: model.to_vec(),
        scatters: 0,
        opset,
    };
    let Some(graph) = graph else {
        return Ok(unchanged(opset));
    };
    if opset.is_none_or(|v| v < SCATTER_ND_REDUCTION_OPSET) {
        return Ok(unchanged(opset));
    }
    let (new_graph, scatters) = rewrite_graph(graph)?;
    if scatters == 0 {
        return Ok(unchanged(opset));
    }
    let mut bytes = Vec::with_capacity(model.len());
    for field in &fields {
        if field.number == 7 {
            put_bytes(&mut bytes, 7, &new_graph);
        } else {
            bytes.extend_from_slice(field.raw);
        }
    }
    Ok(Rewritten {
        bytes,
        scatters,
        opset,
    })
}

/// ONNX's element types the extrema fix writes an infinity of.
const FLOAT: u64 = 1;
const DOUBLE: u64 = 11;

/// Why a model's extrema scatters cannot be fixed at load.
#[derive(Debug, thiserror::Error)]
pub enum ExtremaError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(
        "model.onnx's {node} computes the {reduction} of 0 and the messages (ScatterElements on \
         zeros, as the TorchScript exporter writes PyG's scatter(..., reduce=\"{reduction}\")) \
         over {what} values, which the worker cannot correct at load: export the model with \
         gnn-worker/model/pyg_model.py export, which writes PyG's {reduction}"
    )]
    Unfixable {
        node: String,
        reduction: &'static str,
        what: &'static str,
    },
}

/// A model after the extrema fix.
#[derive(Debug)]
pub struct ExtremaFixed {
    pub bytes: Vec<u8>,
    /// The scatters corrected, by node name.
    pub fixed: Vec<String>,
}

/// Corrects the TorchScript exporter's max/min aggregation. PyG's
/// `scatter(..., reduce="max")` (torch's `scatter_reduce` with
/// `include_self=False` on a zeros tensor) exports as
/// `ScatterElements(zeros, index, src, reduction="max")`: the maximum of 0
/// and the messages, wrong where all of a node's messages are negative
/// (max aggregation answers 0; an attention softmax, which subtracts the
/// max, underflows). Each top-level scatter of that pattern (its data a
/// `ConstantOfShape` of zeros, passed on by `Identity`, `Reshape` or both
/// branches of an `If`) becomes the computation PyG does:
///
/// ```text
/// start   = Add(zeros, -inf)            # +inf for min
/// reduced = ScatterElements(start, index, src, reduction="max")
/// out     = Where(IsInf(reduced, negative), zeros, reduced)  # 0 where nothing arrived
/// ```
///
/// as `pyg_model.py export` writes it (`fix_scatter_extrema`), so a model
/// exported by hand answers as one exported by the tooling. Every other
/// byte of the model is kept.
pub fn fix_scatter_extrema(model: &[u8]) -> Result<ExtremaFixed, ExtremaError> {
    let fields = parse(model)?;
    let Some(graph) = fields.iter().find_map(|f| match (f.number, f.value) {
        (7, Value::Bytes(graph)) => Some(graph),
        _ => None,
    }) else {
        return Ok(ExtremaFixed {
            bytes: model.to_vec(),
            fixed: Vec::new(),
        });
    };
    let graph_fields = parse(graph)?;
    let mut nodes = Vec::new();
    for field in &graph_fields {
        if let (1, Value::Bytes(bytes)) = (field.number, field.value) {
            nodes.push(node(bytes, field.raw)?);
        }
    }
    let producer: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let mut replaced: HashMap<usize, Vec<Vec<u8>>> = HashMap::new();
    let mut fixed = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let reduction = match n.attributes.get("reduction") {
            Some(Attribute::Bytes(r)) if r == b"max" => "max",
            Some(Attribute::Bytes(r)) if r == b"min" => "min",
            _ => continue,
        };
        if n.op_type != "ScatterElements" || !n.domain.is_empty() || n.inputs.len() != 3 {
            continue;
        }
        let Some(data_type) = zeros_source(&n.inputs[0], &nodes, &producer, 0)? else {
            continue;
        };
        let infinity: Vec<u8> = match (data_type, reduction) {
            (FLOAT, "max") => f32::NEG_INFINITY.to_le_bytes().to_vec(),
            (FLOAT, _) => f32::INFINITY.to_le_bytes().to_vec(),
            (DOUBLE, "max") => f64::NEG_INFINITY.to_le_bytes().to_vec(),
            (DOUBLE, _) => f64::INFINITY.to_le_bytes().to_vec(),
            _ => {
                return Err(ExtremaError::Unfixable {
                    node: format!("{} node {:?}", n.op_type, n.name),
                    reduction,
                    what: "non-f32, non-f64",
                })
            }
        };
        let (data, out) = (n.inputs[0].as_str(), n.outputs[0].as_str());
        let at = format!("{out}/include_self_false");
        let (inf, start, reduced, empty) = (
            format!("{at}/inf"),
            format!("{at}/start"),
            format!("{at}/reduced"),
            format!("{at}/empty"),
        );
        let mut tensor = Vec::new();
        put_varint_field(&mut tensor, 2, data_type);
        put_bytes(&mut tensor, 9, &infinity);
        let mut value = Vec::new();
        put_bytes(&mut value, 1, b"value");
        put_bytes(&mut value, 5, &tensor);
        put_varint_field(&mut value, 20, 4); // AttributeType TENSOR
        let mut scatter = n.clone();
        scatter.inputs[0] = start.clone();
        scatter.outputs[0] = reduced.clone();
        let (positive, negative) = if reduction == "max" { (0, 1) } else { (1, 0) };
        replaced.insert(
            i,
            vec![
                plain_node("Constant", &format!("{at}/Constant"), &[], &inf, &[value]),
                plain_node("Add", &format!("{at}/Add"), &[data, &inf], &start, &[]),
                encode_node(&scatter, n.raw)?,
                plain_node(
                    "IsInf",
                    &format!("{at}/IsInf"),
                    &[&reduced],
                    &empty,
                    &[
                        int_attribute("detect_positive", positive),
                        int_attribute("detect_negative", negative),
                    ],
                ),
                plain_node(
                    "Where",
                    &format!("{at}/Where"),
                    &[&empty, data, &reduced],
                    out,
                    &[],
                ),
            ],
        );
        fixed.push(n.name.clone());
    }
    if fixed.is_empty() {
        return Ok(ExtremaFixed {
            bytes: model.to_vec(),
            fixed,
        });
    }
    let mut new_graph = Vec::with_capacity(graph.len() + 512 * fixed.len());
    let mut node_index = 0;
    for field in &graph_fields {
        if field.number != 1 {
            new_graph.extend_from_slice(field.raw);
            continue;
        }
        match replaced.get(&node_index) {
            Some(nodes) => {
                for n in nodes {
                    put_bytes(&mut new_graph, 1, n);
                }
            }
            None => new_graph.extend_from_slice(field.raw),
        }
        node_index += 1;
    }
    let mut bytes = Vec::with_capacity(model.len() + new_graph.len() - graph.len());
    for field in &fields {
        if field.number == 7 {
            put_bytes(&mut bytes, 7, &new_graph);
        } else {
            bytes.extend_from_slice(field.raw);
        }
    }
    Ok(ExtremaFixed { bytes, fixed })
}

/// Whether tensor `name` is all zeros by construction, and its element
/// type: a `ConstantOfShape` of zeros (its default value is a float 0),
/// passed on by `Identity`, `Reshape`, or both branches of an `If` (how
/// the TorchScript exporter hands `scatter_reduce` its `new_zeros`).
fn zeros_source(
    name: &str,
    nodes: &[Node<'_>],
    producer: &HashMap<&str, usize>,
    depth: usize,
) -> Result<Option<u64>, GraphError> {
    let Some(n) = producer.get(name).map(|&i| &nodes[i]) else {
        return Ok(None);
    };
    if depth > 16 || !n.domain.is_empty() {
        return Ok(None);
    }
    Ok(match n.op_type.as_str() {
        "ConstantOfShape" => match n.attributes.get("value") {
            None => Some(FLOAT),
            Some(Attribute::Tensor {
                data_type,
                zero: true,
            }) => Some(*data_type),
            Some(Attribute::Ints(values)) if values.iter().all(|&v| v == 0) => Some(7),
            _ => None,
        },
        "Identity" | "Reshape" => zeros_source(&n.inputs[0], nodes, producer, depth + 1)?,
        "If" => {
            let Some(k) = n.outputs.iter().position(|o| o == name) else {
                return Ok(None);
            };
            if n.branches.len() != 2 {
                return Ok(None);
            }
            let mut found = None;
            for branch in &n.branches {
                let mut inner = Vec::new();
                let mut outputs = Vec::new();
                for field in parse(branch)? {
                    match (field.number, field.value) {
                        (1, Value::Bytes(bytes)) => inner.push(node(bytes, field.raw)?),
                        (12, Value::Bytes(info)) => {
                            for f in parse(info)? {
                                if let (1, Value::Bytes(o)) = (f.number, f.value) {
                                    outputs.push(string(o)?);
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let Some(out) = outputs.get(k) else {
                    return Ok(None);
                };
                let Some(passed) = inner.iter().find(|m| m.outputs.contains(out)) else {
                    return Ok(None);
                };
                if !matches!(passed.op_type.as_str(), "Identity" | "Reshape") {
                    return Ok(None);
                }
                match zeros_source(&passed.inputs[0], nodes, producer, depth + 1)? {
                    Some(t) if found.is_none_or(|f| f == t) => found = Some(t),
                    _ => return Ok(None),
                }
            }
            found
        }
        _ => None,
    })
}

/// A node of the default domain.
fn plain_node(
    op: &str,
    name: &str,
    inputs: &[&str],
    output: &str,
    attributes: &[Vec<u8>],
) -> Vec<u8> {
    let mut node = Vec::new();
    for input in inputs {
        put_bytes(&mut node, 1, input.as_bytes());
    }
    put_bytes(&mut node, 2, output.as_bytes());
    put_bytes(&mut node, 3, name.as_bytes());
    put_bytes(&mut node, 4, op.as_bytes());
    for attribute in attributes {
        put_bytes(&mut node, 5, attribute);
    }
    node
}

/// An `AttributeProto` of one integer.
fn int_attribute(name: &str, value: u64) -> Vec<u8> {
    let mut attribute = Vec::new();
    put_bytes(&mut attribute, 1, name.as_bytes());
    put_varint_field(&mut attribute, 3, value);
    put_varint_field(&mut attribute, 20, 2); // AttributeType INT
    attribute
}

/// A parsed `NodeProto`: what the rewrite reads, and its encoding.
#[derive(Debug, Clone)]
struct Node<'a> {
    inputs: Vec<String>,
    outputs: Vec<String>,
    name: String,
    op_type: String,
    domain: String,
    /// Attributes by name: integer, string and int64 tensor values.
    attributes: HashMap<String, Attribute>,
    /// Names read by subgraphs in its attributes (If, Loop, Scan bodies).
    nested_reads: Vec<String>,
    /// The graphs of its graph attributes (an If's branches), in order.
    branches: Vec<&'a [u8]>,
    raw: &'a [u8],
}

#[derive(Debug, Clone, PartialEq)]
enum Attribute {
    Int(i64),
    Bytes(Vec<u8>),
    Ints(Vec<i64>),
    /// A tensor of another element type: its `data_type` and whether every
    /// value is (bitwise) zero.
    Tensor {
        data_type: u64,
        zero: bool,
    },
    Other,
}

/// Rewrites the graph's nodes; returns the new `GraphProto` bytes and the
/// number of scatters replaced.
fn rewrite_graph(graph: &[u8]) -> Result<(Vec<u8>, usize), GraphError> {
    let fields = parse(graph)?;
    let mut nodes = Vec::new();
    let mut constants: HashMap<String, Vec<i64>> = HashMap::new();
    let mut graph_outputs = HashSet::new();
    for field in &fields {
        match (field.number, &field.value) {
            (1, Value::Bytes(bytes)) => nodes.push(node(bytes, field.raw)?),
            (5, Value::Bytes(bytes)) => {
                if let Some((name, values)) = int64_tensor(bytes)? {
                    constants.insert(name, values);
                }
            }
            (12, Value::Bytes(bytes)) => {
                for f in parse(bytes)? {
                    if let (1, Value::Bytes(name)) = (f.number, f.value) {
                        graph_outputs.insert(string(name)?);
                    }
                }
            }
            _ => {}
        }
    }
    for n in &nodes {
        if n.op_type == "Constant" && n.domain.is_empty() && n.outputs.len() == 1 {
            if let Some(Attribute::Ints(values)) = n.attributes.get("value") {
                constants.insert(n.outputs[0].clone(), values.clone());
            }
        }
    }
    let producer: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let produced_by = |name: &str, op: &str| {
        producer
            .get(name)
            .copied()
            .filter(|&i| nodes[i].op_type == op && nodes[i].domain.is_empty())
    };
    // Node index -> its replacement; expand outputs -> the tensor whose
    // shape they have.
    let mut replaced: HashMap<usize, Vec<u8>> = HashMap::new();
    let mut expands: HashMap<String, (usize, String)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if n.op_type != "ScatterElements" || !n.domain.is_empty() || n.inputs.len() != 3 {
            continue;
        }
        let axis = match n.attributes.get("axis") {
            None => 0,
            Some(Attribute::Int(axis)) => *axis,
            Some(_) => continue,
        };
        if axis != 0 || n.attributes.get("reduction") != Some(&Attribute::Bytes(b"add".to_vec())) {
            continue;
        }
        let Some(expand) = produced_by(&n.inputs[1], "Expand") else {
            continue;
        };
        let expand_node = &nodes[expand];
        let Some(reshape) = produced_by(&expand_node.inputs[0], "Reshape") else {
            continue;
        };
        let column = nodes[reshape]
            .inputs
            .get(1)
            .and_then(|shape| constants.get(shape));
        if column.map(Vec::as_slice) != Some(&[-1, 1]) {
            continue;
        }
        let Some(shape) = expand_node
            .inputs
            .get(1)
            .and_then(|s| produced_by(s, "Shape"))
        else {
            continue;
        };
        let src = &nodes[shape].inputs[0];
        // The updates are `src` or a slice of it (PyG slices it to the
        // index's shape, which is `src`'s).
        let updates = &n.inputs[2];
        let from_src = updates == src
            || produced_by(updates, "Slice").is_some_and(|s| nodes[s].inputs[0] == *src);
        if !from_src {
            continue;
        }
        replaced.insert(
            i,
            scatter_nd(
                &format!("{}/rows", n.name),
                [&n.inputs[0], &nodes[reshape].outputs[0], updates],
                &n.outputs[0],
            ),
        );
        expands.insert(expand_node.outputs[0].clone(), (expand, src.clone()));
    }
    if replaced.is_empty() {
        return Ok((graph.to_vec(), 0));
    }
    // `Shape(X)` of a replaced scatter's index is `Shape(src)`: rewired, so
    // that X need not be materialised.
    for (i, n) in nodes.iter().enumerate() {
        if n.op_type == "Shape" && n.domain.is_empty() && n.inputs.len() == 1 {
            if let Some((_, src)) = expands.get(&n.inputs[0]) {
                let mut rewired = n.clone();
                rewired.inputs[0] = src.clone();
                replaced.insert(i, encode_node(&rewired, n.raw)?);
            }
        }
    }
    // An Expand nobody reads any more (graph outputs, other nodes, nested
    // graphs) is dropped.
    let mut read: HashSet<&str> = graph_outputs.iter().map(String::as_str).collect();
    for (i, n) in nodes.iter().enumerate() {
        let rewritten = replaced.contains_key(&i);
        for input in n.inputs.iter().chain(&n.nested_reads) {
            let stale = rewritten && expands.contains_key(input);
            if !stale {
                read.insert(input);
            }
        }
    }
    let dropped: HashSet<usize> = expands
        .iter()
        .filter(|(out, _)| !read.contains(out.as_str()))
        .map(|(_, (expand, _))| *expand)
        .collect();
    let scatters = replaced
        .keys()
        .filter(|&&i| nodes[i].op_type == "ScatterElements")
        .count();
    let mut out = Vec::with_capacity(graph.len());
    let mut node_index = 0;
    for field in &fields {
        if field.number != 1 {
            out.extend_from_slice(field.raw);
            continue;
        }
        let i = node_index;
        node_index += 1;
        if dropped.contains(&i) {
            continue;
        }
        match replaced.get(&i) {
            Some(bytes) => put_bytes(&mut out, 1, bytes),
            None => out.extend_from_slice(field.raw),
        }
    }
    Ok((out, scatters))
}

/// A `ScatterND(data, indices, updates)` node with `reduction` add.
fn scatter_nd(name: &str, inputs: [&str; 3], output: &str) -> Vec<u8> {
    let mut node = Vec::new();
    for input in inputs {
        put_bytes(&mut node, 1, input.as_bytes());
    }
    put_bytes(&mut node, 2, output.as_bytes());
    put_bytes(&mut node, 3, name.as_bytes());
    put_bytes(&mut node, 4, b"ScatterND");
    let mut attribute = Vec::new();
    put_bytes(&mut attribute, 1, b"reduction");
    put_bytes(&mut attribute, 4, b"add");
    put_varint_field(&mut attribute, 20, 3); // AttributeType STRING
    put_bytes(&mut node, 5, &attribute);
    node
}

/// A node's encoding with its inputs and outputs replaced by
/// `node.inputs` and `node.outputs` (every other field as it was).
fn encode_node(node: &Node<'_>, raw_body: &[u8]) -> Result<Vec<u8>, GraphError> {
    let mut out = Vec::new();
    let (mut inputs_written, mut outputs_written) = (false, false);
    for field in parse(raw_body)? {
        match field.number {
            1 if !inputs_written => {
                for input in &node.inputs {
                    put_bytes(&mut out, 1, input.as_bytes());
                }
                inputs_written = true;
            }
            2 if !outputs_written => {
                for output in &node.outputs {
                    put_bytes(&mut out, 2, output.as_bytes());
                }
                outputs_written = true;
            }
            1 | 2 => {}
            _ => out.extend_from_slice(field.raw),
        }
    }
    Ok(out)
}

fn node<'a>(body: &'a [u8], _raw: &'a [u8]) -> Result<Node<'a>, GraphError> {
    let mut n = Node {
        inputs: Vec::new(),
        outputs: Vec::new(),
        name: String::new(),
        op_type: String::new(),
        domain: String::new(),
        attributes: HashMap::new(),
        nested_reads: Vec::new(),
        branches: Vec::new(),
        raw: body,
    };
    for field in parse(body)? {
        let Value::Bytes(bytes) = field.value else {
            continue;
        };
        match field.number {
            1 => n.inputs.push(string(bytes)?),
            2 => n.outputs.push(string(bytes)?),
            3 => n.name = string(bytes)?,
            4 => n.op_type = string(bytes)?,
            7 => n.domain = string(bytes)?,
            5 => {
                let (name, value) = attribute(bytes, &mut n.nested_reads, &mut n.branches)?;
                n.attributes.insert(name, value);
            }
            _ => {}
        }
    }
    if n.domain == "ai.onnx" {
        n.domain.clear();
    }
    Ok(n)
}

/// An `AttributeProto`: its name and the value the rewrite needs; names
/// read by a subgraph it holds go to `nested_reads`, the graph of a graph
/// attribute to `branches`.
fn attribute<'a>(
    body: &'a [u8],
    nested_reads: &mut Vec<String>,
    branches: &mut Vec<&'a [u8]>,
) -> Result<(String, Attribute), GraphError> {
    let mut name = String::new();
    let mut value = Attribute::Other;
    for field in parse(body)? {
        match (field.number, field.value) {
            (1, Value::Bytes(bytes)) => name = string(bytes)?,
            (3, Value::Varint(i)) => value = Attribute::Int(i as i64),
            (4, Value::Bytes(bytes)) => value = Attribute::Bytes(bytes.to_vec()),
            (5, Value::Bytes(tensor)) => {
                value = match int64_tensor(tensor)? {
                    Some((_, values)) => Attribute::Ints(values),
                    None => tensor_zero(tensor)?,
                };
            }
            (6, Value::Bytes(graph)) => {
                branches.push(graph);
                nested_graph_reads(graph, nested_reads)?;
            }
            (11, Value::Bytes(graph)) => nested_graph_reads(graph, nested_reads)?,
            _ => {}
        }
    }
    Ok((name, value))
}

/// Every name a nested graph's nodes read (recursively).
fn nested_graph_reads(graph: &[u8], reads: &mut Vec<String>) -> Result<(), GraphError> {
    for field in parse(graph)? {
        if let (1, Value::Bytes(bytes)) = (field.number, field.value) {
            let n = node(bytes, bytes)?;
            reads.extend(n.inputs);
            reads.extend(n.nested_reads);
        }
    }
    Ok(())
}

/// A `TensorProto` of int64 values: its name and values; `None` for any
/// other type.
fn int64_tensor(body: &[u8]) -> Result<Option<(String, Vec<i64>)>, GraphError> {
    const INT64: u64 = 7;
    let mut name = String::new();
    let mut data_type = 0;
    let mut values = Vec::new();
    let mut raw = None;
    for field in parse(body)? {
        match (field.number, field.value) {
            (2, Value::Varint(t)) => data_type = t,
            (8, Value::Bytes(bytes)) => name = string(bytes)?,
            (7, Value::Varint(v)) => values.push(v as i64),
            (7, Value::Bytes(packed)) => {
                let mut at = 0;
                while at < packed.len() {
                    values.push(varint(packed, &mut at)? as i64);
                }
            }
            (9, Value::Bytes(bytes)) => raw = Some(bytes),
            _ => {}
        }
    }
    if data_type != INT64 {
        return Ok(None);
    }
    if let Some(raw) = raw {
        if raw.len() % 8 != 0 {
            return Err(GraphError::Malformed("an int64 tensor's raw data"));
        }
        values = raw
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect();
    }
    Ok(Some((name, values)))
}

/// A `TensorProto` of any element type: its type and whether every value
/// it holds (raw or typed) is zero bits.
fn tensor_zero(body: &[u8]) -> Result<Attribute, GraphError> {
    let mut data_type = 0;
    let mut zero = true;
    for field in parse(body)? {
        match (field.number, field.value) {
            (2, Value::Varint(t)) => data_type = t,
            // float_data, int32_data, raw_data, double_data: packed bytes.
            (4 | 5 | 9 | 10 | 11, Value::Bytes(bytes)) => {
                zero &= bytes.iter().all(|&b| b == 0);
            }
            (5 | 11, Value::Varint(v)) => zero &= v == 0,
            // One unpacked float or double: its bits follow the tag.
            (4 | 10, Value::Fixed32 | Value::Fixed64) => {
                let tag_len = field.raw.len() - if field.number == 4 { 4 } else { 8 };
                zero &= field.raw[tag_len..].iter().all(|&b| b == 0);
            }
            _ => {}
        }
    }
    Ok(Attribute::Tensor { data_type, zero })
}

/// An `OperatorSetIdProto`: domain and version.
fn opset_import(body: &[u8]) -> Result<(String, i64), GraphError> {
    let mut domain = String::new();
    let mut version = 0;
    for field in parse(body)? {
        match (field.number, field.value) {
            (1, Value::Bytes(bytes)) => domain = string(bytes)?,
            (2, Value::Varint(v)) => version = v as i64,
            _ => {}
        }
    }
    Ok((domain, version))
}

fn string(bytes: &[u8]) -> Result<String, GraphError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| GraphError::Malformed("a string is not UTF-8"))
}

/// One field of a protobuf message.
#[derive(Debug, Clone, Copy)]
struct Field<'a> {
    number: u64,
    value: Value<'a>,
    /// The whole field as encoded (tag and value).
    raw: &'a [u8],
}

#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

/// The fields of a protobuf message, in order.
fn parse(buf: &[u8]) -> Result<Vec<Field<'_>>, GraphError> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let start = at;
        let tag = varint(buf, &mut at)?;
        let value = match tag & 7 {
            0 => Value::Varint(varint(buf, &mut at)?),
            1 => {
                at = at
                    .checked_add(8)
                    .filter(|&end| end <= buf.len())
                    .ok_or(GraphError::Malformed("a fixed64 runs past its message"))?;
                Value::Fixed64
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut at)?)
                    .map_err(|_| GraphError::Malformed("a length does not fit memory"))?;
                let end = at
                    .checked_add(len)
                    .filter(|&end| end <= buf.len())
                    .ok_or(GraphError::Malformed("a field runs past its message"))?;
                let bytes = &buf[at..end];
                at = end;
                Value::Bytes(bytes)
            }
            5 => {
                at = at
                    .checked_add(4)
                    .filter(|&end| end <= buf.len())
                    .ok_or(GraphError::Malformed("a fixed32 runs past its message"))?;
                Value::Fixed32
            }
            _ => return Err(GraphError::Malformed("an unknown wire type")),
        };
        fields.push(Field {
            number: tag >> 3,
            value,
            raw: &buf[start..at],
        });
    }
    Ok(fields)
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, GraphError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf
            .get(*at)
            .ok_or(GraphError::Malformed("a varint runs past its message"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(GraphError::Malformed("a varint longer than 10 bytes"))
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_bytes(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
    put_varint(out, number << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_varint_field(out: &mut Vec<u8>, number: u64, value: u64) {
    put_varint(out, number << 3);
    put_varint(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node as the exporter writes one.
    fn node_bytes(op: &str, inputs: &[&str], outputs: &[&str], attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut n = Vec::new();
        for i in inputs {
            put_bytes(&mut n, 1, i.as_bytes());
        }
        for o in outputs {
            put_bytes(&mut n, 2, o.as_bytes());
        }
        put_bytes(&mut n, 3, format!("/{op}").as_bytes());
        put_bytes(&mut n, 4, op.as_bytes());
        for a in attributes {
            put_bytes(&mut n, 5, a);
        }
        n
    }

    fn int_attribute(name: &str, value: u64) -> Vec<u8> {
        let mut a = Vec::new();
        put_bytes(&mut a, 1, name.as_bytes());
        put_varint_field(&mut a, 3, value);
        put_varint_field(&mut a, 20, 2);
        a
    }

    fn string_attribute(name: &str, value: &str) -> Vec<u8> {
        let mut a = Vec::new();
        put_bytes(&mut a, 1, name.as_bytes());
        put_bytes(&mut a, 4, value.as_bytes());
        put_varint_field(&mut a, 20, 3);
        a
    }

    /// `Constant` of int64 values, as a tensor attribute.
    fn constant(output: &str, values: &[i64]) -> Vec<u8> {
        let mut t = Vec::new();
        put_varint_field(&mut t, 1, values.len() as u64);
        put_varint_field(&mut t, 2, 7);
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        put_bytes(&mut t, 9, &raw);
        let mut a = Vec::new();
        put_bytes(&mut a, 1, b"value");
        put_bytes(&mut a, 5, &t);
        put_varint_field(&mut a, 20, 4);
        node_bytes("Constant", &[], &[output], &[a])
    }

    /// A model holding PyG's aggregation pattern with the given reduction
    /// and reshape shape, at `opset`.
    fn model(reduction: &str, column: &[i64], opset: u64) -> Vec<u8> {
        let mut graph = Vec::new();
        let nodes = [
            constant("shape", column),
            node_bytes("Reshape", &["index", "shape"], &["r"], &[]),
            node_bytes("Shape", &["src"], &["s"], &[]),
            node_bytes("Expand", &["r", "s"], &["x"], &[]),
            node_bytes("Shape", &["x"], &["xs"], &[]),
            node_bytes("Slice", &["src", "starts", "xs"], &["u"], &[]),
            node_bytes(
                "ScatterElements",
                &["zeros", "x", "u"],
                &["out"],
                &[
                    int_attribute("axis", 0),
                    string_attribute("reduction", reduction),
                ],
            ),
        ];
        for n in nodes {
            put_bytes(&mut graph, 1, &n);
        }
        let mut output = Vec::new();
        put_bytes(&mut output, 1, b"out");
        put_bytes(&mut graph, 12, &output);
        let mut model = Vec::new();
        put_varint_field(&mut model, 1, 8);
        let mut op = Vec::new();
        put_bytes(&mut op, 1, b"");
        put_varint_field(&mut op, 2, opset);
        put_bytes(&mut model, 8, &op);
        put_bytes(&mut model, 7, &graph);
        model
    }

    fn ops(model: &[u8]) -> Vec<(String, Vec<String>)> {
        let graph = parse(model)
            .unwrap()
            .into_iter()
            .find_map(|f| match (f.number, f.value) {
                (7, Value::Bytes(g)) => Some(g),
                _ => None,
            })
            .unwrap();
        parse(graph)
            .unwrap()
            .into_iter()
            .filter_map(|f| match (f.number, f.value) {
                (1, Value::Bytes(b)) => {
                    let n = node(b, b).unwrap();
                    Some((n.op_type, n.inputs))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_row_scatter_add_pattern_becomes_a_scatter_nd() {
        let rewritten = rewrite_scatter_adds(&model("add", &[-1, 1], 18)).unwrap();
        assert_eq!(rewritten.scatters, 1);
        assert_eq!(rewritten.opset, Some(18));
        let ops = ops(&rewritten.bytes);
        let names: Vec<&str> = ops.iter().map(|(op, _)| op.as_str()).collect();
        assert_eq!(
            names,
            [
                "Constant",
                "Reshape",
                "Shape",
                "Shape",
                "Slice",
                "ScatterND"
            ],
            "the Expand is dropped"
        );
        assert_eq!(
            ops[5].1,
            ["zeros", "r", "u"],
            "rows scattered by the reshaped index"
        );
        assert_eq!(ops[3].1, ["src"], "the slice's shape is read from src");
    }

    #[test]
    fn other_scatters_and_old_opsets_are_left_alone() {
        for (model, why) in [
            (model("max", &[-1, 1], 18), "a max reduction"),
            (model("add", &[1, -1], 18), "another reshape"),
            (
                model("add", &[-1, 1], 15),
                "an opset without ScatterND reductions",
            ),
        ] {
            let rewritten = rewrite_scatter_adds(&model).unwrap();
            assert_eq!(rewritten.scatters, 0, "{why}");
            assert_eq!(rewritten.bytes, model, "{why}: byte-identical");
        }
    }

    /// A model whose `ScatterElements(reduction)` starts from `data`, made
    /// by `ConstantOfShape` (with `value`, else its default 0.0) through a
    /// Reshape.
    fn extrema_model(reduction: &str, value: Option<f32>) -> Vec<u8> {
        let mut attributes = Vec::new();
        if let Some(v) = value {
            let mut t = Vec::new();
            put_varint_field(&mut t, 1, 1);
            put_varint_field(&mut t, 2, FLOAT);
            put_bytes(&mut t, 9, &v.to_le_bytes());
            let mut a = Vec::new();
            put_bytes(&mut a, 1, b"value");
            put_bytes(&mut a, 5, &t);
            put_varint_field(&mut a, 20, 4);
            attributes.push(a);
        }
        let mut graph = Vec::new();
        for n in [
            node_bytes("ConstantOfShape", &["shape"], &["z"], &attributes),
            node_bytes("Reshape", &["z", "s"], &["zeros"], &[]),
            node_bytes(
                "ScatterElements",
                &["zeros", "index", "src"],
                &["out"],
                &[string_attribute("reduction", reduction)],
            ),
        ] {
            put_bytes(&mut graph, 1, &n);
        }
        let mut model = Vec::new();
        put_varint_field(&mut model, 1, 8);
        put_bytes(&mut model, 7, &graph);
        model
    }

    #[test]
    fn a_max_over_zeros_becomes_pygs_max_and_other_scatters_stay() {
        for reduction in ["max", "min"] {
            let fixed = fix_scatter_extrema(&extrema_model(reduction, Some(0.0))).unwrap();
            assert_eq!(fixed.fixed, ["/ScatterElements"]);
            let ops = ops(&fixed.bytes);
            let names: Vec<&str> = ops.iter().map(|(op, _)| op.as_str()).collect();
            assert_eq!(
                names,
                [
                    "ConstantOfShape",
                    "Reshape",
                    "Constant",
                    "Add",
                    "ScatterElements",
                    "IsInf",
                    "Where"
                ]
            );
            let at = "out/include_self_false";
            assert_eq!(ops[3].1, ["zeros", &format!("{at}/inf")]);
            assert_eq!(ops[4].1, [&format!("{at}/start"), "index", "src"]);
            assert_eq!(
                ops[6].1,
                [&format!("{at}/empty"), "zeros", &format!("{at}/reduced")]
            );
        }
        // ConstantOfShape's default value is a float 0 too.
        assert_eq!(
            fix_scatter_extrema(&extrema_model("max", None))
                .unwrap()
                .fixed
                .len(),
            1
        );
        // A scatter that starts from ones, or adds, is what it says.
        for model in [
            extrema_model("max", Some(1.0)),
            extrema_model("add", Some(0.0)),
        ] {
            let fixed = fix_scatter_extrema(&model).unwrap();
            assert!(fixed.fixed.is_empty());
            assert_eq!(fixed.bytes, model);
        }
    }

    #[test]
    fn truncated_bytes_are_an_error_not_a_panic() {
        let model = model("add", &[-1, 1], 18);
        for cut in [1, 7, model.len() / 2, model.len() - 1] {
            assert!(rewrite_scatter_adds(&model[..cut]).is_err(), "cut at {cut}");
        }
    }
}
