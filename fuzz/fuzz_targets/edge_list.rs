//! A text edge list (`src dst` per line), converted as `sidecar import`
//! does before building the index.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let dir = common::scratch();
    let text = dir.join("edges.txt");
    std::fs::write(&text, bytes).expect("write the edge list");
    let _ = sidecar::graph::build::text_to_binary(&text, &dir.join("edges.u32"));
});
