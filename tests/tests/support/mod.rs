//! What the end-to-end and PyG test binaries share: their tokio runtime,
//! ONNX Runtime's environment, and gRPC calls of many ids.

use gnn_worker::api::grpc::{pb, PredictorClient};
use tests::stack::Stack;

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// ONNX Runtime from the project venv's wheel, once per test process.
pub fn ort_env() -> &'static ort::environment::Environment {
    static ENV: std::sync::OnceLock<ort::environment::Environment> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        gnn_worker::onnxruntime::init(Some(&tests::stack::onnxruntime_lib()))
            .expect("loading ONNX Runtime")
    })
}

/// Predictions for `ids` through gRPC, `per_call` ids a call, `in_flight`
/// calls at a time (so that the worker may batch them). In `ids` order.
pub fn predict_calls(
    stack: &Stack,
    ids: &[u64],
    per_call: usize,
    in_flight: usize,
) -> Vec<pb::Prediction> {
    runtime().block_on(async {
        let client = PredictorClient::connect(stack.grpc.clone()).await.unwrap();
        let mut out = Vec::with_capacity(ids.len());
        let chunks: Vec<Vec<u64>> = ids.chunks(per_call).map(<[u64]>::to_vec).collect();
        for group in chunks.chunks(in_flight.max(1)) {
            let tasks: Vec<_> = group
                .iter()
                .map(|chunk| {
                    let mut client = client.clone();
                    let chunk = chunk.clone();
                    tokio::spawn(async move {
                        client
                            .predict(pb::PredictRequest {
                                node_ids: chunk,
                                request_id: 0,
                                new_node: None,
                            })
                            .await
                    })
                })
                .collect();
            for task in tasks {
                let response = task.await.unwrap().expect("predict").into_inner();
                out.extend(response.predictions);
            }
        }
        out
    })
}

/// The HTTP prediction of `node` in a call with a deadline of `timeout_ms`
/// (the ladder's input), which must be answered 200.
pub fn predict_within(stack: &Stack, node: u64, timeout_ms: f64) -> serde_json::Value {
    let body = format!(r#"{{"node_ids": [{node}], "timeout_ms": {timeout_ms}}}"#);
    let (code, text) =
        tests::stack::http_request(&stack.http, "POST", "/v1/predict", Some(&body)).unwrap();
    assert_eq!(code, 200, "{text}");
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["predictions"][0].clone()
}
