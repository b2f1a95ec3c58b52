//! Edges with data added while serving (docs/graph-index.md, "Edge data";
//! docs/admin.md; docs/updates.md, "Typed graphs"): through the admin
//! socket (`sidecarctl graph add-edges --edge-type` with the values after
//! `src dst`) and through the update stream (`data:<edge type>`), refused
//! by name when the data does not fit the edge type, and the same graph,
//! data included, on a replica fed by the socket and on replicas following
//! the stream, after a compaction and a restart too; and a graph call that
//! asks for edge data getting each sampled edge's own (docs/protocol.md,
//! section 4.5), typed and one-type. Real `sidecar serve`, `sidecar
//! publish`, `sidecarctl` and redis-server.

use std::path::Path;
use std::time::Duration;

use tests::eventually;
use tests::redis::RedisServer;
use tests::typed::{self, TypedSidecar};

/// Accounts (2 features each) paying merchants: `pays` carries 2
/// attributes, a weight and a time; `rev_pays` nothing.
fn payments(dir: &Path) {
    std::fs::create_dir_all(dir.join("edges")).unwrap();
    std::fs::create_dir_all(dir.join("nodes")).unwrap();
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    write(
        "nodes/account.f32",
        f32s(&[0.5, 1.0, -1.0, 0.0, 2.0, 0.25, 1.5, -0.5]),
    );
    write("edges/pays.u32", u32s(&[0, 0, 1, 0, 2, 2, 1, 2]));
    write(
        "edges/pays.attr.f32",
        f32s(&[1.0, 0.0, 2.0, 1.0, 3.0, 0.0, 4.0, 1.0]),
    );
    write("edges/pays.weight.f32", f32s(&[1.0, 1.0, 2.0, 1.0]));
    write(
        "edges/pays.time.i64",
        [
            1_700_000_000i64,
            1_700_000_010,
            1_700_000_005,
            1_700_000_000,
        ]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect(),
    );
    write("edges/rev_pays.u32", u32s(&[0, 0, 0, 1, 2, 1, 2, 2]));
    let meta = serde_json::json!({
        "node_types": [
            {"name": "account", "num_nodes": 4, "feature_dim": 2, "dtype": "f32",
             "features": "nodes/account.f32"},
            {"name": "merchant", "num_nodes": 3},
        ],
        "edge_types": [
            {"src": "account", "relation": "pays", "dst": "merchant", "num_edges": 4,
             "edges": "edges/pays.u32",
             "edge_data": {"attrs": "edges/pays.attr.f32", "attr_dim": 2,
                           "weight": "edges/pays.weight.f32", "time": "edges/pays.time.i64"}},
            {"src": "merchant", "relation": "rev_pays", "dst": "account", "num_edges": 4,
             "edges": "edges/rev_pays.u32"},
        ],
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
}

/// Three new payments: two repeat the pair (0, 1), two tie in time.
const NEW_PAYS: &str = "0 1 12.5 1 2 1700000000\n\
                        3 1 3 0 1 1699999999\n\
                        0 1 7.5 1 1 1700000000\n";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn edges_with_data_added_through_the_socket_or_the_stream_make_one_graph() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("payments");
    payments(&source);
    let [solo, a, b] = ["solo", "a", "b"].map(|name| dir.path().join(name));
    for data in [&solo, &a, &b] {
        typed::import(&source, data, &[]);
    }

    // Through the admin socket.
    let sidecar = TypedSidecar::serve(&solo, &[]);
    let start = sidecar.sidecarctl_json(&["graph", "checksum"]);
    let file = dir.path().join("pays.txt");
    let add = |text: &str, edge_type: Option<&str>| {
        std::fs::write(&file, text).unwrap();
        let mut args = vec!["graph", "add-edges", "--file", file.to_str().unwrap()];
        if let Some(edge_type) = edge_type {
            args.extend(["--edge-type", edge_type]);
        }
        sidecar.sidecarctl(&args)
    };
    for (text, edge_type, expected) in [
        (
            "0 1 12.5 1 2 1700000000.5\n",
            Some("pays"),
            "edge type account__pays__merchant: edge 0's time \"1700000000.5\" is not an \
             integer",
        ),
        (
            "0 1 12.5 1 2\n",
            Some("pays"),
            "4 values per edge (the attributes, then the weight, then the time): 1 edges \
             need 4, 3 were given",
        ),
        (
            "0 1 12.5 1 2 1700000000\n1 2 1 1\n",
            Some("pays"),
            "pays.txt:2: 2 values after `src dst`, and line 1 has 4",
        ),
        (
            "0 1 inf 1 2 1700000000\n",
            Some("pays"),
            "edge 0 has attribute inf in column 0",
        ),
        (
            "0 1\n",
            Some("pays"),
            "1 edges need 2 attributes (2 per edge), 0 were given",
        ),
        (
            "1 0 1 2 3 4\n",
            Some("rev_pays"),
            "edge type merchant__rev_pays__account: its edges carry no data, and 4 values \
             were given",
        ),
        (NEW_PAYS, None, "name it with --edge-type"),
    ] {
        let out = add(text, edge_type);
        assert!(!out.status.success(), "{text:?} was taken");
        assert!(
            stderr(&out).contains(expected),
            "{text:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(
        sidecar.sidecarctl_json(&["graph", "checksum"]),
        start,
        "nothing changed"
    );
    for (text, edge_type) in [(NEW_PAYS, "pays"), ("1 0\n", "rev_pays")] {
        let out = add(text, Some(edge_type));
        assert!(out.status.success(), "{text:?}: {}", stderr(&out));
    }
    let served = sidecar.sidecarctl_json(&["graph", "checksum"]);
    assert_eq!(served["n_edges"], start["n_edges"].as_u64().unwrap() + 4);
    // Compacted, stopped cleanly and started again: the same graph.
    sidecar.sidecarctl_json(&["graph", "compact"]);
    assert!(sidecar.stop(), "the sidecar did not stop cleanly");
    let sidecar = TypedSidecar::serve(&solo, &[]);
    assert_eq!(
        sidecar.sidecarctl_json(&["graph", "checksum"])["checksum"],
        served["checksum"]
    );

    // Through the stream: `sidecar publish` refuses what does not fit,
    // a producer that does not check writes an entry the replicas skip.
    let redis = RedisServer::start();
    let url = redis.url();
    let follow = ["--updates-stream", "gnn:updates", "--updates-redis", &url];
    let replicas = [&a, &b].map(|data| TypedSidecar::serve(data, &follow));
    for (op, expected) in [
        (
            vec!["add-edges", "edges:pays=0,1", "data:pays=12.5,1,2,1.7e9"],
            "edge 0's time \"1.7e9\" is not an integer",
        ),
        (
            vec!["add-edges", "edges:pays=0,1"],
            "1 edges need 2 attributes (2 per edge), 0 were given",
        ),
        (
            vec!["add-edges", "edges:rev_pays=1,0", "data:pays=1,2,3,4"],
            "data:pays without edges:pays",
        ),
    ] {
        let out = typed::publish(&url, &a, &op);
        assert!(!out.status.success(), "{op:?} was published");
        assert!(stderr(&out).contains(expected), "{op:?}: {}", stderr(&out));
    }
    assert!(
        redis.command("XLEN gnn:updates").contains(":0"),
        "nothing appended"
    );
    assert!(!redis
        .command("XADD gnn:updates * op add_edges edges:pays \"0 1\" data:pays \"1 2 3 soon\"")
        .starts_with('-'));
    let pays: Vec<&str> = NEW_PAYS.split_whitespace().collect();
    let (pairs, values): (Vec<&[&str]>, Vec<&[&str]>) =
        pays.chunks(6).map(|edge| edge.split_at(2)).unzip();
    let edges = format!("edges:pays={}", pairs.concat().join(","));
    let data = format!("data:pays={}", values.concat().join(","));
    for op in [
        vec!["add-edges", edges.as_str(), data.as_str()],
        vec!["add-edges", "edges:rev_pays=1,0"],
    ] {
        let out = typed::publish(&url, &a, &op);
        assert!(out.status.success(), "{op:?}: {}", stderr(&out));
    }
    let converged = eventually(Duration::from_secs(30), || {
        replicas
            .iter()
            .all(|r| r.sidecarctl_json(&["graph", "checksum"])["checksum"] == served["checksum"])
    });
    assert!(converged, "the replicas did not reach the socket-fed graph");
    for replica in &replicas {
        assert_eq!(replica.metric("sidecar_updates_malformed_total"), 1.0);
    }
}

/// A graph call that asks for edge data gets each sampled edge's
/// attributes, weight and time in `edge_index`'s column order, per edge
/// type that carries them (docs/protocol.md, "Edge data"): the imported
/// edges and those added since, each row by (time, source id, input
/// position), repeated pairs each with its own data; an edge type without
/// data sends none, and a call that asks for none gets the same sample.
#[test]
fn a_call_that_asks_for_edge_data_gets_each_sampled_edge_s_own() {
    use protocol::client::CallRequest;
    use protocol::request::{EdgeColumns, GraphAsk};
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("payments");
    payments(&source);
    let data = dir.path().join("data");
    typed::import(&source, &data, &[]);
    let sidecar = TypedSidecar::serve(&data, &[]);
    let file = dir.path().join("pays.txt");
    std::fs::write(&file, NEW_PAYS).unwrap();
    let out = sidecar.sidecarctl(&[
        "graph",
        "add-edges",
        "--file",
        file.to_str().unwrap(),
        "--edge-type",
        "pays",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let client = sidecar.client();
    let schema = client.graph_schema().expect("a typed segment");
    assert_eq!(
        schema.describe(),
        "account (2 f32), merchant (ids); account__pays__merchant (2 attributes, a weight, \
         a time), merchant__rev_pays__account"
    );
    let call = |edge_data: EdgeColumns| {
        let ask = GraphAsk {
            target_type: 1,
            hops: 1,
            fanouts: vec![100, 100],
            edge_data,
        };
        let mut request = CallRequest::new(&[0, 1, 2]);
        request.graph = Some(&ask);
        request.timeout = Some(Duration::from_secs(10));
        client.call(&request)
    };
    let response = call(EdgeColumns::ALL).expect("a call asking for edge data");
    let tables = response
        .graph_tables_with_edge_data(1, EdgeColumns::ALL)
        .expect("a valid response with edge data");
    let (accounts, merchants) = (tables.node_ids(0), tables.node_ids(1));
    let index = tables.edge_index(0);
    let n = index.len() / 2;
    let (attrs, weights, times) = (
        tables.edge_attr(0),
        tables.edge_weight(0),
        tables.edge_time(0),
    );
    assert_eq!((attrs.len(), weights.len(), times.len()), (2 * n, n, n));
    let served: Vec<(u64, u64, Vec<f32>, f32, i64)> = (0..n)
        .map(|j| {
            (
                accounts[index[j] as usize],
                merchants[index[n + j] as usize],
                attrs[2 * j..2 * j + 2].to_vec(),
                weights[j],
                times[j],
            )
        })
        .collect();
    // Merchant by merchant (the order they were sampled for), each row by
    // time, then source id, then input position.
    let t = 1_700_000_000i64;
    let expected = vec![
        (0, 0, vec![1.0, 0.0], 1.0, t),
        (1, 0, vec![2.0, 1.0], 1.0, t + 10),
        (3, 1, vec![3.0, 0.0], 1.0, t - 1),
        (0, 1, vec![12.5, 1.0], 2.0, t),
        (0, 1, vec![7.5, 1.0], 1.0, t),
        (1, 2, vec![4.0, 1.0], 1.0, t),
        (2, 2, vec![3.0, 0.0], 2.0, t + 5),
    ];
    assert_eq!(served, expected);
    // pyarrow, from docs/protocol.md alone, reads the same in place.
    let (stdout, _) = tests::stack::run_ok(
        std::process::Command::new(tests::stack::python())
            .arg(tests::stack::repo_root().join("tests/python/read_typed_segment.py"))
            .arg(&sidecar.shm_name)
            .arg(response.slot_index().to_string()),
        "read_typed_segment.py",
    );
    let read: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        read["buffers_outside"], 0,
        "pyarrow copied a buffer: {read}"
    );
    assert_eq!(read["buffers_misaligned"], 0);
    let pays = "account__pays__merchant";
    assert_eq!(read["edge_attr"][pays], serde_json::json!(attrs));
    assert_eq!(read["edge_weight"][pays], serde_json::json!(weights));
    assert_eq!(read["edge_time"][pays], serde_json::json!(times));
    assert!(read["edge_attr"]
        .get("merchant__rev_pays__account")
        .is_none());
    // rev_pays carries nothing: no data table.
    assert!(tables.edge_attr(1).is_empty() && tables.edge_time(1).is_empty());
    assert!(tables.edge_data[1].is_none());
    // The same call without edge data: the same sample, no data tables.
    let plain = call(EdgeColumns::default()).unwrap();
    let plain = plain.graph_tables(1).unwrap();
    assert_eq!(plain.edge_index(0), index);
    assert!(plain.edge_data.iter().all(Option::is_none));
    // Times alone.
    let times_only = EdgeColumns {
        time: true,
        ..EdgeColumns::default()
    };
    let response = call(times_only).unwrap();
    let only = response.graph_tables_with_edge_data(1, times_only).unwrap();
    assert_eq!(only.edge_time(0), times);
    assert!(only.edge_attr(0).is_empty() && only.edge_weight(0).is_empty());
    assert!(sidecar.stop());
}

/// A one-type graph whose edges carry data states it in its segment's
/// header (docs/protocol.md, section 2.4) and answers a call that asks for
/// it in the subgraph layout, its data table located by a directory of
/// its own (section 4.5): the pair `(a, b)` of its edge list is PyG's edge
/// `b -> a` with that pair's data, a repeated pair's edges each with their
/// own, the row by time; a column its edges do not carry is refused by
/// name.
#[test]
fn a_one_type_graph_s_call_gets_its_edge_data_in_the_subgraph_layout() {
    use protocol::client::CallRequest;
    use protocol::request::{EdgeColumns, GraphAsk};
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("one");
    std::fs::create_dir_all(&source).unwrap();
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(source.join(name), bytes).unwrap();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    write(
        "features.f32",
        f32s(&[0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 3.0, 3.0]),
    );
    let pairs: [u32; 8] = [0, 1, 0, 2, 1, 2, 0, 1];
    write(
        "edges.u32",
        pairs.iter().flat_map(|x| x.to_le_bytes()).collect(),
    );
    write(
        "edge_attr.f32",
        f32s(&[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]),
    );
    write(
        "edge_time.i64",
        [30i64, 10, 5, 20]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect(),
    );
    let meta = serde_json::json!({
        "num_nodes": 4, "num_edges": 4, "feature_dim": 2,
        "edge_data": {"attrs": "edge_attr.f32", "attr_dim": 2, "time": "edge_time.i64"},
    });
    std::fs::write(source.join("meta.json"), meta.to_string()).unwrap();
    let data = dir.path().join("data");
    typed::import(&source, &data, &[]);
    let sidecar = TypedSidecar::serve(&data, &[]);
    let client = sidecar.client();
    assert!(client.graph_schema().is_none(), "a one-type segment");
    assert_eq!(
        client.graph().unwrap().describe(),
        "node (2 f32); node__to__node (2 attributes, a time)"
    );
    let call = |edge_data: EdgeColumns| {
        let ask = GraphAsk {
            edge_data,
            ..GraphAsk::one_type(&[10])
        };
        let mut request = CallRequest::new(&[0]);
        request.graph = Some(&ask);
        request.timeout = Some(Duration::from_secs(10));
        client.call(&request)
    };
    let asked = EdgeColumns {
        attr: true,
        time: true,
        ..EdgeColumns::default()
    };
    let response = call(asked).expect("a call asking for edge data");
    let tables = response.graph_tables_with_edge_data(0, asked).unwrap();
    assert!(tables.subgraph_fanouts().is_some(), "the subgraph layout");
    let ids = tables.node_ids(0);
    let index = tables.edge_index(0);
    let n = index.len() / 2;
    let served: Vec<(u64, u64, Vec<f32>, i64)> = (0..n)
        .map(|j| {
            (
                ids[index[j] as usize],
                ids[index[n + j] as usize],
                tables.edge_attr(0)[2 * j..2 * j + 2].to_vec(),
                tables.edge_time(0)[j],
            )
        })
        .collect();
    // Node 0's row: the pairs (0, 2), (0, 1) twice, by time.
    assert_eq!(
        served,
        [
            (2, 0, vec![2.0, 2.0], 10),
            (1, 0, vec![4.0, 4.0], 20),
            (1, 0, vec![1.0, 1.0], 30),
        ]
    );
    let weight = EdgeColumns {
        weight: true,
        ..EdgeColumns::default()
    };
    let refused = call(weight).expect_err("a weight its edges do not carry");
    assert!(
        refused.to_string().contains(
            "EDGE_WEIGHT (0x80): a weight per edge, which no edge type of this graph carries"
        ),
        "{refused}"
    );
    assert!(sidecar.stop());
}
