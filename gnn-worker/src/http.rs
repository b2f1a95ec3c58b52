//! HTTP/JSON: `POST /v1/predict` with `{"node_ids": [..]}`, `GET /healthz`
//! (the process is up), `GET /readyz` (attached to a live sidecar with a
//! matching model: 200, else 503), `GET /metrics` (Prometheus text).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::batcher::{PredictError, Predictor};

#[derive(Debug, Deserialize)]
pub struct PredictBody {
    pub node_ids: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub struct PredictionJson {
    pub node_id: u64,
    pub label: i32,
    pub logits: Vec<f32>,
    pub known: bool,
    pub fallback_rows: u32,
}

/// The router, for `axum::serve`.
pub fn router(predictor: Predictor) -> Router {
    Router::new()
        .route("/v1/predict", post(predict))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(predictor)
}

async fn predict(
    State(predictor): State<Predictor>,
    Json(body): Json<PredictBody>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    match predictor.predict(body.node_ids).await {
        Ok(predictions) => {
            let predictions: Vec<PredictionJson> = predictions
                .into_iter()
                .map(|p| PredictionJson {
                    node_id: p.node_id,
                    label: p.label,
                    logits: p.logits,
                    known: p.known,
                    fallback_rows: p.fallback_rows,
                })
                .collect();
            Ok(Json(serde_json::json!({ "predictions": predictions })))
        }
        Err(e) => {
            let code = match e {
                PredictError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
                PredictError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                PredictError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            Err((code, format!("{e}\n")))
        }
    }
}

async fn ready(State(predictor): State<Predictor>) -> (StatusCode, &'static str) {
    if predictor.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not attached to a sidecar\n",
        )
    }
}

async fn metrics(State(predictor): State<Predictor>) -> String {
    use std::fmt::Write;
    let s = predictor.stats();
    let mut out = String::new();
    for (name, help, value) in [
        ("gnn_worker_calls_total", "client calls", &s.calls),
        ("gnn_worker_batches_total", "batches formed", &s.batches),
        (
            "gnn_worker_ring_requests_total",
            "ring requests sent",
            &s.ring_requests,
        ),
        ("gnn_worker_targets_total", "targets predicted", &s.targets),
        (
            "gnn_worker_batch_errors_total",
            "batches that failed",
            &s.errors,
        ),
    ] {
        let v = value.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP gnn_worker_ready 1 when attached to a live sidecar\n# TYPE gnn_worker_ready gauge\ngnn_worker_ready {}",
        u8::from(predictor.is_ready())
    );
    out
}
