//! What the worker decodes from a client: a gRPC `PredictRequest` message
//! and an HTTP `/v1/predict` body; and the Open Inference Protocol's
//! requests, a gRPC `ModelInferRequest` and an HTTP inference body (JSON
//! alone, or a JSON header followed by binary tensor data), each taken
//! on to the call it makes and the outputs it asks for, for a one-type and
//! a typed graph's model.
#![no_main]

use gnn_worker::api::grpc::pb;
use gnn_worker::api::http::PredictBody;
use gnn_worker::model::{ModelTensors, OutputKind};
use gnn_worker::api::v2;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn models() -> [ModelTensors; 2] {
    let one_type = ModelTensors {
        output: OutputKind::Classes,
        width: 7,
        feature_dim: 4,
        typed_edges: None,
    };
    let typed = ModelTensors {
        output: OutputKind::Embedding,
        width: 3,
        feature_dim: 2,
        typed_edges: Some(vec!["paper__cites__paper".into()]),
    };
    [one_type, typed]
}

fn to_the_call(inputs: &[v2::call::Input], outputs: &[String]) {
    for tensors in models() {
        let _ = v2::call::call_of(inputs, &tensors);
        let _ = v2::call::requested(outputs, &tensors);
    }
}

fuzz_target!(|bytes: &[u8]| {
    let _ = pb::PredictRequest::decode(bytes);
    let _ = serde_json::from_slice::<PredictBody>(bytes);

    if let Ok(mut request) = v2::grpc::pb::ModelInferRequest::decode(bytes) {
        let outputs: Vec<String> = request.outputs.iter().map(|o| o.name.clone()).collect();
        if let Ok(inputs) = v2::grpc::inputs_of(&mut request) {
            to_the_call(&inputs, &outputs);
        }
    }
    // The first byte splits the rest into a JSON header and binary data.
    let (header_length, body) = match bytes.split_first() {
        Some((&n, rest)) => (n.to_string(), rest),
        None => (String::new(), bytes),
    };
    for length in [None, Some(header_length.as_bytes())] {
        if let Ok(request) = v2::http::parse_infer(length, None, body) {
            let outputs: Vec<String> = request.outputs.iter().map(|(n, _)| n.clone()).collect();
            to_the_call(&request.inputs, &outputs);
        }
    }
});
