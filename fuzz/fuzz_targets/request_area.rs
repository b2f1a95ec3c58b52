//! A slot's request area, as the sidecar decodes it (docs/protocol.md 3.3),
//! for a typed graph and for a one-type graph (the 1x1 graph).
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use protocol::graph_schema::GraphSchema;
use protocol::layout::{dtype, FeatureSchema, Geometry};
use protocol::request::{decode, occupied_bytes, Decoding};

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
    let one_type = GraphSchema::one_type(schema.feature_dim);
    for (graph, is_typed) in [(&typed, true), (&one_type, false)] {
        let on = Decoding {
            geometry: &geometry,
            schema: &schema,
            graph,
            typed: is_typed,
        };
        if let Ok(request) = decode(bytes, on) {
            assert!(request.targets.len() <= geometry.max_targets as usize);
            let target_type = match &request.graph {
                Some(ask) => {
                    assert!((ask.target_type as usize) < graph.node_types.len());
                    assert!((1..=3).contains(&ask.hops));
                    assert_eq!(ask.fanouts.len(), graph.edge_types.len() * ask.hops as usize);
                    for (i, &fanout) in ask.fanouts.iter().enumerate() {
                        let hop = i % ask.hops as usize;
                        assert!(fanout <= geometry.max_fanouts[hop.min(1)]);
                    }
                    ask.target_type
                }
                None => {
                    assert!(!is_typed, "a typed graph takes graph-layout requests only");
                    for (fanout, cap) in request.fanouts.iter().zip(geometry.max_fanouts) {
                        assert!(*fanout >= 1 && *fanout <= cap, "fanout {fanout} cap {cap}");
                    }
                    0
                }
            };
            if let Some(node) = &request.new_node {
                assert_eq!(request.targets.len(), 1, "a new node is the one target");
                let target = &graph.node_types[target_type as usize];
                assert_eq!(node.features.len(), target.feature_dim as usize);
                assert!(node.features.iter().all(|v| v.is_finite()));
                assert_eq!(node.edges.len(), graph.edge_types.len());
                for (e, pairs) in node.edges.iter().enumerate() {
                    let desc = &graph.edge_types[e];
                    for &(src, dst) in pairs {
                        assert!(
                            (desc.src == target_type && src == request.targets[0])
                                || (desc.dst == target_type && dst == request.targets[0])
                        );
                    }
                }
            }
        }
        let occupied = occupied_bytes(bytes, on);
        assert!(occupied <= geometry.request_bytes as usize);
        if let Some(head) = bytes.get(..occupied) {
            // What the sidecar copies out decodes as the whole area does.
            assert_eq!(decode(head, on).is_ok(), decode(bytes, on).is_ok());
        }
    }
});
