//! Temporal sampling (docs/protocol.md, "Temporal sampling"): a graph
//! call with a seed time per target (`SEED_TIME`) samples each target's
//! own tree and no edge later than its seed time, at every hop, uniformly
//! or, with `TEMPORAL_LAST`, the most recent `fanout` valid edges, as PyG's
//! `NeighborLoader(time_attr=..., temporal_strategy=...)` samples on its
//! edges' times. The served subgraph (every row, every edge, their order)
//! is the model tooling's `common.sample` with the same seed times
//! (`gnn-worker/model/common.py`: PyG's rules rebuilt in Python, pyg-lib
//! not installing here); edges added later than every seed time change
//! nothing. Real `sidecar import`, `sidecar serve` and `sidecarctl` on cora
//! with seeded times (`tests/python/edge_datasets.py`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use protocol::client::{CallError, CallRequest, RingClient};
use protocol::request::{EdgeColumns, GraphAsk, SeedTimes};
use tests::stack::{process_dir, python, repo_root, run_ok, shipped_cora};
use tests::typed::{self, TypedSidecar};

/// cora with 3 attributes, a weight and a time (0 .. 99) per edge.
fn cora_with_times(tag: &str) -> PathBuf {
    let out = process_dir(tag).join("cora-times");
    run_ok(
        Command::new(python())
            .arg(repo_root().join("tests/python/edge_datasets.py"))
            .arg("cora")
            .arg(shipped_cora())
            .arg(&out),
        "tests/python/edge_datasets.py cora",
    );
    out
}

/// A sidecar of `dataset` whose caps cover cora (largest degree 168),
/// with nothing pinned in L1 (`--warm-up 0`): a temporal sample's
/// repeated rows are fetched cold, from the store.
fn sidecar(dataset: &Path) -> TypedSidecar {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    typed::import(dataset, &data, &[]);
    let sidecar = TypedSidecar::serve(&data, &["--warm-up", "0"]);
    // The data directory outlives this function with the sidecar.
    std::mem::forget(dir);
    sidecar
}

/// The served subgraph: node ids in row order, and each edge as (source
/// id, destination id, source row, destination row, time).
#[derive(Debug, PartialEq)]
struct Subgraph {
    nodes: Vec<u64>,
    edges: Vec<(u64, u64, i64, i64, i64)>,
}

fn call(
    client: &RingClient,
    targets: &[u64],
    fanouts: &[u32],
    seed: Option<&SeedTimes>,
) -> Result<Subgraph, CallError> {
    let asked = EdgeColumns {
        time: true,
        ..EdgeColumns::default()
    };
    let ask = GraphAsk {
        edge_data: asked,
        ..GraphAsk::one_type(fanouts)
    };
    let mut request = CallRequest::new(targets);
    request.graph = Some(&ask);
    request.seed_times = seed;
    request.timeout = Some(Duration::from_secs(10));
    let response = client.call(&request)?;
    let tables = response.graph_tables_with_edge_data(0, asked).unwrap();
    let ids = tables.node_ids(0).to_vec();
    let index = tables.edge_index(0);
    let n = index.len() / 2;
    let times = tables.edge_time(0);
    assert_eq!(times.len(), n, "a time per edge");
    let edges = (0..n)
        .map(|j| {
            let (s, d) = (index[j], index[n + j]);
            (ids[s as usize], ids[d as usize], s, d, times[j])
        })
        .collect();
    Ok(Subgraph { nodes: ids, edges })
}

/// `common.sample` of the tooling on `dataset` with every source at every
/// hop (`fanouts` None: -1) or, with `last`, the most recent `fanouts`.
fn tooling(dataset: &Path, targets: &[u64], fanouts: &[i64], seed: &SeedTimes) -> Subgraph {
    let script = format!(
        r#"
import json, sys
sys.path.insert(0, {model_dir:?})
from common import Graph, ONE_EDGE_TYPE, ONE_TYPE, sample
ds = Graph({dataset:?}, labels=False)
n_id, edge_index, _, _ = sample(ds, ONE_TYPE, {targets:?}, {{ONE_EDGE_TYPE: {fanouts:?}}}, None,
                                seed_times={times:?}, strategy={strategy:?})
ids = n_id[ONE_TYPE].tolist()
ei = edge_index[ONE_EDGE_TYPE].tolist()
t = edge_index.data["time"][ONE_EDGE_TYPE].tolist()
print(json.dumps({{"nodes": ids, "edges": [[ids[s], ids[d], s, d, tt] for s, d, tt in zip(ei[0], ei[1], t)]}}))
"#,
        model_dir = repo_root().join("gnn-worker/model").display().to_string(),
        dataset = dataset.display().to_string(),
        times = seed.times,
        strategy = if seed.last { "last" } else { "uniform" },
    );
    let (stdout, _) = run_ok(
        Command::new(python()).arg("-c").arg(script),
        "common.sample",
    );
    let out: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    Subgraph {
        nodes: serde_json::from_value(out["nodes"].clone()).unwrap(),
        edges: out["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let v: Vec<i64> = serde_json::from_value(e.clone()).unwrap();
                (v[0] as u64, v[1] as u64, v[2], v[3], v[4])
            })
            .collect(),
    }
}

/// Each tree's edges are no later than its target's seed time: the rows
/// of each tree, followed from its target.
fn assert_no_edge_after_its_seed_time(sub: &Subgraph, targets: &[u64], seed: &SeedTimes) {
    let mut tree = vec![usize::MAX; sub.nodes.len()];
    for (t, _) in targets.iter().enumerate() {
        tree[t] = t;
    }
    for &(_, _, s, d, time) in &sub.edges {
        let owner = tree[d as usize];
        assert!(owner != usize::MAX, "an edge into a row no tree reached");
        assert!(
            time <= seed.times[owner],
            "an edge of time {time} in the tree of seed time {}",
            seed.times[owner]
        );
        tree[s as usize] = owner;
    }
}

#[test]
fn temporal_calls_sample_as_pyg_does_and_later_edges_change_nothing() {
    let dataset = cora_with_times("temporal");
    let sidecar = sidecar(&dataset);
    let client = sidecar.client();
    // Target 1358 (degree 168) twice at two times, a node of degree 5.
    let targets = [1358u64, 1358, 1701, 35];
    let seed = SeedTimes {
        times: vec![40, 90, 60, 99],
        last: false,
    };
    // Covering fanouts: every valid source, uniform or not.
    let served = call(&client, &targets, &[168, 168], Some(&seed)).expect("a temporal call");
    assert_eq!(served, tooling(&dataset, &targets, &[-1, -1], &seed));
    assert_no_edge_after_its_seed_time(&served, &targets, &seed);
    // Four trees: the repeated target has a row in each of its two.
    assert_eq!(served.nodes[..4], targets);
    let untimed = call(&client, &targets, &[168, 168], None).unwrap();
    assert!(
        untimed.edges.len() > served.edges.len(),
        "the seed times leave edges out"
    );
    // 'last': exactly the most recent valid sources, at any fanouts.
    let last = SeedTimes {
        last: true,
        ..seed.clone()
    };
    let recent = call(&client, &targets, &[3, 2], Some(&last)).unwrap();
    assert_eq!(recent, tooling(&dataset, &targets, &[3, 2], &last));
    assert_no_edge_after_its_seed_time(&recent, &targets, &last);

    // Edges later than every seed time, added while serving: the same
    // subgraphs.
    let future = dataset.with_file_name("future.txt");
    std::fs::write(
        &future,
        "7 1358 0 0 0 1 500\n8 1701 0 0 0 1 400\n9 35 0 0 0 1 100\n35 7 0 0 0 1 100\n",
    )
    .unwrap();
    let out = sidecar.sidecarctl(&[
        "graph",
        "add-edges",
        "--edge-type",
        "node__to__node",
        "--file",
        future.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        call(&client, &targets, &[168, 168], Some(&seed)).unwrap(),
        served
    );
    assert_eq!(
        call(&client, &targets, &[3, 2], Some(&last)).unwrap(),
        recent
    );
    let now = call(&client, &targets, &[168, 168], None).unwrap();
    assert!(
        now.edges.len() > untimed.edges.len(),
        "the later edges are there"
    );
}

#[test]
fn a_temporal_call_the_graph_cannot_serve_is_refused_by_name() {
    // cora without times.
    let sidecar = sidecar(&shipped_cora());
    let client = sidecar.client();
    let seed = SeedTimes {
        times: vec![10],
        last: false,
    };
    let ask = GraphAsk::one_type(&[5, 5]);
    let mut request = CallRequest::new(&[1]);
    request.graph = Some(&ask);
    request.seed_times = Some(&seed);
    let err = client.call(&request).unwrap_err().to_string();
    assert!(
        err.contains(
            "request flag SEED_TIME (0x200): no edge type the request samples carries a time"
        ),
        "{err}"
    );
    // One seed time per target, checked before anything is sent.
    let two = [1u64, 2];
    let mut request = CallRequest::new(&two);
    request.graph = Some(&ask);
    request.seed_times = Some(&seed);
    let err = client.call(&request).unwrap_err().to_string();
    assert!(err.contains("1 seed times for 2 targets"), "{err}");
}
