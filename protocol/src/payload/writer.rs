//! Writing a response in place: the sidecar gets typed mutable views of the
//! final Arrow buffers inside the slot and fills them directly.

use std::collections::HashMap;
use std::mem::size_of;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use arrow_schema::SchemaRef;

use crate::graph_schema::GraphSchema;
use crate::layout::{status, ResponseHeader, MAX_HOPS, MESSAGE_BYTES};
use crate::payload::ipc::{self, BodyPlan, ColumnKind, END_OF_STREAM};
use crate::payload::schema::{
    counts_schema, edge_data_schema, edge_schema, node_schema, subgraph_target_schema,
    target_schema,
};
use crate::request::EdgeColumns;

/// Size of one dense-layout response (the graph layouts' is
/// [`crate::payload::GraphShape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadShape {
    pub n_targets: u32,
    pub n_nodes: u32,
    pub feature_dim: u32,
    pub fanouts: [u32; MAX_HOPS],
}

/// Why a response could not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error(
        "response of {needed} bytes does not fit the {available} byte response area \
         ({n_nodes} nodes x {feature_dim} features): send fewer targets per request or raise \
         the sidecar's response_mib (--response-mib)"
    )]
    TooLarge {
        needed: usize,
        available: usize,
        n_nodes: u32,
        feature_dim: u32,
    },
    #[error("response area is not 64-byte aligned")]
    Misaligned,
}

/// A node table's columns for rows of `dim` features: id, features, tier,
/// fallback; with `dim` 0 (a typed graph's node type without features) the
/// id alone.
/// An edge type's data table's columns: `sent`'s, in
/// [`edge_data_schema`]'s order.
pub(crate) fn edge_data_kinds(attr_dim: u32, sent: EdgeColumns) -> Vec<ColumnKind> {
    let mut kinds = Vec::new();
    if sent.attr {
        kinds.push(ColumnKind::List {
            width: 4,
            size: attr_dim as usize,
        });
    }
    if sent.weight {
        kinds.push(ColumnKind::Fixed { width: 4 });
    }
    if sent.time {
        kinds.push(ColumnKind::Fixed { width: 8 });
    }
    kinds
}

pub(crate) fn node_kinds(dim: u32) -> Vec<ColumnKind> {
    let id = ColumnKind::Fixed { width: 8 };
    if dim == 0 {
        return vec![id];
    }
    vec![
        id,
        ColumnKind::List {
            width: 4,
            size: dim as usize,
        },
        ColumnKind::Fixed { width: 1 },
        ColumnKind::Bool,
    ]
}

/// The subgraph layout's target table: id, status, row.
pub(crate) const SUBGRAPH_TARGET_COLUMNS: [ColumnKind; 3] = [
    ColumnKind::Fixed { width: 8 },
    ColumnKind::Fixed { width: 1 },
    ColumnKind::Fixed { width: 4 },
];

fn target_kinds([f1, f2]: [u32; MAX_HOPS]) -> [ColumnKind; 7] {
    let (f1, f2) = (f1 as usize, f2 as usize);
    [
        ColumnKind::Fixed { width: 8 },
        ColumnKind::Fixed { width: 1 },
        ColumnKind::Fixed { width: 4 },
        ColumnKind::Fixed { width: 4 },
        ColumnKind::List { width: 4, size: f1 },
        ColumnKind::List { width: 4, size: f1 },
        ColumnKind::List {
            width: 4,
            size: f1 * f2,
        },
    ]
}

/// A table schema and its encapsulated IPC schema message.
#[derive(Debug)]
pub struct CachedSchema {
    pub schema: SchemaRef,
    pub message: Vec<u8>,
}

impl CachedSchema {
    fn new(schema: SchemaRef) -> Arc<Self> {
        let message = ipc::schema_message(&schema);
        Arc::new(Self { schema, message })
    }
}

/// Table schemas and their encoded messages, built once per feature dim and
/// per fanouts, shared by the writer (which copies the message) and the
/// reader (which recognises it and skips re-parsing it).
#[derive(Debug, Default)]
pub struct SchemaCache {
    nodes: Mutex<HashMap<u32, Arc<CachedSchema>>>,
    targets: Mutex<HashMap<[u32; MAX_HOPS], Arc<CachedSchema>>>,
    subgraph_targets: OnceLock<Arc<CachedSchema>>,
    edges: OnceLock<Arc<CachedSchema>>,
    edge_index: OnceLock<Arc<CachedSchema>>,
    counts: OnceLock<Arc<CachedSchema>>,
    one_type: Mutex<HashMap<u32, Arc<GraphSchema>>>,
    edge_data: Mutex<HashMap<(u32, EdgeColumns), Arc<CachedSchema>>>,
}

impl SchemaCache {
    /// The node table schema for `dim` (0: the ids alone, [`node_schema`]).
    pub fn node(&self, dim: u32) -> Arc<CachedSchema> {
        let mut map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(dim)
            .or_insert_with(|| CachedSchema::new(node_schema(dim)))
            .clone()
    }

    /// The target table schema for `fanouts`.
    pub fn target(&self, fanouts: [u32; MAX_HOPS]) -> Arc<CachedSchema> {
        let mut map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(fanouts)
            .or_insert_with(|| CachedSchema::new(target_schema(fanouts)))
            .clone()
    }

    /// The subgraph layout's target table schema.
    pub fn subgraph_target(&self) -> Arc<CachedSchema> {
        self.subgraph_targets
            .get_or_init(|| CachedSchema::new(subgraph_target_schema()))
            .clone()
    }

    /// The edge table schema: the subgraph layout's (`hop_counts`), or a
    /// typed response's of one edge type ([`edge_schema`]).
    pub fn edges(&self, hop_counts: bool) -> Arc<CachedSchema> {
        let cell = if hop_counts {
            &self.edges
        } else {
            &self.edge_index
        };
        cell.get_or_init(|| CachedSchema::new(edge_schema(hop_counts)))
            .clone()
    }

    /// The 1x1 graph whose layout a one-type graph's subgraph response is,
    /// for rows of `dim` features ([`GraphSchema::one_type`]).
    pub fn one_type(&self, dim: u32) -> Arc<GraphSchema> {
        let mut map = self.one_type.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(dim)
            .or_insert_with(|| Arc::new(GraphSchema::one_type(dim)))
            .clone()
    }

    /// An edge type's data table schema ([`edge_data_schema`]).
    pub fn edge_data(&self, attr_dim: u32, sent: EdgeColumns) -> Arc<CachedSchema> {
        let mut map = self.edge_data.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((attr_dim, sent))
            .or_insert_with(|| CachedSchema::new(edge_data_schema(attr_dim, sent)))
            .clone()
    }

    /// A typed response's counts table schema.
    pub fn counts(&self) -> Arc<CachedSchema> {
        self.counts
            .get_or_init(|| CachedSchema::new(counts_schema()))
            .clone()
    }
}

/// One table's place in the response area.
#[derive(Debug, Clone)]
pub(crate) struct TablePlacement {
    /// The whole IPC stream.
    pub(crate) stream: Range<usize>,
    /// Absolute offset of the body.
    pub(crate) body: usize,
    pub(crate) plan: BodyPlan,
}

impl TablePlacement {
    pub(crate) fn column(&self, idx: usize) -> Range<usize> {
        let r = &self.plan.values[idx];
        self.body + r.start..self.body + r.end
    }

    pub(crate) fn offsets(&self, idx: usize) -> Option<Range<usize>> {
        let r = self.plan.offsets[idx].as_ref()?;
        Some(self.body + r.start..self.body + r.end)
    }
}

/// Node table columns of a response being written; a typed graph's node
/// type without features has `node_id` alone (the other slices are empty).
#[derive(Debug)]
pub struct NodeColumns<'a> {
    pub node_id: &'a mut [u64],
    /// `n_nodes x feature_dim`, row-major.
    pub features: &'a mut [f32],
    pub tier: &'a mut [u8],
    /// Bit-packed (LSB first), zeroed when the writer was created.
    pub fallback: &'a mut [u8],
}

impl<'a> NodeColumns<'a> {
    /// A node table's columns from the parts carved for it, in
    /// [`node_kinds`]' order (its id alone when `dim` is 0).
    pub(crate) fn from_parts(next: &mut impl FnMut() -> &'a mut [u8], dim: u32) -> Self {
        if dim == 0 {
            return NodeColumns {
                node_id: bytemuck::cast_slice_mut(next()),
                features: &mut [],
                tier: &mut [],
                fallback: &mut [],
            };
        }
        NodeColumns {
            node_id: bytemuck::cast_slice_mut(next()),
            features: bytemuck::cast_slice_mut(next()),
            tier: next(),
            fallback: next(),
        }
    }

    /// Sets the fallback flag of `row` (rows with features).
    pub fn set_fallback(&mut self, row: usize, fallback: bool) {
        set_bit(self.fallback, row, fallback);
    }
}

/// Sets or clears bit `row` of an Arrow (LSB first) bitmap.
pub(crate) fn set_bit(bitmap: &mut [u8], row: usize, value: bool) {
    let mask = 1u8 << (row % 8);
    if value {
        bitmap[row / 8] |= mask;
    } else {
        bitmap[row / 8] &= !mask;
    }
}

/// The sampled neighbourhoods of a dense-layout response being written:
/// its target table.
#[derive(Debug)]
pub struct TargetColumns<'a> {
    pub target_id: &'a mut [u64],
    pub status: &'a mut [u8],
    pub target_row: &'a mut [i32],
    pub hop1_count: &'a mut [i32],
    /// `n_targets x f1`; entries past `hop1_count` hold the target's own row.
    pub hop1_rows: &'a mut [i32],
    /// `n_targets x f1`; entries past `hop1_count` are 0.
    pub hop2_count: &'a mut [i32],
    /// `n_targets x f1 x f2`; entries past the counts hold the target's own row.
    pub hop2_rows: &'a mut [i32],
}

/// A dense-layout response being written into a slot's response area (the
/// graph layouts' writer is [`crate::payload::GraphWriter`]).
#[derive(Debug)]
pub struct ResponseWriter<'a> {
    area: &'a mut [u8],
    shape: PayloadShape,
    nodes: TablePlacement,
    targets: TablePlacement,
}

/// Writes a table's messages and end-of-stream marker at `start`; returns its
/// placement. The caller checked that everything fits.
pub(crate) fn place_table(
    area: &mut [u8],
    start: usize,
    schema_message: &[u8],
    batch_message: &[u8],
    plan: BodyPlan,
) -> TablePlacement {
    let mut at = start;
    area[at..at + schema_message.len()].copy_from_slice(schema_message);
    at += schema_message.len();
    area[at..at + batch_message.len()].copy_from_slice(batch_message);
    at += batch_message.len();
    let body = at;
    at += plan.body_len;
    area[at..at + END_OF_STREAM.len()].copy_from_slice(&END_OF_STREAM);
    at += END_OF_STREAM.len();
    TablePlacement {
        stream: start..at,
        body,
        plan,
    }
}

/// Bytes a table stream takes: messages + body + end marker, rounded to 64.
pub(crate) fn stream_len(
    schema_message: usize,
    batch_message: usize,
    plan: &BodyPlan,
) -> Option<usize> {
    schema_message
        .checked_add(batch_message)?
        .checked_add(plan.body_len)?
        .checked_add(END_OF_STREAM.len())?
        .checked_next_multiple_of(64)
}

impl<'a> ResponseWriter<'a> {
    /// Lays the response out in `area`, writes its Arrow metadata, zeroes the
    /// boolean bitmap, and returns the writer for the values.
    pub fn new(
        area: &'a mut [u8],
        shape: PayloadShape,
        schemas: &SchemaCache,
    ) -> Result<Self, WriteError> {
        if !(area.as_ptr() as usize).is_multiple_of(64) {
            return Err(WriteError::Misaligned);
        }
        let too_large = |needed: usize, available: usize| WriteError::TooLarge {
            needed,
            available,
            n_nodes: shape.n_nodes,
            feature_dim: shape.feature_dim,
        };
        let node_plan = ipc::plan_body(shape.n_nodes as usize, &node_kinds(shape.feature_dim))
            .ok_or(too_large(usize::MAX, area.len()))?;
        let node_schema = schemas.node(shape.feature_dim);
        let target_plan = ipc::plan_body(shape.n_targets as usize, &target_kinds(shape.fanouts))
            .ok_or(too_large(usize::MAX, area.len()))?;
        let target_schema = schemas.target(shape.fanouts);
        let node_batch = ipc::record_batch_message(&node_plan);
        let target_batch = ipc::record_batch_message(&target_plan);
        let header_len = size_of::<ResponseHeader>();
        // The exact size, checked before any write, so a response that does
        // not fit leaves the area untouched.
        let needed = stream_len(node_schema.message.len(), node_batch.len(), &node_plan)
            .and_then(|n| {
                n.checked_add(stream_len(
                    target_schema.message.len(),
                    target_batch.len(),
                    &target_plan,
                )?)
            })
            .and_then(|n| n.checked_add(header_len))
            .unwrap_or(usize::MAX);
        if needed > area.len() {
            return Err(too_large(needed, area.len()));
        }
        let nodes = place_table(
            area,
            header_len,
            &node_schema.message,
            &node_batch,
            node_plan,
        );
        let target_start = nodes.stream.end.next_multiple_of(64);
        let targets = place_table(
            area,
            target_start,
            &target_schema.message,
            &target_batch,
            target_plan,
        );
        let mut writer = Self {
            area,
            shape,
            nodes,
            targets,
        };
        writer.columns().0.fallback.fill(0);
        Ok(writer)
    }

    pub fn shape(&self) -> PayloadShape {
        self.shape
    }

    /// Mutable views of every column: the node table, then the target
    /// table.
    pub fn columns(&mut self) -> (NodeColumns<'_>, TargetColumns<'_>) {
        let mut ranges = Vec::with_capacity(11);
        for idx in 0..self.nodes.plan.values.len() {
            ranges.push(self.nodes.column(idx));
        }
        for idx in 0..self.targets.plan.values.len() {
            ranges.push(self.targets.column(idx));
        }
        let mut parts = carve(self.area, &ranges).into_iter();
        let mut next = || parts.next().expect("one part per carved range");
        let nodes = NodeColumns::from_parts(&mut next, self.shape.feature_dim);
        let targets = TargetColumns {
            target_id: bytemuck::cast_slice_mut(next()),
            status: next(),
            target_row: bytemuck::cast_slice_mut(next()),
            hop1_count: bytemuck::cast_slice_mut(next()),
            hop1_rows: bytemuck::cast_slice_mut(next()),
            hop2_count: bytemuck::cast_slice_mut(next()),
            hop2_rows: bytemuck::cast_slice_mut(next()),
        };
        (nodes, targets)
    }

    /// Writes the response header (status OK). Returns the bytes used.
    pub fn finish(self, request_id: u64, meta: impl Into<ResponseMeta>, server_ns: u64) -> usize {
        let meta = meta.into();
        let header = ResponseHeader {
            n_targets: self.shape.n_targets,
            n_nodes: self.shape.n_nodes,
            fanouts: self.shape.fanouts,
            node_table_offset: self.nodes.stream.start as u64,
            node_table_len: self.nodes.stream.len() as u64,
            target_table_offset: self.targets.stream.start as u64,
            target_table_len: self.targets.stream.len() as u64,
            ..ok_header(request_id, meta, server_ns)
        };
        self.area[..size_of::<ResponseHeader>()].copy_from_slice(bytemuck::bytes_of(&header));
        self.targets.stream.end
    }
}

/// What an OK response's header says besides its shape: the graph version,
/// the change clock and the id bound (docs/protocol.md, response header).
/// A bare `u64` is the graph version alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponseMeta {
    pub graph_version: u64,
    pub change_clock: u64,
    pub change_tick: u64,
    pub id_bound: u64,
}

impl From<u64> for ResponseMeta {
    fn from(graph_version: u64) -> Self {
        Self {
            graph_version,
            ..Self::default()
        }
    }
}

/// An OK response's header with what every layout states alike (the
/// request, the graph's version and change clock, the serving time); the
/// writer adds its shape and where its tables are.
pub(crate) fn ok_header(request_id: u64, meta: ResponseMeta, server_ns: u64) -> ResponseHeader {
    ResponseHeader {
        status: status::OK,
        request_id,
        graph_version: meta.graph_version,
        server_ns,
        change_clock: meta.change_clock,
        change_tick: meta.change_tick,
        id_bound: meta.id_bound,
        ..bytemuck::Zeroable::zeroed()
    }
}

/// Writes an error response: a header with `status` and `message`, no tables.
pub fn write_error(area: &mut [u8], status_code: u32, request_id: u64, message: &str) {
    let mut text = [0u8; MESSAGE_BYTES];
    // Cut at a character boundary so the message stays valid UTF-8.
    let mut len = message.len().min(MESSAGE_BYTES);
    while !message.is_char_boundary(len) {
        len -= 1;
    }
    text[..len].copy_from_slice(&message.as_bytes()[..len]);
    let header = ResponseHeader {
        status: status_code,
        message_len: len as u32,
        request_id,
        message: text,
        ..bytemuck::Zeroable::zeroed()
    };
    area[..size_of::<ResponseHeader>()].copy_from_slice(bytemuck::bytes_of(&header));
}

/// Splits `area` into the given sorted, disjoint ranges.
pub(crate) fn carve<'s>(mut area: &'s mut [u8], ranges: &[Range<usize>]) -> Vec<&'s mut [u8]> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut consumed = 0;
    for range in ranges {
        let (_, rest) = area.split_at_mut(range.start - consumed);
        let (part, rest) = rest.split_at_mut(range.len());
        out.push(part);
        area = rest;
        consumed = range.end;
    }
    out
}
