//! Nodes and edges added while serving: visible to new requests, invisible
//! to requests already holding a snapshot, never torn, and preserved by
//! compaction.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use protocol::payload::schema::target_status;
use sidecar::graph::dataset::{import_graph, INDEX_FILE};
use sidecar::graph::{CsrIndex, LiveGraph, NeighborSource, Sampler};

fn cora() -> (tempfile::TempDir, PathBuf, LiveGraph) {
    let data = tests::stack::dataset("cora");
    let dir = tempfile::tempdir().unwrap();
    import_graph(&data, dir.path(), false, 1).unwrap();
    let path = dir.path().join(INDEX_FILE);
    let graph = LiveGraph::new(CsrIndex::open(&path).unwrap());
    (dir, path, graph)
}

#[test]
fn a_new_user_becomes_servable_without_a_restart() {
    let (_dir, _path, graph) = cora();
    let before = graph.snapshot();
    let new_user = 2708u64;
    let mut sampler = Sampler::default();
    let s = sampler.sample(&*before, &[new_user], [20, 10], 1);
    assert_eq!(s.status[0], target_status::UNKNOWN_NODE);

    // The new user interacts with two existing nodes.
    let stats = graph
        .add_edges(&[(new_user, 0), (new_user, 1358)], true)
        .unwrap();
    assert_eq!(stats.edges_added, 4, "two edges, both directions");
    assert_eq!(stats.n_nodes, 2709);
    let after = graph.snapshot();
    let s = sampler.sample(&*after, &[new_user], [20, 10], 1);
    assert_eq!(s.status[0], target_status::OK);
    assert_eq!(s.hop1_count[0], 2);
    let hop1: BTreeSet<u64> = s.hop1_rows[..2]
        .iter()
        .map(|&r| s.nodes[r as usize])
        .collect();
    assert_eq!(hop1, BTreeSet::from([0, 1358]));
    // Reverse edges: the new user is now among node 0's neighbours.
    assert!(after.neighbors(0).contains(&new_user));
    assert_eq!(after.degree(1358), Some(169));

    // A request that loaded the old snapshot still sees the old graph.
    assert_eq!(before.degree(new_user), None);
    assert_eq!(before.degree(1358), Some(168));
    assert!(after.generation() > before.generation());
}

#[test]
fn duplicate_and_existing_edges_are_ignored_and_isolated_nodes_can_be_added() {
    let (_dir, _path, graph) = cora();
    let existing = graph.snapshot().base().neighbors(0)[0];
    let stats = graph
        .add_edges(&[(0, u64::from(existing)), (5, 5), (0, 9), (0, 9)], false)
        .unwrap();
    assert_eq!(stats.edges_added, 1, "only 0 -> 9 is new");
    assert_eq!(stats.edges_ignored, 3);
    let stats = graph.add_nodes(&[3000]).unwrap();
    assert_eq!(stats.n_nodes, 3001);
    let snapshot = graph.snapshot();
    assert_eq!(snapshot.degree(3000), Some(0), "known, isolated");
    assert_eq!(snapshot.degree(3001), None);
    assert!(graph.add_edges(&[(0, u64::from(u32::MAX))], false).is_err());
    // Ids stay dense: a mistyped id far past the end is refused, naming it.
    let far = 3001 + sidecar::graph::live::MAX_ID_GROWTH;
    let err = graph.add_nodes(&[far]).unwrap_err().to_string();
    assert!(
        err.contains(&far.to_string()) && err.contains("dense"),
        "{err}"
    );
    assert_eq!(graph.snapshot().n_nodes(), 3001, "nothing was added");
    graph
        .add_nodes(&[far - 1])
        .expect("just within the growth bound");
}

#[test]
fn concurrent_samplers_never_see_a_torn_update() {
    // Node 7 gains one new neighbour per update (ids 5000, 5001, ...).
    // A snapshot of generation g must show exactly the base row plus the
    // first g of them, whatever the interleaving.
    let (_dir, _path, graph) = cora();
    let graph = Arc::new(graph);
    let base: BTreeSet<u64> = graph.snapshot().neighbors(7).into_iter().collect();
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|seed| {
            let (graph, stop, base) = (graph.clone(), stop.clone(), base.clone());
            let checks = checks.clone();
            std::thread::spawn(move || {
                let mut sampler = Sampler::default();
                let mut checked = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let snapshot = graph.snapshot();
                    let g = snapshot.generation();
                    let mut expected = base.clone();
                    expected.extend((0..g).map(|k| 5000 + k));
                    let s = sampler.sample(&*snapshot, &[7], [500, 1], seed + checked);
                    let c = s.hop1_count[0] as usize;
                    let got: BTreeSet<u64> = s.hop1_rows[..c]
                        .iter()
                        .map(|&r| s.nodes[r as usize])
                        .collect();
                    assert_eq!(got, expected, "generation {g}");
                    checked += 1;
                    checks.fetch_add(1, Ordering::Relaxed);
                }
                checked
            })
        })
        .collect();
    for k in 0..200u64 {
        // Let the readers check between updates, so they overlap them
        // whatever the scheduler does.
        let seen = checks.load(Ordering::Relaxed);
        while checks.load(Ordering::Relaxed) < seen + 2 {
            std::thread::yield_now();
        }
        graph.add_edges(&[(7, 5000 + k)], false).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let total: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(total >= 400, "readers checked between all updates");
    assert_eq!(graph.snapshot().degree(7), Some(base.len() as u32 + 200));
}

#[test]
fn compaction_keeps_every_edge_and_empties_the_delta() {
    let (_dir, path, graph) = cora();
    graph
        .add_edges(&[(2708, 0), (2709, 2708), (1, 2)], true)
        .unwrap();
    let before = graph.snapshot();
    let old_held = graph.snapshot();
    let stats = graph.compact(&path).unwrap();
    let after = graph.snapshot();
    assert_eq!(after.added_edges(), 0);
    assert_eq!(after.n_nodes(), before.n_nodes());
    assert_eq!(after.n_edges(), before.n_edges());
    assert_eq!(stats.n_edges, before.n_edges());
    for node in 0..before.n_nodes() {
        let mut a = before.neighbors(node);
        let mut b = after.neighbors(node);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "node {node}");
    }
    // The compacted file is a valid index on its own (a restart maps it).
    let reopened = CsrIndex::open(&path).unwrap();
    assert_eq!(reopened.n_edges(), before.n_edges());
    // A request holding the pre-compaction snapshot still reads its mapping.
    assert!(old_held.neighbors(2708).contains(&0));
}
