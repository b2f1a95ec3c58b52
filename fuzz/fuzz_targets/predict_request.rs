//! A gRPC `PredictRequest` message and an HTTP `/v1/predict` body, as the
//! worker decodes them.
#![no_main]

use gnn_worker::grpc::pb;
use gnn_worker::http::PredictBody;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|bytes: &[u8]| {
    let _ = pb::PredictRequest::decode(bytes);
    let _ = serde_json::from_slice::<PredictBody>(bytes);
});
