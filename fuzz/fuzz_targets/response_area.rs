//! A slot's response area, as the worker decodes it (docs/protocol.md 3.3
//! and 4): accepted tables are internally consistent.
#![no_main]

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
});
