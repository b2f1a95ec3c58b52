//! Decoding a response without copying: the Arrow arrays borrow the slot.
//!
//! Every byte of a response area came from another process and is treated as
//! hostile: offsets are bounds-checked, the IPC streams are decoded by
//! arrow-rs with alignment *required* (a misaligned buffer is an error, never
//! a silent copy), the schemas must be exactly the documented ones, and every
//! row index is checked against the node table before anyone gathers with it.

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, UInt64Type, UInt8Type};
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;

use crate::layout::{ResponseHeader, MAX_FANOUT, MAX_HOPS};
use crate::payload::schema::{target_status, tier, HOP2_CACHED};
use crate::payload::table::{decode_table, read_ok_header, DecodeError};
use crate::payload::writer::SchemaCache;

/// The decoded tables of an OK dense-layout response (the graph layouts'
/// are [`crate::payload::GraphTables`]). The arrays' buffers point into the
/// response area they were decoded from.
#[derive(Debug, Clone)]
pub struct ResponseTables {
    pub header: ResponseHeader,
    pub nodes: RecordBatch,
    pub targets: RecordBatch,
}

/// Limits the reader enforces, from the segment the response came from.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    pub feature_dim: u32,
    pub max_nodes: u32,
    pub max_targets: u32,
    pub max_fanouts: [u32; MAX_HOPS],
}

/// Decodes the dense-layout response in `area` (the whole response area as
/// one Arrow buffer; a graph layout's is read by
/// [`crate::payload::decode_graph`]). The returned arrays share `area`'s allocation: no copy.
/// `schemas` caches the expected schemas between calls.
pub fn decode(
    area: &Buffer,
    limits: &DecodeLimits,
    schemas: &SchemaCache,
) -> Result<ResponseTables, DecodeError> {
    let header = read_ok_header(area)?;
    let malformed = |m: String| DecodeError::Malformed(m);
    if header.n_targets > limits.max_targets {
        return Err(malformed(format!(
            "{} targets, more than the segment's {}",
            header.n_targets, limits.max_targets
        )));
    }
    if header.n_nodes > limits.max_nodes {
        return Err(malformed(format!(
            "{} nodes, more than the segment's {}",
            header.n_nodes, limits.max_nodes
        )));
    }
    if header.hops != 0
        || header.fanout3 != 0
        || header.edge_table_offset != 0
        || header.edge_table_len != 0
    {
        return Err(malformed(format!(
            "a graph-layout response ({} hops, an edge table) where the dense layout was \
             expected: read it with decode_graph",
            header.hops
        )));
    }
    for (hop, &fanout) in header.fanouts.iter().enumerate() {
        let cap = limits.max_fanouts[hop].min(MAX_FANOUT);
        if !(1..=cap).contains(&fanout) {
            return Err(malformed(format!(
                "fanout {fanout} of hop {} outside 1..={cap}",
                hop + 1,
            )));
        }
    }
    let nodes = decode_table(
        area,
        "node",
        header.node_table_offset,
        header.node_table_len,
        &schemas.node(limits.feature_dim),
    )?;
    let targets = decode_table(
        area,
        "target",
        header.target_table_offset,
        header.target_table_len,
        &schemas.target(header.fanouts),
    )?;
    if nodes.num_rows() != header.n_nodes as usize
        || targets.num_rows() != header.n_targets as usize
    {
        return Err(malformed(format!(
            "tables have {} nodes and {} targets, header says {} and {}",
            nodes.num_rows(),
            targets.num_rows(),
            header.n_nodes,
            header.n_targets
        )));
    }
    let tables = ResponseTables {
        header,
        nodes,
        targets,
    };
    tables.validate_indices()?;
    Ok(tables)
}

impl ResponseTables {
    pub fn n_nodes(&self) -> usize {
        self.nodes.num_rows()
    }

    pub fn n_targets(&self) -> usize {
        self.targets.num_rows()
    }

    pub fn fanouts(&self) -> [u32; MAX_HOPS] {
        self.header.fanouts
    }

    pub fn node_ids(&self) -> &[u64] {
        self.nodes.column(0).as_primitive::<UInt64Type>().values()
    }

    /// `n_nodes x feature_dim` f32, row-major, inside the slot.
    pub fn features(&self) -> &[f32] {
        self.nodes
            .column(1)
            .as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .values()
    }

    pub fn tiers(&self) -> &[u8] {
        self.nodes.column(2).as_primitive::<UInt8Type>().values()
    }

    pub fn fallback(&self, row: usize) -> bool {
        self.nodes.column(3).as_boolean().value(row)
    }

    pub fn target_ids(&self) -> &[u64] {
        self.targets.column(0).as_primitive::<UInt64Type>().values()
    }

    pub fn target_status(&self) -> &[u8] {
        self.targets.column(1).as_primitive::<UInt8Type>().values()
    }

    fn i32_column(&self, idx: usize) -> &[i32] {
        if idx >= self.targets.num_columns() {
            return &[];
        }
        self.targets
            .column(idx)
            .as_primitive::<Int32Type>()
            .values()
    }

    fn i32_list_column(&self, idx: usize) -> &[i32] {
        if idx >= self.targets.num_columns() {
            return &[];
        }
        self.targets
            .column(idx)
            .as_fixed_size_list()
            .values()
            .as_primitive::<Int32Type>()
            .values()
    }

    pub fn target_rows(&self) -> &[i32] {
        self.i32_column(2)
    }

    pub fn hop1_counts(&self) -> &[i32] {
        self.i32_column(3)
    }

    /// `n_targets x f1`.
    pub fn hop1_rows(&self) -> &[i32] {
        self.i32_list_column(4)
    }

    /// `n_targets x f1`.
    pub fn hop2_counts(&self) -> &[i32] {
        self.i32_list_column(5)
    }

    /// `n_targets x f1 x f2`.
    pub fn hop2_rows(&self) -> &[i32] {
        self.i32_list_column(6)
    }

    /// Every row index in range, every count within its fanout, every code
    /// known: what a consumer needs before it gathers with these indices.
    fn validate_indices(&self) -> Result<(), DecodeError> {
        let n_nodes = self.n_nodes() as i64;
        let [f1, f2] = self.header.fanouts.map(|f| f as i32);
        let bad = |what: String| Err(DecodeError::Malformed(what));
        let in_range = |rows: &[i32]| {
            rows.iter()
                .all(|&r| (r as i64) >= 0 && (r as i64) < n_nodes)
        };
        if !in_range(self.target_rows())
            || !in_range(self.hop1_rows())
            || !in_range(self.hop2_rows())
        {
            return bad(format!(
                "a row index is outside the node table of {n_nodes} rows"
            ));
        }
        if self.hop1_counts().iter().any(|&c| !(0..=f1).contains(&c)) {
            return bad(format!("a hop-1 count is outside 0..={f1}"));
        }
        if self
            .hop2_counts()
            .iter()
            .any(|&c| c != HOP2_CACHED && !(0..=f2).contains(&c))
        {
            return bad(format!(
                "a hop-2 count is outside 0..={f2} (or -1, a cached hub)"
            ));
        }
        if self.target_status().iter().any(|&s| s > target_status::MAX) {
            return bad("unknown target status code".into());
        }
        if self.tiers().iter().any(|&t| t > tier::MAX) {
            return bad("unknown tier code".into());
        }
        Ok(())
    }
}
