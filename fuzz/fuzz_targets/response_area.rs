//! A slot's response area, as the worker decodes it (docs/protocol.md 3.3
//! and 4), one-type and typed: accepted tables are internally consistent.
#![no_main]

mod common;

use arrow_buffer::{Buffer, MutableBuffer};
use libfuzzer_sys::fuzz_target;
use protocol::graph_schema::{EdgeDataDesc, GraphSchema};
use protocol::payload::schema::{target_status, NO_ROW};
use protocol::payload::{self, DecodeLimits, SchemaCache};
use protocol::request::EdgeColumns;

fuzz_target!(|bytes: &[u8]| {
    let mut area = MutableBuffer::from_len_zeroed(bytes.len());
    area.as_slice_mut().copy_from_slice(bytes);
    let buffer: Buffer = area.into();
    let limits = DecodeLimits {
        feature_dim: 2,
        max_nodes: 1_000,
        max_targets: 4,
        max_fanouts: [50, 50],
    };
    if let Ok(tables) = payload::decode(&buffer, &limits, &SchemaCache::default()) {
        let n = tables.n_nodes() as i32;
        assert!(tables.hop2_rows().iter().all(|&r| r >= 0 && r < n));
        assert_eq!(tables.features().len(), tables.n_nodes() * 2);
    }
    // A one-type graph's subgraph layout (the 1x1 graph's), then each
    // target type of a typed graph's layout.
    let typed = common::typed_graph();
    let graphs = [(None, 1), (Some(&typed), typed.node_types.len())];
    for (graph, n_types) in graphs {
        let schema = graph.cloned().unwrap_or_else(|| GraphSchema::one_type(limits.feature_dim));
        for target_type in 0..n_types {
            let Ok(tables) =
                payload::decode_graph(&buffer, &limits, graph, target_type, &SchemaCache::default())
            else {
                continue;
            };
            for (t, node_type) in schema.node_types.iter().enumerate() {
                let rows = tables.n_rows(t);
                assert_eq!(tables.features(t).len(), rows * node_type.feature_dim as usize);
                assert_eq!(tables.sampled_nodes(t).iter().sum::<i64>(), rows as i64);
            }
            for (e, edge_type) in schema.edge_types.iter().enumerate() {
                let index = tables.edge_index(e);
                let (src, dst) = index.split_at(index.len() / 2);
                assert!(src.iter().all(|&r| r >= 0 && (r as usize) < tables.n_rows(edge_type.src as usize)));
                assert!(dst.iter().all(|&r| r >= 0 && (r as usize) < tables.n_rows(edge_type.dst as usize)));
            }
            // A row in the target type's table, or none (-1) for a FRESH target.
            let n_target_rows = tables.n_rows(target_type) as i32;
            for (&row, &status) in tables.target_rows().iter().zip(tables.target_status()) {
                assert!((0..n_target_rows).contains(&row) || (row == NO_ROW && status == target_status::FRESH));
            }
        }
    }
    // The same graphs with edge data, read as the answer to a request that
    // asked for every column (section 4.5): each data column holds one
    // value (or attr_dim) per edge of its type, or nothing.
    let data = EdgeDataDesc { attr_dim: 2, weight: false, time: true };
    let with_data = [
        (GraphSchema::one_type(limits.feature_dim).with_edge_data(0, data), false),
        (common::typed_graph().with_edge_data(1, data), true),
    ];
    for (graph, typed) in &with_data {
        let asked = EdgeColumns::ALL;
        let Ok(tables) = payload::decode_graph_with(
            &buffer, &limits, graph, *typed, 0, asked, &SchemaCache::default(),
        ) else {
            continue;
        };
        for (e, edge_type) in graph.edge_types.iter().enumerate() {
            let edges = tables.edge_index(e).len() / 2;
            let sent = asked.sent(&edge_type.data);
            let dim = edge_type.data.attr_dim as usize;
            assert_eq!(tables.edge_attr(e).len(), if sent.attr { edges * dim } else { 0 });
            assert_eq!(tables.edge_weight(e).len(), if sent.weight { edges } else { 0 });
            assert_eq!(tables.edge_time(e).len(), if sent.time { edges } else { 0 });
        }
    }
});
