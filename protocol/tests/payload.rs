//! The payload written in place and decoded without copying, in one process
//! (the multi-process and pyarrow tests cover the same across processes).
#![cfg(not(loom))]

use arrow_buffer::{Buffer, MutableBuffer};
use protocol::layout::status;
use protocol::payload::schema::{node_schema, target_schema, target_status, tier};
use protocol::payload::{
    self, DecodeError, DecodeLimits, PayloadShape, ResponseWriter, SchemaCache, WriteError,
};

const AREA: usize = 1 << 20;

fn limits(dim: u32) -> DecodeLimits {
    DecodeLimits {
        feature_dim: dim,
        max_nodes: 100_000,
        max_targets: 1_000,
        max_fanouts: [50, 50],
    }
}

/// A 64-byte aligned, zeroed area (arrow's MutableBuffer allocates aligned).
fn area() -> MutableBuffer {
    MutableBuffer::from_len_zeroed(AREA)
}

/// One target with `f1` hop-1 and `f1*f2` hop-2 neighbours, all distinct.
fn write_full(area: &mut [u8], dim: u32, fanouts: [u32; 2]) -> PayloadShape {
    let [f1, f2] = fanouts.map(|f| f as usize);
    let n_nodes = 1 + f1 + f1 * f2;
    let shape = PayloadShape {
        n_targets: 1,
        n_nodes: n_nodes as u32,
        feature_dim: dim,
        fanouts,
    };
    let cache = SchemaCache::default();
    let mut writer = ResponseWriter::new(area, shape, &cache).unwrap();
    {
        let (nodes, targets) = writer.columns();
        let mut nodes = nodes;
        for row in 0..n_nodes {
            nodes.node_id[row] = 1000 + row as u64;
            for j in 0..dim as usize {
                nodes.features[row * dim as usize + j] = (row * 10_000 + j) as f32;
            }
            nodes.tier[row] = (row % 4) as u8;
            nodes.set_fallback(row, row % 4 == tier::DEFAULT as usize);
        }
        targets.target_id[0] = 1000;
        targets.status[0] = target_status::OK;
        targets.target_row[0] = 0;
        targets.hop1_count[0] = f1 as i32;
        for i in 0..f1 {
            targets.hop1_rows[i] = 1 + i as i32;
            targets.hop2_count[i] = f2 as i32;
            for j in 0..f2 {
                targets.hop2_rows[i * f2 + j] = (1 + f1 + i * f2 + j) as i32;
            }
        }
    }
    writer.finish(99, 5, 0);
    shape
}

#[test]
fn a_221_row_response_round_trips_and_points_into_the_area() {
    let mut area = area();
    write_full(area.as_slice_mut(), 128, [20, 10]);
    let buffer: Buffer = area.into();
    let tables = payload::decode(&buffer, &limits(128), &SchemaCache::default()).unwrap();
    assert_eq!(tables.n_nodes(), 221);
    assert_eq!(tables.header.request_id, 99);
    assert_eq!(tables.header.graph_version, 5);
    assert_eq!(tables.nodes.schema().fields(), node_schema(128).fields());
    assert_eq!(
        tables.targets.schema().fields(),
        target_schema([20, 10]).fields()
    );
    assert_eq!(
        tables.features()[220 * 128 + 127],
        (220 * 10_000 + 127) as f32
    );
    assert_eq!(tables.hop2_rows()[199], 220);
    assert!(tables.fallback(3) && !tables.fallback(2));
    // Every column's values are inside the area, 64-byte aligned.
    let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
    let starts = [
        tables.node_ids().as_ptr() as usize,
        tables.features().as_ptr() as usize,
        tables.tiers().as_ptr() as usize,
        tables.target_ids().as_ptr() as usize,
        tables.hop1_rows().as_ptr() as usize,
        tables.hop2_rows().as_ptr() as usize,
    ];
    for start in starts {
        assert!(range.contains(&start), "buffer copied out of the area");
        assert_eq!(start % 64, 0, "buffer not 64-byte aligned");
    }
}

#[test]
fn a_response_that_does_not_fit_is_refused_before_any_write() {
    let mut small = MutableBuffer::from_len_zeroed(64 * 1024);
    let shape = PayloadShape {
        n_targets: 1,
        n_nodes: 221,
        feature_dim: 128,
        fanouts: [20, 10],
    };
    let err =
        ResponseWriter::new(small.as_slice_mut(), shape, &SchemaCache::default()).unwrap_err();
    match err {
        WriteError::TooLarge {
            needed, available, ..
        } => {
            assert!(needed > available);
            assert_eq!(available, 64 * 1024);
        }
        other => panic!("{other:?}"),
    }
    assert!(small.as_slice().iter().all(|&b| b == 0), "area untouched");
    assert!(err.to_string().contains("send fewer targets"));
}

#[test]
fn an_error_response_carries_its_status_and_message() {
    let mut area = area();
    payload::write_error(area.as_slice_mut(), status::TOO_LARGE, 4, "too big: é");
    let buffer: Buffer = area.into();
    match payload::decode(&buffer, &limits(8), &SchemaCache::default()) {
        Err(DecodeError::Status {
            status: code,
            status_name,
            message,
        }) => {
            assert_eq!(code, status::TOO_LARGE);
            assert_eq!(status_name, "TOO_LARGE");
            assert_eq!(message, "too big: é");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn row_indices_outside_the_node_table_are_refused() {
    let mut area = area();
    write_full(area.as_slice_mut(), 4, [2, 2]);
    // Corrupt one hop-2 row index to point past the node table: find it by
    // decoding once, then patch the byte in place.
    let buffer: Buffer = area.into();
    let tables = payload::decode(&buffer, &limits(4), &SchemaCache::default()).unwrap();
    let offset = tables.hop2_rows().as_ptr() as usize - buffer.as_ptr() as usize;
    drop(tables);
    let mut bytes = buffer.as_slice().to_vec();
    bytes[offset..offset + 4].copy_from_slice(&1_000i32.to_le_bytes());
    let mut patched = MutableBuffer::from_len_zeroed(AREA);
    patched.as_slice_mut().copy_from_slice(&bytes);
    let err = payload::decode(&patched.into(), &limits(4), &SchemaCache::default()).unwrap_err();
    assert!(err.to_string().contains("outside the node table"), "{err}");
}

#[test]
fn a_misaligned_area_is_an_error_not_a_copy() {
    // Shift a valid response off its 64-byte alignment: refused, never
    // copied silently into an aligned allocation.
    let mut area = area();
    write_full(area.as_slice_mut(), 4, [2, 2]);
    for shift in [4, 8, 32] {
        let mut shifted = MutableBuffer::from_len_zeroed(AREA + 64);
        shifted.as_slice_mut()[shift..shift + AREA].copy_from_slice(area.as_slice());
        let buffer: Buffer = shifted.into();
        let err =
            payload::decode(&buffer.slice(shift), &limits(4), &SchemaCache::default()).unwrap_err();
        assert!(err.to_string().contains("not 64-byte aligned"), "{err}");
    }
}

#[test]
fn fanout_limits_are_enforced_on_decode() {
    let mut area = area();
    write_full(area.as_slice_mut(), 4, [3, 2]);
    let buffer: Buffer = area.into();
    let mut tight = limits(4);
    tight.max_fanouts = [2, 50];
    let err = payload::decode(&buffer, &tight, &SchemaCache::default()).unwrap_err();
    assert!(err.to_string().contains("fanout 3 of hop 1"), "{err}");
}

/// A subgraph-layout response as the sidecar writes it: a chain 0 <- 1 <- 2
/// ... of `n_nodes` rows, one edge per node after the target, split over
/// `hops` hops as evenly as the chain allows.
fn write_subgraph(area: &mut [u8], dim: u32, n_nodes: usize, hops: usize) {
    use protocol::graph_schema::GraphSchema;
    use protocol::payload::{GraphShape, GraphWriter};
    use protocol::request::SubgraphFanouts;
    let n_edges = n_nodes - 1;
    let fanouts = SubgraphFanouts::new(&vec![3; hops]).unwrap();
    let shape = GraphShape::subgraph(fanouts, 1, n_nodes as u32, n_edges as u32);
    let cache = SchemaCache::default();
    let graph = GraphSchema::one_type(dim);
    let mut writer = GraphWriter::new(area, &graph, shape, &cache).unwrap();
    {
        let mut cols = writer.columns();
        let nodes = &mut cols.nodes[0];
        for row in 0..n_nodes {
            nodes.node_id[row] = 500 + row as u64;
            for j in 0..dim as usize {
                nodes.features[row * dim as usize + j] = (row * 100 + j) as f32;
            }
            nodes.tier[row] = tier::L2;
            nodes.set_fallback(row, false);
        }
        cols.target_id[0] = 500;
        cols.status[0] = target_status::OK;
        cols.target_row[0] = 0;
        let (src, dst) = cols.edge_index[0].split_at_mut(n_edges);
        for e in 0..n_edges {
            src[e] = e as i64 + 1;
            dst[e] = e as i64;
        }
        // Hop k reaches the k-th share of the chain.
        let mut left = n_edges as i64;
        cols.sampled_nodes[0][0] = 1;
        for k in 0..hops {
            let share = if k + 1 == hops {
                left
            } else {
                n_edges as i64 / hops as i64
            };
            cols.sampled_nodes[0][k + 1] = share;
            cols.sampled_edges[0][k] = share;
            left -= share;
        }
    }
    writer.finish(42, 3, 0);
}

/// Reads a one-type graph's subgraph-layout response.
fn decode_subgraph(
    buffer: &Buffer,
    dim: u32,
) -> Result<protocol::payload::GraphTables, payload::DecodeError> {
    payload::decode_graph(buffer, &limits(dim), None, 0, &SchemaCache::default())
}

/// A one-type subgraph response reads as the 1x1 graph's (node type 0,
/// edge type 0, the counts from the edge table's `hop_counts`), its
/// buffers in place; the dense reader refuses it, and the graph reader a
/// dense-layout response.
#[test]
fn a_subgraph_response_round_trips_as_the_one_by_one_graph_in_place() {
    for hops in 1..=3 {
        let mut area = area();
        write_subgraph(area.as_slice_mut(), 16, 10, hops);
        let buffer: Buffer = area.into();
        let tables = decode_subgraph(&buffer, 16).unwrap();
        assert_eq!(tables.hops(), hops);
        assert_eq!(tables.subgraph_fanouts().unwrap().as_slice(), vec![3; hops]);
        assert_eq!((tables.n_targets(), tables.n_rows(0)), (1, 10));
        assert_eq!(tables.node_ids(0)[9], 509);
        let edges = tables.edge_index(0);
        assert_eq!(&edges[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(&edges[9..], &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(tables.sampled_nodes(0).len(), hops + 1);
        assert_eq!(tables.sampled_edges(0).len(), hops);
        assert_eq!(tables.sampled_nodes(0).iter().sum::<i64>(), 10);
        assert_eq!(tables.features(0)[9 * 16 + 3], 903.0);
        assert_eq!(tables.tiers(0), &[tier::L2; 10]);
        assert!((0..10).all(|row| !tables.fallback(0, row)));
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
        for start in [
            tables.features(0).as_ptr() as usize,
            tables.edge_index(0).as_ptr() as usize,
            tables.target_rows().as_ptr() as usize,
        ] {
            assert!(range.contains(&start), "buffer copied out of the area");
            assert_eq!(start % 64, 0, "buffer not 64-byte aligned");
        }
        let err = payload::decode(&buffer, &limits(16), &SchemaCache::default()).unwrap_err();
        assert!(
            err.to_string().contains("read it with decode_graph"),
            "{err}"
        );
    }
    // No edges: targets without neighbours.
    let mut lone = area();
    write_subgraph(lone.as_slice_mut(), 4, 1, 2);
    let buffer: Buffer = lone.into();
    let tables = decode_subgraph(&buffer, 4).unwrap();
    assert!(tables.edge_index(0).is_empty());
    assert_eq!(tables.sampled_nodes(0), &[1, 0, 0]);
    let mut dense = area();
    write_full(dense.as_slice_mut(), 8, [3, 2]);
    let buffer: Buffer = dense.into();
    let err = decode_subgraph(&buffer, 8).unwrap_err();
    assert!(err.to_string().contains("hops 0"), "{err}");
}

/// Every way a peer could make a subgraph response lie is a decode error:
/// an edge row past the node table, hop counts that do not add up, a hop
/// count above 3, fanouts past the last hop.
#[test]
fn a_subgraph_response_that_lies_is_refused() {
    let cache = SchemaCache::default();
    let decode = |mutate: &dyn Fn(&mut [u8])| {
        let mut area = area();
        write_subgraph(area.as_slice_mut(), 4, 6, 2);
        mutate(area.as_slice_mut());
        let buffer: Buffer = area.into();
        payload::decode_graph(&buffer, &limits(4), None, 0, &cache).map(|_| ())
    };
    decode(&|_| {}).expect("the unchanged response decodes");
    let u64_at = |area: &[u8], at: usize| u64::from_le_bytes(area[at..at + 8].try_into().unwrap());
    // The edge table's body: find the edge_index values (row 0 = 1..=5).
    let values_at = |area: &[u8]| {
        let start = u64_at(area, 104) as usize;
        let end = start + u64_at(area, 112) as usize;
        let want: Vec<u8> = [1i64, 2, 3, 4, 5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        start
            + area[start..end]
                .windows(want.len())
                .position(|w| w == want)
                .expect("edge values in the stream")
    };
    let err = decode(&|area| {
        let at = values_at(area);
        area[at..at + 8].copy_from_slice(&6i64.to_le_bytes());
    })
    .unwrap_err();
    assert!(err.to_string().contains("a row is outside"), "{err}");
    let err = decode(&|area| {
        let at = values_at(area) + 10 * 8; // past both rows: hop_counts
        let counts = area[at..].windows(8).position(|w| w == 1i64.to_le_bytes());
        let at = at + counts.expect("hop counts after the edges");
        area[at..at + 8].copy_from_slice(&2i64.to_le_bytes());
    })
    .unwrap_err();
    assert!(err.to_string().contains("do not add up"), "{err}");
    let err = decode(&|area| area[120..124].copy_from_slice(&4u32.to_le_bytes())).unwrap_err();
    assert!(err.to_string().contains("hops 4"), "{err}");
    let err = decode(&|area| area[124..128].copy_from_slice(&3u32.to_le_bytes())).unwrap_err();
    assert!(err.to_string().contains("hop 3"), "{err}");
    let err = decode(&|area| area[104..120].fill(0)).unwrap_err();
    assert!(err.to_string().contains("edge table"), "{err}");
}

/// A one-type graph whose edges carry data answers a request that asks
/// for it in the subgraph layout with a directory of its own at 384: its
/// one edge type's data table, one row per `edge_index` column, read in
/// place; a request that did not ask reads the same response's sample,
/// and a reader that asked for other columns refuses it.
#[test]
fn a_one_type_response_carries_its_edge_data_after_its_own_directory() {
    use protocol::graph_schema::{EdgeDataDesc, GraphSchema};
    use protocol::payload::{GraphShape, GraphWriter};
    use protocol::request::{EdgeColumns, SubgraphFanouts};
    let data = EdgeDataDesc {
        attr_dim: 3,
        weight: true,
        time: false,
    };
    let graph = GraphSchema::one_type(2).with_edge_data(0, data);
    let asked = EdgeColumns::ALL;
    let mut area = area();
    let fanouts = SubgraphFanouts::new(&[2]).unwrap();
    let shape = GraphShape::subgraph(fanouts, 1, 3, 2).with_edge_data(asked);
    let cache = SchemaCache::default();
    let mut writer = GraphWriter::new(area.as_slice_mut(), &graph, shape, &cache).unwrap();
    {
        let mut cols = writer.columns();
        cols.target_id[0] = 5;
        cols.target_row[0] = 0;
        cols.nodes[0].node_id.copy_from_slice(&[5, 9, 4]);
        cols.edge_index[0].copy_from_slice(&[1, 2, 0, 0]);
        cols.sampled_nodes[0].copy_from_slice(&[1, 2]);
        cols.sampled_edges[0].copy_from_slice(&[2]);
        assert!(cols.edge_time[0].is_empty(), "no time is carried");
        cols.edge_attr[0].copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        cols.edge_weight[0].copy_from_slice(&[0.5, 2.0]);
    }
    writer.finish(42, 3, 0);
    let buffer: Buffer = area.into();
    let bytes = buffer.as_slice();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    assert!(word(40) >= 448, "the node table follows the directory");
    let read =
        |asked| payload::decode_graph_with(&buffer, &limits(2), &graph, false, 0, asked, &cache);
    let tables = read(asked).unwrap();
    assert_eq!(tables.edge_attr(0), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(tables.edge_weight(0), [0.5, 2.0]);
    assert!(tables.edge_time(0).is_empty());
    assert_eq!(tables.edge_index(0), [1, 2, 0, 0]);
    let (offset, len) = (word(384) as usize, word(392) as usize);
    assert!(offset > 0 && len > 0);
    // Read without asking: the same sample, no data.
    let plain = decode_subgraph(&buffer, 2).unwrap();
    assert_eq!(plain.edge_index(0), [1, 2, 0, 0]);
    assert!(plain.edge_data[0].is_none());
    // A reader that asked for other columns than the response holds
    // (a time, which this graph's edges do not carry) finds a table where
    // its directory must say none, and refuses the response.
    let time = EdgeColumns {
        time: true,
        ..EdgeColumns::default()
    };
    let error = read(time).unwrap_err().to_string();
    assert!(
        error.contains("sends no edge data asked for") && error.contains("(0+0)"),
        "{error}"
    );
}
