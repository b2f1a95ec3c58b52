//! A segment file as a worker attaches to it: refused, or valid with every
//! slot inside the mapping (docs/protocol.md 2 and 7); and the same bytes
//! as a typed graph's schema (section 2.7): refused, or valid and encoded
//! back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::Segment;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(schema) = protocol::graph_schema::GraphSchema::decode(bytes) {
        assert_eq!(schema.encode(), bytes);
    }
    let name = format!("gnn-fuzz-segment-{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    std::fs::write(&path, bytes).expect("write the segment file");
    if let Ok(segment) = Segment::attach(&name) {
        let g = segment.geometry();
        let end = g.slot_data_offset + g.slot_stride * u64::from(g.slot_count);
        assert!(end <= segment.len() as u64);
        if let Some(graph) = segment.graph_schema() {
            assert!(graph.validate().is_ok());
        }
        for slot in segment.slots() {
            let _ = slot.load();
        }
    }
    let _ = std::fs::remove_file(&path);
});
