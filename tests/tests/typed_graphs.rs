//! Typed (heterogeneous) graphs: the shipped OpenFlights dataset in the
//! typed layout (docs/graph-index.md, "Typed datasets"; its index and
//! sampler are sidecar/tests/typed_index.rs) and the PyG tooling for heterogeneous models (`gnn-worker/model/pyg_model.py`,
//! docs/model.md, "Bring your own heterogeneous model"). Every model the
//! tooling writes is run here by the ONNX Runtime the worker links, fed by
//! the documented input names from the dataset's own files, and must give
//! PyG's full-graph outputs.

// Only the ONNX Runtime environment of the shared support module.
#[allow(dead_code)]
mod support;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ort::session::SessionInputValue;
use ort::value::Tensor;
use support::ort_env;
use tests::stack::{dataset, process_dir, python, read_f32, read_u32_pairs, repo_root, run_ok};

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn openflights() -> PathBuf {
    dataset("openflights")
}

/// Each edge type of a typed dataset's meta.json: (src, relation, dst, file).
fn edge_types(meta: &serde_json::Value) -> Vec<(String, String, String, String)> {
    meta["edge_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            (s("src"), s("relation"), s("dst"), s("edges"))
        })
        .collect()
}

fn node_counts(meta: &serde_json::Value) -> BTreeMap<String, u64> {
    meta["node_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["num_nodes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_shipped_openflights_is_what_the_converter_writes_from_the_raw_files() {
    let shipped = openflights();
    let out = process_dir("openflights-converted");
    run_ok(
        Command::new(python())
            .arg(repo_root().join("scripts/datasets/openflights.py"))
            .arg(shipped.join("raw"))
            .arg(&out),
        "scripts/datasets/openflights.py",
    );
    // meta.json holds the sha256 of the raw files the converter read and
    // of every file it wrote: identical metas and identical files.
    let meta = json(&shipped.join("meta.json"));
    assert_eq!(json(&out.join("meta.json")), meta, "meta.json differs");
    let files = meta["files"].as_object().unwrap();
    assert_eq!(
        files.len(),
        2 + 9 + 1 + 2,
        "features of 2 types, 9 edge types, the route attributes, labels, split"
    );
    for (file, entry) in files {
        let bytes = std::fs::read(shipped.join(file)).unwrap();
        assert_eq!(
            bytes.len() as u64,
            entry["bytes"].as_u64().unwrap(),
            "{file}"
        );
        assert!(
            std::fs::read(out.join(file)).unwrap() == bytes,
            "{file} differs"
        );
    }
    assert_eq!(
        meta["source"]["commit"],
        "5a0360255a5a2ff2b9f1e9cb199716da68a8a33f"
    );
    let licence = std::fs::read_to_string(shipped.join("LICENCE")).unwrap();
    assert!(licence.contains("Open Database License (ODbL)"));
    let provenance = std::fs::read_to_string(shipped.join("PROVENANCE.md")).unwrap();
    assert!(provenance.contains("Contains information from the OpenFlights"));
}

#[test]
fn the_typed_layout_holds_what_its_meta_says() {
    let dir = openflights();
    let meta = json(&dir.join("meta.json"));
    let counts = node_counts(&meta);
    // One node per line of its OpenFlights file.
    for (name, file) in [
        ("airport", "airports"),
        ("airline", "airlines"),
        ("country", "countries"),
        ("plane", "planes"),
    ] {
        let lines = std::fs::read_to_string(dir.join(format!("raw/{file}.dat")))
            .unwrap()
            .lines()
            .count() as u64;
        assert_eq!(counts[name], lines, "{name}");
    }
    for t in meta["node_types"].as_array().unwrap() {
        let dim = t["feature_dim"].as_u64().unwrap();
        let n = t["num_nodes"].as_u64().unwrap();
        match t.get("features") {
            Some(file) => {
                let values = read_f32(&dir.join(file.as_str().unwrap()));
                assert_eq!(values.len() as u64, n * dim, "{}", t["name"]);
                assert!(values.iter().all(|v| v.is_finite()));
            }
            None => assert_eq!(dim, 0, "{}: a width without a features file", t["name"]),
        }
    }
    let mut by_type = BTreeMap::new();
    for (src, relation, dst, file) in edge_types(&meta) {
        let edges = read_u32_pairs(&dir.join(&file));
        assert!(!edges.is_empty(), "{file}");
        assert!(
            edges.windows(2).all(|w| w[0] < w[1]),
            "{file}: pairs unique and sorted"
        );
        assert!(
            edges
                .iter()
                .all(|&(s, d)| u64::from(s) < counts[&src] && u64::from(d) < counts[&dst]),
            "{file}: an id past its type's count"
        );
        if src == dst {
            assert!(edges.iter().all(|(s, d)| s != d), "{file}: a self loop");
        }
        by_type.insert((src, relation, dst), edges);
    }
    // Each relation between two types has its reverse, exactly transposed.
    let mut reversed = 0;
    for ((src, relation, dst), edges) in &by_type {
        if let Some(plain) = relation.strip_prefix("rev_") {
            let forward = &by_type[&(dst.clone(), plain.to_string(), src.clone())];
            let mut transposed: Vec<_> = forward.iter().map(|&(s, d)| (d, s)).collect();
            transposed.sort_unstable();
            assert!(&transposed == edges, "{relation} is not {plain} transposed");
            reversed += 1;
        }
    }
    assert_eq!(reversed, 4);
    let labels = &meta["labels"];
    assert_eq!(labels["node_type"], "airport");
    let classes = labels["num_classes"].as_i64().unwrap();
    let y = tests::stack::read_i32(&dir.join("labels.i32"));
    let split = std::fs::read(dir.join("split.u8")).unwrap();
    assert_eq!(y.len() as u64, counts["airport"]);
    assert_eq!(split.len(), y.len());
    for (label, part) in y.iter().zip(&split) {
        assert!((-1..classes).contains(&i64::from(*label)));
        assert_eq!(
            *label == -1,
            *part == 3,
            "unlabelled exactly when in no split"
        );
    }
}

/// A model trained and exported by `pyg_model.py train` on OpenFlights.
fn trained(args: &[&str]) -> PathBuf {
    tests::stack::hetero_model_for(&openflights(), args, "hetero-model")
}

/// The full graph's inputs by the documented names (`x__<type>`,
/// `n_id__<type>`, `edge_index__<src>__<relation>__<dst>`), read from the
/// dataset's files: every name a model over the dataset can declare.
fn full_graph_inputs(dir: &Path) -> BTreeMap<String, SessionInputValue<'static>> {
    let meta = json(&dir.join("meta.json"));
    let mut inputs = BTreeMap::new();
    for t in meta["node_types"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let n = t["num_nodes"].as_u64().unwrap() as usize;
        let value: SessionInputValue = match t.get("features") {
            Some(file) => {
                let x = read_f32(&dir.join(file.as_str().unwrap()));
                let d = x.len() / n;
                Tensor::from_array(([n, d], x)).unwrap().into()
            }
            None => Tensor::from_array(([n], (0..n as i64).collect::<Vec<_>>()))
                .unwrap()
                .into(),
        };
        let prefix = if t.get("features").is_some() {
            "x"
        } else {
            "n_id"
        };
        inputs.insert(format!("{prefix}__{name}"), value);
    }
    for (src, relation, dst, file) in edge_types(&meta) {
        let edges = read_u32_pairs(&dir.join(file));
        let mut index: Vec<i64> = edges.iter().map(|&(s, _)| i64::from(s)).collect();
        index.extend(edges.iter().map(|&(_, d)| i64::from(d)));
        let value = Tensor::from_array(([2, edges.len()], index)).unwrap();
        inputs.insert(
            format!("edge_index__{src}__{relation}__{dst}"),
            value.into(),
        );
    }
    inputs
}

/// Runs `model`'s ONNX file on the full graph, fed exactly the inputs its
/// manifest declares, and returns the largest difference from PyG's
/// full-graph outputs (reference/outputs.f32), relative to each row's
/// magnitude (at least 1), with the output's width.
fn full_graph_difference(model: &Path) -> (f32, usize) {
    let manifest = json(&model.join("manifest.json"));
    let env = ort_env(); // before any tensor is made
    let mut all = full_graph_inputs(&openflights());
    let declared: Vec<String> = manifest["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let mut session = ort::session::Session::builder(env)
        .unwrap()
        .commit_from_file(model.join("model.onnx"))
        .unwrap();
    let session_inputs: Vec<String> = session
        .inputs()
        .iter()
        .map(|i| i.name().to_string())
        .collect();
    assert_eq!(
        session_inputs, declared,
        "the manifest's inputs are the model's"
    );
    let named: Vec<(Cow<str>, SessionInputValue)> = declared
        .iter()
        .map(|name| {
            let value = all
                .remove(name)
                .unwrap_or_else(|| panic!("{name}: not a name the naming rule gives"));
            (Cow::Owned(name.clone()), value)
        })
        .collect();
    let outputs = session.run(named).unwrap();
    let (shape, got) = outputs["out"].try_extract_tensor::<f32>().unwrap();
    let want = read_f32(&model.join("reference/outputs.f32"));
    assert_eq!(got.len(), want.len());
    let n = json(&openflights().join("meta.json"))["node_types"][0]["num_nodes"]
        .as_u64()
        .unwrap() as usize;
    assert_eq!(shape[0] as usize, n, "one output row per airport");
    let width = want.len() / n;
    let mut worst = 0f32;
    for (a, b) in got.chunks_exact(width).zip(want.chunks_exact(width)) {
        let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    (worst, width)
}

#[test]
fn a_to_hetero_model_gives_pyg_s_full_graph_outputs_in_the_worker_s_onnx_runtime() {
    let model = trained(&[
        "--arch",
        "to_hetero",
        "--epochs",
        "60",
        "--loader-runs",
        "1",
    ]);
    let (worst, width) = full_graph_difference(&model);
    assert!(worst <= 1e-5, "ONNX Runtime differs from PyG by {worst}");
    assert_eq!(width, 10, "one logit per time-zone region");
    let manifest = json(&model.join("manifest.json"));
    assert_eq!(manifest["layout"], "subgraph");
    assert_eq!(manifest["target_type"], "airport");
    // The time-zone region is learnt; NeighborLoader-style inference at the
    // serving fanouts stays near the full graph's accuracy.
    let full = manifest["offline"]["test_accuracy"].as_f64().unwrap();
    let sampled = manifest["neighbor_loader"]["mean_test_accuracy"]
        .as_f64()
        .unwrap();
    assert!(full > 0.9, "test accuracy {full}");
    assert!(
        (full - sampled).abs() < 0.05,
        "full {full}, sampled {sampled}"
    );
    // Two layers from the airports: planes reach them (plane -> airline ->
    // airport), but no message reaches a plane's neighbours in time.
    let inputs = manifest["inputs"].to_string();
    assert!(inputs.contains("\"n_id__plane\"") && inputs.contains("\"n_id__country\""));
    assert!(!inputs.contains("edge_index__airline__flies__plane"));
    assert_eq!(
        manifest["exporter"]["dropped_inputs"],
        serde_json::json!(["edge_index__airline__flies__plane"])
    );
    // Served by the worker beside a sidecar of the typed graph:
    // tests/tests/typed_serving.rs.
}

#[test]
fn a_one_layer_heteroconv_embedding_model_declares_only_what_reaches_its_output() {
    let model = trained(&[
        "--arch",
        "heteroconv",
        "--layers",
        "1",
        "--output",
        "embedding",
        "--hidden",
        "32",
        "--epochs",
        "30",
        "--fanout",
        "route=20",
        "--fanouts",
        "5",
    ]);
    let (worst, width) = full_graph_difference(&model);
    assert!(worst <= 1e-5, "ONNX Runtime differs from PyG by {worst}");
    assert_eq!(width, 32);
    let manifest = json(&model.join("manifest.json"));
    assert_eq!(manifest["embedding_dim"], 32);
    assert_eq!(
        manifest["fanouts"]["airport__route__airport"],
        serde_json::json!([20])
    );
    assert_eq!(
        manifest["fanouts"]["airline__flies__plane"],
        serde_json::json!([5])
    );
    // One hop: only the edge types into airports, and their sources' rows.
    let mut inputs: Vec<&str> = manifest["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    inputs.sort_unstable();
    assert_eq!(
        inputs,
        [
            "edge_index__airline__serves__airport",
            "edge_index__airport__route__airport",
            "edge_index__country__rev_located_in__airport",
            "n_id__country",
            "x__airline",
            "x__airport",
        ]
    );
}

#[test]
fn a_user_s_own_heterogeneous_module_exports_through_the_generated_wrapper() {
    let dir = process_dir("hetero-user-module");
    std::fs::write(
        dir.join("flights.py"),
        r#"
import torch
from torch_geometric.nn import GraphConv, HeteroConv, Linear


class Net(torch.nn.Module):
    """A user's module: an embedding for countries, one HeteroConv of
    GraphConv over three edge types, a linear head."""

    def __init__(self, hidden=16, classes=10):
        super().__init__()
        self.country = torch.nn.Embedding(261, 8)
        self.conv = HeteroConv({
            ("airport", "route", "airport"): GraphConv(-1, hidden),
            ("airline", "serves", "airport"): GraphConv((-1, -1), hidden),
            ("country", "rev_located_in", "airport"): GraphConv((-1, -1), hidden),
        }, aggr="mean")
        self.head = Linear(hidden, classes)

    def forward(self, x_dict, edge_index_dict):
        x_dict = dict(x_dict, country=self.country(x_dict["country"]))
        return self.head(self.conv(x_dict, edge_index_dict)["airport"].relu())
"#,
    )
    .unwrap();
    let out = dir.join("model");
    let run = |extra: &[&str]| {
        Command::new(python())
            .current_dir(&dir)
            .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
            .args([
                "export",
                "--module",
                "flights:Net",
                "--init",
                r#"{"hidden": 8}"#,
            ])
            .arg("--dataset")
            .arg(openflights())
            .arg("--out")
            .arg(&out)
            .args(extra)
            .output()
            .expect("running pyg_model.py export")
    };
    // An edge type the dataset lacks is refused by name, with the known ones.
    let refused = run(&["--fanout", "flies_to=3"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("edge type 'flies_to': unknown; give one of airport__route__airport"),
        "{stderr}"
    );
    let done = run(&["--fanouts", "8,4"]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let (worst, width) = full_graph_difference(&out);
    assert!(worst <= 1e-5, "ONNX Runtime differs from PyG by {worst}");
    assert_eq!(width, 10);
    let manifest = json(&out.join("manifest.json"));
    assert_eq!(manifest["architecture"], "flights:Net");
    assert_eq!(manifest["inputs"].as_array().unwrap().len(), 6);
}

#[test]
fn an_attention_model_that_onnxruntime_cannot_run_on_empty_types_is_exported_with_the_cases_named()
{
    let dir = process_dir("hetero-gat");
    std::fs::copy(
        repo_root().join("tests/python/flights_gat.py"),
        dir.join("flights_gat.py"),
    )
    .unwrap();
    let out = dir.join("model");
    let (_, stderr) = run_ok(
        Command::new(python())
            .current_dir(&dir)
            .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
            .args(["export", "--module", "flights_gat:Net", "--fanouts", "5,3"])
            .arg("--dataset")
            .arg(openflights())
            .arg("--out")
            .arg(&out),
        "pyg_model.py export of a to_hetero GAT",
    );
    assert!(
        stderr.contains("onnxruntime cannot run this model on the"),
        "{stderr}"
    );
    // Where every input has rows and edges it is exact.
    let (worst, width) = full_graph_difference(&out);
    assert!(worst <= 1e-5, "ONNX Runtime differs from PyG by {worst}");
    assert_eq!(width, 10);
    let manifest = json(&out.join("manifest.json"));
    let cannot_run = manifest["check"]["cannot_run"].as_array().unwrap();
    assert!(!cannot_run.is_empty());
    for case in cannot_run {
        assert!(
            !case["empty_inputs"].as_array().unwrap().is_empty(),
            "{case}: only a case with an empty input is recorded"
        );
        assert!(
            case["error"].as_str().unwrap().contains("ONNXRuntimeError"),
            "{case}"
        );
    }
    assert!(
        manifest["check"]["cases"]["full-graph"]["max_rel_diff"]
            .as_f64()
            .unwrap()
            <= 1e-5
    );
}
