//! The Arrow schema of a response: the node table and the target table,
//! and in the subgraph layout the edge table.
//!
//! Versioned with the segment layout ([`crate::layout::LAYOUT_VERSION`]); the
//! same text is in `docs/protocol.md`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::layout::{LAYOUT_VERSION, MAX_HOPS};
use crate::request::EdgeColumns;

/// Node table columns, in order.
pub mod node_columns {
    /// UInt64: the node id.
    pub const NODE_ID: &str = "node_id";
    /// FixedSizeList<Float32, dim>: the feature row (the values buffer is a
    /// row-major `n_nodes x dim` matrix).
    pub const FEATURES: &str = "features";
    /// UInt8: which tier served the row, see [`super::tier`].
    pub const TIER: &str = "tier";
    /// Boolean: the row is the configured default, not the node's features.
    pub const FALLBACK: &str = "fallback";
}

/// Target table columns, in order.
pub mod target_columns {
    /// UInt64: the target node id, as requested.
    pub const TARGET_ID: &str = "target_id";
    /// UInt8: see [`super::target_status`].
    pub const STATUS: &str = "status";
    /// Int32: the target's row in the node table.
    pub const TARGET_ROW: &str = "target_row";
    /// Int32: sampled hop-1 neighbours (<= fanout 1).
    pub const HOP1_COUNT: &str = "hop1_count";
    /// FixedSizeList<Int32, f1>: node-table rows of the hop-1 neighbours.
    pub const HOP1_ROWS: &str = "hop1_rows";
    /// FixedSizeList<Int32, f1>: for each hop-1 neighbour, its sampled
    /// hop-2 neighbours (<= fanout 2).
    pub const HOP2_COUNT: &str = "hop2_count";
    /// FixedSizeList<Int32, f1*f2>: node-table rows of the hop-2 neighbours,
    /// `f2` entries per hop-1 neighbour.
    pub const HOP2_ROWS: &str = "hop2_rows";
}

/// Edge table columns (subgraph layout), in order. The table has two rows.
pub mod edge_columns {
    /// List<Int64>: row 0 the sampled neighbours, row 1 the nodes they were
    /// sampled for, as node-table rows; the child values buffer is PyG's
    /// `edge_index`, a row-major `2 x n_edges` matrix.
    pub const EDGE_INDEX: &str = "edge_index";
    /// List<Int64>: row 0 the nodes first reached at each hop (hop 0: the
    /// targets), PyG's `num_sampled_nodes` (`hops + 1` values); row 1 the
    /// edges sampled at each hop, PyG's `num_sampled_edges` (`hops` values).
    pub const HOP_COUNTS: &str = "hop_counts";
}

/// An edge type's data table (docs/protocol.md, "Edge data"): one row per
/// sampled edge, in `edge_index`'s column order; the columns the request
/// asked for that the edge type carries, in this order.
pub mod edge_data_columns {
    /// FixedSizeList<Float32, attr_dim>: the edge's attributes (the values
    /// buffer is PyG's `edge_attr`, a row-major `E x attr_dim` matrix).
    pub const EDGE_ATTR: &str = "edge_attr";
    /// Float32: the edge's weight (PyG's `edge_weight`).
    pub const EDGE_WEIGHT: &str = "edge_weight";
    /// Int64: the edge's time (PyG's `edge_time`).
    pub const EDGE_TIME: &str = "edge_time";
}

/// The counts table of a typed response (docs/protocol.md, section 4.4).
pub mod counts_columns {
    /// List<Int64>: one row per node type (its `num_sampled_nodes`, `hops +
    /// 1` values), then one per edge type (its `num_sampled_edges`, `hops`
    /// values), in the graph schema's order.
    pub const COUNTS: &str = "counts";
}

/// Codes of the node table's `tier` column.
pub mod tier {
    /// In-process cache.
    pub const L1: u8 = 0;
    /// RocksDB on local disk.
    pub const L2: u8 = 1;
    /// Redis.
    pub const L3: u8 = 2;
    /// No tier had it: the configured default row (`fallback` is true).
    pub const DEFAULT: u8 = 3;
    pub const MAX: u8 = DEFAULT;
}

/// Codes of the target table's `status` column.
pub mod target_status {
    /// Sampled normally.
    pub const OK: u8 = 0;
    /// The node is not in the graph index: its row holds the default features
    /// (flagged fallback) and it has no neighbours.
    pub const UNKNOWN_NODE: u8 = 1;
    /// Only in answer to a `FRESH_SINCE` request: nothing the target's
    /// sampled neighbourhood depends on changed since the request's point of
    /// the change clock, and the caller's stored answer stands. In the dense
    /// layout its own row alone is in the response (no neighbours); in the
    /// subgraph layout it has no row ([`super::NO_ROW`]) and the subgraph is
    /// the other targets'.
    pub const FRESH: u8 = 2;
    pub const MAX: u8 = FRESH;
}

/// The `target_row` of a subgraph-layout target answered `FRESH`: it has
/// no row in the node table.
pub const NO_ROW: i32 = -1;

/// The `hop2_count` of a hop-1 node sent without hop-2 neighbours because
/// the caller holds its layer-1 embedding (only in answer to the request
/// flag `HUB_H1`); its `hop2_rows` are padding.
pub const HOP2_CACHED: i32 = -1;

/// Schema-level metadata key carrying the layout version.
pub const LAYOUT_VERSION_KEY: &str = "gnn.layout_version";

fn with_version(fields: Vec<Field>) -> SchemaRef {
    let metadata = HashMap::from([(LAYOUT_VERSION_KEY.to_string(), LAYOUT_VERSION.to_string())]);
    Arc::new(Schema::new_with_metadata(fields, metadata))
}

fn fixed_list(item: DataType, size: u32) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new("item", item, false)), size as i32)
}

fn var_list(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, false)))
}

/// The node table's schema for feature rows of `feature_dim` f32; with
/// `feature_dim` 0 (a typed graph's node type without features) the node
/// ids alone (PyG's `n_id` of that type). A one-type graph's rows always
/// have features.
pub fn node_schema(feature_dim: u32) -> SchemaRef {
    let id = Field::new(node_columns::NODE_ID, DataType::UInt64, false);
    if feature_dim == 0 {
        return with_version(vec![id]);
    }
    with_version(vec![
        id,
        Field::new(
            node_columns::FEATURES,
            fixed_list(DataType::Float32, feature_dim),
            false,
        ),
        Field::new(node_columns::TIER, DataType::UInt8, false),
        Field::new(node_columns::FALLBACK, DataType::Boolean, false),
    ])
}

/// The target table's schema for `fanouts`.
pub fn target_schema(fanouts: [u32; MAX_HOPS]) -> SchemaRef {
    let [f1, f2] = fanouts;
    with_version(vec![
        Field::new(target_columns::TARGET_ID, DataType::UInt64, false),
        Field::new(target_columns::STATUS, DataType::UInt8, false),
        Field::new(target_columns::TARGET_ROW, DataType::Int32, false),
        Field::new(target_columns::HOP1_COUNT, DataType::Int32, false),
        Field::new(
            target_columns::HOP1_ROWS,
            fixed_list(DataType::Int32, f1),
            false,
        ),
        Field::new(
            target_columns::HOP2_COUNT,
            fixed_list(DataType::Int32, f1),
            false,
        ),
        Field::new(
            target_columns::HOP2_ROWS,
            fixed_list(DataType::Int32, f1 * f2),
            false,
        ),
    ])
}

/// The subgraph layout's target table: each target's id, status and row in
/// the node table (its neighbourhood is in the edge table).
pub fn subgraph_target_schema() -> SchemaRef {
    with_version(vec![
        Field::new(target_columns::TARGET_ID, DataType::UInt64, false),
        Field::new(target_columns::STATUS, DataType::UInt8, false),
        Field::new(target_columns::TARGET_ROW, DataType::Int32, false),
    ])
}

/// An edge table (two rows, see [`edge_columns`]): `edge_index`, and with
/// `hop_counts` (the subgraph layout, whose one edge type carries the
/// counts) the hop counts; a typed response's edge table of one edge type
/// has `edge_index` alone (its counts are in the counts table).
pub fn edge_schema(hop_counts: bool) -> SchemaRef {
    let mut fields = vec![Field::new(
        edge_columns::EDGE_INDEX,
        var_list(DataType::Int64),
        false,
    )];
    if hop_counts {
        fields.push(Field::new(
            edge_columns::HOP_COUNTS,
            var_list(DataType::Int64),
            false,
        ));
    }
    with_version(fields)
}

/// A typed response's counts table (see [`counts_columns`]).
pub fn counts_schema() -> SchemaRef {
    with_version(vec![Field::new(
        counts_columns::COUNTS,
        var_list(DataType::Int64),
        false,
    )])
}

/// An edge type's data table for `attr_dim` attributes and the columns
/// `sent` (see [`edge_data_columns`]).
pub fn edge_data_schema(attr_dim: u32, sent: EdgeColumns) -> SchemaRef {
    let mut fields = Vec::new();
    if sent.attr {
        fields.push(Field::new(
            edge_data_columns::EDGE_ATTR,
            fixed_list(DataType::Float32, attr_dim),
            false,
        ));
    }
    if sent.weight {
        fields.push(Field::new(
            edge_data_columns::EDGE_WEIGHT,
            DataType::Float32,
            false,
        ));
    }
    if sent.time {
        fields.push(Field::new(
            edge_data_columns::EDGE_TIME,
            DataType::Int64,
            false,
        ));
    }
    with_version(fields)
}
