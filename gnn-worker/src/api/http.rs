//! HTTP/JSON: `POST /v1/predict` with `{"node_ids": [..]}` (or
//! `{"new_node": {"id", "features", "neighbors", "directed"}}`), `GET /healthz`
//! (the process answers: 200), `GET /readyz` (200 when the worker can
//! serve; 503 with the reason otherwise: no sidecar yet, sidecar gone or
//! draining, schema mismatch, no executor alive), `GET /metrics`
//! (OpenMetrics text); and the Open Inference Protocol's `/v2` routes
//! ([`crate::api::v2::http`]).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::batcher::PredictError;
use crate::service::{Call, NewNodeCall, Service};

#[derive(Debug, Deserialize)]
pub struct PredictBody {
    #[serde(default)]
    pub node_ids: Vec<u64>,
    /// A node the graph does not have, predicted without adding it (instead
    /// of `node_ids`).
    #[serde(default)]
    pub new_node: Option<NewNodeJson>,
    /// The call's deadline, milliseconds from now: the ladder answers on
    /// the richest rung that fits (docs/serving.md, "The ladder").
    #[serde(default)]
    pub timeout_ms: Option<f64>,
}

/// `new_node` of a predict body (docs/serving.md, "A new node in one call").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewNodeJson {
    pub id: u64,
    pub features: Vec<f32>,
    #[serde(default)]
    pub neighbors: Vec<u64>,
    #[serde(default)]
    pub directed: bool,
    /// A typed graph's new node: its edges per edge type, `[src, dst]`
    /// pairs, instead of `neighbors`.
    #[serde(default)]
    pub edges: Option<std::collections::BTreeMap<String, Vec<[u64; 2]>>>,
}

#[derive(Debug, Serialize)]
pub struct PredictionJson {
    pub node_id: u64,
    /// -1 from an embedding model.
    pub label: i32,
    /// Empty from an embedding model.
    pub logits: Vec<f32>,
    /// The node's embedding from an embedding model; empty otherwise.
    pub embedding: Vec<f32>,
    pub known: bool,
    pub fallback_rows: u32,
    pub answered_by: &'static str,
    /// Less than the model's answer on the node's full, current data
    /// ([`crate::batcher::Prediction::degraded`]).
    pub degraded: bool,
}

/// The router, for `axum::serve`.
pub fn router(service: Service) -> Router {
    Router::new()
        .route("/v1/predict", post(predict))
        .merge(crate::api::v2::http::routes())
        .merge(daemon_kit::endpoint::routes(std::sync::Arc::new(
            service.clone(),
        )))
        .with_state(service)
}

/// `/metrics`, `/healthz` and `/readyz` (`daemon_kit::endpoint`): the
/// worker is live while it answers.
impl daemon_kit::endpoint::Probes for Service {
    fn metrics(&self) -> String {
        Service::metrics(self).encode()
    }

    fn readiness(&self) -> Result<(), String> {
        Service::readiness(self).map_err(|reason| format!("not ready: {reason}"))
    }

    /// `ready: model <name> sha256 <hex>`: which model answers.
    fn ready_line(&self) -> String {
        match self.model() {
            Some(model) => format!("ready: model {} sha256 {}", model.name, model.sha256),
            None => "ready".into(),
        }
    }

    fn liveness(&self) -> Result<(), String> {
        Ok(())
    }
}

async fn predict(
    State(service): State<Service>,
    headers: axum::http::HeaderMap,
    Json(body): Json<PredictBody>,
) -> Result<Json<serde_json::Value>, axum::response::Response> {
    use tracing::Instrument;
    let span = crate::service::call_span(
        "POST /v1/predict",
        headers.get("traceparent").and_then(|v| v.to_str().ok()),
    );
    predict_body(service, body).instrument(span).await
}

/// `POST /v1/predict`, inside its call's span.
async fn predict_body(
    service: Service,
    body: PredictBody,
) -> Result<Json<serde_json::Value>, axum::response::Response> {
    let left = match body.timeout_ms {
        Some(ms) if !(ms.is_finite() && ms > 0.0 && ms <= 3_600_000.0) => {
            return Err(error_response(PredictError::InvalidArgument(format!(
                "timeout_ms {ms} is not a number of milliseconds in (0, 3600000]"
            ))));
        }
        ms => ms.map(|ms| std::time::Duration::from_secs_f64(ms / 1000.0)),
    };
    let new_node = body.new_node.map(|node| NewNodeCall {
        id: node.id,
        features: node.features,
        neighbors: node.neighbors,
        directed: node.directed,
        edges: node.edges.map(|edges| {
            edges
                .into_iter()
                .map(|(name, pairs)| (name, pairs.into_iter().map(|[s, d]| (s, d)).collect()))
                .collect()
        }),
    });
    let result = match Call::of(body.node_ids, new_node) {
        Ok(call) => service.call(call, left).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(answer) => {
            let predictions: Vec<PredictionJson> = answer
                .predictions
                .into_iter()
                .map(|p| PredictionJson {
                    degraded: p.degraded(),
                    node_id: p.node_id,
                    label: p.label,
                    logits: p.logits,
                    embedding: p.embedding,
                    known: p.known,
                    fallback_rows: p.fallback_rows,
                    answered_by: p.answered_by.as_str(),
                })
                .collect();
            Ok(Json(serde_json::json!({
                "predictions": predictions,
                "model": answer.model.name,
                "model_sha256": answer.model.sha256,
            })))
        }
        Err(e) => Err(error_response(e)),
    }
}

/// The HTTP answer to a failed call: its status from the one table
/// ([`PredictError::http_status`]), the message as text.
fn error_response(e: PredictError) -> axum::response::Response {
    let mut response = (e.http_status(), format!("{e}\n")).into_response();
    if e.retry_after() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}
