//! The graph index built from the real datasets and from text edge lists,
//! refused when damaged, and sampled with the properties the sampler
//! promises.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use protocol::payload::schema::target_status;
use sidecar::graph::dataset::{import_graph, INDEX_FILE};
use sidecar::graph::{CsrIndex, FormatError, Sampled, Sampler};

/// The (src, dst) pairs of a dataset's edges.u32.
fn dataset_edges(dir: &Path) -> Vec<(u32, u32)> {
    let bytes = std::fs::read(dir.join("edges.u32")).unwrap();
    bytes
        .chunks_exact(8)
        .map(|c| {
            (
                u32::from_le_bytes(c[0..4].try_into().unwrap()),
                u32::from_le_bytes(c[4..8].try_into().unwrap()),
            )
        })
        .collect()
}

fn import_text(text: &str, undirected: bool) -> (tempfile::TempDir, CsrIndex) {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("edges.txt");
    std::fs::write(&list, text).unwrap();
    import_graph(&list, dir.path(), undirected, 3).unwrap();
    let index = CsrIndex::open(&dir.path().join(INDEX_FILE)).unwrap();
    (dir, index)
}

/// The datasets the repository ships (demo/data) are the ones their
/// `meta.json` describes: every data file's size and sha256, and a licence
/// and provenance beside them.
#[test]
fn every_shipped_dataset_matches_its_checksums() {
    for name in ["cora", "citeseer", "cora_ml"] {
        let data = tests::stack::dataset(name);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(data.join("meta.json")).unwrap())
                .unwrap();
        let files = meta["files"].as_object().expect("meta.json files");
        assert_eq!(files.len(), 4, "{name}: {files:?}");
        for (file, want) in files {
            let path = data.join(file);
            let bytes = std::fs::metadata(&path).unwrap().len();
            assert_eq!(Some(bytes), want["bytes"].as_u64(), "{name}/{file}");
            let out = std::process::Command::new("sha256sum")
                .arg(&path)
                .output()
                .expect("running sha256sum");
            let sum = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                sum.split_whitespace().next(),
                want["sha256"].as_str(),
                "{name}/{file}"
            );
        }
        for file in ["LICENCE", "PROVENANCE.md"] {
            assert!(data.join(file).is_file(), "{name}/{file}");
        }
    }
}

#[test]
fn every_dataset_imports_to_exactly_its_edge_list() {
    for name in ["cora", "citeseer", "cora_ml"] {
        let data = tests::stack::dataset(name);
        let out = tempfile::tempdir().unwrap();
        let stats = import_graph(&data, out.path(), false, 1).unwrap();
        let index = CsrIndex::open(&out.path().join(INDEX_FILE)).unwrap();
        let edges = dataset_edges(&data);
        assert_eq!(index.n_edges(), edges.len() as u64, "{name}");
        assert_eq!(
            stats.duplicates_dropped + stats.self_loops_dropped,
            0,
            "{name}"
        );
        let mut rebuilt = Vec::with_capacity(edges.len());
        for node in 0..index.n_nodes() {
            rebuilt.extend(index.neighbors(node).iter().map(|&v| (node, v)));
        }
        assert_eq!(
            rebuilt, edges,
            "{name}: CSR rows equal the sorted edge list"
        );
        if name == "cora" {
            assert_eq!(index.n_nodes(), 2708);
            assert_eq!(
                index.degree(1358),
                168,
                "cora's top node by degree (meta.json)"
            );
        }
    }
}

#[test]
fn a_text_edge_list_is_parsed_deduplicated_and_reversed() {
    let text = "# a comment\n0 1\n1 2   # trailing comment\n\n2 2\n0 1\n5 0\n";
    let (_dir, directed) = import_text(text, false);
    assert_eq!(directed.n_nodes(), 6);
    assert_eq!(directed.neighbors(0), &[1]);
    assert_eq!(directed.neighbors(1), &[2]);
    assert_eq!(directed.neighbors(2), &[] as &[u32], "self loop dropped");
    assert_eq!(directed.neighbors(5), &[0]);
    let (_dir, undirected) = import_text(text, true);
    assert_eq!(undirected.neighbors(0), &[1, 5]);
    assert_eq!(undirected.neighbors(1), &[0, 2]);
    assert_eq!(undirected.neighbors(2), &[1]);
    assert_eq!(undirected.n_edges(), 6);
    assert_eq!(undirected.graph_version(), 3);
}

#[test]
fn bad_edge_lists_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, expect) in [
        ("0 1\n1 x\n", ":2: node id \"x\""),
        ("0 1 2\n", ":1: expected `src dst`"),
        ("0 99999999999\n", ":1: node id \"99999999999\""),
        // The largest u32 is refused before 32 GiB are set aside for it.
        (
            "0 4294967295\n",
            "edge endpoint 4294967295: node ids must be below",
        ),
    ] {
        let list = dir.path().join("bad.txt");
        std::fs::write(&list, text).unwrap();
        let err = import_graph(&list, dir.path(), false, 1).unwrap_err();
        assert!(format!("{err:#}").contains(expect), "{err:#}");
    }
    let err = import_graph(&dir.path().join("missing"), dir.path(), false, 1).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

fn cora_index_file() -> (tempfile::TempDir, PathBuf) {
    let out = tempfile::tempdir().unwrap();
    import_graph(&tests::stack::dataset("cora"), out.path(), false, 1).unwrap();
    let path = out.path().join(INDEX_FILE);
    (out, path)
}

#[test]
fn truncated_and_corrupt_indexes_are_refused() {
    let (_dir, path) = cora_index_file();
    let good = std::fs::read(&path).unwrap();

    let truncate = |len: usize| {
        std::fs::write(&path, &good[..len]).unwrap();
        CsrIndex::open(&path).unwrap_err()
    };
    for len in [0, 100, 5000, good.len() - 1] {
        let err = truncate(len);
        assert!(matches!(err, FormatError::Truncated { .. }), "{len}: {err}");
        assert!(err.to_string().contains("re-run sidecar import"), "{err}");
    }

    let flip = |offset: usize| {
        let mut bad = good.clone();
        bad[offset] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        CsrIndex::open(&path).unwrap_err()
    };
    assert!(matches!(flip(0), FormatError::NotAnIndex { .. }));
    let err = flip(20); // n_nodes
    assert!(err.to_string().contains("header checksum"), "{err}");
    let err = flip(200); // indptr
    assert!(err.to_string().contains("body checksum"), "{err}");
    let err = flip(good.len() - 3); // last neighbour id
    assert!(err.to_string().contains("body checksum"), "{err}");

    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 16]);
    std::fs::write(&path, &longer).unwrap();
    assert!(CsrIndex::open(&path)
        .unwrap_err()
        .to_string()
        .contains("past the end"));

    std::fs::write(&path, &good).unwrap();
    assert!(CsrIndex::open(&path).is_ok(), "the original still opens");
}

/// Checks a sample against the graph: caps, real neighbours, no repeats
/// within a list, one row per unique node, padding rules.
fn check_sample(index: &CsrIndex, targets: &[u64], s: &Sampled) {
    let [f1, f2] = s.fanouts.map(|f| f as usize);
    let unique: HashSet<u64> = s.nodes.iter().copied().collect();
    assert_eq!(unique.len(), s.nodes.len(), "one row per unique node");
    for (t, &target) in targets.iter().enumerate() {
        let row = s.target_row[t];
        assert_eq!(s.nodes[row as usize], target);
        let known = target < u64::from(index.n_nodes());
        assert_eq!(
            s.status[t],
            if known {
                target_status::OK
            } else {
                target_status::UNKNOWN_NODE
            }
        );
        let c1 = s.hop1_count[t] as usize;
        let degree = if known {
            index.degree(target as u32) as usize
        } else {
            0
        };
        assert_eq!(c1, degree.min(f1), "hop-1 cap");
        let mut seen1 = HashSet::new();
        for i in 0..f1 {
            let r1 = s.hop1_rows[t * f1 + i];
            if i >= c1 {
                assert_eq!(r1, row, "hop-1 padding is the target row");
                assert_eq!(s.hop2_count[t * f1 + i], 0);
                continue;
            }
            let n1 = s.nodes[r1 as usize];
            assert!(
                index.neighbors(target as u32).contains(&(n1 as u32)),
                "real neighbour"
            );
            assert!(seen1.insert(n1), "without replacement");
            let c2 = s.hop2_count[t * f1 + i] as usize;
            assert_eq!(c2, (index.degree(n1 as u32) as usize).min(f2), "hop-2 cap");
            let mut seen2 = HashSet::new();
            for j in 0..f2 {
                let r2 = s.hop2_rows[(t * f1 + i) * f2 + j];
                if j >= c2 {
                    assert_eq!(r2, row);
                    continue;
                }
                let n2 = s.nodes[r2 as usize];
                assert!(index.neighbors(n1 as u32).contains(&(n2 as u32)));
                assert!(seen2.insert(n2));
            }
        }
    }
}

#[test]
fn samples_respect_caps_are_real_neighbours_and_deduplicated() {
    let (_dir, path) = cora_index_file();
    let index = CsrIndex::open(&path).unwrap();
    let mut sampler = Sampler::default();
    // Overlapping targets, a repeated target, the top-degree node, unknown ids.
    let targets = [1358u64, 306, 1358, 0, 1, 2, 2707, 2708, u64::MAX];
    for fanouts in [[20, 10], [25, 10], [10, 5], [1, 1], [200, 200]] {
        for seed in 0..20 {
            let s = sampler.sample(&index, &targets, fanouts, seed);
            check_sample(&index, &targets, &s);
            assert_eq!(
                s.target_row[0], s.target_row[2],
                "a repeated target shares its row"
            );
        }
    }
    // With fanouts covering every neighbour, the whole 2-hop neighbourhood is taken.
    let s = sampler.sample(&index, &[306], [200, 200], 1);
    let mut expected: HashSet<u64> = HashSet::from([306]);
    for &n1 in index.neighbors(306) {
        expected.insert(u64::from(n1));
        expected.extend(index.neighbors(n1).iter().map(|&v| u64::from(v)));
    }
    assert_eq!(s.nodes.iter().copied().collect::<HashSet<_>>(), expected);
}

#[test]
fn sampling_is_deterministic_for_a_seed() {
    let (_dir, path) = cora_index_file();
    let index = CsrIndex::open(&path).unwrap();
    let targets: Vec<u64> = (0..64).map(|i| i * 37 % 2708).collect();
    let mut a = Sampler::default();
    let mut b = Sampler::default();
    assert_eq!(
        a.sample(&index, &targets, [20, 10], 7),
        b.sample(&index, &targets, [20, 10], 7)
    );
    assert_ne!(
        a.sample(&index, &targets, [20, 10], 7),
        a.sample(&index, &targets, [20, 10], 8)
    );
}

/// `HUB_H1`: a cached hop-1 node gets count -1 and padding, nothing of its
/// own neighbourhood; every other node's sample is the one `sample` draws
/// (the cached node's draws are made and dropped); `hop1_of` draws a
/// node's hop-1 sample as `sample` does for it as a target.
#[test]
fn cached_hubs_go_without_neighbours_and_leave_the_other_samples_alone() {
    let (_dir, path) = cora_index_file();
    let index = CsrIndex::open(&path).unwrap();
    let targets: Vec<u64> = (0..64).map(|i| i * 37 % 2708).collect();
    let fanouts = [20, 10];
    let plain = Sampler::default().sample(&index, &targets, fanouts, 7);
    let mut asked = Vec::new();
    let cached =
        Sampler::default().sample_unless(&index, &targets, fanouts, 7, &[], &mut |n, d| {
            asked.push((n, d));
            d >= 8
        });
    assert!(asked.iter().all(|&(n, d)| index.degree(n as u32) == d));
    let (f1, f2) = (20usize, 10usize);
    let id = |s: &Sampled, row: i32| s.nodes[row as usize];
    let mut hubs = 0;
    for t in 0..targets.len() {
        assert_eq!(plain.hop1_count[t], cached.hop1_count[t]);
        for j in 0..plain.hop1_count[t] as usize {
            let slot = t * f1 + j;
            let node = id(&plain, plain.hop1_rows[slot]);
            assert_eq!(node, id(&cached, cached.hop1_rows[slot]));
            let rows = slot * f2..(slot + 1) * f2;
            if index.degree(node as u32) >= 8 {
                hubs += 1;
                assert_eq!(cached.hop2_count[slot], -1, "hub {node}");
                assert!(cached.hop2_rows[rows]
                    .iter()
                    .all(|&r| r == cached.target_row[t]));
            } else {
                assert_eq!(cached.hop2_count[slot], plain.hop2_count[slot]);
                let ids = |s: &Sampled| -> Vec<u64> {
                    s.hop2_rows[rows.clone()][..s.hop2_count[slot] as usize]
                        .iter()
                        .map(|&r| id(s, r))
                        .collect()
                };
                assert_eq!(ids(&cached), ids(&plain), "node {node}'s sample");
            }
        }
    }
    assert!(hubs > 0, "no hub among the hop-1 nodes");
    assert!(cached.nodes.len() < plain.nodes.len());
    for &target in &targets {
        let mut hop1 = Vec::new();
        sidecar::graph::sampler::hop1_of(&index, target, 20, 7, &mut Vec::new(), &mut hop1);
        let alone = Sampler::default().sample(&index, &[target], fanouts, 7);
        let expected: Vec<u64> = alone.hop1_rows[..alone.hop1_count[0] as usize]
            .iter()
            .map(|&r| alone.nodes[r as usize])
            .collect();
        assert_eq!(hop1, expected, "target {target}");
    }
}

/// Wide picks (a hash set past 64) give exactly the picks of Floyd's
/// algorithm with a scan, in the same order, in O(k) work.
#[test]
fn wide_picks_are_floyds_picks() {
    use rand::{Rng, SeedableRng};
    use sidecar::graph::sampler::pick;
    for (degree, k, seed) in [
        (10_000u32, 65u32, 1u64),
        (50_000, 1_500, 2),
        (2_000, 1_999, 3),
    ] {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut out = Vec::new();
        let work = pick(&mut rng, degree, k, &mut out);
        assert!(work <= 2 * u64::from(k), "work {work} for k {k}");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut expected: Vec<u32> = Vec::new();
        for j in degree - k..degree {
            let t = rng.random_range(0..=j);
            expected.push(if expected.contains(&t) { j } else { t });
        }
        assert_eq!(out, expected, "degree {degree}, k {k}");
        assert_eq!(out.iter().collect::<HashSet<_>>().len(), k as usize);
    }
}

/// A star: node 0 linked to nodes 1..=degree (and back).
fn star(degree: u32) -> (tempfile::TempDir, CsrIndex) {
    let mut text = String::with_capacity(degree as usize * 12);
    for v in 1..=degree {
        text.push_str(&format!("0 {v}\n"));
    }
    import_text(&text, true)
}

#[test]
fn neighbours_are_sampled_uniformly() {
    // Node 0 has 50 neighbours; draw 10 of them 20 000 times. Each neighbour
    // is expected 4 000 times; chi-square with 49 degrees of freedom must stay
    // below 85.35 (p = 0.001). Seeds are fixed, so the outcome is too.
    let (_dir, index) = star(50);
    let mut sampler = Sampler::default();
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let draws = 20_000u64;
    for seed in 0..draws {
        let s = sampler.sample(&index, &[0], [10, 1], seed);
        assert_eq!(s.hop1_count[0], 10);
        for &r in &s.hop1_rows[..10] {
            *counts.entry(s.nodes[r as usize]).or_default() += 1;
        }
    }
    assert_eq!(counts.len(), 50, "every neighbour is drawn");
    let expected = (draws * 10) as f64 / 50.0;
    let chi2: f64 = counts
        .values()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    assert!(chi2 < 85.35, "chi-square {chi2:.1} >= 85.35: not uniform");
}

#[test]
fn super_node_sampling_work_does_not_depend_on_degree() {
    let (_dir, big) = star(1_000_000);
    let (_dir2, small) = star(30);
    let mut sampler = Sampler::default();
    for seed in 0..50 {
        let on_big = sampler.sample(&big, &[0], [20, 1], seed);
        let on_small = sampler.sample(&small, &[0], [20, 1], seed);
        assert_eq!(on_big.hop1_count[0], 20);
        assert_eq!(on_small.hop1_count[0], 20);
        // Hop 1: 20 draws plus at most 0+1+..+19 probes on either graph;
        // hop 2: each leaf has one neighbour (node 0), taken without a draw.
        let bound = 20 + 190 + 20;
        assert!(
            on_big.work <= bound,
            "super node work {} > {bound}",
            on_big.work
        );
        assert_eq!(on_big.work, on_small.work, "same work for degree 1M and 30");
    }
}

#[test]
fn a_sample_fills_a_response_that_the_protocol_reader_accepts() {
    use arrow_buffer::{Buffer, MutableBuffer};
    use protocol::payload::{self, DecodeLimits, PayloadShape, ResponseWriter, SchemaCache};

    let (_dir, path) = cora_index_file();
    let index = CsrIndex::open(&path).unwrap();
    let targets = [1358u64, 0, 9999];
    let s = Sampler::default().sample(&index, &targets, [20, 10], 3);
    let shape = PayloadShape {
        n_targets: targets.len() as u32,
        n_nodes: s.nodes.len() as u32,
        feature_dim: 2,
        fanouts: [20, 10],
    };
    let mut area = MutableBuffer::from_len_zeroed(1 << 20);
    let cache = SchemaCache::default();
    let mut writer = ResponseWriter::new(area.as_slice_mut(), shape, &cache).unwrap();
    {
        let (nodes, mut columns) = writer.columns();
        nodes.node_id.copy_from_slice(&s.nodes);
        s.write_targets(&targets, &mut columns);
    }
    writer.finish(1, index.graph_version(), 0);
    let buffer: Buffer = area.into();
    let limits = DecodeLimits {
        feature_dim: 2,
        max_nodes: 100_000,
        max_targets: 64,
        max_fanouts: [50, 50],
    };
    let tables = payload::decode(&buffer, &limits, &cache).expect("the protocol reader accepts it");
    assert_eq!(tables.target_ids(), &targets);
    assert_eq!(tables.node_ids(), &s.nodes[..]);
    assert_eq!(tables.hop2_rows(), &s.hop2_rows[..]);
    assert_eq!(tables.target_status()[2], target_status::UNKNOWN_NODE);
}

#[test]
fn the_hot_set_is_the_top_degree_nodes() {
    let (_dir, path) = cora_index_file();
    let index = CsrIndex::open(&path).unwrap();
    // meta.json's top5_nodes_by_degree for cora.
    assert_eq!(index.top_degree(5), vec![1358, 306, 1701, 1986, 1810]);
    let all = index.top_degree(10_000);
    assert_eq!(all.len(), 2708);
    assert!(all
        .windows(2)
        .all(|w| index.degree(w[0]) >= index.degree(w[1])));
}

/// The subgraph layout, data-driven: a small graph sampled with covering
/// fanouts gives exactly the batch NeighborLoader builds (targets first,
/// each hop's new nodes in the order they are reached, an edge per
/// sampled neighbour, a node expanded once at the hop that reached it).
#[test]
fn a_subgraph_is_laid_out_as_neighbor_loader_lays_out_a_batch() {
    use sidecar::graph::sampler::SubgraphLimits;
    // 0-1, 0-2, 1-3, 2-3, 3-4, 5 alone (undirected).
    let (_dir, index) = import_text("0 1\n0 2\n1 3\n2 3\n3 4\n5 5\n", true);
    let limits = SubgraphLimits {
        max_nodes: 100,
        max_edges: 100,
    };
    let fanouts = [10, 10];
    let s = subgraph(
        &mut Sampler::default(),
        &index,
        &[2, 0, 2, 77],
        fanouts,
        1,
        limits,
        &[],
    )
    .unwrap();
    // Hop 0: the unique targets (2 repeated; 77 unknown).
    // Hop 1: 2's neighbours 0 (a target), 3 (new); 0's neighbours 1 (new),
    // 2 (a target); 77 has none.
    // Hop 2: 3's neighbours 1, 2, 4 (new); 1's neighbours 0, 3.
    assert_eq!(s.nodes, vec![2, 0, 77, 3, 1, 4]);
    assert_eq!(s.target_row, vec![0, 1, 0, 2]);
    assert_eq!(
        s.status,
        vec![
            target_status::OK,
            target_status::OK,
            target_status::OK,
            target_status::UNKNOWN_NODE
        ]
    );
    assert_eq!(s.edge_src, vec![1, 3, 4, 0, 4, 0, 5, 1, 3]);
    assert_eq!(s.edge_dst, vec![0, 0, 1, 1, 3, 3, 3, 4, 4]);
    assert_eq!(s.sampled_nodes, vec![3, 2, 1]);
    assert_eq!(s.sampled_edges, vec![4, 5]);
    // One hop: the targets' own edges only.
    let one = subgraph(&mut Sampler::default(), &index, &[3], [10], 1, limits, &[]).unwrap();
    assert_eq!(one.nodes, vec![3, 1, 2, 4]);
    assert_eq!(
        (one.edge_src.clone(), one.edge_dst.clone()),
        (vec![1, 2, 3], vec![0, 0, 0])
    );
    // A node without neighbours: no edges at all.
    let alone = subgraph(
        &mut Sampler::default(),
        &index,
        &[5],
        fanouts,
        1,
        limits,
        &[],
    )
    .unwrap();
    assert_eq!((alone.nodes.clone(), alone.edge_src.len()), (vec![5], 0));
    assert_eq!(alone.sampled_nodes, vec![1, 0, 0]);
}

/// With fanouts below the degrees: every expanded node gets exactly
/// min(fanout, degree) distinct real neighbours, once; the same request
/// samples the same subgraph; a node's draws do not depend on the other
/// targets; a super node costs what a small one costs.
#[test]
fn subgraph_samples_respect_fanouts_and_are_deterministic() {
    use sidecar::graph::sampler::SubgraphLimits;
    let (_dir, path) = cora_index_file();
    let index = CsrIndex::open(&path).unwrap();
    let limits = SubgraphLimits {
        max_nodes: 100_000,
        max_edges: 1_000_000,
    };
    let fanouts = [5, 3, 2];
    let targets = [1358u64, 0, 5, 99];
    let mut sampler = Sampler::default();
    let s = subgraph(&mut sampler, &index, &targets, fanouts, 9, limits, &[]).unwrap();
    assert_eq!(s.edge_src.len() as i64, s.sampled_edges.iter().sum::<i64>());
    assert_eq!(s.nodes.len() as i64, s.sampled_nodes.iter().sum::<i64>());
    assert!(
        s.edge_dst.windows(2).all(|w| w[0] <= w[1]),
        "sorted by destination"
    );
    let mut hop_of = vec![0usize; s.nodes.len()];
    let mut start = 0;
    for (hop, &count) in s.sampled_nodes.iter().enumerate() {
        hop_of[start..start + count as usize].fill(hop);
        start += count as usize;
    }
    let mut by_node: HashMap<i64, Vec<u64>> = HashMap::new();
    for (&src, &dst) in s.edge_src.iter().zip(&s.edge_dst) {
        by_node.entry(dst).or_default().push(s.nodes[src as usize]);
    }
    for (&dst, sampled) in &by_node {
        let node = s.nodes[dst as usize];
        let hop = hop_of[dst as usize];
        assert!(hop < 3, "nodes of the last hop are not expanded");
        let degree = index.degree(node as u32);
        let fanout = fanouts[hop];
        assert_eq!(sampled.len() as u32, degree.min(fanout), "node {node}");
        let real: HashSet<u64> = index
            .neighbors(node as u32)
            .iter()
            .map(|&n| u64::from(n))
            .collect();
        assert!(sampled.iter().all(|n| real.contains(n)), "node {node}");
        assert_eq!(
            sampled.iter().collect::<HashSet<_>>().len(),
            sampled.len(),
            "node {node}: drawn without replacement"
        );
    }
    let again = subgraph(
        &mut Sampler::default(),
        &index,
        &targets,
        fanouts,
        9,
        limits,
        &[],
    )
    .unwrap();
    assert_eq!(
        (again.nodes, again.edge_src),
        (s.nodes.clone(), s.edge_src.clone())
    );
    // Target 1358's own hop-1 draws are the same alone as beside others.
    let alone = subgraph(
        &mut Sampler::default(),
        &index,
        &[1358],
        fanouts,
        9,
        limits,
        &[],
    )
    .unwrap();
    let hop1 = |s: &Subgraph, row: i64| -> Vec<u64> {
        s.edge_src
            .iter()
            .zip(&s.edge_dst)
            .filter(|(_, &d)| d == row)
            .map(|(&src, _)| s.nodes[src as usize])
            .collect()
    };
    assert_eq!(hop1(&alone, 0), hop1(&s, 0));
    // FRESH targets (FRESH_SINCE) have no row and are left out: the
    // subgraph is the one the others get alone, in the same order.
    let fresh = [false, true, false, true];
    let without = subgraph(
        &mut Sampler::default(),
        &index,
        &targets,
        fanouts,
        9,
        limits,
        &fresh,
    )
    .unwrap();
    let others = subgraph(
        &mut Sampler::default(),
        &index,
        &[1358, 5],
        fanouts,
        9,
        limits,
        &[],
    )
    .unwrap();
    assert_eq!(
        (&without.nodes, &without.edge_src, &without.edge_dst),
        (&others.nodes, &others.edge_src, &others.edge_dst)
    );
    assert_eq!(
        (&without.sampled_nodes, &without.sampled_edges),
        (&others.sampled_nodes, &others.sampled_edges)
    );
    assert_eq!(without.target_row, vec![0, -1, 1, -1]);
    assert_eq!(without.status, vec![0, 2, 0, 2]);
    // Limits stop the sample with what outgrew.
    let tight = SubgraphLimits {
        max_nodes: 10,
        max_edges: 1_000,
    };
    assert!(subgraph(
        &mut Sampler::default(),
        &index,
        &targets,
        fanouts,
        9,
        tight,
        &[]
    )
    .is_err());
    // A super node costs its fanout, not its degree.
    let (_d1, big) = star(1_000_000);
    let (_d2, small) = star(30);
    let one_hop = [20];
    let on_big = subgraph(&mut sampler, &big, &[0], one_hop, 4, limits, &[]).unwrap();
    let on_small = subgraph(&mut sampler, &small, &[0], one_hop, 4, limits, &[]).unwrap();
    assert_eq!((on_big.edge_src.len(), on_small.edge_src.len()), (20, 20));
    assert_eq!(on_big.work, on_small.work, "same work for degree 1M and 30");
}

/// A one-type graph's sample in the subgraph layout: the 1x1 graph's
/// (node type 0, edge type 0), as the sidecar samples a subgraph-layout
/// request.
#[derive(Debug)]
struct Subgraph {
    nodes: Vec<u64>,
    target_row: Vec<i32>,
    status: Vec<u8>,
    edge_src: Vec<i64>,
    edge_dst: Vec<i64>,
    sampled_nodes: Vec<i64>,
    sampled_edges: Vec<i64>,
    work: u64,
}

fn subgraph(
    sampler: &mut Sampler,
    index: &CsrIndex,
    targets: &[u64],
    fanouts: impl AsRef<[u32]>,
    seed: u64,
    limits: sidecar::graph::sampler::SubgraphLimits,
    fresh: &[bool],
) -> Result<Subgraph, sidecar::graph::sampler::SubgraphTooLarge> {
    use sidecar::graph::sampler::{GraphFanouts, OneType};
    let fanouts = fanouts.as_ref();
    let fanouts = GraphFanouts::new(fanouts.len(), fanouts.to_vec()).unwrap();
    let mut s = sampler.sample_graph(&OneType(index), 0, targets, &fanouts, seed, limits, fresh)?;
    let one = |v: &mut Vec<Vec<i64>>| std::mem::take(&mut v[0]);
    Ok(Subgraph {
        edge_src: one(&mut s.edge_src),
        edge_dst: one(&mut s.edge_dst),
        sampled_nodes: one(&mut s.sampled_nodes),
        sampled_edges: one(&mut s.sampled_edges),
        nodes: std::mem::take(&mut s.nodes[0]),
        target_row: s.target_row,
        status: s.status,
        work: s.work,
    })
}
