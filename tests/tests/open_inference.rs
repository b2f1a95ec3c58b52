//! The Open Inference Protocol (docs/serving.md, "The Open Inference
//! Protocol"): the protocol's own clients (tritonclient's gRPC and HTTP
//! clients, the kserve SDK's REST and gRPC clients, in .venv-v2) call a
//! running worker and get, byte for byte, what the native API answers, for
//! a classifier and an embedding model, one target, a batch and a new
//! node; malformed calls get the protocol's errors; health and metadata
//! answer what is true, and readiness over the protocol is `/readyz`'s.

use std::process::Command;
use std::time::Duration;

use gnn_worker::api::grpc::{pb, PredictorClient};
use gnn_worker::api::v2::grpc::{pb as v2, GrpcInferenceServiceClient};
use tests::eventually;
use tests::stack::{
    pyg_model_for, python_v2, repo_root, run_ok, shipped_cora, Stack, StackOptions,
};

/// What the native API answered for `ids` (or a new node), in the form
/// check_v2.py compares with: the logits' or embedding's f32 bytes in hex.
fn native_case(predictions: &[pb::Prediction], embedding: bool) -> serde_json::Value {
    let main: Vec<u8> = predictions
        .iter()
        .flat_map(|p| if embedding { &p.embedding } else { &p.logits })
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let hex: String = main.iter().map(|b| format!("{b:02x}")).collect();
    serde_json::json!({
        "ids": predictions.iter().map(|p| p.node_id).collect::<Vec<_>>(),
        "main_hex": hex,
        "label": predictions.iter().map(|p| p.label).collect::<Vec<_>>(),
        "known": predictions.iter().map(|p| p.known).collect::<Vec<_>>(),
        "fallback_rows": predictions.iter().map(|p| p.fallback_rows).collect::<Vec<_>>(),
        "answered_by": predictions.iter().map(|p| p.answered_by.clone()).collect::<Vec<_>>(),
        "degraded": predictions.iter().map(|p| p.degraded).collect::<Vec<_>>(),
    })
}

async fn native(stack: &Stack, request: pb::PredictRequest) -> Vec<pb::Prediction> {
    let mut client = PredictorClient::connect(stack.grpc.clone()).await.unwrap();
    client
        .predict(request)
        .await
        .expect("native predict")
        .into_inner()
        .predictions
}

/// Runs check_v2.py against `stack`, with the native answers for one
/// target, a batch (an id the graph lacks among them) and, given a row
/// width, a new node.
fn check_with_the_protocols_clients(
    stack: &Stack,
    model_name: &str,
    embedding: bool,
    width: usize,
    new_node_width: Option<usize>,
    max_request_targets: usize,
) {
    let rt = runtime();
    let one = vec![5u64];
    let batch: Vec<u64> = (0..9).chain([1_000_000]).collect();
    let mut cases = Vec::new();
    for ids in [one, batch] {
        let predictions = rt.block_on(native(
            stack,
            pb::PredictRequest {
                node_ids: ids,
                ..Default::default()
            },
        ));
        cases.push(native_case(&predictions, embedding));
    }
    // One known target: not degraded; the batch's last id is unknown, its
    // answer from the default row.
    assert_eq!(cases[0]["degraded"], serde_json::json!([false]));
    assert_eq!(cases[1]["degraded"][9], true);
    assert_eq!(cases[1]["degraded"][0], false);
    let new_node = new_node_width.map(|width| {
        let features: Vec<f32> = (0..width).map(|j| ((j % 7) as f32) * 0.25).collect();
        let node = pb::NewNode {
            id: 2708,
            features: features.clone(),
            neighbors: vec![0, 1, 2],
            ..Default::default()
        };
        let predictions = rt.block_on(native(
            stack,
            pb::PredictRequest {
                new_node: Some(node),
                ..Default::default()
            },
        ));
        let mut case = native_case(&predictions, embedding);
        case["id"] = 2708.into();
        case["features"] = serde_json::json!(features);
        case["neighbors"] = serde_json::json!([0, 1, 2]);
        case
    });
    let sha = gnn_worker::model::sha256_hex(&stack.model.join("model.onnx")).unwrap();
    let expected = serde_json::json!({
        "model": model_name,
        "version": &sha[..12],
        "output": if embedding { "embedding" } else { "classes" },
        "width": width,
        "feature_dim": new_node_width.unwrap_or(1433),
        "max_request_targets": max_request_targets,
        "cases": cases,
        "new_node": new_node,
    });
    let path = stack.dir.path().join("expected.json");
    std::fs::write(&path, expected.to_string()).unwrap();
    // One process per package: both register `inference.*` in
    // protobuf's default pool.
    for clients in ["triton", "kserve"] {
        let (said, _) = run_ok(
            Command::new(python_v2())
                .arg(repo_root().join("tests/python/check_v2.py"))
                .args([
                    "--grpc",
                    stack.grpc.trim_start_matches("http://"),
                    "--http",
                    &stack.http,
                    "--clients",
                    clients,
                    "--expected",
                ])
                .arg(&path),
            "check_v2.py",
        );
        assert!(said.contains("v2 checks passed"), "{clients}: {said}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A classifier (the trained cora model) under `--model-name`: every
/// client, every output, the errors; V2 calls go through the same service
/// (counted in `gnn_worker_calls`); readiness over V2 follows `/readyz`
/// when the sidecar goes and comes back.
#[test]
fn a_classifier_answers_the_protocols_clients_as_it_answers_its_own() {
    let mut options = StackOptions::new("cora");
    options.worker_args = vec![
        "--model-name".into(),
        "cora-sage".into(),
        "--max-request-targets".into(),
        "32".into(),
    ];
    let mut stack = Stack::start(&options).expect("stack");
    let calls_before = tests::stack::metric_value(&stack.http, "gnn_worker_calls_total");
    check_with_the_protocols_clients(&stack, "cora-sage", false, 7, Some(1433), 32);
    let calls_after = tests::stack::metric_value(&stack.http, "gnn_worker_calls_total");
    // At least the successful V2 inferences: 2 cases x (2 tritonclient
    // gRPC + 1 new node + 1 two-output) and more over HTTP and kserve.
    assert!(
        calls_after - calls_before >= 20.0,
        "V2 calls are not counted as calls: {calls_before} -> {calls_after}"
    );

    // Readiness over V2 is /readyz's, reason included.
    let rt = runtime();
    let ready = |stack: &Stack| {
        let (code, body) = stack.http_get("/v2/health/ready").unwrap();
        let (model_code, _) = stack.http_get("/v2/models/cora-sage/ready").unwrap();
        let (readyz, reason) = stack.http_get("/readyz").unwrap();
        let grpc = rt.block_on(async {
            let mut client = GrpcInferenceServiceClient::connect(stack.grpc.clone())
                .await
                .unwrap();
            let server = client
                .server_ready(v2::ServerReadyRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready;
            let model = client
                .model_ready(v2::ModelReadyRequest {
                    name: "cora-sage".into(),
                    version: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .ready;
            (server, model)
        });
        (code, body, model_code, readyz, reason, grpc)
    };
    let (code, _, model_code, readyz, _, grpc) = ready(&stack);
    assert_eq!(
        (code, model_code, readyz, grpc),
        (200, 200, 200, (true, true))
    );
    let sidecar = stack.sidecar.take().unwrap();
    assert!(sidecar.stop());
    assert!(
        eventually(Duration::from_secs(30), || {
            stack.http_get("/readyz").is_ok_and(|(c, _)| c == 503)
        }),
        "the worker stayed ready without its sidecar"
    );
    let (code, body, model_code, readyz, reason, grpc) = ready(&stack);
    assert_eq!(
        (code, model_code, readyz, grpc),
        (503, 503, 503, (false, false))
    );
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["ready"], false);
    assert_eq!(
        body["error"].as_str().unwrap().trim(),
        reason.trim(),
        "/v2/health/ready and /readyz give different reasons"
    );
    // A call meanwhile: the native error, as the protocol's.
    let (code, body) = tests::stack::http_request(
        &stack.http,
        "POST",
        "/v2/models/cora-sage/infer",
        Some(r#"{"inputs":[{"name":"node_ids","shape":[1],"datatype":"INT64","data":[1]}]}"#),
    )
    .unwrap();
    assert_eq!(code, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("sidecar"),
        "{body}"
    );
    stack.restart_sidecar().expect("sidecar back");
    let (code, _, model_code, readyz, _, grpc) = ready(&stack);
    assert_eq!(
        (code, model_code, readyz, grpc),
        (200, 200, 200, (true, true))
    );
    assert!(stack.stop());
}

/// An embedding model (PyG, the subgraph layout) named by its directory:
/// the embedding byte for byte, no label or logits.
#[test]
fn an_embedding_model_answers_the_protocols_clients_as_it_answers_its_own() {
    let model = pyg_model_for(
        &shipped_cora(),
        &[
            "--output",
            "embedding",
            "--hidden",
            "16",
            "--epochs",
            "5",
            "--loader-runs",
            "0",
        ],
    );
    let mut options = StackOptions::new("cora");
    options.dataset_dir = Some(shipped_cora());
    options.model = Some(model.clone());
    options.worker_args = vec!["--max-request-targets".into(), "16".into()];
    let stack = Stack::start(&options).expect("stack");
    let name = std::fs::canonicalize(&model)
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    check_with_the_protocols_clients(&stack, &name, true, 16, None, 16);
    assert!(stack.stop());
}
