//! A segment file as a worker attaches to it: refused, or valid with every
//! slot inside the mapping (docs/protocol.md 2 and 7).
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::Segment;

fuzz_target!(|bytes: &[u8]| {
    let name = format!("gnn-fuzz-segment-{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    std::fs::write(&path, bytes).expect("write the segment file");
    if let Ok(segment) = Segment::attach(&name) {
        let g = segment.geometry();
        let end = g.slot_data_offset + g.slot_stride * u64::from(g.slot_count);
        assert!(end <= segment.len() as u64);
        for slot in segment.slots() {
            let _ = slot.load();
        }
    }
    let _ = std::fs::remove_file(&path);
});
