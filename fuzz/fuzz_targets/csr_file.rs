//! A graph index file (docs/graph-index.md): refused, or every neighbour
//! list inside the graph and every row's edge data as long as its row.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use sidecar::graph::index::CsrIndex;

fuzz_target!(|bytes: &[u8]| {
    let path = common::scratch().join("graph.csr");
    std::fs::write(&path, bytes).expect("write the index file");
    if let Ok(index) = CsrIndex::open(&path) {
        let n = index.n_nodes();
        let shape = index.edge_data();
        for node in 0..n.min(64) {
            let row = index.neighbors(node);
            let bound = index.header().source_count();
            assert!(row.iter().all(|&v| u64::from(v) < bound));
            let data = index.edge_row(node);
            assert_eq!(data.attrs.len(), row.len() * shape.attr_dim as usize);
            assert_eq!(data.weights.len(), if shape.weight { row.len() } else { 0 });
            assert_eq!(data.times.len(), if shape.time { row.len() } else { 0 });
            assert!(data.attrs.iter().chain(data.weights).all(|v| v.is_finite()));
        }
    }
});
