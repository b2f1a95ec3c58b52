//! Arbitrary bytes where the other process writes: in the header, in a
//! request, in a response. Attach and decode must return errors (or valid
//! values), never panic, never index out of bounds.
#![cfg(not(loom))]

use std::sync::OnceLock;

use arrow_buffer::{Buffer, MutableBuffer};
use proptest::prelude::*;
use protocol::layout::{dtype, FeatureSchema, Geometry, Header};
use protocol::payload::{self, DecodeLimits, PayloadShape, ResponseWriter, SchemaCache};
use protocol::request;
use protocol::{Segment, SegmentConfig};

fn schema() -> FeatureSchema {
    FeatureSchema {
        feature_dim: 4,
        dtype: dtype::F32,
        graph_version: 1,
        default_fanouts: [3, 2],
    }
}

fn config(name: &str) -> SegmentConfig {
    let mut cfg = SegmentConfig::new(name, schema());
    cfg.slot_count = 2;
    cfg.max_targets = 4;
    cfg.response_bytes = 16 * 1024;
    cfg
}

/// The bytes of a freshly created valid segment (created once).
fn valid_segment_bytes() -> &'static Vec<u8> {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let name = format!("gnn-hostile-src-{}", std::process::id());
        let segment = Segment::create(&config(&name)).unwrap();
        let bytes = std::fs::read(format!("/dev/shm/{name}")).unwrap();
        segment.unlink().unwrap();
        bytes
    })
}

/// Writes `bytes` as /dev/shm/<name> and attaches to it.
fn attach_bytes(bytes: &[u8], tag: u64) -> Result<Segment, protocol::AttachError> {
    let name = format!("gnn-hostile-{}-{tag}", std::process::id());
    let path = format!("/dev/shm/{name}");
    std::fs::write(&path, bytes).unwrap();
    let result = Segment::attach(&name);
    std::fs::remove_file(&path).unwrap();
    result
}

/// `bytes` decoded as a request to a one-type graph's segment of
/// [`schema`] and `geometry`.
fn decode(bytes: &[u8], geometry: &Geometry) -> Result<request::Request, request::RequestError> {
    let schema = schema();
    let graph = protocol::graph_schema::GraphSchema::one_type(schema.feature_dim);
    request::decode(
        bytes,
        request::Decoding {
            geometry,
            schema: &schema,
            graph: &graph,
            typed: false,
        },
    )
}

fn check_attached(segment: &Segment) {
    // Whatever was accepted must describe slots inside the mapping.
    let g: &Geometry = segment.geometry();
    let end = g.slot_data_offset + g.slot_stride * u64::from(g.slot_count);
    assert!(end <= segment.len() as u64);
    for slot in segment.slots() {
        let _ = slot.load();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn corrupted_headers_are_refused_or_valid(
        edits in prop::collection::vec((0usize..std::mem::size_of::<Header>(), any::<u8>()), 1..8),
        tag in any::<u64>(),
    ) {
        let mut bytes = valid_segment_bytes().clone();
        for (offset, value) in edits {
            bytes[offset] = value;
        }
        if let Ok(segment) = attach_bytes(&bytes, tag) {
            check_attached(&segment);
        }
    }

    #[test]
    fn random_files_are_refused(
        bytes in prop::collection::vec(any::<u8>(), 0..8192),
        tag in any::<u64>(),
    ) {
        prop_assert!(attach_bytes(&bytes, tag).is_err());
    }

    #[test]
    fn random_request_areas_decode_to_errors_or_bounded_requests(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let segment_bytes = valid_segment_bytes();
        let geometry: Geometry = bytemuck_geometry(segment_bytes);
        if let Ok(req) = decode(&bytes, &geometry) {
            prop_assert!(req.targets.len() <= geometry.max_targets as usize);
            match &req.graph {
                None => prop_assert!(req.fanouts.iter().zip(geometry.max_fanouts).all(|(f, cap)| *f >= 1 && *f <= cap)),
                Some(ask) => prop_assert!(ask.fanouts.iter().all(|f| *f <= geometry.max_fanouts[0].max(geometry.max_fanouts[1]))),
            }
        }
    }

    #[test]
    fn random_response_areas_decode_to_errors(
        bytes in prop::collection::vec(any::<u8>(), 0..4096),
    ) {
        let mut area = MutableBuffer::from_len_zeroed(bytes.len());
        area.as_slice_mut().copy_from_slice(&bytes);
        // Random bytes are never a valid response (the framing, the
        // flatbuffers and the schemas would all have to hold by chance):
        // decoding must refuse them, without panicking.
        let decoded = payload::decode(&area.into(), &limits(), &SchemaCache::default());
        prop_assert!(decoded.is_err(), "random bytes decoded as a response");
    }

    #[test]
    fn a_zeroed_response_area_is_refused(len in 0usize..4096) {
        let area = MutableBuffer::from_len_zeroed(len);
        prop_assert!(payload::decode(&area.into(), &limits(), &SchemaCache::default()).is_err());
    }

    #[test]
    fn corrupted_valid_responses_decode_to_errors_or_valid_tables(
        edits in prop::collection::vec((0usize..4096, any::<u8>()), 1..6),
    ) {
        let mut area = valid_response();
        let len = area.len();
        for (offset, value) in edits {
            area.as_slice_mut()[offset % len] = value;
        }
        let buffer: Buffer = area.into();
        if let Ok(tables) = payload::decode(&buffer, &limits(), &SchemaCache::default()) {
            // Accepted tables are internally consistent: indices in range.
            let n = tables.n_nodes() as i32;
            prop_assert!(tables.hop2_rows().iter().all(|&r| r >= 0 && r < n));
            prop_assert_eq!(tables.features().len(), tables.n_nodes() * 4);
        }
    }
}

fn limits() -> DecodeLimits {
    DecodeLimits {
        feature_dim: 4,
        max_nodes: 1_000,
        max_targets: 4,
        max_fanouts: [50, 50],
    }
}

fn valid_response() -> MutableBuffer {
    let mut area = MutableBuffer::from_len_zeroed(8192);
    let shape = PayloadShape {
        n_targets: 1,
        n_nodes: 3,
        feature_dim: 4,
        fanouts: [2, 1],
    };
    let cache = SchemaCache::default();
    let mut writer = ResponseWriter::new(area.as_slice_mut(), shape, &cache).unwrap();
    {
        let (nodes, targets) = writer.columns();
        nodes.node_id.copy_from_slice(&[1, 2, 3]);
        targets.target_row[0] = 0;
        targets.hop1_count[0] = 2;
        targets.hop1_rows.copy_from_slice(&[1, 2]);
        targets.hop2_count.copy_from_slice(&[1, 0]);
        targets.hop2_rows.copy_from_slice(&[2, 0]);
    }
    writer.finish(1, 1, 0);
    area
}

/// The geometry stored in a segment's header bytes.
fn bytemuck_geometry(bytes: &[u8]) -> Geometry {
    let offset = std::mem::offset_of!(Header, geometry);
    let raw = &bytes[offset..offset + std::mem::size_of::<Geometry>()];
    let word = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().unwrap());
    let dword = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().unwrap());
    Geometry {
        slot_count: word(0),
        max_targets: word(4),
        max_fanouts: [word(8), word(12)],
        max_nodes: word(16),
        _pad: 0,
        slot_control_offset: dword(24),
        slot_data_offset: dword(32),
        slot_stride: dword(40),
        request_bytes: dword(48),
        response_bytes: dword(56),
    }
}

/// Inputs the `response_area` fuzz target found (scripts/fuzz.sh). Each is
/// refused by the framing check, before arrow-rs sees it, not by the panic
/// guard around the Arrow decoder (which a panic hook that aborts, as the
/// fuzzer's, would defeat).
#[test]
fn fuzzer_found_responses_are_refused_by_the_framing() {
    let found: &[(&str, &[u8])] = &[
        (
            "a row count whose FixedSizeList size overflows",
            include_bytes!("regressions/response_fixed_size_list_overflow.bin"),
        ),
        (
            "a record batch body that is not 8-byte aligned",
            include_bytes!("regressions/response_misaligned_body.bin"),
        ),
        (
            "a subgraph edge table whose list offsets buffer is not whole i32 values",
            include_bytes!("regressions/response_list_offsets_short.bin"),
        ),
    ];
    for (what, bytes) in found {
        let mut area = MutableBuffer::from_len_zeroed(bytes.len());
        area.as_slice_mut().copy_from_slice(bytes);
        let limits = DecodeLimits {
            feature_dim: 2,
            ..limits()
        };
        let err = payload::decode(&area.into(), &limits, &SchemaCache::default())
            .expect_err(what)
            .to_string();
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

/// The one defined request flag is read; any other bit is refused, naming
/// the flags (docs/protocol.md, "Request area").
#[test]
fn the_own_rows_flag_is_read_and_other_bits_are_refused() {
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let mut area = vec![0u8; 136];
    area[0..8].copy_from_slice(&7u64.to_le_bytes());
    area[16..20].copy_from_slice(&1u32.to_le_bytes());
    area[128..136].copy_from_slice(&42u64.to_le_bytes());
    let with_flags = |flags: u32| {
        let mut area = area.clone();
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        decode(&area, &geometry)
    };
    let plain = with_flags(0).unwrap();
    assert!(!plain.own_rows_only);
    let own = with_flags(protocol::layout::request_flags::OWN_ROWS_ONLY).unwrap();
    assert!(own.own_rows_only);
    assert_eq!((own.request_id, own.targets.as_slice()), (7, &[42u64][..]));
    let err = with_flags(1 << 11).unwrap_err();
    assert_eq!(err, request::RequestError::UnknownFlags { flags: 1 << 11 });
    assert!(err.to_string().contains("0x800"), "{err}");
    // Temporal sampling (0x200, 0x400) is the graph layout's, and 'last'
    // goes with seed times.
    let err = with_flags(0x200).unwrap_err().to_string();
    assert!(err.contains("which the graph layout alone does"), "{err}");
    let err = with_flags(0x400).unwrap_err().to_string();
    assert!(err.contains("set it with SEED_TIME (0x200)"), "{err}");
    // The edge data flags (0x40, 0x80, 0x100) are the graph layout's.
    for flags in [0x40, 0x80, 0x100, 0x1c0] {
        let err = with_flags(flags).unwrap_err();
        assert_eq!(err, request::RequestError::GraphOnly { flags });
        assert!(err.to_string().contains("graph layout alone"), "{err}");
    }
    // NEW_NODE_DIRECTED (0x4) and TYPED (0x20) were retired in layout
    // version 4: refused naming what replaced them.
    for retired in [0x4, 0x20] {
        let err = with_flags(retired).unwrap_err();
        assert_eq!(err, request::RequestError::RetiredFlags { flags: retired });
        assert!(err.to_string().contains("layout version 4"), "{err}");
    }
}

/// `FRESH_SINCE`: the clock, tick and fanouts at 40..64 are read with the
/// flag and refused without it; fanouts outside the caps are refused.
#[test]
fn the_fresh_since_fields_are_read_with_their_flag_only() {
    use protocol::layout::request_flags::FRESH_SINCE;
    use request::RequestError;
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let area = |flags: u32, clock: u64, tick: u64, fanouts: [u32; 2]| {
        let mut area = vec![0u8; 136];
        area[16..20].copy_from_slice(&1u32.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[40..48].copy_from_slice(&clock.to_le_bytes());
        area[48..56].copy_from_slice(&tick.to_le_bytes());
        area[56..60].copy_from_slice(&fanouts[0].to_le_bytes());
        area[60..64].copy_from_slice(&fanouts[1].to_le_bytes());
        area[128..136].copy_from_slice(&3u64.to_le_bytes());
        area
    };
    let decode = |bytes: &[u8]| decode(bytes, &geometry);
    let caps = geometry.max_fanouts;
    let got = decode(&area(FRESH_SINCE, 0xabc, 17, caps)).unwrap();
    assert_eq!(got.fresh, Some(request::FreshSince::dense(0xabc, 17, caps)));
    assert_eq!(decode(&area(0, 0, 0, [0, 0])).unwrap().fresh, None);
    assert_eq!(
        decode(&area(0, 0, 5, [0, 0])).unwrap_err(),
        RequestError::FreshWithoutFlag
    );
    for bad in [[0, 1], [1, 0], [caps[0] + 1, 1]] {
        let err = decode(&area(FRESH_SINCE, 1, 1, bad)).unwrap_err();
        assert!(matches!(err, RequestError::FreshFanouts { .. }), "{err}");
    }
}

/// `HUB_H1`: `hub_min_degree` at 36 and the clock fields at 40..64 are
/// read with the flag, alone or beside `FRESH_SINCE`; a degree without
/// the flag, or 0 with it, is refused by name.
#[test]
fn the_hub_fields_are_read_with_their_flag_only() {
    use protocol::layout::request_flags::{FRESH_SINCE, HUB_H1};
    use request::RequestError;
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let caps = geometry.max_fanouts;
    let area = |flags: u32, degree: u32, tick: u64| {
        let mut area = vec![0u8; 136];
        area[16..20].copy_from_slice(&1u32.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[36..40].copy_from_slice(&degree.to_le_bytes());
        area[40..48].copy_from_slice(&0xabcu64.to_le_bytes());
        area[48..56].copy_from_slice(&tick.to_le_bytes());
        area[56..60].copy_from_slice(&caps[0].to_le_bytes());
        area[60..64].copy_from_slice(&caps[1].to_le_bytes());
        area[128..136].copy_from_slice(&3u64.to_le_bytes());
        area
    };
    let decode = |bytes: &[u8]| decode(bytes, &geometry);
    let since = request::FreshSince::dense(0xabc, 9, caps);
    let hub = decode(&area(HUB_H1, 20, 9)).unwrap();
    assert_eq!(
        hub.hub_h1,
        Some(request::HubH1 {
            since,
            min_degree: 20
        })
    );
    assert_eq!(hub.fresh, None, "HUB_H1 alone asks for no FRESH target");
    let both = decode(&area(HUB_H1 | FRESH_SINCE, 5, 9)).unwrap();
    assert_eq!(
        (both.fresh, both.hub_h1.map(|h| h.since)),
        (Some(since), Some(since))
    );
    let mut degree_alone = area(0, 20, 0);
    degree_alone[40..64].fill(0);
    let err = decode(&degree_alone).unwrap_err();
    assert_eq!(err, RequestError::HubDegreeWithoutFlag { degree: 20 });
    assert!(err.to_string().contains("HUB_H1"), "{err}");
    let err = decode(&area(HUB_H1, 0, 9)).unwrap_err();
    assert_eq!(err, RequestError::HubDegreeZero);
    assert!(err.to_string().contains("hub_min_degree 0"), "{err}");
}

/// `NEW_NODE`: the row, the edge counts and the edges after the one target
/// id (and a graph-layout request's fanouts) are read as docs/protocol.md
/// lays them out; every way of getting them wrong is refused by name, never
/// read past the area.
#[test]
fn a_new_node_is_read_after_its_id_and_bad_ones_are_refused() {
    use protocol::layout::request_flags::NEW_NODE;
    use request::RequestError;
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let dim = schema().feature_dim;
    let (row_at, counts_at, edges_at) = request::new_node_offsets(0, dim, 1).unwrap();
    assert_eq!(
        (row_at, counts_at, edges_at),
        (136, 152, 160),
        "docs/protocol.md's offsets"
    );
    assert_eq!(
        request::new_node_offsets(2, dim, 1).unwrap(),
        (144, 160, 168),
        "after two fanouts"
    );
    let max = (geometry.request_bytes - 160) / 16;
    assert!(max >= 1024, "sized for the default max_new_node_edges");
    let area = |flags: u32, n_targets: u32, edges: u32, row: [f32; 4], pairs: &[(u64, u64)]| {
        let mut area = vec![0u8; geometry.request_bytes as usize];
        area[0..8].copy_from_slice(&9u64.to_le_bytes());
        area[16..20].copy_from_slice(&n_targets.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[32..36].copy_from_slice(&edges.to_le_bytes());
        area[128..136].copy_from_slice(&5000u64.to_le_bytes());
        for (i, v) in row.iter().enumerate() {
            area[136 + 4 * i..140 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        area[152..156].copy_from_slice(&(pairs.len() as u32).to_le_bytes());
        for (i, (src, dst)) in pairs.iter().enumerate() {
            area[160 + 16 * i..168 + 16 * i].copy_from_slice(&src.to_le_bytes());
            area[168 + 16 * i..176 + 16 * i].copy_from_slice(&dst.to_le_bytes());
        }
        area
    };
    let decode = |bytes: &[u8]| decode(bytes, &geometry);
    let row = [1.0, -2.5, 0.0, 3.25];
    let pairs = [(5000, 4), (7, 5000), (5000, 11)];
    let got = decode(&area(NEW_NODE, 1, 3, row, &pairs)).unwrap();
    assert_eq!(got.targets, vec![5000]);
    let node = got.new_node.expect("the new node");
    assert_eq!(node.features, row.to_vec());
    assert_eq!(node.edges, vec![pairs.to_vec()]);
    // A one-type new node's neighbours: each a source of the new node's
    // messages, and unless directed the new node one of theirs.
    assert_eq!(
        request::NewNode::one_type(5000, row.to_vec(), &[4, 11], false).edges,
        vec![vec![(4, 5000), (11, 5000), (5000, 4), (5000, 11)]]
    );
    assert_eq!(
        request::NewNode::one_type(5000, row.to_vec(), &[4], true).edges,
        vec![vec![(4, 5000)]]
    );
    assert!(decode(&area(0, 1, 0, row, &[])).unwrap().new_node.is_none());
    // What the sidecar copies out of the slot covers exactly this much.
    let bytes = area(NEW_NODE, 1, 3, row, &pairs);
    let schema = schema();
    let graph = protocol::graph_schema::GraphSchema::one_type(schema.feature_dim);
    let on = request::Decoding {
        geometry: &geometry,
        schema: &schema,
        graph: &graph,
        typed: false,
    };
    assert_eq!(request::occupied_bytes(&bytes, on), 160 + 48);

    assert_eq!(
        decode(&area(NEW_NODE, 2, 0, row, &[])).unwrap_err(),
        RequestError::NewNodeTargets { n_targets: 2 }
    );
    let too_many = (max + 1) as u32;
    let err = decode(&area(NEW_NODE, 1, too_many, row, &[])).unwrap_err();
    assert!(err.to_string().contains("add up to 0"), "{err}");
    let mut counted = area(NEW_NODE, 1, too_many, row, &[]);
    counted[152..156].copy_from_slice(&too_many.to_le_bytes());
    let err = decode(&counted).unwrap_err();
    assert!(err.to_string().contains("max_new_node_edges"), "{err}");
    counted[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
    counted[152..156].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode(&counted).unwrap_err(),
        RequestError::Graph(_)
    ));
    // An edge without the new node at an end is refused by name.
    let err = decode(&area(NEW_NODE, 1, 1, row, &[(4, 7)])).unwrap_err();
    assert!(err.to_string().contains("edge (4, 7)"), "{err}");
    // An area cut short (a hostile peer's geometry) is refused, not indexed.
    let short = area(NEW_NODE, 1, 3, row, &pairs);
    assert!(decode(&short[..170]).is_err());
    let err = decode(&area(NEW_NODE, 1, 0, [1.0, f32::NAN, 0.0, 0.0], &[])).unwrap_err();
    assert!(
        err.to_string()
            .contains("feature 1 is NaN: every feature must be a finite number"),
        "{err}"
    );
    assert_eq!(
        decode(&area(0, 1, 2, row, &[])).unwrap_err(),
        RequestError::EdgesWithoutNewNode { edges: 2 }
    );
}

/// The graph layout's fields: `hops` at 64 and a fanout per edge type and
/// hop after the target ids (here one edge type) are read; more than three
/// hops, fanouts in the header, a dense-only flag with hops, a fanout above
/// its cap, a target type in the dense layout and non-zero reserved bytes
/// (68..80, 112..128) are refused by name.
#[test]
fn the_graph_fields_are_read_and_bad_ones_are_refused() {
    use protocol::layout::request_flags::{HUB_H1, NEW_NODE, OWN_ROWS_ONLY};
    use request::{GraphAsk, RequestError};
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let caps = geometry.max_fanouts;
    let area = |hops: u32, fanouts: &[u32], flags: u32| {
        let mut area = vec![0u8; 136 + 4 * fanouts.len()];
        area[16..20].copy_from_slice(&1u32.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[64..68].copy_from_slice(&hops.to_le_bytes());
        area[128..136].copy_from_slice(&3u64.to_le_bytes());
        for (i, f) in fanouts.iter().enumerate() {
            area[136 + 4 * i..140 + 4 * i].copy_from_slice(&f.to_le_bytes());
        }
        area
    };
    let decode = |bytes: &[u8]| decode(bytes, &geometry);
    let dense = decode(&area(0, &[], 0)).unwrap();
    assert_eq!(dense.graph, None);
    let three = decode(&area(3, &[2, 1, 1], 0)).unwrap();
    assert_eq!(three.graph, Some(GraphAsk::one_type(&[2, 1, 1])));
    assert_eq!(three.fanouts, [0, 0], "the dense fanouts are not used");
    let one = decode(&area(1, &[2], 0)).unwrap();
    assert_eq!(one.graph.unwrap().one_type_fanouts().unwrap().hops(), 1);
    assert_eq!(
        decode(&area(4, &[1, 1, 1, 1], 0)).unwrap_err(),
        RequestError::Hops { hops: 4 }
    );
    let mut in_header = area(2, &[1, 1], 0);
    in_header[20..24].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        decode(&in_header).unwrap_err(),
        RequestError::GraphFanoutFields
    );
    let err = decode(&area(3, &[1, 1, caps[1] + 1], 0)).unwrap_err();
    assert!(
        err.to_string().contains("at hop 3 exceeds the cap"),
        "{err}"
    );
    // The fanouts cut off by the area's end are refused, not read.
    assert!(matches!(
        decode(&area(3, &[1, 1, 1], 0)[..140]).unwrap_err(),
        RequestError::Graph(_)
    ));
    for flag in [OWN_ROWS_ONLY, HUB_H1] {
        let err = decode(&area(2, &[1, 1], flag)).unwrap_err();
        assert!(
            matches!(err, RequestError::NotForGraph { .. }),
            "flag {flag:#x}: {err}"
        );
        assert!(err.to_string().contains("dense layout only"), "{err}");
    }
    // A new node is sampled in either layout.
    let mut new_node = area(2, &[1, 1], NEW_NODE);
    new_node.resize(geometry.request_bytes as usize, 0);
    assert!(decode(&new_node).unwrap().new_node.is_some());
    for at in [68, 76, 120] {
        let mut reserved = area(2, &[1, 1], 0);
        reserved[at] = 1;
        assert_eq!(decode(&reserved).unwrap_err(), RequestError::Reserved);
    }
    let mut fresh_hops = area(2, &[1, 1], 0);
    fresh_hops[72] = 1;
    assert_eq!(
        decode(&fresh_hops).unwrap_err(),
        RequestError::FreshHopsWithoutGraphFresh { fresh_hops: 1 }
    );
    // Bytes 108..112 are a graph-layout request's target type.
    let mut target_type = area(0, &[], 0);
    target_type[108] = 1;
    assert_eq!(
        decode(&target_type).unwrap_err(),
        RequestError::TargetTypeForDense { target_type: 1 }
    );
    let mut target_type = area(2, &[1, 1], 0);
    target_type[108] = 1;
    assert!(decode(&target_type)
        .unwrap_err()
        .to_string()
        .contains("target type 1 is not a node type"));
    // Bytes 80..108 are the trace context (docs/protocol.md, "Trace
    // context"): read when both ids are set, never refused.
    let mut traced = area(2, &[1, 1], 0);
    traced[80..96].copy_from_slice(&[0xab; 16]);
    traced[96..104].copy_from_slice(&[0xcd; 8]);
    traced[104] = 0xff;
    let trace = decode(&traced).unwrap().trace.unwrap();
    assert_eq!(
        (trace.trace_id, trace.parent, trace.sampled),
        ([0xab; 16], [0xcd; 8], true)
    );
    traced[96..104].copy_from_slice(&[0; 8]);
    assert_eq!(
        decode(&traced).unwrap().trace,
        None,
        "a zero span id is no context"
    );
}

/// `FRESH_SINCE` in the graph layout: the stored answers were computed at
/// the request's own hops and fanouts, so the clock and tick alone are
/// read; `fresh_fanouts` is refused by name, and the fields without the
/// flag.
#[test]
fn a_graph_fresh_since_is_at_the_requests_own_fanouts() {
    use protocol::layout::request_flags::FRESH_SINCE;
    use request::{FreshSince, RequestError};
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let area = |flags: u32, fresh: [u32; 2]| {
        let mut area = vec![0u8; 144];
        area[16..20].copy_from_slice(&1u32.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[40..48].copy_from_slice(&0xabcu64.to_le_bytes());
        area[48..56].copy_from_slice(&5u64.to_le_bytes());
        area[56..60].copy_from_slice(&fresh[0].to_le_bytes());
        area[60..64].copy_from_slice(&fresh[1].to_le_bytes());
        area[64..68].copy_from_slice(&2u32.to_le_bytes());
        area[128..136].copy_from_slice(&3u64.to_le_bytes());
        area[136..140].copy_from_slice(&2u32.to_le_bytes());
        area[140..144].copy_from_slice(&1u32.to_le_bytes());
        area
    };
    let decode = |bytes: &[u8]| decode(bytes, &geometry);
    let got = decode(&area(FRESH_SINCE, [0, 0])).unwrap();
    assert_eq!(got.fresh, Some(FreshSince::graph(0xabc, 5)));
    let err = decode(&area(FRESH_SINCE, [2, 1])).unwrap_err();
    assert_eq!(err, RequestError::GraphFreshFanouts);
    assert!(err.to_string().contains("own hops and fanouts"), "{err}");
    assert_eq!(
        decode(&area(0, [0, 0])).unwrap_err(),
        RequestError::FreshWithoutFlag
    );
    // fresh_hops (byte 72): answers computed at other hops and fanouts,
    // which follow the request's own (here 3 hops at [5, 4, 3]).
    let mut deeper = area(FRESH_SINCE, [0, 0]);
    deeper[72..76].copy_from_slice(&3u32.to_le_bytes());
    for f in [5u32, 4, 3] {
        deeper.extend_from_slice(&f.to_le_bytes());
    }
    let got = decode(&deeper).unwrap();
    assert_eq!(got.fresh_at, Some(request::GraphAsk::one_type(&[5, 4, 3])));
    assert_eq!(got.graph, Some(request::GraphAsk::one_type(&[2, 1])));
    assert!(decode(&deeper[..150]).is_err(), "fanouts cut short");
    let mut unflagged = deeper.clone();
    unflagged[28..32].fill(0);
    unflagged[40..56].fill(0);
    assert_eq!(
        decode(&unflagged).unwrap_err(),
        RequestError::FreshHopsWithoutGraphFresh { fresh_hops: 3 }
    );
}
