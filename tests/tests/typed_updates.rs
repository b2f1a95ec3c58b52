//! Updates of a typed graph while serving (docs/updates.md, "Typed
//! graphs"): a node of a type with its row and edges of several edge types
//! added through the admin socket and through the update stream, answered
//! in the next call; replicas following one stream converge, a restarted
//! one replays it; what names a type, a relation or a width the graph
//! lacks is refused by name (admin, `sidecar publish`) or skipped whole
//! (the stream). A real `sidecar serve` on the shipped OpenFlights, a real
//! redis-server, the Rust ring client.

use std::time::Duration;

use protocol::graph_schema::GraphSchema;
use protocol::request::GraphAsk;
use protocol::{CallRequest, RingClient};
use tests::eventually;
use tests::redis::RedisServer;
use tests::stack::dataset;
use tests::typed::{self, TypedSidecar};

/// A new airport's 11 features.
const ROW: [f32; 11] = [0.5, -1.0, 2.0, 0.25, 3.0, -0.5, 1.5, 0.0, 4.0, -2.0, 0.125];
/// The first airport id past OpenFlights' 7,698.
const NEW_AIRPORT: u64 = 7698;

fn row_text(row: &[f32]) -> String {
    row.iter().map(f32::to_string).collect::<Vec<_>>().join(",")
}

/// One hop over every edge type at a covering fanout, from `target_type`.
fn one_hop(schema: &GraphSchema, target_type: &str) -> GraphAsk {
    GraphAsk {
        target_type: schema.node_type(target_type).unwrap() as u32,
        hops: 1,
        fanouts: vec![2048; schema.edge_types.len()],
        edge_data: Default::default(),
    }
}

fn call(client: &RingClient, targets: &[u64], ask: &GraphAsk) -> protocol::Response {
    let mut request = CallRequest::new(targets);
    request.graph = Some(ask);
    request.timeout = Some(Duration::from_secs(10));
    client.call(&request).expect("a typed call")
}

/// The edge type whose key or relation is `name`.
fn edge(schema: &GraphSchema, name: &str) -> usize {
    (0..schema.edge_types.len())
        .find(|&e| schema.edge_key(e) == name || schema.edge_types[e].relation == name)
        .unwrap_or_else(|| panic!("no edge type {name}"))
}

/// The new airport served as added: its row first in its type, not a
/// fallback; a route from 3482 and airlines 0 and 5 serving it; and
/// airline 5's row `airline_row`, when given.
fn assert_new_airport_is_served(client: &RingClient, airline_row: Option<[f32; 3]>) {
    let schema = client.graph_schema().unwrap();
    let response = call(client, &[NEW_AIRPORT], &one_hop(&schema, "airport"));
    let tables = response.graph_tables(0).unwrap();
    let (airport, airline) = (
        schema.node_type("airport").unwrap(),
        schema.node_type("airline").unwrap(),
    );
    assert_eq!(tables.node_ids(airport), vec![NEW_AIRPORT, 3482]);
    assert_eq!(&tables.features(airport)[..11], &ROW);
    assert!(!tables.fallback(airport, 0), "the new row is stored");
    assert_eq!(tables.node_ids(airline), vec![0, 5]);
    // Local ids: the source first row, the destination second.
    assert_eq!(tables.edge_index(edge(&schema, "route")), vec![1, 0]);
    assert_eq!(tables.edge_index(edge(&schema, "serves")), vec![0, 1, 0, 0]);
    if let Some(row) = airline_row {
        assert_eq!(&tables.features(airline)[3..6], &row, "airline 5's new row");
    }
}

#[test]
fn a_typed_node_added_through_the_admin_socket_is_answered_in_the_next_call() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    typed::import(&dataset("openflights"), &data, &[]);
    let sidecar = TypedSidecar::serve(&data, &[]);
    let client = sidecar.client();
    let before = sidecar.sidecarctl_json(&["graph", "checksum"]);
    let row = row_text(&ROW);
    let new_id = NEW_AIRPORT.to_string();
    // What the graph lacks is refused by name, and nothing changes.
    for (args, expected) in [
        (
            vec!["graph", "add-node", &new_id, "--type", "hotel"],
            "unknown node type \"hotel\": this graph's node types are airport, airline, \
             country, plane",
        ),
        (
            vec![
                "graph",
                "add-node",
                &new_id,
                "--type",
                "airport",
                "--features",
                "1,2,3",
            ],
            "rows of node type airport have 44 (11 f32 values)",
        ),
        (
            vec![
                "graph",
                "add-node",
                &new_id,
                "--type",
                "airport",
                "--features",
                &row,
                "--typed-edges",
                "flies_to=3482,7698",
            ],
            "unknown edge type \"flies_to\"",
        ),
        (
            vec!["graph", "add-node", "9000000", "--type", "country"],
            "country id 9000000 lies 1048576 or more ids past the largest country id 260",
        ),
        (
            vec!["invalidate", "--type", "country", "1"],
            "node type country has no features",
        ),
    ] {
        let out = sidecar.sidecarctl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert_eq!(sidecar.sidecarctl_json(&["graph", "checksum"]), before);
    // The node, its row and its edges of two edge types, in one snapshot.
    let added = sidecar.sidecarctl_json(&[
        "graph",
        "add-node",
        &new_id,
        "--type",
        "airport",
        "--features",
        &row,
        "--typed-edges",
        "route=3482,7698",
        // Route edges carry 4 attributes (routes, codeshare, stops,
        // equipment).
        "--edge-data",
        "route=1,0,0,2",
        "--typed-edges",
        "airline__serves__airport=0,7698,5,7698",
    ]);
    assert_eq!(added["nodes_added"], 1, "{added}");
    assert_eq!(added["edges_added"], 3, "{added}");
    assert_new_airport_is_served(&client, None);
    // Edges of one edge type from a file; a present one is ignored.
    let add_edges = |edge_type: &str, lines: &str| {
        let file = dir.path().join("edges.txt");
        std::fs::write(&file, lines).unwrap();
        let file = file.to_str().unwrap();
        sidecar.sidecarctl_json(&[
            "graph",
            "add-edges",
            "--edge-type",
            edge_type,
            "--file",
            file,
        ])
    };
    let added = add_edges("rev_serves", "# airport airline\n7698 0\n7698 5\n");
    assert_eq!(added["edges_added"], 2, "{added}");
    let after = sidecar.sidecarctl_json(&["graph", "checksum"]);
    assert_ne!(after["checksum"], before["checksum"]);
    assert_eq!(after["n_nodes"], before["n_nodes"].as_u64().unwrap() + 1);
    assert_eq!(after["n_edges"], before["n_edges"].as_u64().unwrap() + 5);
    let status = sidecar.sidecarctl_json(&["status"]);
    assert_eq!(status["n_nodes"], after["n_nodes"]);
    let invalidated = sidecar.sidecarctl_json(&["invalidate", "--type", "airport", &new_id]);
    assert_eq!(invalidated["invalidated"], 1, "{invalidated}");
    assert_new_airport_is_served(&client, None);
    // Compacted into the typed index, then one more edge that a clean stop
    // compacts: a restart serves both.
    let compacted = sidecar.sidecarctl_json(&["graph", "compact"]);
    assert_eq!(compacted["n_edges"], after["n_edges"], "{compacted}");
    assert_eq!(sidecar.sidecarctl_json(&["graph", "checksum"]), after);
    let added = add_edges("route", "7698 5 1 0 0 2\n");
    assert_eq!(added["edges_added"], 1, "{added}");
    let served = sidecar.sidecarctl_json(&["graph", "checksum"]);
    drop(client);
    assert!(sidecar.stop(), "the typed sidecar did not stop cleanly");
    assert!(!data.join("typed-graph.tmp").exists() && !data.join("typed-graph.old").exists());
    let restarted = TypedSidecar::serve(&data, &[]);
    let mut sum = restarted.sidecarctl_json(&["graph", "checksum"]);
    assert_eq!(sum["checksum"], served["checksum"]);
    assert_eq!(sum["n_edges"], served["n_edges"]);
    sum["generation"] = served["generation"].clone();
    assert_eq!(sum, served, "the same graph, generation and position");
    assert_new_airport_is_served(&restarted.client(), None);
}

#[test]
fn typed_replicas_following_the_stream_converge_and_skip_what_they_cannot_apply() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (dir.path().join("a"), dir.path().join("b"));
    for data in [&data_a, &data_b] {
        typed::import(&dataset("openflights"), data, &[]);
    }
    let follow = ["--updates-stream", "gnn:updates", "--updates-redis", &url];
    let a = TypedSidecar::serve(&data_a, &follow);
    let b = TypedSidecar::serve(&data_b, &follow);
    let start = a.sidecarctl_json(&["graph", "checksum"]);
    // `sidecar publish` refuses what the graph lacks, naming it, and
    // appends nothing.
    for (op, expected) in [
        (
            vec!["add-node", "hotel", "1"],
            "unknown node type \"hotel\"",
        ),
        (
            vec!["set-features", "airline", "5", "row=1,2"],
            "rows of node type airline have 12 (3 f32 values)",
        ),
        (
            vec!["add-edges", "edges:lands_at=1,2"],
            "unknown edge type \"lands_at\"",
        ),
        (
            vec!["add-edges", "1", "2"],
            "the data directory holds a typed graph",
        ),
    ] {
        let out = typed::publish(&url, &data_a, &op);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{op:?} was published");
        assert!(stderr.contains(expected), "{op:?}: {stderr}");
    }
    assert!(
        redis.command("XLEN gnn:updates").contains(":0"),
        "nothing appended"
    );
    // Operations of every kind, and entries no replica can apply, written
    // to the stream directly by a producer that does not check them.
    let ops = dir.path().join("ops.txt");
    std::fs::write(
        &ops,
        format!(
            "add-node airport {NEW_AIRPORT} row={} edges:route=3482,{NEW_AIRPORT} \
             data:route=1,0,0,2 \
             edges:serves=0,{NEW_AIRPORT},5,{NEW_AIRPORT}\n\
             add-edges edges:airport__rev_serves__airline={NEW_AIRPORT},0\n\
             set-features airline 5 row=0.5,0.25,2\n\
             invalidate airport 3482\n",
            row_text(&ROW)
        ),
    )
    .unwrap();
    let out = typed::publish(&url, &data_a, &["--file", ops.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for malformed in [
        "XADD gnn:updates * op add_node type hotel id 1",
        "XADD gnn:updates * op add_node id 5",
        "XADD gnn:updates * op add_edges edges:route 1",
        "XADD gnn:updates * op set_features type country id 1 row abcd",
    ] {
        assert!(!redis.command(malformed).starts_with('-'), "{malformed}");
    }
    let out = typed::publish(
        &url,
        &data_a,
        &["add-edges", "edges:route=7698,5", "data:route=1,1,0,3"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Both replicas apply everything, skip the same four entries, and serve
    // the same graph.
    let converged = eventually(Duration::from_secs(30), || {
        let sums = [&a, &b].map(|s| s.sidecarctl_json(&["graph", "checksum"]));
        sums[0] == sums[1] && sums[0]["n_edges"] == start["n_edges"].as_u64().unwrap() + 5
    });
    assert!(converged, "the replicas did not converge");
    for sidecar in [&a, &b] {
        assert_eq!(sidecar.metric("sidecar_updates_malformed_total"), 4.0);
        assert_new_airport_is_served(&sidecar.client(), Some([0.5, 0.25, 2.0]));
    }
    // A restarted replica replays the stream from its graph's position
    // (a's compacted: the position is in its typed index) and its stores':
    // the same graph, the same rows.
    let served = b.sidecarctl_json(&["graph", "checksum"]);
    let compacted = a.sidecarctl_json(&["graph", "compact"]);
    assert_eq!(compacted["n_edges"], served["n_edges"], "{compacted}");
    assert!(a.stop(), "replica a did not stop cleanly");
    let a = TypedSidecar::serve(&data_a, &follow);
    assert!(eventually(Duration::from_secs(30), || {
        a.sidecarctl(&["ready"]).status.success()
    }));
    assert_eq!(a.sidecarctl_json(&["graph", "checksum"]), served);
    assert_new_airport_is_served(&a.client(), Some([0.5, 0.25, 2.0]));
    // A replica following the stream takes changes from it only.
    let out = a.sidecarctl(&["graph", "add-node", "7699", "--type", "country"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("follows the update stream gnn:updates"));
}
