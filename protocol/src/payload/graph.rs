//! A typed graph's response (docs/protocol.md, section 4.4): a table
//! directory after the response header, the target table, the counts
//! table, one node table per node type and one edge table per edge type,
//! in the graph schema's order; written in place and read without copying
//! like the one-type layouts.

use std::mem::size_of;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, Int64Type, UInt64Type, UInt8Type};
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;

use crate::graph_schema::GraphSchema;
use crate::layout::{status, ResponseHeader, MAX_HOPS, MAX_SUBGRAPH_HOPS, MESSAGE_BYTES};
use crate::payload::ipc::{self, ColumnKind};
use crate::payload::schema::{target_status, tier, NO_ROW};
use crate::payload::table::{decode_table, read_ok_header};
use crate::payload::writer::{
    carve, node_kinds, place_table, stream_len, NodeColumns, ResponseMeta, SchemaCache,
    TablePlacement, WriteError, SUBGRAPH_TARGET_COLUMNS,
};
use crate::payload::{DecodeError, DecodeLimits};

/// Bytes of one table directory entry: the table's offset and length.
pub const DIRECTORY_ENTRY_BYTES: usize = 16;

/// The size of a typed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedShape {
    pub hops: u32,
    pub n_targets: u32,
    /// Per node type: its rows.
    pub node_rows: Vec<u32>,
    /// Per edge type: its edges.
    pub edges: Vec<u32>,
}

/// Every column of a typed response being written.
#[derive(Debug)]
pub struct TypedColumns<'a> {
    pub target_id: &'a mut [u64],
    pub status: &'a mut [u8],
    /// Each target's row in its type's node table.
    pub target_row: &'a mut [i32],
    /// Per node type.
    pub nodes: Vec<NodeColumns<'a>>,
    /// Per edge type: `2 x edges`, row-major; row 0 the sources' rows in
    /// the source type's table, row 1 the destinations' in the
    /// destination type's.
    pub edge_index: Vec<&'a mut [i64]>,
    /// Per node type: `hops + 1` counts (PyG's `num_sampled_nodes_dict`).
    pub sampled_nodes: Vec<&'a mut [i64]>,
    /// Per edge type: `hops` counts (PyG's `num_sampled_edges_dict`).
    pub sampled_edges: Vec<&'a mut [i64]>,
}

/// A typed response being written into a slot's response area.
#[derive(Debug)]
pub struct TypedResponseWriter<'a> {
    area: &'a mut [u8],
    shape: TypedShape,
    feature_dims: Vec<u32>,
    directory_len: usize,
    targets: TablePlacement,
    counts: TablePlacement,
    nodes: Vec<TablePlacement>,
    edges: Vec<TablePlacement>,
}

impl<'a> TypedResponseWriter<'a> {
    /// Lays the response out in `area` (checking first that it fits, so a
    /// response that does not leaves the area untouched), writes its Arrow
    /// metadata, the list offsets and the directory, zeroes the fallback
    /// bitmaps, and returns the writer for the values. `shape` has one
    /// entry per node type and per edge type of `graph`.
    pub fn new(
        area: &'a mut [u8],
        graph: &GraphSchema,
        shape: TypedShape,
        schemas: &SchemaCache,
    ) -> Result<Self, WriteError> {
        assert_eq!(shape.node_rows.len(), graph.node_types.len());
        assert_eq!(shape.edges.len(), graph.edge_types.len());
        assert!((1..=MAX_SUBGRAPH_HOPS as u32).contains(&shape.hops));
        if !(area.as_ptr() as usize).is_multiple_of(64) {
            return Err(WriteError::Misaligned);
        }
        let n_nodes: u64 = shape.node_rows.iter().map(|&n| u64::from(n)).sum();
        let too_large = |needed: usize, available: usize| WriteError::TooLarge {
            needed,
            available,
            n_nodes: n_nodes.min(u64::from(u32::MAX)) as u32,
            feature_dim: 0,
        };
        let hops = shape.hops as usize;
        let n_counts = graph.node_types.len() * (hops + 1) + graph.edge_types.len() * hops;
        // (schema, plan) of each table, in the order they are placed.
        let mut tables = Vec::with_capacity(2 + shape.node_rows.len() + shape.edges.len());
        tables.push((
            schemas.subgraph_target(),
            ipc::plan_body(shape.n_targets as usize, &SUBGRAPH_TARGET_COLUMNS),
        ));
        let counts_rows = graph.node_types.len() + graph.edge_types.len();
        tables.push((
            schemas.counts(),
            ipc::plan_body(
                counts_rows,
                &[ColumnKind::VarList {
                    width: 8,
                    children: n_counts,
                }],
            ),
        ));
        for (t, &rows) in graph.node_types.iter().zip(&shape.node_rows) {
            let plan = ipc::plan_body(rows as usize, &node_kinds(t.feature_dim));
            tables.push((schemas.node(t.feature_dim), plan));
        }
        for &edges in &shape.edges {
            let kinds = [ColumnKind::VarList {
                width: 8,
                children: 2 * edges as usize,
            }];
            tables.push((schemas.edges(false), ipc::plan_body(2, &kinds)));
        }
        let directory_len = DIRECTORY_ENTRY_BYTES * (tables.len() - 2);
        let header_len = size_of::<ResponseHeader>();
        let mut planned = Vec::with_capacity(tables.len());
        let mut needed = Some(header_len + directory_len.next_multiple_of(64));
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
        let mut at = header_len + directory_len.next_multiple_of(64);
        let mut placed = Vec::with_capacity(planned.len());
        for (schema, batch, plan) in planned {
            let table = place_table(area, at, &schema.message, &batch, plan);
            at = table.stream.end.next_multiple_of(64);
            placed.push(table);
        }
        let mut placed = placed.into_iter();
        let targets = placed.next().expect("the target table");
        let counts = placed.next().expect("the counts table");
        let nodes: Vec<TablePlacement> = placed.by_ref().take(shape.node_rows.len()).collect();
        let edges: Vec<TablePlacement> = placed.collect();
        // The list offsets follow from the shape.
        let mut count_offsets = Vec::with_capacity(counts_rows + 1);
        count_offsets.push(0i32);
        let per_row = std::iter::repeat_n(hops + 1, graph.node_types.len())
            .chain(std::iter::repeat_n(hops, graph.edge_types.len()));
        for n in per_row {
            count_offsets.push(count_offsets.last().expect("one") + n as i32);
        }
        let range = counts.offsets(0).expect("a list column");
        bytemuck::cast_slice_mut::<u8, i32>(&mut area[range]).copy_from_slice(&count_offsets);
        for (table, &n) in edges.iter().zip(&shape.edges) {
            let range = table.offsets(0).expect("a list column");
            let n = n as i32;
            bytemuck::cast_slice_mut::<u8, i32>(&mut area[range]).copy_from_slice(&[0, n, 2 * n]);
        }
        for (i, table) in nodes.iter().chain(&edges).enumerate() {
            let at = header_len + DIRECTORY_ENTRY_BYTES * i;
            area[at..at + 8].copy_from_slice(&(table.stream.start as u64).to_le_bytes());
            area[at + 8..at + 16].copy_from_slice(&(table.stream.len() as u64).to_le_bytes());
        }
        let mut writer = Self {
            area,
            shape,
            feature_dims: graph.node_types.iter().map(|t| t.feature_dim).collect(),
            directory_len,
            targets,
            counts,
            nodes,
            edges,
        };
        for nodes in writer.columns().nodes {
            nodes.fallback.fill(0);
        }
        Ok(writer)
    }

    pub fn shape(&self) -> &TypedShape {
        &self.shape
    }

    /// Mutable views of every column.
    pub fn columns(&mut self) -> TypedColumns<'_> {
        let mut ranges = Vec::new();
        for idx in 0..3 {
            ranges.push(self.targets.column(idx));
        }
        ranges.push(self.counts.column(0));
        for table in &self.nodes {
            for idx in 0..table.plan.values.len() {
                ranges.push(table.column(idx));
            }
        }
        for table in &self.edges {
            ranges.push(table.column(0));
        }
        let mut parts = carve(self.area, &ranges).into_iter();
        let mut next = || parts.next().expect("one part per carved range");
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
            .edges
            .iter()
            .map(|_| bytemuck::cast_slice_mut(next()))
            .collect();
        let hops = self.shape.hops as usize;
        let mut take = |n: usize| {
            let (head, rest) = std::mem::take(&mut counts).split_at_mut(n);
            counts = rest;
            head
        };
        let sampled_nodes = (0..self.feature_dims.len())
            .map(|_| take(hops + 1))
            .collect();
        let sampled_edges = (0..self.shape.edges.len()).map(|_| take(hops)).collect();
        TypedColumns {
            target_id,
            status,
            target_row,
            nodes,
            edge_index,
            sampled_nodes,
            sampled_edges,
        }
    }

    /// Writes the response header (status OK). Returns the bytes used.
    pub fn finish(self, request_id: u64, meta: impl Into<ResponseMeta>, server_ns: u64) -> usize {
        let meta = meta.into();
        let header_len = size_of::<ResponseHeader>();
        let n_nodes: u32 = self.shape.node_rows.iter().sum();
        let header = ResponseHeader {
            status: status::OK,
            n_targets: self.shape.n_targets,
            n_nodes,
            fanouts: [0; MAX_HOPS],
            message_len: 0,
            request_id,
            graph_version: meta.graph_version,
            node_table_offset: header_len as u64,
            node_table_len: self.directory_len as u64,
            target_table_offset: self.targets.stream.start as u64,
            target_table_len: self.targets.stream.len() as u64,
            server_ns,
            change_clock: meta.change_clock,
            change_tick: meta.change_tick,
            id_bound: meta.id_bound,
            edge_table_offset: self.counts.stream.start as u64,
            edge_table_len: self.counts.stream.len() as u64,
            hops: self.shape.hops,
            fanout3: 0,
            message: [0; MESSAGE_BYTES],
        };
        self.area[..header_len].copy_from_slice(bytemuck::bytes_of(&header));
        let last = self
            .edges
            .last()
            .or(self.nodes.last())
            .unwrap_or(&self.counts);
        last.stream.end
    }
}

/// The decoded tables of an OK typed response; the arrays' buffers point
/// into the response area.
#[derive(Debug, Clone)]
pub struct TypedTables {
    pub header: ResponseHeader,
    pub targets: RecordBatch,
    pub counts: RecordBatch,
    /// Per node type.
    pub nodes: Vec<RecordBatch>,
    /// Per edge type.
    pub edges: Vec<RecordBatch>,
    /// Per node type: whether it has features.
    has_features: Vec<bool>,
    n_edge_types: usize,
}

/// Decodes a typed response (`area`: the whole response area) to a
/// request whose targets are of node type `target_type`. Every table is
/// checked against its documented schema and every index against the
/// table it points into. No copy.
pub fn decode_typed(
    area: &Buffer,
    limits: &DecodeLimits,
    graph: &GraphSchema,
    target_type: usize,
    schemas: &SchemaCache,
) -> Result<TypedTables, DecodeError> {
    let malformed = |m: String| DecodeError::Malformed(m);
    let header = read_ok_header(area)?;
    if target_type >= graph.node_types.len() {
        return Err(malformed(format!(
            "target type {target_type}; the graph has {} node types",
            graph.node_types.len()
        )));
    }
    let hops = header.hops as usize;
    if !(1..=MAX_SUBGRAPH_HOPS).contains(&hops)
        || header.fanouts != [0; MAX_HOPS]
        || header.fanout3 != 0
    {
        return Err(malformed(format!(
            "a typed response has hops {hops} (1 to {MAX_SUBGRAPH_HOPS}) and fanouts {:?}, {} \
             (all 0)",
            header.fanouts, header.fanout3
        )));
    }
    if header.n_targets > limits.max_targets || header.n_nodes > limits.max_nodes {
        return Err(malformed(format!(
            "{} targets and {} nodes, more than the segment's {} and {}",
            header.n_targets, header.n_nodes, limits.max_targets, limits.max_nodes
        )));
    }
    let n_tables = graph.node_types.len() + graph.edge_types.len();
    let header_len = size_of::<ResponseHeader>() as u64;
    if header.node_table_offset != header_len
        || header.node_table_len != (DIRECTORY_ENTRY_BYTES * n_tables) as u64
        || area.len() < header_len as usize + DIRECTORY_ENTRY_BYTES * n_tables
    {
        return Err(malformed(format!(
            "table directory at {}+{}; expected {header_len}+{}",
            header.node_table_offset,
            header.node_table_len,
            DIRECTORY_ENTRY_BYTES * n_tables
        )));
    }
    let entry = |i: usize| {
        let at = header_len as usize + DIRECTORY_ENTRY_BYTES * i;
        let word = |at: usize| {
            u64::from_le_bytes(area.as_slice()[at..at + 8].try_into().expect("8 bytes"))
        };
        (word(at), word(at + 8))
    };
    let targets = decode_table(
        area,
        "target",
        header.target_table_offset,
        header.target_table_len,
        &schemas.subgraph_target(),
    )?;
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
    let tables = TypedTables {
        header,
        targets,
        counts,
        nodes,
        edges,
        has_features: graph.node_types.iter().map(|t| t.feature_dim > 0).collect(),
        n_edge_types: graph.edge_types.len(),
    };
    tables.validate(graph, target_type)?;
    Ok(tables)
}

impl TypedTables {
    /// A one-type graph's subgraph-layout response read as the 1x1 typed
    /// graph's (node type 0, edge type 0): the same record batches, no
    /// copy, so that one reader serves a subgraph of either kind. The node
    /// table is type 0's, the edge table's `edge_index` edge type 0's, its
    /// `hop_counts` the counts (row 0 the nodes', row 1 the edges'). A
    /// target answered `FRESH` keeps its `NO_ROW`. `None` for a
    /// dense-layout response, which has no edge table.
    pub fn from_subgraph(tables: &crate::payload::ResponseTables) -> Option<Self> {
        let edges = tables.edges.as_ref().filter(|_| tables.hops() > 0)?;
        let counts = RecordBatch::try_new(
            crate::payload::schema::counts_schema(),
            vec![edges.column(1).clone()],
        )
        .expect("hop_counts is the counts table's column");
        Some(Self {
            header: tables.header,
            targets: tables.targets.clone(),
            counts,
            nodes: vec![tables.nodes.clone()],
            edges: vec![edges.clone()],
            has_features: vec![true],
            n_edge_types: 1,
        })
    }

    pub fn hops(&self) -> usize {
        self.header.hops as usize
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
