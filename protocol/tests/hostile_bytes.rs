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
        if let Ok(req) = request::decode(&bytes, &geometry, &schema(), None) {
            prop_assert!(req.targets.len() <= geometry.max_targets as usize);
            prop_assert!(req.fanouts.iter().zip(geometry.max_fanouts).all(|(f, cap)| *f >= 1 && *f <= cap));
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
        request::decode(&area, &geometry, &schema(), None)
    };
    let plain = with_flags(0).unwrap();
    assert!(!plain.own_rows_only);
    let own = with_flags(protocol::layout::request_flags::OWN_ROWS_ONLY).unwrap();
    assert!(own.own_rows_only);
    assert_eq!((own.request_id, own.targets.as_slice()), (7, &[42u64][..]));
    let err = with_flags(64).unwrap_err();
    assert_eq!(err, request::RequestError::UnknownFlags { flags: 64 });
    assert!(err.to_string().contains("0x40"), "{err}");
    // TYPED (0x20) is for a typed graph's segment.
    let err = with_flags(protocol::layout::request_flags::TYPED).unwrap_err();
    assert_eq!(err, request::RequestError::TypedForOneTypeGraph);
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
    let decode = |bytes: &[u8]| request::decode(bytes, &geometry, &schema(), None);
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
    let decode = |bytes: &[u8]| request::decode(bytes, &geometry, &schema(), None);
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

/// `NEW_NODE`: the row and the edges after the one target id are read as
/// docs/protocol.md lays them out; every way of getting them wrong is
/// refused by name, never read past the area.
#[test]
fn a_new_node_is_read_after_its_id_and_bad_ones_are_refused() {
    use protocol::layout::request_flags::{NEW_NODE, NEW_NODE_DIRECTED};
    use request::RequestError;
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let dim = schema().feature_dim;
    let (row_at, edges_at) = request::new_node_offsets(dim).unwrap();
    assert_eq!((row_at, edges_at), (136, 152), "docs/protocol.md's offsets");
    let max = request::max_new_node_edges(&geometry, &schema());
    assert_eq!(max, (geometry.request_bytes - 152) / 8);
    assert!(max >= 1024, "sized for the default max_new_node_edges");
    let area = |flags: u32, n_targets: u32, edges: u32, row: [f32; 4], ids: &[u64]| {
        let mut area = vec![0u8; geometry.request_bytes as usize];
        area[0..8].copy_from_slice(&9u64.to_le_bytes());
        area[16..20].copy_from_slice(&n_targets.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[32..36].copy_from_slice(&edges.to_le_bytes());
        area[128..136].copy_from_slice(&5000u64.to_le_bytes());
        for (i, v) in row.iter().enumerate() {
            area[136 + 4 * i..140 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        for (i, id) in ids.iter().enumerate() {
            area[152 + 8 * i..160 + 8 * i].copy_from_slice(&id.to_le_bytes());
        }
        area
    };
    let decode = |bytes: &[u8]| request::decode(bytes, &geometry, &schema(), None);
    let row = [1.0, -2.5, 0.0, 3.25];
    let got = decode(&area(NEW_NODE | NEW_NODE_DIRECTED, 1, 3, row, &[4, 7, 11])).unwrap();
    assert_eq!(got.targets, vec![5000]);
    let node = got.new_node.expect("the new node");
    assert_eq!(node.features, row.to_vec());
    assert_eq!(node.neighbors, vec![4, 7, 11]);
    assert!(node.directed);
    assert!(
        !decode(&area(NEW_NODE, 1, 0, row, &[]))
            .unwrap()
            .new_node
            .unwrap()
            .directed
    );
    assert!(decode(&area(0, 1, 0, row, &[])).unwrap().new_node.is_none());
    // What the sidecar copies out of the slot covers exactly this much.
    let bytes = area(NEW_NODE, 1, 3, row, &[4, 7, 11]);
    assert_eq!(
        request::occupied_bytes(&bytes, &geometry, &schema(), None),
        152 + 24
    );

    assert_eq!(
        decode(&area(NEW_NODE, 2, 0, row, &[])).unwrap_err(),
        RequestError::NewNodeTargets { n_targets: 2 }
    );
    let too_many = (max + 1) as u32;
    let err = decode(&area(NEW_NODE, 1, too_many, row, &[])).unwrap_err();
    assert!(err.to_string().contains("max_new_node_edges"), "{err}");
    assert!(matches!(
        decode(&area(NEW_NODE, 1, u32::MAX, row, &[])).unwrap_err(),
        RequestError::NewNodeTooManyEdges { .. }
    ));
    // An area cut short (a hostile peer's geometry) is refused, not indexed.
    let short = area(NEW_NODE, 1, 3, row, &[4, 7, 11]);
    assert!(decode(&short[..160]).is_err());
    let err = decode(&area(NEW_NODE, 1, 0, [1.0, f32::NAN, 0.0, 0.0], &[])).unwrap_err();
    assert_eq!(
        err,
        RequestError::NewNodeFeatureNotFinite {
            index: 1,
            value: "NaN".into()
        }
    );
    assert_eq!(
        decode(&area(0, 1, 2, row, &[])).unwrap_err(),
        RequestError::EdgesWithoutNewNode { edges: 2 }
    );
    assert_eq!(
        decode(&area(NEW_NODE_DIRECTED, 1, 0, row, &[])).unwrap_err(),
        RequestError::DirectedWithoutNewNode
    );
}

/// The subgraph layout's fields: `hops` at 64 and `fanout3` at 68 are read
/// (hop 3 capped as hop 2, 0 meaning hop 2's default); more than three
/// hops, a third fanout without a third hop, a dense-only flag with hops,
/// and non-zero reserved bytes (80..128) are refused by name.
#[test]
fn the_subgraph_fields_are_read_and_bad_ones_are_refused() {
    use protocol::layout::request_flags::{HUB_H1, NEW_NODE, OWN_ROWS_ONLY};
    use request::RequestError;
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let caps = geometry.max_fanouts;
    let area = |hops: u32, fanouts: [u32; 3], flags: u32| {
        let mut area = vec![0u8; 136];
        area[16..20].copy_from_slice(&1u32.to_le_bytes());
        area[20..24].copy_from_slice(&fanouts[0].to_le_bytes());
        area[24..28].copy_from_slice(&fanouts[1].to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[64..68].copy_from_slice(&hops.to_le_bytes());
        area[68..72].copy_from_slice(&fanouts[2].to_le_bytes());
        area[128..136].copy_from_slice(&3u64.to_le_bytes());
        area
    };
    let decode = |bytes: &[u8]| request::decode(bytes, &geometry, &schema(), None);
    let dense = decode(&area(0, [2, 1, 0], 0)).unwrap();
    assert_eq!(dense.subgraph(), None);
    let three = decode(&area(3, [2, 1, 1], 0)).unwrap();
    assert_eq!(three.subgraph().unwrap().as_slice(), &[2, 1, 1]);
    let one = decode(&area(1, [2, 0, 0], 0)).unwrap();
    assert_eq!(one.subgraph().unwrap().hops(), 1);
    // Hop 3 left at 0 takes the segment's default hop-2 fanout.
    let defaulted = decode(&area(3, [2, 1, 0], 0)).unwrap();
    assert!(defaulted.fanout3_defaulted);
    assert_eq!(defaulted.fanout3, schema().default_fanouts[1]);
    assert_eq!(
        decode(&area(4, [1, 1, 1], 0)).unwrap_err(),
        RequestError::SubgraphHops { hops: 4 }
    );
    assert_eq!(
        decode(&area(2, [1, 1, 1], 0)).unwrap_err(),
        RequestError::Fanout3WithoutThirdHop {
            fanout3: 1,
            hops: 2
        }
    );
    let err = decode(&area(3, [1, 1, caps[1] + 1], 0)).unwrap_err();
    assert!(
        matches!(err, RequestError::FanoutAboveCap { hop: 3, .. }),
        "{err}"
    );
    for flag in [OWN_ROWS_ONLY, HUB_H1] {
        let err = decode(&area(2, [1, 1, 0], flag)).unwrap_err();
        assert!(
            matches!(err, RequestError::NotForSubgraph { .. }),
            "flag {flag:#x}: {err}"
        );
        assert!(err.to_string().contains("dense layout only"), "{err}");
    }
    // A new node is sampled in either layout.
    let mut new_node = area(2, [1, 1, 0], NEW_NODE);
    new_node.resize(geometry.request_bytes as usize, 0);
    assert!(decode(&new_node).unwrap().new_node.is_some());
    let mut reserved = area(2, [1, 1, 0], 0);
    reserved[120] = 1;
    assert_eq!(decode(&reserved).unwrap_err(), RequestError::Reserved);
    // Bytes 108..112 are a typed request's target type.
    let mut target_type = area(2, [1, 1, 0], 0);
    target_type[108] = 1;
    assert_eq!(
        decode(&target_type).unwrap_err(),
        RequestError::TargetTypeWithoutTyped { target_type: 1 }
    );
    // Bytes 80..108 are the trace context (docs/protocol.md, "Trace
    // context"): read when both ids are set, never refused.
    let mut traced = area(2, [1, 1, 0], 0);
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

/// `FRESH_SINCE` in the subgraph layout: `fresh_hops` at 72 and
/// `fresh_fanout3` at 76 name the stored answers' own subgraph (1 to 3
/// hops, each fanout within its cap, 0 past the last hop); both are
/// refused in the dense layout and without the flag.
#[test]
fn a_subgraph_fresh_since_names_its_hops() {
    use protocol::layout::request_flags::FRESH_SINCE;
    use request::{FreshSince, RequestError, SubgraphFanouts};
    let geometry: Geometry = bytemuck_geometry(valid_segment_bytes());
    let caps = geometry.max_fanouts;
    let area = |hops: u32, flags: u32, fresh_hops: u32, fresh: [u32; 3]| {
        let mut area = vec![0u8; 136];
        area[16..20].copy_from_slice(&1u32.to_le_bytes());
        area[20..24].copy_from_slice(&2u32.to_le_bytes());
        area[24..28].copy_from_slice(&1u32.to_le_bytes());
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[40..48].copy_from_slice(&0xabcu64.to_le_bytes());
        area[48..56].copy_from_slice(&5u64.to_le_bytes());
        area[56..60].copy_from_slice(&fresh[0].to_le_bytes());
        area[60..64].copy_from_slice(&fresh[1].to_le_bytes());
        area[64..68].copy_from_slice(&hops.to_le_bytes());
        area[72..76].copy_from_slice(&fresh_hops.to_le_bytes());
        area[76..80].copy_from_slice(&fresh[2].to_le_bytes());
        area[128..136].copy_from_slice(&3u64.to_le_bytes());
        area
    };
    let decode = |bytes: &[u8]| request::decode(bytes, &geometry, &schema(), None);
    for (fresh_hops, fresh) in [(1, [3, 0, 0]), (2, [3, 2, 0]), (3, [3, 2, 1])] {
        let got = decode(&area(2, FRESH_SINCE, fresh_hops, fresh)).unwrap();
        let subgraph = SubgraphFanouts::new(&fresh[..fresh_hops as usize]).unwrap();
        assert_eq!(got.fresh, Some(FreshSince::subgraph(0xabc, 5, subgraph)));
    }
    // The stored answers' depth need not be the request's.
    let deeper = decode(&area(1, FRESH_SINCE, 3, [1, 1, 1])).unwrap();
    assert_eq!(deeper.fresh.unwrap().subgraph.unwrap().hops(), 3);
    for (fresh_hops, fresh) in [
        (0, [1, 1, 0]),
        (4, [1, 1, 1]),
        (1, [1, 1, 0]),
        (2, [1, 0, 0]),
        (2, [1, 1, 1]),
        (3, [1, 1, 0]),
        (2, [caps[0] + 1, 1, 0]),
        (3, [1, 1, caps[1] + 1]),
    ] {
        let err = decode(&area(2, FRESH_SINCE, fresh_hops, fresh)).unwrap_err();
        assert!(
            matches!(err, RequestError::FreshSubgraph { .. }),
            "fresh_hops {fresh_hops} {fresh:?}: {err}"
        );
        assert!(err.to_string().contains("fresh_hops"), "{err}");
    }
    let err = decode(&area(0, FRESH_SINCE, 2, caps_with_zero(caps))).unwrap_err();
    assert_eq!(
        err,
        RequestError::FreshHopsForDense {
            fresh_hops: 2,
            fresh_fanout3: 0
        }
    );
    let mut unflagged = area(2, 0, 2, [0, 0, 0]);
    unflagged[40..56].fill(0);
    assert_eq!(
        decode(&unflagged).unwrap_err(),
        RequestError::FreshWithoutFlag
    );
}

fn caps_with_zero(caps: [u32; 2]) -> [u32; 3] {
    [caps[0], caps[1], 0]
}
