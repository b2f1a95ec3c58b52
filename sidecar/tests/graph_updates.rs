//! Nodes and edges added while serving: visible to new requests, invisible
//! to requests already holding a snapshot, never torn, and preserved by
//! compaction.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use protocol::payload::schema::target_status;
use sidecar::graph::dataset::{import_graph, INDEX_FILE};
use sidecar::graph::{
    CsrIndex, GraphUpdate, LiveGraph, NeighborSource, Sampler, TypedGraph, UpdateStats,
};

fn cora() -> (tempfile::TempDir, PathBuf, LiveGraph) {
    let data = tests::stack::dataset("cora");
    let dir = tempfile::tempdir().unwrap();
    import_graph(&data, dir.path(), false, 1).unwrap();
    let path = dir.path().join(INDEX_FILE);
    let graph = LiveGraph::new(TypedGraph::open_one_type(&path, 0).unwrap());
    (dir, path, graph)
}

/// The one-type graph's edges `(src, dst)`: `dst` becomes a neighbour of
/// `src` (and the reverse when `undirected`).
fn add_edges(
    graph: &LiveGraph,
    edges: &[(u64, u64)],
    undirected: bool,
) -> anyhow::Result<UpdateStats> {
    graph.update(GraphUpdate::one_type(&[], edges, undirected))
}

fn add_nodes(graph: &LiveGraph, ids: &[u64]) -> anyhow::Result<UpdateStats> {
    graph.update(GraphUpdate::one_type(ids, &[], false))
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
    let stats = add_edges(&graph, &[(new_user, 0), (new_user, 1358)], true).unwrap();
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
    assert!(after.sources(0, 0).contains(&new_user));
    assert_eq!(after.degree(1358), Some(169));

    // A request that loaded the old snapshot still sees the old graph.
    assert_eq!(before.degree(new_user), None);
    assert_eq!(before.degree(1358), Some(168));
    assert!(after.generation() > before.generation());
}

#[test]
fn duplicate_and_existing_edges_are_ignored_and_ids_past_the_end_fill_in() {
    let (_dir, _path, graph) = cora();
    let existing = graph.snapshot().sources(0, 0)[0];
    let stats = add_edges(&graph, &[(0, existing), (5, 5), (0, 9), (0, 9)], false).unwrap();
    assert_eq!(stats.edges_added, 1, "only 0 -> 9 is new");
    assert_eq!(stats.edges_ignored, 3);
    // One rule for ids past the end (docs/graph-index.md): the ids in
    // between become nodes without edges.
    let stats = add_nodes(&graph, &[3000]).unwrap();
    assert_eq!(stats.nodes_added, 293, "2708..=3000");
    assert_eq!(stats.n_nodes, 3001);
    let snapshot = graph.snapshot();
    assert_eq!(snapshot.degree(3000), Some(0), "a node, isolated");
    assert_eq!(snapshot.degree(2708), Some(0), "an id in between: a node");
    assert_eq!(snapshot.degree(3001), None);
    assert_eq!(snapshot.id_bound(0), 3001);
    let mut sampler = Sampler::default();
    let s = sampler.sample(&*snapshot, &[2900, 3001], [20, 10], 1);
    assert_eq!(s.status, [target_status::OK, target_status::UNKNOWN_NODE]);
    assert!(add_edges(&graph, &[(0, u64::from(u32::MAX))], false).is_err());
    // Ids stay dense: a mistyped id 2^20 or more past the largest id (3000)
    // is refused, naming it.
    use sidecar::graph::live::MAX_ID_GROWTH;
    let far = 3000 + MAX_ID_GROWTH;
    let err = add_nodes(&graph, &[far]).unwrap_err().to_string();
    assert!(
        err.contains(&far.to_string()) && err.contains("dense"),
        "{err}"
    );
    assert_eq!(graph.snapshot().n_nodes(), 3001, "nothing was added");
    assert_eq!(
        graph.snapshot().generation(),
        2,
        "a refused update does not count"
    );
    // 2^20 - 1 past is accepted, and the bound moves with the nodes.
    add_nodes(&graph, &[far - 1]).expect("2^20 - 1 past the largest id");
    assert_eq!(graph.snapshot().n_nodes(), far);
    add_nodes(&graph, &[far]).expect("now one past the largest id");
}

/// Nodes added past the end and edges between them: a compaction keeps the
/// digest, counts, generation and stream position of the graph before it,
/// and a restart maps the same graph.
#[test]
fn a_compaction_keeps_the_nodes_the_generation_and_the_digest() {
    let (_dir, path, graph) = cora();
    add_nodes(&graph, &[5000]).unwrap();
    add_edges(&graph, &[(5000, 1), (4000, 5000)], true).unwrap();
    let position = sidecar::graph::StreamPosition {
        ms: 1700000000000,
        seq: 3,
    };
    let outcomes = graph.apply(
        &[GraphUpdate::one_type(&[], &[(2, 3000)], false)],
        Some((position, 3)),
    );
    assert!(outcomes[0].is_ok());
    let before = graph.snapshot();
    assert_eq!(before.n_nodes(), 5001, "every id up to 5000");
    graph.compact().unwrap();
    let after = graph.snapshot();
    assert_eq!(after.delta_entries(), 0);
    assert_eq!(after.n_nodes(), before.n_nodes());
    assert_eq!(after.n_edges(), before.n_edges());
    assert_eq!(after.generation(), before.generation());
    assert_eq!(after.position(), position);
    assert_eq!(after.checksum(), before.checksum());
    for id in [2708u64, 2999, 3001, 4999] {
        assert_eq!(after.degree(id), Some(0), "{id} is a node without edges");
    }
    assert_eq!(after.degree(5000), Some(2));
    assert_eq!(after.sources(0, 2).last(), Some(&3000));
    assert_eq!(after.degree(5001), None);
    // A restart maps the compacted file: the same graph, no bitmap.
    assert!(!CsrIndex::open(&path).unwrap().header().has_known_bitmap());
    let restarted = LiveGraph::new(TypedGraph::open_one_type(&path, 0).unwrap()).snapshot();
    assert_eq!(restarted.checksum(), before.checksum());
    assert_eq!(restarted.n_nodes(), 5001);
    assert_eq!(restarted.generation(), before.generation());
    assert_eq!(restarted.position(), position);
    assert_eq!(restarted.degree(4500), Some(0));
}

/// The digest depends on the graph only: the same edges added in another
/// order, in other batches, compacted or not, give the same digest; one
/// edge more changes it.
#[test]
fn the_checksum_depends_on_the_graph_not_on_its_history() {
    let (_dir_a, _path_a, a) = cora();
    let (_dir_b, _path_b, b) = cora();
    assert_eq!(a.snapshot().checksum(), b.snapshot().checksum());
    let edges: Vec<(u64, u64)> = (0..300u64).map(|k| (k * 7 % 2708, 2708 + k % 50)).collect();
    add_edges(&a, &edges, true).unwrap();
    a.compact().unwrap();
    for chunk in edges.rchunks(7) {
        add_edges(&b, chunk, true).unwrap();
    }
    assert_eq!(a.snapshot().checksum(), b.snapshot().checksum());
    assert_eq!(a.snapshot().n_edges(), b.snapshot().n_edges());
    let stats = add_edges(&b, &[(2900, 0)], false).unwrap();
    // Ids 2758..=2900 become nodes (the largest was 2757).
    assert_eq!((stats.nodes_added, stats.edges_added), (143, 1));
    assert_ne!(a.snapshot().checksum(), b.snapshot().checksum());
}

/// Updates applied while a compaction builds are not lost: they are
/// replayed on the new base when it switches. Automatic compaction runs by
/// itself once the delta passes its threshold.
#[test]
fn updates_during_a_compaction_survive_it_and_the_graph_compacts_by_itself() {
    let data = tests::stack::dataset("cora");
    let dir = tempfile::tempdir().unwrap();
    import_graph(&data, dir.path(), false, 1).unwrap();
    let path = dir.path().join(INDEX_FILE);
    let graph =
        LiveGraph::with_auto_compact(TypedGraph::open_one_type(&path, 0).unwrap(), Some(200));
    let reference = LiveGraph::new(TypedGraph::open_one_type(&path, 0).unwrap());
    // Many small updates: the delta passes 200 entries several times over,
    // so compactions run in the background while updates keep coming.
    for k in 0..600u64 {
        let edge = [(k % 2708, (k * 31 + 5) % 2708)];
        add_edges(&graph, &edge, true).unwrap();
        add_edges(&reference, &edge, true).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let settled = || {
        let s = graph.snapshot();
        !graph.compacting() && s.delta_entries() + s.added_edges() < 200
    };
    while !settled() {
        assert!(
            std::time::Instant::now() < deadline,
            "compaction did not keep up"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        graph.compactions() >= 2,
        "{} compactions",
        graph.compactions()
    );
    let (got, want) = (graph.snapshot(), reference.snapshot());
    assert!(
        got.delta_entries() < want.delta_entries(),
        "compacted: {} delta entries, {} without compaction",
        got.delta_entries(),
        want.delta_entries()
    );
    assert_eq!(got.checksum(), want.checksum(), "no update lost or doubled");
    assert_eq!(got.n_edges(), want.n_edges());
    assert_eq!(got.generation(), want.generation());
    let on_disk = CsrIndex::open(&path).unwrap();
    assert!(
        on_disk.header().generation > 0,
        "a compaction rewrote the index"
    );
    assert!(on_disk.n_edges() > 10_556, "with added edges");
    assert_eq!(graph.snapshot().checksum(), reference.snapshot().checksum());
}

#[test]
fn concurrent_samplers_never_see_a_torn_update() {
    // Node 7 gains one new neighbour per update (ids 5000, 5001, ...).
    // A snapshot of generation g must show exactly the base row plus the
    // first g of them, whatever the interleaving.
    let (_dir, _path, graph) = cora();
    let graph = Arc::new(graph);
    let base: BTreeSet<u64> = graph.snapshot().sources(0, 7).into_iter().collect();
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
        add_edges(&graph, &[(7, 5000 + k)], false).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let total: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(total >= 400, "readers checked between all updates");
    assert_eq!(graph.snapshot().degree(7), Some(base.len() as u32 + 200));
}

#[test]
fn compaction_keeps_every_edge_and_empties_the_delta() {
    let (_dir, path, graph) = cora();
    add_edges(&graph, &[(2708, 0), (2709, 2708), (1, 2)], true).unwrap();
    let before = graph.snapshot();
    let old_held = graph.snapshot();
    let stats = graph.compact().unwrap();
    let after = graph.snapshot();
    assert_eq!(after.added_edges(), 0);
    assert_eq!(after.n_nodes(), before.n_nodes());
    assert_eq!(after.n_edges(), before.n_edges());
    assert_eq!(stats.n_edges, before.n_edges());
    for node in 0..before.n_nodes() {
        let mut a = before.sources(0, node);
        let mut b = after.sources(0, node);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "node {node}");
    }
    // The compacted file is a valid index on its own (a restart maps it).
    let reopened = CsrIndex::open(&path).unwrap();
    assert_eq!(reopened.n_edges(), before.n_edges());
    // A request holding the pre-compaction snapshot still reads its mapping.
    assert!(old_held.sources(0, 2708).contains(&0));
}

/// A target's sample depends on the graph alone: the same nodes whatever
/// else is in the batch, and whether the added edges lie in the delta or in
/// a compacted index.
#[test]
fn a_target_samples_the_same_neighbourhood_compacted_or_not_in_any_batch() {
    let (_dir_a, _path_a, a) = cora();
    let (_dir_b, _path_b, b) = cora();
    let edges: Vec<(u64, u64)> = (0..400u64)
        .map(|k| (k % 40, (k * 97 + 13) % 2708))
        .collect();
    add_edges(&a, &edges, true).unwrap();
    add_edges(&b, &edges, true).unwrap();
    a.compact().unwrap();
    let (sa, sb) = (a.snapshot(), b.snapshot());
    assert_eq!(sa.delta_entries(), 0);
    assert!(sb.delta_entries() > 0);
    let mut sampler = Sampler::default();
    let neighbourhood = |s: &sidecar::graph::Sampled, t: usize| -> Vec<u64> {
        let [f1, f2] = s.fanouts.map(|f| f as usize);
        let mut ids = vec![s.nodes[s.target_row[t] as usize]];
        for j in 0..s.hop1_count[t] as usize {
            ids.push(s.nodes[s.hop1_rows[t * f1 + j] as usize]);
            for k in 0..s.hop2_count[t * f1 + j] as usize {
                ids.push(s.nodes[s.hop2_rows[(t * f1 + j) * f2 + k] as usize]);
            }
        }
        ids
    };
    for target in 0..40u64 {
        let alone_a = sampler.sample(&*sa, &[target], [5, 3], 99);
        let alone_b = sampler.sample(&*sb, &[target], [5, 3], 99);
        let in_batch = sampler.sample(&*sb, &[1000, target, 7], [5, 3], 99);
        let want = neighbourhood(&alone_a, 0);
        assert!(want.len() > 1, "node {target} has sampled neighbours");
        assert_eq!(
            neighbourhood(&alone_b, 0),
            want,
            "node {target}: delta vs compacted"
        );
        assert_eq!(
            neighbourhood(&in_batch, 1),
            want,
            "node {target}: alone vs in a batch"
        );
    }
}
