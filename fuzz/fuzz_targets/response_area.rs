//! A slot's response area, as the worker decodes it (docs/protocol.md 3.3
//! and 4), one-type and typed: accepted tables are internally consistent.
#![no_main]

mod common;

use arrow_buffer::{Buffer, MutableBuffer};
use libfuzzer_sys::fuzz_target;
use protocol::graph_schema::GraphSchema;
use protocol::payload::schema::{target_status, NO_ROW};
use protocol::payload::{self, DecodeLimits, SchemaCache};

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
});
