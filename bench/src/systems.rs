//! The systems under test, each a [`Caller`] answering request `k` of the
//! scenario's sequence end to end:
//!
//! - (a) the product through gRPC ([`ProductGrpc`]) and HTTP
//!   ([`ProductHttp`]), and through the Open Inference Protocol's doors
//!   over gRPC ([`ProductV2Grpc`]) and HTTP ([`ProductV2Http`]);
//! - (b) the naive design ([`Naive`]): the caller samples the neighbourhood
//!   from the same index, GETs every feature row from Redis key by key,
//!   and posts them as JSON to an axum model server (`naive-model-server`);
//! - (c) the Python service ([`FastApi`]): FastAPI + numpy sampling +
//!   one redis-py MGET + onnxruntime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context};
use gnn_worker::api::grpc::{pb, PredictorClient};
use gnn_worker::api::v2::grpc::{pb as v2, GrpcInferenceServiceClient};
use sidecar::graph::{CsrIndex, Sampler};

use crate::http::HttpClient;
use crate::load::Caller;

/// The request sequence of a scenario: target ids per request.
pub type Requests = Arc<Vec<Vec<u64>>>;

fn body_of(targets: &[u64]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "node_ids": targets })).expect("json")
}

/// Checks a `{"predictions": [...]}` answer for `n` targets.
fn check_predictions(body: &[u8], n: usize) -> anyhow::Result<()> {
    let value: serde_json::Value = serde_json::from_slice(body).context("a JSON answer")?;
    let got = value["predictions"].as_array().map_or(0, Vec::len);
    ensure!(got == n, "{got} predictions for {n} targets");
    Ok(())
}

/// (a) the product, through gRPC.
#[derive(Debug)]
pub struct ProductGrpc {
    pub client: PredictorClient<tonic::transport::Channel>,
    pub requests: Requests,
}

impl Caller for ProductGrpc {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let targets = &self.requests[k % self.requests.len()];
            let mut client = self.client.clone();
            let response = client
                .predict(pb::PredictRequest {
                    node_ids: targets.clone(),
                    request_id: k as u64,
                    new_node: None,
                })
                .await
                .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
            ensure!(response.get_ref().predictions.len() == targets.len());
            Ok(())
        })
    }
}

/// (a) the product, through HTTP/JSON.
#[derive(Debug)]
pub struct ProductHttp {
    pub http: HttpClient,
    pub requests: Requests,
}

impl Caller for ProductHttp {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let targets = &self.requests[k % self.requests.len()];
            let body = self.http.post("/v1/predict", &body_of(targets)).await?;
            check_predictions(&body, targets.len())
        })
    }
}

/// The model name the product's worker serves in the benchmark
/// (`--model-name`), which the V2 doors call.
pub const V2_MODEL: &str = "bench";

/// (a) the product through the Open Inference Protocol over gRPC: the
/// ids as `raw_input_contents` (as tritonclient sends them), every output
/// back in `raw_output_contents`.
#[derive(Debug)]
pub struct ProductV2Grpc {
    pub client: GrpcInferenceServiceClient<tonic::transport::Channel>,
    pub requests: Requests,
}

impl Caller for ProductV2Grpc {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let targets = &self.requests[k % self.requests.len()];
            let raw: Vec<u8> = targets.iter().flat_map(|t| t.to_le_bytes()).collect();
            let mut client = self.client.clone();
            let response = client
                .model_infer(v2::ModelInferRequest {
                    model_name: V2_MODEL.into(),
                    inputs: vec![v2::model_infer_request::InferInputTensor {
                        name: "node_ids".into(),
                        datatype: "INT64".into(),
                        shape: vec![targets.len() as i64],
                        ..Default::default()
                    }],
                    raw_input_contents: vec![raw],
                    ..Default::default()
                })
                .await
                .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
            let response = response.get_ref();
            ensure!(
                response.outputs.first().and_then(|o| o.shape.first())
                    == Some(&(targets.len() as i64)),
                "V2 answered shape {:?} for {} targets",
                response.outputs.first().map(|o| &o.shape),
                targets.len()
            );
            Ok(())
        })
    }
}

/// (a) the product through the Open Inference Protocol over HTTP: a JSON
/// request, every output back as JSON (the encoding of `/v1/predict`, so
/// that the two HTTP doors differ by the door alone).
#[derive(Debug)]
pub struct ProductV2Http {
    pub http: HttpClient,
    pub requests: Requests,
}

impl Caller for ProductV2Http {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let targets = &self.requests[k % self.requests.len()];
            let body = serde_json::to_vec(&serde_json::json!({
                "inputs": [{
                    "name": "node_ids",
                    "datatype": "INT64",
                    "shape": [targets.len()],
                    "data": targets,
                }]
            }))
            .expect("json");
            let answer = self
                .http
                .post(&format!("/v2/models/{V2_MODEL}/infer"), &body)
                .await?;
            let value: serde_json::Value =
                serde_json::from_slice(&answer).context("a JSON answer")?;
            let rows = value["outputs"][0]["shape"][0].as_u64().unwrap_or(0);
            ensure!(
                rows == targets.len() as u64,
                "V2 answered {rows} rows for {} targets",
                targets.len()
            );
            Ok(())
        })
    }
}

/// (c) the FastAPI service.
#[derive(Debug)]
pub struct FastApi {
    pub http: HttpClient,
    pub requests: Requests,
}

impl Caller for FastApi {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let targets = &self.requests[k % self.requests.len()];
            let body = self.http.post("/predict", &body_of(targets)).await?;
            check_predictions(&body, targets.len())
        })
    }
}

/// (b) the naive design: sample here, GET each row, POST JSON.
pub struct Naive {
    pub index: Arc<CsrIndex>,
    pub fanouts: [u32; 2],
    pub redis: redis::aio::MultiplexedConnection,
    pub prefix: String,
    pub feature_dim: usize,
    pub http: HttpClient,
    pub requests: Requests,
    pub samplers: Mutex<Vec<Sampler>>,
}

impl std::fmt::Debug for Naive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Naive").finish_non_exhaustive()
    }
}

impl Caller for Naive {
    fn call(&self, k: usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>> {
        Box::pin(async move {
            let targets = &self.requests[k % self.requests.len()];
            let mut sampler = self.samplers.lock().unwrap().pop().unwrap_or_default();
            let sampled = sampler.sample(&*self.index, targets, self.fanouts, k as u64 + 1);
            self.samplers.lock().unwrap().push(sampler);
            let dim = self.feature_dim;
            let mut features = Vec::with_capacity(sampled.nodes.len() * dim);
            let mut redis = self.redis.clone();
            for &node in &sampled.nodes {
                // Key by key, as the naive client does.
                let value: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(format!("{}{node}", self.prefix))
                    .query_async(&mut redis)
                    .await?;
                match value {
                    Some(bytes) if bytes.len() == dim * 4 => features.extend(
                        bytes
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    ),
                    _ => features.extend(std::iter::repeat_n(0.0f32, dim)),
                }
            }
            let body = serde_json::to_vec(&serde_json::json!({
                "feature_dim": dim,
                "fanouts": sampled.fanouts,
                "features": features,
                "target_row": sampled.target_row,
                "hop1_count": sampled.hop1_count,
                "hop1_rows": sampled.hop1_rows,
                "hop2_count": sampled.hop2_count,
                "hop2_rows": sampled.hop2_rows,
            }))?;
            let answer = self.http.post("/predict", &body).await?;
            let value: serde_json::Value = serde_json::from_slice(&answer)?;
            ensure!(
                value["logits"].as_array().is_some_and(|l| !l.is_empty()),
                "no logits"
            );
            Ok(())
        })
    }
}
