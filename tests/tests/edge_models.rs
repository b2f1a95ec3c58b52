//! PyG models that read their edges' data, served unchanged
//! (docs/model.md, "Models that read edge data"): GINEConv, GATConv and
//! TransformerConv with `edge_dim` (`edge_attr`) and GCNConv with
//! `edge_weight`, each exported by the tooling from the user's module
//! (`tests/python/edge_models.py`) on cora with seeded edge data
//! (`tests/python/edge_datasets.py`), checked against PyG there, then
//! served by the real sidecar and worker: at covering fanouts every test
//! node's answer is PyG's full-graph answer, which reads every edge's data.
//! The same for a typed graph: a `to_hetero` GATConv reading OpenFlights'
//! route attributes.

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::stack::{
    dataset, process_dir, python, read_f32, repo_root, run_ok, shipped_cora, Stack, StackOptions,
};
use tests::typed::{TypedSidecar, Worker};

/// cora's largest degree: fanouts of at least this take every neighbour.
const COVERING: u32 = 168;

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// cora with `columns` of 3 attributes, a weight and a time per edge
/// ("attr,weight,time"), written by `tests/python/edge_datasets.py` into
/// a fresh directory.
fn cora_with_edge_data(tag: &str, columns: &str) -> PathBuf {
    let out = process_dir(tag).join("cora-edge-data");
    run_ok(
        Command::new(python())
            .arg(repo_root().join("tests/python/edge_datasets.py"))
            .arg("cora")
            .arg(shipped_cora())
            .arg(&out)
            .arg(columns),
        "tests/python/edge_datasets.py cora",
    );
    out
}

/// `pyg_model.py export` of `edge_models:<class>` (its weights as built)
/// on `dataset` at fanouts 10,5 into `out`.
fn export_to(dataset: &Path, class: &str, init: &str, out: &Path) {
    run_ok(
        Command::new(python())
            .current_dir(repo_root().join("tests/python"))
            .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
            .args(["export", "--module", &format!("edge_models:{class}")])
            .args(["--init", init, "--dataset"])
            .arg(dataset)
            .args(["--fanouts", "10,5", "--out"])
            .arg(out),
        &format!("pyg_model.py export of edge_models:{class}"),
    );
}

/// [`export_to`] beside `dataset`: the model directory.
fn export(dataset: &Path, class: &str, init: &str) -> PathBuf {
    let out = dataset.with_file_name(format!("model-{class}"));
    export_to(dataset, class, init, &out);
    out
}

/// A stack serving `model` over `dataset` at covering fanouts for `hops`
/// hops.
fn stack(dataset: &Path, model: &Path, hops: usize) -> Stack {
    let mut options = StackOptions::new("cora");
    options.dataset_dir = Some(dataset.to_path_buf());
    options.model = Some(model.to_path_buf());
    options.max_fanouts = Some([COVERING, COVERING]);
    options.worker_fanouts = Some(vec![COVERING.to_string(); hops].join(","));
    options.max_targets = 8;
    options.max_batch = 8;
    options.response_mib = 64;
    Stack::start(&options).expect("stack")
}

/// The test split's nodes.
fn test_nodes(dataset: &Path) -> Vec<u64> {
    let split = std::fs::read(dataset.join("split.u8")).unwrap();
    (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .collect()
}

/// Serves `model` over `dataset` at covering fanouts for `hops` hops: the
/// largest difference of a test node's served row to PyG's full-graph row
/// (`reference/outputs.f32`), relative to the row's magnitude (at least 1).
fn served_difference(dataset: &Path, model: &Path, hops: usize) -> f32 {
    let stack = stack(dataset, model, hops);
    let ids = test_nodes(dataset);
    let predictions = support::predict_calls(&stack, &ids, 8, 4);
    assert_eq!(predictions.len(), ids.len());
    let reference = read_f32(&model.join("reference/outputs.f32"));
    let width = reference.len() / 2708;
    let mut worst = 0f32;
    for (p, &id) in predictions.iter().zip(&ids) {
        assert_eq!(p.node_id, id);
        assert!(p.known && p.fallback_rows == 0, "node {id}");
        assert_eq!(p.answered_by, "gnn");
        let want = &reference[id as usize * width..(id as usize + 1) * width];
        assert_eq!(p.logits.len(), width, "node {id}: output width");
        let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (a, b) in p.logits.iter().zip(want) {
            worst = worst.max((a - b).abs() / scale);
        }
    }
    assert!(stack.stop(), "the stack did not shut down cleanly");
    worst
}

/// Each edge-reading layer: exported with the edge data it takes named
/// in its inputs and manifest, then served as PyG computes it (a 2-layer
/// GCN at 3 hops: its normalisation reads the weights into each node of
/// the second hop, docs/model.md).
#[test]
fn models_that_read_edge_data_are_served_as_pyg_computes_them() {
    let dataset = cora_with_edge_data("edge-models", "attr,weight,time");
    let with_attrs = r#"{"in_dim": 1433, "edge_dim": 3}"#;
    for (class, init, input, hops) in [
        ("Gine", with_attrs, "edge_attr", 2),
        ("Gat", with_attrs, "edge_attr", 2),
        ("Transformer", with_attrs, "edge_attr", 2),
        ("Gcn", r#"{"in_dim": 1433}"#, "edge_weight", 3),
    ] {
        let model = export(&dataset, class, init);
        let manifest = json(&model.join("manifest.json"));
        assert_eq!(
            manifest["inputs"],
            serde_json::json!(["x", "edge_index", input]),
            "{class}"
        );
        let edge_dim = if input == "edge_attr" { 3 } else { 0 };
        assert_eq!(
            manifest["edge_dim"].as_u64().unwrap_or(0),
            edge_dim,
            "{class}"
        );
        let worst = served_difference(&dataset, &model, hops);
        println!(
            "{class} ({input}): served at covering fanouts, max difference to PyG {worst:.2e}"
        );
        assert!(
            worst <= 1e-5,
            "{class}: served rows differ from PyG's full-graph rows by {worst:.2e}"
        );
    }
}

/// `pyg_model.py train` reads the edge data its architecture takes:
/// GINEConv the attributes, GCNConv the weights; each trained model is
/// served as PyG computes it.
#[test]
fn the_tooling_trains_models_that_read_edge_data() {
    let dataset = cora_with_edge_data("edge-models-trained", "attr,weight,time");
    for (arch, input, hops) in [("gine", "edge_attr", 2), ("gcn", "edge_weight", 3)] {
        let out = dataset.with_file_name(format!("trained-{arch}"));
        run_ok(
            Command::new(python())
                .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
                .args(["train", "--arch", arch, "--dataset"])
                .arg(&dataset)
                .args([
                    "--epochs",
                    "30",
                    "--loader-runs",
                    "0",
                    "--fanouts",
                    "10,5",
                    "--out",
                ])
                .arg(&out),
            &format!("pyg_model.py train --arch {arch}"),
        );
        let manifest = json(&out.join("manifest.json"));
        assert_eq!(
            manifest["inputs"],
            serde_json::json!(["x", "edge_index", input]),
            "{arch}"
        );
        let worst = served_difference(&dataset, &out, hops);
        println!("trained {arch} ({input}): max difference to PyG {worst:.2e}");
        assert!(
            worst <= 1e-5,
            "{arch}: served rows differ from PyG's by {worst:.2e}"
        );
    }
    // GINEConv needs attributes: cora without them is refused by name.
    let output = Command::new(python())
        .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
        .args(["train", "--arch", "gine", "--dataset"])
        .arg(shipped_cora())
        .arg("--out")
        .arg(dataset.with_file_name("refused-gine"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("arch gine reads edge attributes and the dataset's edges carry none"),
        "{stderr}"
    );
}

/// Starts a worker with `model` beside `stack`'s sidecar; it must exit
/// non-zero. Returns its stderr.
fn worker_refusal(stack: &Stack, model: &Path) -> String {
    tests::stack::worker_refusal(&stack.shm_name, model, &[])
}

/// A model that reads edge data beside a sidecar whose graph lacks it is
/// refused at start by name, and so is a manifest whose `edge_dim` is not
/// the export's.
#[test]
fn a_model_whose_edge_data_the_graph_lacks_is_refused_by_name() {
    let dataset = cora_with_edge_data("edge-models-refused", "attr,weight,time");
    let weighted = export(&dataset, "Gcn", r#"{"in_dim": 1433}"#);
    let attributed = export(&dataset, "Gine", r#"{"in_dim": 1433, "edge_dim": 3}"#);
    // cora without edge data, serving its trained model.
    let plain = Stack::start(&StackOptions::new("cora")).expect("stack");
    let err = worker_refusal(&plain, &weighted);
    assert!(
        err.contains("input \"edge_weight\" takes a weight per edge of edge type node__to__node")
            && err.contains("carries no edge data there"),
        "{err}"
    );
    assert!(plain.stop());
    // cora whose edges carry a weight and a time, no attributes.
    let weights_only = cora_with_edge_data("edge-models-weights", "weight,time");
    let carrying = stack(&weights_only, &weighted, 3);
    let err = worker_refusal(&carrying, &attributed);
    assert!(
        err.contains("input \"edge_attr\" takes 3 attributes per edge")
            && err.contains("carries a weight, a time there"),
        "{err}"
    );
    // The manifest says 4 attributes; the export takes 3.
    let manifest_path = attributed.join("manifest.json");
    let mut manifest = json(&manifest_path);
    manifest["edge_dim"] = 4.into();
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let err = worker_refusal(&carrying, &attributed);
    assert!(
        err.contains("input \"edge_attr\" has shape [-1, 3]; expected [-1, 4]")
            && err.contains("not the manifest's edge_dim 4"),
        "{err}"
    );
    assert!(carrying.stop());
}

/// A typed graph: OpenFlights' route edges carry 4 attributes
/// (docs/graph-index.md, "Typed datasets"); a `to_hetero` GATConv with
/// `edge_dim` 4 takes them as `edge_attr__airport__route__airport` (the
/// other edge types carry none: to_hetero hands their layers None).
/// Served at covering fanouts (every source of every edge type at both
/// hops), every answer is PyG's full-graph answer.
#[test]
fn a_typed_model_reading_route_attributes_is_served_as_pyg_computes_it() {
    let openflights = dataset("openflights");
    let model = process_dir("edge-models-typed").join("flights-gat-edge");
    export_to(&openflights, "FlightsGat", "{}", &model);
    let manifest = json(&model.join("manifest.json"));
    let inputs = manifest["inputs"].as_array().unwrap();
    assert!(inputs.contains(&"edge_attr__airport__route__airport".into()));
    let route = manifest["edge_types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["relation"] == "route")
        .unwrap();
    assert_eq!(route["edge_dim"], 4);

    let sidecar = TypedSidecar::start(&[], &[]);
    let worker = Worker::start(&sidecar.shm_name, &model, &["--fanouts", "2048,2048"]);
    let split = std::fs::read(openflights.join("split.u8")).unwrap();
    // The test airports of the first 600 ids, and the largest hub (3482).
    let mut ids: Vec<u64> = (0..600).filter(|&i| split[i as usize] == 2).collect();
    ids.push(3482);
    let full = read_f32(&model.join("reference/outputs.f32"));
    let width = full.len() / split.len();
    let mut worst = 0f32;
    for chunk in ids.chunks(16) {
        let body = serde_json::json!({ "node_ids": chunk }).to_string();
        let (code, text) =
            tests::stack::http_request(&worker.http, "POST", "/v1/predict", Some(&body)).unwrap();
        assert_eq!(code, 200, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (p, &id) in answer["predictions"].as_array().unwrap().iter().zip(chunk) {
            assert_eq!(p["answered_by"], "gnn");
            assert_eq!(p["fallback_rows"], 0);
            let logits: Vec<f32> = serde_json::from_value(p["logits"].clone()).unwrap();
            let want = &full[id as usize * width..(id as usize + 1) * width];
            assert_eq!(logits.len(), width);
            let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
            for (a, b) in logits.iter().zip(want) {
                worst = worst.max((a - b).abs() / scale);
            }
        }
    }
    println!(
        "to_hetero GATConv with route attributes: {} airports at covering fanouts, max \
         difference to PyG {worst:.2e}",
        ids.len()
    );
    assert!(
        worst <= 1e-5,
        "served rows differ from PyG's full-graph rows by {worst:.2e}"
    );
    assert!(worker.daemon.stop());
}
