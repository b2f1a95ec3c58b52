//! pyarrow, in its own process, maps the segment file from /dev/shm and
//! decodes a published response with every buffer inside its mapping; its
//! values equal what arrow-rs decodes from the same slot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use protocol::{CallRequest, ClientOptions, RingClient};
use tests::{unique_name, verify_response, ServerProcess};

const SERVER: &str = env!("CARGO_BIN_EXE_ring-test-server");

/// The project venv's Python (`scripts/setup.sh` creates it), or $GNN_PYTHON.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("GNN_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = tests::stack::repo_root().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/setup.sh to create the project venv (pyarrow, numpy)",
        venv.display()
    );
    venv
}

/// What tests/python/read_segment.py, in its own process, reads of slot
/// `slot` of segment `name`.
fn read_segment(name: &str, slot: usize) -> serde_json::Value {
    let script = tests::stack::repo_root().join("tests/python/read_segment.py");
    let output = Command::new(python())
        .arg(&script)
        .arg(name)
        .arg(slot.to_string())
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "read_segment.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn pyarrow_decodes_a_response_in_place_from_the_segment_file() {
    let name = unique_name("pyarrow");
    let server = ServerProcess::start(
        Path::new(SERVER),
        &["--name".into(), name.clone(), "--dim".into(), "24".into()],
    )
    .unwrap();
    let client = RingClient::attach(&name, ClientOptions::default()).unwrap();
    let targets = [5u64, 17, tests::UNKNOWN_FROM + 1];
    let mut request = CallRequest::new(&targets);
    request.fanouts = [4, 3];
    request.timeout = Some(Duration::from_secs(5));
    // Hold the response: the slot stays PUBLISHED while Python reads it.
    let response = client.call(&request).unwrap();
    let tables = response.tables().unwrap();
    verify_response(&tables, &targets, 24, false).unwrap();

    let out = read_segment(&name, response.slot_index());

    assert_eq!(out["state_published"], true);
    assert_eq!(out["status"], 0);
    assert_eq!(out["feature_dim"], 24);
    assert_eq!(out["layout_version"], protocol::LAYOUT_VERSION.to_string());
    // Zero copy on the Python side too: every non-empty buffer (ids,
    // features, tiers, bitmaps, row indices) lies inside the mapping.
    assert_eq!(out["buffers_outside"], 0, "pyarrow copied a buffer: {out}");
    assert_eq!(out["buffers_misaligned"], 0);
    assert!(out["buffers_inside"].as_u64().unwrap() >= 11);
    assert_eq!(out["features_inside"], true);

    // pyarrow reads exactly what arrow-rs reads.
    let as_u64s = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let as_i32s = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() as i32)
            .collect()
    };
    assert_eq!(as_u64s(&out["node_ids"]), tables.node_ids());
    assert_eq!(as_u64s(&out["target_ids"]), tables.target_ids());
    assert_eq!(as_i32s(&out["target_row"]), tables.target_rows());
    assert_eq!(as_i32s(&out["hop1_rows"]), tables.hop1_rows());
    assert_eq!(as_i32s(&out["hop2_rows"]), tables.hop2_rows());
    let features: Vec<f32> = out["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(features, tables.features());
    let fallback: Vec<bool> = out["fallback"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_bool().unwrap())
        .collect();
    assert_eq!(
        fallback,
        (0..tables.n_nodes())
            .map(|r| tables.fallback(r))
            .collect::<Vec<_>>()
    );
    assert!(
        fallback.iter().any(|&f| f),
        "the unknown target's row is flagged"
    );

    drop(tables);
    drop(response);
    drop(client);
    server.stop().unwrap();
}

/// The subgraph layout through pyarrow: the three tables decode in place,
/// and the edge table's `edge_index` values are PyG's [2, E] matrix, equal
/// to what arrow-rs reads.
#[test]
fn pyarrow_reads_a_subgraph_response_in_place() {
    let name = unique_name("pyarrow-subgraph");
    let server = ServerProcess::start(
        Path::new(SERVER),
        &["--name".into(), name.clone(), "--dim".into(), "8".into()],
    )
    .unwrap();
    let client = RingClient::attach(&name, ClientOptions::default()).unwrap();
    let targets = [5u64, 17, 5, tests::UNKNOWN_FROM + 1];
    let ask = protocol::request::GraphAsk::one_type(&[3, 2, 2]);
    let mut request = CallRequest::new(&targets);
    request.graph = Some(&ask);
    request.timeout = Some(Duration::from_secs(5));
    let response = client.call(&request).unwrap();
    let tables = response.graph_tables(0).unwrap();
    tests::verify_subgraph_response(&tables, &targets, 8, &[3, 2, 2], false).unwrap();

    let out = read_segment(&name, response.slot_index());
    assert_eq!(out["hops"], 3);
    assert_eq!(out["buffers_outside"], 0, "pyarrow copied a buffer: {out}");
    assert_eq!(out["buffers_misaligned"], 0);
    assert_eq!(out["edge_index_inside"], true);
    let rows: Vec<Vec<i64>> = serde_json::from_value(out["edge_index"].clone()).unwrap();
    let (src, dst) = tables
        .edge_index(0)
        .split_at(tables.edge_index(0).len() / 2);
    assert_eq!((rows[0].as_slice(), rows[1].as_slice()), (src, dst));
    let counts: Vec<i64> = serde_json::from_value(out["num_sampled_nodes"].clone()).unwrap();
    assert_eq!(counts, tables.sampled_nodes(0));
    let counts: Vec<i64> = serde_json::from_value(out["num_sampled_edges"].clone()).unwrap();
    assert_eq!(counts, tables.sampled_edges(0));
    let ids: Vec<u64> = serde_json::from_value(out["node_ids"].clone()).unwrap();
    assert_eq!(ids, tables.node_ids(0));

    drop(tables);
    drop(response);
    drop(client);
    server.stop().unwrap();
}
