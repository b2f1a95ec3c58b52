//! A graph index file (docs/graph-index.md): refused, or every neighbour
//! list inside the graph.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use sidecar::graph::index::CsrIndex;

fuzz_target!(|bytes: &[u8]| {
    let path = common::scratch().join("graph.csr");
    std::fs::write(&path, bytes).expect("write the index file");
    if let Ok(index) = CsrIndex::open(&path) {
        let n = index.n_nodes();
        for node in 0..n.min(64) {
            assert!(index.neighbors(node).iter().all(|&v| v < n));
        }
    }
});
