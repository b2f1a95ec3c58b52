//! The hex test vectors of docs/protocol.md (appendix A) are exactly what
//! this implementation writes: a reader in another language can be
//! unit-tested against them without a sidecar.
//!
//! To print the vectors after a deliberate layout change (with a
//! `LAYOUT_VERSION` bump): `GNN_PRINT_VECTORS=1 cargo test --release
//! --workspace --test test_vectors -- --nocapture`.
#![cfg(not(loom))]

use std::mem::offset_of;

use arrow_buffer::MutableBuffer;
use protocol::graph_schema::{EdgeDataDesc, GraphSchema};
use protocol::layout::{dtype, FeatureSchema, Header, Preamble};
use protocol::payload::schema::{target_status, tier};
use protocol::payload::{GraphShape, GraphWriter, PayloadShape, ResponseWriter, SchemaCache};
use protocol::request::{EdgeColumns, SubgraphFanouts};
use protocol::{Segment, SegmentConfig};

/// The header vector covers the header up to the end of the feature schema.
const HEADER_VECTOR_BYTES: usize = 808;

/// The header of a segment created with the appendix's configuration, with
/// the fields that differ on every start (epoch, PID, heartbeat) zeroed.
fn header_vector() -> Vec<u8> {
    let name = format!("gnn-vectors-{}", std::process::id());
    let schema = FeatureSchema {
        feature_dim: 2,
        dtype: dtype::F32,
        graph_version: 7,
        default_fanouts: [1, 1],
    };
    let mut cfg = SegmentConfig::new(&name, schema);
    cfg.slot_count = 2;
    cfg.max_targets = 4;
    cfg.max_fanouts = [2, 2];
    cfg.max_nodes = 16;
    cfg.response_bytes = 8192;
    // A new node of 2 features and up to 494 edges fits the one page the
    // targets take: the vector shows the smallest request area.
    cfg.max_new_node_edges = 494;
    let segment = Segment::create(&cfg).expect("create");
    let mut bytes = std::fs::read(format!("/dev/shm/{name}")).expect("read the segment");
    segment.unlink().expect("unlink");
    bytes.truncate(HEADER_VECTOR_BYTES);
    let pre = offset_of!(Header, preamble);
    for (field, len) in [
        (offset_of!(Preamble, epoch), 8),
        (offset_of!(Preamble, server_pid), 4),
        (offset_of!(Preamble, server_heartbeat), 8),
    ] {
        bytes[pre + field..pre + field + len].fill(0);
    }
    bytes
}

/// A response to request 0x1122334455667788 for target 5: its neighbour 9
/// (fetched from Redis) at hop 1, no hop-2 neighbour, feature dim 2,
/// fanouts [1, 1], graph version 7, server_ns 1000.
fn response_vector() -> Vec<u8> {
    let mut area = MutableBuffer::from_len_zeroed(4096);
    let shape = PayloadShape {
        n_targets: 1,
        n_nodes: 2,
        feature_dim: 2,
        fanouts: [1, 1],
    };
    let cache = SchemaCache::default();
    let mut writer = ResponseWriter::new(area.as_slice_mut(), shape, &cache).expect("fits");
    {
        let (mut nodes, targets) = writer.columns();
        nodes.node_id.copy_from_slice(&[5, 9]);
        nodes.features.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        nodes.tier.copy_from_slice(&[tier::L1, tier::L3]);
        nodes.set_fallback(0, false);
        nodes.set_fallback(1, false);
        targets.target_id[0] = 5;
        targets.status[0] = target_status::OK;
        targets.target_row[0] = 0;
        targets.hop1_count[0] = 1;
        targets.hop1_rows[0] = 1;
        targets.hop2_count[0] = 0;
        targets.hop2_rows[0] = 0;
    }
    writer.finish(0x1122_3344_5566_7788, 7, 1000);
    let bytes = area.as_slice();
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    // The area up to the end of the target table (the last thing written).
    let end = (u64_at(56) + u64_at(64)) as usize;
    bytes[..end].to_vec()
}

/// A subgraph-layout response to request 0x1122334455667788 for target 5
/// at fanouts [1, 2] (two hops): 5's neighbour 9 at hop 1 (tier L3), 9's
/// neighbours 4 (new, tier L2) and 5 (the target again) at hop 2; feature
/// dim 2, graph version 7, server_ns 1000.
fn subgraph_response_vector() -> Vec<u8> {
    let mut area = MutableBuffer::from_len_zeroed(4096);
    let shape = GraphShape::subgraph(SubgraphFanouts::new(&[1, 2]).expect("two hops"), 1, 3, 3);
    let cache = SchemaCache::default();
    let mut writer = GraphWriter::new(
        area.as_slice_mut(),
        &GraphSchema::one_type(2),
        shape,
        &cache,
    )
    .expect("fits");
    {
        let mut cols = writer.columns();
        let nodes = &mut cols.nodes[0];
        nodes.node_id.copy_from_slice(&[5, 9, 4]);
        nodes
            .features
            .copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        nodes.tier.copy_from_slice(&[tier::L1, tier::L3, tier::L2]);
        for row in 0..3 {
            nodes.set_fallback(row, false);
        }
        cols.target_id[0] = 5;
        cols.status[0] = target_status::OK;
        cols.target_row[0] = 0;
        // Sources (9, 4, 5), then destinations (5, 9, 9), as rows.
        cols.edge_index[0].copy_from_slice(&[1, 2, 0, 0, 1, 1]);
        cols.sampled_nodes[0].copy_from_slice(&[1, 1, 1]);
        cols.sampled_edges[0].copy_from_slice(&[1, 2]);
    }
    writer.finish(0x1122_3344_5566_7788, 7, 1000);
    let bytes = area.as_slice();
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    // The area up to the end of the edge table (the last thing written).
    let end = (u64_at(104) + u64_at(112)) as usize;
    bytes[..end].to_vec()
}

/// The appendix's typed graph: users (2 features) and items (no
/// features); (user, buys, item) and (item, rev_buys, user).
fn typed_graph() -> GraphSchema {
    GraphSchema::of(
        &[("user", 2), ("item", 0)],
        &[(0, "buys", 1), (1, "rev_buys", 0)],
    )
}

/// The typed answer's sample: user 5 (row [1, 2], tier L1) and item 30,
/// which user 5 bought (rev_buys: 30 -> 5), at hop 1.
fn write_typed_answer(cols: &mut protocol::payload::GraphColumns<'_>) {
    cols.target_id[0] = 5;
    cols.status[0] = target_status::OK;
    cols.target_row[0] = 0;
    cols.nodes[0].node_id[0] = 5;
    cols.nodes[0].features.copy_from_slice(&[1.0, 2.0]);
    cols.nodes[0].tier[0] = tier::L1;
    cols.nodes[1].node_id[0] = 30;
    cols.edge_index[1].copy_from_slice(&[0, 0]);
    cols.sampled_nodes[0].copy_from_slice(&[1, 0]);
    cols.sampled_nodes[1].copy_from_slice(&[0, 1]);
    cols.sampled_edges[0].copy_from_slice(&[0]);
    cols.sampled_edges[1].copy_from_slice(&[1]);
}

/// A typed answer (`hops` 1) to request 0x1122334455667788 for user 5:
/// item 30 bought by user 5 (rev_buys: 30 -> 5); user rows 5 ([1, 2],
/// tier L1); item rows 30; graph version 7, server_ns 1000.
fn typed_response_vector() -> Vec<u8> {
    let mut area = MutableBuffer::from_len_zeroed(8192);
    let shape = GraphShape::typed(1, 1, vec![1, 1], vec![0, 1]);
    let cache = SchemaCache::default();
    let mut writer = GraphWriter::new(area.as_slice_mut(), &typed_graph(), shape, &cache).unwrap();
    {
        let mut cols = writer.columns();
        write_typed_answer(&mut cols);
    }
    let end = writer.finish(0x1122_3344_5566_7788, 7, 1000);
    area.as_slice()[..end].to_vec()
}

/// The typed answer above to a request that asked for edge data
/// (`EDGE_ATTR` and `EDGE_TIME`), over the graph whose
/// `item__rev_buys__user` edges carry 2 attributes and a time: the one
/// edge's attributes [0.5, -1.0] and time 1700000000.
fn edge_data_response_vector() -> Vec<u8> {
    let graph = typed_graph().with_edge_data(
        1,
        EdgeDataDesc {
            attr_dim: 2,
            weight: false,
            time: true,
        },
    );
    let asked = EdgeColumns {
        attr: true,
        weight: false,
        time: true,
    };
    let mut area = MutableBuffer::from_len_zeroed(8192);
    let shape = GraphShape::typed(1, 1, vec![1, 1], vec![0, 1]).with_edge_data(asked);
    let cache = SchemaCache::default();
    let mut writer = GraphWriter::new(area.as_slice_mut(), &graph, shape, &cache).unwrap();
    {
        let mut cols = writer.columns();
        write_typed_answer(&mut cols);
        cols.edge_attr[1].copy_from_slice(&[0.5, -1.0]);
        cols.edge_time[1].copy_from_slice(&[1_700_000_000]);
        assert!(cols.edge_attr[0].is_empty() && cols.edge_weight[1].is_empty());
    }
    let end = writer.finish(0x1122_3344_5566_7788, 7, 1000);
    let bytes = area.as_slice()[..end].to_vec();
    // What the documented reader reads back, in place.
    let mut aligned = MutableBuffer::from_len_zeroed(bytes.len());
    aligned.as_slice_mut().copy_from_slice(&bytes);
    let buffer: arrow_buffer::Buffer = aligned.into();
    let tables = protocol::payload::decode_graph_with(
        &buffer,
        &protocol::payload::DecodeLimits {
            feature_dim: 0,
            max_nodes: 16,
            max_targets: 4,
            max_fanouts: [2, 2],
        },
        &graph,
        true,
        0,
        asked,
        &cache,
    )
    .unwrap();
    assert_eq!(tables.edge_attr(1), [0.5, -1.0]);
    assert_eq!(tables.edge_time(1), [1_700_000_000]);
    assert!(tables.edge_data[0].is_none() && tables.edge_weight(1).is_empty());
    bytes
}

/// `offset: hex bytes` lines, 32 bytes each.
fn to_hex_lines(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(32).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{:04x}: {}\n", i * 32, hex.join(" ")));
    }
    out
}

/// The bytes of the fenced block that follows `marker` in the document.
fn vector_in_doc(doc: &str, marker: &str) -> Vec<u8> {
    let start = doc
        .find(marker)
        .unwrap_or_else(|| panic!("docs/protocol.md has no {marker}"));
    let block = &doc[start..];
    let open = block
        .find("```text\n")
        .expect("a ```text block after the marker")
        + 8;
    let close = open + block[open..].find("```").expect("the block is closed");
    let mut bytes = Vec::new();
    for line in block[open..close].lines() {
        let (offset, hex) = line.split_once(':').expect("offset: bytes");
        assert_eq!(
            usize::from_str_radix(offset.trim(), 16).expect("hex offset"),
            bytes.len(),
            "offsets run on without gaps"
        );
        for byte in hex.split_whitespace() {
            bytes.push(u8::from_str_radix(byte, 16).expect("a hex byte"));
        }
    }
    bytes
}

fn doc() -> String {
    // Cargo's run-time value first: a binary reused from a shared target
    // directory may have been compiled in another checkout.
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    );
    let path = crate_dir.join("../docs/protocol.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_documented_header_vector_is_what_the_sidecar_writes() {
    let ours = header_vector();
    if std::env::var_os("GNN_PRINT_VECTORS").is_some() {
        println!("header vector:\n{}", to_hex_lines(&ours));
    }
    let documented = vector_in_doc(&doc(), "<!-- vector: header -->");
    assert_eq!(
        to_hex_lines(&documented),
        to_hex_lines(&ours),
        "docs/protocol.md appendix A (header) differs from the implementation"
    );
}

#[test]
fn the_documented_response_vector_is_what_the_sidecar_writes() {
    let ours = response_vector();
    if std::env::var_os("GNN_PRINT_VECTORS").is_some() {
        println!("response vector:\n{}", to_hex_lines(&ours));
    }
    let documented = vector_in_doc(&doc(), "<!-- vector: response -->");
    assert_eq!(
        to_hex_lines(&documented),
        to_hex_lines(&ours),
        "docs/protocol.md appendix A (response) differs from the implementation"
    );
}

#[test]
fn the_documented_subgraph_response_vector_is_what_the_sidecar_writes() {
    let ours = subgraph_response_vector();
    if std::env::var_os("GNN_PRINT_VECTORS").is_some() {
        println!("subgraph response vector:\n{}", to_hex_lines(&ours));
    }
    let documented = vector_in_doc(&doc(), "<!-- vector: subgraph-response -->");
    assert_eq!(
        to_hex_lines(&documented),
        to_hex_lines(&ours),
        "docs/protocol.md appendix A (subgraph response) differs from the implementation"
    );
}

#[test]
fn the_documented_graph_schema_vector_is_what_the_sidecar_writes() {
    let ours = typed_graph().encode();
    if std::env::var_os("GNN_PRINT_VECTORS").is_some() {
        println!("graph schema vector:\n{}", to_hex_lines(&ours));
    }
    let documented = vector_in_doc(&doc(), "<!-- vector: graph-schema -->");
    assert_eq!(
        to_hex_lines(&documented),
        to_hex_lines(&ours),
        "docs/protocol.md appendix A (graph schema) differs from the implementation"
    );
}

#[test]
fn the_documented_typed_response_vector_is_what_the_sidecar_writes() {
    let ours = typed_response_vector();
    if std::env::var_os("GNN_PRINT_VECTORS").is_some() {
        println!("typed response vector:\n{}", to_hex_lines(&ours));
    }
    let documented = vector_in_doc(&doc(), "<!-- vector: typed-response -->");
    assert_eq!(
        to_hex_lines(&documented),
        to_hex_lines(&ours),
        "docs/protocol.md appendix A (typed response) differs from the implementation"
    );
}

#[test]
fn the_documented_edge_data_response_vector_is_what_the_sidecar_writes() {
    let ours = edge_data_response_vector();
    if std::env::var_os("GNN_PRINT_VECTORS").is_some() {
        println!("edge data response vector:\n{}", to_hex_lines(&ours));
    }
    let documented = vector_in_doc(&doc(), "<!-- vector: edge-data-response -->");
    assert_eq!(
        to_hex_lines(&documented),
        to_hex_lines(&ours),
        "docs/protocol.md appendix A (edge data response) differs from the implementation"
    );
}
