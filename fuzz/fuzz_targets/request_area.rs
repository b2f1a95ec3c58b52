//! A slot's request area, as the sidecar decodes it (docs/protocol.md 3.3),
//! for a one-type graph and for a typed one.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use protocol::layout::{dtype, FeatureSchema, Geometry};

fuzz_target!(|bytes: &[u8]| {
    let geometry = Geometry {
        slot_count: 4,
        max_targets: 64,
        max_fanouts: [25, 25],
        max_nodes: 4096,
        _pad: 0,
        slot_control_offset: 5120,
        slot_data_offset: 8192,
        slot_stride: 1 << 20,
        request_bytes: 4096,
        response_bytes: (1 << 20) - 4096,
    };
    let schema = FeatureSchema {
        feature_dim: 8,
        dtype: dtype::F32,
        graph_version: 1,
        default_fanouts: [10, 5],
    };
    let typed = common::typed_graph();
    if let Ok(request) = protocol::request::decode(bytes, &geometry, &schema, Some(&typed)) {
        let ask = request.typed.as_ref().expect("a typed graph takes typed requests only");
        assert!((ask.target_type as usize) < typed.node_types.len());
        assert!((1..=3).contains(&ask.hops));
        assert_eq!(ask.fanouts.len(), typed.edge_types.len() * ask.hops as usize);
        for (i, &fanout) in ask.fanouts.iter().enumerate() {
            let hop = i % ask.hops as usize;
            assert!(fanout <= geometry.max_fanouts[hop.min(1)]);
        }
        assert!(request.targets.len() <= geometry.max_targets as usize);
        if let Some(node) = &request.typed_new_node {
            assert_eq!(request.targets.len(), 1, "a typed new node is the one target");
            let target = &typed.node_types[ask.target_type as usize];
            assert_eq!(node.features.len(), target.feature_dim as usize);
            assert!(node.features.iter().all(|v| v.is_finite()));
            assert_eq!(node.edges.len(), typed.edge_types.len());
            for (e, pairs) in node.edges.iter().enumerate() {
                let desc = &typed.edge_types[e];
                for &(src, dst) in pairs {
                    assert!(
                        (desc.src == ask.target_type && src == request.targets[0])
                            || (desc.dst == ask.target_type && dst == request.targets[0])
                    );
                }
            }
        }
    }
    let occupied = protocol::request::occupied_bytes(bytes, &geometry, &schema, Some(&typed));
    assert!(occupied <= geometry.request_bytes as usize);
    if let Some(head) = bytes.get(..occupied) {
        assert_eq!(
            protocol::request::decode(head, &geometry, &schema, Some(&typed)).is_ok(),
            protocol::request::decode(bytes, &geometry, &schema, Some(&typed)).is_ok()
        );
    }
    if let Ok(request) = protocol::request::decode(bytes, &geometry, &schema, None) {
        assert!(request.typed.is_none());
        assert!(request.targets.len() <= geometry.max_targets as usize);
        for (fanout, cap) in request.fanouts.iter().zip(geometry.max_fanouts) {
            assert!(*fanout >= 1 && *fanout <= cap, "fanout {fanout} cap {cap}");
        }
        if let Some(node) = &request.new_node {
            assert_eq!(request.targets.len(), 1);
            assert_eq!(node.features.len(), schema.feature_dim as usize);
            assert!(node.features.iter().all(|v| v.is_finite()));
            assert!(
                node.neighbors.len() as u64
                    <= protocol::request::max_new_node_edges(&geometry, &schema)
            );
        }
    }
    let occupied = protocol::request::occupied_bytes(bytes, &geometry, &schema, None);
    assert!(occupied <= geometry.request_bytes as usize);
    if let Some(head) = bytes.get(..occupied) {
        // What the sidecar copies out decodes as the whole area does.
        assert_eq!(
            protocol::request::decode(head, &geometry, &schema, None).is_ok(),
            protocol::request::decode(bytes, &geometry, &schema, None).is_ok()
        );
    }
});
