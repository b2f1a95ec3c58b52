//! A feature row read from Redis or RocksDB, and an invalidation message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecar::features::contract::decode_row;
use sidecar::features::invalidation::parse_nodes;

fuzz_target!(|bytes: &[u8]| {
    let dim = bytes.first().map_or(0, |&b| b as usize);
    let mut row = vec![0f32; dim];
    if decode_row(bytes, &mut row) {
        assert_eq!(bytes.len(), dim * 4);
    }
    let text = String::from_utf8_lossy(bytes);
    let _ = parse_nodes(&text, &[("node", true)]);
    let _ = parse_nodes(&text, &[("airport", true), ("country", false)]);
});
