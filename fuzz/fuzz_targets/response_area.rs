//! A slot's response area, as the worker decodes it (docs/protocol.md 3.3
//! and 4), one-type and typed: accepted tables are internally consistent.
#![no_main]

mod common;

use arrow_buffer::{Buffer, MutableBuffer};
use libfuzzer_sys::fuzz_target;
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
        assert!(tables.edge_index().iter().all(|&r| r >= 0 && r < i64::from(n)));
        assert_eq!(tables.edge_index().len(), 2 * tables.n_edges());
        assert_eq!(tables.features().len(), tables.n_nodes() * 2);
    }
    let graph = common::typed_graph();
    for target_type in 0..graph.node_types.len() {
        let Ok(tables) =
            payload::decode_typed(&buffer, &limits, &graph, target_type, &SchemaCache::default())
        else {
            continue;
        };
        for (t, node_type) in graph.node_types.iter().enumerate() {
            let rows = tables.n_rows(t);
            assert_eq!(tables.features(t).len(), rows * node_type.feature_dim as usize);
            assert_eq!(tables.sampled_nodes(t).iter().sum::<i64>(), rows as i64);
        }
        for (e, edge_type) in graph.edge_types.iter().enumerate() {
            let index = tables.edge_index(e);
            let (src, dst) = index.split_at(index.len() / 2);
            assert!(src.iter().all(|&r| r >= 0 && (r as usize) < tables.n_rows(edge_type.src as usize)));
            assert!(dst.iter().all(|&r| r >= 0 && (r as usize) < tables.n_rows(edge_type.dst as usize)));
        }
        let n_target_rows = tables.n_rows(target_type) as i32;
        assert!(tables.target_rows().iter().all(|&r| r >= 0 && r < n_target_rows));
    }
});
