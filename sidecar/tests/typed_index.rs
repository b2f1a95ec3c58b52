//! The typed index (one CSR per edge type, rows the destinations) built by
//! `sidecar import` from the shipped OpenFlights dataset, and the typed
//! sampler: with covering fanouts it lays out exactly the subgraph that
//! the PyG tooling's `sample_graph` (NeighborLoader's semantics on a
//! HeteroData) lays out; at small fanouts it keeps the caps, draws only
//! real edges, and draws the same for a node whatever its batch.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use protocol::payload::schema::target_status;
use sidecar::features::import::FeatureManifest;
use sidecar::features::rocks::RocksStore;
use sidecar::features::store::Role;
use sidecar::graph::sampler::SubgraphLimits;
use sidecar::graph::typed::{feature_dir, TYPED_DIR};
use sidecar::graph::{GraphFanouts, GraphSampled, GraphSource, Sampler, TypedGraph};
use tests::redis::RedisServer;
use tests::stack::{dataset, python, read_u32_pairs, repo_root, run_ok, workspace_bin};

const NO_LIMITS: SubgraphLimits = SubgraphLimits {
    max_nodes: usize::MAX,
    max_edges: usize::MAX,
};

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

fn import(dataset_dir: &Path) -> (tempfile::TempDir, std::process::Output) {
    let data = tempfile::tempdir().unwrap();
    let output = Command::new(workspace_bin("sidecar"))
        .arg("import")
        .arg(dataset_dir)
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .expect("running sidecar import");
    (data, output)
}

/// OpenFlights imported once per test process.
fn openflights_graph() -> &'static (tempfile::TempDir, PathBuf) {
    static GRAPH: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    GRAPH.get_or_init(|| {
        let data = tempfile::tempdir().unwrap();
        let (stdout, _) = run_ok(
            Command::new(workspace_bin("sidecar"))
                .arg("import")
                .arg(dataset("openflights"))
                .arg("--data-dir")
                .arg(data.path()),
            "sidecar import of openflights",
        );
        assert!(stdout.contains("4 node types, 9 edge types"), "{stdout}");
        assert!(
            stdout.contains("edge type airport__route__airport: 36588 edges"),
            "{stdout}"
        );
        let path = data.path().to_path_buf();
        (data, path)
    })
}

#[test]
fn each_edge_type_s_index_lists_every_destination_s_sources() {
    let source = dataset("openflights");
    let graph = TypedGraph::open(&openflights_graph().1).unwrap();
    let meta = meta(&source);
    let schema = graph.schema();
    assert_eq!(schema.node_types.len(), 4);
    assert_eq!(schema.edge_types.len(), 9);
    for (t, entry) in meta["node_types"].as_array().unwrap().iter().enumerate() {
        assert_eq!(schema.node_types[t].name, entry["name"].as_str().unwrap());
        assert_eq!(
            schema.node_types[t].num_nodes,
            entry["num_nodes"].as_u64().unwrap()
        );
        assert_eq!(
            u64::from(schema.node_types[t].feature_dim),
            entry["feature_dim"].as_u64().unwrap()
        );
    }
    for (e, entry) in meta["edge_types"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            schema.edge_types[e].key(),
            format!(
                "{}__{}__{}",
                entry["src"].as_str().unwrap(),
                entry["relation"].as_str().unwrap(),
                entry["dst"].as_str().unwrap()
            )
        );
        let (_, dst) = graph.edge_types()[e];
        let mut want: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (s, d) in read_u32_pairs(&source.join(entry["edges"].as_str().unwrap())) {
            want.entry(d).or_default().push(s);
        }
        let index = graph.csr(e);
        assert_eq!(index.n_edges(), entry["num_edges"].as_u64().unwrap());
        for v in 0..schema.node_types[dst].num_nodes as u32 {
            let mut sources = want.remove(&v).unwrap_or_default();
            sources.sort_unstable();
            assert_eq!(
                index.neighbors(v),
                &sources[..],
                "{} row {v}",
                schema.edge_types[e].key()
            );
        }
    }
}

/// The subgraph of `targets` (airports) as `common.sample` lays
/// it out with every neighbour taken: per node type its global ids, per
/// edge type its edge_index, the per-hop counts.
fn python_sample(targets: &[u64], hops: usize) -> serde_json::Value {
    tests::stack::openflights_python_sample(targets, hops, 1_000_000)
}

fn covering(graph: &TypedGraph, hops: usize) -> GraphFanouts {
    GraphFanouts::new(hops, vec![1_000_000; hops * graph.edge_types().len()]).unwrap()
}

#[test]
fn with_covering_fanouts_the_typed_sample_is_pyg_tooling_s_subgraph() {
    let graph = TypedGraph::open(&openflights_graph().1).unwrap();
    let schema = graph.schema();
    let airport = schema.node_type("airport").unwrap();
    let mut sampler = Sampler::default();
    // A small airport, the largest hub (Atlanta, row 3482), a batch with a
    // repeat, the last airport; two hops and one.
    for (targets, hops) in [
        (vec![1u64], 2),
        (vec![3482], 1),
        (vec![5, 3482, 5, 900, 7000], 2),
        (vec![7697, 0], 2),
    ] {
        let got = sampler
            .sample_graph(
                &graph,
                airport,
                &targets,
                &covering(&graph, hops),
                3,
                NO_LIMITS,
                &[],
            )
            .unwrap();
        let want = python_sample(&targets, hops);
        for (t, node_type) in schema.node_types.iter().enumerate() {
            let ids: Vec<u64> =
                serde_json::from_value(want["n_id"][&node_type.name].clone()).unwrap();
            assert_eq!(got.nodes[t], ids, "{targets:?}: {} rows", node_type.name);
            let counts: Vec<i64> =
                serde_json::from_value(want["nodes"][&node_type.name].clone()).unwrap();
            assert_eq!(got.sampled_nodes[t], counts, "{}", node_type.name);
        }
        for (e, edge_type) in schema.edge_types.iter().enumerate() {
            let key = edge_type.key();
            let index: Vec<Vec<i64>> =
                serde_json::from_value(want["edge_index"][&key].clone()).unwrap();
            assert_eq!(got.edge_src[e], index[0], "{targets:?}: {key} sources");
            assert_eq!(got.edge_dst[e], index[1], "{targets:?}: {key} destinations");
            let counts: Vec<i64> = serde_json::from_value(want["edges"][&key].clone()).unwrap();
            assert_eq!(got.sampled_edges[e], counts, "{key}");
        }
        assert!(got.status.iter().all(|&s| s == target_status::OK));
    }
}

/// Every edge of `sample` is an edge of its type, each (edge type,
/// destination) drew at most its fanout of distinct sources, rows are
/// unique per type.
fn assert_real_and_capped(graph: &TypedGraph, sample: &GraphSampled, fanout: u32) {
    for (e, &(src, dst)) in graph.edge_types().iter().enumerate() {
        let mut per_destination: BTreeMap<i64, HashSet<u64>> = BTreeMap::new();
        for (&s, &d) in sample.edge_src[e].iter().zip(&sample.edge_dst[e]) {
            let source = sample.nodes[src][s as usize];
            let destination = sample.nodes[dst][d as usize];
            assert!(
                graph
                    .csr(e)
                    .neighbors(destination as u32)
                    .contains(&(source as u32)),
                "{}: {source} -> {destination} is not an edge",
                graph.schema().edge_types[e].key()
            );
            assert!(
                per_destination.entry(d).or_default().insert(source),
                "a source drawn twice"
            );
        }
        assert!(per_destination.values().all(|s| s.len() <= fanout as usize));
    }
    for nodes in &sample.nodes {
        let unique: HashSet<_> = nodes.iter().collect();
        assert_eq!(unique.len(), nodes.len(), "a node in two rows of its type");
    }
}

#[test]
fn sampled_fanouts_keep_their_caps_draw_real_edges_and_depend_on_the_node_alone() {
    let graph = TypedGraph::open(&openflights_graph().1).unwrap();
    let airport = graph.schema().node_type("airport").unwrap();
    let n_edge_types = graph.edge_types().len();
    let fanouts = GraphFanouts::new(1, vec![3; n_edge_types]).unwrap();
    let mut sampler = Sampler::default();
    let batch = [3482u64, 1, 2000, 3000];
    let together = sampler
        .sample_graph(&graph, airport, &batch, &fanouts, 11, NO_LIMITS, &[])
        .unwrap();
    assert_real_and_capped(&graph, &together, 3);
    // One hop: each target's draws are its own, whatever its batch.
    for (t, &target) in batch.iter().enumerate() {
        let alone = sampler
            .sample_graph(&graph, airport, &[target], &fanouts, 11, NO_LIMITS, &[])
            .unwrap();
        for (e, &(src, _)) in graph.edge_types().iter().enumerate() {
            let of = |s: &GraphSampled, row: i64| -> Vec<u64> {
                s.edge_src[e]
                    .iter()
                    .zip(&s.edge_dst[e])
                    .filter(|(_, &d)| d == row)
                    .map(|(&r, _)| s.nodes[src][r as usize])
                    .collect()
            };
            assert_eq!(of(&together, t as i64), of(&alone, 0), "target {target}");
        }
    }
    // Two hops, another seed: still capped and real, and repeatable.
    let fanouts = GraphFanouts::new(2, vec![4; 2 * n_edge_types]).unwrap();
    let first = sampler
        .sample_graph(&graph, airport, &batch, &fanouts, 12, NO_LIMITS, &[])
        .unwrap();
    assert_real_and_capped(&graph, &first, 4);
    let again = sampler
        .sample_graph(&graph, airport, &batch, &fanouts, 12, NO_LIMITS, &[])
        .unwrap();
    assert_eq!(first, again);
    // A fanout of 0 leaves its edge type out at that hop.
    let mut only_routes = vec![0; n_edge_types];
    only_routes[graph.schema().edge_type("route").unwrap()] = 5;
    let routes = sampler
        .sample_graph(
            &graph,
            airport,
            &batch,
            &GraphFanouts::new(1, only_routes).unwrap(),
            12,
            NO_LIMITS,
            &[],
        )
        .unwrap();
    for (e, edges) in routes.edge_src.iter().enumerate() {
        let key = graph.schema().edge_types[e].key();
        assert_eq!(edges.is_empty(), key != "airport__route__airport", "{key}");
    }
}

#[test]
fn an_unknown_target_gets_a_row_and_no_edges_and_limits_stop_a_large_subgraph() {
    let graph = TypedGraph::open(&openflights_graph().1).unwrap();
    let airport = graph.schema().node_type("airport").unwrap();
    let mut sampler = Sampler::default();
    let sample = sampler
        .sample_graph(
            &graph,
            airport,
            &[7698, 1],
            &covering(&graph, 2),
            1,
            NO_LIMITS,
            &[],
        )
        .unwrap();
    assert_eq!(
        sample.status,
        [target_status::UNKNOWN_NODE, target_status::OK]
    );
    assert_eq!(sample.target_row, [0, 1]);
    assert!(sample.edge_dst[graph.schema().edge_type("route").unwrap()]
        .iter()
        .all(|&d| d != 0));
    let limits = SubgraphLimits {
        max_nodes: 100,
        max_edges: usize::MAX,
    };
    let refused = sampler.sample_graph(
        &graph,
        airport,
        &[3482],
        &covering(&graph, 2),
        1,
        limits,
        &[],
    );
    assert!(
        refused.is_err(),
        "a hub's covering 2-hop subgraph has more than 100 nodes"
    );
}

#[test]
fn an_import_whose_edges_leave_their_types_is_refused_by_edge_type_and_id() {
    let source = dataset("openflights");
    let copy = tempfile::tempdir().unwrap();
    for entry in ["edges", "nodes"] {
        tests::stack::copy_dir(&source.join(entry), &copy.path().join(entry));
    }
    let mut meta = meta(&source);
    // Fewer airlines than the edges name.
    meta["node_types"][1]["num_nodes"] = 100.into();
    std::fs::write(copy.path().join("meta.json"), meta.to_string()).unwrap();
    let (data, output) = import(copy.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("edge type airline__serves__airport")
            && stderr.contains("is not below the source type's num_nodes 100"),
        "{stderr}"
    );
    assert!(
        !data.path().join(TYPED_DIR).exists(),
        "nothing is put in place"
    );
    // A bad name is refused before anything is built.
    let mut meta = self::meta(&source);
    meta["edge_types"][0]["relation"] = "flies__to".into();
    std::fs::write(copy.path().join("meta.json"), meta.to_string()).unwrap();
    let (_, output) = import(copy.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("relation \"flies__to\" of (airport, airport)"),
        "{stderr}"
    );
}

#[test]
fn a_typed_data_directory_refuses_what_it_does_not_serve_yet_by_name() {
    // Serving it is tests/tests/typed_serving.rs; a seed dataset is for
    // one-type graphs in this release.
    let data = &openflights_graph().1;
    let output = Command::new(workspace_bin("sidecar"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--shm-name", "typed-index-not-served", "--admin-socket"])
        .arg(data.join("admin.sock"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .arg("--seed-dataset")
        .arg(tests::stack::dataset("cora"))
        .output()
        .expect("running sidecar serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(
            "holds a typed graph; seed_dataset is for one-type graphs in this release: leave it \
             unset"
        ),
        "{stderr}"
    );
}

/// Row `id` of a dataset's f32 feature file of width `dim`.
fn dataset_row(file: &Path, dim: usize, id: usize) -> Vec<f32> {
    tests::stack::read_f32(file)[id * dim..(id + 1) * dim].to_vec()
}

fn decode(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn each_node_type_with_features_gets_its_own_store_of_its_width() {
    let source = dataset("openflights");
    let data = &openflights_graph().1;
    for (name, dim, n) in [("airport", 11usize, 7698u64), ("airline", 3, 6162)] {
        let dir = feature_dir(data, name);
        let manifest = FeatureManifest::read(&dir).unwrap();
        assert_eq!(manifest.feature_dim as usize, dim, "{name}");
        assert_eq!(manifest.num_nodes, n, "{name}");
        assert_eq!(manifest.store, "rocksdb");
        let file = source.join(format!("nodes/{name}.f32"));
        let all = tests::stack::read_f32(&file);
        let mean = manifest.read_mean(&dir).unwrap();
        for (column, value) in mean.iter().enumerate() {
            let sum: f64 = all
                .iter()
                .skip(column)
                .step_by(dim)
                .map(|&v| f64::from(v))
                .sum();
            assert!(
                (sum / n as f64 - f64::from(*value)).abs() < 1e-5,
                "{name} mean"
            );
        }
        let (store, _) =
            RocksStore::open(&dir.join(FeatureManifest::STORE_DIR), Role::StoreOfRecord).unwrap();
        let ids = [0, 1, 17, n - 1];
        for (&id, row) in ids.iter().zip(store.get_many(&ids, dim * 4)) {
            let row = row.unwrap_or_else(|| panic!("{name} {id}: no row"));
            assert_eq!(
                decode(&row),
                dataset_row(&file, dim, id as usize),
                "{name} {id}"
            );
        }
        assert_eq!(
            store.get_many(&[n], dim * 4),
            [None],
            "{name}: a row past the count"
        );
    }
    for featureless in ["country", "plane"] {
        assert!(!feature_dir(data, featureless).exists(), "{featureless}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn into_redis_each_type_s_rows_are_keyed_by_type_and_id() {
    let server = RedisServer::start();
    let source = dataset("openflights");
    let data = tempfile::tempdir().unwrap();
    let (stdout, _) = run_ok(
        Command::new(workspace_bin("sidecar"))
            .arg("import")
            .arg(&source)
            .arg("--data-dir")
            .arg(data.path())
            .args(["--redis", &server.url()]),
        "sidecar import into Redis",
    );
    assert!(
        stdout.contains("features of airport: 7698 rows of 11 f32 into Redis"),
        "{stdout}"
    );
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    for (name, dim, id) in [
        ("airport", 11usize, 17usize),
        ("airline", 3, 5),
        ("airport", 11, 7697),
    ] {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(format!("feat:{name}:{id}"))
            .query_async(&mut connection)
            .await
            .unwrap();
        let file = source.join(format!("nodes/{name}.f32"));
        assert_eq!(
            decode(&value),
            dataset_row(&file, dim, id),
            "feat:{name}:{id}"
        );
    }
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        keys,
        7698 + 6162 + 2,
        "one key per row of a type with features, and its import's fingerprint \
         (`<prefix>dataset`), no other"
    );
    let manifest = FeatureManifest::read(&feature_dir(data.path(), "airline")).unwrap();
    let fingerprint: String = redis::cmd("GET")
        .arg("feat:airline:dataset")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(Some(fingerprint), manifest.fingerprint);
    assert_eq!(manifest.store, "redis");
    assert_eq!(manifest.redis_prefix.as_deref(), Some("feat:airline:"));
    assert!(TypedGraph::open(data.path()).is_ok());
}

#[test]
fn a_generated_typed_graph_is_seeded_imports_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let generate = |out: &str| {
        let output = Command::new(workspace_bin("sidecar"))
            .arg("generate")
            .arg("--out")
            .arg(dir.path().join(out))
            .args(["--nodes", "5000", "--items", "1000", "--edges", "60000"])
            .args([
                "--follows",
                "8000",
                "--feature-dim",
                "8",
                "--item-feature-dim",
                "4",
            ])
            .args(["--classes", "3", "--seed", "7"])
            .output()
            .expect("running sidecar generate");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        dir.path().join(out)
    };
    let (a, b) = (generate("a"), generate("b"));
    let meta = meta(&a);
    let mut files = vec![
        "meta.json".to_string(),
        "labels.i32".into(),
        "split.u8".into(),
    ];
    files.extend(["nodes/user.f32".into(), "nodes/item.f32".into()]);
    for e in meta["edge_types"].as_array().unwrap() {
        files.push(e["edges"].as_str().unwrap().to_string());
    }
    for file in &files {
        assert!(
            std::fs::read(a.join(file)).unwrap() == std::fs::read(b.join(file)).unwrap(),
            "{file} is seeded"
        );
    }
    let keys: Vec<String> = meta["edge_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{}__{}__{}", e["src"], e["relation"], e["dst"]).replace('"', ""))
        .collect();
    assert_eq!(
        keys,
        [
            "user__interacts__item",
            "item__rev_interacts__user",
            "user__follows__user"
        ]
    );
    // Power-law degrees: the busiest item has many times the mean.
    let interactions = read_u32_pairs(&a.join("edges/user__interacts__item.u32"));
    let mut degree = vec![0u32; 1000];
    for &(_, item) in &interactions {
        degree[item as usize] += 1;
    }
    let mean = interactions.len() as f64 / 1000.0;
    assert!(f64::from(*degree.iter().max().unwrap()) > 10.0 * mean);

    let (data, output) = import(&a);
    assert!(output.status.success(), "{output:?}");
    let graph = TypedGraph::open(data.path()).unwrap();
    assert_eq!(
        graph.csr(0).n_edges() as usize,
        interactions.len(),
        "every interaction, none repeated"
    );
    // The PyG tooling reads it (unique, sorted pairs checked) and trains.
    let model = tempfile::tempdir().unwrap();
    run_ok(
        Command::new(python())
            .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
            .args(["train", "--dataset"])
            .arg(&a)
            .arg("--out")
            .arg(model.path())
            .args(["--epochs", "3", "--loader-runs", "0", "--hidden", "16"]),
        "pyg_model.py train on a generated graph",
    );
}

#[test]
fn a_typed_index_whose_sources_leave_their_type_is_refused_even_with_valid_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let path = openflights_graph()
        .1
        .join(TYPED_DIR)
        .join("airline__serves__airport.csr");
    let original = std::fs::read(&path).unwrap();
    let header = sidecar::graph::CsrHeader::decode(&original, original.len() as u64, "x").unwrap();
    assert!(header.is_typed());
    assert_eq!((header.n_nodes, header.n_src), (7698, 6162));
    let broken = dir.path().join("broken.csr");
    let refused = |bytes: &[u8]| {
        std::fs::write(&broken, bytes).unwrap();
        sidecar::graph::CsrIndex::open(&broken)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    // Each edit with both checksums made valid again: only the structure
    // check can catch it.
    let edited = |offset: usize, value: &[u8]| {
        let mut bytes = original.clone();
        bytes[offset..offset + value.len()].copy_from_slice(value);
        tests::stack::reseal_csr(&mut bytes);
        refused(&bytes)
    };
    let first = header.indices_range().start;
    for (what, offset, value, error) in [
        // An airline id past the airlines (the first row's first source).
        (
            "a source id of 6162",
            first,
            6162u32.to_le_bytes().to_vec(),
            "an id out of range",
        ),
        // A source count below the ids the rows hold.
        (
            "n_src 100",
            112,
            100u64.to_le_bytes().to_vec(),
            "an id out of range",
        ),
        // A source count on a file without the typed flag.
        (
            "flags 0",
            12,
            0u32.to_le_bytes().to_vec(),
            "another file has no source count",
        ),
    ] {
        let message = edited(offset, &value);
        assert!(message.contains(error), "{what}: {message}");
    }
    // The file as written opens.
    std::fs::write(&broken, &original).unwrap();
    assert!(sidecar::graph::CsrIndex::open(&broken).is_ok());
}
