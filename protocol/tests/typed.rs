//! A typed graph over the ring (docs/protocol.md, sections 2.7, "Typed
//! requests" and 4.4): the schema a segment carries, a typed request's
//! fields, a typed response written and read in place, and hostile bytes in
//! each refused by name, never a panic.
#![cfg(not(loom))]

use arrow_buffer::{Buffer, MutableBuffer};
use proptest::prelude::*;
use protocol::graph_schema::GraphSchema;
use protocol::layout::{dtype, request_flags, FeatureSchema, Geometry};
use protocol::payload::schema::{target_status, tier, NO_ROW};
use protocol::payload::{
    decode_graph, DecodeError, DecodeLimits, GraphColumns, GraphShape, GraphWriter, SchemaCache,
};
use protocol::request::{self, FreshSince, GraphAsk, NewNode, RequestError};
use protocol::{Segment, SegmentConfig};

/// Users (2 features) and items (ids): (user, buys, item), (item,
/// rev_buys, user), (user, follows, user).
fn graph() -> GraphSchema {
    GraphSchema::of(
        &[("user", 2), ("item", 0)],
        &[(0, "buys", 1), (1, "rev_buys", 0), (0, "follows", 0)],
    )
}

fn typed_config(name: &str) -> SegmentConfig {
    let schema = FeatureSchema {
        feature_dim: 0,
        dtype: dtype::F32,
        graph_version: 3,
        default_fanouts: [3, 2],
    };
    let mut cfg = SegmentConfig::new(name, schema);
    cfg.graph = Some(graph());
    cfg.slot_count = 2;
    cfg.max_targets = 4;
    cfg.response_bytes = 16 * 1024;
    cfg
}

#[test]
fn a_typed_segment_carries_its_schema_and_a_damaged_one_is_refused() {
    let name = format!("gnn-typed-{}", std::process::id());
    let segment = Segment::create(&typed_config(&name)).unwrap();
    let attached = Segment::attach(&name).unwrap();
    assert_eq!(attached.graph_schema(), Some(&graph()));
    assert_eq!(attached.schema().feature_dim, 0);
    let mut bytes = std::fs::read(format!("/dev/shm/{name}")).unwrap();
    drop(attached);
    segment.unlink().unwrap();
    let word = |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (offset, len) = (word(&bytes, 824) as usize, word(&bytes, 832) as usize);
    assert_eq!(bytes[offset..offset + len], graph().encode());
    let attach = |bytes: &[u8], tag: &str| {
        let name = format!("gnn-typed-{}-{tag}", std::process::id());
        std::fs::write(format!("/dev/shm/{name}"), bytes).unwrap();
        let result = Segment::attach(&name);
        std::fs::remove_file(format!("/dev/shm/{name}")).unwrap();
        result
    };
    // A relation that names a node type the graph lacks.
    bytes[offset + 16 + 48 * 2] = 9;
    let error = attach(&bytes, "type").unwrap_err().to_string();
    assert!(
        error.contains("graph schema") && error.contains("names node type 9"),
        "{error}"
    );
    // A schema that runs into the first slot.
    bytes[offset + 16 + 48 * 2] = 0;
    bytes[832..840].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let error = attach(&bytes, "long").unwrap_err().to_string();
    assert!(error.contains("graph schema"), "{error}");
    // A typed segment without its schema, and a one-type one with a schema.
    bytes[824..840].fill(0);
    let error = attach(&bytes, "none").unwrap_err().to_string();
    assert!(
        error.contains("feature dim is 0 with no graph schema"),
        "{error}"
    );
    // Creating: a typed graph's segment has feature_dim 0.
    let mut cfg = typed_config("gnn-typed-never");
    cfg.schema.feature_dim = 2;
    let error = Segment::create(&cfg).unwrap_err().to_string();
    assert!(error.contains("feature dim 0"), "{error}");
}

fn geometry() -> Geometry {
    Geometry {
        slot_count: 2,
        max_targets: 4,
        max_fanouts: [5, 3],
        max_nodes: 100,
        _pad: 0,
        slot_control_offset: 5120,
        slot_data_offset: 8192,
        slot_stride: 1 << 16,
        request_bytes: 4096,
        response_bytes: (1 << 16) - 4096,
    }
}

fn feature_schema() -> FeatureSchema {
    FeatureSchema {
        feature_dim: 0,
        dtype: dtype::F32,
        graph_version: 3,
        default_fanouts: [3, 2],
    }
}

/// How a typed graph's segment reads its requests.
fn typed_decoding<'a>(
    geometry: &'a Geometry,
    schema: &'a FeatureSchema,
    graph: &'a GraphSchema,
) -> request::Decoding<'a> {
    request::Decoding {
        geometry,
        schema,
        graph,
        typed: true,
    }
}

/// A typed request area: request 7, targets, hops, target type, fanouts.
fn typed_area(targets: &[u64], hops: u32, target_type: u32, fanouts: &[u32]) -> Vec<u8> {
    let mut area = vec![0u8; 4096];
    area[0..8].copy_from_slice(&7u64.to_le_bytes());
    area[16..20].copy_from_slice(&(targets.len() as u32).to_le_bytes());
    area[64..68].copy_from_slice(&hops.to_le_bytes());
    area[108..112].copy_from_slice(&target_type.to_le_bytes());
    let mut at = 128;
    for id in targets {
        area[at..at + 8].copy_from_slice(&id.to_le_bytes());
        at += 8;
    }
    for fanout in fanouts {
        area[at..at + 4].copy_from_slice(&fanout.to_le_bytes());
        at += 4;
    }
    area
}

#[test]
fn a_typed_request_is_read_with_its_fanouts_and_bad_ones_are_refused() {
    let (geometry, schema, graph) = (geometry(), feature_schema(), graph());
    let on = typed_decoding(&geometry, &schema, &graph);
    let decode = |area: &[u8]| request::decode(area, on);
    // Two hops: buys [2, 0], rev_buys [1, 1], follows [5, 3].
    let fanouts = [2, 0, 1, 1, 5, 3];
    let request = decode(&typed_area(&[4, 9], 2, 0, &fanouts)).unwrap();
    assert_eq!(request.targets, [4, 9]);
    assert_eq!(
        request.graph,
        Some(GraphAsk {
            target_type: 0,
            hops: 2,
            fanouts: fanouts.to_vec(),
            edge_data: Default::default(),
        })
    );
    assert_eq!(request.graph.as_ref().unwrap().fanout(2, 1), 3);
    // What the sidecar copies out is exactly the header, ids and fanouts.
    let area = typed_area(&[4, 9], 2, 0, &fanouts);
    let occupied = request::occupied_bytes(&area, on);
    assert_eq!(occupied, 128 + 16 + 24);
    assert!(decode(&area[..occupied]).is_ok());

    let problem = |area: Vec<u8>| decode(&area).unwrap_err().to_string();
    let cases = [
        (
            typed_area(&[4], 0, 0, &[]),
            "send graph-layout requests (hops 1 to 3)",
        ),
        (
            typed_area(&[4], 4, 0, &[1; 12]),
            "request hops 4: 0 asks for the dense layout, 1 to 3",
        ),
        (
            typed_area(&[4], 1, 2, &[1, 1, 1]),
            "target type 2 is not a node type of this graph (2 types: user (2 f32), item (ids)",
        ),
        (
            typed_area(&[4], 1, 1, &[1, 1, 6]),
            "fanout 6 of edge type user__follows__user at hop 1 exceeds the cap 5",
        ),
        (
            typed_area(&[4], 2, 1, &[1, 1, 1, 1, 1, 4]),
            "fanout 4 of edge type user__follows__user at hop 2 exceeds the cap 3",
        ),
        (
            typed_area(&[1, 2, 3, 4, 5], 1, 0, &[1, 1, 1]),
            "5 targets; the segment allows at most 4",
        ),
    ];
    for (area, expected) in cases {
        let error = problem(area);
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
    let mut fanout_fields = typed_area(&[4], 1, 0, &[1, 1, 1]);
    fanout_fields[20] = 1;
    assert_eq!(
        decode(&fanout_fields).unwrap_err(),
        RequestError::GraphFanoutFields
    );
    for (flag, name) in [
        (request_flags::OWN_ROWS_ONLY, "OWN_ROWS_ONLY"),
        (request_flags::HUB_H1, "HUB_H1"),
    ] {
        let mut area = typed_area(&[4], 1, 0, &[1, 1, 1]);
        area[28..32].copy_from_slice(&flag.to_le_bytes());
        let error = decode(&area).unwrap_err().to_string();
        assert!(error.contains(name) && error.contains("dense layout only"));
    }
    // FRESH_SINCE: the point of the change clock alone; the stored
    // answers were computed at the request's own fanouts.
    let fresh_area = |fields: &[(usize, u32)]| {
        let mut area = typed_area(&[4, 9], 2, 0, &fanouts);
        let flags = request_flags::FRESH_SINCE;
        area[28..32].copy_from_slice(&flags.to_le_bytes());
        area[40..48].copy_from_slice(&0xc10cu64.to_le_bytes());
        area[48..56].copy_from_slice(&17u64.to_le_bytes());
        for &(at, value) in fields {
            area[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
        area
    };
    let fresh = decode(&fresh_area(&[])).unwrap();
    assert_eq!(fresh.fresh, Some(FreshSince::graph(0xc10c, 17)));
    assert_eq!(fresh.graph.as_ref().unwrap().fanouts, fanouts);
    // fresh_fanouts: refused by name; bytes 68..80 are reserved.
    for at in [56, 60] {
        assert_eq!(
            decode(&fresh_area(&[(at, 2)])).unwrap_err(),
            RequestError::GraphFreshFanouts,
            "byte {at}"
        );
    }
    for at in [68, 76] {
        assert_eq!(
            decode(&fresh_area(&[(at, 2)])).unwrap_err(),
            RequestError::Reserved,
            "byte {at}"
        );
    }
    // fresh_hops (byte 72): the stored answers' hops, their fanouts (per
    // edge type and hop) after the request's own.
    let mut at_other = fresh_area(&[(72, 1)]);
    let after = 128 + 16 + 4 * fanouts.len();
    for (i, f) in [4u32, 0, 2].iter().enumerate() {
        at_other[after + 4 * i..after + 4 * i + 4].copy_from_slice(&f.to_le_bytes());
    }
    let got = decode(&at_other).unwrap();
    assert_eq!(
        got.fresh_at,
        Some(GraphAsk {
            target_type: 0,
            hops: 1,
            fanouts: vec![4, 0, 2],
            edge_data: Default::default(),
        })
    );
    assert_eq!(
        request::occupied_bytes(&at_other, on),
        after + 12,
        "the sidecar copies the stored answers' fanouts too"
    );
    at_other[after..after + 4].copy_from_slice(&9u32.to_le_bytes());
    let error = decode(&at_other).unwrap_err().to_string();
    assert!(
        error.starts_with(
            "the stored answers' (fresh_hops): fanout 9 of edge type user__buys__item"
        ),
        "{error}"
    );
    let error = decode(&fresh_area(&[(72, 4)])).unwrap_err().to_string();
    assert!(error.contains("4 hops; it samples 1 to 3"), "{error}");
    // The clock without the flag, and hub_min_degree: refused.
    let mut no_flag = fresh_area(&[]);
    no_flag[28..32].fill(0);
    assert_eq!(
        decode(&no_flag).unwrap_err(),
        RequestError::FreshWithoutFlag
    );
    let error = decode(&fresh_area(&[(36, 3)])).unwrap_err().to_string();
    assert!(error.contains("HUB_H1's hub_min_degree"), "{error}");
    // A dense-layout request to a typed graph names the graph.
    let untyped = typed_area(&[4], 0, 0, &[]);
    let error = decode(&untyped).unwrap_err().to_string();
    assert!(
        error.contains("serves a typed graph (user (2 f32), item (ids); user__buys__item"),
        "{error}"
    );
    // Fanouts past the end of the area.
    let short = typed_area(&[4, 9], 2, 0, &fanouts);
    let error = decode(&short[..150]).unwrap_err().to_string();
    assert!(error.contains("does not fit"), "{error}");
}

/// A typed request for new user `id` at one hop (fanouts [1, 1, 1]) with
/// its row and per edge type its edges, laid out as docs/protocol.md says:
/// after the fanouts the row at the next multiple of 8, the counts after
/// the row at the next multiple of 8, the u64 pairs after the counts at the
/// next multiple of 8; `new_node_edges` (bytes 32..36) their total.
fn new_user_area(id: u64, row: &[f32], edges: &[&[(u64, u64)]]) -> Vec<u8> {
    let mut area = typed_area(&[id], 1, 0, &[1, 1, 1]);
    let flags = request_flags::NEW_NODE;
    area[28..32].copy_from_slice(&flags.to_le_bytes());
    let total: usize = edges.iter().map(|e| e.len()).sum();
    area[32..36].copy_from_slice(&(total as u32).to_le_bytes());
    let mut bytes = Vec::new();
    let pad = |bytes: &mut Vec<u8>, base: usize| {
        while !(base + bytes.len()).is_multiple_of(8) {
            bytes.push(0);
        }
    };
    let base = 128 + 8 + 12;
    pad(&mut bytes, base);
    bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    pad(&mut bytes, base);
    bytes.extend(edges.iter().flat_map(|e| (e.len() as u32).to_le_bytes()));
    pad(&mut bytes, base);
    for pairs in edges {
        bytes.extend(
            pairs
                .iter()
                .flat_map(|&(s, d)| [s.to_le_bytes(), d.to_le_bytes()])
                .flatten(),
        );
    }
    area[base..base + bytes.len()].copy_from_slice(&bytes);
    area
}

#[test]
fn a_typed_new_node_is_read_with_its_row_and_edges_and_bad_ones_are_refused() {
    let (geometry, schema, graph) = (geometry(), feature_schema(), graph());
    let on = typed_decoding(&geometry, &schema, &graph);
    let decode = |area: &[u8]| request::decode(area, on);
    // The offsets of the doc: fanouts end at 148, the row at 152, the
    // counts at 160, the edges at 176.
    assert_eq!(request::new_node_offsets(3, 2, 3), Some((152, 160, 176)));
    // User 12 buys item 1, item 1 points back, user 3 follows user 12.
    let edges: [&[(u64, u64)]; 3] = [&[(12, 1)], &[(1, 12)], &[(3, 12), (12, 4)]];
    let area = new_user_area(12, &[0.5, -1.5], &edges);
    let request = decode(&area).unwrap();
    assert_eq!(request.targets, [12]);
    assert_eq!(
        request.new_node,
        Some(NewNode {
            features: vec![0.5, -1.5],
            edges: edges.iter().map(|e| e.to_vec()).collect(),
        })
    );
    let occupied = request::occupied_bytes(&area, on);
    assert_eq!(occupied, 176 + 4 * 16);
    assert!(decode(&area[..occupied]).is_ok());
    assert!(
        decode(&area[..occupied - 1]).is_err(),
        "the last edge cut short"
    );

    let problem = |area: Vec<u8>| decode(&area).unwrap_err().to_string();
    let mut two_targets = typed_area(&[12, 13], 1, 0, &[1, 1, 1]);
    let flags = request_flags::NEW_NODE;
    two_targets[28..32].copy_from_slice(&flags.to_le_bytes());
    let mut counts_off = new_user_area(12, &[0.5, 1.5], &edges);
    counts_off[32..36].copy_from_slice(&3u32.to_le_bytes());
    let cases = [
        (
            new_user_area(12, &[0.5, f32::NAN], &edges),
            "the new node's feature 1 is NaN".to_string(),
        ),
        (
            new_user_area(12, &[0.5, 1.5], &[&[(5, 1)], &[], &[]]),
            "edge (5, 1) of edge type user__buys__item: an edge of the new node has it (12) at \
             an end of node type user"
                .to_string(),
        ),
        (
            counts_off,
            "edge counts add up to 4, new_node_edges says 3".to_string(),
        ),
        (two_targets, "2 targets".to_string()),
    ];
    for (area, expected) in cases {
        let error = problem(area);
        assert!(error.contains(&expected), "{error:?} lacks {expected:?}");
    }
    // More edges than the area holds: 250 counted, 200 fit.
    let many = vec![(12u64, 1u64); 200];
    let mut area = new_user_area(12, &[0.5, 1.5], &[&many, &[], &[]]);
    area[32..36].copy_from_slice(&250u32.to_le_bytes());
    area[160..164].copy_from_slice(&250u32.to_le_bytes());
    let error = problem(area);
    assert!(error.contains("do not fit"), "{error}");
}

/// A typed response to targets [7, 8] (users) over two hops: user rows 7,
/// 8, 3; item rows 40, 41; edges of each type with their counts.
fn typed_response() -> MutableBuffer {
    let shape = GraphShape::typed(2, 2, vec![3, 2], vec![2, 1, 1]);
    written(shape, 0x55, |cols| {
        cols.target_id.copy_from_slice(&[7, 8]);
        cols.status
            .copy_from_slice(&[target_status::OK, target_status::OK]);
        cols.target_row.copy_from_slice(&[0, 1]);
        cols.nodes[0].node_id.copy_from_slice(&[7, 8, 3]);
        cols.nodes[0]
            .features
            .copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
        cols.nodes[0]
            .tier
            .copy_from_slice(&[tier::L1, tier::L2, tier::DEFAULT]);
        cols.nodes[0].set_fallback(2, true);
        cols.nodes[1].node_id.copy_from_slice(&[40, 41]);
        // (user, buys, item): users 7 and 8 bought items 40 and 41.
        cols.edge_index[0].copy_from_slice(&[0, 1, 0, 1]);
        // (item, rev_buys, user): item 40 to user 7.
        cols.edge_index[1].copy_from_slice(&[0, 0]);
        // (user, follows, user): user 3 follows user 8.
        cols.edge_index[2].copy_from_slice(&[2, 1]);
        cols.sampled_nodes[0].copy_from_slice(&[2, 1, 0]);
        cols.sampled_nodes[1].copy_from_slice(&[0, 2, 0]);
        cols.sampled_edges[0].copy_from_slice(&[0, 2]);
        cols.sampled_edges[1].copy_from_slice(&[1, 0]);
        cols.sampled_edges[2].copy_from_slice(&[1, 0]);
    })
}

/// A typed response of `shape` to request `request_id`, its columns
/// written by `fill`.
fn written(
    shape: GraphShape,
    request_id: u64,
    fill: impl FnOnce(&mut GraphColumns<'_>),
) -> MutableBuffer {
    let mut area = MutableBuffer::from_len_zeroed(16 * 1024);
    let mut writer = GraphWriter::new(
        area.as_slice_mut(),
        &graph(),
        shape,
        &SchemaCache::default(),
    )
    .unwrap();
    fill(&mut writer.columns());
    writer.finish(request_id, 3, 1000);
    area
}

fn limits() -> DecodeLimits {
    DecodeLimits {
        feature_dim: 0,
        max_nodes: 100,
        max_targets: 4,
        max_fanouts: [5, 3],
    }
}

#[test]
fn a_typed_response_is_read_in_place_as_it_was_written() {
    let area: Buffer = typed_response().into();
    let tables =
        decode_graph(&area, &limits(), Some(&graph()), 0, &SchemaCache::default()).unwrap();
    assert_eq!(tables.header.request_id, 0x55);
    assert_eq!(tables.header.n_nodes, 5);
    assert_eq!(tables.hops(), 2);
    assert_eq!(tables.target_ids(), [7, 8]);
    assert_eq!(tables.target_rows(), [0, 1]);
    assert_eq!(tables.node_ids(0), [7, 8, 3]);
    assert_eq!(tables.features(0), [1., 2., 3., 4., 5., 6.]);
    assert_eq!(tables.tiers(0), [tier::L1, tier::L2, tier::DEFAULT]);
    assert!(!tables.fallback(0, 0) && tables.fallback(0, 2));
    assert_eq!(tables.node_ids(1), [40, 41]);
    assert!(tables.features(1).is_empty() && !tables.fallback(1, 0));
    assert_eq!(tables.edge_index(0), [0, 1, 0, 1]);
    assert_eq!(tables.edge_index(2), [2, 1]);
    assert_eq!(tables.sampled_nodes(1), [0, 2, 0]);
    assert_eq!(tables.sampled_edges(1), [1, 0]);
    // In place: the features and the edges are inside the area.
    let range = area.as_ptr() as usize..area.as_ptr() as usize + area.len();
    assert!(range.contains(&(tables.features(0).as_ptr() as usize)));
    assert!(range.contains(&(tables.edge_index(0).as_ptr() as usize)));
    // Read for another target type, the hop-0 users are refused.
    let error =
        decode_graph(&area, &limits(), Some(&graph()), 1, &SchemaCache::default()).unwrap_err();
    assert!(
        error.to_string().contains("node type user has hop-0 nodes"),
        "{error}"
    );
}

/// A typed answer to `FRESH_SINCE` for targets [7, 8] whose first is
/// `FRESH` (no row) and whose second has row `second_row` of the user
/// table; `fresh_row` is the first's row as written.
fn fresh_response(fresh_row: i32, first_status: u8) -> Buffer {
    let shape = GraphShape::typed(1, 2, vec![1, 0], vec![0, 0, 0]);
    written(shape, 0x56, |cols| {
        cols.target_id.copy_from_slice(&[7, 8]);
        cols.status
            .copy_from_slice(&[first_status, target_status::OK]);
        cols.target_row.copy_from_slice(&[fresh_row, 0]);
        cols.nodes[0].node_id.copy_from_slice(&[8]);
        cols.nodes[0].features.copy_from_slice(&[1., 2.]);
        cols.sampled_nodes[0].copy_from_slice(&[1, 0]);
        cols.sampled_nodes[1].copy_from_slice(&[0, 0]);
    })
    .into()
}

#[test]
fn a_fresh_target_of_a_typed_response_has_no_row_and_only_it() {
    let read =
        |area: &Buffer| decode_graph(area, &limits(), Some(&graph()), 0, &SchemaCache::default());
    let tables = read(&fresh_response(NO_ROW, target_status::FRESH)).unwrap();
    assert_eq!(
        tables.target_status(),
        [target_status::FRESH, target_status::OK]
    );
    assert_eq!(tables.target_rows(), [NO_ROW, 0]);
    assert_eq!(tables.node_ids(0), [8]);
    // A FRESH target with a row, an OK one without: refused by name.
    let error = read(&fresh_response(0, target_status::FRESH)).unwrap_err();
    assert!(
        error.to_string().contains("a FRESH target has row 0"),
        "{error}"
    );
    let error = read(&fresh_response(NO_ROW, target_status::OK)).unwrap_err();
    assert!(
        error.to_string().contains("a target row is outside"),
        "{error}"
    );
    let error = read(&fresh_response(0, 9)).unwrap_err();
    assert!(
        error.to_string().contains("unknown target status 9"),
        "{error}"
    );
}

#[test]
fn a_typed_response_that_does_not_fit_leaves_the_area_untouched() {
    let mut area = MutableBuffer::from_len_zeroed(4096);
    let shape = GraphShape::typed(1, 1, vec![1000, 0], vec![0, 0, 0]);
    let error = GraphWriter::new(
        area.as_slice_mut(),
        &graph(),
        shape,
        &SchemaCache::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("does not fit"), "{error}");
    assert!(area.as_slice().iter().all(|&b| b == 0));
}

/// Offsets of the i64 values of `edge_index` of edge type `e` in the area.
fn edge_values_at(area: &Buffer, e: usize) -> usize {
    let tables = decode_graph(area, &limits(), Some(&graph()), 0, &SchemaCache::default()).unwrap();
    tables.edge_index(e).as_ptr() as usize - area.as_ptr() as usize
}

#[test]
fn hostile_typed_responses_are_refused_by_what_is_wrong() {
    let good: Buffer = typed_response().into();
    let at = edge_values_at(&good, 0);
    let damaged = |at: usize, value: i64| {
        let mut bytes = MutableBuffer::from_len_zeroed(good.len());
        bytes.as_slice_mut().copy_from_slice(good.as_slice());
        bytes.as_slice_mut()[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let area: Buffer = bytes.into();
        match decode_graph(&area, &limits(), Some(&graph()), 0, &SchemaCache::default()) {
            Err(DecodeError::Malformed(m)) => m,
            other => panic!("accepted or another error: {other:?}"),
        }
    };
    // An item row past the item table (buys' destinations are items).
    let error = damaged(at + 16, 2);
    assert!(
        error.contains("edge type user__buys__item: a row is outside"),
        "{error}"
    );
    // A user row below zero.
    let error = damaged(at, -1);
    assert!(error.contains("user__buys__item"), "{error}");
    // A directory entry pointing into the header.
    let error = damaged(384, 8);
    assert!(error.contains("node type user"), "{error}");
    // The hop counts (counts table) no longer add up.
    let counts = {
        let tables =
            decode_graph(&good, &limits(), Some(&graph()), 0, &SchemaCache::default()).unwrap();
        tables.sampled_nodes(0).as_ptr() as usize - good.as_ptr() as usize
    };
    let error = damaged(counts, 3);
    assert!(
        error.contains("node type user: counts [3, 1, 0]"),
        "{error}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any byte of a valid typed response changed: an error or a response
    /// whose every index is inside its tables, never a panic.
    #[test]
    fn a_changed_byte_is_refused_or_consistent(at in 0usize..4096, value: u8) {
        let mut bytes = typed_response();
        bytes.as_slice_mut()[at] = value;
        let area: Buffer = bytes.into();
        let graph = graph();
        if let Ok(tables) = decode_graph(&area, &limits(), Some(&graph), 0, &SchemaCache::default()) {
            for (e, edge_type) in graph.edge_types.iter().enumerate() {
                let index = tables.edge_index(e);
                let (src, dst) = index.split_at(index.len() / 2);
                let n_src = tables.n_rows(edge_type.src as usize) as i64;
                let n_dst = tables.n_rows(edge_type.dst as usize) as i64;
                prop_assert!(src.iter().all(|&r| (0..n_src).contains(&r)));
                prop_assert!(dst.iter().all(|&r| (0..n_dst).contains(&r)));
            }
            prop_assert_eq!(tables.features(0).len(), tables.n_rows(0) * 2);
        }
    }

    /// Any bytes as a typed request: refused, or within every limit.
    #[test]
    fn any_typed_request_bytes_are_refused_or_within_limits(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        hops in 0u32..5,
    ) {
        let mut area = bytes;
        if area.len() >= 68 {
            area[64..68].copy_from_slice(&hops.to_le_bytes());
        }
        let graph = graph();
        let (geometry, schema) = (geometry(), feature_schema());
        let on = typed_decoding(&geometry, &schema, &graph);
        if let Ok(request) = request::decode(&area, on) {
            let ask = request.graph.unwrap();
            prop_assert!((1..=3).contains(&ask.hops));
            prop_assert_eq!(ask.fanouts.len(), 3 * ask.hops as usize);
            prop_assert!((ask.target_type as usize) < 2);
        }
    }
}
