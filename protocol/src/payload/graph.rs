//! The graph layouts: a sampled subgraph as PyG's `Data` or `HeteroData`
//! (one node table per node type, one `edge_index` per edge type, the
//! nodes and edges sampled at each hop), written in place by one writer
//! ([`GraphWriter`]) and read without copying by one reader
//! ([`decode_graph`]), in either of two wire forms:
//! - the subgraph layout (docs/protocol.md, "The subgraph layout"), a
//!   one-type graph's, the 1x1 graph: its node table, the target table and
//!   one edge table whose `hop_counts` column holds the counts, the
//!   fanouts in the response header;
//! - the typed layout (section 4.4): a table directory after the response
//!   header, the target table, the counts table, one node table per node
//!   type and one edge table per edge type, in the graph schema's order.

use std::mem::size_of;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, Int64Type, UInt64Type, UInt8Type};
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;

use crate::graph_schema::GraphSchema;
use crate::layout::{ResponseHeader, MAX_FANOUT, MAX_HOPS, MAX_SUBGRAPH_HOPS};
use crate::payload::ipc::{self, ColumnKind};
use crate::payload::schema::{counts_schema, edge_data_columns, target_status, tier, NO_ROW};
use crate::payload::table::{decode_table, read_ok_header};
use crate::payload::writer::{
    carve, edge_data_kinds, node_kinds, ok_header, place_table, stream_len, CachedSchema,
    NodeColumns, ResponseMeta, SchemaCache, TablePlacement, WriteError, SUBGRAPH_TARGET_COLUMNS,
};
use crate::payload::{DecodeError, DecodeLimits};
use crate::request::{EdgeColumns, SubgraphFanouts};

/// Bytes of one table directory entry: the table's offset and length.
pub const DIRECTORY_ENTRY_BYTES: usize = 16;

/// Data entries of a response's directory: one per edge type when the
/// request asked for edge data, none otherwise.
fn directory_data_entries(graph: &GraphSchema, asked: EdgeColumns) -> usize {
    if asked.any() {
        graph.edge_types.len()
    } else {
        0
    }
}

/// Which wire form a graph response takes, and its hops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphForm {
    /// The subgraph layout of a one-type graph (the 1x1 graph), sampled at
    /// these fanouts, one per hop (the response header states them).
    Subgraph(SubgraphFanouts),
    /// The typed layout, `hops` hops (1 to [`MAX_SUBGRAPH_HOPS`]).
    Typed { hops: u32 },
}

impl GraphForm {
    pub fn hops(&self) -> usize {
        match self {
            GraphForm::Subgraph(fanouts) => fanouts.hops(),
            GraphForm::Typed { hops } => *hops as usize,
        }
    }
}

/// The size of a graph response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphShape {
    pub form: GraphForm,
    pub n_targets: u32,
    /// Per node type: its rows.
    pub node_rows: Vec<u32>,
    /// Per edge type: its edges.
    pub edges: Vec<u32>,
    /// The edge data asked for: each edge type's data table holds the
    /// asked columns it carries.
    pub edge_data: EdgeColumns,
}

impl GraphShape {
    /// A one-type graph's subgraph-layout response: `n_nodes` rows of its
    /// one node type, `n_edges` edges of its one edge type.
    pub fn subgraph(fanouts: SubgraphFanouts, n_targets: u32, n_nodes: u32, n_edges: u32) -> Self {
        Self {
            form: GraphForm::Subgraph(fanouts),
            n_targets,
            node_rows: vec![n_nodes],
            edges: vec![n_edges],
            edge_data: EdgeColumns::default(),
        }
    }

    /// A typed graph's response of `hops` hops.
    pub fn typed(hops: u32, n_targets: u32, node_rows: Vec<u32>, edges: Vec<u32>) -> Self {
        Self {
            form: GraphForm::Typed { hops },
            n_targets,
            node_rows,
            edges,
            edge_data: EdgeColumns::default(),
        }
    }

    /// The same response carrying the edge data `asked` for.
    pub fn with_edge_data(mut self, asked: EdgeColumns) -> Self {
        self.edge_data = asked;
        self
    }

    pub fn hops(&self) -> usize {
        self.form.hops()
    }

    /// The fanouts the response header states: the subgraph layout's first
    /// two (0 past its last hop) and its third; all 0 in the typed layout.
    fn header_fanouts(&self) -> ([u32; MAX_HOPS], u32) {
        match self.form {
            GraphForm::Subgraph(fanouts) => {
                let [f1, f2, f3] = fanouts.padded();
                ([f1, f2], f3)
            }
            GraphForm::Typed { .. } => ([0; MAX_HOPS], 0),
        }
    }
}

/// Every column of a graph response being written.
#[derive(Debug)]
pub struct GraphColumns<'a> {
    pub target_id: &'a mut [u64],
    pub status: &'a mut [u8],
    /// Each target's row in its type's node table.
    pub target_row: &'a mut [i32],
    /// Per node type.
    pub nodes: Vec<NodeColumns<'a>>,
    /// Per edge type: `2 x edges`, row-major; row 0 the sources' rows in
    /// the source type's table (the sampled neighbours), row 1 the
    /// destinations' in the destination type's (the nodes they were
    /// sampled for).
    pub edge_index: Vec<&'a mut [i64]>,
    /// Per node type: `hops + 1` counts (PyG's `num_sampled_nodes_dict`).
    pub sampled_nodes: Vec<&'a mut [i64]>,
    /// Per edge type: `hops` counts (PyG's `num_sampled_edges_dict`).
    pub sampled_edges: Vec<&'a mut [i64]>,
    /// Per edge type: `edges x attr_dim` f32 attributes, row-major, in
    /// `edge_index`'s column order; empty where not sent.
    pub edge_attr: Vec<&'a mut [f32]>,
    /// Per edge type: one weight per edge; empty where not sent.
    pub edge_weight: Vec<&'a mut [f32]>,
    /// Per edge type: one time per edge; empty where not sent.
    pub edge_time: Vec<&'a mut [i64]>,
}

/// Where each part of a graph response went in the area.
#[derive(Debug)]
struct Placed {
    targets: TablePlacement,
    /// The counts table (typed layout); `None` in the subgraph layout,
    /// whose counts are its edge table's second column.
    counts: Option<TablePlacement>,
    nodes: Vec<TablePlacement>,
    edges: Vec<TablePlacement>,
    /// Per edge type: its data table, where it sends any.
    data: Vec<Option<TablePlacement>>,
}

/// A graph response being written into a slot's response area.
#[derive(Debug)]
pub struct GraphWriter<'a> {
    area: &'a mut [u8],
    shape: GraphShape,
    feature_dims: Vec<u32>,
    /// Per edge type: the data columns it sends.
    sent: Vec<EdgeColumns>,
    placed: Placed,
}

impl<'a> GraphWriter<'a> {
    /// Lays the response out in `area` (checking first that it fits, so a
    /// response that does not leaves the area untouched), writes its Arrow
    /// metadata, the list offsets and (typed layout) the directory, zeroes
    /// the fallback bitmaps, and returns the writer for the values.
    /// `shape` has one entry per node type and per edge type of `graph`
    /// (the 1x1 graph for the subgraph layout).
    pub fn new(
        area: &'a mut [u8],
        graph: &GraphSchema,
        shape: GraphShape,
        schemas: &SchemaCache,
    ) -> Result<Self, WriteError> {
        assert_eq!(shape.node_rows.len(), graph.node_types.len());
        assert_eq!(shape.edges.len(), graph.edge_types.len());
        let hops = shape.hops();
        assert!((1..=MAX_SUBGRAPH_HOPS).contains(&hops));
        let subgraph = matches!(shape.form, GraphForm::Subgraph(_));
        assert!(!subgraph || (graph.node_types.len(), graph.edge_types.len()) == (1, 1));
        if !(area.as_ptr() as usize).is_multiple_of(64) {
            return Err(WriteError::Misaligned);
        }
        let n_nodes: u64 = shape.node_rows.iter().map(|&n| u64::from(n)).sum();
        let too_large = |needed: usize, available: usize| WriteError::TooLarge {
            needed,
            available,
            n_nodes: n_nodes.min(u64::from(u32::MAX)) as u32,
            feature_dim: if subgraph {
                graph.node_types[0].feature_dim
            } else {
                0
            },
        };
        // Each table's schema and plan, in the order they are placed.
        let target = (
            schemas.subgraph_target(),
            ipc::plan_body(shape.n_targets as usize, &SUBGRAPH_TARGET_COLUMNS),
        );
        let node_tables = graph
            .node_types
            .iter()
            .zip(&shape.node_rows)
            .map(|(t, &rows)| {
                let plan = ipc::plan_body(rows as usize, &node_kinds(t.feature_dim));
                (schemas.node(t.feature_dim), plan)
            });
        let edge_list = |edges: u32| ColumnKind::VarList {
            width: 8,
            children: 2 * edges as usize,
        };
        let counts_rows = graph.node_types.len() + graph.edge_types.len();
        let n_counts = graph.node_types.len() * (hops + 1) + graph.edge_types.len() * hops;
        let counts_list = ColumnKind::VarList {
            width: 8,
            children: n_counts,
        };
        let mut tables: Vec<(std::sync::Arc<CachedSchema>, _)> = Vec::new();
        if subgraph {
            // Node table, target table, edge table (edge_index, hop_counts).
            tables.extend(node_tables);
            tables.push(target);
            let kinds = [edge_list(shape.edges[0]), counts_list];
            tables.push((schemas.edges(true), ipc::plan_body(2, &kinds)));
        } else {
            tables.push(target);
            tables.push((
                schemas.counts(),
                ipc::plan_body(counts_rows, &[counts_list]),
            ));
            tables.extend(node_tables);
            for &edges in &shape.edges {
                tables.push((schemas.edges(false), ipc::plan_body(2, &[edge_list(edges)])));
            }
        }
        // Each edge type's data table, where it sends any, after the rest.
        let sent: Vec<EdgeColumns> = graph
            .edge_types
            .iter()
            .map(|e| shape.edge_data.sent(&e.data))
            .collect();
        for ((e, &edges), sent) in graph.edge_types.iter().zip(&shape.edges).zip(&sent) {
            if sent.any() {
                let kinds = edge_data_kinds(e.data.attr_dim, *sent);
                tables.push((
                    schemas.edge_data(e.data.attr_dim, *sent),
                    ipc::plan_body(edges as usize, &kinds),
                ));
            }
        }
        let data_entries = directory_data_entries(graph, shape.edge_data);
        let directory_len = if subgraph {
            DIRECTORY_ENTRY_BYTES * data_entries
        } else {
            DIRECTORY_ENTRY_BYTES * (counts_rows + data_entries)
        };
        let header_len = size_of::<ResponseHeader>();
        let first = header_len + directory_len.next_multiple_of(64);
        let mut planned = Vec::with_capacity(tables.len());
        let mut needed = Some(first);
        for (schema, plan) in tables {
            let plan = plan.ok_or(too_large(usize::MAX, area.len()))?;
            let batch = ipc::record_batch_message(&plan);
            needed = needed
                .and_then(|n| n.checked_add(stream_len(schema.message.len(), batch.len(), &plan)?));
            planned.push((schema, batch, plan));
        }
        let needed = needed.unwrap_or(usize::MAX);
        if needed > area.len() {
            return Err(too_large(needed, area.len()));
        }
        let mut at = first;
        let mut placed = Vec::with_capacity(planned.len());
        for (schema, batch, plan) in planned {
            let table = place_table(area, at, &schema.message, &batch, plan);
            at = table.stream.end.next_multiple_of(64);
            placed.push(table);
        }
        let mut placed = placed.into_iter();
        let n_types = graph.node_types.len();
        let mut placed_tables = if subgraph {
            let nodes = vec![placed.next().expect("the node table")];
            let targets = placed.next().expect("the target table");
            let edges = vec![placed.next().expect("the edge table")];
            Placed {
                targets,
                counts: None,
                nodes,
                edges,
                data: Vec::new(),
            }
        } else {
            let targets = placed.next().expect("the target table");
            let counts = Some(placed.next().expect("the counts table"));
            let nodes = placed.by_ref().take(n_types).collect();
            let edges = placed.by_ref().take(graph.edge_types.len()).collect();
            Placed {
                targets,
                counts,
                nodes,
                edges,
                data: Vec::new(),
            }
        };
        placed_tables.data = sent
            .iter()
            .map(|sent| sent.any().then(|| placed.next().expect("a data table")))
            .collect();
        let placed = placed_tables;
        // The list offsets follow from the shape: each edge_index's two
        // rows are equal halves; the counts are each node type's hops + 1
        // and each edge type's hops.
        let mut count_offsets = Vec::with_capacity(counts_rows + 1);
        count_offsets.push(0i32);
        let per_row = std::iter::repeat_n(hops + 1, n_types)
            .chain(std::iter::repeat_n(hops, graph.edge_types.len()));
        for n in per_row {
            count_offsets.push(count_offsets.last().expect("one") + n as i32);
        }
        let counts_at = match &placed.counts {
            Some(counts) => counts.offsets(0),
            None => placed.edges[0].offsets(1),
        };
        let range = counts_at.expect("a list column");
        bytemuck::cast_slice_mut::<u8, i32>(&mut area[range]).copy_from_slice(&count_offsets);
        for (table, &n) in placed.edges.iter().zip(&shape.edges) {
            let range = table.offsets(0).expect("a list column");
            let n = n as i32;
            bytemuck::cast_slice_mut::<u8, i32>(&mut area[range]).copy_from_slice(&[0, n, 2 * n]);
        }
        let mut entries: Vec<(u64, u64)> = Vec::new();
        if !subgraph {
            for table in placed.nodes.iter().chain(&placed.edges) {
                entries.push((table.stream.start as u64, table.stream.len() as u64));
            }
        }
        if data_entries > 0 {
            for table in &placed.data {
                entries.push(
                    table
                        .as_ref()
                        .map_or((0, 0), |t| (t.stream.start as u64, t.stream.len() as u64)),
                );
            }
        }
        for (i, (offset, len)) in entries.into_iter().enumerate() {
            let at = header_len + DIRECTORY_ENTRY_BYTES * i;
            area[at..at + 8].copy_from_slice(&offset.to_le_bytes());
            area[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
        }
        let mut writer = Self {
            area,
            shape,
            feature_dims: graph.node_types.iter().map(|t| t.feature_dim).collect(),
            sent,
            placed,
        };
        for nodes in writer.columns().nodes {
            nodes.fallback.fill(0);
        }
        Ok(writer)
    }

    pub fn shape(&self) -> &GraphShape {
        &self.shape
    }

    /// Mutable views of every column.
    pub fn columns(&mut self) -> GraphColumns<'_> {
        let placed = &self.placed;
        // Every column in the order they are handed out below: the
        // target table's three, the counts, each node table's, each
        // edge_index.
        let mut ranges = Vec::new();
        for idx in 0..3 {
            ranges.push(placed.targets.column(idx));
        }
        ranges.push(match &placed.counts {
            Some(counts) => counts.column(0),
            None => placed.edges[0].column(1),
        });
        for table in &placed.nodes {
            for idx in 0..table.plan.values.len() {
                ranges.push(table.column(idx));
            }
        }
        for table in &placed.edges {
            ranges.push(table.column(0));
        }
        for table in placed.data.iter().flatten() {
            for idx in 0..table.plan.values.len() {
                ranges.push(table.column(idx));
            }
        }
        // Carved in address order, handed out in the order above.
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| ranges[i].start);
        let sorted: Vec<_> = order.iter().map(|&i| ranges[i].clone()).collect();
        let mut parts: Vec<Option<&mut [u8]>> = (0..ranges.len()).map(|_| None).collect();
        for (part, &i) in carve(self.area, &sorted).into_iter().zip(&order) {
            parts[i] = Some(part);
        }
        let mut parts = parts.into_iter();
        let mut next = || parts.next().flatten().expect("one part per carved range");
        let target_id = bytemuck::cast_slice_mut(next());
        let status = next();
        let target_row = bytemuck::cast_slice_mut(next());
        let mut counts: &mut [i64] = bytemuck::cast_slice_mut(next());
        let nodes = self
            .feature_dims
            .iter()
            .map(|&dim| NodeColumns::from_parts(&mut next, dim))
            .collect();
        let edge_index = self
            .shape
            .edges
            .iter()
            .map(|_| bytemuck::cast_slice_mut(next()))
            .collect();
        let (mut edge_attr, mut edge_weight, mut edge_time) = (Vec::new(), Vec::new(), Vec::new());
        for sent in &self.sent {
            // An unsent column is an empty slice of its own type (an empty
            // byte slice is not aligned for a cast).
            edge_attr.push(match sent.attr {
                true => bytemuck::cast_slice_mut(next()),
                false => &mut [][..],
            });
            edge_weight.push(match sent.weight {
                true => bytemuck::cast_slice_mut(next()),
                false => &mut [][..],
            });
            edge_time.push(match sent.time {
                true => bytemuck::cast_slice_mut(next()),
                false => &mut [][..],
            });
        }
        let hops = self.shape.hops();
        let mut take = |n: usize| {
            let (head, rest) = std::mem::take(&mut counts).split_at_mut(n);
            counts = rest;
            head
        };
        let sampled_nodes = (0..self.feature_dims.len())
            .map(|_| take(hops + 1))
            .collect();
        let sampled_edges = (0..self.shape.edges.len()).map(|_| take(hops)).collect();
        GraphColumns {
            target_id,
            status,
            target_row,
            nodes,
            edge_index,
            sampled_nodes,
            sampled_edges,
            edge_attr,
            edge_weight,
            edge_time,
        }
    }

    /// Writes the response header (status OK). Returns the bytes used.
    pub fn finish(self, request_id: u64, meta: impl Into<ResponseMeta>, server_ns: u64) -> usize {
        let meta = meta.into();
        let header_len = size_of::<ResponseHeader>();
        let n_nodes: u32 = self.shape.node_rows.iter().sum();
        let placed = &self.placed;
        let (fanouts, fanout3) = self.shape.header_fanouts();
        // The subgraph layout's header points at its node and edge tables;
        // the typed layout's at its directory and counts table.
        let (node_table, edge_table) = match &placed.counts {
            None => (
                placed.nodes[0].stream.clone(),
                placed.edges[0].stream.clone(),
            ),
            Some(counts) => (
                header_len
                    ..header_len
                        + DIRECTORY_ENTRY_BYTES
                            * (placed.nodes.len()
                                + placed.edges.len()
                                + self.shape.edge_data.any() as usize * placed.edges.len()),
                counts.stream.clone(),
            ),
        };
        let header = ResponseHeader {
            n_targets: self.shape.n_targets,
            n_nodes,
            fanouts,
            node_table_offset: node_table.start as u64,
            node_table_len: node_table.len() as u64,
            target_table_offset: placed.targets.stream.start as u64,
            target_table_len: placed.targets.stream.len() as u64,
            edge_table_offset: edge_table.start as u64,
            edge_table_len: edge_table.len() as u64,
            hops: self.shape.hops() as u32,
            fanout3,
            ..ok_header(request_id, meta, server_ns)
        };
        self.area[..header_len].copy_from_slice(bytemuck::bytes_of(&header));
        [&placed.targets]
            .into_iter()
            .chain(&placed.counts)
            .chain(&placed.nodes)
            .chain(&placed.edges)
            .chain(placed.data.iter().flatten())
            .map(|t| t.stream.end)
            .max()
            .expect("a target table")
    }
}

/// The decoded tables of an OK graph response, in either form; the
/// arrays' buffers point into the response area. A subgraph-layout
/// response reads as the 1x1 graph's: node type 0 its node table, edge
/// type 0 its edge table's `edge_index`, the counts its `hop_counts` (row
/// 0 the nodes', row 1 the edges').
#[derive(Debug, Clone)]
pub struct GraphTables {
    pub header: ResponseHeader,
    pub targets: RecordBatch,
    pub counts: RecordBatch,
    /// Per node type.
    pub nodes: Vec<RecordBatch>,
    /// Per edge type.
    pub edges: Vec<RecordBatch>,
    /// Per edge type: its data table, where the response carries one.
    pub edge_data: Vec<Option<RecordBatch>>,
    /// Per node type: whether it has features.
    has_features: Vec<bool>,
    n_edge_types: usize,
}

/// Decodes a graph response (`area`: the whole response area) to a
/// request whose targets are of node type `target_type`: the typed layout
/// of `graph`, or with `graph` `None` (a one-type graph's segment) the
/// subgraph layout, read as the 1x1 graph's (`target_type` 0). Every
/// table is checked against its documented schema and every index against
/// the table it points into. No copy.
pub fn decode_graph(
    area: &Buffer,
    limits: &DecodeLimits,
    graph: Option<&GraphSchema>,
    target_type: usize,
    schemas: &SchemaCache,
) -> Result<GraphTables, DecodeError> {
    let one_type;
    let (graph, typed) = match graph {
        Some(graph) => (graph, true),
        None => {
            one_type = schemas.one_type(limits.feature_dim);
            (&*one_type, false)
        }
    };
    decode_graph_with(
        area,
        limits,
        graph,
        typed,
        target_type,
        EdgeColumns::default(),
        schemas,
    )
}

/// [`decode_graph`] of a response to a request that asked for the edge
/// data `asked` (docs/protocol.md, "Edge data"): `graph` is the segment's
/// (a one-type graph's the 1x1 graph, `typed` false, whose edge type
/// carries what the segment header says), and each edge type's data table
/// holds the asked columns it carries, one row per edge.
pub fn decode_graph_with(
    area: &Buffer,
    limits: &DecodeLimits,
    graph: &GraphSchema,
    typed: bool,
    target_type: usize,
    asked: EdgeColumns,
    schemas: &SchemaCache,
) -> Result<GraphTables, DecodeError> {
    let malformed = |m: String| DecodeError::Malformed(m);
    let header = read_ok_header(area)?;
    let subgraph = !typed;
    let data_entries = directory_data_entries(graph, asked);
    let header_len = size_of::<ResponseHeader>();
    let word = |at: usize| -> u64 {
        area.as_slice().get(at..at + 8).map_or(u64::MAX, |b| {
            u64::from_le_bytes(b.try_into().expect("8 bytes"))
        })
    };
    if target_type >= graph.node_types.len() {
        return Err(malformed(format!(
            "target type {target_type}; the graph has {} node types",
            graph.node_types.len()
        )));
    }
    if header.n_targets > limits.max_targets || header.n_nodes > limits.max_nodes {
        return Err(malformed(format!(
            "{} targets and {} nodes, more than the segment's {} and {}",
            header.n_targets, header.n_nodes, limits.max_targets, limits.max_nodes
        )));
    }
    let hops = header.hops as usize;
    if !(1..=MAX_SUBGRAPH_HOPS).contains(&hops) {
        return Err(malformed(format!(
            "a graph response has hops {hops} (1 to {MAX_SUBGRAPH_HOPS})"
        )));
    }
    let all = [header.fanouts[0], header.fanouts[1], header.fanout3];
    if subgraph {
        // Each of its hops' fanout (hop 3 capped as hop 2), 0 past its last.
        for (hop, &fanout) in all.iter().enumerate() {
            let cap = limits.max_fanouts[hop.min(MAX_HOPS - 1)].min(MAX_FANOUT);
            let ok = if hop < hops {
                (1..=cap).contains(&fanout)
            } else {
                fanout == 0
            };
            if !ok {
                return Err(malformed(format!(
                    "fanout {fanout} of hop {} outside 1..={cap} (0 past the last of {hops} hops)",
                    hop + 1,
                )));
            }
        }
    } else if all != [0; 3] {
        return Err(malformed(format!(
            "a typed response has fanouts {all:?} (all 0)"
        )));
    }
    let targets = decode_table(
        area,
        "target",
        header.target_table_offset,
        header.target_table_len,
        &schemas.subgraph_target(),
    )?;
    let (counts, nodes, edges) = if subgraph {
        let node = decode_table(
            area,
            "node",
            header.node_table_offset,
            header.node_table_len,
            &schemas.node(limits.feature_dim),
        )?;
        let edge = decode_table(
            area,
            "edge",
            header.edge_table_offset,
            header.edge_table_len,
            &schemas.edges(true),
        )?;
        if edge.num_rows() != 2 {
            return Err(malformed(format!(
                "the edge table has {} rows: two",
                edge.num_rows()
            )));
        }
        let counts = RecordBatch::try_new(counts_schema(), vec![edge.column(1).clone()])
            .expect("hop_counts is the counts table's column");
        (counts, vec![node], vec![edge])
    } else {
        let n_tables = graph.node_types.len() + graph.edge_types.len() + data_entries;
        if header.node_table_offset != header_len as u64
            || header.node_table_len != (DIRECTORY_ENTRY_BYTES * n_tables) as u64
            || area.len() < header_len + DIRECTORY_ENTRY_BYTES * n_tables
        {
            return Err(malformed(format!(
                "table directory at {}+{}; expected {header_len}+{}",
                header.node_table_offset,
                header.node_table_len,
                DIRECTORY_ENTRY_BYTES * n_tables
            )));
        }
        let entry = |i: usize| {
            let at = header_len + DIRECTORY_ENTRY_BYTES * i;
            (word(at), word(at + 8))
        };
        let counts = decode_table(
            area,
            "counts",
            header.edge_table_offset,
            header.edge_table_len,
            &schemas.counts(),
        )?;
        let mut nodes = Vec::with_capacity(graph.node_types.len());
        for (i, t) in graph.node_types.iter().enumerate() {
            let (offset, len) = entry(i);
            let table = decode_table(area, "node", offset, len, &schemas.node(t.feature_dim))
                .map_err(|e| malformed(format!("node type {}: {e}", t.name)))?;
            nodes.push(table);
        }
        let mut edges = Vec::with_capacity(graph.edge_types.len());
        for e in 0..graph.edge_types.len() {
            let (offset, len) = entry(graph.node_types.len() + e);
            let table = decode_table(area, "edge", offset, len, &schemas.edges(false))
                .map_err(|err| malformed(format!("edge type {}: {err}", graph.edge_key(e))))?;
            edges.push(table);
        }
        (counts, nodes, edges)
    };
    // The data entries follow the typed directory's node and edge types;
    // the subgraph layout's directory holds them alone.
    let first_data = match subgraph {
        true => 0,
        false => graph.node_types.len() + graph.edge_types.len(),
    };
    if subgraph && data_entries > 0 && area.len() < header_len + 64 {
        return Err(malformed("no room for the edge data directory".into()));
    }
    let mut edge_data = Vec::with_capacity(graph.edge_types.len());
    for (e, t) in graph.edge_types.iter().enumerate() {
        let sent = asked.sent(&t.data);
        let at = header_len + DIRECTORY_ENTRY_BYTES * (first_data + e);
        let (offset, len) = match data_entries {
            0 => (0, 0),
            _ => (word(at), word(at + 8)),
        };
        if !sent.any() {
            if (offset, len) != (0, 0) {
                return Err(malformed(format!(
                    "edge type {} sends no edge data asked for, yet its directory entry is \
                     {offset}+{len} (0+0)",
                    graph.edge_key(e)
                )));
            }
            edge_data.push(None);
            continue;
        }
        let expected = schemas.edge_data(t.data.attr_dim, sent);
        let table = decode_table(area, "edge data", offset, len, &expected)
            .map_err(|err| malformed(format!("edge type {}: {err}", graph.edge_key(e))))?;
        edge_data.push(Some(table));
    }
    let tables = GraphTables {
        header,
        targets,
        counts,
        nodes,
        edges,
        edge_data,
        has_features: graph.node_types.iter().map(|t| t.feature_dim > 0).collect(),
        n_edge_types: graph.edge_types.len(),
    };
    tables.validate(graph, target_type)?;
    Ok(tables)
}

impl GraphTables {
    pub fn hops(&self) -> usize {
        self.header.hops as usize
    }

    /// The subgraph layout's fanouts, one per hop, as its header states
    /// them; `None` for the typed layout (whose fanouts are per edge type,
    /// the request's).
    pub fn subgraph_fanouts(&self) -> Option<SubgraphFanouts> {
        let all = [
            self.header.fanouts[0],
            self.header.fanouts[1],
            self.header.fanout3,
        ];
        SubgraphFanouts::new(&all[..self.hops().min(all.len())])
    }

    pub fn n_targets(&self) -> usize {
        self.targets.num_rows()
    }

    pub fn target_ids(&self) -> &[u64] {
        self.targets.column(0).as_primitive::<UInt64Type>().values()
    }

    pub fn target_status(&self) -> &[u8] {
        self.targets.column(1).as_primitive::<UInt8Type>().values()
    }

    /// Each target's row in its type's node table.
    pub fn target_rows(&self) -> &[i32] {
        self.targets.column(2).as_primitive::<Int32Type>().values()
    }

    /// Node type `t`'s rows.
    pub fn n_rows(&self, t: usize) -> usize {
        self.nodes[t].num_rows()
    }

    /// Node type `t`'s node ids (PyG's `n_id` of the type), inside the slot.
    pub fn node_ids(&self, t: usize) -> &[u64] {
        self.nodes[t]
            .column(0)
            .as_primitive::<UInt64Type>()
            .values()
    }

    /// Node type `t`'s `rows x feature_dim` f32 features, row-major,
    /// inside the slot; empty for a type without features.
    pub fn features(&self, t: usize) -> &[f32] {
        if !self.has_features[t] {
            return &[];
        }
        self.nodes[t]
            .column(1)
            .as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .values()
    }

    /// Node type `t`'s tiers; empty for a type without features.
    pub fn tiers(&self, t: usize) -> &[u8] {
        if !self.has_features[t] {
            return &[];
        }
        self.nodes[t].column(2).as_primitive::<UInt8Type>().values()
    }

    /// Whether row `row` of node type `t` is a default row (false for a
    /// type without features).
    pub fn fallback(&self, t: usize, row: usize) -> bool {
        self.has_features[t] && self.nodes[t].column(3).as_boolean().value(row)
    }

    /// Edge type `e`'s `edge_index`, `2 x edges` int64, row-major, inside
    /// the slot.
    pub fn edge_index(&self, e: usize) -> &[i64] {
        self.edges[e]
            .column(0)
            .as_list::<i32>()
            .values()
            .as_primitive::<Int64Type>()
            .values()
    }

    /// Edge type `e`'s `edges x attr_dim` f32 attributes (PyG's
    /// `edge_attr`), row-major, in `edge_index`'s column order, inside the
    /// slot; empty where the response carries none.
    pub fn edge_attr(&self, e: usize) -> &[f32] {
        self.edge_data_column(e, edge_data_columns::EDGE_ATTR)
            .map_or(&[], |c| {
                c.as_fixed_size_list()
                    .values()
                    .as_primitive::<Float32Type>()
                    .values()
            })
    }

    /// Edge type `e`'s weights (PyG's `edge_weight`), one per edge in
    /// `edge_index`'s column order; empty where the response carries none.
    pub fn edge_weight(&self, e: usize) -> &[f32] {
        self.edge_data_column(e, edge_data_columns::EDGE_WEIGHT)
            .map_or(&[], |c| c.as_primitive::<Float32Type>().values())
    }

    /// Edge type `e`'s times (PyG's `edge_time`), one per edge in
    /// `edge_index`'s column order; empty where the response carries none.
    pub fn edge_time(&self, e: usize) -> &[i64] {
        self.edge_data_column(e, edge_data_columns::EDGE_TIME)
            .map_or(&[], |c| c.as_primitive::<Int64Type>().values())
    }

    fn edge_data_column(&self, e: usize, name: &str) -> Option<&arrow_array::ArrayRef> {
        self.edge_data.get(e)?.as_ref()?.column_by_name(name)
    }

    fn counts_row(&self, row: usize) -> &[i64] {
        let list = self.counts.column(0).as_list::<i32>();
        let offsets = list.offsets();
        let values = list.values().as_primitive::<Int64Type>().values();
        &values[offsets[row] as usize..offsets[row + 1] as usize]
    }

    /// Node type `t`'s nodes first reached at each hop (hop 0: the unique
    /// targets, for the target type), `hops + 1` counts.
    pub fn sampled_nodes(&self, t: usize) -> &[i64] {
        self.counts_row(t)
    }

    /// Edge type `e`'s edges sampled at each hop, `hops` counts.
    pub fn sampled_edges(&self, e: usize) -> &[i64] {
        self.counts_row(self.has_features.len() + e)
    }

    pub(crate) fn validate(
        &self,
        graph: &GraphSchema,
        target_type: usize,
    ) -> Result<(), DecodeError> {
        let bad = |what: String| Err(DecodeError::Malformed(what));
        let hops = self.hops() as i32;
        let n_types = graph.node_types.len();
        let mut expected = vec![0i32];
        for n in std::iter::repeat_n(hops + 1, n_types)
            .chain(std::iter::repeat_n(hops, self.n_edge_types))
        {
            expected.push(expected.last().expect("one") + n);
        }
        let counts = self.counts.column(0).as_list::<i32>();
        let n_counts = counts.values().len() as i32;
        if counts.offsets()[..] != expected[..] || n_counts != *expected.last().expect("one") {
            return bad(format!(
                "counts table offsets {:?}: expected {expected:?}",
                &counts.offsets()[..]
            ));
        }
        if self.targets.num_rows() != self.header.n_targets as usize {
            return bad(format!(
                "{} targets, header says {}",
                self.targets.num_rows(),
                self.header.n_targets
            ));
        }
        let total: usize = self.nodes.iter().map(RecordBatch::num_rows).sum();
        if total != self.header.n_nodes as usize {
            return bad(format!(
                "node tables hold {total} rows, header says {}",
                self.header.n_nodes
            ));
        }
        let sum = |counts: &[i64]| {
            counts.iter().try_fold(0i64, |acc, &c| {
                (c >= 0).then(|| acc.checked_add(c)).flatten()
            })
        };
        for (t, nodes) in self.nodes.iter().enumerate() {
            if sum(self.sampled_nodes(t)) != Some(nodes.num_rows() as i64) {
                return bad(format!(
                    "node type {}: counts {:?} do not add up to its {} rows",
                    graph.node_types[t].name,
                    self.sampled_nodes(t),
                    nodes.num_rows()
                ));
            }
            if t != target_type && self.sampled_nodes(t)[0] != 0 {
                return bad(format!(
                    "node type {} has hop-0 nodes but is not the target type",
                    graph.node_types[t].name
                ));
            }
            if self.tiers(t).iter().any(|&c| c > tier::MAX) {
                return bad(format!(
                    "node type {}: unknown tier code",
                    graph.node_types[t].name
                ));
            }
        }
        let n_target_rows = self.n_rows(target_type) as i64;
        if self.sampled_nodes(target_type)[0] > self.n_targets() as i64 {
            return bad("more hop-0 nodes than targets".into());
        }
        // A FRESH target (the answer to FRESH_SINCE) has no row, and only it.
        for (&row, &status) in self.target_rows().iter().zip(self.target_status()) {
            match status {
                target_status::OK | target_status::UNKNOWN_NODE => {
                    if !(0..n_target_rows).contains(&i64::from(row)) {
                        return bad(format!(
                            "a target row is outside the target type's {n_target_rows} rows"
                        ));
                    }
                }
                target_status::FRESH if row == NO_ROW => {}
                target_status::FRESH => {
                    return bad(format!("a FRESH target has row {row}: it has none (-1)"))
                }
                other => return bad(format!("unknown target status {other}")),
            }
        }
        for (e, table) in self.edges.iter().enumerate() {
            let key = graph.edge_key(e);
            let offsets = table.column(0).as_list::<i32>().offsets();
            let index = self.edge_index(e);
            let n = index.len() as i32;
            if offsets[..] != [0, n / 2, n] || n % 2 != 0 {
                return bad(format!(
                    "edge type {key}: edge_index offsets {:?}: expected two rows of equal length",
                    &offsets[..]
                ));
            }
            let (src, dst) = index.split_at(index.len() / 2);
            let ends = &graph.edge_types[e];
            let (n_src, n_dst) = (
                self.n_rows(ends.src as usize) as i64,
                self.n_rows(ends.dst as usize) as i64,
            );
            if src.iter().any(|&r| !(0..n_src).contains(&r))
                || dst.iter().any(|&r| !(0..n_dst).contains(&r))
            {
                return bad(format!(
                    "edge type {key}: a row is outside its source type's {n_src} or its \
                     destination type's {n_dst} rows"
                ));
            }
            if let Some(data) = &self.edge_data[e] {
                if data.num_rows() != src.len() {
                    return bad(format!(
                        "edge type {key}: its edge data table has {} rows for {} edges",
                        data.num_rows(),
                        src.len()
                    ));
                }
            }
            if sum(self.sampled_edges(e)) != Some(src.len() as i64) {
                return bad(format!(
                    "edge type {key}: counts {:?} do not add up to its {} edges",
                    self.sampled_edges(e),
                    src.len()
                ));
            }
        }
        Ok(())
    }
}
